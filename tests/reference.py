"""Brute-force reference: one gradient per example, then numpy moments.

Shares no code with the rules: each example's loss is computed on its own slice of the batch
and differentiated with a `tf.GradientTape`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def example_gradient(forward, variables, per_example_loss, x, y, j: int, in_batch: bool):
    """``d l_j / d theta`` for each variable, as numpy arrays (zeros where there is no gradient).

    ``in_batch=False``: ``l_j`` is computed on example ``j``'s own slice of the batch.
    ``in_batch=True``: ``l_j`` is taken from the forward pass of the whole batch (the row ``j``
    of the jacobian of the per-example losses).
    """
    if in_batch:
        xj, yj, row = x, y, j
    else:
        xj, yj, row = x[j : j + 1], None if y is None else y[j : j + 1], 0
    xj = tf.constant(xj)
    yj = None if yj is None else tf.constant(yj)
    with tf.GradientTape() as tape:
        lj = per_example_loss(forward(xj), yj)[row]
    grads = tape.gradient(lj, variables)
    return [
        np.zeros(v.shape, v.dtype.as_numpy_dtype)
        if g is None
        else np.asarray(tf.convert_to_tensor(g))
        for g, v in zip(grads, variables)
    ]


def example_gradient_fn(forward, variables, per_example_loss, x, y, in_batch: bool):
    """`example_gradient` as ``fn(j)``, traced once in a `tf.function` for every ``j``.

    For big models checked one example at a time (`tests/zoo_worker.streamed_moments`): Keras
    layers that compile their own `tf.function` per eager call (the grouped convolution) are
    traced once here instead of on every example.
    """
    xt = tf.constant(x)
    yt = None if y is None else tf.constant(y)

    @tf.function
    def grads(j):
        if in_batch:
            xj, yj, row = xt, yt, j
        else:
            xj = tf.gather(xt, [j])
            yj = None if yt is None else tf.gather(yt, [j])
            row = 0
        with tf.GradientTape() as tape:
            lj = tf.gather(per_example_loss(forward(xj), yj), row)
        # IndexedSlices (a gather's gradient) as dense tensors
        return [
            None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(lj, variables)
        ]

    def fn(j: int) -> list[np.ndarray]:
        out = grads(tf.constant(j, tf.int32))
        return [
            np.zeros(v.shape, v.dtype.as_numpy_dtype) if g is None else np.asarray(g)
            for g, v in zip(out, variables)
        ]

    return fn


def _stacked(forward, variables, per_example_loss, x, y, in_batch: bool) -> list[np.ndarray]:
    rows = [
        example_gradient(forward, variables, per_example_loss, x, y, j, in_batch)
        for j in range(x.shape[0])
    ]
    return [np.stack([r[i] for r in rows]) for i in range(len(variables))]


def per_example_gradients(forward, variables, per_example_loss, x, y) -> list[np.ndarray]:
    """``[n, *shape]`` per-example gradients of each variable (the unscaled ``d l_j / d theta``),
    each example's loss computed on its own slice of the batch."""
    return _stacked(forward, variables, per_example_loss, x, y, in_batch=False)


def per_example_jacobian(forward, variables, per_example_loss, x, y) -> list[np.ndarray]:
    """``[n, *shape]``: row ``j`` is ``d l_j / d theta`` with ``l_j`` computed in the forward pass
    of the *whole* batch (one gradient per example, taken from the [n] loss vector).

    For layers that couple the examples (BatchNormalization in training mode) this is the
    definition; without coupling it equals `per_example_gradients` up to the rounding of the
    forward pass (a network that amplifies rounding, see `tests/zoo_worker.forward_spread`,
    makes the two differ).
    """
    return _stacked(forward, variables, per_example_loss, x, y, in_batch=True)


def moments(per_example: np.ndarray, orders) -> dict[int, np.ndarray]:
    """``M_p = (1/n) sum_j g_j ** p`` in float64."""
    g = per_example.astype(np.float64)
    return {p: np.mean(g**p, axis=0) for p in orders}


def per_row_jacobian(forward, variables, per_example_loss, x, y) -> list[np.ndarray]:
    """``[rows, *shape]``: row ``r`` is ``d l_r / d theta`` for every entry ``r`` of the
    per-example loss vector of the whole batch's forward pass, however many rows it has (a
    batch built in the step: ``concat([real, fake])`` has ``2 n`` examples)."""
    xt = tf.constant(x)
    yt = None if y is None else tf.constant(y)
    rows = int(per_example_loss(forward(xt), yt).shape[0])
    out: list[list[np.ndarray]] = [[] for _ in variables]
    for r in range(rows):
        with tf.GradientTape() as tape:
            lr = per_example_loss(forward(xt), yt)[r]
        for k, (g, v) in enumerate(zip(tape.gradient(lr, variables), variables)):
            out[k].append(
                np.zeros(v.shape, v.dtype.as_numpy_dtype)
                if g is None
                else np.asarray(tf.convert_to_tensor(g))
            )
    return [np.stack(o) for o in out]
