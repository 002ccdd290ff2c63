"""Parameters derived element-wise from a variable before they meet the batch.

BatchNormalization in training mode (``tf.nn.batch_normalization``) never multiplies the batch
by ``gamma`` itself: it computes ``inv = rsqrt(var + eps) * gamma`` and ``shift = beta - mean *
inv`` from the batch statistics (tensors with no per-example axis) and only then
``y = x * inv + shift``. Such a *derived parameter* ``d = f(v, r)`` (``f`` one of ``Mul``, ``Add``,
``Sub``; ``r`` free of examples) is a function of ``v`` alone within one step, so example ``j``'s
gradient of ``v`` is the chain rule applied to example ``j``'s gradient of ``d``:

    g_j(v) = unbroadcast(dd/dv * g_j(d))      (dd/dv = r for Mul, 1 for Add, -1 for the Sub's b)

and ``g_j(d)`` comes from the rules of ``d``'s own consumers (summed over them before any power,
as for every variable with several consumers). The batch statistics are held fixed, as they are
in the gradient of ``v`` itself: ``gamma`` and ``beta`` are exact as defined. The layers
*upstream* of the normalisation are coupled through the statistics (``n * dL/dz_j`` is not
``dl_j/dz_j`` there): `tb_gradmom.core.couplings` finds them and they take the exact fallback.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom.core.rules.base import (
    Contribution,
    Count,
    PowerSumsFn,
    RuleError,
    constant,
    reshape,
    times,
)

__all__ = [
    "DERIVED_OPS",
    "local_factor",
    "derived_contribution",
    "region_contribution",
]

DERIVED_OPS = frozenset({"Mul", "AddV2", "Add", "Sub"})


def local_factor(op: tf.Operation, index: int, dtype: tf.DType) -> tf.Tensor | float:
    """``dd/dv`` for ``d = op(...)`` with ``v`` its input ``index``: a tensor, a number or 1."""
    if op.type == "Mul":
        return tf.cast(op.inputs[1 - index], dtype)
    if op.type == "Sub" and index == 1:
        return -1.0
    return 1.0


def derived_contribution(
    view: tf.Tensor, derived: tf.Tensor, factor: tf.Tensor | float, inner: Contribution
) -> Contribution:
    """The contribution to ``view`` of ``inner``, a contribution to ``derived = op(view, r)``."""
    vshape, dshape = view.shape, derived.shape
    if not (vshape.is_fully_defined() and dshape.is_fully_defined()):
        raise RuleError("the shapes of a parameter derived from the variable are not static")
    if vshape.rank > dshape.rank:
        raise RuleError("the derived parameter has a lower rank than the variable")
    aligned = [1] * (dshape.rank - vshape.rank) + list(vshape)
    if any(a not in (1, d) for a, d in zip(aligned, dshape)):
        raise RuleError("the variable does not broadcast to the derived parameter")
    # Axes of `derived` (shifted by the example axis) that the variable was broadcast over.
    sum_axes = [i + 1 for i, (a, d) in enumerate(zip(aligned, dshape)) if a == 1 and d != 1]
    dshape, vshape = list(dshape), list(vshape)

    def scale(g: tf.Tensor, p: int = 1) -> tf.Tensor:
        """``g * factor ** p`` (nothing for a factor of 1)."""
        if isinstance(factor, float):
            return times(g, factor**p)
        return g * (factor if p == 1 else factor * factor if p == 2 else factor**p)

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        g = reshape(inner.per_example(delta, n, start, size), [-1, *dshape])
        g = scale(g)
        if sum_axes:
            g = tf.reduce_sum(g, axis=constant(sum_axes))
        return reshape(g, [-1, *vshape])

    power_sums: PowerSumsFn | None = None
    inner_sums = inner.power_sums
    if not sum_axes and inner_sums is not None:

        def scaled_sums(
            delta: tf.Tensor, n: Count, orders: tuple[int, ...], chunk: int | None = None
        ) -> dict[int, tf.Tensor]:
            sums = inner_sums(delta, n, orders, chunk)
            out = {}
            for p, s in sums.items():
                out[p] = reshape(scale(reshape(s, dshape), p), vshape)
            return out

        power_sums = scaled_sums

    return Contribution(
        examples=inner.examples,
        evidence=inner.evidence,
        per_example=per_example,
        per_example_elements=inner.per_example_elements
        + int(tf.TensorShape(dshape).num_elements()),
        power_sums=power_sums,
        power_sums_elements=inner.power_sums_elements,
    )


def region_contribution(
    view: tf.Tensor,
    outs: list,
    others: list,
    target: tf.Tensor,
    region_stop: list,
    dtype: tf.DType,
    inner: Contribution,
) -> Contribution:
    """The contribution to ``view`` of ``inner``, a contribution to ``target``, a tensor computed
    from ``outs = f(view, others)`` by ops whose outputs hold no examples (a *derived region*:
    DeBERTa's relative position table through a LayerNorm and the attention projections; a
    weight-normalised kernel). Example ``j``'s gradient is pulled back through the whole region
    in one vector-Jacobian product, ``g_j(view) = J_f^T J_region^T g_j(target)``, vectorised over
    a chunk of examples; ``region_stop`` (every input of the region's ops that the region does
    not compute) and ``others`` are held fixed, so only the paths through ``f`` count (the
    variable's other consumers are sites of their own)."""
    from tb_gradmom._compat import tf_private

    if view.shape.rank is None or target.shape.rank is None:
        raise RuleError("the ranks of a parameter derived from the variable are not static")
    if (why := tf_private.unavailable("pfor")) is not None:  # pragma: no cover
        raise RuleError(why)

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        g = inner.per_example(delta, n, start, size)
        g = reshape(g, tf.concat([[-1], tf.shape(target)], 0))
        g = tf.cast(g, target.dtype)

        def loop_fn(i):
            if any(target is o for o in outs):
                d_outs = [tf.gather(g, i) if o is target else tf.zeros_like(o) for o in outs]
            else:
                d_outs = tf.gradients(
                    target,
                    outs,
                    grad_ys=tf.gather(g, i),
                    stop_gradients=region_stop,
                    unconnected_gradients="zero",
                )
            (gv,) = tf.gradients(
                outs,
                view,
                grad_ys=[tf.cast(tf.convert_to_tensor(d), o.dtype) for d, o in zip(d_outs, outs)],
                stop_gradients=others,
                unconnected_gradients="zero",
            )
            return tf.cast(tf.convert_to_tensor(gv), dtype)

        rows = tf_private.pfor(loop_fn, tf.shape(g)[0], fallback_to_while_loop=True)
        return reshape(rows, tf.concat([[-1], tf.shape(view)], 0))

    return Contribution(
        examples=inner.examples,
        evidence=inner.evidence,
        per_example=per_example,
        per_example_elements=inner.per_example_elements
        + _elements(target.shape)
        + sum(_elements(o.shape) for o in outs)
        + _elements(view.shape),
    )


def _elements(shape: tf.TensorShape, unknown: int = 1024) -> int:
    """Elements of ``shape``, counting an unknown dim (the batch) as ``unknown``."""
    out = 1
    for d in shape:
        out *= d if d is not None else unknown
    return int(out)
