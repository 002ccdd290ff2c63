"""Issue 26, causes D-G: views used twice by one op, batch statistics and custom gradients
between a layer and the loss, losses that mix the examples. Never a silent wrong number.

Each model is small and float64; the moments are compared with one gradient per example:
``reference.per_example_gradients`` (each example's loss on its own slice) where nothing
couples the examples, ``reference.per_example_jacobian`` (each example's loss from the batch's
forward pass: the definition ``g_j = d l_j / d theta``) where something does.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tests import reference
from tests.cases import squared_error

ORDERS = (1, 2, 3, 4)


def _moments(forward, variables, x, y, *, loss=squared_error, **kwargs):
    """``(plan paths, moments, warnings)`` of ``mean(loss(forward(x), y))`` in one trace."""
    seen = {}

    @tf.function
    def step(x, y):
        total = tf.reduce_mean(loss(forward(x), y))
        plan = gradmom.plan_moments(total, variables, ORDERS, **kwargs)
        seen["paths"] = [v.path for v in plan.variables]
        return gradmom.gradients_and_moments(total, variables, ORDERS, **kwargs)[1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moments = step(tf.constant(x), tf.constant(y))
    messages = [str(w.message) for w in caught if "tb_gradmom" in str(w.message)]
    return seen["paths"], moments, messages


def _assert_exact(moments, per_example, what, tol=1e-10):
    for i, (m, g) in enumerate(zip(moments, per_example)):
        expected = reference.moments(g, ORDERS)
        for p in ORDERS:
            ref = expected[p]
            scale = max(float(np.max(np.abs(ref))), 1e-30)
            err = float(np.max(np.abs(np.asarray(m[p]) - ref)))
            assert err <= tol * scale, f"{what}: variable {i} M{p}: error {err:.3g} of {scale:.3g}"


# --- D: one view of a variable at two inputs of one op ---------------------------------------


def _twice(kind):
    rng = np.random.default_rng(1)
    shape = {"identity-mul": (3, 2), "reshape-matmul": (9,), "expm": (3, 3)}[kind]
    s = tf.Variable(rng.normal(size=shape) * 0.5, name="s")

    def kernel():
        if kind == "identity-mul":
            w = tf.identity(s)
            return w * w  # [3, 2]
        if kind == "reshape-matmul":
            r = tf.reshape(s, [3, 3])
            return r @ r
        return tf.linalg.expm(s)

    out = 2 if kind == "identity-mul" else 3
    return (lambda x: tf.tanh(x @ kernel())), [s], (3, out)


@pytest.mark.parametrize("kind", ["identity-mul", "reshape-matmul", "expm"])
def test_a_view_used_at_two_inputs_of_one_op_counts_once(kind):
    """``w * w``, ``r @ r`` (one view, both inputs of one op) and ``expm(S)`` (which squares
    its argument): ``t.consumers()`` lists such an op once per input, and each use was
    counted twice (M_2 at 4x, M_4 at 16x, expm 7.6 % off)."""
    forward, variables, (d_in, d_out) = _twice(kind)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(5, d_in)), rng.normal(size=(5, d_out))
    paths, moments, _ = _moments(forward, variables, x, y, fallback="error")
    assert all(p.startswith("rule") for p in paths), paths
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    _assert_exact(moments, ref, kind)
