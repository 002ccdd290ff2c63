"""Variables used inside a ``while`` loop: Keras recurrent layers (LSTM, GRU, SimpleRNN).

Keras 3 on TensorFlow runs a recurrent layer as one ``While`` op. Its variables enter the loop as
loop-invariant resource handles, and the body reads them and uses each value in a few ops, e.g.
for an LSTM::

    z_t = x_t K + h_{t-1} R + b        (MatMul, MatMul, AddV2, BiasAdd; then the gates)

A use ``z_t = a_t D`` of a loop-invariant parameter ``D`` gives example ``j`` the gradient
``g_j(D) = sum_t a_{t,j}^T delta_{t,j}`` (``delta_t = dL/dz_t``), a bias added to ``z_t`` the
gradient ``g_j = sum_t delta_{t,j}``: the positions (here the steps) are summed before any power,
as for Dense on sequences (`tb_gradmom.core.rules.matmul`). ``D`` may be a slice, a split or an unstacked
part of the variable (GRU); its per-example gradient is scattered back into the variable's shape.
A convolution ``z_t = conv(x_t, F)`` (ConvLSTM1D/2D/3D) gives ``g_j(F) = sum_t`` of the conv
rule's per-example filter gradient of ``(x_{t,j}, delta_{t,j})`` (`tb_gradmom.core.rules.conv`).
A parameter as the initial value of a loop variable (a learned state tiled to the batch) is
`_init_rule`'s.

The ``a_t`` and ``delta_t`` live inside the loop. They are read from a *copy* of the loop, built
where the moments are computed (inside the ``tf.cond`` of a step that records them, so a step
that records nothing runs none of it): the body's ``GraphDef`` imported into a new
``tf.while_loop`` whose body is the original body with

* a *tap* at each use: the use's output ``z_t`` (or the top of the chain of additions it feeds,
  which has the same gradient) becomes ``z_t + P[t]``, ``P`` a zero tensor fed through a
  ``TensorList``;
* each use's other operand ``a_t`` written to a ``TensorList`` every step.

The copy computes the same numbers as the loop (adding zeros), from the same inputs, for the
same number of steps (the loop's own final iteration counter), so the gradient of its outputs
with respect to ``P``, seeded with the loss's gradients of the original loop's outputs (from the
step's one backward pass), is ``delta_t`` for every step at once. That costs one more forward and
backward pass of the recurrence (the variables are read once before the copy and captured, like
the time-major input: the tape builds no gradient for either), plus one batched matmul per use.

Proof, never a guess: the body is analysed (`tb_gradmom.core.axes.loop_body`) with the loop variables
at their fixed point (the time-major input's elements hold the examples on axis 0 when the outer
input holds them on axis 1; a zero initial state takes the examples' axis of its update), and a
use is accepted only where the examples' axis of ``a_t`` and ``z_t`` is proven. Anything else, a
nested loop or call, a stateful op other than a variable read (random numbers, assignments), a
statistic over the batch inside the body (the examples coupled from step to step), a use other
than a matmul, a convolution's filter or an added bias, a float16 loop (mixed precision), raises
`RuleError` and the core takes the exact fallback.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core.rules.base import (
    Contribution,
    RuleError,
    Site,
    example_count,
    per_example_masked,
    power_sums_of,
    static_chunks_only,
    sum_over_chunks,
)
from tb_gradmom.core.rules.conv import ConvSpec, conv_contribution, conv_spec

__all__ = ["LOOP_OPS", "LoopGrads", "loop_outputs", "recurrent_rule"]

LOOP_OPS = frozenset({"While", "StatelessWhile"})

# The power sums take the per-example gradients of at most this many elements at once (1 MiB in
# float32; with their squares, 2 MiB): a variable's examples go in parts of
# _CHUNK_ELEMENTS // its size, or fewer where the copy's stacks are small (`_Loop.part_elements`).
# The copy of the loop already holds stacks bigger than that (for
# an LSTM(128) at T 50 and batch 64, the output gradients of its gates are 1.6M elements), while
# the core's default chunk (8M elements) lets the per-example recurrent kernels of the whole
# batch (4M elements) and their squares dominate the step's memory (peak 50 MB against 13 MB
# for the plain step; 4 MiB chunks: 29 MB; these: 17-18 MB).
_CHUNK_ELEMENTS = 1 << 18
# The copy of the loop runs on chunks of examples whose stacks (deltas at the taps, recorded
# operands; a list of the steps and its stack) hold at most this many elements (20 MiB in
# float32), one chunk after the other: its memory no longer grows with the batch (GRU(128), T 50,
# batch 64: 93k elements per example, 5.9M in all: two chunks of 32, peak 28 -> 15.5 MB against
# 11.4 MB plain). Each chunk is one more pass of the recurrence, a cost in step time (LSTM(128),
# 4.3M elements, one chunk: with two, its moments step took 174 ms against 94, one 7-round run
# at load 10; with three, 1.8x too), so the budget is not smaller.
_COPY_ELEMENTS = 5 << 20
# At most this many chunks of per-example gradients are summed unrolled (chunks chained by control
# dependencies); more go in a tf.while_loop (one chunk's ops traced). Each unrolled chunk is ops to
# trace and optimise on the first call: with 16 (LSTM(128), batch 64: 16 chunks of 4 examples of
# its recurrent kernel) the moments step's trace + first call took 2.52x the plain step's, with 2
# (a loop) 2.08x, its step time unchanged (2.00x against 1.98x, 7 interleaved rounds, load 0.6-1.3).
_UNROLL = 2

# Ops in a body that would make the copy differ from the loop, or that the copy cannot import.
_CALL_OPS = frozenset(
    {
        "While",
        "StatelessWhile",
        "If",
        "StatelessIf",
        "Case",
        "StatelessCase",
        "PartitionedCall",
        "StatefulPartitionedCall",
    }
)
# Stateful ops that read, and do not change, what the copy reads.
_READS = frozenset({"ReadVariableOp"})
# Views of the variable's value inside the body (their per-example gradient is a scatter).
_VIEWS = frozenset(
    {
        "Identity",
        "Snapshot",
        "Split",
        "SplitV",
        "Unpack",
        "Squeeze",
        "ExpandDims",
        "Reshape",
        "Transpose",
        "StridedSlice",
        "Slice",
        "GatherV2",
    }
)
_ADDS = frozenset({"AddV2", "Add", "BiasAdd", "Sub"})
# Convolutions whose filter the body may read (Keras' ConvLSTM1D/2D/3D; Conv1D is ExpandDims ->
# Conv2D): the conv rule's per-example filter gradients (`tb_gradmom.core.rules.conv`).
_CONVS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative"})
_NO_GRADIENT = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})


class LoopGrads(NamedTuple):
    """What the core passes as ``delta`` for a loop site.

    Attributes:
      grads: the gradients of the scalar loss with respect to the loop's outputs that reach the
        loss (``Site.output``, a tuple; None where a gradient is structurally zero), as
        ``tf.gradients`` gives them (a ``TensorList``'s gradient is a ``TensorList``).
      factor: the number (a Python float or a scalar tensor in the moment dtype) by which the
        core scales an unscaled output gradient (the batch size for a mean loss, the loss
        scale's inverse): the per-example gradients are linear in the seeds, so it multiplies
        them.
    """

    grads: tuple
    factor: object


def num_original_outputs(op: tf.Operation) -> int:
    """The loop's outputs before TensorFlow's gradient added its accumulators."""
    try:
        return int(op.get_attr("_num_original_outputs"))
    except (ValueError, TypeError):
        return len(op.outputs)


def loop_outputs(op: tf.Operation, on_path) -> tuple:
    """The outputs of loop ``op`` through which the loss depends on it (floating point tensors
    and ``TensorList``s consumed on ``on_path``): the site's ``output``."""
    return tuple(
        t
        for t in op.outputs[: num_original_outputs(op)]
        if (t.dtype.is_floating or t.dtype == tf.variant)
        and any(c in on_path for c in t.consumers())
    )


# --- the analysis of the body --------------------------------------------------------------------


@dataclass(frozen=True)
class _Tap:
    name: str  # the tapped tensor in the body
    dtype: tf.DType
    dims: tuple  # static dims, None at the examples' axis
    axis: int  # the examples' axis


@dataclass(frozen=True)
class _Record:
    name: str  # the recorded tensor in the body (a use's other operand)
    dtype: tf.DType
    dims: tuple
    axis: int


@dataclass(frozen=True)
class _Use:
    """One use of (a view of) the variable inside the body."""

    kind: str  # "matmul" or "bias"
    tap: _Tap
    shape: tuple  # the shape of the used view
    # the view's elements' flat positions in the variable's value (None: the value itself)
    positions: np.ndarray | None
    record: _Record | None = None  # matmul: the other operand
    transpose_out: bool = False  # matmul: the rows-form gradient is the view's transpose
    sign: float = 1.0  # bias: -1 for the subtrahend of a Sub
    keep: tuple = ()  # bias: the tap's axes (besides the examples') that the view spans
    conv: ConvSpec | None = None  # conv: the convolution (the view is its filter)


def _dims(t: tf.Tensor, axis: int, what: str) -> tuple:
    if t.shape.rank is None:
        raise RuleError(f"the rank of {what} '{t.name}' inside the loop is not static")
    dims = list(t.shape.as_list())
    if any(d is None for i, d in enumerate(dims) if i != axis):
        raise RuleError(f"the shape of {what} '{t.name}' inside the loop is not static")
    dims[axis] = None
    return tuple(dims)


def _pure_axis(sub, t: tf.Tensor, what: str) -> int:
    st = sub.of(t)
    if not isinstance(st, _axes.Axis) or not st.pure:
        why = f" (stopped at {sub.why(t)})" if st == _axes.UNKNOWN else ""
        raise RuleError(
            f"the examples' axis of {what} '{t.name}' inside the loop is not proven: "
            f"{_axes.describe(st)}{why}"
        )
    return st.axis


def _static(t: tf.Tensor, what: str) -> np.ndarray:
    v = tf.get_static_value(t)
    if v is None:
        raise RuleError(f"the {what} of a view of the variable inside the loop is not static")
    return np.asarray(v)


def _strided_slice(op: tf.Operation, m: np.ndarray) -> np.ndarray:
    if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        raise RuleError("a strided slice of the variable with an ellipsis or a new axis")
    begin, end, strides = (_static(op.inputs[i], "slice") for i in (1, 2, 3))
    bm, em, sm = (op.get_attr(k) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
    index: list[int | slice] = []
    for i in range(len(begin)):
        if sm >> i & 1:
            index.append(int(begin[i]))
            continue
        b = None if bm >> i & 1 else int(begin[i])
        e = None if em >> i & 1 else int(end[i])
        index.append(slice(b, e, int(strides[i])))
    return m[tuple(index)]


def _view_positions(op: tf.Operation, index: int, m: np.ndarray) -> list:
    """The positions held by each output of view ``op`` whose input ``index`` holds ``m``."""
    ty = op.type
    if ty in ("Identity", "Snapshot"):
        return [m]
    if ty == "Split":
        if index != 1:
            raise RuleError("the variable is the split dimension")
        axis = int(_static(op.inputs[0], "split dimension"))
        return np.split(m, int(op.get_attr("num_split")), axis=axis)
    if ty == "SplitV":
        if index != 0:
            raise RuleError("the variable is a size of a split")
        sizes = [int(s) for s in _static(op.inputs[1], "split sizes")]
        axis = int(_static(op.inputs[2], "split dimension"))
        if any(s < 0 for s in sizes):
            sizes[sizes.index(-1)] = m.shape[axis] - sum(s for s in sizes if s >= 0)
        return np.split(m, np.cumsum(sizes)[:-1], axis=axis)
    if ty == "Unpack":
        axis = int(op.get_attr("axis"))
        return [np.take(m, i, axis=axis) for i in range(int(op.get_attr("num")))]
    if index != 0:
        raise RuleError(f"the variable is not the data input of {ty}")
    if ty == "Squeeze":
        dims = list(op.get_attr("squeeze_dims"))
        return [np.squeeze(m, axis=tuple(dims)) if dims else np.squeeze(m)]
    if ty == "ExpandDims":
        return [np.expand_dims(m, int(_static(op.inputs[1], "axis")))]
    if ty == "Reshape":
        return [m.reshape([int(d) for d in _static(op.inputs[1], "shape")])]
    if ty == "Transpose":
        return [np.transpose(m, [int(p) for p in _static(op.inputs[1], "permutation")])]
    if ty == "StridedSlice":
        return [_strided_slice(op, m)]
    if ty == "Slice":
        begin = [int(b) for b in _static(op.inputs[1], "begin")]
        size = [int(s) for s in _static(op.inputs[2], "size")]
        region = tuple(slice(b, None if s == -1 else b + s) for b, s in zip(begin, size))
        return [m[region]]
    if ty == "GatherV2":
        if op.get_attr("batch_dims"):
            raise RuleError("a batched gather of the variable")
        idx = _static(op.inputs[1], "indices")
        if len(np.unique(idx)) != idx.size:
            raise RuleError("a gather of the variable that repeats entries")
        return [np.take(m, idx, axis=int(_static(op.inputs[2], "axis")))]
    raise RuleError(f"{ty} of the variable inside the loop")  # pragma: no cover


def _tap_of(z: tf.Tensor, sub, outputs) -> tf.Tensor:
    """The top of the chain of additions that ``z`` alone feeds, each keeping its shape and
    examples' axis: its gradient is ``z``'s, so uses along the chain share one tap."""
    st = sub.of(z)
    while not any(o is z for o in outputs):
        consumers = z.consumers()
        if len(consumers) != 1:
            break
        c = consumers[0]
        if c.type not in ("AddV2", "Add", "BiasAdd") or sum(x is z for x in c.inputs) != 1:
            break
        if c.type == "BiasAdd" and c.inputs[0] is not z:
            break
        out = c.outputs[0]
        if out.shape.rank is None or out.shape.as_list() != z.shape.as_list():
            break
        if sub.of(out) != st:
            break
        z = out
    return z


@dataclass
class _Loop:
    """One while loop: what the copy needs, the uses registered by the rules of its variables,
    and the copies built (one per graph and set of seeds)."""

    op: tf.Operation
    body: tf.Graph  # the loop body's FuncGraph
    sub: _axes.Examples  # the example axes inside the body
    body_def: bytes
    inputs: list
    carried: list
    invariant: list
    # reads of loop-invariant handles in the body: (the read's output name, input index, dtype)
    reads: list = field(default_factory=list)
    taps: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)
    built: dict = field(default_factory=dict)
    # per loop input, how a chunk of its examples is taken (`_slicing`); None: the copy cannot
    # run on a chunk of the examples (it then runs on the whole batch)
    slicing: list | None = None
    steps_static: int | None = None  # the number of steps, if an input shows it statically
    # the registered variables: key -> (uses, shape, size)
    variables: dict = field(default_factory=dict)
    # carried loop variables whose initial value is a parameter (`_init_rule`): input index ->
    # the examples' axis of the loop variable inside the body
    inits: dict = field(default_factory=dict)

    def register(self, uses, key=None, shape=(), size=0, dtype=tf.float32) -> None:
        for u in uses:
            self.taps.setdefault(u.tap.name, u.tap)
            if u.record is not None:
                self.records.setdefault(u.record.name, u.record)
        if key is not None:
            self.variables.setdefault(key, (tuple(uses), tuple(shape), int(size), dtype))

    def copy_elements(self) -> int:
        """Elements one example holds in the copy's stacks of deltas and records (twice: a
        list of the steps and its stack), which `chunk_sums` bounds."""
        width = 0
        for t in list(self.taps.values()) + list(self.records.values()):
            width += int(np.prod([d for d in t.dims if d is not None]))
        return 2 * width * (self.steps_static or 128)

    def part_elements(self, examples) -> int:
        """Per-example gradient elements summed at once, for a copy run on ``examples``
        examples (a Python int, or None when unknown): `_CHUNK_ELEMENTS`, or a quarter of the
        copy's stacks when that is less. A small recurrence's step holds a few MB (the LSTM(64)
        of ``bench_core.py``: 2.2 MB), which a full 1 MiB part (and its square) outgrows."""
        if examples is None:
            return _CHUNK_ELEMENTS
        stacks = self.copy_elements() // 2 * int(examples)
        return max(1, min(_CHUNK_ELEMENTS, stacks // 4))

    def chunk_sums(self, grads: tuple, outputs: tuple, n, orders: tuple, chunk: int):
        """``{variable key: {p: sum_j g_j ** p}}`` (unscaled) for every registered variable,
        from copies of the loop run on chunks of at most ``chunk`` examples, one after the
        other in a ``tf.while_loop`` (one copy traced): only one chunk's stacks are alive.
        None when the seeds cannot be sliced (the caller uses the whole batch's stacks)."""
        if self.slicing is None:
            return None
        seeds: list[tuple | None] = []
        for t, g in zip(outputs, grads):
            if g is None or t.value_index not in self.carried:
                seeds.append(None)
                continue
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            how = self.slicing[t.value_index]
            if how is None:  # holds no examples
                return None
            if how[0] == "dense":
                seeds.append(("dense", how[1], g))
            elif g.op.type == "TensorListFromTensor" and how[0] in ("reserve", "from_tensor"):
                seeds.append(("list", how[1], g.op))
            else:
                return None
        graph = tf.compat.v1.get_default_graph()
        key: tuple = ("chunks", id(graph), tuple(None if g is None else id(g) for g in grads))
        key += (tuple(sorted(self.taps)), tuple(sorted(self.records)))
        key += (tuple(self.variables), tuple(orders), int(chunk))
        hit = self.built.get(key)
        if hit is not None and hit[0] is graph:
            return hit[1]
        names = list(self.variables)
        zeros = tuple(
            tf.zeros(self.variables[k][1], self.variables[k][3]) for k in names for _ in orders
        )
        n_static = tf.get_static_value(n)
        xla = static_chunks_only()
        if xla and n_static is None:
            return None  # no chunk of a static size: the copy runs on the whole batch
        static = None  # a chunk size that divides a static batch: every chunk's shapes static
        rest = 0  # under XLA, the examples left after the chunks of `static` examples
        if n_static is not None:  # as even as their number allows: 64 in chunks of 45 -> 32
            chunk = -(-int(n_static) // -(-int(n_static) // chunk))
            static = next(
                (d for d in range(chunk, (chunk + 1) // 2 - 1, -1) if int(n_static) % d == 0), None
            )
            if static is None and xla:  # chunks of `chunk`, then one of the rest
                static, rest = chunk, int(n_static) % chunk
            chunk = chunk if static is None else static
        n_t = tf.convert_to_tensor(n, tf.int32)
        count = (n_t + chunk - 1) // chunk if not rest else int(n_static) // chunk

        def one_chunk(start, size) -> list:
            inputs = [self._slice_input(k, start, size) for k in range(len(self.inputs))]
            chunk_grads = tuple(
                None if sd is None else _slice_seed(sd, start, size) for sd in seeds
            )
            stacks = self._build(chunk_grads, outputs, size, inputs)
            new: list = []
            for k in names:
                sums = self._variable_sums(k, stacks, size, orders, chunk)
                new.extend(sums[p] for p in orders)
            return new

        def body(i, accs):
            start = i * chunk
            size = static if static is not None else tf.minimum(chunk, n_t - start)
            return i + 1, tuple(a + b for a, b in zip(accs, one_chunk(start, size)))

        _, accs = tf.while_loop(
            lambda i, _: i < count,
            body,
            (tf.constant(0), zeros),
            parallel_iterations=1,
            maximum_iterations=count if xla else None,
            name="gradmom_copy_chunks",
        )
        if rest:
            with tf.control_dependencies(list(accs)):
                accs = tuple(a + b for a, b in zip(accs, one_chunk(int(n_static) - rest, rest)))
        out = {}
        for j, k in enumerate(names):
            out[k] = {p: accs[j * len(orders) + q] for q, p in enumerate(orders)}
        self.built[key] = (graph, out)
        return out

    def _variable_sums(self, key, stacks, size, orders, chunk) -> dict:
        """``{p: sum_j g_j ** p}`` over the ``size`` examples of one chunk's stacks, at most
        `part_elements` per-example elements at once (`sum_over_chunks`: up to `_UNROLL`
        parts unrolled, more in one traced loop)."""
        uses, shape, flat, dtype = self.variables[key]
        own = max(1, self.part_elements(chunk) // max(flat, 1))

        def part_sums(start, count):
            g = _variable_gradients(uses, stacks, start, count, shape, flat, dtype)
            return power_sums_of(g, orders)

        if own >= chunk:  # the whole chunk in one part, whether its size is static or not
            return part_sums(0, size)
        return sum_over_chunks(
            size, own, orders, shape, dtype, part_sums, name="gradmom_parts", unroll=_UNROLL
        )

    def _open_items(self, gdef, nodes, size=-1) -> None:
        """For a copy on a chunk of the examples: the items read from a sliced list get an
        element shape with the examples' axis open (the body's says the whole batch's size,
        which would pin the shapes of the copy's accumulators to it)."""
        assert self.slicing is not None
        lists = {}
        for i, how in enumerate(self.slicing):
            if how is not None and how[0] != "dense":
                lists[self.body.inputs[i].op.name] = how[1]
        for o in self.body.get_operations():
            if o.type != "TensorListGetItem":
                continue
            src = o.inputs[0].op
            while src.type == "Identity":
                src = src.inputs[0].op
            if src.name not in lists:
                continue
            shape = tf.get_static_value(o.inputs[2])
            if shape is None or np.ndim(shape) != 1:
                continue
            shape = np.array(shape)
            shape[lists[src.name]] = size
            const = gdef.node.add()
            const.name = o.name + "/gradmom_open_shape"
            const.op = "Const"
            const.attr["dtype"].type = o.inputs[2].dtype.as_datatype_enum
            const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(shape, o.inputs[2].dtype))
            nodes[o.name].input[2] = const.name

    def _slice_input(self, k: int, start, size):
        """Loop input ``k`` restricted to the examples ``[start, start + size)``."""
        t = self.inputs[k]
        how = self.slicing[k] if self.slicing is not None else None
        if how is None:
            return t
        kind, axis = how
        if kind == "dense":
            return _slice_examples(t, axis - 1, start, size)
        src = _list_source(t)
        if kind == "reserve":
            return tf.raw_ops.TensorListReserve(
                element_shape=_open_axis(src.inputs[0], axis, size),
                num_elements=src.inputs[1],
                element_dtype=src.get_attr("element_dtype"),
            )
        return tf.raw_ops.TensorListFromTensor(
            tensor=_slice_examples(src.inputs[0], axis, start, size),
            element_shape=_open_axis(src.inputs[1], axis, size),
        )

    # --- the copy --------------------------------------------------------------------------

    def stacks(self, grads: tuple, outputs: tuple, n) -> dict:
        """``{tensor name in the body: [T, *element] stack over the steps}``: ``delta`` at every
        tap and every recorded operand, time-major (the examples on the tap's or record's
        ``axis`` of the element), from a copy of the loop built in the current graph (once per
        graph and seeds). Chunks of examples are sliced from them (`_chunk_of`)."""
        graph = tf.compat.v1.get_default_graph()
        key: tuple = (id(graph), tuple(None if g is None else id(g) for g in grads))
        key += (tuple(sorted(self.taps)), tuple(sorted(self.records)), tuple(sorted(self.inits)))
        hit = self.built.get(key)
        if hit is not None and hit[0] is graph:
            return hit[1]
        out = self._build(grads, outputs, n, inits=tuple(sorted(self.inits)))
        self.built[key] = (graph, out)
        return out

    def _invariant(self, i: int, size=None) -> tf.TensorShape:
        """Loop variable ``i``'s shape across steps: the body's, with the examples' axis set to
        ``size`` when it is a static number of examples above one, else left open (the copy's
        shape inference may not pin a batch of one down). Static shapes matter: with the axis
        open, the copy's gradient accumulates the operands' shapes of every broadcasting op at
        every step (GRU(128) on chunks of 32 examples: 29 accumulators instead of 13)."""
        shape = self.body.inputs[i].shape
        st = self.sub.of(self.body.inputs[i])
        if shape.rank is None or not isinstance(st, _axes.Axis):
            return shape
        dims = shape.as_list()
        dims[st.axis] = size if isinstance(size, int) and size > 1 else None
        return tf.TensorShape(dims)

    def _build(self, grads, outputs, n, inputs=None, inits=()) -> dict:
        """The copy's stacks; ``inputs``: the loop's inputs to run it on (default: the loop's
        own; `chunk_sums` passes a chunk of the examples of each). ``inits``: carried loop
        variables whose initial value's gradient is wanted too (``init:<index>``: the gradient
        of the loss with respect to that input of the loop, shaped like it)."""
        if inputs is None:
            inputs = self.inputs
        gdef = tf.compat.v1.GraphDef.FromString(self.body_def)
        taps = [self.taps[k] for k in sorted(self.taps)]
        records = [self.records[k] for k in sorted(self.records)]
        nodes = {nd.name: nd for nd in gdef.node}
        if inputs is not self.inputs:
            self._open_items(gdef, nodes, n if isinstance(n, int) and n > 1 else -1)
        for i, tap in enumerate(taps):
            node_name = tap.name.rsplit(":", 1)[0]
            nodes[node_name].name = node_name + "/gradmom_untapped"
            ph = gdef.node.add()
            ph.name = f"gradmom_tap_{i}"
            ph.op = "Placeholder"
            ph.attr["dtype"].type = tap.dtype.as_datatype_enum
            add = gdef.node.add()
            add.name = node_name
            add.op = "AddV2"
            add.input.extend([node_name + "/gradmom_untapped", ph.name])
            add.attr["T"].type = tap.dtype.as_datatype_enum

        body_in = [t.name for t in self.body.inputs]
        body_out = [t.name for t in self.body.outputs]
        position = {name: i for i, name in enumerate(body_in)}
        # The placeholders that `input_map` replaces (the body's inputs, the taps) are left out
        # of the import: unused, they would still be ops of the copy's body, which XLA compiles
        # whole (and has no kernel for a Placeholder).
        # whole (and has no kernel for a Placeholder). A body input that no op reads is then
        # in the graph nowhere, and is left out of `input_map` too (the import refuses a key it
        # cannot find).
        mapped = {t.split(":")[0] for t in body_in} | {f"gradmom_tap_{i}" for i in range(len(taps))}
        kept = [nd for nd in gdef.node if not (nd.op == "Placeholder" and nd.name in mapped)]
        read = {x.lstrip("^").split(":")[0] for nd in kept for x in nd.input}
        unread = mapped - read
        del gdef.node[:]
        gdef.node.extend(kept)
        steps = self.op.outputs[0]  # the loop's final iteration counter: how many steps it ran
        # Under XLA a list has a size known at compile time, and a loop's gradient needs its
        # most iterations: both the steps the inputs show (`recurrent_rule` checks there are).
        # Items past the last step are never set and stack as zeros, which add nothing.
        bound = self.steps_static if static_chunks_only() else None
        items = steps if bound is None else bound

        def element_shape(dims):
            return tf.constant([-1 if d is None else d for d in dims], tf.int32)

        def full_shape(dims):
            return tf.stack([items] + [n if d is None else d for d in dims])

        def item_shape(dims):  # an item's full shape, the batch included
            return tf.stack([tf.cast(n, tf.int32) if d is None else d for d in dims])

        # The variables, read once before the copy (none changes inside the loop: no stateful
        # op but reads there) and captured: the copy's backward then neither accumulates a
        # read per step nor builds the variables' gradients.
        values = {
            name: tf.raw_ops.ReadVariableOp(resource=inputs[i], dtype=dtype)
            for name, i, dtype in self.reads
        }
        nc = len(self.carried)
        iterations = self.op.get_attr("parallel_iterations")
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            # the taps' P: lists of T items never set, which read as zeros of the item's
            # shape (no [T, n, ...] zero tensor is allocated); the gradient with respect to a
            # list is the list of its items' gradients
            tap_lists = [
                tf.raw_ops.TensorListReserve(
                    element_shape=item_shape(t.dims), num_elements=items, element_dtype=t.dtype
                )
                for t in taps
            ]
            tape.watch(tap_lists)
            init_values = [tf.identity(inputs[i]) for i in inits]
            tape.watch(init_values)
            initial = dict(zip(inits, init_values))
            # Under XLA the records are kept as integers of the same width (a bitcast, no
            # copy): a list of floats carried by a loop is differentiable, and the loop's
            # gradient then takes zeros like it at every step, which needs the list itself at
            # every step (a list of lists, which XLA's compiler aborts on); a list of integers
            # gets no gradient.
            stored = {r.name: _BITS[r.dtype] if bound is not None else r.dtype for r in records}
            rec_lists = [
                tf.raw_ops.TensorListReserve(
                    element_shape=element_shape(r.dims),
                    num_elements=items,
                    element_dtype=stored[r.name],
                )
                for r in records
            ]

            def cond(*loop_vars):
                return loop_vars[0] < steps

            def body(*loop_vars):
                carried = loop_vars[:nc]
                t_lists = loop_vars[nc : nc + len(taps)]
                r_lists = loop_vars[nc + len(taps) :]
                step = carried[0]  # the loop counter: 0, 1, ... (checked by the rule)
                mapping = {}
                for j, i in enumerate(self.carried):
                    mapping[body_in[i]] = carried[j]
                for i in self.invariant:
                    mapping[body_in[i]] = tf.identity(inputs[i])  # captured, not carried
                for name, value in values.items():
                    mapping[name] = tf.identity(value)
                for i, (tap, lst) in enumerate(zip(taps, t_lists)):
                    mapping[f"gradmom_tap_{i}:0"] = tf.raw_ops.TensorListGetItem(
                        input_handle=lst,
                        index=step,
                        element_shape=item_shape(tap.dims),
                        element_dtype=tap.dtype,
                    )
                wanted = [body_out[i] for i in self.carried] + [r.name for r in records]
                fetch = [w for w in wanted if w not in position]
                got = tf.graph_util.import_graph_def(
                    gdef,
                    input_map={k: v for k, v in mapping.items() if k.split(":")[0] not in unread},
                    return_elements=fetch,
                    name="gradmom_copy",
                )
                found = dict(zip(fetch, got))
                for w in wanted:
                    if w in position:
                        found[w] = mapping[w]
                new = [found[body_out[i]] for i in self.carried]
                # the records are read, never differentiated: no gradient pass through them
                new_records = [
                    tf.stop_gradient(
                        tf.raw_ops.TensorListSetItem(
                            input_handle=lst,
                            index=step,
                            item=_as(tf.stop_gradient(found[r.name]), stored[r.name]),
                        )
                    )
                    for r, lst in zip(records, r_lists)
                ]
                return new + list(t_lists) + new_records

            loop_vars = [initial.get(i, inputs[i]) for i in self.carried] + tap_lists + rec_lists
            invariants = [self._invariant(i, n) for i in self.carried]
            invariants += [tf.TensorShape([])] * (len(tap_lists) + len(rec_lists))
            result = tf.while_loop(
                cond,
                body,
                loop_vars,
                shape_invariants=invariants,
                parallel_iterations=iterations,
                maximum_iterations=bound,
                name="gradmom_loop_copy",
            )
        ys, seeds_y = [], []
        for t, g in zip(outputs, grads):
            if g is None or t.value_index not in self.carried:
                continue  # unconnected, or a loop-invariant input passed through
            ys.append(result[self.carried.index(t.value_index)])
            seeds_y.append(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g)
        out = {}
        lists = [None] * len(taps)
        init_grads: list = [None] * len(inits)
        if ys:
            found = tape.gradient(ys, tap_lists + init_values, output_gradients=seeds_y)
            lists, init_grads = found[: len(taps)], found[len(taps) :]
        for i, v, g in zip(inits, init_values, init_grads):
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            out[f"init:{i}"] = tf.zeros_like(v) if g is None else g
        # One stack after the other: a list's items are freed once it is stacked, so at most
        # one tap is held twice (its list and its stack) instead of all of them.
        deltas: list = []
        for tap, lst in zip(taps, lists):
            if lst is None:
                deltas.append(tf.zeros(full_shape(tap.dims), tap.dtype))
                continue
            with tf.control_dependencies(deltas[-1:]):
                deltas.append(
                    tf.raw_ops.TensorListStack(
                        input_handle=lst,
                        element_shape=item_shape(tap.dims),
                        element_dtype=tap.dtype,
                    )
                )
        for tap, d in zip(taps, deltas):
            out[tap.name] = d
        for r, lst in zip(records, result[nc + len(taps) :]):
            stack = tf.raw_ops.TensorListStack(
                input_handle=lst, element_shape=element_shape(r.dims), element_dtype=stored[r.name]
            )
            out[r.name] = _as(stack, r.dtype)
        return out


# The integer type of each float type's width, for records kept as bits under XLA (`_build`).
_BITS = {
    tf.float16: tf.int16,
    tf.bfloat16: tf.int16,
    tf.float32: tf.int32,
    tf.float64: tf.int64,
}


def _as(t: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``t`` bitcast to ``dtype`` (the same width), or ``t`` when it already is."""
    return t if t.dtype == dtype else tf.bitcast(t, dtype)


def _slice_examples(stack: tf.Tensor, axis: int, start, size) -> tf.Tensor:
    """Examples ``[start, start + size)`` of a ``[T, *element]`` stack whose elements hold the
    examples on ``axis`` (same layout)."""
    if isinstance(start, int) or not isinstance(size, int):
        index = (slice(None),) * (axis + 1) + (slice(start, start + size),)
        return stack[index]
    # a tensor start and a static size: a Slice, whose output keeps the size in its shape
    rank = stack.shape.rank
    begin = tf.stack([0] * (axis + 1) + [start] + [0] * (rank - axis - 2))
    return tf.slice(stack, begin, [-1] * (axis + 1) + [size] + [-1] * (rank - axis - 2))


def _chunk_of(stack: tf.Tensor, axis: int, start, size) -> tf.Tensor:
    """Examples ``[start, start + size)`` of a ``[T, *element]`` stack whose elements hold the
    examples on ``axis``, as ``[size, T, *other element axes]``. The stacks stay time-major
    and only a chunk is transposed at a time: no full-batch copy of a stack besides it."""
    rank = stack.shape.rank
    perm = [axis + 1, 0] + [k + 1 for k in range(rank - 1) if k != axis]
    return tf.transpose(_slice_examples(stack, axis, start, size), perm)


def _open_axis(element_shape: tf.Tensor, axis: int, size=-1) -> tf.Tensor:
    """A list's element shape with the examples' ``axis`` left open (-1), or set to a static
    chunk ``size`` (a Python int)."""
    rank = element_shape.shape.num_elements() if element_shape.shape.rank == 1 else None
    if rank is None:  # an unknown rank (-1): nothing to open
        return element_shape
    mask = np.zeros(rank, element_shape.dtype.as_numpy_dtype)
    mask[axis] = 1
    value = size if isinstance(size, int) and size > 1 else -1
    return element_shape * (1 - mask) + value * mask


def _slice_seed(seed, start, size):
    """A seed (the gradient of a loop output) restricted to the examples of a chunk."""
    kind, axis, g = seed
    if kind == "dense":
        return _slice_examples(g, axis - 1, start, size)
    return tf.raw_ops.TensorListFromTensor(  # g: the seed list's TensorListFromTensor op
        tensor=_slice_examples(g.inputs[0], axis, start, size),
        element_shape=_open_axis(g.inputs[1], axis, size),
    )


def _variable_gradients(uses, stacks, start, count, shape, size, dtype) -> tf.Tensor:
    """``[count, *shape]``: the per-example gradients of a variable from its ``uses``, for the
    examples ``[start, start + count)`` of the stacks, unscaled."""
    g = None
    for u in uses:
        part = _use_gradients(u, stacks, start, count, dtype)
        if u.positions is None:
            part = tf.reshape(part, [-1, *shape])
        else:
            part = tf.reshape(_scatter(u, part, size), [-1, *shape])
        g = part if g is None else g + part
    return g


# Loops analysed in one call of the core (keyed by its `Examples`), by op name: one analysis, one
# set of taps and one copy per graph for all the loop's variables.
_LOOPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_counter(op, body) -> None:
    """Input 0 is ``while_v2``'s iteration counter: 0 on entry, plus 1 per step."""
    start = tf.get_static_value(op.inputs[0])
    if start is None or int(start) != 0 or op.inputs[0].dtype != tf.int32:
        raise RuleError("the loop's first variable is not an iteration counter from 0")
    t = body.outputs[0]
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    ok = t.op.type in ("AddV2", "Add") and len(t.op.inputs) == 2
    if ok:
        a, b = t.op.inputs
        one = tf.get_static_value(b)
        ok = a is body.inputs[0] and one is not None and int(one) == 1
    if not ok:
        raise RuleError("the loop's first variable is not an iteration counter plus 1")


def _loop(site: Site) -> _Loop:
    op = site.op
    per_call = _LOOPS.setdefault(site.axes, {})
    if op.name in per_call:
        found = per_call[op.name]
        if isinstance(found, RuleError):
            raise found
        return found
    try:
        per_call[op.name] = _analyse(site)
    except RuleError as e:
        per_call[op.name] = e
        raise
    return per_call[op.name]


def _analyse(site: Site) -> _Loop:
    op = site.op
    found = _axes.loop_body(site.axes, op)
    if found is None:
        raise RuleError("the examples' axes of the loop's variables do not settle")
    body, sub = found
    n_in = len(op.inputs)
    if len(body.inputs) != n_in or len(body.outputs) != n_in:
        raise RuleError("the loop's body does not match its inputs")
    _check_counter(op, body)
    for o in body.get_operations():
        if o.type in _CALL_OPS:
            raise RuleError(f"the loop's body holds a {o.type} (a nested loop or call)")
        if o.op_def.is_stateful and o.type not in _READS:
            raise RuleError(
                f"the loop's body holds the stateful {o.type} op '{o.name}' (a copy of the "
                "loop would not compute the same numbers)"
            )
        if sub.n_static != 1 and any(sub.of(t) == _axes.REDUCED for t in o.outputs):
            # a batch statistic inside the recurrence couples the examples from step to step:
            # the fallback's per-example losses' jacobian is the definition there
            raise RuleError(
                f"the examples are not proven apart inside the loop: {o.type} op '{o.name}' "
                "holds a statistic over the batch"
            )
    invariant = [i for i in range(n_in) if body.outputs[i] is body.inputs[i]]
    carried = [i for i in range(n_in) if i not in invariant]
    if 0 not in carried:
        raise RuleError("the loop's counter is not carried")
    for i in carried:
        if op.inputs[i].dtype == tf.resource:
            raise RuleError("a resource handle changes from step to step")
    body_def = body.as_graph_def()
    try:  # the copy must import: find out now, while the core can still fall back
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(body_def, name="")
    except Exception as e:  # noqa: BLE001 - any failure means: no rule for this loop
        raise RuleError(f"the loop's body cannot be copied ({type(e).__name__})") from None
    placeholders = {body.inputs[i].op: i for i in invariant}
    reads = [
        (o.outputs[0].name, placeholders[o.inputs[0].op], o.get_attr("dtype"))
        for o in body.get_operations()
        if o.type == "ReadVariableOp" and o.inputs[0].op in placeholders
    ]
    slicing, steps = _slicing(op, body, sub)
    return _Loop(
        op=op,
        body=body,
        sub=sub,
        body_def=body_def.SerializeToString(),
        inputs=list(op.inputs),
        carried=carried,
        invariant=invariant,
        reads=reads,
        slicing=slicing,
        steps_static=steps,
    )


def _list_source(t: tf.Tensor) -> tf.Operation:
    src = t.op
    while src.type == "Identity":
        src = src.inputs[0].op
    return src


def _slicing(op: tf.Operation, body, sub) -> tuple[list | None, int | None]:
    """Per loop input, how the copy takes a chunk of its examples: None (it holds none: the
    same input), ``("dense", axis)`` (a slice on that axis), ``("reserve", axis)`` or
    ``("from_tensor", axis)`` (a ``TensorList`` made by that op, its elements holding the
    examples on ``axis``: the list made again for the chunk). None for the whole list when an
    input holds examples some other way (the copy then runs on the whole batch). Also the
    number of steps if a list made from a tensor shows it."""
    how: list = []
    steps = None
    for i, t in enumerate(op.inputs):
        st = sub.of(body.inputs[i])
        if st == _axes.FREE or (isinstance(st, _axes.Elements) and st.of == _axes.FREE):
            how.append(None)
        elif isinstance(st, _axes.Axis) and st.pure and t.dtype != tf.variant:
            if t.shape.rank is None:
                return None, None
            how.append(("dense", st.axis))
        elif isinstance(st, _axes.Elements) and isinstance(st.of, _axes.Axis) and st.of.pure:
            src = _list_source(t)
            if src.type == "TensorListReserve":
                how.append(("reserve", st.of.axis))
            elif src.type == "TensorListFromTensor":
                how.append(("from_tensor", st.of.axis))
                if src.inputs[0].shape.rank and src.inputs[0].shape[0] is not None:
                    steps = int(src.inputs[0].shape[0])
            else:
                return None, None
            if src.inputs[0 if src.type == "TensorListReserve" else 1].shape.rank != 1:
                return None, None
        else:
            return None, None
    return how, steps


def _roots(site: Site, loop: _Loop) -> list:
    """The tensors inside the body that hold the variable's value (shaped like ``site.view``'s
    value)."""
    op, body, sub = site.op, loop.body, loop.sub
    if sum(1 for x in op.inputs if x is site.view) != 1:
        raise RuleError("the variable enters the loop more than once")
    if site.index not in loop.invariant:  # pragma: no cover - `recurrent_rule` takes it first
        raise RuleError(f"the variable's value is the initial value of loop variable {site.index}")
    p = body.inputs[site.index]
    if p.dtype != tf.resource:
        if sub.of(p) != _axes.FREE:
            raise RuleError("the consumed value holds examples")
        return [p]
    roots = []
    for c in p.consumers():
        if c.type in _NO_GRADIENT:
            continue
        if c.type not in _READS:
            raise RuleError(f"the loop's body uses the variable's handle in {c.type}")
        roots.append(c.outputs[0])
    return roots


def _uses(site: Site, loop: _Loop) -> list[_Use]:
    body, sub = loop.body, loop.sub
    if site.view.dtype == tf.resource:
        shape = site.var_shape
    else:
        shape = site.view.shape
    if shape is None or not tf.TensorShape(shape).is_fully_defined():
        raise RuleError("the variable's shape is not static")
    shape = tuple(int(d) for d in tf.TensorShape(shape))
    dtype = site.dtype
    uses = []
    stack = [(r, None) for r in _roots(site, loop)]
    seen = set()
    while stack:
        t, positions = stack.pop()
        passed = t is body.inputs[site.index]  # a captured value: passed through, unchanged
        if not passed and any(o is t for o in body.outputs):
            raise RuleError("the variable's value leaves the loop")
        if t.dtype != dtype:
            raise RuleError(f"the loop computes in {t.dtype.name}, not {dtype.name}")
        for c in t.consumers():
            if c.type in _NO_GRADIENT or c in seen:
                continue
            seen.add(c)
            at = [i for i, x in enumerate(c.inputs) if x is t]
            if len(at) != 1:
                raise RuleError(f"{c.type} op '{c.name}' uses the variable twice")
            i = at[0]
            what = f"{c.type} op '{c.name}' inside the loop"
            if c.type in _VIEWS:
                m = positions
                if m is None:
                    m = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
                for out, mo in zip(c.outputs, _view_positions(c, i, m)):
                    if tuple(out.shape.as_list()) != mo.shape:
                        raise RuleError(f"the shape of the view {what} is not static")
                    if sub.of(out) != _axes.FREE:
                        raise RuleError(f"the view {what} holds examples")
                    stack.append((out, mo))
                continue
            view_shape = tuple(int(d) for d in t.shape) if positions is not None else shape
            if c.type == "MatMul":
                uses.append(_matmul_use(c, i, view_shape, positions, sub, body, what))
            elif c.type in _CONVS:
                uses.append(_conv_use(c, i, view_shape, positions, sub, body, what))
            elif c.type in _ADDS:
                uses.append(_bias_use(c, i, view_shape, positions, sub, body, what))
            else:
                raise RuleError(f"the variable is used by {what} (no rule for it in a loop)")
    if not uses:
        raise RuleError("the loop's body does not use the variable")
    return uses


def _matmul_use(c, i, view_shape, positions, sub, body, what) -> _Use:
    ta, tb = c.get_attr("transpose_a"), c.get_attr("transpose_b")
    other = c.inputs[1 - i]
    a_axis = _pure_axis(sub, other, f"the other operand of {what}")
    if i == 1:  # z = op(a) op(W): rows of op(a), and of z, are the examples
        if a_axis != (1 if ta else 0):
            raise RuleError(f"the examples are on the contracted axis of {what}")
        z_axis, transpose_out = 0, tb
    else:  # z = op(W) op(b): columns of op(b), and of z, are the examples
        if a_axis != (0 if tb else 1):
            raise RuleError(f"the examples are on the contracted axis of {what}")
        z_axis, transpose_out = 1, not ta
    z = c.outputs[0]
    if _pure_axis(sub, z, f"the output of {what}") != z_axis:
        raise RuleError(f"the examples' axis of the output of {what} is not its rows")
    tap = _tap_of(z, sub, body.outputs)
    t_axis = _pure_axis(sub, tap, "a tapped tensor")
    return _Use(
        kind="matmul",
        tap=_Tap(tap.name, tap.dtype, _dims(tap, t_axis, "a tapped tensor"), t_axis),
        shape=view_shape,
        positions=positions,
        record=_Record(other.name, other.dtype, _dims(other, a_axis, "an operand"), a_axis),
        transpose_out=transpose_out,
    )


def _conv_use(c, i, view_shape, positions, sub, body, what) -> _Use:
    """A convolution ``z_t = conv(x_t, F)`` with ``F`` (a view of) the variable: example ``j``'s
    gradient is ``sum_t`` of the conv rule's filter gradient of ``(x_{t,j}, delta_{t,j})``."""
    if i != 1:
        raise RuleError(f"the variable is the input of {what}, not its filter")
    spec = conv_spec(c, tf.TensorShape(view_shape))
    x, z = c.inputs[0], c.outputs[0]
    if _pure_axis(sub, x, f"the input of {what}") != 0:
        raise RuleError(f"the examples are not on the batch axis of the input of {what}")
    if _pure_axis(sub, z, f"the output of {what}") != 0:
        raise RuleError(f"the examples are not on the batch axis of the output of {what}")
    tap = _tap_of(z, sub, body.outputs)
    t_axis = _pure_axis(sub, tap, "a tapped tensor")
    return _Use(
        kind="conv",
        tap=_Tap(tap.name, tap.dtype, _dims(tap, t_axis, "a tapped tensor"), t_axis),
        shape=view_shape,
        positions=positions,
        record=_Record(x.name, x.dtype, _dims(x, 0, "an operand"), 0),
        conv=spec,
    )


def _bias_use(c, i, view_shape, positions, sub, body, what) -> _Use:
    if c.type == "BiasAdd":
        fmt = c.get_attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if i != 1 or fmt != "NHWC":
            raise RuleError(f"the variable is not the channels-last bias of {what}")
    z = c.outputs[0]
    z_axis = _pure_axis(sub, z, f"the output of {what}")
    z_dims = _dims(z, z_axis, f"the output of {what}")
    rank, r = len(z_dims), len(view_shape)
    if r > rank:
        raise RuleError(f"the variable broadcasts the other operand of {what}")
    keep = []
    for k, d in enumerate(view_shape):
        j = k + rank - r
        if j == z_axis:
            if d != 1:
                raise RuleError(f"the variable spans the examples' axis of {what}")
        elif d == z_dims[j]:
            if d != 1:
                keep.append(j)
        elif d != 1:
            raise RuleError(f"the variable broadcasts the other operand of {what}")
    tap = _tap_of(z, sub, body.outputs)
    t_axis = _pure_axis(sub, tap, "a tapped tensor")
    if tap is not z and t_axis != z_axis:  # pragma: no cover - _tap_of keeps the axis
        raise RuleError("the tapped tensor moves the examples")
    return _Use(
        kind="bias",
        tap=_Tap(tap.name, tap.dtype, _dims(tap, t_axis, "a tapped tensor"), t_axis),
        shape=view_shape,
        positions=positions,
        sign=-1.0 if (c.type == "Sub" and i == 1) else 1.0,
        keep=tuple(keep),
    )


def _in_xla(graph: tf.Graph) -> bool:
    """Whether ``graph`` is (inside) an XLA-compiled function; False where TensorFlow lacks the
    private function that tells."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    try:
        return tf_private.in_xla_context(graph)
    except PrivateAPIError:  # pragma: no cover
        return False


# --- per-example gradients ---------------------------------------------------------------------


def _use_gradients(u: _Use, stacks: dict, start, size, dtype) -> tf.Tensor:
    """``[size, *u.shape]``: the per-example gradients of the used view, examples ``[start,
    start + size)``, unscaled. The stacks are time-major (`_Loop.stacks`)."""
    d_stack, d_axis = stacks[u.tap.name], u.tap.axis
    if u.kind == "matmul":
        d = tf.cast(_chunk_of(d_stack, d_axis, start, size), dtype)  # [size, T, d_out]
        record = u.record
        assert record is not None, "a matmul use records its other operand"
        a = tf.cast(
            _chunk_of(stacks[record.name], record.axis, start, size), dtype
        )  # [size, T, d_in]
        # one [d_in, T] x [T, d_out] product per example (a batched matmul, not an einsum:
        # measured 1.5-2x faster for LSTM(128) at T = 50)
        g = tf.matmul(a, d, transpose_a=True)
        return tf.linalg.matrix_transpose(g) if u.transpose_out else g
    if u.kind == "conv":
        return _conv_gradients(u, stacks, start, size, dtype)
    # a bias: the sum over the steps (and the tap's other axes the view does not span), in the
    # time-major layout; then the examples first
    d = tf.cast(_slice_examples(d_stack, d_axis, start, size), dtype)  # [T, *tap dims]
    summed = [0] + [1 + j for j in range(len(u.tap.dims)) if j != d_axis and j not in u.keep]
    g = tf.reduce_sum(d, axis=summed)  # the examples' and the kept axes, in order
    at = sum(1 for j in u.keep if j < d_axis)  # where the examples' axis is now
    if at:
        g = tf.transpose(g, [at] + [k for k in range(len(u.keep) + 1) if k != at])
    g = tf.reshape(g, [-1, *u.shape])
    return -g if u.sign < 0 else g


def _conv_gradients(u: _Use, stacks: dict, start, size, dtype) -> tf.Tensor:
    """``[size, *u.shape]``: a convolution's per-example filter gradients, the conv rule's
    (`tb_gradmom.core.rules.conv.conv_contribution`) for every (example, step) row of the
    stacks, then summed over the steps per example (before any power)."""
    record, spec = u.record, u.conv
    assert record is not None and spec is not None, "a conv use records its input"
    x = tf.cast(_chunk_of(stacks[record.name], record.axis, start, size), dtype)  # [size, T, ..]
    d = tf.cast(_chunk_of(stacks[u.tap.name], u.tap.axis, start, size), dtype)
    x_dims = [v for k, v in enumerate(record.dims) if k != record.axis]
    d_dims = [v for k, v in enumerate(u.tap.dims) if k != u.tap.axis]
    x = tf.reshape(x, [-1, *x_dims])  # rows: example-major (example, step)
    d = tf.reshape(d, [-1, *d_dims])
    positions = int(np.prod(d_dims[:-1])) if d_dims else 1
    rows = conv_contribution(
        spec, lambda *_: (x, d), dtype, examples=0, evidence=spec.what, positions=positions
    ).per_example(None, 0, 0, 0)  # [size * T, *filter]
    if isinstance(size, int):
        g = tf.reshape(rows, [size, -1, *u.shape])
    else:
        g = tf.reshape(rows, tf.concat([tf.reshape(size, [1]), [-1], list(u.shape)], 0))
    return tf.reduce_sum(g, axis=1)


def _scatter(u: _Use, g: tf.Tensor, size: int) -> tf.Tensor:
    """``[n, size]`` per-example gradients of the variable's flat value from those of the view
    (``[n, *u.shape]``) whose elements sit at ``u.positions``."""
    positions = u.positions
    assert positions is not None, "only a view of part of the value is scattered"
    flat = tf.reshape(g, [tf.shape(g)[0], -1])
    where = np.full(size, positions.size, np.int64)  # the appended zero column
    where[positions.reshape(-1)] = np.arange(positions.size)
    flat = tf.concat([flat, tf.zeros_like(flat[:, :1])], axis=1)
    return tf.gather(flat, where, axis=1)


def recurrent_rule(site: Site) -> Contribution:
    """The rule for a variable (its handle, or its value) that a ``While`` loop consumes."""
    op = site.op
    what = f"{op.type} op '{op.name}'"
    if site.dtype not in (tf.float32, tf.float64):
        raise RuleError(f"moments in {site.dtype.name}")
    outputs = site.output if isinstance(site.output, tuple) else (site.output,)
    loop = _loop(site)
    if loop.steps_static is None and _in_xla(op.graph):
        raise RuleError(
            "inside an XLA-compiled function the copy of the loop needs its number of steps "
            "at trace time (a static sequence length), which no input of the loop shows"
        )
    if site.index not in loop.invariant:
        return _init_rule(site, loop, outputs)
    uses = _uses(site, loop)
    for u in uses:
        if u.positions is not None and np.unique(u.positions).size != u.positions.size:
            raise RuleError("a view repeats entries of the variable")  # pragma: no cover
    if site.view.dtype == tf.resource:
        var_shape = tuple(int(d) for d in tf.TensorShape(site.var_shape))
    else:
        var_shape = tuple(int(d) for d in site.view.shape)
    var_key = (site.view.ref(), site.index)
    loop.register(uses, var_key, var_shape, int(np.prod(var_shape)), site.dtype)

    ev_t, ev_axis = _evidence(loop)
    if site.view.dtype == tf.resource:
        shape = tuple(int(d) for d in tf.TensorShape(site.var_shape))
    else:
        shape = tuple(int(d) for d in site.view.shape)
    size = int(np.prod(shape))
    dtype = site.dtype

    def gradients(stacks, start, count, factor):
        g = _variable_gradients(uses, stacks, start, count, shape, size, dtype)
        if not (isinstance(factor, float) and factor == 1.0):
            g = g * tf.cast(factor, dtype)
        return g

    def per_example(delta, n, start, count):
        stacks = loop.stacks(delta.grads, outputs, n)
        return gradients(stacks, start, count, delta.factor)

    def power_sums(delta, n, orders, chunk=None):
        # The copy on chunks of at most _COPY_ELEMENTS elements of stacks (and at most `chunk`
        # examples): unless the batch is statically one such chunk.
        copy_chunk = max(1, _COPY_ELEMENTS // max(loop.copy_elements(), 1))
        if chunk is not None:
            copy_chunk = min(copy_chunk, int(chunk))
        n_static = tf.get_static_value(n)
        if n_static is None or int(n_static) > copy_chunk:
            found = loop.chunk_sums(delta.grads, outputs, n, tuple(orders), copy_chunk)
            if found is not None:
                sums = found[var_key]
                factor = delta.factor
                if isinstance(factor, float) and factor == 1.0:
                    return dict(sums)
                return {p: v * tf.cast(factor, dtype) ** p for p, v in sums.items()}
        stacks = loop.stacks(delta.grads, outputs, n)
        # at most `part_elements` per-example elements at once (and at most `chunk` examples)
        budget = loop.part_elements(None if n_static is None else int(n_static))
        own = max(1, budget // max(size, 1))
        chunk = own if chunk is None else min(int(chunk), own)

        def chunk_sums(start, count):
            return power_sums_of(gradients(stacks, start, count, delta.factor), orders)

        return sum_over_chunks(
            n, chunk, orders, shape, dtype, chunk_sums, name="loop_chunks", unroll=_UNROLL
        )

    return Contribution(
        examples=example_count(ev_t, ev_axis),
        evidence=f"the examples' axis {ev_axis} of '{ev_t.name}', an output of {what}",
        per_example=per_example,
        per_example_elements=size,
        power_sums=power_sums,
        power_sums_elements=size,
        gradient_from_sums=True,
    )


def _evidence(loop: _Loop) -> tuple[tf.Tensor, int]:
    """A carried floating-point output of the loop and its proven examples' axis."""
    for i in loop.carried:
        t = loop.op.outputs[i]
        st = loop.sub.of(loop.body.inputs[i])
        if t.dtype.is_floating and isinstance(st, _axes.Axis) and st.pure:
            return t, st.axis
    raise RuleError("no output of the loop holds the examples on a proven axis")


def _init_rule(site: Site, loop: _Loop, outputs: tuple) -> Contribution:
    """A parameter (the variable's value, or a value derived from it that holds no examples:
    a learned state tiled or broadcast to the batch) as the initial value ``s_0`` of a carried
    loop variable whose examples' axis ``a`` inside the body is proven.

    The proof holds with ``s_0``'s slices along ``a`` as the examples' (the fixed point joins
    the free entry state with the state after an iteration): example ``j``'s loss depends on
    ``s_0`` only through slice ``j``, so ``g_j(s_0)`` is slice ``j`` of ``dL/ds_0`` (times the
    loss's scale, as the taps' deltas), every other slice zero. ``dL/ds_0`` is the copy's
    gradient with respect to its initial value, from the same backward pass as the taps'
    deltas. Whatever computed ``s_0`` from the variable (a ``Tile``) is a derived region that
    the core pulls back through (`tb_gradmom.core.rules.derived.region_contribution`)."""
    op, i = site.op, site.index
    where = f"the initial value of loop variable {i} of {op.type} op '{op.name}'"
    if op.inputs[i].dtype == tf.resource:
        raise RuleError(f"the variable's handle is {where}, which the loop replaces")
    if not site.view.dtype.is_floating or site.view.dtype != site.dtype:
        raise RuleError(f"the variable's value is {where}, not in {site.dtype.name}")
    if site.axes.of(site.view) != _axes.FREE:  # pragma: no cover - a site's view holds none
        raise RuleError(f"{where} holds examples")
    body_input = loop.body.inputs[i]
    st = loop.sub.of(body_input)
    if not isinstance(st, _axes.Axis) or not st.pure or st.batch:
        why = f" (stopped at {loop.sub.why(body_input)})" if st == _axes.UNKNOWN else ""
        raise RuleError(
            f"the variable's value is {where}, which the loop updates at every step; that loop "
            f"variable's examples' axis inside the loop is not proven: {_axes.describe(st)}{why}"
        )
    if site.view.shape.rank is None or site.view.shape.rank <= st.axis:
        raise RuleError(f"the rank of {where} is not static")
    ev_t, ev_axis = _evidence(loop)
    loop.inits[i] = st.axis
    ax = _axes.Axis(st.axis)
    dtype = site.dtype

    def per_example(delta, n, start, count):
        g = loop.stacks(delta.grads, outputs, n)[f"init:{i}"]  # dL/ds_0, unscaled
        factor = delta.factor
        if not (isinstance(factor, float) and factor == 1.0):
            g = g * tf.cast(factor, g.dtype)
        return tf.cast(per_example_masked(g, ax, n, start, count), dtype)

    elements = 1
    for d in site.view.shape:
        elements *= d if d is not None else 1024
    return Contribution(
        examples=example_count(ev_t, ev_axis),
        evidence=f"the examples' axis {ev_axis} of '{ev_t.name}', an output of {op.type} op "
        f"'{op.name}', and {st} of loop variable {i} inside it",
        per_example=per_example,
        per_example_elements=int(elements) + loop.copy_elements(),
    )
