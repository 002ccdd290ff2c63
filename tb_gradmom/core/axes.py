"""Where the examples are: a dataflow analysis of the traced graph, never a guess from shapes.

For every tensor between the step's inputs and its loss, `Examples.of` says which axis (if any)
holds the examples, *proven* by following the ops from the tensors that carry the batch:

* `Axis(k, outer, inner)`: slice ``j`` of axis ``k`` (for a folded axis, the ``inner`` consecutive
  entries at ``j`` within each of the ``outer`` blocks) depends on example ``j`` alone. A pure
  example axis has ``outer == inner == 1``; Keras 3 Dense on ``[n, T, d]`` reshapes to
  ``[n * T, d]`` (``inner = T``), Swin folds ``examples x windows``, a dilated convolution's
  ``SpaceToBatchND`` puts ``blocks x examples`` on its batch axis (``outer = blocks``).
* `FREE`: depends on no example (variables, constants, shapes, random numbers, a position
  table looked up with ``arange(T)``, LoRA's ``A @ B``, a class token broadcast to the batch).
* `REDUCED`: depends on the examples only through reductions over them (batch statistics, as
  in BatchNormalization in training mode).
* `UNKNOWN`: the analysis cannot prove where the examples are (an op it does not know, a
  ``while`` loop, examples moved across axes); `Examples.why` names the op.

The batch-carrying tensors are the step's dense tensor arguments (axis 0; a `tf.function`'s
non-captured inputs, a TF1 graph's placeholders) and the elements an iterator yields. A shape
coincidence (batch size equal to a sequence length, a width, a vocabulary or 1) changes
nothing: axes are followed op by op, and a reshape is resolved by the strides of the examples,
with the batch size kept symbolic when it is not static.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tb_gradmom._compat import PrivateAPIError, tf_private

__all__ = [
    "Axis",
    "FREE",
    "REDUCED",
    "UNKNOWN",
    "Examples",
    "Sym",
    "examples_first",
    "loop_body",
    "call_body",
]


@dataclass(frozen=True)
class Axis:
    """Examples on axis ``axis``; the axis is laid out ``[outer, n, inner]`` (row-major)."""

    axis: int
    outer: int = 1
    inner: int = 1

    @property
    def pure(self) -> bool:
        return self.outer == 1 and self.inner == 1

    @property
    def partners(self) -> int:
        """Entries of the axis per example (folded windows, positions, dilation blocks)."""
        return self.outer * self.inner

    def moved(self, axis: int) -> Axis:
        return Axis(axis, self.outer, self.inner)

    def __str__(self) -> str:
        if self.pure:
            return f"axis {self.axis}"
        return f"axis {self.axis} (folded: {self.outer} x examples x {self.inner})"


FREE = "free"
REDUCED = "reduced"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Elements:
    """A ``TensorList`` (a ``tf.TensorArray`` in a loop) whose elements hold the examples on
    ``of`` (an `Axis`), or hold none yet (``of == FREE``)."""

    of: object


def join(a, b):
    """The state of a loop variable that is ``a`` on entry and ``b`` after an iteration."""
    if a == b:
        return a
    if UNKNOWN in (a, b):
        return UNKNOWN
    if a == FREE:
        return b if b != REDUCED else REDUCED
    if b == FREE:
        return a if a != REDUCED else REDUCED
    if isinstance(a, Elements) and isinstance(b, Elements):
        inner = join(a.of, b.of)
        return UNKNOWN if inner == UNKNOWN else Elements(inner)
    return UNKNOWN


@dataclass(frozen=True)
class Sym:
    """``c * n``: a size that is a multiple of the (unknown at trace time) batch size."""

    c: int

    def __str__(self) -> str:
        return f"{self.c}*n" if self.c != 1 else "n"


def _mul(a, b):
    if a is None or b is None:
        return None
    if isinstance(a, Sym) and isinstance(b, Sym):
        return None
    if isinstance(a, Sym):
        return Sym(a.c * b)
    if isinstance(b, Sym):
        return Sym(b.c * a)
    return a * b


def _div(a, b):
    """Exact division, or None."""
    if a is None or b is None:
        return None
    if isinstance(b, Sym):
        if isinstance(a, Sym) and b.c and a.c % b.c == 0:
            return a.c // b.c
        return None
    if b == 0:
        return None
    if isinstance(a, Sym):
        return Sym(a.c // b) if a.c % b == 0 else None
    return a // b if a % b == 0 else None


def _add(a, b, sign=1):
    if a is None or b is None:
        return None
    if isinstance(a, Sym) and isinstance(b, Sym):
        c = a.c + sign * b.c
        return Sym(c) if c else 0
    if isinstance(a, Sym) or isinstance(b, Sym):
        return a if b == 0 else (b if a == 0 and sign == 1 else None)
    return a + sign * b


def _prod(values):
    out = 1
    for v in values:
        out = _mul(out, v)
        if out is None:
            return None
    return out


# --- op families --------------------------------------------------------------------------------

# Sources whose outputs depend on no example.
_FREE_OPS = frozenset(
    {
        "Const",
        "VarHandleOp",
        "ReadVariableOp",
        "VariableShape",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "ZerosLike",
        "OnesLike",
        "Range",
        "Fill",
        "BroadcastArgs",
        "NoOp",
        "StopGradient",  # blocks gradients: for the per-example split it is a constant
    }
)
_SOURCE_OPS = frozenset(
    {"IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue", "IteratorGetNextAsOptional"}
)

# Element-wise with one data input (output shaped like input 0).
_UNARY = frozenset(
    """Identity Cast Neg Abs Exp Log Log1p Expm1 Sqrt Rsqrt Square Reciprocal Inv Relu Relu6 Elu
    Selu LeakyRelu Softplus Softsign Sigmoid Tanh Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh
    Atanh Erf Erfc Erfinv Floor Ceil Round Rint Sign IsNan IsInf IsFinite LogicalNot Snapshot
    CheckNumerics CheckNumericsV2 EnsureShape PreventGradient Real Imag Conj Lgamma Digamma
    Invert PopulationCount DebugIdentity DebugIdentityV2 DebugIdentityV3 Gelu Mish Bitcast""".split()
)
# Element-wise with numpy broadcasting over all inputs.
_BROADCAST = frozenset(
    """AddV2 Add Sub Mul RealDiv Div DivNoNan MulNoNan FloorDiv FloorMod TruncateDiv TruncateMod
    Maximum Minimum Pow SquaredDifference Greater GreaterEqual Less LessEqual Equal NotEqual
    LogicalAnd LogicalOr SelectV2 Atan2 Xdivy Xlogy Xlog1py ClipByValue BitwiseAnd BitwiseOr
    BitwiseXor LeftShift RightShift Igamma Igammac Zeta Polygamma ApproximateEqual AddN""".split()
)
# Per-row ops over the last axis (the examples must not be on it).
_LAST_AXIS = frozenset({"Softmax", "LogSoftmax", "TopKV2", "InTopKV2", "L2Loss"})
# Reductions: (data, axes) with keep_dims.
_REDUCTIONS = frozenset(
    {"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm", "ArgMax", "ArgMin"}
)
# Ops on NHWC/NDHWC data that treat every row of their batch axis (0) on its own.
_BATCH_ROW_OPS = frozenset(
    """Conv2D Conv3D DepthwiseConv2dNative MaxPool MaxPoolV2 AvgPool MaxPool3D AvgPool3D
    FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3 ResizeBilinear ResizeNearestNeighbor
    ResizeBicubic ResizeArea LRN SpaceToDepth DepthToSpace ExtractImagePatches
    ExtractVolumePatches Conv2DBackpropInput Conv3DBackpropInputV2 MatrixBandPart
    MatrixDiagPartV3 MatrixSetDiagV3 MatrixTranspose""".split()
)
_RANDOM_WORDS = ("Random", "Multinomial", "TruncatedNormal")


def _is_random(op_type: str) -> bool:
    return any(w in op_type for w in _RANDOM_WORDS) and "Seed" not in op_type[:4]


def _static(t: tf.Tensor):
    v = tf.get_static_value(t)
    return None if v is None else np.asarray(v)


class Examples:
    """The example axis of every tensor on the way from the step's inputs to its loss.

    One analysis per traced call (`of` memoises). ``n_static`` is the batch size when a
    batch-carrying input has a static first axis, else None (sizes are then kept symbolic).
    """

    def __init__(self, graph: tf.Graph, inputs=None, n_static=None, depth: int = 0):
        self.graph = graph
        self.depth = depth
        self._memo: dict = {}
        self._why: dict = {}
        if inputs is not None:  # the body of a called function: its inputs' states are given
            self._sources = _RefMap()
            for t, st in zip(graph.inputs, inputs):
                self._sources.set(t, st)
            self.n_static = n_static
            return
        self._sources = self._find_sources(graph)
        sizes = {
            int(t.shape[0])
            for t, st in self._sources.items_tensors()
            if isinstance(st, Axis) and t.shape.rank and t.shape[0] is not None
        }
        self.n_static = next(iter(sizes)) if len(sizes) == 1 else None
        if len(sizes) > 1:  # several static batch sizes among the inputs: prove nothing from them
            for t, st in list(self._sources.items_tensors()):
                if isinstance(st, Axis):
                    self._sources.set(t, UNKNOWN)
                    self._why[t.ref()] = (
                        f"the step's inputs disagree about the batch size ('{t.name}')"
                    )

    # --- sources ---------------------------------------------------------------------------

    @staticmethod
    def _find_sources(graph) -> _RefMap:
        out = _RefMap()
        captured = set()
        for t in getattr(graph, "internal_captures", None) or []:
            captured.add(t.ref())
        args = [t for t in getattr(graph, "inputs", []) if t.ref() not in captured]
        composite = set()
        signature = getattr(graph, "structured_input_signature", None)
        if signature is not None and args:
            kinds = []
            for spec in tf.nest.flatten(signature, expand_composites=False):
                if isinstance(spec, tf.TypeSpec):
                    kinds.extend(_leaf_kinds(spec))
            if len(kinds) != len(args):  # an unexpected layout: prove nothing from sparse parts
                text = repr(signature)
                sparse = "Sparse" in text or "Ragged" in text
                kinds = ["sparse" if sparse else "dense"] * len(args)
            for t, kind in zip(args, kinds):
                if kind != "dense":
                    composite.add(t.ref())
        for t in args:
            if t.dtype in (tf.resource, tf.variant):
                out.set(t, FREE if t.dtype == tf.resource else UNKNOWN)
            elif t.ref() in composite:
                out.set(t, UNKNOWN)
            elif t.shape.rank == 0:
                out.set(t, FREE)
            else:
                out.set(t, Axis(0))
        return out

    # --- queries ---------------------------------------------------------------------------

    def of(self, t: tf.Tensor):
        """`Axis`, `FREE`, `REDUCED` or `UNKNOWN` for ``t``."""
        key = t.ref()
        if key in self._memo:
            return self._memo[key]
        stack = [t.op]
        while stack:
            op = stack[-1]
            if op.outputs and op.outputs[0].ref() in self._memo:
                stack.pop()
                continue
            pending = [x.op for x in op.inputs if x.ref() not in self._memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            try:
                states = self._visit(op)
            except Exception as e:  # noqa: BLE001 - an analysis gap must never crash the step
                states = [self._unknown(op, f"{op.type} op '{op.name}' ({e})")] * len(op.outputs)
            for out, st in zip(op.outputs, states):
                self._memo[out.ref()] = st
            if not op.outputs:
                pass
        return self._memo.get(key, UNKNOWN)

    def why(self, t: tf.Tensor) -> str:
        """Which op stopped the proof for ``t`` (for messages)."""
        self.of(t)
        return self._why.get(t.ref(), f"'{t.name}'")

    def free(self, t: tf.Tensor) -> bool:
        return self.of(t) == FREE

    def n_value(self):
        """The batch size as a number: an int when static, else ``Sym(1)``."""
        return self.n_static if self.n_static is not None else Sym(1)

    # --- symbolic shapes and integer values --------------------------------------------------

    def sym_shape(self, t: tf.Tensor):
        """Dims of ``t`` as ints, `Sym` (multiples of the batch size) or None; None if the rank
        is unknown."""
        if t.shape.rank is None:
            return None
        dims = list(t.shape.as_list())
        st = self.of(t)
        if isinstance(st, Axis) and dims[st.axis] is None:
            dims[st.axis] = _mul(self.n_value(), st.partners)
        return dims

    def sym_value(self, t: tf.Tensor, depth: int = 0):
        """The value of a small integer tensor (a shape computation) with the batch size kept
        symbolic: an int, `Sym`, a list of those (None entries where unknown), or None."""
        if depth > 32:
            return None
        v = _static(t)
        if v is not None and v.dtype.kind in "iu":
            return int(v) if v.ndim == 0 else [int(x) for x in v.reshape(-1)]
        op = t.op
        ty = op.type
        if ty in ("Identity", "Cast"):
            return self.sym_value(op.inputs[0], depth + 1)
        if ty == "Shape":
            return self.sym_shape(op.inputs[0])
        if ty == "ShapeN":
            return self.sym_shape(op.inputs[t.value_index])
        if ty == "Size":
            dims = self.sym_shape(op.inputs[0])
            return None if dims is None else _prod(dims)
        if ty == "Pack":
            vals = [self.sym_value(x, depth + 1) for x in op.inputs]
            if any(isinstance(x, list) for x in vals):
                return None
            return vals
        if ty == "ConcatV2":
            parts = [self.sym_value(x, depth + 1) for x in op.inputs[:-1]]
            if any(not isinstance(p, list) for p in parts):
                return None
            return [x for p in parts for x in p]
        if ty == "StridedSlice":
            return self._sym_slice(op, depth)
        if ty == "GatherV2":
            vals = self.sym_value(op.inputs[0], depth + 1)
            idx = _static(op.inputs[1])
            axis = _static(op.inputs[2])
            if not isinstance(vals, list) or idx is None or axis is None or int(axis) != 0:
                return None
            try:
                if idx.ndim == 0:
                    return vals[int(idx)]
                return [vals[int(i)] for i in idx.reshape(-1)]
            except IndexError:
                return None
        if ty == "Prod":
            vals = self.sym_value(op.inputs[0], depth + 1)
            if isinstance(vals, list):
                return _prod(vals)
            return vals if vals is not None and not isinstance(vals, list) else None
        if ty in ("Mul", "FloorDiv", "RealDiv", "AddV2", "Add", "Sub", "Maximum"):
            a = self.sym_value(op.inputs[0], depth + 1)
            b = self.sym_value(op.inputs[1], depth + 1)
            if isinstance(a, list) or isinstance(b, list):
                if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
                    return [self._binary(ty, x, y) for x, y in zip(a, b)]
                return None
            return self._binary(ty, a, b)
        return None

    @staticmethod
    def _binary(ty, a, b):
        if ty == "Mul":
            return _mul(a, b)
        if ty in ("FloorDiv", "RealDiv"):
            return _div(a, b)
        if ty in ("AddV2", "Add"):
            return _add(a, b)
        if ty == "Sub":
            return _add(a, b, -1)
        if ty == "Maximum" and isinstance(a, int) and isinstance(b, int):
            return max(a, b)
        return None

    def _sym_slice(self, op, depth):
        vals = self.sym_value(op.inputs[0], depth + 1)
        begin, end, strides = (_static(x) for x in op.inputs[1:4])
        if not isinstance(vals, list) or begin is None or end is None or strides is None:
            return None
        if begin.size != 1 or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
            return None
        b, e, s = int(begin[0]), int(end[0]), int(strides[0])
        if op.get_attr("shrink_axis_mask") & 1:
            try:
                return vals[b]
            except IndexError:
                return None
        b = None if op.get_attr("begin_mask") & 1 else b
        e = None if op.get_attr("end_mask") & 1 else e
        return vals[slice(b, e, s)]

    # --- the transfer functions ------------------------------------------------------------

    def _unknown(self, op, why=None):
        for out in op.outputs:
            self._why.setdefault(
                out.ref(), why or f"{op.type} op '{op.name}', which the analysis cannot see through"
            )
        return UNKNOWN

    def _inherit_unknown(self, op):
        for x in op.inputs:
            if self._memo.get(x.ref()) == UNKNOWN:
                for out in op.outputs:
                    self._why.setdefault(out.ref(), self._why.get(x.ref(), f"'{x.name}'"))
                return True
        return False

    def _visit(self, op) -> list:
        ty = op.type
        outs = op.outputs
        if not outs:
            return []
        src = (
            self._sources.get(outs[0]) if ty in ("Placeholder", "PlaceholderWithDefault") else None
        )
        if ty in ("Placeholder", "PlaceholderWithDefault"):
            if src is not None:
                if src == UNKNOWN:
                    self._why[outs[0].ref()] = (
                        f"input '{outs[0].name}' (a sparse or ragged tensor, or the inputs "
                        "disagree about the batch size)"
                    )
                return [src]
            # a TF1 graph (no signature), or a captured value
            captured = {t.ref() for t in getattr(op.graph, "internal_captures", None) or []}
            t = outs[0]
            if t.ref() in captured or t.dtype == tf.resource or t.shape.rank == 0:
                return [FREE]
            if isinstance(op.graph, tf.Graph) and not hasattr(op.graph, "internal_captures"):
                return [Axis(0)]
            return [FREE]
        if ty in _SOURCE_OPS:
            return [
                Axis(0) if (t.shape.rank and t.dtype != tf.variant) else self._unknown(op)
                for t in outs
            ]
        if ty in _FREE_OPS or not op.inputs or _is_random(ty):
            return [FREE] * len(outs)
        states = [self._memo[x.ref()] for x in op.inputs]
        if all(s == FREE for s in states):
            return [FREE] * len(outs)
        if self._inherit_unknown(op):
            return [UNKNOWN] * len(outs)
        data = [s for s in states if isinstance(s, Axis | Elements)]
        if not data:  # only FREE and REDUCED inputs: batch statistics stay batch statistics
            return [REDUCED] * len(outs)
        handler = _HANDLERS.get(ty)
        if handler is None:
            return [self._unknown(op)] * len(outs)
        result = handler(self, op, states)
        if not isinstance(result, list):
            result = [result] * len(outs)
        return [self._unknown(op) if r == UNKNOWN else r for r in result]


def _leaf_kinds(spec) -> list[str]:
    """Per placeholder of an argument's spec: "dense", or "sparse" for the parts of a sparse or
    ragged tensor (their first axis holds non-zeros or values, not examples)."""
    if isinstance(spec, tf.SparseTensorSpec | tf.RaggedTensorSpec):
        return ["sparse"] * len(tf.nest.flatten(spec, expand_composites=True))
    if isinstance(spec, tf.TensorSpec):
        return ["dense"]
    try:  # e.g. a distribution's PerReplicaSpec
        components = tf_private.component_specs(spec)
    except PrivateAPIError:
        components = None
    if components is None:
        return ["sparse"] * len(tf.nest.flatten(spec, expand_composites=True))
    out: list[str] = []
    for c in tf.nest.flatten(components, expand_composites=False):
        if isinstance(c, tf.TypeSpec):
            out.extend(_leaf_kinds(c))
    return out


class _RefMap:
    def __init__(self):
        self._d = {}

    def set(self, t, v):
        self._d[t.ref()] = (t, v)

    def get(self, t):
        item = self._d.get(t.ref())
        return None if item is None else item[1]

    def items_tensors(self):
        return list(self._d.values())


# --- handlers: (analysis, op, input states) -> output state(s) ------------------------------------


def _h_unary(ex, op, states):
    return states[0] if isinstance(states[0], Axis | Elements) else UNKNOWN


def _h_broadcast(ex, op, states):
    """Numpy broadcasting: an input's example axis lands at the same output position for every
    input that has one, and is never broadcast itself."""
    out = op.outputs[0]
    rank = out.shape.rank
    if rank is None:
        return UNKNOWN
    inputs = list(op.inputs)
    if op.type == "BiasAdd":
        fmt = op.get_attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if fmt != "NHWC" and any(isinstance(s, Axis) for s in states[1:]):
            return UNKNOWN
    shapes = []
    for x in inputs:
        dims = ex.sym_shape(x)
        if dims is None:
            return UNKNOWN
        shapes.append([1] * (rank - len(dims)) + dims)
    found = None
    for x, st, dims in zip(inputs, states, shapes):
        if not isinstance(st, Axis):
            continue
        pos = st.axis + (rank - x.shape.rank)
        own = dims[pos]
        if own is None:
            return UNKNOWN
        for other in shapes:
            d = other[pos]
            if d is None or d == 1 or d == own:
                continue
            return UNKNOWN  # the example axis would be broadcast against another size
        if own == 1 and out.shape[pos] not in (1, None):
            return UNKNOWN
        cand = st.moved(pos)
        if found is not None and found != cand:
            return UNKNOWN
        found = cand
    return found if found is not None else REDUCED


def _axes_of(op, rank):
    axes = _static(op.inputs[1])
    if axes is None or rank is None:
        return None
    return sorted({int(a) % rank for a in axes.reshape(-1)}) if rank else []


def _h_reduce(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis):
        return UNKNOWN if st == UNKNOWN else REDUCED
    x = op.inputs[0]
    rank = x.shape.rank
    axes = _axes_of(op, rank)
    if axes is None:
        return UNKNOWN
    if op.type in ("ArgMax", "ArgMin"):
        keep = False
    else:
        keep = bool(op.get_attr("keep_dims"))
    if st.axis in axes:
        return REDUCED
    if keep:
        return st
    return st.moved(st.axis - sum(1 for a in axes if a < st.axis))


def _h_last_axis(ex, op, states):
    st = states[0]
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or rank is None or st.axis == rank - 1:
        return UNKNOWN
    if op.type == "L2Loss":
        return REDUCED
    if op.type == "InTopKV2":
        return st if st.axis == 0 else UNKNOWN
    return st


def _h_transpose(ex, op, states):
    st = states[0]
    perm = _static(op.inputs[1])
    if not isinstance(st, Axis) or perm is None:
        return UNKNOWN
    perm = [int(p) for p in perm.reshape(-1)]
    return st.moved(perm.index(st.axis))


def _h_expand_dims(ex, op, states):
    st = states[0]
    axis = _static(op.inputs[1])
    rank = op.outputs[0].shape.rank
    if not isinstance(st, Axis) or axis is None or rank is None:
        return UNKNOWN
    a = int(axis) % rank
    return st.moved(st.axis + 1 if a <= st.axis else st.axis)


def _h_squeeze(ex, op, states):
    st = states[0]
    x = op.inputs[0]
    rank = x.shape.rank
    if not isinstance(st, Axis) or rank is None:
        return UNKNOWN
    dims = list(op.get_attr("squeeze_dims"))
    if dims:
        dims = sorted({int(d) % rank for d in dims})
    else:
        shape = x.shape.as_list()
        if any(s is None for i, s in enumerate(shape) if i != st.axis):
            return UNKNOWN
        dims = [i for i, s in enumerate(shape) if s == 1]
    if st.axis in dims:
        # A batch of one squeezed away (Keras adds a [1, d] operand as a bias): the values
        # are those of the one example, with no examples' axis left, as after a sum over it.
        return REDUCED if x.shape[st.axis] == 1 and st.pure else UNKNOWN
    return st.moved(st.axis - sum(1 for d in dims if d < st.axis))


def _h_reshape(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis):
        return UNKNOWN
    x = op.inputs[0]
    in_dims = ex.sym_shape(x)
    if in_dims is None:
        return UNKNOWN
    pre = _prod(in_dims[: st.axis])
    post = _prod(in_dims[st.axis + 1 :])
    if pre is None or post is None or isinstance(pre, Sym) or isinstance(post, Sym):
        return UNKNOWN
    big_p, big_q = pre * st.outer, st.inner * post  # elements before / after the example block
    out_dims = _reshape_dims(ex, op, in_dims)
    if out_dims is None:
        return UNKNOWN
    n = ex.n_value()
    for k, d in enumerate(out_dims):
        before, after = _prod(out_dims[:k]), _prod(out_dims[k + 1 :])
        if before is None or after is None or isinstance(before, Sym) or isinstance(after, Sym):
            continue
        if before == 0 or after == 0 or big_p % before or big_q % after:
            continue
        o, i = big_p // before, big_q // after
        if d is not None and d == _mul(n, o * i):
            return Axis(k, o, i)
    return UNKNOWN


def _reshape_dims(ex, op, in_dims):
    out = op.outputs[0]
    static = out.shape.as_list() if out.shape.rank is not None else None
    if static is not None and all(s is not None for s in static) and ex.n_static is not None:
        return static
    val = ex.sym_value(op.inputs[1])
    if val is None:
        return static if static is not None and all(s is not None for s in static) else None
    if not isinstance(val, list):
        val = [val]
    total = _prod(in_dims)
    if total is None:
        return None
    if -1 in val:
        known = _prod([v for v in val if v != -1])
        rest = _div(total, known)
        if rest is None:
            return None
        val = [rest if v == -1 else v for v in val]
    if any(v is None for v in val):
        return None
    return val


def _h_matmul(ex, op, states):
    a, b = states
    ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    out = None
    if isinstance(a, Axis):
        a_rows = 1 if ta else 0
        if a.axis != a_rows:
            return REDUCED if not isinstance(b, Axis) else UNKNOWN
        out = a.moved(0)
    if isinstance(b, Axis):
        b_cols = 0 if tb else 1
        if b.axis != b_cols or out is not None:
            return UNKNOWN if out is not None else REDUCED
        out = b.moved(1)
    return out if out is not None else REDUCED


def _h_batch_matmul(ex, op, states):
    x, y = op.inputs
    out = op.outputs[0]
    rank = out.shape.rank
    if rank is None or x.shape.rank is None or y.shape.rank is None:
        return UNKNOWN
    adj = (op.get_attr("adj_x"), op.get_attr("adj_y"))
    found = None
    for i, (t, st) in enumerate(zip((x, y), states)):
        if not isinstance(st, Axis):
            continue
        r = t.shape.rank
        if st.axis < r - 2:  # a batch dim, broadcast like an element-wise op
            pos = st.axis + (rank - r)
            if t.shape[st.axis] == 1 and out.shape[pos] != 1:
                return UNKNOWN
            cand = st.moved(pos)
        else:
            mat = st.axis - (r - 2)  # 0: rows, 1: columns of the operand as stored
            if adj[i]:
                mat = 1 - mat
            if (i == 0 and mat == 1) or (i == 1 and mat == 0):
                return REDUCED if found is None else UNKNOWN  # contracted
            cand = st.moved(rank - 2 if i == 0 else rank - 1)
        if found is not None and found != cand:
            return UNKNOWN
        found = cand
    return found if found is not None else REDUCED


def _h_einsum(ex, op, states):
    eq = op.get_attr("equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    if "..." in eq or "->" not in eq:
        return UNKNOWN
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != len(op.inputs):
        return UNKNOWN
    found = None
    for subs, st in zip(parts, states):
        if not isinstance(st, Axis):
            continue
        letter = subs[st.axis]
        if letter not in out:
            return REDUCED if found is None else UNKNOWN
        cand = st.moved(out.index(letter))
        if found is not None and found != cand:
            return UNKNOWN
        # the same letter must not index examples in one operand and something else in another
        for other, ost in zip(parts, states):
            if letter in other and not isinstance(ost, Axis) and ost != FREE:
                return UNKNOWN
        found = cand
    return found if found is not None else REDUCED


def _h_concat(ex, op, states):
    axis = _static(op.inputs[-1])
    rank = op.outputs[0].shape.rank
    if axis is None or rank is None:
        return UNKNOWN
    axis = int(axis) % rank
    found = None
    for st in states[:-1]:
        if isinstance(st, Axis):
            if st.axis == axis or (found is not None and found != st):
                return UNKNOWN
            found = st
    return found if found is not None else REDUCED


def _h_pack(ex, op, states):
    rank = op.outputs[0].shape.rank
    if rank is None:
        return UNKNOWN
    axis = int(op.get_attr("axis")) % rank
    found = None
    for st in states:
        if isinstance(st, Axis):
            cand = st.moved(st.axis + 1 if st.axis >= axis else st.axis)
            if found is not None and found != cand:
                return UNKNOWN
            found = cand
    return found if found is not None else REDUCED


def _h_unpack(ex, op, states):
    st = states[0]
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or rank is None:
        return UNKNOWN
    axis = int(op.get_attr("axis")) % rank
    if axis == st.axis:
        return UNKNOWN
    return st.moved(st.axis - 1 if st.axis > axis else st.axis)


def _h_split(ex, op, states):
    # Split(axis, value, num_split) / SplitV(value, size_splits, axis)
    if op.type == "Split":
        axis_t, x, st = op.inputs[0], op.inputs[1], states[1]
    else:
        axis_t, x, st = op.inputs[2], op.inputs[0], states[0]
    axis = _static(axis_t)
    rank = x.shape.rank
    if not isinstance(st, Axis) or axis is None or rank is None or int(axis) % rank == st.axis:
        return UNKNOWN
    return st


def _h_pad(ex, op, states):
    st = states[0]
    pads = _static(op.inputs[1])
    if not isinstance(st, Axis) or pads is None:
        return UNKNOWN
    if any(int(p) != 0 for p in pads[st.axis]):
        return UNKNOWN
    return st


def _h_tile(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis):
        return UNKNOWN
    # The multiples are often computed (tf.repeat, keras.ops.repeat: grouped-query attention's
    # key/value heads): read them with the batch size kept symbolic.
    mult = ex.sym_value(op.inputs[1])
    if not isinstance(mult, list) or len(mult) <= st.axis or mult[st.axis] != 1:
        return UNKNOWN
    return st


def _h_broadcast_to(ex, op, states):
    st = states[0]
    x, out = op.inputs[0], op.outputs[0]
    if not isinstance(st, Axis) or x.shape.rank is None or out.shape.rank is None:
        return UNKNOWN
    pos = st.axis + out.shape.rank - x.shape.rank
    in_dim = ex.sym_shape(x)[st.axis]
    val = ex.sym_value(op.inputs[1])
    out_dim = val[pos] if isinstance(val, list) and len(val) > pos else out.shape[pos]
    if in_dim is None or out_dim is None or in_dim != out_dim:
        return UNKNOWN
    return st.moved(pos)


def _h_slice(ex, op, states):
    st = states[0]
    x = op.inputs[0]
    if not isinstance(st, Axis):
        return UNKNOWN
    if op.type == "Slice":
        begin, size = _static(op.inputs[1]), _static(op.inputs[2])
        if begin is None or size is None:
            return UNKNOWN
        dim = x.shape[st.axis]
        full = int(begin[st.axis]) == 0 and (
            int(size[st.axis]) == -1 or (dim is not None and int(size[st.axis]) == dim)
        )
        return st if full else UNKNOWN
    # StridedSlice
    begin, end, strides = (_static(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None:
        return UNKNOWN
    ellipsis = op.get_attr("ellipsis_mask")
    new_axis = op.get_attr("new_axis_mask")
    shrink = op.get_attr("shrink_axis_mask")
    bmask, emask = op.get_attr("begin_mask"), op.get_attr("end_mask")
    rank = x.shape.rank
    if rank is None:
        return UNKNOWN
    # Walk the spec, mapping input dims to output dims.
    spec = len(begin)
    in_dim, out_dim = 0, 0
    target = None
    for i in range(spec):
        bit = 1 << i
        if ellipsis & bit:
            covered = rank - (
                spec - i - 1 - sum(1 for j in range(i + 1, spec) if new_axis >> j & 1)
            )
            while in_dim < covered:
                if in_dim == st.axis:
                    target = out_dim
                in_dim += 1
                out_dim += 1
            continue
        if new_axis & bit:
            out_dim += 1
            continue
        if in_dim == st.axis:
            full = (
                (bmask & bit or int(begin[i]) == 0)
                and (emask & bit or int(end[i]) >= (2**31 - 1) or _end_is_full(x, i, int(end[i])))
                and int(strides[i]) == 1
                and not shrink & bit
            )
            if not full:
                return UNKNOWN
            target = out_dim
        in_dim += 1
        if not shrink & bit:
            out_dim += 1
    if target is None:  # the example axis is past the spec: untouched
        target = out_dim + (st.axis - in_dim)
    return st.moved(target)


def _end_is_full(x, i, end):
    dim = x.shape[i] if x.shape.rank is not None and i < x.shape.rank else None
    return dim is not None and end >= dim


def _h_gather(ex, op, states):
    params, indices = op.inputs[0], op.inputs[1]
    sp, si = states[0], states[1]
    batch_dims = int(op.get_attr("batch_dims")) if op.type != "ResourceGather" else 0
    if op.type == "ResourceGather":
        sp = FREE
        axis = 0
    else:
        axis_v = _static(op.inputs[2])
        if axis_v is None or params.shape.rank is None:
            return UNKNOWN
        axis = int(axis_v) % params.shape.rank
    ri = indices.shape.rank
    if ri is None:
        return UNKNOWN
    # out = params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis + 1:], where
    # params.shape[:batch_dims] == indices.shape[:batch_dims] (gathered row by row).
    if isinstance(sp, Axis) and isinstance(si, Axis):
        # Both hold the examples: fine on a shared batch axis only (row j gathers from row j).
        return sp if sp == si and sp.axis < batch_dims else UNKNOWN
    if isinstance(si, Axis):
        if sp == REDUCED:
            return UNKNOWN
        return si if si.axis < batch_dims else si.moved(axis + si.axis - batch_dims)
    if isinstance(sp, Axis):
        if si != FREE:
            return UNKNOWN  # indices computed from the batch choose what each example sees
        if sp.axis < batch_dims or sp.axis < axis:
            return sp
        if sp.axis == axis:
            return UNKNOWN  # selects examples
        return sp.moved(sp.axis + ri - batch_dims - 1)
    return REDUCED


def _h_gather_nd(ex, op, states):
    sp, si = states[0], states[1]
    ri = op.inputs[1].shape.rank
    if isinstance(si, Axis) and sp in (FREE, REDUCED) and ri is not None and si.axis < ri - 1:
        return si
    return UNKNOWN


def _h_one_hot(ex, op, states):
    st = states[0]
    axis = int(op.get_attr("axis"))
    if not isinstance(st, Axis):
        return UNKNOWN
    if axis == -1 or axis > st.axis:
        return st
    return st.moved(st.axis + 1)


def _h_batch_row(ex, op, states):
    """NHWC ops whose batch axis (0) is processed row by row."""
    idx = 2 if op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2") else 0
    st = states[idx]
    for i, s in enumerate(states):
        if i != idx and isinstance(s, Axis):
            return UNKNOWN
    if op.type.startswith("Matrix"):
        rank = op.inputs[0].shape.rank
        if not isinstance(st, Axis) or rank is None or st.axis >= rank - 2:
            return UNKNOWN
        if op.type == "MatrixTranspose":
            return st
        return st
    if "data_format" in op.node_def.attr:
        fmt = op.get_attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if not fmt.startswith("N"):
            return UNKNOWN
    if not isinstance(st, Axis) or st.axis != 0:
        return UNKNOWN
    if op.type.startswith("FusedBatchNorm"):
        training = bool(op.get_attr("is_training"))
        rest = [REDUCED if training else FREE] * (len(op.outputs) - 1)
        return [st] + rest
    return st


def _h_space_to_batch(ex, op, states):
    st = states[0]
    block = _static(op.inputs[1])
    if not isinstance(st, Axis) or st.axis != 0 or block is None:
        return UNKNOWN
    return Axis(0, st.outer * int(np.prod(block)), st.inner)


def _h_batch_to_space(ex, op, states):
    st = states[0]
    block = _static(op.inputs[1])
    if not isinstance(st, Axis) or st.axis != 0 or block is None:
        return UNKNOWN
    b = int(np.prod(block))
    if st.outer % b:
        return UNKNOWN
    return Axis(0, st.outer // b, st.inner)


def _h_cumulative(ex, op, states):
    st = states[0]
    axis = _static(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or axis is None or rank is None or int(axis) % rank == st.axis:
        return UNKNOWN
    return st


def _h_select(ex, op, states):
    # Select(cond, t, e): a vector cond selects rows of t/e.
    cond = op.inputs[0]
    if cond.shape.rank == 1 and op.inputs[1].shape.rank not in (None, 1):
        sc = states[0]
        rows = [s for s in states[1:] if isinstance(s, Axis)]
        if sc in (FREE, REDUCED):
            if all(s.axis == 0 for s in rows):
                return rows[0] if rows else REDUCED
            return UNKNOWN
        if isinstance(sc, Axis) and sc.pure and all(s == Axis(0) for s in rows):
            return Axis(0)
        return UNKNOWN
    return _h_broadcast(ex, op, states)


def _h_cross_entropy(ex, op, states):
    """``(Sparse)SoftmaxCrossEntropyWithLogits``: rows of logits and labels, a loss per row.
    The rows may fold the examples with positions (``[n, T, V]`` logits reshaped to
    ``[n * T, V]`` by ``tf.nn.sparse_softmax_cross_entropy_with_logits``): each row is still one
    example's."""
    rows = [s for s in states if isinstance(s, Axis)]
    if not rows or any(s != rows[0] or s.axis != 0 for s in rows):
        return UNKNOWN
    if op.inputs[0].shape.rank != 2:
        return UNKNOWN
    return [rows[0], rows[0]]


def _h_list_from_tensor(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis) or st.axis == 0:
        return UNKNOWN
    return Elements(st.moved(st.axis - 1))


def _elements(st):
    if st == FREE:
        return FREE
    return st.of if isinstance(st, Elements) else UNKNOWN


def _h_list_get(ex, op, states):
    if any(isinstance(s, Axis) for s in states[1:]):
        return UNKNOWN
    return _elements(states[0])


def _h_list_set(ex, op, states):
    if isinstance(states[1], Axis):
        return UNKNOWN
    inner = join(_elements(states[0]), states[2])
    return UNKNOWN if inner in (UNKNOWN, REDUCED) else Elements(inner)


def _h_list_stack(ex, op, states):
    inner = _elements(states[0])
    if isinstance(inner, Axis):
        return inner.moved(inner.axis + 1)
    return UNKNOWN if inner != FREE else FREE


def _loop_fixed_point(ex, op, states):
    """``(body, sub, states)``: the body graph of while op ``op``, its analysis (an `Examples` of
    the body) and the loop variables' states at their fixed point, or None."""
    body = function_graph(op, "body")
    if body is None or ex.depth > 8 or len(body.inputs) != len(op.inputs):
        return None
    cur = list(states)
    for _ in range(6):
        sub = Examples(body, inputs=cur, n_static=ex.n_static, depth=ex.depth + 1)
        outs = [sub.of(t) for t in body.outputs]
        if len(outs) != len(cur):
            return None
        new = [join(a, b) for a, b in zip(cur, outs)]
        if new == cur:
            return body, sub, cur
        cur = new
    return None


def _h_while(ex, op, states):
    """A ``while`` loop (Keras RNNs): the body is analysed until its loop variables' states stop
    changing (a variable that starts free, such as a zero state, takes the examples' axis)."""
    found = _loop_fixed_point(ex, op, states)
    return UNKNOWN if found is None else found[2][: len(op.outputs)]


def loop_body(ex, op: tf.Operation):
    """``(body, sub)`` for while op ``op`` of the graph ``ex`` analyses: its body graph and an
    `Examples` of the body whose inputs (the loop variables) hold their states at the fixed
    point (each the join of its state on entry and after any number of iterations), so that
    what ``sub`` proves inside the body holds at every iteration. None when the loop's states
    do not settle or its body cannot be read."""
    found = _loop_fixed_point(ex, op, [ex.of(t) for t in op.inputs])
    return None if found is None else found[:2]


def _h_reverse(ex, op, states):
    """``ReverseV2`` (``go_backwards``, ``Bidirectional``): the examples stay where they are
    unless their own axis is reversed."""
    st = states[0]
    axes = _static(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or axes is None or rank is None:
        return UNKNOWN
    if st.axis in {int(a) % rank for a in axes.reshape(-1)}:
        return UNKNOWN
    return st


def _h_identity_n(ex, op, states):
    return list(states)


def function_graph(op: tf.Operation, attr: str = "f"):
    """The `FuncGraph` a call op (or a loop's ``body``) runs, or None."""
    try:
        name = op.get_attr(attr).name
        fn = tf_private.graph_function(op.graph, name)
        return getattr(fn, "graph", None) if fn is not None else None
    except Exception:  # noqa: BLE001 - any layout change: no body to look into
        return None


def _call_analysis(ex, op, states):
    fg = function_graph(op)
    if fg is None or ex.depth > 8 or len(fg.inputs) != len(op.inputs):
        return None
    return fg, Examples(fg, inputs=states, n_static=ex.n_static, depth=ex.depth + 1)


def call_body(ex, op: tf.Operation):
    """``(body, sub)`` for call op ``op`` (``PartitionedCall``) of the graph ``ex`` analyses: the
    function's graph and an `Examples` of it whose inputs hold the call's input states. None
    when the body cannot be read."""
    return _call_analysis(ex, op, [ex.of(t) for t in op.inputs])


def _h_call(ex, op, states):
    """A function call (Keras' XLA-compiled grouped convolution, nested ``tf.function``s): the
    body is analysed with the call's input states."""
    found = _call_analysis(ex, op, states)
    if found is None:
        return UNKNOWN
    fg, sub = found
    out = []
    for t in fg.outputs:
        st = sub.of(t)
        out.append(st)
    if len(out) != len(op.outputs):
        return UNKNOWN
    return out


_HANDLERS = {}
for _t in _UNARY:
    _HANDLERS[_t] = _h_unary
for _t in _BROADCAST:
    _HANDLERS[_t] = _h_broadcast
_HANDLERS["BiasAdd"] = _h_broadcast
_HANDLERS["Select"] = _h_select
for _t in _REDUCTIONS:
    _HANDLERS[_t] = _h_reduce
for _t in _LAST_AXIS:
    _HANDLERS[_t] = _h_last_axis
for _t in _BATCH_ROW_OPS:
    _HANDLERS[_t] = _h_batch_row
_HANDLERS.update(
    {
        "Transpose": _h_transpose,
        "ExpandDims": _h_expand_dims,
        "Squeeze": _h_squeeze,
        "Reshape": _h_reshape,
        "MatMul": _h_matmul,
        "BatchMatMul": _h_batch_matmul,
        "BatchMatMulV2": _h_batch_matmul,
        "BatchMatMulV3": _h_batch_matmul,
        "Einsum": _h_einsum,
        "ConcatV2": _h_concat,
        "Pack": _h_pack,
        "Unpack": _h_unpack,
        "Split": _h_split,
        "SplitV": _h_split,
        "Pad": _h_pad,
        "PadV2": _h_pad,
        "MirrorPad": _h_pad,
        "Tile": _h_tile,
        "BroadcastTo": _h_broadcast_to,
        "Slice": _h_slice,
        "StridedSlice": _h_slice,
        "GatherV2": _h_gather,
        "ResourceGather": _h_gather,
        "GatherNd": _h_gather_nd,
        "OneHot": _h_one_hot,
        "SpaceToBatchND": _h_space_to_batch,
        "BatchToSpaceND": _h_batch_to_space,
        "Cumsum": _h_cumulative,
        "Cumprod": _h_cumulative,
        "CumulativeLogsumexp": _h_cumulative,
        "IdentityN": _h_identity_n,
        "SoftmaxCrossEntropyWithLogits": _h_cross_entropy,
        "SparseSoftmaxCrossEntropyWithLogits": _h_cross_entropy,
        "TensorListFromTensor": _h_list_from_tensor,
        "TensorListGetItem": _h_list_get,
        "TensorListSetItem": _h_list_set,
        "TensorListStack": _h_list_stack,
        "ReverseV2": _h_reverse,
        "While": _h_while,
        "StatelessWhile": _h_while,
        "PartitionedCall": _h_call,
        "StatefulPartitionedCall": _h_call,
    }
)


def examples_first(t: tf.Tensor, ax: Axis, n) -> tf.Tensor:
    """``t`` rearranged to ``[n, partners, *other dims]``: the examples first, then the entries of
    the (folded) example axis that belong to each example, then the remaining axes in order.

    Static sizes stay static (a reshape to Python numbers: no shape ops, and the shapes of
    what follows are known), and an axis laid out ``[n, inner]`` (``outer == 1``: a Dense on
    sequences) is one reshape, no transpose."""
    rank = t.shape.rank
    if ax.axis != 0:
        t = tf.transpose(t, [ax.axis] + [i for i in range(rank) if i != ax.axis])
    if ax.pure:
        return tf.expand_dims(t, 1)
    n_static = tf.get_static_value(n)
    n_dim = int(n_static) if n_static is not None else n
    rest_shape = t.shape[1:]
    if rest_shape.is_fully_defined() and n_static is not None:
        dims = rest_shape.as_list()

        def shape(*lead):
            return [*lead, *dims]

    else:
        rest = tf.shape(t)[1:]

        def shape(*lead):
            return tf.concat([list(lead), rest], 0)

    if ax.outer == 1:  # [n, inner] row-major: already examples first
        return tf.reshape(t, shape(n_dim, ax.inner))
    t = tf.reshape(t, shape(ax.outer, n_dim, ax.inner))
    t = tf.transpose(t, [1, 0, 2] + list(range(3, rank + 2)))
    return tf.reshape(t, shape(n_dim, ax.partners))


def describe(st) -> str:
    if isinstance(st, Axis):
        return str(st)
    return {FREE: "no examples", REDUCED: "batch statistics", UNKNOWN: "unknown"}.get(st, str(st))


def per_example_masked(t: tf.Tensor, ax: Axis, n, start, size) -> tf.Tensor:
    """``[size, *t.shape]``: entry ``s`` is ``t`` with every entry zeroed but those of example
    ``start + s``. For a parameter broadcast to the batch (a class token tiled to ``[n, 1, d]``)
    whose copies meet the examples one by one: example ``j``'s gradient of it is ``j``'s copy."""
    rank = t.shape.rank
    ef = examples_first(t, ax, n)[start : start + size]  # [size, P, *rest]
    hot = tf.one_hot(tf.range(size) + start, n, dtype=t.dtype)  # [size, n]
    extra = [1] * rank  # P and the rank - 1 other axes
    full = tf.reshape(hot, tf.concat([tf.shape(hot), extra], 0)) * ef[:, None]  # [size, n, P, rest]
    rest = tf.shape(ef)[2:]
    # back from [n, outer * inner, *rest] to t's layout, for each of the `size` copies
    full = tf.reshape(full, tf.concat([[size, n, ax.outer, ax.inner], rest], 0))
    full = tf.transpose(full, [0, 2, 1, 3] + list(range(4, rank + 3)))
    full = tf.reshape(full, tf.concat([[size, -1], rest], 0))  # [size, outer*n*inner, *rest]
    if ax.axis != 0:
        perm = [0] + list(range(2, ax.axis + 2)) + [1] + list(range(ax.axis + 2, rank + 1))
        full = tf.transpose(full, perm)
    return full
