"""Where users train: the Keras callback and `gradmom.GradientTape` on the models users build,
with their own train steps, and training never changed by them.

Every test trains the same model twice, with and without Grad Moments attached, and compares
losses, weights and optimizer variables bit for bit; where moments are logged, they are read
back with `gradmom.data.load` and compared with one gradient per example.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.analysis import data
from tb_gradmom.core import plan as _plan
from tests import archgen, reference

# End-to-end cases past a quick representative of each (`python -m pytest -m "not slow"`).
SLOW = pytest.mark.slow


def _same_training(a: keras.Model, b: keras.Model, ha=None, hb=None) -> None:
    if ha is not None:
        assert ha.history == hb.history
    for u, v in zip(a.weights, b.weights):
        np.testing.assert_array_equal(u.numpy(), v.numpy(), err_msg=u.path)
    for u, v in zip(a.optimizer.variables, b.optimizer.variables):
        np.testing.assert_array_equal(u.numpy(), v.numpy(), err_msg=u.path)


def _check_logged(run, model, weights, x, y, per_example_loss, tags=None, rtol=1e-4):
    """The step-0 records of ``run`` against brute force at ``weights`` on batch ``(x, y)``."""
    for w, value in zip(model.trainable_weights, weights):
        w.assign(value)
    per_ex = reference.per_example_gradients(
        lambda t: model(t, training=True), model.trainable_weights, per_example_loss, x, y
    )
    tags = tags or gradmom.summary.tag_names(model.trainable_weights)
    wants = [reference.moments(g, (1, 2)) for g in per_ex]
    # judged against the model's largest moments, as tests/zoo_worker.py does: a gradient
    # that vanishes in exact arithmetic (an attention key's bias) is float32 rounding noise
    scale = {p: max(float(np.abs(w[p]).max()) for w in wants) for p in (1, 2)}
    for tag, want in zip(tags, wants):
        rec = run[tag][0]
        assert rec.step == 0 and rec.batch_size == len(x), tag
        for p in (1, 2):
            np.testing.assert_allclose(
                rec.moments[p], want[p], rtol=rtol, atol=1e-5 * scale[p], err_msg=f"{tag} M{p}"
            )


def _sce(out, y):
    return keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)


# -- the public module names ----------------------------------------------------------------


def test_documented_module_names_import():
    import tb_gradmom.plot
    import tb_gradmom.stats
    from tb_gradmom.data import load
    from tb_gradmom.keras import GradMoments
    from tb_gradmom.summary import moments

    from tb_gradmom.analysis import data as data_module
    from tb_gradmom.writers import keras as keras_module
    from tb_gradmom.writers import summary as summary_module

    assert load is data_module.load and GradMoments is keras_module.GradMoments
    assert moments is summary_module.moments
    assert tb_gradmom.stats is gradmom.stats and tb_gradmom.plot is gradmom.plot
    assert tb_gradmom.stats.__name__ == "tb_gradmom.analysis.stats"
    assert tb_gradmom.stats.__spec__.name == "tb_gradmom.analysis.stats"


# -- models with an Embedding ---------------------------------------------------------------

_EMBEDDING_HEADS = {
    "pool": lambda: [keras.layers.GlobalAveragePooling1D()],
    "flatten": lambda: [keras.layers.Flatten()],
    "conv1d": lambda: [keras.layers.Conv1D(4, 3), keras.layers.GlobalMaxPooling1D()],
    "lstm": lambda: [keras.layers.LSTM(5)],
}


def _embedding_params():
    """Every head with int64 ids and the pooling head with int32 in the quick set; the other
    int32 models are marked slow."""
    for ids in ("int32", "int64"):
        for head in sorted(_EMBEDDING_HEADS):
            quick = ids == "int64" or head == "pool"
            yield pytest.param(head, ids, id=f"{ids}-{head}", marks=[] if quick else [SLOW])


@pytest.mark.parametrize("head, ids", _embedding_params())
def test_embedding_models_log_exact_moments_through_the_callback(head, ids, tmp_path):
    def build():
        keras.utils.set_random_seed(5)
        m = keras.Sequential(
            [keras.Input((6,), dtype=ids), keras.layers.Embedding(50, 8)]
            + _EMBEDDING_HEADS[head]()
            + [keras.layers.Dense(3)]
        )
        m.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(True))
        return m

    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, (24, 6)).astype(ids)
    x[:, 1] = x[:, 0]  # a repeated id in every example
    y = rng.integers(0, 3, 24)
    a, b = build(), build()
    initial = [w.numpy() for w in a.trainable_weights]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2)
    ha = a.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    _same_training(a, b, ha, hb)
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(a.trainable_weights)
    assert [r.step for r in run[tags[0]]] == [0, 2, 4]
    _check_logged(run, build(), initial, x[:8], y[:8], _sce, tags)


def test_embedding_model_logs_through_summary_moments(tmp_path):
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((5,), dtype="int64"), keras.layers.Embedding(30, 4), keras.layers.Flatten()]
        + [keras.layers.Dense(2)]
    )
    rng = np.random.default_rng(1)
    x = rng.integers(0, 30, (6, 5))
    y = rng.integers(0, 2, 6)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(_sce(model(x), y))
        with writer.as_default(step=0):
            return gradmom.summary.moments(loss, model.trainable_variables)

    step(x, y)
    writer.close()
    initial = [w.numpy() for w in model.trainable_weights]
    _check_logged(data.load(tmp_path)["."], model, initial, x, y, _sce)


# -- a train_step the user wrote ------------------------------------------------------------


class ClippedL1(keras.Model):
    """A user's train_step: gradient clipping and an L1 term (not Keras' default step)."""

    tape = tf.GradientTape

    def __init__(self):
        super().__init__()
        self.d1 = keras.layers.Dense(8, activation="tanh")
        self.d2 = keras.layers.Dense(3)
        self.runs = tf.Variable(0, trainable=False)

    def call(self, x):
        return self.d2(self.d1(x))

    def train_step(self, data):
        x, y = data
        self.runs.assign_add(1)
        with self.tape() as tape:
            loss = tf.reduce_mean(_sce(self(x, training=True), y))
        grads = tape.gradient(loss, self.trainable_weights)
        l1 = [0.01 * tf.sign(w) for w in self.trainable_weights]
        grads, _ = tf.clip_by_global_norm([g + r for g, r in zip(grads, l1)], 0.5)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {"loss": loss}


def _clipped(tape):
    keras.utils.set_random_seed(1)
    m = ClippedL1()
    m.tape = tape
    m.compile(keras.optimizers.SGD(0.5, momentum=0.9))
    m(np.zeros((1, 5), "float32"))
    return m


def _xy(n=48, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype("float32"), rng.integers(0, 3, n)


def test_a_users_train_step_with_tf_tape_runs_unchanged_and_says_how_to_log(tmp_path):
    x, y = _xy()
    a, b = _clipped(tf.GradientTape), _clipped(tf.GradientTape)
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2)
    with pytest.warns(UserWarning, match=r"replace `tf.GradientTape\(\)` with `gradmom.Grad"):
        ha = a.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    assert int(a.runs.numpy()) == 18  # the user's step ran on every step
    _same_training(a, b, ha, hb)


def test_a_users_train_step_with_gradmom_tape_logs_exact_moments(tmp_path):
    x, y = _xy()
    a, b = _clipped(gradmom.GradientTape), _clipped(tf.GradientTape)
    initial = [w.numpy() for w in a.trainable_weights]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the tape logs
        ha = a.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    assert int(a.runs.numpy()) == 18
    _same_training(a, b, ha, hb)
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(a.trainable_weights)
    assert [r.step for r in run[tags[0]]] == [0, 4, 8, 12, 16]
    _check_logged(run, _clipped(tf.GradientTape), initial, x[:8], y[:8], _sce, tags)


class _Boom(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            raise KeyboardInterrupt("interrupted")


def test_an_interrupted_fit_leaves_nothing_behind(tmp_path):
    x, y = _xy()
    a, b = _clipped(tf.GradientTape), _clipped(tf.GradientTape)
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=1)
    with pytest.raises(KeyboardInterrupt), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.fit(x, y, batch_size=8, verbose=0, shuffle=False, callbacks=[cb, _Boom()])
    b.fit(x[:24], y[:24], batch_size=8, verbose=0, shuffle=False)
    # the next fit, without the callback, runs the user's step through Keras' own function
    ha = a.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    hb = b.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert "make_train_function" not in a.__dict__
    assert "Switch" not in type(a.train_function).__name__
    _same_training(a, b, ha, hb)


class KerasIoGAN(keras.Model):
    """The keras.io GAN: latents drawn inside the step, the discriminator on the
    concatenation of generated and real examples, two optimizers of its own."""

    def __init__(self):
        super().__init__()
        self.discriminator = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(1)]
        )
        self.generator = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(6)]
        )
        self.seed = keras.random.SeedGenerator(3)

    def compile(self):
        super().compile()
        self.d_opt, self.g_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def train_step(self, real):
        b = tf.shape(real)[0]
        fake = self.generator(keras.random.normal((b, 4), seed=self.seed))
        labels = tf.concat([tf.ones((b, 1)), tf.zeros((b, 1))], 0)
        with gradmom.GradientTape(name="discriminator") as tape:
            d_loss = self.loss_fn(labels, self.discriminator(tf.concat([fake, real], 0)))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_opt.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        z = keras.random.normal((b, 4), seed=self.seed)
        with gradmom.GradientTape(name="generator") as tape:
            g_loss = self.loss_fn(tf.zeros((b, 1)), self.discriminator(self.generator(z)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_opt.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def test_keras_io_gan_trains_unchanged_with_the_callback(tmp_path):
    def build():
        keras.utils.set_random_seed(2)
        gan = KerasIoGAN()
        gan.compile()
        return gan

    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    a, b = build(), build()
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ha = a.fit(x, epochs=2, batch_size=16, verbose=0, shuffle=False, callbacks=[cb])
    hb = b.fit(x, epochs=2, batch_size=16, verbose=0, shuffle=False)
    assert ha.history == hb.history
    for u, v in zip(
        a.weights + a.d_opt.variables + a.g_opt.variables,
        b.weights + b.d_opt.variables + b.g_opt.variables,
    ):
        np.testing.assert_array_equal(u.numpy(), v.numpy(), err_msg=u.path)
    texts = [str(w.message) for w in caught]
    try:
        run = data.load(tmp_path)["."]
    except ValueError:  # nothing logged: then a warning says why
        assert any("GradMoments" in t and "training goes on" in t for t in texts), texts
    else:
        # the optimizers are the GAN's own: the callback counts the steps (8 of them)
        steps = {r.step for t in run for r in run[t]}
        assert steps == {0, 2, 4, 6}


# -- Keras' default train_step on many models ------------------------------------------------


def _family(kind):
    keras.utils.set_random_seed(7)
    if kind == "cnn_bn":
        layers = [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.DepthwiseConv2D(3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3),
        ]
        shape = (8, 8, 3)
    elif kind == "lstm":
        layers = [keras.Input((5, 4)), keras.layers.LSTM(6), keras.layers.Dense(3)]
        shape = (5, 4)
    elif kind == "attention":
        inp = keras.Input((6, 8))
        h = keras.layers.MultiHeadAttention(2, 4)(inp, inp)
        h = keras.layers.LayerNormalization()(h + inp)
        out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
        return keras.Model(inp, out), (6, 8)
    elif kind == "dropout":
        layers = [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(3),
        ]
        shape = (6,)
    else:  # shared: one Dense called twice
        dense = keras.layers.Dense(6, activation="tanh")
        inp = keras.Input((6,))
        return keras.Model(inp, keras.layers.Dense(3)(dense(dense(inp)))), (6,)
    return keras.Sequential(layers), shape


@pytest.mark.parametrize("kind", ["cnn_bn", "lstm", "attention", "shared", "dropout"])
def test_default_train_step_trains_bit_identically_and_logs(kind, tmp_path):
    def build():
        m, shape = _family(kind)
        m.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(True))
        return m, shape

    (a, shape), (b, _) = build(), build()
    rng = np.random.default_rng(4)
    x = rng.normal(size=(24, *shape)).astype("float32")
    y = rng.integers(0, 3, 24)
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # batch normalisation and the LSTM's fallback
        ha = a.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    _same_training(a, b, ha, hb)
    run = data.load(tmp_path)["."]
    assert {r.step for t in run for r in run[t]} == set(range(6))


# The first three in the quick set, the others marked slow.
_GENERATED = [3, 11, 19, 23, 31, 42, 57, 77, 101, 133]


@pytest.mark.parametrize(
    "seed", [pytest.param(s, marks=[] if k < 3 else [SLOW]) for k, s in enumerate(_GENERATED)]
)
def test_generated_models_train_bit_identically_and_log_exact_moments(seed, tmp_path):
    arch = archgen.generate(seed)

    def build():
        m = archgen.build_model(arch, "float32")
        m.compile(keras.optimizers.SGD(0.05, momentum=0.5), "mse")
        return m

    a, b = build(), build()
    forward, _, (x, y), _ = archgen.entry(arch).build("float32")
    initial = [w.numpy() for w in a.trainable_weights]
    batch = max(1, len(x) // 2)
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ha = a.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    _same_training(a, b, ha, hb)

    def mse(out, t):  # Keras' "mse": the mean over every non-batch axis
        return tf.reduce_mean(tf.reshape(tf.square(out - t), [tf.shape(out)[0], -1]), axis=1)

    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(a.trainable_weights)
    _check_logged(run, build(), initial, x[:batch], y[:batch], mse, tags, rtol=2e-3)


# -- fit's options ---------------------------------------------------------------------------


def test_steps_per_execution_and_validation(tmp_path):
    def build():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(3)])
        m.compile("adam", keras.losses.SparseCategoricalCrossentropy(True), steps_per_execution=3)
        return m

    x, y = _xy(n=64)
    a, b = build(), build()
    initial = [w.numpy() for w in a.trainable_weights]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2)
    kw = dict(batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=(x[:16], y[:16]))
    ha = a.fit(x, y, callbacks=[cb], **kw)
    hb = b.fit(x, y, **kw)
    _same_training(a, b, ha, hb)
    tag = gradmom.summary.tag_names(a.trainable_weights)[0]
    steps = [r.step for r in data.load(tmp_path)["."][tag]]
    assert steps == list(range(0, 16, 2))
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(a.trainable_weights)
    _check_logged(run, build(), initial, x[:8], y[:8], _sce, tags)


def test_shares_the_train_run_of_keras_tensorboard(tmp_path):
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True))
    x, y = _xy(n=16)
    callbacks = [
        keras.callbacks.TensorBoard(str(tmp_path)),
        gradmom.keras.GradMoments(str(tmp_path), every_n_steps=1),
    ]
    m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=callbacks, validation_data=(x, y))
    runs = data.list_runs(tmp_path)
    assert "." not in runs and "train" in runs
    assert gradmom.summary.tag_names(m.trainable_weights)[0] in data.load(tmp_path)["train"]


def test_jit_compile_is_kept_on_the_steps_that_do_not_log(tmp_path):
    def build():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(3)])
        m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True), jit_compile=True)
        return m

    x, y = _xy(n=32)
    a = build()
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=3)
    a.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    assert a.jit_compile is True
    tag = gradmom.summary.tag_names(a.trainable_weights)[0]
    assert [r.step for r in data.load(tmp_path)["."][tag]] == [0, 3, 6]


# -- gradmom.GradientTape ---------------------------------------------------------------------


def test_gradient_tape_returns_what_tf_gradient_tape_returns(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, "tanh"), keras.layers.Dense(2)]
    )
    extra = tf.Variable(tf.ones([2]))
    x, y = _xy(n=8, d=4)
    writer = tf.summary.create_file_writer(str(tmp_path))

    def grads(tape_cls, **kw):
        @tf.function
        def f(x, y):
            with writer.as_default(step=0):
                with tape_cls(persistent=True, **kw) as tape:
                    out = model(x) * extra
                    loss = tf.reduce_mean(_sce(out, y % 2))
                    per_example = _sce(out, y % 2)
                g1 = tape.gradient(loss, {"w": model.trainable_variables, "e": extra})
                g2 = tape.gradient(per_example, model.trainable_variables)
                g3 = tape.gradient(loss, [extra, model.trainable_variables[0]])
                return g1, g2, g3

        return f(x, y)

    want = grads(tf.GradientTape)
    got = grads(gradmom.GradientTape)
    for w, g in zip(tf.nest.flatten(want), tf.nest.flatten(got)):
        np.testing.assert_array_equal(w.numpy(), g.numpy())
    writer.close()
    tags = gradmom.summary.tag_names([*model.trainable_variables, extra])
    assert set(tags) <= set(data.load(tmp_path)["."])

    @tf.function
    def unwatched(x):
        with gradmom.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(extra)
            loss = tf.reduce_mean(model(x) * extra)
        return tape.gradient(loss, [extra, model.trainable_variables[0]])

    g = unwatched(x)
    assert g[1] is None and g[0] is not None


def test_gan_two_tapes_two_groups(tmp_path):
    keras.utils.set_random_seed(0)
    gen = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="g")], name="gen")
    disc = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="d")], name="disc")
    writer = tf.summary.create_file_writer(str(tmp_path))
    real = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")

    @tf.function
    def step(real, z):
        with writer.as_default(step=0):
            with gradmom.GradientTape(name="discriminator") as tape:
                # example j: the pair (real_j, z_j)
                d_loss = tf.reduce_mean(
                    keras.losses.binary_crossentropy(tf.ones([6, 1]), disc(real), True)
                    + keras.losses.binary_crossentropy(tf.zeros([6, 1]), disc(gen(z)), True)
                )
            tape.gradient(d_loss, disc.trainable_variables)
            with gradmom.GradientTape(name="generator") as tape:
                g_loss = tf.reduce_mean(
                    keras.losses.binary_crossentropy(tf.ones([6, 1]), disc(gen(z)), True)
                )
            return tape.gradient(g_loss, gen.trainable_variables)

    z = np.random.default_rng(1).normal(size=(6, 3)).astype("float32")
    step(real, z)
    writer.close()
    run = data.load(tmp_path)["."]
    assert {"discriminator/d/kernel", "generator/g/kernel"} <= set(run)
    assert run["generator/g/kernel"][0].batch_size == 6


def _small(seed=3, **compile_kwargs):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, "tanh"), keras.layers.Dense(3)])
    compile_kwargs.setdefault("optimizer", keras.optimizers.SGD(0.1, momentum=0.5))
    m.compile(loss=keras.losses.SparseCategoricalCrossentropy(True), **compile_kwargs)
    return m


def test_gradient_accumulation_logs_once_per_update_over_the_whole_batch(tmp_path):
    def build():
        opt = keras.optimizers.SGD(0.1, gradient_accumulation_steps=4)
        return _small(optimizer=opt)

    x, y = _xy(n=64)
    a, b = build(), build()
    initial = [w.numpy() for w in a.trainable_weights]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2)
    ha = a.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    _same_training(a, b, ha, hb)
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(a.trainable_weights)
    # 16 micro-batches of 4, 4 updates: updates 0 and 2 logged, each over 16 examples
    assert [(r.step, r.batch_size) for r in run[tags[0]]] == [(0, 16), (2, 16)]
    _check_logged(run, build(), initial, x[:16], y[:16], _sce, tags)


def test_sample_and_class_weights_multi_output_and_resumed_fit(tmp_path):
    def build():
        keras.utils.set_random_seed(4)
        inp = keras.Input((5,))
        h = keras.layers.Dense(6, "tanh")(inp)
        out1 = keras.layers.Dense(3, name="a")(h)
        out2 = keras.layers.Dense(1, name="b")(h)
        m = keras.Model(inp, [out1, out2])
        m.compile(
            "adam",
            loss=[keras.losses.SparseCategoricalCrossentropy(True), "mse"],
            loss_weights=[1.0, 0.3],
        )
        return m

    x, y = _xy(n=32)
    y2 = np.random.default_rng(5).normal(size=(32, 1)).astype("float32")
    sw = np.random.default_rng(6).uniform(0.5, 2.0, size=32).astype("float32")
    a, b = build(), build()
    initial = [w.numpy() for w in a.trainable_weights]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=3)
    kw = dict(batch_size=8, shuffle=False, verbose=0, sample_weight=sw)
    a.fit(x, [y, y2], epochs=1, callbacks=[cb], **kw)
    ha = a.fit(x, [y, y2], epochs=3, initial_epoch=1, callbacks=[cb], **kw)  # resumed
    b.fit(x, [y, y2], epochs=1, **kw)
    hb = b.fit(x, [y, y2], epochs=3, initial_epoch=1, **kw)
    _same_training(a, b, ha, hb)
    tags = gradmom.summary.tag_names(a.trainable_weights)
    run = data.load(tmp_path)["."]
    assert [r.step for r in run[tags[0]]] == [0, 3, 6, 9]

    # step 0 against brute force: l_j = w_j (ce_j + 0.3 se_j), the targets and weights packed
    def weighted(out, packed):
        ce = keras.losses.sparse_categorical_crossentropy(
            tf.cast(packed[:, 0], tf.int32), out[0], from_logits=True
        )
        se = tf.square(out[1][:, 0] - packed[:, 1])
        return packed[:, 2] * (ce + 0.3 * se)

    packed = np.stack([y.astype("float32"), y2[:, 0], sw], 1)
    _check_logged(run, build(), initial, x[:8], packed[:8], weighted, tags)

    def build_cw():
        return _small(seed=8)

    c, d = build_cw(), build_cw()
    c_initial = [w.numpy() for w in c.trainable_weights]
    cw = {0: 1.0, 1: 3.0, 2: 0.5}
    c.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        class_weight=cw,
        verbose=0,
        shuffle=False,
        callbacks=[gradmom.keras.GradMoments(tmp_path / "cw", every_n_steps=1)],
    )
    d.fit(x, y, batch_size=8, epochs=2, class_weight=cw, verbose=0, shuffle=False)
    _same_training(c, d)

    # class weights are sample weights by label: l_j = cw[y_j] ce_j
    def class_weighted(out, t):
        labels = tf.cast(t, tf.int32)
        w = tf.gather(tf.constant([cw[0], cw[1], cw[2]]), labels)
        return w * keras.losses.sparse_categorical_crossentropy(labels, out, from_logits=True)

    cw_run = data.load(tmp_path / "cw")["."]
    cw_tags = gradmom.summary.tag_names(c.trainable_weights)
    _check_logged(cw_run, build_cw(), c_initial, x[:8], y[:8], class_weighted, cw_tags)


def test_mixed_precision_loss_scale_optimizer(tmp_path):
    def build():
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            keras.utils.set_random_seed(9)
            m = keras.Sequential(
                [keras.Input((5,)), keras.layers.Dense(6, "tanh"), keras.layers.Dense(3)]
            )
        finally:
            keras.mixed_precision.set_global_policy("float32")
        m.compile(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=256.0),
            keras.losses.SparseCategoricalCrossentropy(True),
        )
        return m

    x, y = _xy(n=32)
    a, b = build(), build()
    initial = [w.numpy() for w in a.trainable_weights]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2)
    ha = a.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    _same_training(a, b, ha, hb)
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(a.trainable_weights)
    rec = run[tags[0]][0]
    ref = build()
    for w, v in zip(ref.trainable_weights, initial):
        w.assign(v)
    per_ex = reference.per_example_gradients(
        lambda t: tf.cast(ref(t), tf.float32), ref.trainable_weights, _sce, x[:8], y[:8]
    )
    want = reference.moments(per_ex[0], (1, 2))
    # float16 compute: the loss scale is out of the moments (not 32768x)
    np.testing.assert_allclose(rec.moments[2], want[2], rtol=0.05, atol=1e-4)


def test_summary_write_outside_an_xla_step_logs_what_moments_logs(tmp_path):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, "tanh"), keras.layers.Dense(3)]
    )
    x, y = _xy(n=8)
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(_sce(model(x), y))
        grads, moments = gradmom.gradients_and_moments(loss, variables)
        return loss, moments

    loss, moments = step(x, y)
    eager = tf.summary.create_file_writer(str(tmp_path / "eager"))
    with eager.as_default(step=5):
        gradmom.summary.write(moments, variables, n=8, loss=loss)
    eager.close()
    ref = tf.summary.create_file_writer(str(tmp_path / "ref"))

    @tf.function
    def logged(x, y):
        loss = tf.reduce_mean(_sce(model(x), y))
        with ref.as_default(step=5):
            return gradmom.summary.moments(loss, variables)

    logged(x, y)
    ref.close()
    got, want = data.load(tmp_path / "eager")["."], data.load(tmp_path / "ref")["."]
    assert set(got) == set(want)
    for tag in want:
        g, w = got[tag][0], want[tag][0]
        assert g.step == w.step == 5
        for p in w.moments:
            np.testing.assert_allclose(g.moments[p], w.moments[p], rtol=1e-6, atol=1e-9)
        assert set(g.stats) == set(w.stats)
        for k in w.stats:
            if k in ("source_hi", "source_lo"):
                continue  # each call's writer token: two writers here, on purpose
            np.testing.assert_allclose(g.stats[k], w.stats[k], rtol=1e-5, err_msg=k)
    with pytest.raises(ValueError, match="same orders, 1 and 2"):
        gradmom.summary.write([{1: moments[0][1]}], variables[:1], n=8, step=0)
    with pytest.raises(ValueError, match="moments has 1 entries and var_list 2"):
        gradmom.summary.write(moments[:1], variables[:2], n=8, step=0)


# -- the writer path on the zoo --------------------------------------------------------------


def _zoo_params():
    from tests import zoo

    return [pytest.param(e, id=e.id) for e in zoo.selected() if not e.isolate]


@pytest.mark.slow
@pytest.mark.parametrize("entry", _zoo_params())
def test_zoo_entries_log_through_summary_moments_what_the_core_computes(entry, tmp_path):
    """Every in-process zoo entry logged with `summary.moments` and read back with
    `gradmom.data.load` holds the moments `gradients_and_moments` computes in the same step
    (which `tests/test_zoo.py` checks against one gradient per example), and the gradients
    `summary.moments` returns are TensorFlow's own."""
    import contextlib

    from tests import zoo

    inside = zoo.float64_inside() if entry.float32_inside else contextlib.nullcontext()
    with inside:
        forward, variables, (x, y), loss_spec = entry.build("float64")
        if isinstance(loss_spec, zoo.ScalarLoss):
            scalar = loss_spec.scalar
        else:

            def scalar(out, t):
                return tf.reduce_mean(loss_spec(out, t))

        writer = tf.summary.create_file_writer(str(tmp_path))

        if entry.raises:  # the writer path refuses the loss as the core does
            kind, fragment = entry.raises

            @tf.function
            def refused(x, y):
                with writer.as_default(step=0):
                    return gradmom.summary.moments(
                        scalar(forward(x), y), variables, fallback=entry.fallback
                    )

            with pytest.raises(Exception) as info, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                refused(x, y)
            assert type(info.value).__name__ == kind, info.value
            assert fragment in str(info.value), str(info.value)
            return

        @tf.function
        def step(x, y):
            loss = scalar(forward(x), y)
            moments = gradmom.gradients_and_moments(loss, variables, fallback=entry.fallback)[1]
            with writer.as_default(step=0):
                grads = gradmom.summary.moments(
                    loss, variables, max_elements=1 << 30, fallback=entry.fallback
                )
            # the examples the core found (a discriminator on concat([real, fake]): 2 len(x))
            n = len(x)
            if entry.reference == "rows":  # examples built in the step: the core's count
                options = _plan.Options.check((1,), None, None, None, entry.fallback, None)
                n = _plan.make_plan(loss, variables, options, name="examples").n
            return moments, grads, tf.gradients(loss, variables), n

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            moments, grads, want, n = step(x, y)
    writer.close()
    for g, w in zip(grads, want):
        if w is not None:
            np.testing.assert_array_equal(
                np.asarray(tf.convert_to_tensor(g)), np.asarray(tf.convert_to_tensor(w))
            )
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(variables)
    scale = max(float(np.max(np.abs(m[2].numpy()))) for m in moments)
    for tag, m in zip(tags, moments):
        rec = run[tag][0]
        assert rec.batch_size == int(n), tag
        for p in (1, 2):
            want_p = m[p].numpy().astype(np.float64)
            tol = 1e-6 * max(float(np.max(np.abs(want_p))), 1e-30) + 1e-12 * scale
            np.testing.assert_allclose(rec.moments[p], want_p, rtol=1e-6, atol=tol, err_msg=tag)


def test_summary_moments_inside_xla_says_what_to_do(tmp_path):
    v = tf.Variable(tf.ones([3, 2]))
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(jit_compile=True)
    def step(x):
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(x @ v), axis=1))
        with writer.as_default(step=0):
            return gradmom.summary.moments(loss, [v])

    with pytest.raises(RuntimeError, match=r"cannot write inside an XLA.*summary.write"):
        step(tf.ones([4, 3]))


@pytest.fixture
def small_disk(tmp_path):
    """A 96 KiB tmpfs (root only; skipped where it cannot be mounted)."""
    import subprocess

    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_never_stops_training(small_disk):
    def build():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((40,)), keras.layers.Dense(64), keras.layers.Dense(3)])
        m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True))
        return m

    x, y = _xy(n=64, d=40)
    a, b = build(), build()
    cb = gradmom.keras.GradMoments(small_disk / "run", every_n_steps=1)
    with pytest.warns(UserWarning, match=r"could not write step \d+ to .*training goes on"):
        ha = a.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[cb])
    hb = b.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    _same_training(a, b, ha, hb)
    run = data.load(small_disk / "run")["."]  # what was written stays readable
    tag = gradmom.summary.tag_names(a.trainable_weights)[0]
    assert run[tag][0].step == 0


def test_arguments_are_checked_naming_the_argument(tmp_path):
    v = tf.Variable(tf.ones([2]))
    with pytest.raises(ValueError, match="every_n_steps must fit in a signed 64-bit"):
        gradmom.keras.GradMoments(tmp_path, every_n_steps=10**20)
    with pytest.raises(ValueError, match="log_dir is empty"):
        gradmom.keras.GradMoments("")
    with pytest.raises(ValueError, match="variables is empty"):
        gradmom.keras.GradMoments(tmp_path, variables=[])
    with pytest.raises(TypeError, match="per_variable_scalars must be True or False"):
        gradmom.keras.GradMoments(tmp_path, per_variable_scalars="yes")
    m = _small()
    x, y = _xy(n=8)
    with pytest.raises(ValueError, match=r"GradMoments\(variables=...\) holds"):
        m.fit(x, y, verbose=0, callbacks=[gradmom.keras.GradMoments(tmp_path, variables=[v])])
    uncompiled = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    with pytest.raises((RuntimeError, ValueError), match="compile"):
        uncompiled.fit(x, y, verbose=0, callbacks=[gradmom.keras.GradMoments(tmp_path)])

    writer = tf.summary.create_file_writer(str(tmp_path / "w"))

    def logged(**kwargs):
        @tf.function
        def f(x):
            loss = tf.reduce_mean(tf.square(x * v))
            with writer.as_default(step=0):
                return gradmom.summary.moments(loss, [v], **kwargs)

        return f(tf.ones([3, 2]))

    with pytest.raises(ValueError, match="step must fit in a signed 64-bit"):
        logged(step=2**70)
    for lr in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="learning_rate must be a finite positive"):
            logged(learning_rate=lr)
    with pytest.raises(TypeError, match="per_variable_scalars must be True or False"):
        logged(per_variable_scalars="yes")
    with pytest.raises(ValueError, match="name has 5000 characters"):
        logged(name="x" * 5000)


def test_a_batch_captured_by_the_function_gets_a_hint():
    v = tf.Variable(tf.ones([2]))
    x = tf.ones([3, 2])

    @tf.function
    def f():
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(x * v), axis=1))
        return gradmom.gradients_and_moments(loss, [v])

    with pytest.raises(gradmom.PerExampleLossError, match="pass the batch as an argument"):
        f()


def test_calls_whose_tags_coincide_are_refused_not_mixed(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    keras.utils.set_random_seed(0)
    disc = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="dense")])
    gen = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, name="dense")])

    def loss_of(model, x):
        return tf.reduce_mean(tf.reduce_sum(tf.square(model(x)), axis=1))

    @tf.function
    def twice(x):
        with writer.as_default(step=0):
            gradmom.summary.moments(loss_of(disc, x), disc.trainable_variables)
            gradmom.summary.moments(loss_of(disc, x), disc.trainable_variables)

    with pytest.raises(ValueError, match="logged twice in one step"):
        twice(tf.ones([4, 3]))

    @tf.function
    def same_name(x):
        with writer.as_default(step=0):
            gradmom.summary.moments(loss_of(disc, x), disc.trainable_variables, name="x")
            gradmom.summary.moments(loss_of(gen, x), gen.trainable_variables, name="x")

    with pytest.raises(ValueError, match=r"already logged on this summary writer.*distinct name"):
        same_name(tf.ones([4, 3]))

    other = tf.summary.create_file_writer(str(tmp_path / "ok"))

    @tf.function
    def once(x):  # traced twice (two shapes): the same call, no collision
        with other.as_default(step=0):
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(disc(x)), axis=1))
            return gradmom.summary.moments(loss, disc.trainable_variables, name="d")

    once(tf.ones([4, 3]))
    once(tf.ones([5, 3]))


def test_coupled_rules_keeps_the_rules_before_a_training_batch_norm():
    keras.utils.set_random_seed(5)
    dense = keras.layers.Dense(4, name="first")
    bn = keras.layers.BatchNormalization()
    head = keras.layers.Dense(2)
    x = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")

    def forward(t):
        return head(tf.nn.relu(bn(dense(t), training=True)))

    forward(x)
    variables = dense.trainable_variables

    texts = []

    def step(t, coupled):
        moments, dz = tf.function(lambda t: _bn_step(t, coupled))(t)
        return texts[-1], moments, dz

    def _bn_step(t, coupled):
        z = dense(t)
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(head(tf.nn.relu(bn(z, training=True)))), 1))
        plan = gradmom.plan_moments(loss, variables, coupled=coupled)
        _, moments = gradmom.gradients_and_moments(loss, variables, coupled=coupled)
        dz = tf.gradients(loss, z)[0]
        texts.append(str(plan))
        return moments, dz

    with pytest.warns(UserWarning, match=r"coupled between the uses of .*first.*coupled='rules'"):
        text, moments, dz = step(x, "rules")
    assert "rule: MatMul" in text
    # the rules' split: example j's share of the batch gradient, a_j (n dL/dz_j)^T
    share = np.einsum("ni,no->nio", x, 6 * dz.numpy())
    np.testing.assert_allclose(moments[0][1].numpy(), share.mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(moments[0][2].numpy(), (share**2).mean(0), rtol=1e-5, atol=1e-7)
    exact_text, _, _ = step(x, "exact")
    assert "fallback" in exact_text
    with pytest.raises(ValueError, match="coupled must be 'exact'.*or 'rules'"):
        step(x, "nope")


def test_per_example_norms_take_coupled_like_the_moments():
    keras.utils.set_random_seed(5)
    dense, bn, head = (
        keras.layers.Dense(4),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(2),
    )
    x = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    head(tf.nn.relu(bn(dense(x), training=True)))

    @tf.function
    def norms(t):
        z = dense(t)
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(head(tf.nn.relu(bn(z, training=True)))), 1))
        _, sq = gradmom.per_example_norms(loss, dense.trainable_variables[:1], coupled="rules")
        return sq[0], tf.gradients(loss, z)[0]

    with pytest.warns(UserWarning, match="coupled='rules'"):
        sq, dz = norms(x)
    share = np.einsum("ni,no->nio", x, 6 * dz.numpy())  # each example's share, as the rules
    np.testing.assert_allclose(sq.numpy(), (share**2).sum((1, 2)), rtol=1e-5)


def _zoo_family_params():
    """One in-process zoo entry per family (the first), for the callback path."""
    from tests import zoo

    first: dict[str, object] = {}
    for e in zoo.selected():
        if not e.isolate and e.family not in first:
            first[e.family] = e
    return [pytest.param(e, id=e.id) for e in first.values()]


@pytest.mark.slow
@pytest.mark.parametrize("entry", _zoo_family_params())
def test_zoo_families_log_through_the_callback_what_the_core_computes(entry, tmp_path):
    """One zoo entry per family trained 3 steps by ``model.fit`` with the `GradMoments`
    callback (a ``train_step`` with `gradmom.GradientTape`, float64 data from a ``tf.data``
    pipeline so Keras casts nothing), logged at steps 0 and 2; read back with
    `gradmom.data.load`, each logged step holds the moments `gradients_and_moments` computes
    at the weights that step started from (which `tests/test_zoo.py` checks against one
    gradient per example)."""
    import contextlib

    from tests import zoo

    inside = zoo.float64_inside() if entry.float32_inside else contextlib.nullcontext()
    with inside:
        forward, variables, (x, y), loss_spec = entry.build("float64")
        if isinstance(loss_spec, zoo.ScalarLoss):
            scalar = loss_spec.scalar
        else:

            def scalar(out, t):
                return tf.reduce_mean(loss_spec(out, t))

        class ZooFit(keras.Model):
            def train_step(self, data):
                bx, by = data
                with gradmom.GradientTape() as tape:
                    loss = scalar(forward(bx), by)
                grads = tape.gradient(loss, variables)
                for v, g in zip(variables, grads):
                    if g is not None:
                        v.assign_sub(1e-3 * tf.cast(tf.convert_to_tensor(g), v.dtype))
                return {"loss": loss}

        model = ZooFit()
        model.compile(optimizer=keras.optimizers.SGD(1e-3))
        weights: list = []

        class Keep(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                weights.append([np.array(v.numpy()) for v in variables])

        ds = tf.data.Dataset.from_tensors((x, y)).repeat(3)
        cb = gradmom.keras.GradMoments(
            tmp_path, every_n_steps=2, fallback=entry.fallback, max_elements=1 << 30
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(ds, epochs=1, verbose=0, callbacks=[Keep(), cb])

            @tf.function
            def core(x, y):
                loss = scalar(forward(x), y)
                return gradmom.gradients_and_moments(loss, variables, fallback=entry.fallback)[1]

            want = {}
            for step in (0, 2):
                for v, value in zip(variables, weights[step]):
                    v.assign(value)
                want[step] = core(x, y)
    assert len(weights) == 3
    # the steps trained: step 2's moments are of other weights than step 0's
    assert any(not np.array_equal(a, b) for a, b in zip(weights[0], weights[2]))
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(variables)
    for step, moments in want.items():
        scale = max(float(np.max(np.abs(m[2].numpy()))) for m in moments)
        for tag, m in zip(tags, moments):
            rec = next(r for r in run[tag] if r.step == step)
            assert rec.batch_size == len(tf.nest.flatten(x)[0]), tag
            for p in (1, 2):
                want_p = m[p].numpy().astype(np.float64)
                tol = 1e-6 * max(float(np.max(np.abs(want_p))), 1e-30) + 1e-12 * scale
                np.testing.assert_allclose(
                    rec.moments[p], want_p, rtol=1e-6, atol=tol, err_msg=f"{tag} step {step}"
                )
    assert sorted({r.step for r in run[tags[0]]}) == [0, 2]


def _application_fit_params():
    from tests import zoo_worker

    return [pytest.param(i, id=i) for i in zoo_worker.FIT_MEMBERS]


@pytest.fixture(scope="module")
def application_fits(request):
    """Futures of the `zoo_worker.fit_through_callback` child processes of the members
    selected in this session, ``GRADMOM_ZOO_JOBS`` (default 2) at a time, started together
    when the first is reached."""
    import concurrent.futures
    import os

    from tests import zoo_worker

    selected = [
        item.callspec.params["entry_id"]
        for item in request.session.items
        if "entry_id" in getattr(getattr(item, "callspec", None), "params", {})
        and item.originalname
        == "test_applications_train_unchanged_through_fit_and_log_what_the_core_computes"
    ]
    jobs = int(os.environ.get("GRADMOM_ZOO_JOBS", "2"))
    pool = concurrent.futures.ThreadPoolExecutor(max(1, jobs))
    futures = {i: pool.submit(zoo_worker.run_in_subprocess, i, None, True) for i in selected}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry_id", _application_fit_params())
def test_applications_train_unchanged_through_fit_and_log_what_the_core_computes(
    entry_id, application_fits
):
    """One ``keras.applications`` member per architecture family (`zoo_worker.FIT_MEMBERS`),
    float64, in a child process of its own (`zoo_worker.fit_through_callback`, two at a time:
    `application_fits`): 3 steps of ``model.fit`` with Keras' own ``train_step``
    (``training=True``: batch statistics, drop connect and dropout live), without and with
    `GradMoments` from the same state. Training is bit-identical (loss history, every weight
    and optimizer variable); the moments logged at steps 0 and 2, read
    back with `gradmom.data.load`, equal `gradients_and_moments` at the state each step started
    from; the smallest member's step 0 also equals one gradient per example (rows of the
    jacobian of the batch's per-example losses)."""
    from tests import zoo_worker

    future = application_fits.get(entry_id)
    result = future.result() if future else zoo_worker.run_in_subprocess(entry_id, fit=True)
    if result.get("error"):
        err = result["error"]
        raise AssertionError(
            f"{entry_id}: {err['type']}: {err['first_line']}\n{err.get('traceback', '')}"
        )
    assert not result["failures"], f"{entry_id}: " + "; ".join(result["failures"][:20])
    assert result["logged"] == [0, 2]
    assert result["variables"] > 50  # every variable of the application compared
    if entry_id == zoo_worker.FIT_BRUTE:
        assert result["brute"] is not None and result["brute"] <= zoo_worker.FIT_TOLERANCE
