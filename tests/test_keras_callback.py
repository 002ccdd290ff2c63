"""gradmom.keras.GradMoments on Sequential, Functional and subclassed models."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tb_gradmom as gradmom
from tb_gradmom.analysis import data
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
    tags = gradmom.summary.tag_names(with_cb.trainable_weights)
    kernel_tag = tags[0]
    assert [r.step for r in logged[kernel_tag]] == [0, 4, 8]
    # Step 0 uses the initial weights and the first batch: compare with brute force.
    fresh = _compiled(kind)
    for w, value in zip(fresh.trainable_weights, initial):
        w.assign(value)
    per_ex = reference.per_example_gradients(
        fresh, fresh.trainable_weights, sparse_ce, x[:8], y[:8]
    )
    for tag, g in zip(tags, per_ex):
        rec = logged[tag][0]
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
    assert tags == set(gradmom.summary.tag_names([first])) | {"_model"}
    with pytest.raises(ValueError, match="every_n_steps must be a positive integer"):
        gradmom.keras.GradMoments(tmp_path, every_n_steps=0)


# --- every reduction a Keras loss or a user's loss function can have ---------------------------


def _sum_loss(y, y_pred):
    per = keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)
    return keras.ops.sum(per)  # a user's loss returning the SUM over the batch


def _max_loss(y, y_pred):
    per = keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)
    return keras.ops.max(per)


LOSSES = {
    # (compile kwargs, per-example loss of example j on its own)
    "mean": (
        dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        lambda out, y, w: sparse_ce(out, y),
    ),
    "sum-reduction": (
        dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")),
        lambda out, y, w: sparse_ce(out, y),
    ),
    "custom-sum-function": (dict(loss=_sum_loss), lambda out, y, w: sparse_ce(out, y)),
    "sample-weights": (
        dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        lambda out, y, w: sparse_ce(out, y) * w,
    ),
}


@pytest.mark.parametrize("kind", list(LOSSES))
def test_callback_is_exact_for_every_reduction(tmp_path, kind):
    """The reduction is read from the graph: a loss function returning the batch SUM is logged
    as the moments of its per-example terms (not n or n**2 times them), sample weights enter
    the per-example losses, Keras' "sum" reduction is a sum."""
    import tensorflow as tf

    keras.utils.set_random_seed(12)
    model = _sequential()
    compile_kw, per_example = LOSSES[kind]
    model.compile(optimizer=keras.optimizers.SGD(0.0), **compile_kw)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(8, 4)).astype("float32")
    y = rng.integers(0, 3, size=8)
    w = rng.uniform(0.5, 2.0, size=8).astype("float32")
    fit_kw = dict(sample_weight=w) if kind == "sample-weights" else {}
    cb = gradmom.keras.GradMoments(str(tmp_path), every_n_steps=1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[cb], **fit_kw)
    run = data.load(str(tmp_path))["."]
    variables = model.trainable_variables

    per = []
    for j in range(8):
        with tf.GradientTape() as tape:
            out = model(x[j : j + 1])
            lj = per_example(out, y[j : j + 1], w[j : j + 1])[0]
        per.append([tf.convert_to_tensor(g).numpy() for g in tape.gradient(lj, variables)])
    tags = gradmom.summary.tag_names(variables)
    for i, v in enumerate(variables):
        g = np.stack([p[i] for p in per]).astype(np.float64)
        rec = run[tags[i]][0]
        assert rec.batch_size == 8
        for p in (1, 2):
            ref = np.mean(g**p, axis=0)
            err = np.max(np.abs(rec.moments[p] - ref))
            assert err <= 2e-5 * max(np.max(np.abs(ref)), 1e-6), (kind, v.path, p, err)


def test_callback_multi_output_loss_weights(tmp_path):
    """Two outputs, two losses, loss weights: l_j = a * l1_j + b * l2_j."""
    import tensorflow as tf

    keras.utils.set_random_seed(13)
    inp = keras.Input((4,))
    h = keras.layers.Dense(5, activation="tanh")(inp)
    out1 = keras.layers.Dense(3, name="cls")(h)
    out2 = keras.layers.Dense(1, name="reg")(h)
    model = keras.Model(inp, [out1, out2])
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
        loss_weights=[0.3, 2.0],
    )
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 4)).astype("float32")
    y1 = rng.integers(0, 3, size=6)
    y2 = rng.normal(size=(6, 1)).astype("float32")
    cb = gradmom.keras.GradMoments(str(tmp_path), every_n_steps=1)
    model.fit(x, [y1, y2], batch_size=6, epochs=1, verbose=0, callbacks=[cb])
    run = data.load(str(tmp_path))["."]
    variables = model.trainable_variables
    per = []
    for j in range(6):
        with tf.GradientTape() as tape:
            o1, o2 = model(x[j : j + 1])
            lj = 0.3 * sparse_ce(o1, y1[j : j + 1])[0] + 2.0 * tf.reduce_mean((o2 - y2[j]) ** 2)
        per.append([tf.convert_to_tensor(g).numpy() for g in tape.gradient(lj, variables)])
    tags = gradmom.summary.tag_names(variables)
    for i, v in enumerate(variables):
        g = np.stack([p[i] for p in per]).astype(np.float64)
        rec = run[tags[i]][0]
        for p in (1, 2):
            ref = np.mean(g**p, axis=0)
            err = np.max(np.abs(rec.moments[p] - ref))
            assert err <= 2e-5 * max(np.max(np.abs(ref)), 1e-6), (v.path, p, err)


def test_callback_refuses_a_max_loss_and_training_goes_on(tmp_path):
    """A loss that is not a mean or a sum of per-example losses: no number is logged, a
    warning gives the error, and training goes on as without the callback."""
    x, y = _data()
    models = []
    for cb in (gradmom.keras.GradMoments(str(tmp_path), every_n_steps=1), None):
        keras.utils.set_random_seed(14)
        model = _sequential()
        model.compile(optimizer="sgd", loss=_max_loss)
        if cb is None:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        else:
            with pytest.warns(UserWarning, match=r"training goes on.*PerExampleLossError.*max"):
                model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        models.append(model)
    for a, b in zip(models[0].weights, models[1].weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="no Grad Moments data"):
        data.load(tmp_path)


def test_callback_arguments_are_checked_at_construction(tmp_path):
    with pytest.raises(TypeError, match=r"every_n_steps must be a positive integer.*2\.9"):
        gradmom.keras.GradMoments(str(tmp_path), every_n_steps=2.9)
    with pytest.raises(ValueError, match=r"orders must be integers.*True"):
        gradmom.keras.GradMoments(str(tmp_path), orders=(1, True))
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"log_dir '.*not_a_dir' is a file"):
        gradmom.keras.GradMoments(str(a_file))
