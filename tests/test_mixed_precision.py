"""Mixed precision: float16/bfloat16 compute, float32 variables, moments exact and in float32.

The reference is the same model (same weights) in float32, brute force per example: the mixed
model differs from it only by 16-bit rounding of the forward and backward passes.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.analysis import data
from tests import reference
from tests.cases import sparse_ce

ORDERS = (1, 2, 3, 4)
# Largest error relative to the largest absolute moment mean_j |g_j|**p of the same variable
# and order (the scale of 16-bit rounding in a sum of per-example terms; for even p it is M_p).
# Measured: float16 <= 4e-3, bfloat16 <= 2.5e-2 (8 bits of mantissa); a moment scaled by
# n**p or by the loss scale is off by orders of magnitude.
TOLERANCE = {"mixed_float16": 2e-2, "mixed_bfloat16": 8e-2}


def _mlp(policy):
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", dtype=policy),
            keras.layers.LayerNormalization(dtype=policy),
            keras.layers.Dense(3, dtype=policy),
        ]
    )


def _convnet(policy):
    return keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(3, 3, activation="relu", dtype=policy),
            keras.layers.DepthwiseConv2D(2, dtype=policy),
            keras.layers.Flatten(dtype=policy),
            keras.layers.Dense(3, dtype=policy),
        ]
    )


def _sequence(policy):
    inp = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(9, 8, dtype=policy)(inp)
    h = keras.layers.MultiHeadAttention(2, 4, dtype=policy)(h, h)
    h = keras.layers.LSTM(4, dtype=policy)(h)  # through the exact fallback
    out = keras.layers.Dense(3, dtype=policy)(h)
    return keras.Model(inp, out)


MODELS = {
    "mlp-layernorm": (_mlp, lambda rng: rng.normal(size=(6, 6))),
    "conv-depthwise": (_convnet, lambda rng: rng.normal(size=(5, 6, 6, 2))),
    "embedding-attention-lstm": (_sequence, lambda rng: rng.integers(0, 9, size=(4, 5))),
}


def _pair(name, policy):
    build, inputs = MODELS[name]
    keras.utils.set_random_seed(21)
    mixed = build(policy)
    full = build("float32")
    full.set_weights(mixed.get_weights())
    rng = np.random.default_rng(5)
    x = inputs(rng)
    x = x.astype("float32") if x.dtype.kind == "f" else x.astype("int32")
    y = rng.integers(0, 3, size=x.shape[0])
    return mixed, full, x, y


def _abs_moment(g, p):
    return float(np.max(np.mean(np.abs(g.astype(np.float64)) ** p, axis=0)))


def _check(moments, full, x, y, tol, what):
    per_ex = reference.per_example_gradients(full, full.trainable_variables, sparse_ce, x, y)
    # Variables whose gradients are tiny next to the model's (an attention key bias has none
    # at all) carry the 16-bit rounding of the whole backward pass, as TensorFlow's own
    # gradient does: a floor of 1e-3 of the model's largest absolute moment of each order.
    floor = {p: 1e-3 * max(_abs_moment(g, p) for g in per_ex) for p in ORDERS}
    for v, m, g in zip(full.trainable_variables, moments, per_ex):
        want = reference.moments(g, ORDERS)
        for p in ORDERS:
            got = np.asarray(m[p])
            assert m[p].dtype == tf.float32, f"{what} {v.path} M{p} is {m[p].dtype}"
            assert np.all(np.isfinite(got)), f"{what} {v.path} M{p} not finite"
            scale = max(_abs_moment(g, p), floor[p], 1e-30)
            err = float(np.max(np.abs(got - want[p])))
            assert err <= tol * scale, f"{what} {v.path} M{p}: {err:.3g} > {tol} * {scale:.3g}"


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_mixed_precision_moments_match_float32_brute_force(name, policy):
    mixed, full, x, y = _pair(name, policy)

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(sparse_ce(tf.cast(mixed(x), tf.float32), y))
        return gradmom.gradients_and_moments(loss, mixed.trainable_variables, orders=ORDERS)

    grads, moments = step(x, y)
    for g, v in zip(grads, mixed.trainable_variables):
        assert v.dtype == "float32" and tf.convert_to_tensor(g).dtype == tf.float32
    _check(moments, full, x, y, TOLERANCE[policy], f"{name} {policy}")


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
@pytest.mark.parametrize("name", ["mlp-layernorm", "embedding-attention-lstm"])
def test_loss_scale_gives_unscaled_moments_and_scaled_gradients(name):
    """With a LossScaleOptimizer's scale (2**15) the moments are those of the unscaled
    gradients (not s**p times them) and the gradients stay scaled for the optimizer."""
    mixed, full, x, y = _pair(name, "mixed_float16")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build(mixed.trainable_variables)

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(sparse_ce(tf.cast(mixed(x), tf.float32), y))
        scaled = optimizer.scale_loss(loss)
        return gradmom.gradients_and_moments(
            scaled, mixed.trainable_variables, orders=ORDERS, loss_scale=optimizer.dynamic_scale
        )

    grads, moments = step(x, y)
    scale = float(optimizer.dynamic_scale.numpy())
    assert scale > 1000.0
    _check(moments, full, x, y, TOLERANCE["mixed_float16"], f"{name} scaled")
    for g, m in zip(grads, moments):
        np.testing.assert_allclose(
            np.asarray(tf.convert_to_tensor(g)) / scale, m[1].numpy(), rtol=1e-5, atol=1e-9
        )


def test_gradients_that_square_beyond_float16_range():
    """Per-example gradients of about 2e3: their squares (4e6) and fourth powers (2e13) do not
    fit in float16 (max 65504). The moments are computed in float32 and stay exact."""
    mixed, full, x, y = _pair("mlp-layernorm", "mixed_float16")
    x = x * 300.0
    big = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(3, dtype="mixed_float16", use_bias=False)]
    )
    big_full = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, use_bias=False)])
    big_full.set_weights(big.get_weights())

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(sparse_ce(tf.cast(big(x), tf.float32), y))
        return gradmom.gradients_and_moments(loss, big.trainable_variables, orders=ORDERS)[1]

    moments = step(x, y)
    assert float(np.max(moments[0][4].numpy())) > 65504.0
    _check(moments, big_full, x, y, TOLERANCE["mixed_float16"], "large gradients")


def test_keras_callback_under_mixed_precision_logs_unscaled_moments(tmp_path):
    """A mixed_float16 model trained with a LossScaleOptimizer (what Keras uses under the
    global mixed_float16 policy): the logged moments are of the unscaled gradients, and
    training matches training without the callback."""
    keras.utils.set_random_seed(4)

    def compiled():
        keras.utils.set_random_seed(4)
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(6, activation="tanh", dtype="mixed_float16"),
                keras.layers.Dense(3, dtype="mixed_float16"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, size=16)
    model = compiled()
    initial = model.get_weights()
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[gradmom.keras.GradMoments(tmp_path, every_n_steps=1)],
    )
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    plain = compiled()
    plain.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)

    full = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)]
    )
    full.set_weights(initial)
    per_ex = reference.per_example_gradients(
        full, full.trainable_variables, sparse_ce, x[:8], y[:8]
    )
    logged = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(model.trainable_weights)
    for w, g, tag in zip(model.trainable_weights, per_ex, tags):
        rec = logged[tag][0]
        assert rec.step == 0
        want = reference.moments(g, (1, 2))
        for p in (1, 2):
            scale = float(np.max(np.abs(want[p])))
            assert float(np.max(np.abs(rec.moments[p] - want[p]))) <= 2e-2 * scale, (w.path, p)
