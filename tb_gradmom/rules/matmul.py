"""Dense layers (``MatMul``).

Rows of ``A`` are examples (``Z = A W``, ``A: [n, d_in]``): the per-example gradient is rank one,
``g_j = a_j delta_j^T``, so ``sum_j g_j**p = (A**p)^T (delta**p)``: one extra matmul per order,
no per-example tensor (the factorised form; Dangel et al. 2020, BackPACK, "batch_l2"/"variance").

Rows grouped by example (Keras 3 Dense on ``[n, T, d_in]`` reshapes to ``[n * T, d_in]``):
``g_j = sum_t a_{j,t} delta_{j,t}^T`` is materialised per chunk of examples with an einsum,
then raised to the power: positions are summed before the power.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom._graph import grouped_source
from tb_gradmom.rules.base import Contribution, RuleError, Site

__all__ = ["matmul_rule"]


def _t(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(x)


def matmul_rule(site: Site) -> Contribution:
    """The rule for ``MatMul`` consuming a variable as either operand."""
    op = site.op
    ta = op.get_attr("transpose_a")
    tb = op.get_attr("transpose_b")
    if site.index == 1:
        # Z = A_eff W_eff with A_eff = op(a): rows of A_eff and of Z are examples.
        def rows() -> tf.Tensor:
            a = site.input(0)
            return _t(a) if ta else a

        def delta_rows(delta: tf.Tensor) -> tf.Tensor:
            return delta

        transpose_out = tb
        group_src = (
            None if ta else grouped_source(op.inputs[0], d_in=site.view.shape[-1 if tb else 0])
        )
    elif site.index == 0:
        # Z = W_eff B_eff; Z^T = B_eff^T W_eff^T: columns of B_eff and of Z are examples.
        def rows() -> tf.Tensor:
            b = site.input(1)
            return b if tb else _t(b)

        def delta_rows(delta: tf.Tensor) -> tf.Tensor:
            return _t(delta)

        transpose_out = not ta
        group_src = None
    else:  # pragma: no cover - MatMul has two inputs
        raise RuleError(f"unexpected input index {site.index}")

    def finish(g: tf.Tensor) -> tf.Tensor:
        # g: [..., d_rows_in, d_rows_out] in the rows form; back to the consumed tensor's layout.
        if transpose_out:
            return tf.linalg.matrix_transpose(g)
        return g

    if group_src is None:

        def examples() -> tf.Tensor:
            return tf.shape(rows())[0]

        def per_example(delta, n, start, size):
            a = rows()[start : start + size]
            d = delta_rows(delta)[start : start + size]
            return finish(tf.einsum("ni,no->nio", a, d))

        def power_sums(delta, n, orders, chunk=None):
            a = rows()
            d = delta_rows(delta)
            out = {}
            a_pow = {1: a}
            d_pow = {1: d}
            for p in sorted(orders):
                if p not in a_pow:
                    a_pow[p] = a_pow[p - 1] * a
                    d_pow[p] = d_pow[p - 1] * d
                out[p] = finish(tf.matmul(a_pow[p], d_pow[p], transpose_a=True))
            return out

        d_in, d_out = site.view.shape[-2], site.view.shape[-1]
        return Contribution(
            examples=examples(),
            evidence=f"rows of the input of {op.type} op '{op.name}'",
            per_example=per_example,
            per_example_elements=int((d_in or 1) * (d_out or 1)),
            power_sums=power_sums,
        )

    # Grouped rows: A = reshape(src, [n * T, d_in]).
    def per_example_grouped(delta, n, start, size):
        a = rows()
        d = delta_rows(delta)
        a3 = tf.reshape(a, [n, -1, tf.shape(a)[-1]])[start : start + size]
        d3 = tf.reshape(d, [n, -1, tf.shape(d)[-1]])[start : start + size]
        return finish(tf.einsum("nti,nto->nio", a3, d3))

    d_in, d_out = site.view.shape[-2], site.view.shape[-1]
    return Contribution(
        examples=tf.shape(group_src)[0],
        evidence=f"the leading axis of '{group_src.name}', reshaped into {op.type} op '{op.name}'",
        per_example=per_example_grouped,
        per_example_elements=int((d_in or 1) * (d_out or 1)),
        power_sums=None,
    )
