"""Reading a traced graph: where a variable is read, what consumes it, where examples are."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

__all__ = [
    "VIEW_OPS",
    "ancestors",
    "internal_handle",
    "find_sites",
    "consumers_past_views",
    "batch_free",
    "CONSTANT",
    "REDUCED",
    "grouped_source",
    "static_dim",
]

# Ops that pass a variable's value through unchanged up to shape and dtype, preserving the
# row-major order of its elements. A moment of the viewed tensor reshapes to the variable.
VIEW_OPS = frozenset({"Identity", "Cast", "ExpandDims", "Reshape", "Squeeze"})

# Ops that read a variable's value but pass no gradient to it (its shape, not its numbers).
NO_GRADIENT_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})


def static_dim(t: tf.Tensor, axis: int = 0):
    """The static size of ``t`` along ``axis``, or None."""
    shape = t.shape
    if shape.rank is None or shape.rank <= axis:
        return None
    return shape[axis]


def ancestors(tensor: tf.Tensor) -> set[tf.Operation]:
    """All ops that ``tensor`` depends on through data inputs (including its own op)."""
    seen: set[tf.Operation] = set()
    stack = [tensor.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
    return seen


def internal_handle(graph: tf.Graph, variable) -> tf.Tensor | None:
    """The tensor in ``graph`` that stands for ``variable``'s resource handle, or None.

    Inside a ``tf.function`` the handle is an eager tensor captured as a placeholder; in nested
    function graphs the capture is chained through the outer graphs. In a TF1 graph the handle
    lives in the graph itself.
    """
    handle = variable.handle
    if not isinstance(handle, tf.Tensor):
        return None
    try:
        if handle.graph is graph:
            return handle
    except AttributeError:  # eager tensors have no graph
        pass
    return _captured(graph, handle)


def _captured(graph, external):
    captures = getattr(graph, "captures", None)
    if captures is None:
        return None
    for ext, internal in captures:
        if ext is external:
            return internal
    outer = getattr(graph, "outer_graph", None)
    if outer is not None:
        outer_t = _captured(outer, external)
        if outer_t is not None:
            for ext, internal in captures:
                if ext is outer_t:
                    return internal
    return None


@dataclass(frozen=True)
class RawSite:
    op: tf.Operation
    index: int
    view: tf.Tensor
    read: tf.Operation


def find_sites(handle: tf.Tensor, on_path: set[tf.Operation]) -> list[RawSite]:
    """The consumers of a variable's value on the loss's path, past pass-through views.

    Every read of ``handle`` (a variable may have several, e.g. in TF1 graphs) is followed
    through `VIEW_OPS`; the first op that is not a view is a site. Ops not on ``on_path``
    (the loss's ancestors) are ignored. A non-read consumer of the handle itself (e.g.
    ``ResourceGather``, or a ``While`` loop that reads the variable inside) is a site too.
    """
    sites: list[RawSite] = []
    for read in handle.consumers():
        if read not in on_path:
            continue
        if read.type in NO_GRADIENT_OPS:
            continue
        if read.type != "ReadVariableOp":
            index = next(i for i, x in enumerate(read.inputs) if x is handle)
            sites.append(RawSite(read, index, handle, read))
            continue
        sites.extend(consumers_past_views(read.outputs[0], on_path, read))
    return sites


def consumers_past_views(t: tf.Tensor, on_path, read=None) -> list[RawSite]:
    """The first non-view ops on ``on_path`` that consume ``t`` (through `VIEW_OPS`)."""
    sites: list[RawSite] = []
    stack = [t]
    while stack:
        t = stack.pop()
        for op in t.consumers():
            if op not in on_path or op.type in NO_GRADIENT_OPS:
                continue
            if op.type in VIEW_OPS and op.inputs[0] is t:
                stack.extend(op.outputs[:1])
                continue
            for i, inp in enumerate(op.inputs):
                if inp is t:
                    sites.append(RawSite(op, i, t, read if read is not None else t.op))
    return sites


# Ops whose output carries no per-example axis when none of their inputs does, or that remove it.
_CONSTANT_OPS = frozenset(
    {"Const", "ReadVariableOp", "VarHandleOp", "VariableShape", "Shape", "ShapeN", "Size", "Rank"}
)
_REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod", "EuclideanNorm"})

CONSTANT = "constant"  # depends on no example: variables, constants, shapes
REDUCED = "reduced"  # depends on the examples only through reductions over the batch axis


def batch_free(t: tf.Tensor, memo: dict | None = None) -> str | None:
    """Whether ``t`` has no per-example axis: `CONSTANT`, `REDUCED` (batch statistics such as
    BatchNormalization's mean and variance in training mode) or None (it may hold examples).

    Conservative: a non-scalar placeholder (the model's inputs) holds examples; a reduction
    whose static axes include axis 0 removes them; any other op is batch-free when all of its
    inputs are.
    """
    memo = {} if memo is None else memo
    stack = [t]
    while stack:
        cur = stack[-1]
        key = cur.ref()
        if key in memo:
            stack.pop()
            continue
        op = cur.op
        if op.type in _CONSTANT_OPS or (op.type == "Placeholder" and _scalar_or_resource(cur)):
            memo[key] = CONSTANT
            stack.pop()
            continue
        if op.type == "Placeholder" or not op.inputs:
            memo[key] = None
            stack.pop()
            continue
        if op.type in _REDUCTIONS and _reduces_batch_axis(op):
            data = op.inputs[0]
            if data.ref() not in memo:
                stack.append(data)
                continue
            memo[key] = memo[data.ref()] or REDUCED
            stack.pop()
            continue
        pending = [x for x in op.inputs if x.ref() not in memo]
        if pending:
            # Stop early: one input known to hold examples decides.
            if any(memo.get(x.ref(), CONSTANT) is None for x in op.inputs if x.ref() in memo):
                memo[key] = None
                stack.pop()
                continue
            stack.extend(pending)
            continue
        levels = [memo[x.ref()] for x in op.inputs]
        if any(lv is None for lv in levels):
            memo[key] = None
        else:
            memo[key] = REDUCED if REDUCED in levels else CONSTANT
        stack.pop()
    return memo[t.ref()]


def _scalar_or_resource(t: tf.Tensor) -> bool:
    return t.dtype == tf.resource or (t.shape.rank == 0)


def _reduces_batch_axis(op: tf.Operation) -> bool:
    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if axes is None or rank is None:
        return False
    axes = [int(a) % rank for a in (axes.reshape(-1) if hasattr(axes, "reshape") else [axes])]
    return 0 in axes


def grouped_source(
    t: tf.Tensor, after_matmul: bool = False, d_in: int | None = None
) -> tf.Tensor | None:
    """If the rows of 2-D ``t`` are the positions of several examples, the tensor they came from.

    Keras 3 Dense on ``[n, T, d]`` inputs reshapes them to ``[n * T, d]`` before ``MatMul``; the
    rows of the product (and of its bias add) are then grouped by example. ``t`` is a ``MatMul``
    input, or (``after_matmul=True``) a tensor computed from a ``MatMul`` output by bias adds.
    Returns the rank >= 3 tensor before the reshape (its first axis indexes examples), or None
    when ``t``'s rows are examples themselves. ``d_in``: the width of ``t`` if not static.
    """
    if after_matmul:
        t = _skip(t, _PASS)
        if t.op.type != "MatMul" or t.op.get_attr("transpose_a"):
            return None
        w = t.op.inputs[1]
        d_in = w.shape[-1] if t.op.get_attr("transpose_b") else w.shape[0]
        t = t.op.inputs[0]
    t = _skip(t, frozenset({"Cast", "Identity"}))
    if t.op.type != "Reshape" or t.shape.rank != 2:
        return None
    src = t.op.inputs[0]
    if src.op.type == "Transpose":  # tf.tensordot transposes, with the identity permutation
        perm = tf.get_static_value(src.op.inputs[1])
        if perm is not None and list(perm) == list(range(len(perm))):
            src = src.op.inputs[0]
    if src.shape.rank is None or src.shape.rank < 3:
        return None
    last = t.shape[-1] if t.shape[-1] is not None else d_in
    if last is None or src.shape[-1] != last:
        return None  # e.g. Flatten: the last axis is not kept, rows are examples
    return src


_PASS = frozenset({"BiasAdd", "AddV2", "Add", "Cast", "Identity"})


def _skip(t: tf.Tensor, kinds) -> tf.Tensor:
    for _ in range(8):
        if t.op.type not in kinds or not t.op.inputs:
            break
        t = t.op.inputs[0]
    return t
