"""Projections with extra axes: ``BatchMatMulV2`` with a broadcast weight, and ``Einsum``.

Keras 3 ``EinsumDense`` (the query/key/value/output projections of ``MultiHeadAttention``)
appears as ``Reshape -> BatchMatMulV2`` of ``x: [n, ..., d_in]`` with ``W: [d_in, d_out]``; its
per-example gradient sums over every non-example position: ``g_j = sum_t x_{j,t}^T
delta_{j,t}``. A plain ``Einsum`` ``"X,W->Z"`` whose output carries the examples on a letter
``b`` absent from ``W`` has per-example gradient ``einsum("X,Z->bW", x, delta)``: the positions
are summed inside the einsum, per example, before the power. Both are materialised for a chunk
of examples. The examples' axis (possibly folded with windows, as in Swin's window attention,
or with positions) is proven by `tb_gradmom.core.axes`; the folded entries are summed per example.
"""

from __future__ import annotations

import string

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
    reshape,
    sequence_sq_norms,
)

__all__ = ["BATCH_MATMUL_RULE", "EINSUM_RULE", "batch_matmul_rule", "einsum_rule"]


def batch_matmul_rule(site: Site) -> Contribution:
    """``BatchMatMulV2(x, W)`` with a rank-2 (broadcast) variable ``W`` as the second operand."""
    op = site.op
    if site.index != 1:
        raise RuleError(
            "the variable is the left operand; only a broadcast right operand is supported"
        )
    wshape = site.view.shape
    if wshape.rank != 2 or not wshape.is_fully_defined():
        raise RuleError("the variable must be a static matrix broadcast over the batch")
    x_t, out = op.inputs[0], op.outputs[0]
    if x_t.shape.rank is None or x_t.shape.rank < 3:
        raise RuleError("the other operand has no batch axis beyond the matrix axes")
    site.example_axis(x_t, f"the input of {op.type} op '{op.name}'")
    ax = site.example_axis(out, f"the output of {op.type} op '{op.name}'")
    if ax.axis == out.shape.rank - 1:
        raise RuleError("the examples are on the output's columns")
    adj_x, adj_y = op.get_attr("adj_x"), op.get_attr("adj_y")
    d_in, d_out = (wshape[1], wshape[0]) if adj_y else (wshape[0], wshape[1])

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        x = site.input(0)
        if adj_x:
            x = tf.linalg.matrix_transpose(x)
        x3 = reshape(example_slice(examples_first_once(x, ax, n), start, size), [size, -1, d_in])
        d3 = reshape(
            example_slice(examples_first_once(delta, ax, n), start, size), [size, -1, d_out]
        )
        g = tf.einsum("nti,nto->nio", x3, d3)
        return tf.linalg.matrix_transpose(g) if adj_y else g

    def sq_norms(
        delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
    ) -> tf.Tensor | None:
        x = site.input(0)
        if adj_x:
            x = tf.linalg.matrix_transpose(x)
        x_all = examples_first_once(x, ax, n)
        d_all = examples_first_once(delta, ax, n)
        if not (x_all.shape[1:].is_fully_defined() and d_all.shape[1:].is_fully_defined()):
            return None
        positions = x_all.shape[1:].num_elements() // int(d_in)
        x3 = reshape(x_all, [-1, positions, int(d_in)])
        d3 = reshape(d_all, [-1, positions, int(d_out)])
        c = None
        if shift is not None:
            c = tf.linalg.matrix_transpose(shift) if adj_y else shift
        ghost = ghost_form(positions, int(d_in), int(d_out))
        return sequence_sq_norms(x3, d3, n, c, chunk, ghost)

    return Contribution(
        examples=example_count(out, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the output of {op.type} op '{op.name}'",
        per_example=per_example,
        sq_norms=sq_norms,
        per_example_elements=int(d_in * d_out),
        gradient_from_sums=True,  # materialised anyway: their sum is the weight gradient
    )


def _parse(equation: str) -> tuple[str, str, str]:
    eq = equation.replace(" ", "")
    if "..." in eq or "->" not in eq:
        raise RuleError(f"equation {equation!r} has an ellipsis or no output")
    inputs, out = eq.split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        raise RuleError(f"equation {equation!r} does not have two operands")
    return parts[0], parts[1], out


def einsum_rule(site: Site) -> Contribution:
    """A two-operand ``Einsum`` whose output carries the examples of the other operand."""
    op = site.op
    equation = op.get_attr("equation")
    equation = equation.decode() if isinstance(equation, bytes) else equation
    subs = _parse(equation)
    var_subs, other_subs, out_subs = subs[site.index], subs[1 - site.index], subs[2]
    out = op.outputs[0]
    ax = site.example_axis(out, f"the output of {op.type} op '{op.name}'")
    batch = out_subs[ax.axis]
    if batch in var_subs or batch not in other_subs:
        raise RuleError(
            f"equation {equation!r}: the examples' letter {batch!r} of the output must come "
            "from the other operand only"
        )
    missing = [c for c in var_subs if c not in other_subs and c not in out_subs]
    if missing:
        raise RuleError(f"equation {equation!r}: the variable's axes {missing} are summed away")
    if not site.view.shape.is_fully_defined():
        raise RuleError("the variable's consumed shape is not static")
    other_t = op.inputs[1 - site.index]
    other_ax = Axis(other_subs.index(batch), ax.outer, ax.inner)
    if site.axes.of(other_t) != other_ax:
        raise RuleError(
            f"equation {equation!r}: the examples of the other operand are not on its "
            f"letter {batch!r}"
        )
    free = [c for c in string.ascii_letters if c not in var_subs + other_subs + out_subs]
    z, q = free[0], free[1]
    other_rest = other_subs.replace(batch, "")
    out_rest = out_subs.replace(batch, "")
    grad_eq = f"{z}{q}{other_rest},{z}{q}{out_rest}->{z}{var_subs}"

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        other = example_slice(
            examples_first_once(site.input(1 - site.index), other_ax, n), start, size
        )
        d = example_slice(examples_first_once(delta, ax, n), start, size)
        return tf.einsum(grad_eq, other, d)

    return Contribution(
        examples=example_count(out, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the output of {op.type} op '{op.name}'",
        per_example=per_example,
        per_example_elements=int(site.view.shape.num_elements()),
        gradient_from_sums=True,
    )


BATCH_MATMUL_RULE = Rule(
    "batch_matmul", ops=("BatchMatMulV2", "BatchMatMulV3"), contribution=batch_matmul_rule
)
EINSUM_RULE = Rule("einsum", ops=("Einsum",), contribution=einsum_rule)
