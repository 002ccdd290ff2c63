"""Reading a traced graph: where a variable is read and what consumes it (where the examples
are is `tb_gradmom.core.axes`)."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

__all__ = [
    "VIEW_OPS",
    "ancestors",
    "consumers",
    "internal_handle",
    "find_sites",
    "consumers_past_views",
]

# Ops that pass a variable's value through unchanged up to shape and dtype, preserving the
# row-major order of its elements. A moment of the viewed tensor reshapes to the variable.
VIEW_OPS = frozenset({"Identity", "Cast", "ExpandDims", "Reshape", "Squeeze"})

# Ops that read a variable's value but pass no gradient to it (its shape, not its numbers).
NO_GRADIENT_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})


def ancestors(tensor: tf.Tensor, cut: set | frozenset = frozenset()) -> set[tf.Operation]:
    """All ops that ``tensor`` depends on through data inputs (including its own op), not
    crossing the edges in ``cut``: ``(op, input.ref())`` pairs."""
    seen: set[tf.Operation] = set()
    stack = [tensor.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs if not cut or (op, t.ref()) not in cut)
    return seen


def consumers(t: tf.Tensor) -> list[tf.Operation]:
    """The ops that consume ``t``, each once, in graph order.

    ``t.consumers()`` lists an op once per input that reads ``t``: ``w * w`` appears twice.
    Every walk over a tensor's uses goes through here and visits each input of an op by its
    index (``[i for i, x in enumerate(op.inputs) if x is t]``), so that no use counts twice.
    """
    return list(dict.fromkeys(t.consumers()))


def internal_handle(graph: tf.Graph, variable: tf.Variable) -> tf.Tensor | None:
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


def _captured(graph: tf.Graph, external: tf.Tensor) -> tf.Tensor | None:
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
    for read in consumers(handle):
        if read not in on_path:
            continue
        if read.type in NO_GRADIENT_OPS:
            continue
        if read.type != "ReadVariableOp":
            sites.extend(
                RawSite(read, i, handle, read) for i, x in enumerate(read.inputs) if x is handle
            )
            continue
        sites.extend(consumers_past_views(read.outputs[0], on_path, read))
    return sites


def consumers_past_views(
    t: tf.Tensor, on_path: set[tf.Operation], read: tf.Operation | None = None
) -> list[RawSite]:
    """The first non-view ops on ``on_path`` that consume ``t`` (through `VIEW_OPS`): one
    `RawSite` per input that reads the view (``w * w`` gives inputs 0 and 1, once each)."""
    sites: list[RawSite] = []
    stack = [t]
    while stack:
        t = stack.pop()
        for op in consumers(t):
            if op not in on_path or op.type in NO_GRADIENT_OPS:
                continue
            if op.type in VIEW_OPS and op.inputs[0] is t:
                stack.extend(op.outputs[:1])
                continue
            for i, inp in enumerate(op.inputs):
                if inp is t:
                    sites.append(RawSite(op, i, t, read if read is not None else t.op))
    return sites
