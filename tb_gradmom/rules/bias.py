"""Biases and element-wise scales: ``BiasAdd``, ``AddV2``/``Add``, ``Sub`` and ``Mul``.

For ``z = x + b`` with ``b`` broadcast over the non-batch axes ``S`` (positions, pixels, the
sequence), the per-example gradient sums over them: ``g_j = sum_S delta_j``. For ``z = x * w``
it is ``g_j = sum_S x_j * delta_j`` (the scale of LayerNormalization); for ``z = x - b`` it is
``-sum_S delta_j``. The sum over ``S`` is taken per example *before* the power.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom._graph import grouped_source
from tb_gradmom.rules.base import Contribution, RuleError, Site, power_sum

__all__ = ["bias_rule"]


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
    other_index = 1 - site.index
    group_src = None
    if out.shape.rank == 2:
        group_src = grouped_source(op.inputs[other_index], after_matmul=True)

    # Align the parameter's shape to the output's, right to left (numpy broadcasting).
    rank = 3 if group_src is not None else out.shape.rank
    if rank == 0:
        raise RuleError("the op's output is a scalar, with no batch axis")
    if vshape.rank > rank:
        raise RuleError(f"the parameter has rank {vshape.rank}, above the output's rank {rank}")
    aligned = [1] * (rank - vshape.rank) + list(vshape)
    if aligned[0] != 1:
        raise RuleError(
            "the parameter is not broadcast over the batch axis (its first axis has size "
            f"{aligned[0]}), so its gradient has no per-example split at this op"
        )
    sum_axes = [i for i in range(1, rank) if aligned[i] == 1]

    def contributions(delta, n):
        c = delta
        if op.type == "Mul":
            other = tf.cast(op.inputs[other_index], site.dtype)
            c = c * other
        elif op.type == "Sub" and site.index == 1:
            c = -c
        if group_src is not None:
            c = tf.reshape(c, [n, -1, tf.shape(c)[-1]])
        return c

    def reduce(c):
        g = tf.reduce_sum(c, axis=sum_axes) if sum_axes else c
        return tf.reshape(g, [-1, *vshape])

    def per_example(delta, n, start, size):
        return reduce(contributions(delta, n)[start : start + size])

    def power_sums(delta, n, orders, chunk=None):
        g_pow = {1: reduce(contributions(delta, n))}
        return {p: power_sum(g_pow, p) for p in sorted(orders)}

    if group_src is not None:
        examples = tf.shape(group_src)[0]
        evidence = (
            f"the leading axis of '{group_src.name}', reshaped before {op.type} op '{op.name}'"
        )
    else:
        examples = tf.shape(out)[0]
        evidence = f"the first axis of the output of {op.type} op '{op.name}'"
    per_ex = 1
    for s in out.shape[1:]:
        per_ex *= s if s is not None else 1024
    return Contribution(
        examples=examples,
        evidence=evidence,
        per_example=per_example,
        per_example_elements=int(per_ex),
        power_sums=power_sums,
    )
