"""Brute-force reference: one gradient per example, then numpy moments.

Shares no code with the rules: each example's loss is computed on its own slice of the batch
and differentiated with a `tf.GradientTape`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def per_example_gradients(forward, variables, per_example_loss, x, y) -> list[np.ndarray]:
    """``[n, *shape]`` per-example gradients of each variable (the unscaled ``d l_j / d theta``)."""
    n = x.shape[0]
    rows = []
    for j in range(n):
        xj = tf.constant(x[j : j + 1])
        yj = None if y is None else tf.constant(y[j : j + 1])
        with tf.GradientTape() as tape:
            lj = per_example_loss(forward(xj), yj)[0]
        grads = tape.gradient(lj, variables)
        rows.append(
            [
                np.zeros(v.shape, v.dtype.as_numpy_dtype)
                if g is None
                else np.asarray(tf.convert_to_tensor(g))
                for g, v in zip(grads, variables)
            ]
        )
    return [np.stack([r[i] for r in rows]) for i in range(len(variables))]


def per_example_jacobian(forward, variables, per_example_loss, x, y) -> list[np.ndarray]:
    """``[n, *shape]``: row ``j`` is ``d l_j / d theta`` with ``l_j`` computed in the forward pass
    of the *whole* batch (one gradient per example, taken from the [n] loss vector).

    For layers that couple the examples (BatchNormalization in training mode) this is the
    definition; without coupling it equals `per_example_gradients`.
    """
    n = x.shape[0]
    xt = tf.constant(x)
    yt = None if y is None else tf.constant(y)
    rows = []
    for j in range(n):
        with tf.GradientTape() as tape:
            lj = per_example_loss(forward(xt), yt)[j]
        grads = tape.gradient(lj, variables)
        rows.append(
            [
                np.zeros(v.shape, v.dtype.as_numpy_dtype)
                if g is None
                else np.asarray(tf.convert_to_tensor(g))
                for g, v in zip(grads, variables)
            ]
        )
    return [np.stack([r[i] for r in rows]) for i in range(len(variables))]


def moments(per_example: np.ndarray, orders) -> dict[int, np.ndarray]:
    """``M_p = (1/n) sum_j g_j ** p`` in float64."""
    g = per_example.astype(np.float64)
    return {p: np.mean(g**p, axis=0) for p in orders}
