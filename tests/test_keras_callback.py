"""gradmom.keras.GradMoments on Sequential, Functional and subclassed models."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tb_gradmom as gradmom
from tb_gradmom import data
from tests import reference
from tests.cases import sparse_ce


def _sequential():
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)]
    )


def _functional():
    inp = keras.Input((4,))
    h = keras.layers.Dense(6, activation="tanh")(inp)
    return keras.Model(inp, keras.layers.Dense(3)(h))


class Sub(keras.Model):
    def __init__(self):
        super().__init__()
        self.h = keras.layers.Dense(6, activation="tanh")
        self.o = keras.layers.Dense(3)

    def call(self, x):
        return self.o(self.h(x))


def _subclassed():
    m = Sub()
    m(np.zeros((1, 4), "float32"))
    return m


BUILDERS = {"sequential": _sequential, "functional": _functional, "subclassed": _subclassed}


def _compiled(kind):
    keras.utils.set_random_seed(11)
    model = BUILDERS[kind]()
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, size=40)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_callback_logs_exact_moments_and_leaves_training_unchanged(kind, tmp_path):
    x, y = _data()
    with_cb = _compiled(kind)
    initial = [w.numpy().copy() for w in with_cb.trainable_weights]
    h1 = with_cb.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[gradmom.keras.GradMoments(tmp_path, every_n_steps=4)],
    )
    plain = _compiled(kind)
    h2 = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(h1.history["loss"], h2.history["loss"], rtol=1e-6)
    for a, b in zip(with_cb.weights, plain.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)

    logged = data.load(tmp_path)["."]
    # 5 batches per epoch, 2 epochs: optimizer iterations 0..9; logged at 0, 4, 8.
    kernel_tag = with_cb.trainable_weights[0].path
    assert [r.step for r in logged[kernel_tag]] == [0, 4, 8]
    # Step 0 uses the initial weights and the first batch: compare with brute force.
    fresh = _compiled(kind)
    for w, value in zip(fresh.trainable_weights, initial):
        w.assign(value)
    per_ex = reference.per_example_gradients(
        fresh, fresh.trainable_weights, sparse_ce, x[:8], y[:8]
    )
    for w, g in zip(with_cb.trainable_weights, per_ex):
        rec = logged[w.path][0]
        assert rec.batch_size == 8
        want = reference.moments(g, (1, 2))
        np.testing.assert_allclose(rec.moments[1], want[1], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(rec.moments[2], want[2], rtol=1e-4, atol=1e-9)

    # The model's own train_step is back: a later fit without the callback runs plainly.
    assert "train_step" not in with_cb.__dict__
    with_cb.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert [r.step for r in data.load(tmp_path)["."][kernel_tag]] == [0, 4, 8]


def test_callback_variables_subset_and_bad_arguments(tmp_path):
    x, y = _data()
    model = _compiled("sequential")
    first = model.trainable_weights[0]
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[gradmom.keras.GradMoments(tmp_path, every_n_steps=2, variables=[first])],
    )
    tags = set(data.load(tmp_path)["."])
    assert first.path in tags and model.trainable_weights[1].path not in tags
    with pytest.raises(ValueError, match="every_n_steps must be a positive integer"):
        gradmom.keras.GradMoments(tmp_path, every_n_steps=0)
