"""Loss forms the per-example split must read right (issue 26, causes A-C), against brute force.

A. A factor of the per-example losses holds no example: ``c * batch_statistic`` and
   ``mean(l) * mean(h)`` are refused (`PerExampleLossError` naming the op and the term), on
   whichever side the constant stands; a count no gradient flows through still divides.
B. An example-free term ``R`` of the loss (a weight penalty) is part of every example's loss:
   ``g_j = grad(l_j + R)`` for a mean loss, ``grad(l_j + R / n)`` for a sum, so ``M_1`` is the
   gradient and ``M_2 - M_1**2`` the variance of the per-example gradients; the variable keeps
   its rule.
C. Keras' loss total ``ops.sum([loss, *model.losses])`` (``Sum(Pack(...))``), ``tf.add_n`` and
   nested forms are sums of terms.

Every case is float64 and small; the reference takes one gradient per example
(`tests.reference`) of the per-example loss the definition names.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tests import reference

ORDERS = (1, 2, 3, 4)
N, D, K = 5, 3, 2


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)), rng.normal(size=(N, K))


def _variables(seed: int = 1):
    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.normal(size=(D, K)), name="w")
    v = tf.Variable(rng.normal(size=(D, 1)), name="v")
    return w, v


def _per_example(w):
    """``l_j = 0.5 * |tanh(x_j W) - y_j|^2``: ``[n]``."""

    def loss(out, y):
        return 0.5 * tf.reduce_sum(tf.square(out - y), axis=1)

    def forward(x):
        return tf.tanh(x @ w)

    return forward, loss


def _assert_moments(got, want, what: str, rtol: float = 1e-9):
    for p, expected in want.items():
        g = np.asarray(got[p])
        scale = max(float(np.max(np.abs(expected))), 1e-300)
        err = float(np.max(np.abs(g - expected))) / scale
        assert err <= rtol, f"{what} M_{p}: relative error {err:.3g}\n{g}\nvs\n{expected}"


# --- A: a factor holds no example ---------------------------------------------------------------

# (id, loss from (per [n], x, w, v), the op type the message names)
REFUSED = [
    (
        "const-times-square-of-batch-mean",
        lambda per, x, w, v: tf.reduce_mean(per) + 0.5 * tf.square(tf.reduce_mean(tf.tanh(x @ v))),
        "Square",
    ),
    (
        "square-of-batch-mean-times-const",
        lambda per, x, w, v: tf.reduce_mean(per) + tf.square(tf.reduce_mean(tf.tanh(x @ v))) * 0.5,
        "Square",
    ),
    (
        "mean-times-batch-mean",
        lambda per, x, w, v: tf.reduce_mean(per) * tf.reduce_mean(tf.sigmoid(x @ v)),
        "Mul",
    ),
    (
        "batch-mean-times-mean",
        lambda per, x, w, v: tf.reduce_mean(tf.sigmoid(x @ v)) * tf.reduce_mean(per),
        "Mul",
    ),
    (
        "sum-over-batch-statistic",
        lambda per, x, w, v: tf.reduce_sum(per) / tf.reduce_sum(tf.sigmoid(x @ v)),
        "RealDiv",
    ),
    (
        # keras_hub Mixtral/Qwen-MoE: router_aux_loss_coef * load-balancing loss
        "coef-times-load-balancing-loss",
        lambda per, x, w, v: tf.reduce_mean(per) + 0.02 * _load_balancing(x, w),
        "Mul",
    ),
]


def _load_balancing(x, w):
    """A mixture-of-experts load-balancing loss over the batch (Switch Transformer, Mixtral):
    ``E * sum_e f_e * P_e`` with ``f`` the fraction of examples routed to expert ``e`` and ``P``
    the mean router probability: a statistic of the whole batch, through the router ``w``."""
    probs = tf.nn.softmax(x @ w, axis=-1)
    routed = tf.one_hot(tf.argmax(probs, axis=-1), K, dtype=probs.dtype)
    return K * tf.reduce_sum(tf.reduce_mean(routed, axis=0) * tf.reduce_mean(probs, axis=0))


@pytest.mark.parametrize("make_loss, op", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_batch_statistic_is_not_a_constant_factor(make_loss, op):
    """Every form of a batch statistic of the variables times (or dividing) the loss raises,
    naming the op; never a silent number (the first form gave M_1 and M_2 1 % off)."""
    x, y = _data()
    w, v = _variables()
    forward, loss = _per_example(w)

    @tf.function
    def step(x, y):
        total = make_loss(loss(forward(x), y), x, w, v)
        return gradmom.gradients_and_moments(total, [w, v], orders=(1, 2))

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(x, y)
    msg = str(info.value)
    assert f", {op})" in msg, msg
    assert "[n] vector" in msg and "no per-example split" in msg, msg


def test_a_the_error_names_an_added_term_and_what_to_do():
    """A batch statistic added to the loss (the aux loss of a mixture of experts): the message
    names the term and says to log a loss without it."""
    x, y = _data()
    w, v = _variables()
    forward, loss = _per_example(w)

    @tf.function
    def step(x, y):
        aux = tf.identity(_load_balancing(x, v @ tf.ones([1, K], tf.float64)), name="aux")
        total = tf.reduce_mean(loss(forward(x), y)) + tf.multiply(
            tf.constant(0.01, tf.float64), aux, name="aux_term"
        )
        return gradmom.gradients_and_moments(total, [w, v], orders=(1, 2))

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(x, y)
    msg = str(info.value)
    assert "its term 'aux_term:0', added to the loss" in msg, msg
    assert "auxiliary loss" in msg and "without that term" in msg, msg


def test_a_a_count_no_gradient_flows_through_still_divides():
    """``sum(l * m) / sum(m)`` with a mask from the labels: the divisor is a batch statistic no
    gradient flows through, a constant for the per-example split (``l_j' = m_j l_j / sum(m)``,
    read as a sum)."""
    x, y = _data()
    w, _ = _variables()
    forward, loss = _per_example(w)
    mask = np.array([1.0, 0.0, 1.0, 1.0, 0.0])

    def per_example(out, yy):
        m = tf.constant(mask)
        return loss(out, yy) * m / tf.reduce_sum(m)

    @tf.function
    def step(x, y, m):
        values = loss(forward(x), y) * m
        return gradmom.gradients_and_moments(
            tf.reduce_sum(values) / tf.reduce_sum(m), [w], orders=ORDERS
        )

    grads, moments = step(x, y, mask)
    ref = reference.per_example_jacobian(forward, [w], per_example, x, y)[0]
    want = reference.moments(ref, ORDERS)
    _assert_moments(moments[0], want, "masked sum")
    np.testing.assert_allclose(grads[0], ref.sum(axis=0), rtol=1e-12)
