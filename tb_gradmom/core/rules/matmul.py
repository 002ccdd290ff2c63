"""Dense layers (``MatMul``).

Rows of ``A`` are examples (``Z = A W``, ``A: [n, d_in]``): the per-example gradient is rank one,
``g_j = a_j delta_j^T``, so ``sum_j g_j**p = (A**p)^T (delta**p)``: one extra matmul per order,
no per-example tensor (the factorised form; Dangel et al. 2020, BackPACK, "batch_l2"/"variance").

Rows grouped by example (Keras 3 Dense on ``[n, T, d_in]`` reshapes to ``[n * T, d_in]``; a
time-major or windowed layout folds the examples with other entries): the example axis of the
rows is proven by `tb_gradmom.core.axes`, ``g_j = sum_t a_{j,t} delta_{j,t}^T`` is materialised per
chunk of examples with an einsum, then raised to the power: positions are summed before it.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom.core.axes import Axis
from tb_gradmom.core.rules.base import (
    Contribution,
    Count,
    Rule,
    RuleError,
    Site,
    example_count,
    example_slice,
    examples_first_once,
    ghost_form,
    sequence_sq_norms,
    sq_norms_of,
    times,
)

__all__ = ["MATMUL_RULE", "matmul_rule"]


def _t(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(x)


def matmul_rule(site: Site) -> Contribution:
    """The rule for ``MatMul`` consuming a variable as either operand."""
    op = site.op
    ta = op.get_attr("transpose_a")
    tb = op.get_attr("transpose_b")
    if site.index == 1:
        # Z = A_eff W_eff with A_eff = op(a): rows of A_eff and of Z hold the examples.
        other = op.inputs[0]
        ax = site.example_axis(other, f"the input of {op.type} op '{op.name}'")
        if ax.axis != (1 if ta else 0):
            raise RuleError(f"the examples are on the contracted axis of '{other.name}'")

        def rows() -> tf.Tensor:
            a = site.input(0)
            return _t(a) if ta else a

        def delta_rows(delta: tf.Tensor) -> tf.Tensor:
            return delta

        transpose_out = tb
    elif site.index == 0:
        # Z = W_eff B_eff; Z^T = B_eff^T W_eff^T: columns of B_eff and of Z hold the examples.
        other = op.inputs[1]
        ax = site.example_axis(other, f"the input of {op.type} op '{op.name}'")
        if ax.axis != (0 if tb else 1):
            raise RuleError(f"the examples are on the contracted axis of '{other.name}'")

        def rows() -> tf.Tensor:
            b = site.input(1)
            return b if tb else _t(b)

        def delta_rows(delta: tf.Tensor) -> tf.Tensor:
            return _t(delta)

        transpose_out = not ta
    else:  # pragma: no cover - MatMul has two inputs
        raise RuleError(f"unexpected input index {site.index}")
    row_axis = Axis(0, ax.outer, ax.inner)

    def finish(g: tf.Tensor) -> tf.Tensor:
        # g: [..., d_rows_in, d_rows_out] in the rows form; back to the consumed tensor's layout.
        if transpose_out:
            return tf.linalg.matrix_transpose(g)
        return g

    d_in, d_out = site.view.shape[-2], site.view.shape[-1]
    evidence = f"the examples' {ax} of '{other.name}', the input of {op.type} op '{op.name}'"

    def examples():
        return example_count(other, ax.axis, ax.partners)

    if ax.pure:

        def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
            a = example_slice(rows(), start, size)
            d = example_slice(delta_rows(delta), start, size)
            return finish(tf.einsum("ni,no->nio", a, d))

        def power_sums(
            delta: tf.Tensor, n: Count, orders: tuple[int, ...], chunk: int | None = None
        ) -> dict[int, tf.Tensor]:
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

        def sq_norms(
            delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
        ) -> tf.Tensor:
            # ||a_j delta_j^T + C||^2 = ||a_j||^2 ||delta_j||^2 + 2 a_j^T C delta_j + ||C||^2
            a = rows()
            d = delta_rows(delta)
            out = sq_norms_of(a) * sq_norms_of(d)
            if shift is not None:
                c = finish(shift)  # the rows form (a transpose is its own inverse)
                dots = tf.reduce_sum(tf.matmul(a, c) * d, axis=1)
                out = out + times(dots, 2.0) + tf.reduce_sum(tf.square(c))
            return out

        return Contribution(
            examples=examples(),
            evidence=evidence,
            per_example=per_example,
            per_example_elements=int((d_in or 1) * (d_out or 1)),
            power_sums=power_sums,
            sq_norms=sq_norms,
        )

    # Rows grouped by example: [outer, n, inner] rows -> [n, outer * inner, d].
    def per_example_grouped(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        a3 = example_slice(examples_first_once(rows(), row_axis, n), start, size)
        d3 = example_slice(examples_first_once(delta_rows(delta), row_axis, n), start, size)
        return finish(tf.einsum("nti,nto->nio", a3, d3))

    def sq_norms_grouped(
        delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
    ) -> tf.Tensor | None:
        a3 = examples_first_once(rows(), row_axis, n)
        d3 = examples_first_once(delta_rows(delta), row_axis, n)
        if a3.shape.rank != 3 or a3.shape[-1] is None or d3.shape[-1] is None:
            return None
        ghost = ghost_form(a3.shape[1], int(a3.shape[-1]), int(d3.shape[-1]))
        c = None if shift is None else finish(shift)
        return sequence_sq_norms(a3, d3, n, c, chunk, ghost)

    return Contribution(
        examples=examples(),
        evidence=evidence,
        sq_norms=sq_norms_grouped,
        per_example=per_example_grouped,
        per_example_elements=int((d_in or 1) * (d_out or 1)),
        power_sums=None,
        # the per-example gradients are materialised anyway: their sum is the weight gradient
        gradient_from_sums=True,
    )


MATMUL_RULE = Rule("matmul", ops=("MatMul",), contribution=matmul_rule)
