"""Biases and element-wise scales: ``BiasAdd``, ``AddV2``/``Add``, ``Sub`` and ``Mul``.

For ``z = x + b`` with ``b`` broadcast over the non-example axes ``S`` (positions, pixels, the
sequence, and the entries folded with the examples on their axis), the per-example gradient sums
over them: ``g_j = sum_S delta_j``. For ``z = x * w`` it is ``g_j = sum_S x_j * delta_j`` (the
scale of LayerNormalization); for ``z = x - b`` it is ``-sum_S delta_j``. The sum over ``S`` is
taken per example *before* the power. The examples' axis of ``z`` is proven by
`tb_gradmom.core.axes`; the parameter must be broadcast over it.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom.core.rules.base import (
    Contribution,
    Count,
    Rule,
    RuleError,
    Site,
    constant,
    example_count,
    example_slice,
    examples_first,
    per_example_masked,
    power_sums_of,
    reshape,
    sq_norms_of,
)

__all__ = ["BIAS_RULE", "bias_rule"]


def bias_rule(site: Site) -> Contribution:
    """The rule for a variable broadcast into an element-wise add, subtract or multiply."""
    op = site.op
    if op.type == "BiasAdd":
        fmt = op.get_attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if fmt != "NHWC":
            raise RuleError(f"BiasAdd with data_format {fmt} is not supported (only NHWC)")
        if site.index != 1:
            raise RuleError("the variable is the value of BiasAdd, not its bias")
    out = op.outputs[0]
    vshape = site.view.shape
    if not vshape.is_fully_defined():
        raise RuleError("the variable's consumed shape is not static")
    if out.shape.rank is None:
        raise RuleError("the op's output rank is not static")
    rank = out.shape.rank
    if rank == 0:
        raise RuleError("the op's output is a scalar, with no examples' axis")
    ax = site.example_axis(out, f"the output of {op.type} op '{op.name}'")
    if vshape.rank > rank:
        raise RuleError(f"the parameter has rank {vshape.rank}, above the output's rank {rank}")
    aligned = [1] * (rank - vshape.rank) + list(vshape)
    other_index = 1 - site.index
    if aligned[ax.axis] != 1:
        if aligned[ax.axis] != out.shape[ax.axis]:
            raise RuleError(
                "the parameter is not broadcast over the examples' axis (its size there is "
                f"{aligned[ax.axis]}), so its gradient has no per-example split at this op"
            )
        return _tiled(site, op, out, ax, aligned, other_index)
    # After examples_first: [n, partners, *out dims without the examples' axis].
    rest = [i for i in range(rank) if i != ax.axis]
    sum_axes = [1] + [2 + r for r, i in enumerate(rest) if aligned[i] == 1]

    def contributions(delta):
        c = delta
        if op.type == "Mul":
            c = c * tf.cast(op.inputs[other_index], site.dtype)
        elif op.type == "Sub" and site.index == 1:
            c = -c
        return c

    plain = ax.pure and ax.axis == 0  # no rearranging: sum the broadcast axes in place
    plain_axes = [i for i in rest if aligned[i] == 1]

    def rows(c, n):
        return c if plain else examples_first(c, ax, n)

    def total(c):
        axes = plain_axes if plain else sum_axes
        g = tf.reduce_sum(c, axis=constant(axes)) if axes else c
        return reshape(g, [-1, *vshape])

    def reduce(c, n):
        return total(rows(c, n))

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        return total(example_slice(rows(contributions(delta), n), start, size))

    def power_sums(
        delta: tf.Tensor, n: Count, orders: tuple[int, ...], chunk: int | None = None
    ) -> dict[int, tf.Tensor]:
        return power_sums_of(reduce(contributions(delta), n), sorted(orders))

    def sq_norms(
        delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
    ) -> tf.Tensor:
        # the per-example sums over the broadcast axes are the per-example gradients
        g = reduce(contributions(delta), n)
        return sq_norms_of(g if shift is None else g + shift)

    per_ex = ax.partners
    for i in rest:
        s = out.shape[i]
        per_ex *= s if s is not None else 1024
    return Contribution(
        examples=example_count(out, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the output of {op.type} op '{op.name}'",
        per_example=per_example,
        per_example_elements=int(per_ex),
        power_sums=power_sums,
        sq_norms=sq_norms,
        # Where the per-example sums reduce positions (sequences, pixels), they are taken
        # anyway and their sum is the parameter's gradient: TF's BiasAddGrad (or the Sum of its
        # Add/Mul gradient) is then not built. On plain rows ([n, d]) the per-example
        # gradients are the rows themselves: TF's own reduction is kept (the same work, and
        # the MLP of bench_core.py measured 6% slower with the fused form, load 7).
        gradient_from_sums=not (plain and not plain_axes),
    )


def _tiled(site: Site, op, out, ax, aligned, other_index) -> Contribution:
    """A parameter tiled to the batch (``[n, ...]``, a copy per example): example ``j``'s
    gradient is its own copy's, the others zero (`per_example_masked`)."""
    vshape = site.view.shape
    keep = [i for i, a in enumerate(aligned) if a == 1 and out.shape[i] != 1]

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        c = delta
        if op.type == "Mul":
            c = c * tf.cast(op.inputs[other_index], site.dtype)
        elif op.type == "Sub" and site.index == 1:
            c = -c
        if keep:
            c = tf.reduce_sum(c, axis=keep, keepdims=True)
        c = reshape(c, aligned)
        return reshape(per_example_masked(c, ax, n, start, size), [-1, *vshape])

    return Contribution(
        examples=example_count(out, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the output of {op.type} op '{op.name}'",
        per_example=per_example,
        per_example_elements=int(vshape.num_elements()),
    )


BIAS_RULE = Rule(
    "bias",
    ops=("BiasAdd", "AddV2", "Add", "Sub", "Mul"),
    contribution=bias_rule,
    broadcasts=True,
)
