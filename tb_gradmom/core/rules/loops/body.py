"""The analysis of a loop's body: which loop variables are carried, where the examples are
inside the body, and every use of a variable there (`Use`: a matmul, a convolution's filter or
an added bias, through views of the variable's value), each with the tensor to tap (``z_t``) and
the operand to record (``a_t``).

Proof, never a guess: the body is analysed (`tb_gradmom.core.axes.loop_body`) with the loop
variables at their fixed point (the time-major input's elements hold the examples on axis 0 when
the outer input holds them on axis 1; a zero initial state takes the examples' axis of its
update), and a use is accepted only where the examples' axis of ``a_t`` and ``z_t`` is proven.
Anything else, a nested loop or call, a stateful op other than a variable read (random numbers,
assignments), a statistic over the batch inside the body (the examples coupled from step to
step), a use other than a matmul, a convolution's filter or an added bias, a float16 loop (mixed
precision), raises `RuleError` and the core takes the exact fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core.rules.base import RuleError, Site
from tb_gradmom.core.rules.conv import ConvSpec, conv_spec

__all__ = ["LoopBody", "Record", "Tap", "Use", "analyse", "list_source", "uses"]

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


@dataclass(frozen=True)
class Tap:
    name: str  # the tapped tensor in the body
    dtype: tf.DType
    dims: tuple  # static dims, None at the examples' axis
    axis: int  # the examples' axis


@dataclass(frozen=True)
class Record:
    name: str  # the recorded tensor in the body (a use's other operand)
    dtype: tf.DType
    dims: tuple
    axis: int


@dataclass(frozen=True)
class Use:
    """One use of (a view of) the variable inside the body."""

    kind: str  # "matmul" or "bias"
    tap: Tap
    shape: tuple  # the shape of the used view
    # the view's elements' flat positions in the variable's value (None: the value itself)
    positions: np.ndarray | None
    record: Record | None = None  # matmul: the other operand
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


def _tap_of(z: tf.Tensor, loop: LoopBody) -> tf.Tensor:
    """The top of the chain of additions that ``z`` alone feeds, each keeping its shape and
    examples' axis: its gradient is ``z``'s, so uses along the chain share one tap."""
    sub, outputs = loop.sub, loop.outputs
    st = sub.of(z)
    while not any(o is z for o in outputs):
        consumers = loop.consumers(z)
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
class LoopBody:
    """What the analysis of one while loop found: its body, the examples' axes inside it, and
    what a copy of the loop needs (`tb_gradmom.core.rules.loops.graphdef`)."""

    op: tf.Operation
    body: tf.Graph  # the loop body's FuncGraph
    sub: _axes.Examples  # the example axes inside the body
    body_def: bytes
    inputs: list
    carried: list
    invariant: list
    # reads of loop-invariant handles in the body: (the read's output name, input index, dtype)
    reads: list = field(default_factory=list)
    # per loop input, how a chunk of its examples is taken (`_slicing`); None: the copy cannot
    # run on a chunk of the examples (it then runs on the whole batch)
    slicing: list | None = None
    steps_static: int | None = None  # the number of steps, if an input shows it statically
    # the names of the body's ops that only fill the accumulators TensorFlow's gradient of the
    # loop appended (`_accumulators`): not part of the loop as built, left out of the copy
    dropped: frozenset = frozenset()

    @property
    def outputs(self) -> list:
        """The body's outputs of the loop as built (``inputs``' loop variables)."""
        return self.body.outputs[: len(self.inputs)]

    def consumers(self, t: tf.Tensor) -> list:
        """The ops inside the body that consume ``t``, the accumulators' left out."""
        return [c for c in t.consumers() if c.name not in self.dropped]


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


def _accumulators(op: tf.Operation, body, outputs) -> tuple[int, frozenset]:
    """The loop variables of the loop as built, and the body's ops that only fill the
    accumulators TensorFlow's gradient of the loop appended after them.

    ``while_v2``'s gradient rewrites the forward loop in place: for each value of the body that
    the backward loop needs, a new loop variable, an ``EmptyTensorList`` on entry, to which the
    body pushes the value at every step (``TensorListPushBack``). A gradient taken before the
    plan (a first plan's backward pass in the same step, the user's tape) leaves them in the
    body, where they would read as uses of the variables; the loss depends on none of them (a
    variable whose output is among the site's ``outputs`` is kept). Returns the number of
    loop variables before the appended accumulators and the names of the ops that only feed
    them (the pushes, and what only they consume)."""
    n = len(op.inputs)
    pushes: set = set()
    while n > 1:
        j = n - 1
        p, out = body.inputs[j], body.outputs[j]
        if (
            op.inputs[j].op.type != "EmptyTensorList"
            or out.op.type != "TensorListPushBack"
            or out.op.inputs[0] is not p
            or p.consumers() != [out.op]
            or any(o is op.outputs[j] for o in outputs)
        ):
            break
        pushes.add(out.op)
        n = j
    if not pushes:
        return n, frozenset()
    dropped = set(pushes)
    for i in range(n, len(op.inputs)):
        dropped.add(body.inputs[i].op)
    ops = body.get_operations()
    users: dict = {o: [c for t in o.outputs for c in t.consumers()] for o in ops}
    for o in ops:
        for c in o.control_inputs:
            users.setdefault(c, []).append(o)
    kept_outputs = {t.ref() for t in body.outputs[:n]}
    changed = True
    while changed:  # what only the accumulators consume (the shape of a pushed list, say)
        changed = False
        for o in ops:
            if o in dropped or not users[o] or not all(c in dropped for c in users[o]):
                continue
            if any(t.ref() in kept_outputs for t in o.outputs):
                continue  # a loop variable's next value (pushed too): no consumer in the body
            dropped.add(o)
            changed = True
    return n, frozenset(o.name for o in dropped)


def analyse(site: Site) -> LoopBody:
    """The analysis of the loop that ``site`` consumes a variable in; `RuleError` if the rule
    cannot cover it."""
    op = site.op
    found = _axes.loop_body(site.axes, op)
    if found is None:
        raise RuleError("the examples' axes of the loop's variables do not settle")
    body, sub = found
    if len(body.inputs) != len(op.inputs) or len(body.outputs) != len(op.inputs):
        raise RuleError("the loop's body does not match its inputs")
    outputs = site.output if isinstance(site.output, tuple) else (site.output,)
    n_in, dropped = _accumulators(op, body, outputs)
    _check_counter(op, body)
    for o in body.get_operations():
        if o.name in dropped:
            continue
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
    if dropped:
        kept = [nd for nd in body_def.node if nd.name not in dropped]
        del body_def.node[:]
        body_def.node.extend(kept)
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
    slicing, steps = _slicing(op, body, sub, n_in)
    return LoopBody(
        op=op,
        body=body,
        sub=sub,
        body_def=body_def.SerializeToString(),
        inputs=list(op.inputs[:n_in]),
        carried=carried,
        invariant=invariant,
        reads=reads,
        slicing=slicing,
        steps_static=steps,
        dropped=dropped,
    )


def list_source(t: tf.Tensor) -> tf.Operation:
    src = t.op
    while src.type == "Identity":
        src = src.inputs[0].op
    return src


def _slicing(op: tf.Operation, body, sub, n_in: int) -> tuple[list | None, int | None]:
    """Per loop input, how the copy takes a chunk of its examples: None (it holds none: the
    same input), ``("dense", axis)`` (a slice on that axis), ``("reserve", axis)`` or
    ``("from_tensor", axis)`` (a ``TensorList`` made by that op, its elements holding the
    examples on ``axis``: the list made again for the chunk). None for the whole list when an
    input holds examples some other way (the copy then runs on the whole batch). Also the
    number of steps if a list made from a tensor shows it."""
    how: list = []
    steps = None
    for i, t in enumerate(op.inputs[:n_in]):
        st = sub.of(body.inputs[i])
        if st == _axes.FREE or (isinstance(st, _axes.Elements) and st.of == _axes.FREE):
            how.append(None)
        elif isinstance(st, _axes.Axis) and st.pure and t.dtype != tf.variant:
            if t.shape.rank is None:
                return None, None
            how.append(("dense", st.axis))
        elif isinstance(st, _axes.Elements) and isinstance(st.of, _axes.Axis) and st.of.pure:
            src = list_source(t)
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


def _roots(site: Site, loop: LoopBody) -> list:
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
    for c in loop.consumers(p):
        if c.type in _NO_GRADIENT:
            continue
        if c.type not in _READS:
            raise RuleError(f"the loop's body uses the variable's handle in {c.type}")
        roots.append(c.outputs[0])
    return roots


def uses(site: Site, loop: LoopBody) -> list[Use]:
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
        if not passed and any(o is t for o in loop.outputs):
            raise RuleError("the variable's value leaves the loop")
        if t.dtype != dtype:
            raise RuleError(f"the loop computes in {t.dtype.name}, not {dtype.name}")
        for c in loop.consumers(t):
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
                uses.append(_matmul_use(c, i, view_shape, positions, loop, what))
            elif c.type in _CONVS:
                uses.append(_conv_use(c, i, view_shape, positions, loop, what))
            elif c.type in _ADDS:
                uses.append(_bias_use(c, i, view_shape, positions, loop, what))
            else:
                raise RuleError(f"the variable is used by {what} (no rule for it in a loop)")
    if not uses:
        raise RuleError("the loop's body does not use the variable")
    return uses


def _matmul_use(c, i, view_shape, positions, loop, what) -> Use:
    sub = loop.sub
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
    return Use(
        kind="matmul",
        tap=_tapped(z, loop),
        shape=view_shape,
        positions=positions,
        record=Record(other.name, other.dtype, _dims(other, a_axis, "an operand"), a_axis),
        transpose_out=transpose_out,
    )


def _tapped(z, loop) -> Tap:
    """The tap of ``z``, the output of a use inside the loop, with its examples' axis."""
    tap = _tap_of(z, loop)
    t_axis = _pure_axis(loop.sub, tap, "a tapped tensor")
    return Tap(tap.name, tap.dtype, _dims(tap, t_axis, "a tapped tensor"), t_axis)


def _conv_use(c, i, view_shape, positions, loop, what) -> Use:
    """A convolution ``z_t = conv(x_t, F)`` with ``F`` (a view of) the variable: example ``j``'s
    gradient is ``sum_t`` of the conv rule's filter gradient of ``(x_{t,j}, delta_{t,j})``."""
    sub = loop.sub
    if i != 1:
        raise RuleError(f"the variable is the input of {what}, not its filter")
    spec = conv_spec(c, tf.TensorShape(view_shape))
    x, z = c.inputs[0], c.outputs[0]
    if _pure_axis(sub, x, f"the input of {what}") != 0:
        raise RuleError(f"the examples are not on the batch axis of the input of {what}")
    if _pure_axis(sub, z, f"the output of {what}") != 0:
        raise RuleError(f"the examples are not on the batch axis of the output of {what}")
    return Use(
        kind="conv",
        tap=_tapped(z, loop),
        shape=view_shape,
        positions=positions,
        record=Record(x.name, x.dtype, _dims(x, 0, "an operand"), 0),
        conv=spec,
    )


def _bias_use(c, i, view_shape, positions, loop, what) -> Use:
    sub = loop.sub
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
    tap = _tap_of(z, loop)
    t_axis = _pure_axis(sub, tap, "a tapped tensor")
    if tap is not z and t_axis != z_axis:  # pragma: no cover - _tap_of keeps the axis
        raise RuleError("the tapped tensor moves the examples")
    return Use(
        kind="bias",
        tap=_tapped(z, loop),
        shape=view_shape,
        positions=positions,
        sign=-1.0 if (c.type == "Sub" and i == 1) else 1.0,
        keep=tuple(keep),
    )
