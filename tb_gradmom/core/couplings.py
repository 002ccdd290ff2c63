"""Couplings: where an example's loss comes to depend on other examples' rows after a layer.

Every rule takes example ``j``'s gradient at a site with output ``z`` from row ``j`` of
``n * dL/dz`` (a mean loss). That is ``d l_j / d z_j``, and the rule exact, only when ``l_j``
depends on ``z`` through ``z_j`` alone: nothing on the way from ``z`` to the per-example losses
``l`` may bring other examples' rows of ``z`` back into row ``j``. Ops that do, *couplers*:

* a **batch statistic** (a tensor that `tb_gradmom.core.axes` proves `REDUCED`: a mean, a
  variance, a standard deviation over the batch) entering an op whose output holds the
  examples: BatchNormalization in training mode, centring by the batch mean, StyleGAN's
  minibatch standard deviation. A fused batch norm in training mode does it inside one op;
* a **custom gradient** (``tf.custom_gradient``, ``gradient_override_map``: an op with a
  ``_gradient_op_type``) that an example-carrying tensor goes through, whose backward pass is
  not proven to map example j's output gradient to example j's input gradient, linearly
  (`_backward_not_per_example` traces it on its own: a gradient centred over the batch or
  divided by the batch's RMS couples; ``tf.nn.silu``'s does not);
* a **function call or loop** whose body holds one of the above;
* an op where the proof of the examples' axis **stops** (`UNKNOWN` past it): nothing is known
  of how it mixes the rows.

A site is coupled when its output is upstream of a coupler's inputs (through tensors that carry
a gradient). Its per-example gradient ``g_j = d l_j / d theta``, through the batch's forward
pass, is then a row of the jacobian of the per-example losses: the exact fallback computes it
(`tb_gradmom.core.plan` routes coupled variables there). A coupler *before* a site is harmless:
a batch statistic that a variable's derived parameter takes (``rsqrt(var) * gamma``) is held
fixed in ``d l_j / d gamma`` as in the gradient itself.

`refuse_mixing` is the loss's side of the same question: per-example losses that combine two
tensors holding the examples (``img @ txt^T`` of a contrastive loss, distances between a batch
and a support set of the same size) have no per-example split at all.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import tensorflow as tf

from tb_gradmom._compat import PrivateAPIError, tf_private
from tb_gradmom.core import axes as _axes
from tb_gradmom.core.errors import PerExampleLossError

__all__ = ["Coupling", "Couplings", "refuse_mixing"]

# Ops whose outputs carry no gradient of their inputs.
_NO_GRADIENT = frozenset({"Shape", "ShapeN", "Size", "Rank", "StopGradient", "PreventGradient"})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
_LOOPS = frozenset({"While", "StatelessWhile"})
_FUSED_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
# Ops that combine entries of two operands: with the examples in both, each output entry
# depends on an example of each (an [n, n] matrix of logits, distances, similarities).
_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})
_ELEMENTWISE_PAIRS = frozenset(
    """AddV2 Add Sub Mul RealDiv Div DivNoNan MulNoNan Maximum Minimum Pow SquaredDifference
    BiasAdd Atan2 Xdivy Xlogy""".split()
)
# Nested bodies looked into (a loop inside a call inside a loop ...).
_MAX_DEPTH = 8


@dataclass(frozen=True)
class Coupling:
    """An op that brings other examples' rows into an example's loss, and how."""

    op: tf.Operation
    # "a batch statistic", "a custom gradient", "an op the analysis cannot see through", ...
    what: str
    # the tensor that carries the coupling (the batch statistic), or None
    via: tf.Tensor | None = None

    def __str__(self) -> str:
        return f"{self.op.type} op '{self.op.name}' ({self.what})"

    def detail(self) -> str:
        """`str` with the tensor that carries the coupling, when there is one."""
        if self.via is None:
            return str(self)
        return f"{self.op.type} op '{self.op.name}' ({self.what}: '{self.via.name}')"


def _differentiable(t: tf.Tensor) -> bool:
    return t.dtype.is_floating or t.dtype.is_complex or t.dtype == tf.variant


def _holds_examples(st) -> bool:
    return isinstance(st, _axes.Axis | _axes.Elements)


def _custom_gradient(op: tf.Operation) -> bool:
    return "_gradient_op_type" in op.node_def.attr


def _body(ex: _axes.Examples, op: tf.Operation):
    """``(graph, analysis)`` of the body of a call or loop ``op``, or None."""
    if op.type in _LOOPS:
        return _axes.loop_body(ex, op)
    if op.type in _CALLS:
        return _axes.call_body(ex, op)
    return None


def _coupler(
    ex: _axes.Examples, op: tf.Operation, flowing: set, depth: int
) -> tuple[Coupling, list] | None:
    """``(Coupling, entries)`` when ``op`` couples the examples, else None. ``entries``: the
    inputs whose upstream is coupled (gradient-carrying, and not free of examples).

    ``flowing``: the tensors whose rows reach the per-example losses through tensors that hold
    the examples (not through a batch statistic: a statistic of a statistic, as the centring
    inside ``reduce_variance``, couples nothing until the statistic meets the examples, and
    there the coupler is named)."""
    if not any(t.ref() in flowing for t in op.outputs):
        return None
    inputs = [(x, ex.of(x)) for x in op.inputs if _differentiable(x)]
    carried = [x for x, st in inputs if st != _axes.FREE]
    if not carried:
        return None
    outs = [ex.of(t) for t in op.outputs if _differentiable(t)]
    if any(st == _axes.UNKNOWN for st in outs):
        known = [x for x, st in inputs if st not in (_axes.FREE, _axes.UNKNOWN)]
        if not known:
            return None  # inside the unknown region: its boundary is the coupler
        why = ex.why(op.outputs[0])
        return Coupling(op, f"the examples cannot be followed past it: {why}"), known
    if _custom_gradient(op):
        backward = _backward_not_per_example(ex, op)
        if backward is not None:
            return Coupling(op, f"a custom gradient whose backward pass {backward}"), carried
    if not any(_holds_examples(st) for st in outs):
        return None
    if op.type in _FUSED_NORMS and op.get_attr("is_training"):
        return Coupling(op, "a batch normalised with its own statistics"), carried
    for x, st in inputs:
        if st == _axes.REDUCED:
            return Coupling(op, "a batch statistic into the examples", via=x), [
                y for y, s in inputs if s == _axes.REDUCED
            ]
    if depth < _MAX_DEPTH and (op.type in _LOOPS or op.type in _CALLS):
        found = _body(ex, op)
        if found is not None:
            body, sub = found
            inner = _first_coupler(body, sub, depth + 1)
            if inner is not None:
                return Coupling(op, f"in its body: {inner}"), carried
    return None


# Ops linear in their inputs that depend on the incoming gradient ``dy``, whatever the other
# inputs are: views, sums, sign changes, and the gradient ops of element-wise functions
# (``f'(x) * dy``).
_LINEAR = frozenset(
    """Identity IdentityN Cast Reshape ExpandDims Squeeze Transpose BroadcastTo Tile ConcatV2
    Pack Unpack Split SplitV Slice StridedSlice Pad PadV2 Sum Neg AddV2 Add AddN Sub Conj Real
    Imag ReverseV2 Snapshot EnsureShape ReluGrad Relu6Grad EluGrad SeluGrad LeakyReluGrad
    SoftplusGrad SoftsignGrad SigmoidGrad TanhGrad RsqrtGrad SqrtGrad ReciprocalGrad
    InvGrad""".split()
)
# Ops linear in one operand when the others do not depend on ``dy``.
_LINEAR_IN_ONE = frozenset(
    """Mul MulNoNan MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum GatherV2 Select
    SelectV2""".split()
)
# Ops linear in their first operand when the others do not depend on ``dy``.
_LINEAR_IN_FIRST = frozenset({"RealDiv", "Div", "DivNoNan", "Mean"})


def _backward_not_per_example(ex: _axes.Examples, op: tf.Operation) -> str | None:
    """Why the custom gradient of ``op`` is not proven to give example j's input gradient
    from example j's output gradient alone, linearly; None when it is.

    The registered backward function is traced on its own, in a graph nested in ``op``'s
    (`tf_private.probe_graph`: nothing of it joins the step), with placeholders ``dy`` for the
    output gradients holding the examples where ``op``'s outputs hold them. Then the examples'
    axis is followed through it (`tb_gradmom.core.axes`): every tensor computed from ``dy``
    must hold the examples (a statistic of ``dy`` over the batch couples them) and be linear in
    ``dy`` (a backward that normalises ``dy`` has no per-example split whose mean is the
    gradient), and each input's gradient must hold the examples where the input does. The
    backward function (Python) is called once more at trace time for it, in that graph."""
    try:
        grad_fn = tf_private.gradient_function(op)
        probe = tf_private.probe_graph("gradmom_custom_gradient_probe")
    except PrivateAPIError as e:
        return f"cannot be read ({e})"
    if grad_fn is None:
        return "is not registered"
    try:
        with probe.as_default():
            dys = [tf.compat.v1.placeholder(t.dtype, t.shape) for t in op.outputs]
            grads = grad_fn(op, *dys)
    except Exception as e:  # noqa: BLE001 - any failure to trace it: not proven
        return f"cannot be traced on its own ({type(e).__name__}: {e})"
    grads = list(grads) if isinstance(grads, list | tuple) else [grads]
    outer = {}
    for external, internal in getattr(probe, "captures", []):
        own = isinstance(external, tf.Tensor) and getattr(external, "graph", None) is ex.graph
        outer[internal.ref()] = ex.of(external) if own else _axes.FREE
    for ph, out in zip(dys, op.outputs):
        outer[ph.ref()] = ex.of(out)
    inputs = list(probe.inputs) + dys
    states = [outer.get(t.ref(), _axes.UNKNOWN) for t in inputs]
    probe.inputs.extend(dys)  # the analysis takes the graph's inputs with their states
    sub = _axes.Examples(probe, inputs=states, n_static=ex.n_static, depth=ex.depth + 1)
    from_dy = {ph.ref() for ph in dys}

    def depends(t: tf.Tensor) -> bool:
        stack, seen = [t], set()
        while stack:
            u = stack.pop()
            if u.ref() in from_dy:
                return True
            if u.ref() in seen:
                continue
            seen.add(u.ref())
            stack.extend(u.op.inputs)
        return False

    for i, x in enumerate(op.inputs):
        st = ex.of(x)
        if st == _axes.FREE or not _differentiable(x) or i >= len(grads) or grads[i] is None:
            continue
        g = grads[i]
        if not isinstance(g, tf.Tensor):
            return f"returns a {type(g).__name__} for input {i}"
        if sub.of(g) != st:
            return (
                f"gives input {i} a gradient with {_axes.describe(sub.of(g))}, where the input "
                f"holds {_axes.describe(st)}"
            )
        stack, seen = [g], set()
        while stack:
            t = stack.pop()
            if t.ref() in seen or t.ref() in from_dy or not depends(t):
                continue
            seen.add(t.ref())
            inner = t.op
            tst = sub.of(t)
            if not _holds_examples(tst):
                return (
                    f"computes '{t.name}' ({inner.type}) from the output gradient with "
                    f"{_axes.describe(tst)}"
                )
            on_dy = [k for k, y in enumerate(inner.inputs) if depends(y)]
            linear = inner.type in _LINEAR
            linear = linear or (inner.type in _LINEAR_IN_ONE and len(on_dy) == 1)
            linear = linear or (inner.type in _LINEAR_IN_FIRST and on_dy == [0])
            if inner.type in ("Select", "SelectV2") and 0 in on_dy:
                linear = False
            if not linear:
                return f"is not linear in the output gradient ({inner.type} op '{inner.name}')"
            stack.extend(inner.inputs[k] for k in on_dy)
    return None


def _first_coupler(graph, sub: _axes.Examples, depth: int) -> Coupling | None:
    """A coupler among the ops of a function body on the way to its outputs, or None."""
    ends = [t for t in graph.outputs if _differentiable(t)]
    ops, flowing = _gradient_ancestors(ends, sub)
    for op in ops:
        found = _coupler(sub, op, flowing, depth)
        if found is not None:
            return found[0]
    return None


def _gradient_ancestors(ends, ex: _axes.Examples) -> tuple[list[tf.Operation], set]:
    """The ops through whose outputs a gradient flows to ``ends`` (through tensors that hold
    examples or batch statistics, past no ``StopGradient`` or shape op), each once; and the
    tensors among them that reach ``ends`` through tensors holding the examples only."""
    ops: dict[tf.Operation, None] = {}
    flowing: set = set()
    seen: set = set()
    # (tensor, whether every tensor from it to the ends holds the examples)
    stack = [(t, True) for t in ends]
    while stack:
        t, rows = stack.pop()
        rows = rows and ex.of(t) != _axes.REDUCED
        if (t.ref(), rows) in seen:
            continue
        seen.add((t.ref(), rows))
        if not _differentiable(t) or ex.of(t) == _axes.FREE:
            continue
        if rows:
            flowing.add(t.ref())
        op = t.op
        if op.type in _NO_GRADIENT:
            continue
        ops[op] = None
        stack.extend((x, rows) for x in op.inputs)
    return list(ops), flowing


class Couplings:
    """The couplers on the way to the per-example losses ``ends``, and what each couples.

    ``of(t)`` is the nearest coupler that a gradient-carrying tensor ``t`` feeds (the rows of
    the examples in ``t`` reach other examples' losses through it), or None.
    """

    def __init__(self, ends, ex: _axes.Examples):
        self.ex = ex
        entries: list[tuple[tf.Tensor, Coupling]] = []
        ops, flowing = _gradient_ancestors(ends, ex)
        for op in ops:
            found = _coupler(ex, op, flowing, 0)
            if found is not None:
                coupling, xs = found
                entries.extend((x, coupling) for x in xs)
        # breadth first from every coupler's inputs at once: each tensor gets its nearest one
        self._of: dict = {}
        queue = deque(entries)
        while queue:
            t, coupling = queue.popleft()
            if t.ref() in self._of or not _differentiable(t) or ex.of(t) == _axes.FREE:
                continue
            self._of[t.ref()] = coupling
            if t.op.type not in _NO_GRADIENT:
                queue.extend((x, coupling) for x in t.op.inputs)

    def of(self, t: tf.Tensor) -> Coupling | None:
        return self._of.get(t.ref())

    def of_sites(self, sites) -> Coupling | None:
        """The coupler after one of ``sites`` (``(Site, Contribution)`` pairs), or None."""
        for site, _ in sites:
            outs = site.output if isinstance(site.output, tuple) else (site.output,)
            for out in outs:
                found = self.of(out)
                if found is not None:
                    return found
        return None


def _mixing(ex: _axes.Examples, op: tf.Operation) -> list[tf.Tensor]:
    """The operands of ``op`` that hold the examples, when ``op`` combines two or more of them
    entry by entry (a product, an element-wise op broadcasting one against the other) and the
    analysis cannot align them; else []."""
    if op.type not in _PRODUCTS and op.type not in _ELEMENTWISE_PAIRS:
        return []
    if not any(ex.of(t) == _axes.UNKNOWN for t in op.outputs):
        return []
    held = [x for x in op.inputs if isinstance(ex.of(x), _axes.Axis)]
    return held if len(held) >= 2 else []


def refuse_mixing(values: tf.Tensor, ex: _axes.Examples, what: str) -> None:
    """Raise `PerExampleLossError` when the per-example losses ``values`` (described by
    ``what``) are computed by an op that combines two tensors holding the examples; nothing
    when their examples' axis is proven, or unproven for another reason."""
    if ex.of(values) != _axes.UNKNOWN:
        return
    seen: set = set()
    stack = [values]
    while stack:
        t = stack.pop()
        if t.ref() in seen or ex.of(t) != _axes.UNKNOWN:
            continue
        seen.add(t.ref())
        held = _mixing(ex, t.op)
        if held:
            operands = ", ".join(f"'{x.name}' ({_axes.describe(ex.of(x))})" for x in held)
            raise PerExampleLossError(
                f"{what} mix the examples: {t.op.type} op '{t.op.name}' combines {operands}, "
                "which all hold the examples, so each of its entries depends on several "
                "examples (a contrastive loss over [n, n] logits, in-batch negatives, "
                "distances to a support set built from the batch). Such a loss has no "
                "per-example gradients and no moments of them. Compute the moments of a loss "
                "that is a mean or a sum of per-example terms (each depending on its own "
                "example alone), or pass the [n] vector of such losses as `loss`."
            )
        stack.extend(x for x in t.op.inputs if x.ref() not in seen)
