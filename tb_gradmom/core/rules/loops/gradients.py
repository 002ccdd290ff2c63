"""The per-example math of the loop rule, on the stacks of the loop's copy.

A use ``z_t = a_t D`` of a loop-invariant parameter ``D`` gives example ``j`` the gradient
``g_j(D) = sum_t a_{t,j}^T delta_{t,j}`` (one batched matmul), a bias added to ``z_t`` the
gradient ``g_j = sum_t delta_{t,j}``, a convolution's filter ``sum_t`` of the conv rule's
per-example filter gradient of ``(x_{t,j}, delta_{t,j})``: the steps are summed before any power.
A view of part of the variable (a slice, a split) is scattered back into its shape.

The stacks (`tb_gradmom.core.rules.loops.graphdef.build_copy`) are time-major ``[T, *element]``,
the examples on the tap's or record's ``axis`` of the element; a chunk of examples is sliced
from them here.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_gradmom.core.rules.conv import conv_contribution
from tb_gradmom.core.rules.loops.body import Use

__all__ = ["chunk_of", "slice_examples", "variable_gradients"]


def slice_examples(stack: tf.Tensor, axis: int, start, size) -> tf.Tensor:
    """Examples ``[start, start + size)`` of a ``[T, *element]`` stack whose elements hold the
    examples on ``axis`` (same layout)."""
    if isinstance(start, int) or not isinstance(size, int):
        index = (slice(None),) * (axis + 1) + (slice(start, start + size),)
        return stack[index]
    # a tensor start and a static size: a Slice, whose output keeps the size in its shape
    rank = stack.shape.rank
    begin = tf.stack([0] * (axis + 1) + [start] + [0] * (rank - axis - 2))
    return tf.slice(stack, begin, [-1] * (axis + 1) + [size] + [-1] * (rank - axis - 2))


def chunk_of(stack: tf.Tensor, axis: int, start, size) -> tf.Tensor:
    """Examples ``[start, start + size)`` of a ``[T, *element]`` stack whose elements hold the
    examples on ``axis``, as ``[size, T, *other element axes]``. The stacks stay time-major
    and only a chunk is transposed at a time: no full-batch copy of a stack besides it."""
    rank = stack.shape.rank
    perm = [axis + 1, 0] + [k + 1 for k in range(rank - 1) if k != axis]
    return tf.transpose(slice_examples(stack, axis, start, size), perm)


def variable_gradients(uses, stacks, start, count, shape, size, dtype) -> tf.Tensor:
    """``[count, *shape]``: the per-example gradients of a variable from its ``uses``, for the
    examples ``[start, start + count)`` of the stacks, unscaled."""
    g = None
    for u in uses:
        part = _use_gradients(u, stacks, start, count, dtype)
        if u.positions is None:
            part = tf.reshape(part, [-1, *shape])
        else:
            part = tf.reshape(_scatter(u, part, size), [-1, *shape])
        g = part if g is None else g + part
    return g


def _use_gradients(u: Use, stacks: dict, start, size, dtype) -> tf.Tensor:
    """``[size, *u.shape]``: the per-example gradients of the used view, examples ``[start,
    start + size)``, unscaled. The stacks are time-major (`Loop.stacks`)."""
    d_stack, d_axis = stacks[u.tap.name], u.tap.axis
    if u.kind == "matmul":
        d = tf.cast(chunk_of(d_stack, d_axis, start, size), dtype)  # [size, T, d_out]
        record = u.record
        assert record is not None, "a matmul use records its other operand"
        a = tf.cast(
            chunk_of(stacks[record.name], record.axis, start, size), dtype
        )  # [size, T, d_in]
        # one [d_in, T] x [T, d_out] product per example (a batched matmul, not an einsum:
        # measured 1.5-2x faster for LSTM(128) at T = 50)
        g = tf.matmul(a, d, transpose_a=True)
        return tf.linalg.matrix_transpose(g) if u.transpose_out else g
    if u.kind == "conv":
        return _conv_gradients(u, stacks, start, size, dtype)
    # a bias: the sum over the steps (and the tap's other axes the view does not span), in the
    # time-major layout; then the examples first
    d = tf.cast(slice_examples(d_stack, d_axis, start, size), dtype)  # [T, *tap dims]
    summed = [0] + [1 + j for j in range(len(u.tap.dims)) if j != d_axis and j not in u.keep]
    g = tf.reduce_sum(d, axis=summed)  # the examples' and the kept axes, in order
    at = sum(1 for j in u.keep if j < d_axis)  # where the examples' axis is now
    if at:
        g = tf.transpose(g, [at] + [k for k in range(len(u.keep) + 1) if k != at])
    g = tf.reshape(g, [-1, *u.shape])
    return -g if u.sign < 0 else g


def _conv_gradients(u: Use, stacks: dict, start, size, dtype) -> tf.Tensor:
    """``[size, *u.shape]``: a convolution's per-example filter gradients, the conv rule's
    (`tb_gradmom.core.rules.conv.conv_contribution`) for every (example, step) row of the
    stacks, then summed over the steps per example (before any power)."""
    record, spec = u.record, u.conv
    assert record is not None and spec is not None, "a conv use records its input"
    x = tf.cast(chunk_of(stacks[record.name], record.axis, start, size), dtype)  # [size, T, ..]
    d = tf.cast(chunk_of(stacks[u.tap.name], u.tap.axis, start, size), dtype)
    x_dims = [v for k, v in enumerate(record.dims) if k != record.axis]
    d_dims = [v for k, v in enumerate(u.tap.dims) if k != u.tap.axis]
    x = tf.reshape(x, [-1, *x_dims])  # rows: example-major (example, step)
    d = tf.reshape(d, [-1, *d_dims])
    positions = int(np.prod(d_dims[:-1])) if d_dims else 1
    rows = conv_contribution(
        spec, lambda *_: (x, d), dtype, examples=0, evidence=spec.what, positions=positions
    ).per_example(None, 0, 0, 0)  # [size * T, *filter]
    if isinstance(size, int):
        g = tf.reshape(rows, [size, -1, *u.shape])
    else:
        g = tf.reshape(rows, tf.concat([tf.reshape(size, [1]), [-1], list(u.shape)], 0))
    return tf.reduce_sum(g, axis=1)


def _scatter(u: Use, g: tf.Tensor, size: int) -> tf.Tensor:
    """``[n, size]`` per-example gradients of the variable's flat value from those of the view
    (``[n, *u.shape]``) whose elements sit at ``u.positions``."""
    positions = u.positions
    assert positions is not None, "only a view of part of the value is scattered"
    flat = tf.reshape(g, [tf.shape(g)[0], -1])
    where = np.full(size, positions.size, np.int64)  # the appended zero column
    where[positions.reshape(-1)] = np.arange(positions.size)
    flat = tf.concat([flat, tf.zeros_like(flat[:, :1])], axis=1)
    return tf.gather(flat, where, axis=1)
