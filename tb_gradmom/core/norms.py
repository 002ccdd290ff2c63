"""Per-example squared gradient norms: ``||g_j||^2`` per variable, for every example ``j``.

The same plan and backward pass as the moments (`tb_gradmom.core.plan.make_plan`,
`tb_gradmom.core.moments.run_backward`), the same per-example gradient ``g_j`` (the unscaled
gradient of example ``j``'s loss, the loss's example-free terms ``R`` included: ``g_j = a_j + c``
with ``c = dR/dtheta`` for a mean and ``dR/dtheta / n`` for a sum, see docs/math.md). Per
variable the cheapest exact form:

- a variable with one site whose rule has a norms form (`Contribution.sq_norms`): Dense on
  ``[n, d]`` rows ``||a_j||^2 ||delta_j||^2``; Dense/EinsumDense on sequences the Gram ("ghost")
  form ``<A_j A_j^T, D_j D_j^T>`` or the materialised ``||A_j^T D_j||^2``, by the sizes; biases
  and broadcast parameters from their per-example sums; embeddings from the (example, id)
  sums; a one-group convolution from its unfolded input ``U_j`` (im2col, ``[Q, K c_in]``):
  the Gram form ``<U_j U_j^T, D_j D_j^T>`` or ``||U_j^T D_j||^2`` by one batched matmul,
  whichever takes fewer FLOPs (`tb_gradmom.core.rules.conv`), its kernel's gradient from the
  same work; grouped and depthwise ones from their per-example filter gradients;
- otherwise (several sites, whose per-example gradients add before the norm; derived
  parameters; recurrent layers; the masked VJP) the per-example gradients the rules materialise,
  summed over the sites, chunk by chunk;
- the exact fallback: rows of the jacobian of the per-example losses.

``||a_j + c||^2 = ||a_j||^2 + 2 <a_j, c> + ||c||^2``: the rules take ``c`` in their own form
(``<a_j delta_j^T, C> = a_j^T C delta_j`` for a Dense), or it is added to the materialised
``a_j``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import tensorflow as tf

from tb_gradmom.core import fallback as _fallback
from tb_gradmom.core import loss as _loss
from tb_gradmom.core import plan as _plan
from tb_gradmom.core.moments import (
    Backward,
    _chunk,
    batch_asserts,
    run_backward,
    site_deltas,
    unscaled,
)
from tb_gradmom.core.plan import Options
from tb_gradmom.core.rules.base import (
    Count,
    constant,
    norms_over_chunks,
    reshape,
    scalar,
    sq_norms_of,
    static_chunks,
)
from tb_gradmom.core.sites import VariablePlan

__all__ = ["per_example_norms", "sq_norms"]


@tf.autograph.experimental.do_not_convert
def per_example_norms(
    loss: tf.Tensor,
    var_list: Sequence[tf.Variable],
    *,
    batch_size: int | tf.Tensor | None = None,
    reduction: str | None = None,
    fallback: str = "exact",
    chunk_size: int | None = None,
    name: str | None = None,
    loss_scale: float | tf.Tensor | tf.Variable | None = None,
    coupled: str = "exact",
) -> tuple[list[tf.Tensor | None], list[tf.Tensor]]:
    """Gradients and the squared norms of the per-example gradients, from one backward pass.

    ``sq_norms[i][j] = ||g_j||^2`` for variable ``var_list[i]``, with ``g_j`` the unscaled
    gradient of example ``j``'s loss, as in `gradients_and_moments` (terms of the loss that
    hold no example, such as a weight penalty ``R``, are part of every example's loss:
    ``g_j = d(l_j + R)/dtheta`` for a mean loss, ``d(l_j + R/n)/dtheta`` for a sum). The sum
    over variables is the whole model's squared per-example norm; ``mean_j ||g_j||^2 -
    ||mean_j g_j||^2`` is the total variance ``tr(Sigma)`` (biased).

    Call it inside a ``tf.function`` (or a ``tf.compat.v1`` graph), after the forward pass:

        @tf.function
        def step(x, y):
            loss = loss_fn(y, model(x, training=True))
            grads, sq_norms = gradmom.per_example_norms(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return tf.add_n(sq_norms)  # [n]: the whole model's ||g_j||^2

    Args:
      loss: as for `gradients_and_moments`: a scalar mean or sum of per-example losses (checked
        in the graph), plus terms that hold no example, or a ``[n]`` vector of them.
      var_list: ``tf.Variable``s or Keras variables.
      batch_size: the number of examples ``n`` (inferred from the graph by default, checked).
      reduction: None (read from the graph), ``"mean"`` or ``"sum"``.
      fallback: ``"exact"`` (default) or ``"error"`` for variables without an exact rule.
      chunk_size: examples per chunk where per-example work is materialised (default: chosen
        per layer to hold at most 4M elements; 32 examples on the fallback).
      name: a name scope for the added ops.
      loss_scale: the factor ``loss`` was multiplied by (mixed precision); ``grads`` stay
        scaled, the norms are those of the unscaled gradients.
      coupled: ``"exact"`` or ``"rules"`` for variables used before an op that couples the
        examples (a training-mode batch normalisation): see `gradients_and_moments`.

    Returns:
      ``(grads, sq_norms)``: ``grads`` as `gradients_and_moments` returns them
      (``tf.gradients(loss, var_list)``, of the mean for a vector loss); ``sq_norms[i]`` a
      ``[n]`` tensor, float32 (float64 for float64 variables); zeros for a variable the loss
      does not depend on.

    Under ``tf.distribute`` (inside ``strategy.run``, several replicas in sync) each replica
    gets the norms of its own examples (``[b_r]``), the same ``g_j`` as on one device over the
    global batch (one all-reduce of the example counts and of the example-free terms' shares);
    ``grads`` are the replica's own, as ``tf.gradients`` gives them.

    Raises:
      RuntimeError: when called eagerly.
      UnsupportedOpError, PerExampleLossError, BatchSizeError: as `gradients_and_moments`.
    """
    options = Options.check(
        (1,), reduction, batch_size, chunk_size, fallback, loss_scale, coupled=coupled
    )
    plan = _plan.make_plan(loss, var_list, options, name=name or "per_example_norms")
    if plan.replica is not None:
        # each replica's own examples; the example-free terms' share from one all-reduce
        backward = run_backward(plan)
        local, _ = _replica_local(backward, list(range(len(plan.variables))), None)
        norms = [tf.cast(t, v.dtype) for t, v in zip(local[: len(plan.variables)], plan.variables)]
        return list(backward.grads), norms
    # a convolution's gradient is the sum of the per-example filter gradients its norms build
    # (TensorFlow's own filter gradient is not built), as in `gradients_and_moments`
    from_work = [
        i
        for i, v in enumerate(plan.variables)
        if len(v.sites) == 1 and v.sites[0][1].sq_norms_and_sum is not None
    ]
    backward = run_backward(plan, from_work=from_work)
    return _with_gradients(backward, sq_norms(backward, from_work=set(from_work)))


def _with_gradients(
    backward: Backward, found: tuple[list[tf.Tensor], dict[int, tf.Tensor]]
) -> tuple[list[tf.Tensor | None], list[tf.Tensor]]:
    """``(grads, norms)``: the backward pass's gradients, with those of the variables whose
    per-example work gave their sum (``found[1]``: ``sum_j`` of the unscaled per-example
    gradients of the per-example part, as the rules see them) as ``tf.gradients`` gives them:
    plus the example-free terms' gradient, times the loss scale."""
    norms, sums = found
    plan = backward.plan
    grads = list(backward.grads)
    for i, total in sums.items():
        vplan = plan.variables[i]
        g = reshape(total, vplan.variable.shape)
        if i in backward.shifts:
            g = g + backward.shifts[i]
        if plan.options.loss_scale is not None:
            g = g * tf.cast(plan.options.loss_scale, g.dtype)
        grads[i] = tf.cast(g, vplan.variable.dtype)
    return grads, norms


def sq_norms(
    backward: Backward,
    indices: Sequence[int] | None = None,
    from_work: Collection[int] = (),
    fallback_norms: dict[int, tf.Tensor] | None = None,
) -> tuple[list[tf.Tensor], dict[int, tf.Tensor]]:
    """``[n]`` per variable (at ``indices``, default all): ``||g_j||^2`` for every example;
    and for the variables ``from_work`` (their rule has `Contribution.sq_norms_and_sum`) the
    sum of their per-example gradients from the same work. ``fallback_norms``: the norms of
    the variables on the exact fallback, already computed (`fallback_sq_norms`, outside a
    ``tf.cond`` branch, where a gradient can be taken)."""
    plan = backward.plan
    indices = list(range(len(plan.variables)) if indices is None else indices)
    n = plan.n
    n_static = tf.get_static_value(n)
    scope = plan.scope.rstrip("/") + "_norms"
    with tf.name_scope(scope):
        asserts = batch_asserts(plan.checks, n)
    out: dict[int, tf.Tensor] = {}
    sums: dict[int, tf.Tensor] = {}
    with tf.name_scope(scope), tf.control_dependencies(asserts), static_chunks(plan.xla):
        if fallback_norms is not None:
            out.update({i: fallback_norms[i] for i in indices if i in fallback_norms})
        fallback_ids = [i for i in indices if i in plan.fallback_ids and i not in out]
        if fallback_ids:
            with tf.name_scope("fallback"):
                out.update(zip(fallback_ids, _fallback_norms(backward, fallback_ids)))
        for i in indices:
            if i in out:
                continue
            out[i], total = _variable_norms(backward, i, i in from_work)
            if total is not None:
                sums[i] = total
    result = []
    for i in indices:
        v = out[i]
        if n_static is not None:
            v.set_shape([int(n_static)])
        result.append(v)
    return result, sums


def _nf(plan: _plan.Plan, dtype: tf.DType) -> float | tf.Tensor:
    n_static = tf.get_static_value(plan.n)
    return float(n_static) if n_static is not None else tf.cast(plan.n, dtype)


def _shift(backward: Backward, i: int, dtype: tf.DType) -> tf.Tensor | None:
    """``dR/dtheta / n``: the example-free terms' share of every example's gradient, in the
    scale of the output gradients as TensorFlow gives them (``G = delta / n`` for a mean; for a
    sum ``delta = G`` and the share is ``R / n`` itself)."""
    r = backward.shifts.get(i)
    if r is None:
        return None
    nf = _nf(backward.plan, dtype)
    return r / (scalar(nf, dtype) if isinstance(nf, float) else nf)


def _variable_norms(
    backward: Backward, i: int, with_sum: bool = False
) -> tuple[tf.Tensor, tf.Tensor | None]:
    """The variable's ``[n]`` norms; with ``with_sum`` (a rule with
    `Contribution.sq_norms_and_sum`) also ``sum_j a_j``, unscaled, else None."""
    plan = backward.plan
    vplan = plan.variables[i]
    dtype = vplan.dtype
    n = plan.n
    shift = _shift(backward, i, dtype)
    connected = backward.grads[i] is not None or i in backward.fused or i in backward.deferred
    if not connected or not vplan.sites:
        total = tf.zeros(vplan.variable.shape, dtype) if with_sum else None
        if shift is None:
            return tf.zeros(tf.reshape(n, [1]), dtype), total
        nf = _nf(plan, dtype)
        c2 = tf.reduce_sum(tf.square(shift)) * (nf * nf if plan.mode == "mean" else 1.0)
        return tf.fill(tf.reshape(n, [1]), c2), total
    # The rules see G (TensorFlow's output gradients, times 1/loss_scale): the per-example
    # gradients of a mean loss are n times theirs, so their squared norms n**2 times.
    deltas = site_deltas(vplan, backward.out_grads, backward.index, backward.inv_scale, 1.0)
    chunk = plan.options.chunk_size
    norms, total = None, None
    if len(vplan.sites) == 1 and vplan.sites[0][1].sq_norms is not None:
        site, contribution = vplan.sites[0]
        view_shift = None
        if shift is not None:
            shape = site.var_shape if site.view.dtype == tf.resource else site.view.shape
            view_shift = reshape(shift, shape)
        if with_sum and contribution.sq_norms_and_sum is not None:
            norms, total = contribution.sq_norms_and_sum(deltas[0], n, view_shift, chunk)
        else:
            norms = contribution.sq_norms(deltas[0], n, view_shift, chunk)
    if norms is None:
        norms = _materialised(vplan, deltas, n, shift, chunk)
    if plan.mode == "mean":
        nf = _nf(plan, dtype)
        norms = norms * (scalar(nf * nf, dtype) if isinstance(nf, float) else nf * nf)
    # (the rules' sum_j over the G-scale per-example gradients is the per-example part's
    # gradient dL/dtheta, for a mean and for a sum alike)
    return norms, total


def _materialised(
    vplan: VariablePlan,
    deltas: Sequence[Any],
    n: Count,
    shift: tf.Tensor | None,
    chunk_size: int | None,
) -> tf.Tensor:
    """``||sum_sites g_j + shift||^2`` from the rules' per-example gradients, chunk by chunk."""
    var_shape = vplan.variable.shape

    def chunk_norms(start: Count, size: Count) -> tf.Tensor:
        g = None
        for (_site, c), delta in zip(vplan.sites, deltas):
            part = reshape(c.per_example(delta, n, start, size), [-1, *var_shape])
            g = part if g is None else g + part
        assert g is not None
        if shift is not None:
            g = g + shift
        return sq_norms_of(g)

    return norms_over_chunks(n, _chunk(vplan, chunk_size, n=n), vplan.dtype, chunk_norms)


def fallback_sq_norms(
    backward: Backward, indices: Sequence[int], gate: tf.Tensor | None = None
) -> dict[int, tf.Tensor]:
    """``{i: [n] norms}`` of the variables at ``indices`` on the exact fallback, computed
    where ``gate`` (a scalar bool tensor) holds (zeros elsewhere): in the step's graph, for
    `sq_norms` in a ``tf.cond`` branch."""
    plan = backward.plan
    ids = [i for i in indices if i in plan.fallback_ids]
    if not ids:
        return {}
    with tf.name_scope(plan.scope.rstrip("/") + "_norms/fallback"), static_chunks(plan.xla):
        return dict(zip(ids, _fallback_norms(backward, ids, gate)))


def per_example_losses(backward: Backward) -> tf.Tensor:
    """The ``[n]`` per-example losses ``l_j`` of the plan's loss (its per-example part: a mean
    or a sum of them is the loss without its example-free terms), unscaled, float64."""
    plan = backward.plan
    if plan.form is None:
        vector = plan.loss_vector
    else:
        vector = _loss.per_example_losses(plan.form, plan.n, plan.mode)
    out = tf.cast(vector, tf.float64)
    if backward.inv_scale is not None:
        out = out * tf.cast(backward.inv_scale, tf.float64)
    return out


def _fallback_norms(
    backward: Backward, ids: list[int], gate: tf.Tensor | None = None
) -> list[tf.Tensor]:
    """The squared norms of the rows of the jacobian of the per-example losses (plus the
    example-free terms' share), for the variables ``ids`` on the exact fallback."""
    plan = backward.plan
    if plan.form is None:
        vector = plan.loss_vector
    else:
        vector = _loss.per_example_losses(plan.form, plan.n, plan.mode)
    dtypes = [plan.variables[i].dtype for i in ids]
    shifts = []
    for i, d in zip(ids, dtypes):
        r = backward.shifts.get(i)
        if r is not None and plan.mode == "sum":
            nf = _nf(plan, d)
            r = r / (scalar(nf, d) if isinstance(nf, float) else nf)
        shifts.append(r)
    chunk = plan.options.chunk_size
    return _fallback.sq_norms(
        vector,
        [plan.variables[i].variable for i in ids],
        dtypes,
        shifts,
        plan.n,
        _fallback.DEFAULT_CHUNK if chunk is None else int(chunk),
        backward.inv_scale,
        gate,
    )


# ------------------------------------------------------- the noise statistics' sums of a step


@tf.autograph.experimental.do_not_convert
def compute_sums_logged(
    plan: _plan.Plan,
    indices: Sequence[int],
    *,
    gate: tf.Tensor | None,
    record: tf.Tensor | None,
    write: Any,
    norms: bool,
    ids: tf.Tensor | None,
    mode: str,
    exact_gradients: bool = True,
) -> Any:
    """`tb_gradmom.core.moments.compute_logged` for ``mode="norms"`` and ``"replicas"``: the
    gradients and a `Logged` record whose `Logged.sums` hold, per variable, the statistics'
    sums ``sum_m2 = |M_1|^2``, ``sum_var`` (unbiased ``tr(Sigma)``) and ``sum_m2_raw``,
    computed without any element-wise second moment (docs/math.md, "The noise scale at the
    cost of a norm"):

    - ``"norms"``: ``sum_m2_raw = (1/n) sum_j ||g_j||^2`` from the per-example squared norms
      (`sq_norms`, each rule's cheapest exact form), ``sum_var = n/(n-1) (sum_m2_raw -
      sum_m2)``: the same numbers as the element-wise ``sum_i M_2,i`` and ``sum_i s2_i``, up to
      rounding. Under ``tf.distribute`` each replica sums its examples' norms and one
      all-reduce adds them to the gradient's.
    - ``"replicas"`` (several replicas in sync): each replica's mean gradient ``m_r`` over its
      ``b_r`` examples and the global one ``m`` over ``N = sum_r b_r`` give
      ``sum_var = (sum_r b_r |m_r|^2 - N |m|^2) / (R - 1)`` over the ``R`` replicas with
      examples (McCandlish et al. 2018, App. A.1, for any split) and ``sum_m2_raw = sum_m2 +
      (N-1)/N sum_var``. No per-example work: one norm per replica and variable.

    Where ``gate`` is False nothing of it runs (under ``tf.distribute`` the all-reduce does,
    on zeros). ``norms`` (log the per-example norms too, ``log_examples``) reuses the norms of
    ``"norms"`` mode; under ``tf.distribute`` they are gathered from every replica
    (`gathered_examples`).

    ``exact_gradients`` False (``"norms"``, one device): a logged convolution's kernel gradient
    is the sum of the per-example filter gradients its norms build (`sq_norms` ``from_work``,
    as `per_example_norms` takes it), where nothing is logged TensorFlow's own filter gradient
    (`Backward.plain_grads`): no step runs both.
    """
    from tb_gradmom.core.moments import Computed

    replica = plan.replica
    if mode == "replicas" and replica is None:
        raise ValueError(
            "mode='replicas' estimates the noise from the gradients of several tf.distribute "
            "replicas (McCandlish et al. 2018, App. A.1): call it inside strategy.run of a "
            "strategy with at least 2 replicas in sync (MirroredStrategy, "
            "MultiWorkerMirroredStrategy). On one device use mode='norms' (exact, from the "
            "per-example gradient norms)."
        )
    static = None if gate is None else tf.get_static_value(gate)
    if static is not None and not bool(static):
        return Computed(plan, list(run_backward(plan).grads), None, None)
    dynamic = gate is not None and static is None
    defer = (
        []
        if exact_gradients or mode != "norms" or replica is not None
        else _deferrable(plan, indices)
    )
    backward = run_backward(plan, gate=gate if dynamic else None, from_work=defer)
    shifts: dict[int, tf.Tensor] = {}
    gathered = None
    if replica is not None and norms:  # the global batch's examples, on every replica
        gathered = gathered_examples(backward, indices, gate if dynamic else None, ids)
    if replica is not None:
        # no shift in the per-example work: the example-free terms' gradient is taken into
        # the sums after the all-reduce, from the global shift (`_reduced_sums`)
        shifts = dict(backward.shifts)
        backward = replace(backward, shifts={})
    per_example = mode == "norms" or (norms and replica is None)
    fallback = (
        fallback_sq_norms(backward, indices, gate if dynamic else None) if per_example else {}
    )
    reduced = None
    if replica is not None:
        reduced = _reduced_sums(
            backward, indices, mode, fallback, gate if dynamic else None, shifts
        )
    elif gate is not None and tf.get_static_value(plan.n) is None:
        # an empty batch has no statistics: nothing is written for it
        record = tf.logical_and(gate if record is None else record, tf.cast(plan.n, tf.int64) > 0)

    def logged():
        """The `Logged` record and the gradients of the variables ``defer``."""
        from_work: list[tf.Tensor] = []
        if reduced is not None:
            m1s, sums, n = reduced
            extra: dict[str, Any] = {} if gathered is None else gathered
        else:
            found = sq_norms(backward, indices, fallback_norms=fallback, from_work=set(defer))
            sq = found[0]
            source = backward
            if defer:  # their gradients from the norms' work, then M_1 from those
                grads, _ = _with_gradients(backward, found)
                from_work = [grads[i] for i in backward.deferred]
                source = replace(backward, grads=grads, deferred=[])
            m1s = [m[1] for m in source.moments((1,), indices).values]
            n = plan.n
            sums = [_sums_from_norms(m1, s, n) for m1, s in zip(m1s, sq)]
            extra = {}
            if norms:
                extra = {"sq_norms": sq, "losses": per_example_losses(backward), "ids": ids}
        loss = tf.cast(plan.loss, tf.float64)
        if backward.inv_scale is not None:
            loss = loss * tf.cast(backward.inv_scale, tf.float64)
        from tb_gradmom.core.moments import Logged

        record_ = Logged(
            variables=[plan.variables[i].variable for i in indices],
            names=[plan.names[i] for i in indices],
            op_types=[plan.op_type(i) for i in indices],
            moments=[{1: m1} for m1 in m1s],
            n=n,
            loss=loss,
            mode=mode,
            sums=sums,
            **extra,
        )
        return record_, from_work

    def with_deferred(values: Sequence[tf.Tensor]) -> list[tf.Tensor | None]:
        grads = list(backward.grads)
        for i, g in zip(backward.deferred, values):
            grads[i] = g
        return grads

    if gate is None:
        record_, from_work = logged()
        written = write(record_) if write is not None else None
        return Computed(plan, with_deferred(from_work), record_, written)

    def logged_branch():
        record_, from_work = logged()
        out = write(record_) if write is not None else []
        ops = [t for t in tf.nest.flatten(out) if t is not None]
        with tf.control_dependencies(ops):
            if defer:
                return [tf.identity(g) for g in from_work]
            return tf.constant(True)

    def skipped_branch():
        # TensorFlow's own filter gradients where nothing is logged
        return backward.plain_grads() if defer else tf.constant(False)

    out = tf.cond(
        gate if record is None else record,
        logged_branch,
        skipped_branch,
        name="gradmom_record",
    )
    if defer:
        return Computed(plan, with_deferred(out), None, None)
    return Computed(plan, list(backward.grads), None, out)


def _deferrable(plan: _plan.Plan, indices: Sequence[int]) -> list[int]:
    """The variables at ``indices`` whose gradient the norms' work can give and TensorFlow's own
    filter gradient can replace where nothing is logged (`Backward.plain_grads`): a variable with
    one site whose contribution has both `Contribution.sq_norms_and_sum` and
    `Contribution.plain_gradient` (a convolution's filter)."""
    out = []
    for i in indices:
        sites = plan.variables[i].sites
        if len(sites) != 1:
            continue
        contribution = sites[0][1]
        if contribution.sq_norms_and_sum is not None and contribution.plain_gradient is not None:
            out.append(i)
    return sorted(out)


def _local_first(backward: Backward, i: int) -> tf.Tensor:
    """`Backward._local_sums`' order 1 without its multiply by 1: the replica's gradient
    (unscaled) for a scalar loss, ``sum_{j in r} g_j`` for a vector."""
    plan = backward.plan
    vplan = plan.variables[i]
    grad = backward.grads[i]
    if grad is None:
        return tf.zeros(vplan.variable.shape, vplan.dtype)
    g = unscaled(grad, vplan.dtype, backward.inv_scale)
    return g * tf.cast(plan.n, vplan.dtype) if backward.vector else g


def sq_norm64(t: tf.Tensor) -> tf.Tensor:
    """``|t|^2``, a float64 scalar. A float64 ``t`` as ``sum t**2``; a float32 one without a
    float64 copy of it (a cast, a square and a sum of 8-byte elements were most of a logged
    norms-mode MLP step's extra time): the Euclidean norm of each row (last axis) in float32,
    one pass with no temporary, then those norms squared and summed in float64. On a
    ``[784, 512]`` gradient: 4e-9 relative (the float32 rounding of ``t`` itself is up to
    6e-8 per element), 0.14 against 0.33 ms for the float64 copy (measured)."""
    if t.dtype == tf.float32 and t.shape.rank is not None and t.shape.rank >= 2:
        rows = tf.math.reduce_euclidean_norm(t, axis=constant(-1))
        return tf.reduce_sum(tf.square(tf.cast(rows, tf.float64)))
    return tf.reduce_sum(tf.square(tf.cast(t, tf.float64)))


def _sums_from_norms(m1: tf.Tensor, sq: tf.Tensor, n: Count) -> dict[str, tf.Tensor]:
    """The three sums of one variable from ``M_1`` and its ``[n]`` squared norms (float64)."""
    nf = tf.cast(n, tf.float64)
    raw = tf.reduce_sum(tf.cast(sq, tf.float64)) / nf
    m2 = sq_norm64(m1)
    return {"sum_m2": m2, "sum_var": _unbiased(raw - m2, nf), "sum_m2_raw": raw}


def _unbiased(biased: tf.Tensor, nf: tf.Tensor) -> tf.Tensor:
    """``n/(n-1) * biased``; NaN for ``n <= 1`` (as the element-wise variance)."""
    return tf.where(
        nf > 1.0, biased * nf / tf.maximum(nf - 1.0, 1.0), tf.constant(float("nan"), tf.float64)
    )


def _reduced_sums(
    backward: Backward,
    indices: Sequence[int],
    mode: str,
    fallback: dict[int, tf.Tensor],
    gate: tf.Tensor | None,
    shifts: dict[int, tf.Tensor],
) -> tuple[list[tf.Tensor], list[dict[str, tf.Tensor]], tf.Tensor]:
    """Under ``tf.distribute``: ``(M_1 per variable, sums per variable, N)`` over the global
    batch, from each replica's local quantities and ONE all-reduce (SUM) of them all.

    Per replica ``r`` with ``b_r`` examples and variable: ``s_r`` its order-1 sum
    (`Backward._local_sums`: the replica's gradient for a scalar loss), ``c_r`` its share of
    the example-free terms' gradient, and the scalar ``q_r``:

    - ``"norms"``: ``sum_{j in r} ||a_j||^2`` of the per-example part ``a_j`` (divided by
      ``N^2`` for a scalar mean loss, whose replica share is ``sum_{j in r} l_j / N``);
    - ``"replicas"``: ``|s_r - c_r|^2 / b_r`` (``b_r |m_r|^2`` up to the same ``N^2``).

    ``shifts``: the replica's ``c_r`` per variable (`Backward.shifts`, which ``backward`` no
    longer holds: its per-example work is of the ``a_j`` alone).

    After the reduction ``M_1`` and ``c = sum_r c_r`` (over ``N`` for a sum) are global and
    ``g_j = a_j + c``: ``sum_j ||g_j||^2 = sum_j ||a_j||^2 + 2 N <M_1, c> - N ||c||^2``.
    """
    plan = backward.plan
    replica = plan.replica
    scalar_mean = plan.mode == "mean" and not backward.vector
    shifted = [i for i in indices if i in shifts]

    def local() -> list[tf.Tensor]:
        nf = tf.cast(plan.n, tf.float64)
        with tf.name_scope(plan.scope.rstrip("/") + "_sums"):
            asserts = batch_asserts(plan.checks, plan.n)
        with tf.control_dependencies(asserts), static_chunks(plan.xla):
            firsts = [_local_first(backward, i) for i in indices]
            if mode == "norms":
                sq, _ = sq_norms(backward, indices, fallback_norms=fallback)
                scale = 1.0 / tf.maximum(nf * nf, 1.0) if scalar_mean else 1.0
                qs = [tf.reduce_sum(tf.cast(s, tf.float64)) * scale for s in sq]
            else:
                qs = []
                for i, s in zip(indices, firsts):
                    if i in shifts:
                        a = tf.cast(s, tf.float64) - tf.cast(shifts[i], tf.float64)
                        q = tf.reduce_sum(tf.square(a))
                    else:
                        q = sq_norm64(s)
                    qs.append(q / tf.maximum(nf, 1.0))
            present = tf.cast(nf > 0, tf.float64)
            return [*firsts, *(shifts[i] for i in shifted), tf.stack([*qs, nf, present])]

    if gate is None:
        flat = local()
    else:

        def zeros() -> list[tf.Tensor]:
            out = [
                tf.zeros(plan.variables[i].variable.shape, plan.variables[i].dtype) for i in indices
            ]
            out += [tf.zeros_like(shifts[i]) for i in shifted]
            return out + [tf.zeros([len(indices) + 2], tf.float64)]

        flat = tf.cond(gate, local, zeros, name="gradmom_local_sums")
    from tb_gradmom.core.moments import _all_reduce_sum

    reduced = _all_reduce_sum(replica, list(flat))
    firsts = reduced[: len(indices)]
    cs = dict(zip(shifted, reduced[len(indices) : len(indices) + len(shifted)]))
    tail = reduced[-1]
    total, replicas = tail[len(indices)], tail[len(indices) + 1]
    nf = tf.maximum(total, 1.0)
    m1s, sums = [], []
    for k, (i, first) in enumerate(zip(indices, firsts)):
        # no float64 copy of the gradient: M_1 in its dtype (n_r, N integers: the division is
        # rounded once, as in float64 then cast), |.|^2 by `sq_norm64`
        m1 = first if scalar_mean else first / tf.cast(nf, first.dtype)
        m1s.append(tf.reshape(m1, plan.variables[i].variable.shape))
        tt = sq_norm64(first)  # one pass: |M_1|^2 and, without shift, |sum_j a_j|^2
        m2 = tt if scalar_mean else tt / (nf * nf)
        q = tail[k] * (nf * nf if scalar_mean else 1.0)
        if mode == "norms":
            total_sq = q
            if i in cs:
                t = tf.cast(first, tf.float64)
                m1_64 = t if scalar_mean else t / nf
                c = tf.cast(cs[i], tf.float64)
                c = tf.reshape(c if plan.mode == "mean" else c / nf, m1_64.shape)
                total_sq = q + 2.0 * nf * tf.reduce_sum(m1_64 * c) - nf * tf.reduce_sum(c * c)
            raw = total_sq / nf
            sums.append({"sum_m2": m2, "sum_var": _unbiased(raw - m2, total), "sum_m2_raw": raw})
        else:
            # |sum_j a_j|^2 over the global batch (N sum_r s_r for a scalar mean)
            if i in cs:
                t = tf.cast(first, tf.float64)
                a = t - tf.cast(tf.reshape(cs[i], tf.shape(t)), tf.float64)
                big_sq = tf.reduce_sum(tf.square(a))
            else:
                big_sq = tt
            if scalar_mean:
                big_sq = big_sq * nf * nf
            with tf.name_scope("replicas"):
                var = tf.where(
                    replicas > 1.0,
                    (q - big_sq / nf) / tf.maximum(replicas - 1.0, 1.0),
                    tf.constant(float("nan"), tf.float64),
                )
            raw = m2 + (total - 1.0) / nf * var
            sums.append({"sum_m2": m2, "sum_var": var, "sum_m2_raw": raw})
    return m1s, sums, tf.cast(total, tf.int32)


def gathered_examples(
    backward: Backward,
    indices: Sequence[int],
    gate: tf.Tensor | None,
    ids: tf.Tensor | None,
) -> dict[str, Any]:
    """Under ``tf.distribute``: the per-example squared norms (of the variables at
    ``indices``), losses and ids of the GLOBAL batch, in replica order, on every replica
    (``{"sq_norms": [[N], ...], "losses": [N], "ids": [N] or None}``).

    One all-reduce of the example-free terms' gradient shares and of the example counts
    (every step), each replica's norms of ``g_j = a_j + c`` with the global ``c`` (under
    ``gate``: zeros where it is False), then one all-gather of the ``[b_r]`` vectors (every
    step: collectives cannot sit in a ``tf.cond`` branch). A scalar mean loss's replica share
    is ``sum_{j in r} l_j / N``: the rules' norms (``n_r^2 ||g_j / N||^2``) are scaled by
    ``(N / n_r)^2`` and its per-example losses by ``N / n_r``.
    """
    plan = backward.plan
    replica = plan.replica
    if ids is not None and ids.dtype == tf.string:
        raise NotImplementedError(
            "string example_ids cannot be gathered across tf.distribute replicas: pass "
            "integer ids (dataset indices) under a strategy"
        )
    flat, _ = _replica_local(backward, indices, gate)
    stacked = tf.stack(flat, 1)  # [b_r, V + 1]
    gathered = replica.all_gather(stacked, axis=0)
    out: dict[str, Any] = {
        "sq_norms": [gathered[:, k] for k in range(len(indices))],
        "losses": gathered[:, len(indices)],
        "ids": None,
    }
    if ids is not None:
        out["ids"] = replica.all_gather(tf.cast(ids, tf.int64), axis=0)
    return out


def _replica_local(
    backward: Backward, indices: Sequence[int], gate: tf.Tensor | None
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """This replica's examples' ``[b_r]`` squared norms ``||g_j||^2`` (float64, one per
    variable at ``indices``), then their ``[b_r]`` losses, and the global ``N``: one all-reduce
    of the example-free terms' shares and of the counts (every step), the rest under ``gate``
    (zeros where it is False). See `gathered_examples`."""
    from tb_gradmom.core.moments import _all_reduce_sum

    plan = backward.plan
    replica = plan.replica
    scalar_mean = plan.mode == "mean" and not backward.vector
    shifted = [i for i in indices if i in backward.shifts]
    local_n = tf.cast(plan.n, tf.float64)
    reduced = _all_reduce_sum(
        replica, [*(backward.shifts[i] for i in shifted), tf.reshape(local_n, [1])]
    )
    total = reduced[-1][0]
    nf = tf.maximum(total, 1.0)
    shifts = {}
    for i, c in zip(shifted, reduced[:-1]):
        # the share every example's gradient holds (c), in the scale `_shift` divides by n_r
        # (a mean: c n_r / N, the G = g_j / N scale; a sum: c is sum_r c_r / N, times n_r)
        shifts[i] = c * tf.cast(local_n / nf, c.dtype)
    local_backward = replace(backward, shifts=shifts)
    fallback = fallback_sq_norms(local_backward, indices, gate)

    def local() -> list[tf.Tensor]:
        sq, _ = sq_norms(local_backward, indices, fallback_norms=fallback)
        scale = (nf / tf.maximum(local_n, 1.0)) if scalar_mean else tf.constant(1.0, tf.float64)
        norms = [tf.cast(s, tf.float64) * scale * scale for s in sq]
        losses = per_example_losses(local_backward) * scale
        return [*norms, losses]

    if gate is None:
        flat = local()
    else:

        def zeros() -> list[tf.Tensor]:
            z = tf.zeros(tf.reshape(tf.cast(plan.n, tf.int32), [1]), tf.float64)
            return [z for _ in indices] + [z]

        flat = tf.cond(gate, local, zeros, name="gradmom_local_examples")
    return list(flat), total
