"""Executing a moments plan: the one backward pass, the rules' power sums, the exact fallback.

`gradients_and_moments` is `tb_gradmom.core.plan.make_plan` (trace-time analysis) then
`run_backward` (the gradients of the loss with respect to the variables and to every site's
output, taken once, outside any conditional) then `Backward.moments` (the moment ops, which may
sit in a ``tf.cond`` branch so that a step that logs nothing runs none of them).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import tensorflow as tf

from tb_gradmom.core import fallback as _fallback
from tb_gradmom.core import loss as _loss
from tb_gradmom.core import plan as _plan
from tb_gradmom.core.plan import LISTED, WARNED, Options, Plan, check_orders, listing
from tb_gradmom.core.rules.base import (
    UNROLL,
    Count,
    Site,
    power_sums_of,
    reshape,
    scalar,
    static_chunks,
    sum_over_chunks,
    times,
)
from tb_gradmom.core.sites import VariablePlan

__all__ = [
    "gradients_and_moments",
    "variance",
    "run_backward",
    "Backward",
    "Moments",
    "DEFAULT_CHUNK_ELEMENTS",
]

# Per rule, examples are processed in chunks so that the per-example tensors of one chunk hold
# at most this many elements (32 MiB in float32), unless `chunk_size` is given.
DEFAULT_CHUNK_ELEMENTS = 1 << 23
# Where per-example gradients are materialised whole (Dense on sequences, EinsumDense,
# variables with several sites), one chunk holds at most this many of their elements (4 MiB in
# float32): the per-example kernels of a Dense(128 -> 512) on sequences go 16 examples at a
# time. Transformer block of bench_core.py (batch 32): peak 1.28x plain instead of 1.44x, the
# same step time (chunks of 8: 1.23x; two chunks in flight at once: no faster).
MATERIALISED_CHUNK_ELEMENTS = 1 << 20
_MATERIALISED_CHUNKS = 2


def _warn_fallback(plans: Sequence[VariablePlan], ids: Sequence[int]) -> None:
    key = ("fallback",) + tuple(plans[i].name for i in ids)
    if key in WARNED:
        return
    WARNED.add(key)
    lines = listing([f"'{plans[i].name}' ({plans[i].fallback})" for i in ids], sep="; ")
    more = " (gradmom.plan_moments lists every variable's rule)" if len(ids) > LISTED else ""
    warnings.warn(
        f"tb_gradmom: no exact rule for {lines}{more}. Their moments come from the exact "
        "fallback: per-example gradients of the per-example losses, vectorised over the "
        "examples (slow path, about one backward pass of the batch per example, on the steps "
        "that compute moments). Pass fallback='error' to raise instead.",
        stacklevel=4,
    )


def _warn_disconnected(
    variables: Sequence[tf.Variable],
    names: Sequence[str],
    grads: Sequence[tf.Tensor | None],
    fused_ids: set[int],
) -> None:
    """Once per set: variables whose gradient is structurally zero (the loss does not depend on
    them) or that are not floating point; their moments are zeros."""
    lines = []
    for i, (v, nm, g) in enumerate(zip(variables, names, grads)):
        if not v.dtype.is_floating:
            lines.append(f"'{nm}' ({v.dtype.name}, not floating point)")
        elif g is None and i not in fused_ids:
            lines.append(f"'{nm}' (the loss does not depend on it)")
    key = ("disconnected", *lines)
    if not lines or key in WARNED:
        return
    WARNED.add(key)
    warnings.warn(
        "tb_gradmom: "
        + listing(lines, sep="; ")
        + " get zero moments and a None gradient. Leave them "
        "out of var_list (e.g. model.trainable_variables holds only what the loss uses).",
        stacklevel=4,
    )


def batch_asserts(checks: Sequence[tuple[tf.Tensor, str]], n: Count) -> list[tf.Operation]:
    """One run-time assert that every batch evidence of ``checks`` (``(count, description)``)
    equals ``n`` (one op for the whole model, not one per site). Its message lists each
    evidence with its value."""
    if not checks:
        return []
    values = tf.stack([tf.cast(t, tf.int32) for t, _ in checks])
    descs = "; ".join(f"[{i}] {d}" for i, (_, d) in enumerate(checks))
    return [
        tf.debugging.Assert(
            tf.reduce_all(tf.equal(values, n)),
            [
                "tb_gradmom: batch size mismatch: these counts should all equal the batch size",
                n,
                "(the first evidence), got",
                values,
                "for:",
                descs,
            ],
            summarize=len(checks),
            name="batch_size_check",
        )
    ]


def _chunk(
    plan: VariablePlan, chunk_size: int | None, fast: bool = False, n: Count | None = None
) -> int:
    if chunk_size is not None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
        return int(chunk_size)
    if fast:  # the single site's power_sums path
        per_example = plan.sites[0][1].power_sums_elements or 1
        return max(1, DEFAULT_CHUNK_ELEMENTS // per_example)
    per_example = sum(c.per_example_elements for _, c in plan.sites)
    per_example = max(per_example, int(plan.variable.shape.num_elements() or 1))
    chunk = max(1, MATERIALISED_CHUNK_ELEMENTS // max(per_example, 1))
    n_static = tf.get_static_value(n) if n is not None else None
    if n_static is not None:
        # at most _MATERIALISED_CHUNKS chunks of a static batch below the 8M budget: each chunk
        # is more ops to trace (BERT of bench_zoo.py: 4 chunks took trace + first call from 1.9x
        # to 2.6x plain)
        floor = -(-int(n_static) // _MATERIALISED_CHUNKS)
        chunk = max(chunk, min(floor, max(1, DEFAULT_CHUNK_ELEMENTS // max(per_example, 1))))
    return chunk


def _power_sums_chunked(
    plan: VariablePlan, deltas: Sequence[Any], n: Count, orders: tuple[int, ...], chunk: int
) -> dict[int, tf.Tensor]:
    """sum_j g_j**p with per-example gradients summed over sites, chunk by chunk."""
    var_shape = plan.variable.shape

    def chunk_sums(start: Count, size: Count) -> dict[int, tf.Tensor]:
        g = None
        for (_site, c), delta in zip(plan.sites, deltas):
            part = reshape(c.per_example(delta, n, start, size), [-1, *var_shape])
            g = part if g is None else g + part
        return power_sums_of(g, orders)

    return sum_over_chunks(n, chunk, orders, var_shape, plan.dtype, chunk_sums, unroll=UNROLL)


@tf.autograph.experimental.do_not_convert
def gradients_and_moments(
    loss: tf.Tensor,
    var_list: Sequence[tf.Variable],
    orders: Sequence[int] = (1, 2),
    reduction: str | None = None,
    *,
    batch_size: int | tf.Tensor | None = None,
    chunk_size: int | None = None,
    name: str | None = None,
    fallback: str = "exact",
    loss_scale: float | tf.Tensor | tf.Variable | None = None,
    coupled: str = "exact",
) -> tuple[list[tf.Tensor | None], list[dict[int, tf.Tensor]]]:
    """Gradients and the moments of the per-example gradients, from one backward pass.

    The p-th moment of variable ``theta`` is ``M_p = (1/n) * sum_j g_j ** p``, element-wise, where
    ``g_j = d l_j / d theta`` is the *unscaled* gradient of example ``j``'s own loss ``l_j``
    (whatever the reduction) and ``n`` the number of examples. ``M_1`` is the mini-batch gradient
    of the mean loss; the (unbiased) variance is ``variance(moments_i, n)``.

    Call it inside a ``tf.function`` (or a ``tf.compat.v1`` graph), after the forward pass:

        @tf.function
        def train_step(x, y):
            logits = model(x, training=True)
            loss = loss_fn(y, logits)  # mean over the batch
            grads, moments = gradmom.gradients_and_moments(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return moments

    Args:
      loss: a scalar, a mean or a sum of the per-example losses of the batch (checked in the
        graph: `PerExampleLossError` otherwise), plus any terms ``R`` that hold no example (a
        weight penalty, Keras regularisers): part of every example's loss, so that ``g_j`` is
        the gradient of ``l_j + R`` for a mean and of ``l_j + R / n`` for a sum; or a ``[n]``
        vector of per-example losses (then ``grads`` are those of its mean, and
        ``reduction`` is ignored).
      var_list: ``tf.Variable``s or Keras variables (``model.trainable_variables``).
      orders: the moment orders to compute, integers from 1 to 4.
      reduction: None (default: read from the graph: a division by a count that holds the batch
        size is a mean, none is a sum), or ``"mean"``/``"sum"`` where a constant divisor is
        ambiguous; one that contradicts the graph's structure raises ``ValueError``.
      batch_size: the number of examples ``n``. Inferred from the graph by default (the
        per-example loss vector or the batch axis of the layers' inputs); when given it is
        checked against the graph like every other piece of evidence.
      chunk_size: examples per chunk where per-example gradients are materialised (convolutions,
        Dense on sequences, variables used by several ops). Default: chosen per layer so one
        chunk holds at most 8M elements (1M where whole per-example gradients are
        materialised: Dense on sequences, EinsumDense, variables used by several ops).
      name: a name scope for the added ops.
      fallback: for a variable consumed by an op without an exact rule (a custom op,
        ``tf.sin(W)``, a ``tf.while_loop`` that `tb_gradmom.core.rules.loops` does not cover;
        Keras LSTM/GRU/SimpleRNN have a rule): ``"exact"`` (default) computes its
        per-example gradients from the per-example losses by vectorised autodiff (exact, about
        one backward pass per example; a warning names the variables once); ``"error"`` raises
        `UnsupportedOpError` instead. The fallback needs the per-example losses: a ``[n]``
        ``loss``, or a scalar that is a mean/sum over them (found in the graph).
      loss_scale: the factor ``loss`` was multiplied by, if any (mixed precision with
        ``keras.optimizers.LossScaleOptimizer``: pass ``optimizer.scale_loss(loss)`` and
        ``loss_scale=optimizer.dynamic_scale``). ``grads`` are then those of the scaled loss,
        for the optimizer to unscale; the moments are those of the unscaled gradients. Under
        mixed precision (float16/bfloat16 compute, float32 variables) moments are computed
        and returned in float32: output gradients are cast up, and unscaled, before any power.

      coupled: ``"exact"`` (default): a variable used before an op that couples the examples
        (a training-mode batch normalisation, centring by the batch mean, a custom gradient
        that mixes them) takes the exact fallback, ``g_j = d l_j / d theta`` through the
        batch's forward pass (slow: about one backward pass of the batch per example).
        ``"rules"``: such variables keep their rules, whose ``g_j`` is example j's share of
        the batch gradient at the layer (row j of ``n * dL/dz``; it sums to the gradient, but
        is not ``d l_j / d theta``), with a warning naming the op.

    Returns:
      ``(grads, moments)``: ``grads[i]`` is what ``tf.gradients(loss, var_list)[i]`` gives (for a
      vector loss, of its mean; ``None`` for a variable the loss does not depend on). A
      convolution kernel's gradient is the order-1 sum of the same per-example work, so it equals
      TensorFlow's up to float rounding, and TensorFlow's own filter gradient is not computed.
      ``moments[i]`` is a dict from each order ``p`` to a tensor shaped like ``var_list[i]``,
      float32 (float64 for float64 variables).

    Raises:
      RuntimeError: when called eagerly.
      UnsupportedOpError: with ``fallback="error"``, a requested variable is consumed by an op
        without an exact rule.
      PerExampleLossError: ``loss`` is not a mean or a sum of per-example losses (a maximum, a
        norm, a product, values that mix the examples).
      BatchSizeError: the batch size cannot be inferred or the graph disagrees about it.
    """
    options = Options.check(
        orders, reduction, batch_size, chunk_size, fallback, loss_scale, coupled=coupled
    )
    plan = _plan.make_plan(loss, var_list, options, name=name or "gradients_and_moments")
    backward = run_backward(plan, fused=True)
    return list(backward.grads), backward.moments().values


def _shaped(moments_i: dict[int, tf.Tensor], vplan: VariablePlan) -> dict[int, tf.Tensor]:
    """The moments with the variable's static shape: an embedding's gradient arrives as
    ``IndexedSlices`` whose dense form has an unknown number of rows, and the writers size their
    statistics from static shapes."""
    for t in moments_i.values():
        t.set_shape(vplan.variable.shape)
    return moments_i


def unscaled(grad, dtype: tf.DType, inv_scale: tf.Tensor | None) -> tf.Tensor:
    """A gradient in the moments' ``dtype``, times the loss scale's inverse if there is one
    (mixed precision: the cast comes first, so nothing is unscaled in float16)."""
    g = tf.cast(tf.convert_to_tensor(grad), dtype)
    return g if inv_scale is None else g * tf.cast(inv_scale, dtype)


@dataclass(frozen=True)
class Moments:
    """The moments of one call: ``values[k][p]`` for the k-th variable asked for, and ``n``, the
    number of examples they average over (the global batch under ``tf.distribute``)."""

    values: list[dict[int, tf.Tensor]]
    n: Count


@dataclass
class Backward:
    """The backward pass of one plan: the gradients and every site's output gradient.

    `run_backward` builds it outside any conditional; `moments` adds the moment ops and can be
    called inside a ``tf.cond`` branch so that a step that logs nothing never runs them.
    """

    plan: Plan
    # aligned with the plan's variables (None where the loss does not depend on one)
    grads: list[tf.Tensor | None]
    # the gradients of the loss with respect to the sites' outputs, at `index[output.ref()]`
    out_grads: list[tf.Tensor | None]
    index: dict[Any, int]
    # variable index -> {p: M_p} already computed by `run_backward` (``fused=True``)
    fused: dict[int, dict[int, tf.Tensor]] = field(default_factory=dict)
    # variable index -> {p: sum_j g_j**p} (p > 1) for the variables on the exact fallback
    fallback_sums: dict[int, dict[int, tf.Tensor]] = field(default_factory=dict)
    # 1 / loss_scale (float32) when the loss is scaled (mixed precision), else None
    inv_scale: tf.Tensor | None = None
    # variables whose gradient `run_backward(defer=...)` left to `from_sums` (None in `grads`)
    deferred: list[int] = field(default_factory=list)
    # variable index -> dR/dtheta (unscaled, the moments' dtype) for the variables that the
    # loss's example-free terms R read (`Plan.free_ids`; R is part of every example's loss)
    shifts: dict[int, tf.Tensor] = field(default_factory=dict)

    def from_sums(self, orders: Sequence[int]) -> tuple[list[tf.Tensor], Backward]:
        """The gradients of the `deferred` variables from their rule's power sums of
        ``orders`` (1 included), and a `Backward` whose `moments` take those variables' moments
        from the same sums. In a ``tf.cond`` branch: ``orders=(1,)`` where nothing is logged,
        the logged orders where the moments are."""
        orders = tuple(sorted({1, *orders}))
        plan = self.plan
        grads, sums = [], {}
        with tf.name_scope(plan.scope.rstrip("/") + "_from_sums"), static_chunks(plan.xla):
            for i in self.deferred:
                vplan = plan.variables[i]
                sums[i] = _moments_of(
                    vplan,
                    None,
                    self.out_grads,
                    self.index,
                    plan.n,
                    plan.mode,
                    orders,
                    plan.options.chunk_size,
                    sums_only=True,
                    inv_scale=self.inv_scale,
                    shift=self.shifts.get(i),
                )
                grads.append(_grad_from_sums(vplan, sums[i][1], plan))
        return grads, replace(self, fused={**self.fused, **sums})

    def plain_grads(self) -> list[tf.Tensor]:
        """The gradients of the `deferred` variables as TensorFlow's own gradient of their op
        computes them (e.g. ``Conv2DBackpropFilter``), from the op's output gradient: for the
        ``tf.cond`` branch where no moments are computed. Under XLA, a function call's (Keras'
        grouped convolution) from its rule's order-1 sums, as `from_sums` gives it."""
        grads = []
        plan = self.plan
        with tf.name_scope(plan.scope.rstrip("/") + "_plain"), static_chunks(plan.xla):
            for i in self.deferred:
                vplan = plan.variables[i]
                site, contribution = vplan.sites[0]
                if contribution.plain_gradient is None:  # a function call, under XLA
                    m1 = _moments_of(
                        vplan,
                        None,
                        self.out_grads,
                        self.index,
                        plan.n,
                        plan.mode,
                        (1,),
                        plan.options.chunk_size,
                        sums_only=True,
                        inv_scale=self.inv_scale,
                    )[1]
                    grads.append(_grad_from_sums(vplan, m1, plan))
                    continue
                dz = self.out_grads[self.index[_site_outputs(site)[0].ref()]]
                grad = contribution.plain_gradient(dz)
                grad = reshape(tf.cast(grad, vplan.variable.dtype), vplan.variable.shape)
                if i in self.shifts:  # the loss's example-free terms (a weight penalty)
                    r = self.shifts[i]
                    if self.plan.options.loss_scale is not None:  # as tf.gradients: scaled
                        r = r * tf.cast(self.plan.options.loss_scale, r.dtype)
                    grad = grad + tf.cast(r, grad.dtype)
                grads.append(grad)
        return grads

    @property
    def vector(self) -> bool:
        """The loss was given as a [n] vector of per-example losses."""
        return self.plan.loss_vector is not None

    @property
    def _scope(self) -> str:
        return self.plan.scope.rstrip("/") + "_moments"

    def moments(
        self,
        orders: Sequence[int] | None = None,
        indices: Iterable[int] | None = None,
        gate: tf.Tensor | None = None,
    ) -> Moments:
        """The moments of the variables at ``indices`` (default all), in order, for ``orders``
        (default: the plan's).

        Under ``tf.distribute`` (several replicas in sync) the moments are over the global
        batch, on every replica. `gate`: a scalar bool tensor (only used then): where it is
        False nothing runs, the all-reduce included, and zeros come out.
        """
        orders = self.plan.options.orders if orders is None else check_orders(orders)
        chunk_size = self.plan.options.chunk_size
        indices = list(range(len(self.plan.variables)) if indices is None else indices)
        if self.plan.replica is not None:
            return self._distributed_moments(orders, chunk_size, list(indices), gate)
        out = []
        with tf.name_scope(self._scope):
            asserts = batch_asserts(self.plan.checks, self.plan.n)
        with (
            tf.name_scope(self._scope),
            tf.control_dependencies(asserts),
            static_chunks(self.plan.xla),
        ):
            for i in indices:
                plan, grad = self.plan.variables[i], self.grads[i]
                if all(p in self.fused.get(i, {}) for p in orders):
                    out.append({p: self.fused[i][p] for p in orders})
                    continue
                if i in self.fallback_sums:
                    out.append(self._fallback_moments(i, orders))
                    continue
                out.append(
                    _moments_of(
                        plan,
                        grad,
                        self.out_grads,
                        self.index,
                        self.plan.n,
                        self.plan.mode,
                        orders,
                        chunk_size,
                        inv_scale=self.inv_scale,
                        shift=self.shifts.get(i),
                    )
                )
        return Moments(
            [_shaped(m, self.plan.variables[i]) for m, i in zip(out, indices)], self.plan.n
        )

    def _distributed_moments(
        self,
        orders: Sequence[int],
        chunk_size: int | None,
        indices: list[int],
        gate: tf.Tensor | None,
    ) -> Moments:
        """Per replica, sums over its own examples; then ONE all-reduce (SUM) of every sum and
        of the replica's example count; then the moments over the global batch.

        The per-example gradient is ``N * dL_r/dtheta_j`` for a scalar mean loss whose replica
        share is ``L_r = sum_{j in r} l_j / N`` (``tf.nn.compute_average_loss``, Keras): so each
        replica sums ``(dL_r/dtheta_j) ** p`` and the result is scaled by ``N ** (p - 1)``
        after the reduction, with ``N`` from the same reduction.

        With `gate`, the replica's sums are computed in a ``tf.cond`` (zeros where it is
        False); the all-reduce, a synchronisation point that no ``cond`` branch may hold under
        MirroredStrategy, runs on every step.

        The loss's example-free terms: each replica's ``dR_r/dtheta`` is all-reduced with the
        sums, and their sum ``r`` added to every example's gradient after (`_with_shift`).
        """
        shifted = [i for i in indices if i in self.shifts]
        # (a_j + r)**p needs every power sum of a_j up to p
        top = max(orders)
        need = {i: tuple(range(1, top + 1)) if i in shifted else tuple(orders) for i in indices}
        layout = [(i, p) for i in indices for p in need[i]]

        def local() -> list[tf.Tensor]:
            with tf.name_scope(self._scope):
                asserts = batch_asserts(self.plan.checks, self.plan.n)
            with (
                tf.name_scope(self._scope),
                tf.control_dependencies(asserts),
                static_chunks(self.plan.xla),
            ):
                flat: list[tf.Tensor] = []
                for i in indices:
                    sums = self._local_sums(i, need[i], chunk_size)
                    flat.extend(sums[p] for p in need[i])
                flat.extend(self.shifts[i] for i in shifted)
                return flat + [tf.cast(self.plan.n, tf.float64)]

        if gate is None:
            flat = local()
        else:

            def zeros() -> list[tf.Tensor]:
                flat = [
                    tf.zeros(self.plan.variables[i].variable.shape, self.plan.variables[i].dtype)
                    for i, _ in layout
                ]
                flat.extend(tf.zeros_like(self.shifts[i]) for i in shifted)
                return flat + [tf.zeros([], tf.float64)]

            flat = tf.cond(gate, local, zeros, name="gradmom_local_sums")
        reduced = _all_reduce_sum(self.plan.replica, list(flat))
        total = reduced[-1]
        scalar_mean = self.plan.mode == "mean" and not self.vector
        result: dict[int, dict[int, tf.Tensor]] = {i: {} for i in indices}
        for (i, p), t in zip(layout, reduced[: len(layout)]):
            nt = tf.maximum(tf.cast(total, t.dtype), 1.0)
            result[i][p] = t * nt ** (p - 1) if scalar_mean else t / nt
        for i, r in zip(shifted, reduced[len(layout) : -1]):
            nt = tf.maximum(tf.cast(total, r.dtype), 1.0)
            r = r if self.plan.mode == "mean" else r / nt
            m1 = result[i][1]  # of the gradient, which holds r
            raw = {**result[i], 1: m1 - r}
            result[i] = {**_with_shift(raw, r, [p for p in orders if p > 1]), 1: m1}
        out = [_shaped({p: result[i][p] for p in orders}, self.plan.variables[i]) for i in indices]
        return Moments(out, tf.cast(total, tf.int32))

    def _local_sums(
        self, i: int, orders: Sequence[int], chunk_size: int | None
    ) -> dict[int, tf.Tensor]:
        """``{p: sum over this replica's examples}``: of ``(dL_r/dtheta_j) ** p`` for a scalar
        loss, of ``g_j ** p`` for a vector (order 1: the replica's summed gradient)."""
        plan = self.plan.variables[i]
        dtype = plan.dtype
        shape = plan.variable.shape
        grad = self.grads[i]
        if grad is None:
            return {p: tf.zeros(shape, dtype) for p in orders}
        k = tf.cast(self.plan.n, dtype) if self.vector else 1.0  # L_r: the mean of the vector
        g = unscaled(grad, dtype, self.inv_scale)
        sums = {1: g * k}
        higher = tuple(p for p in orders if p > 1)
        if not higher:
            return sums
        if i in self.fallback_sums:
            sums.update({p: self.fallback_sums[i][p] for p in higher})
        elif plan.sites:
            sums.update(
                _raw_sums(
                    plan,
                    self.out_grads,
                    self.index,
                    self.plan.n,
                    higher,
                    chunk_size,
                    self.inv_scale,
                    k,
                )
            )
        else:
            sums.update({p: tf.zeros(shape, dtype) for p in higher})
        return sums

    def _fallback_moments(self, i: int, orders: Sequence[int]) -> dict[int, tf.Tensor]:
        plan, sums = self.plan.variables[i], self.fallback_sums[i]
        missing = [p for p in orders if p > 1 and p not in sums]
        if missing:
            raise ValueError(
                f"orders {missing} were not prepared for '{plan.name}' (exact fallback): pass "
                "them in prepare(orders=...)"
            )
        nf = tf.cast(self.plan.n, plan.dtype)
        if self.grads[i] is None:
            return {p: tf.zeros(plan.variable.shape, plan.dtype) for p in orders}
        g = unscaled(self.grads[i], plan.dtype, self.inv_scale)
        m1 = g / nf if self.plan.mode == "sum" else tf.identity(g)
        shift = self.shifts.get(i)
        if shift is None:
            return {p: m1 if p == 1 else sums[p] / nf for p in orders}
        if self.plan.mode == "sum":
            shift = shift / nf
        # the jacobian rows are those of the per-example part; R's gradient is added
        raw = {p: s / nf for p, s in sums.items()}
        raw[1] = m1 - shift
        out = _with_shift(raw, shift, [p for p in orders if p > 1])
        if 1 in orders:
            out[1] = m1
        return out


def run_backward(
    plan: Plan,
    *,
    fused: bool = False,
    gate: tf.Tensor | None = None,
    defer: Iterable[int] = (),
    from_work: Iterable[int] = (),
) -> Backward:
    """Takes the gradients of the plan's loss, once, for the variables and the sites' outputs.

    `fused`: the moments will be computed on every step (`gradients_and_moments`). Then a
    variable whose only site can give ``sum_j g_j`` with its per-example work
    (``gradient_from_sums``: convolutions) takes its gradient from there, TF's own filter
    gradient is never built, and its moments are computed here. Leave it False when the moments
    are gated (``tf.cond``).

    `defer`: variable indices (gated moments) whose gradient may come from the same sums: those
    of them that `fused` would take from their sums and whose rule gives TF's own gradient too
    (`Contribution.plain_gradient`: a convolution's filter; under XLA
    ``xla_gradient_from_sums``: a function call) get no gradient here (None in ``grads``,
    listed in ``deferred``); the caller takes it inside its ``tf.cond``, with
    `Backward.from_sums` where it logs (no separate filter gradient) and `Backward.plain_grads`
    (TF's own filter gradient) where it does not.

    The exact fallback's per-example gradients are taken here too, in the step's graph (a
    gradient cannot be taken inside a ``tf.cond`` branch); `gate`, a scalar bool tensor, makes
    them run only on the steps where it is True (see `tb_gradmom.core.fallback`).

    `from_work`: variable indices whose gradient the caller takes from its own per-example
    work (`tb_gradmom.core.norms`: a convolution's per-example filter gradients): no gradient
    here (None in ``grads``, listed in ``deferred``).
    """
    options, plans, n, mode = plan.options, plan.variables, plan.n, plan.mode
    variables = [p.variable for p in plans]
    with tf.name_scope(plan.scope), static_chunks(plan.xla):
        outputs: list[tf.Tensor] = []
        targets: list[tf.Tensor] = []  # what tf.gradients differentiates for each output
        index: dict[Any, int] = {}  # output.ref() -> its position in `outputs`
        for vplan in plans:
            for site, _ in vplan.sites:
                for out in _site_outputs(site):
                    key = out.ref()
                    if key not in index:
                        index[key] = len(outputs)
                        outputs.append(out)
                        targets.append(_target(site, out) if plan.xla else out)
        fused_ids: set[int] = set()
        allowed = set(range(len(plans))) if fused else set(defer)
        if not fused:  # deferred: only where `Backward.plain_grads` has TF's own gradient
            allowed = {
                i
                for i in allowed
                if len(plans[i].sites) == 1
                and (
                    plans[i].sites[0][1].plain_gradient is not None
                    # under XLA a function call's gradient does not compile (`Rule.xla_target`):
                    # `plain_grads` takes it from the rule's order-1 sums
                    or (plan.xla and plans[i].sites[0][1].xla_gradient_from_sums)
                )
            }
        if allowed and any(p > 1 for p in options.orders) and plan.replica is None:
            fused_ids = {
                i
                for i, vplan in enumerate(plans)
                if i in allowed and len(vplan.sites) == 1 and vplan.sites[0][1].gradient_from_sums
            }
        fused_ids |= set(from_work)
        asked = [v for i, v in enumerate(variables) if i not in fused_ids]
        free = [f.value for f in plan.form.free] if plan.free_ids else []
        all_grads = tf.gradients(plan.loss, asked + targets + free)
        rest = iter(all_grads[: len(asked)])
        grads = [None if i in fused_ids else next(rest) for i in range(len(variables))]
        out_grads = all_grads[len(asked) : len(asked) + len(outputs)]
        _warn_disconnected(variables, plan.names, grads, fused_ids)
        inv_scale = None
        if options.loss_scale is not None:
            inv_scale = 1.0 / tf.cast(options.loss_scale, tf.float32)
        shifts = _free_gradients(plan, free, all_grads[len(asked) + len(outputs) :], inv_scale)
        fused_moments: dict[int, dict[int, tf.Tensor]] = {}
        if fused_ids and fused:
            orders = tuple(sorted({1, *options.orders}))
            with tf.name_scope("fused"):
                for i in sorted(fused_ids):
                    vplan = plans[i]
                    fused_moments[i] = _moments_of(
                        vplan,
                        None,
                        out_grads,
                        index,
                        n,
                        mode,
                        orders,
                        options.chunk_size,
                        sums_only=True,
                        inv_scale=inv_scale,
                        shift=shifts.get(i),
                    )
                    grads[i] = _grad_from_sums(vplan, fused_moments[i][1], plan)
        fallback_sums: dict[int, dict[int, tf.Tensor]] = {}
        fallback_ids = plan.fallback_ids
        if fallback_ids:
            with tf.name_scope("fallback"):
                _warn_fallback(plans, fallback_ids)
                fallback_sums = _fallback_power_sums(plan, fallback_ids, gate, inv_scale)
    return Backward(
        plan=plan,
        grads=list(grads),
        out_grads=out_grads,
        index=index,
        fused=fused_moments,
        fallback_sums=fallback_sums,
        inv_scale=inv_scale,
        deferred=[] if fused else sorted(fused_ids),
        shifts=shifts,
    )


def _free_gradients(
    plan: Plan,
    free: Sequence[tf.Tensor],
    coefficients: Sequence[tf.Tensor | None],
    inv_scale: tf.Tensor | None,
) -> dict[int, tf.Tensor]:
    """``{i: dR/dtheta_i}`` (unscaled, in the moments' dtype) for the variables `Plan.free_ids`
    that the loss's example-free terms ``free`` read: ``R = sum_t c_t * free_t`` with
    ``c_t = dL/dfree_t`` (``coefficients``, from the step's backward pass), so ``R`` is the
    free part of the loss exactly as it enters it (signs, loss weights, a loss scale)."""
    pairs = [(t, c) for t, c in zip(free, coefficients) if c is not None]
    if not pairs or not plan.free_ids:
        return {}
    variables = [plan.variables[i].variable for i in plan.free_ids]
    with tf.name_scope("free_terms"):
        rs = tf.gradients([t for t, _ in pairs], variables, grad_ys=[c for _, c in pairs])
    out = {}
    for i, r in zip(plan.free_ids, rs):
        if r is not None:
            out[i] = unscaled(r, plan.variables[i].dtype, inv_scale)
    return out


def _target(site: Site, out: tf.Tensor) -> tf.Tensor:
    """Under XLA, the tensor ``tf.gradients`` differentiates for the site's output ``out``: its
    rule's `Rule.xla_target` (a function call's output: past an identity), else ``out``."""
    rule = site.rule
    if rule is None or rule.xla_target is None:
        return out
    return rule.xla_target(out)


def _grad_from_sums(vplan: VariablePlan, m1: tf.Tensor, plan: Plan) -> tf.Tensor:
    """The variable's gradient, as ``tf.gradients`` gives it, from its first moment ``m1``
    (taken from its rule's sums: unscaled, a mean over the examples)."""
    grad = m1
    if plan.mode == "sum":
        grad = grad * tf.cast(plan.n, vplan.dtype)
    if plan.options.loss_scale is not None:  # as tf.gradients gives it: scaled
        grad = grad * tf.cast(plan.options.loss_scale, vplan.dtype)
    return tf.cast(grad, vplan.variable.dtype)


def _fallback_power_sums(
    plan: Plan, ids: list[int], gate: tf.Tensor | None, inv_scale: tf.Tensor | None
) -> dict[int, dict[int, tf.Tensor]]:
    """``{i: {p: sum_j g_j ** p}}`` (orders above 1) of the variables ``ids`` on the fallback."""
    higher = tuple(p for p in plan.options.orders if p > 1)
    if not higher:
        return {i: {} for i in ids}
    if set(ids) & set(plan.free_ids):  # (a_j + r)**p needs every power sum of a_j up to p
        higher = tuple(range(2, max(higher) + 1))
    if plan.form is None:
        vector = plan.loss_vector
    elif plan.replica is not None:  # sums of (dL_r/dtheta_j)**p, see _distributed_moments
        vector = _loss.per_example_losses(plan.form, plan.n, "sum")
    else:
        vector = _loss.per_example_losses(plan.form, plan.n, plan.mode)
    chunk = plan.options.chunk_size
    sums = _fallback.power_sums(
        vector,
        [plan.variables[i].variable for i in ids],
        [plan.variables[i].dtype for i in ids],
        higher,
        plan.n,
        _fallback.DEFAULT_CHUNK if chunk is None else int(chunk),
        gate,
        inv_scale,
    )
    return dict(zip(ids, sums))


def _moments_of(
    plan: VariablePlan,
    grad: tf.Tensor | None,
    out_grads: Sequence[tf.Tensor | None],
    index: dict[Any, int],
    n: Count,
    mode: str,
    orders: Sequence[int],
    chunk_size: int | None,
    sums_only: bool = False,
    inv_scale: tf.Tensor | None = None,
    shift: tf.Tensor | None = None,
) -> dict[int, tf.Tensor]:
    """{p: M_p}. `sums_only`: every order (1 included) from the rule's power sums, not `grad`.
    `shift`: ``dR/dtheta`` of the loss's example-free terms, added to every example's gradient
    (`_with_shift`); ``grad`` includes it already."""
    shape = plan.variable.shape
    result: dict[int, tf.Tensor] = {}
    if grad is None and not sums_only:
        return {p: tf.zeros(shape, plan.dtype) for p in orders}
    if not plan.sites and shift is None:
        return {p: tf.zeros(shape, plan.dtype) for p in orders}
    # a static batch as a Python number: constants, not a Cast and a Pow per variable and order
    n_static = tf.get_static_value(n)
    nf: float | tf.Tensor = float(n_static) if n_static is not None else tf.cast(n, plan.dtype)
    if inv_scale is not None:
        inv_scale = tf.cast(inv_scale, plan.dtype)
    if shift is not None:
        # each example's share of R: all of it for a mean, R / n for a sum
        shift = shift / _number(nf, plan.dtype) if mode == "sum" else shift
    m1 = None
    if not sums_only:
        g = unscaled(grad, plan.dtype, inv_scale)
        m1 = g / _number(nf, plan.dtype) if mode == "sum" else g
        if 1 in orders:
            result[1] = m1
    higher = tuple(orders) if sums_only else tuple(p for p in orders if p > 1)
    if shift is not None and higher:
        # the expansion of (a_j + r)**p needs every power sum of a_j up to p
        higher = tuple(range(1 if sums_only else 2, max(higher) + 1))
    if not higher:
        return result
    raw: dict[int, tf.Tensor] = {}
    if plan.sites:
        # For a mean loss delta = n * G. Up to order 2, scale the (small) sums by n**p instead
        # of the (large) output gradients: one full-size multiply and its buffer less per
        # layer. For orders 3-4 in float32, (G)**p could underflow where (n G)**p does not:
        # scale delta then.
        scale_sums = mode == "mean" and max(higher) <= 2
        factor = nf if mode == "mean" and not scale_sums else 1.0
        sums = _raw_sums(plan, out_grads, index, n, higher, chunk_size, inv_scale, factor)
        for p in higher:
            raw[p] = (
                times(sums[p], nf ** (p - 1)) if scale_sums else sums[p] / _number(nf, plan.dtype)
            )
    else:  # only the example-free terms read the variable: a_j = 0
        raw = {p: tf.zeros(shape, plan.dtype) for p in higher}
    if shift is None:
        result.update({p: raw[p] for p in orders if p in raw})
        return result
    if m1 is not None:
        raw[1] = m1 - shift
    shifted = _with_shift(raw, shift, [p for p in orders if p > 1 or sums_only])
    result.update(shifted)
    return result


def _with_shift(
    raw: Mapping[int, tf.Tensor], shift: tf.Tensor, orders: Sequence[int]
) -> dict[int, tf.Tensor]:
    """``{p: (1/n) sum_j (a_j + r) ** p}`` from ``raw[k] = (1/n) sum_j a_j ** k`` (``k`` from 1
    to the highest order) and the shift ``r`` shared by every example: the binomial expansion
    ``sum_k C(p, k) r**(p-k) raw[k]`` with ``raw[0] = 1``. The variance does not move."""
    powers = {0: None, 1: shift}
    for k in range(2, max(orders, default=0) + 1):
        powers[k] = powers[k - 1] * shift
    out = {}
    for p in orders:
        total = powers[p]
        for k in range(1, p + 1):
            term = raw[k] if k == p else times(powers[p - k] * raw[k], float(math.comb(p, k)))
            total = total + term
        out[p] = total
    return out


def _number(x: float | tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``x``, a tensor, or a number as a constant shared in the graph."""
    return scalar(x, dtype) if isinstance(x, float) else x


def _all_reduce_sum(replica: tf.distribute.ReplicaContext, tensors: list[tf.Tensor]) -> list:
    """One batched all-reduce (SUM) per dtype among ``tensors`` (one in the usual case)."""
    groups: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    out = [None] * len(tensors)
    for ids in groups.values():
        reduced = replica.all_reduce(tf.distribute.ReduceOp.SUM, [tensors[i] for i in ids])
        for i, t in zip(ids, reduced):
            out[i] = t
    return out


def _site_outputs(site: Site) -> tuple[tf.Tensor, ...]:
    """The outputs whose gradients a site's rule needs (several for a loop)."""
    return site.output if isinstance(site.output, tuple) else (site.output,)


def _raw_sums(
    plan: VariablePlan,
    out_grads: Sequence[tf.Tensor | None],
    index: dict[Any, int],
    n: Count,
    orders: Sequence[int],
    chunk_size: int | None,
    inv_scale: tf.Tensor | None,
    factor: float | tf.Tensor,
) -> dict[int, tf.Tensor]:
    """``{p: sum_j g_j ** p}`` with ``g_j`` from the output gradients times ``factor`` (and
    ``inv_scale``, the loss scale's inverse, folded into the same multiply)."""
    deltas = site_deltas(plan, out_grads, index, inv_scale, factor)
    if len(plan.sites) == 1 and plan.sites[0][1].power_sums is not None:
        chunk = _chunk(plan, chunk_size, fast=True)
        sums = plan.sites[0][1].power_sums(deltas[0], n, tuple(orders), chunk)
        return {p: reshape(sums[p], plan.variable.shape) for p in orders}
    return _power_sums_chunked(plan, deltas, n, tuple(orders), _chunk(plan, chunk_size, n=n))


def site_deltas(
    plan: VariablePlan,
    out_grads: Sequence[tf.Tensor | None],
    index: dict[Any, int],
    inv_scale: tf.Tensor | None,
    factor: float | tf.Tensor,
) -> list[Any]:
    """Per site of ``plan``, the ``delta`` its rule takes: the output gradient in the moments'
    dtype times ``factor`` and ``inv_scale`` (a loop's site: its `LoopGrads`)."""
    if inv_scale is not None:
        factor = tf.cast(inv_scale, plan.dtype) * factor
    deltas: list[Any] = []  # output gradients, or a rule's seed of several (a loop's LoopGrads)
    for site, _ in plan.sites:
        if isinstance(site.output, tuple):  # several outputs (a loop): the rule's seed
            if site.rule is None or site.rule.seed is None:
                raise TypeError(
                    f"the site of {site.op.type} op '{site.op.name}' has several outputs but "
                    "its rule has no seed (Rule.outputs and Rule.seed go together)"
                )
            grads = tuple(out_grads[index[t.ref()]] for t in site.output)
            deltas.append(site.rule.seed(grads, factor))
            continue
        g_out = out_grads[index[site.output.ref()]]
        if g_out is None:
            g_out = tf.zeros_like(site.output)
        g_out = tf.cast(tf.convert_to_tensor(g_out), plan.dtype)
        if not (isinstance(factor, float) and factor == 1.0):
            g_out = g_out * factor
        deltas.append(g_out)
    return deltas


def variance(
    moments_i: Mapping[int, Any], n: int | float | tf.Tensor, unbiased: bool = True
) -> Any:
    """Element-wise variance of the per-example gradients from their first two raw moments.

    Args:
      moments_i: one entry of the ``moments`` list, a dict with orders 1 and 2.
      n: the number of examples the moments average over.
      unbiased: ``True`` for ``s2 = n/(n-1) * (M_2 - M_1**2)`` (the sample variance of the
        per-example gradients); ``False`` for the biased ``M_2 - M_1**2``. The variance of the
        mini-batch gradient itself is ``s2 / n``.

    Returns:
      A tensor (or numpy array) shaped like the variable.
    """
    if 1 not in moments_i or 2 not in moments_i:
        raise ValueError("variance needs moments of orders 1 and 2; pass orders=(1, 2)")
    m1, m2 = moments_i[1], moments_i[2]
    biased = m2 - m1 * m1
    if not unbiased:
        return biased
    if isinstance(n, int | float):
        if n < 2:
            raise ValueError(f"the unbiased variance needs at least 2 examples, got n={n}")
        return biased * (n / (n - 1.0))
    nf = tf.cast(n, biased.dtype)
    return biased * nf / (nf - 1.0)


# What a logged step computes (`compute_logged`'s ``mode``, `summary.moments`' ``mode``).
LOG_MODES = ("moments", "norms", "replicas")


def check_log_mode(mode: Any) -> str:
    """``mode`` checked against `LOG_MODES` (a ValueError saying what each one logs)."""
    if mode not in LOG_MODES:
        raise ValueError(
            f"mode must be one of {', '.join(map(repr, LOG_MODES))}, got {mode!r}: 'moments' "
            "logs the element-wise moments (maps, histograms, every statistic), 'norms' only "
            "the noise statistics from per-example gradient norms (no maps; much cheaper on "
            "convolutions and transformers), 'replicas' the noise statistics from each "
            "tf.distribute replica's gradient (no per-example work)"
        )
    return str(mode)


@dataclass(frozen=True)
class Logged:
    """What one logged call hands to a writer: the moments of the variables it logs, over
    ``n`` examples, with what a writer names them by.

    ``moments[k][p]`` is ``M_p`` of ``variables[k]`` (float32, float64 for float64 variables),
    ``loss`` the batch's mean loss (float64, unscaled; None when unknown), ``names`` the
    variables' paths and ``op_types`` the op each is consumed by (``""`` when unknown).

    With per-example norms (``compute_logged(norms=True)``): ``sq_norms[k]`` the ``[n]``
    squared norms ``||g_j||^2`` of ``variables[k]``, ``losses`` the ``[n]`` per-example losses
    (float64, unscaled) and ``ids`` the ``[n]`` example ids the caller passed (or None).

    ``mode`` is the logging mode (`LOG_MODES`). In ``"norms"`` and ``"replicas"`` modes no
    element-wise second moment exists: ``moments[k]`` holds ``M_1`` only, and ``sums[k]`` the
    float64 scalars ``sum_m2`` (``|M_1|^2``), ``sum_var`` (the unbiased ``tr(Sigma)``
    estimate) and ``sum_m2_raw`` (``|M_1|^2 + (n-1)/n sum_var``; in ``"norms"`` mode
    ``(1/n) sum_j ||g_j||^2``) of ``variables[k]``: the `tb_gradmom.metadata.STATS_FIELDS`
    sums the writers log (docs/math.md, "The noise scale at the cost of a norm").
    """

    variables: list
    names: list[str]
    op_types: list[str]
    moments: list[dict[int, tf.Tensor]]
    n: Any
    loss: Any = None
    sq_norms: list | None = None
    losses: Any = None
    ids: Any = None
    mode: str = "moments"
    sums: list | None = None

    @property
    def orders(self) -> tuple[int, ...]:
        return tuple(sorted(self.moments[0])) if self.moments else ()

    def values(self) -> tuple:
        """The tensors of this record, a nest a ``tf.function`` can return (`with_values`
        rebuilds the record from it outside); ``()`` stands for None."""
        vals = (self.moments, self.n, self.loss, self.sq_norms, self.losses, self.ids, self.sums)
        return tuple(() if v is None else v for v in vals)

    def with_values(self, values: tuple) -> Logged:
        moments, n, loss, sq_norms, losses, ids, sums = (
            None if isinstance(v, tuple) and not v else v for v in values
        )
        return replace(
            self,
            moments=list(moments or []),
            n=n,
            loss=loss,
            sq_norms=None if sq_norms is None else list(sq_norms),
            losses=losses,
            ids=ids,
            sums=None if sums is None else list(sums),
        )


@dataclass(frozen=True)
class Computed:
    """What `compute_logged` returns: the gradients, aligned with the plan's variables, as
    ``tf.gradients`` gives them; ``logged`` when the moments were computed unconditionally
    (None under a gate: they exist only inside its ``tf.cond``); ``written`` what ``write``
    returned (under a gate, the ``cond``'s bool output)."""

    plan: Plan
    grads: list[tf.Tensor | None]
    logged: Logged | None
    written: Any


@tf.autograph.experimental.do_not_convert
def compute_logged(
    plan: Plan,
    indices: Sequence[int] | None = None,
    *,
    gate: tf.Tensor | None = None,
    record: tf.Tensor | None = None,
    exact_gradients: bool = True,
    write: Any = None,
    norms: bool = False,
    ids: tf.Tensor | None = None,
    mode: str = "moments",
) -> Computed:
    """The one entry between the core and the writers: the gradients and, from the same
    backward pass, the `Logged` moments of the variables at ``indices`` (default all) for the
    plan's orders.

    Without ``gate`` the moments are computed on every run (a TF1 graph, an XLA function, the
    Keras callback's dry run); ``write(logged)``, if given, is called on them and its result
    returned in ``written``.

    With ``gate`` (a scalar bool tensor: is this step logged) nothing of the moments runs where
    it is False: they are computed in the true branch of a ``tf.cond`` on ``record`` (default
    ``gate``; False for an empty batch of unknown size), which calls ``write(logged)`` there (a
    list of ops or tensors to run). Under ``tf.distribute`` the per-replica sums run under
    ``gate`` and their all-reduce on every step, outside the ``cond`` (a synchronisation point
    no branch may hold); ``record`` then says where to write (replica 0). A statically False
    ``gate`` builds the gradients alone.

    ``exact_gradients`` False: a logged convolution's gradient is the order-1 sum of the
    per-example work of its moments (computed in the ``cond``, from TensorFlow's own filter
    gradient where nothing is logged; on every run without a gate) instead of TensorFlow's own.

    ``norms``: the record also holds the per-example squared norms of the logged variables
    (`tb_gradmom.core.norms.sq_norms`, from the same backward pass) and the per-example
    losses; ``ids``, a ``[n]`` tensor of example ids, is carried along. Under
    ``tf.distribute`` those of the global batch, gathered from every replica
    (`tb_gradmom.core.norms.gathered_examples`).

    ``mode`` (`LOG_MODES`): ``"moments"`` (default) the element-wise moments of the plan's
    orders; ``"norms"`` the statistics' sums from the per-example squared norms and the batch
    gradient, never ``g_j**2`` element-wise; ``"replicas"`` (under ``tf.distribute``, several
    replicas in sync) McCandlish et al.'s estimator from each replica's gradient and the
    all-reduced one, no per-example work. Both fill `Logged.sums` (see
    `tb_gradmom.core.norms.compute_sums_logged`).
    """
    indices = list(range(len(plan.variables)) if indices is None else indices)
    mode = check_log_mode(mode)
    if mode != "moments":
        from tb_gradmom.core import norms as _norms

        return _norms.compute_sums_logged(
            plan,
            indices,
            gate=gate,
            record=record,
            write=write,
            norms=norms,
            ids=ids,
            mode=mode,
            exact_gradients=exact_gradients,
        )
    orders = plan.options.orders
    extras = _Extras(norms, ids)
    if gate is None:
        backward = run_backward(plan, fused=not exact_gradients)
        extras.prepare(backward, indices, None)
        logged = _logged(backward, orders, indices, backward.moments(orders, indices), extras)
        written = write(logged) if write is not None else None
        return Computed(plan, list(backward.grads), logged, written)
    static = tf.get_static_value(gate)
    if static is not None and not bool(static):
        return Computed(plan, list(run_backward(plan).grads), None, None)
    dynamic = static is None
    backward = run_backward(
        plan,
        gate=gate if dynamic else None,
        # the logged variables whose gradient their rule's sums can give (convolutions) take it
        # from those sums inside the cond below, on both sides, instead of TF's filter gradient
        # outside it plus the sums on logged steps
        defer=() if exact_gradients else indices,
    )
    record = gate if record is None else record
    moms = None
    if plan.replica is not None:
        # the replica's sums gated by their own cond, their all-reduce on every step (zeros
        # when not logged); the write below, on the replicas `record` holds for
        moms = backward.moments(orders, indices, gate=gate if dynamic else None)
    elif tf.get_static_value(plan.n) is None:
        # an empty batch has no moments: nothing is written for it
        record = tf.logical_and(record, tf.cast(plan.n, tf.int64) > 0)
    deferred = backward.deferred  # empty under tf.distribute (see run_backward)
    extras.prepare(backward, indices, gate if dynamic else None)

    def logged_branch():
        grads, source = backward.from_sums(orders) if deferred else ([], backward)
        computed = source.moments(orders, indices) if moms is None else moms
        logged = _logged(source, orders, indices, computed, extras)
        out = write(logged) if write is not None else []
        ops = [t for t in tf.nest.flatten(out) if t is not None]
        if deferred:
            return grads  # the writes run in the branch all the same (stateful ops)
        with tf.control_dependencies(ops):
            return tf.constant(True)

    def skipped_branch():
        return backward.plain_grads() if deferred else tf.constant(False)

    out = tf.cond(record, logged_branch, skipped_branch, name="gradmom_record")
    grads = list(backward.grads)
    for i, g in zip(deferred, out if deferred else []):
        grads[i] = g
    return Computed(plan, grads, None, None if deferred else out)


class _Extras:
    """The per-example part of a record (`compute_logged(norms=True)`): the exact fallback's
    norms are taken in the step's graph (`prepare`, gated), the rest in the record's branch."""

    def __init__(self, norms: bool, ids: tf.Tensor | None) -> None:
        self.norms = norms
        self.ids = ids
        self.fallback: dict[int, tf.Tensor] = {}
        self.gathered: dict[str, Any] | None = None

    def prepare(self, backward: Backward, indices: Sequence[int], gate) -> None:
        if self.norms:
            from tb_gradmom.core import norms as _norms

            if backward.plan.replica is not None:
                # tf.distribute: gathered from every replica, outside the record's cond
                self.gathered = _norms.gathered_examples(backward, indices, gate, self.ids)
                return
            self.fallback = _norms.fallback_sq_norms(backward, indices, gate)

    def of(self, backward: Backward, indices: Sequence[int]) -> dict[str, Any]:
        if not self.norms:
            return {}
        if self.gathered is not None:
            return self.gathered
        from tb_gradmom.core import norms as _norms

        sq, _ = _norms.sq_norms(backward, indices, fallback_norms=self.fallback)
        return {"sq_norms": sq, "losses": _norms.per_example_losses(backward), "ids": self.ids}


def _logged(
    backward: Backward, orders, indices: Sequence[int], computed: Moments, extras: _Extras
) -> Logged:
    plan = backward.plan
    loss = tf.cast(plan.loss, tf.float64)
    if backward.inv_scale is not None:
        loss = loss * tf.cast(backward.inv_scale, tf.float64)
    return Logged(
        variables=[plan.variables[i].variable for i in indices],
        names=[plan.names[i] for i in indices],
        op_types=[plan.op_type(i) for i in indices],
        moments=computed.values,
        n=computed.n,
        loss=loss,
        **extras.of(backward, indices),
    )
