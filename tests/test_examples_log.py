"""Logged per-example squared gradient norms (tag ``_examples``) against brute force.

Each test writes real event files (`summary.moments`, `gradmom.GradientTape`, the Keras callback)
in float64 and reads them back with `data.load(examples=True)` and with TensorBoard's own
`EventAccumulator`; the reference is one `tf.GradientTape` gradient per example (numpy norms).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import tb_gradmom as gradmom
from tb_gradmom import metadata
from tb_gradmom.analysis import data
from tests import reference

TOL = 1e-12


def _model():
    keras.utils.set_random_seed(5)
    inp = keras.Input((5,), dtype="float64")
    h = keras.layers.Dense(7, activation="tanh", dtype="float64", name="hidden")(inp)
    h = keras.layers.Dense(6, activation="relu", dtype="float64", name="mid")(h)
    return keras.Model(inp, keras.layers.Dense(3, dtype="float64", name="out")(h))


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, size=n)


def _per_example_loss(logits, y):
    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


def _brute(model, x, y):
    """(per-variable [n] squared norms, [n] losses) from one gradient per example."""
    per_ex = reference.per_example_gradients(
        model, model.trainable_variables, _per_example_loss, x, y
    )
    norms = [np.sum(g.reshape(len(x), -1) ** 2, axis=1) for g in per_ex]
    losses = _per_example_loss(model(x), y).numpy()
    return norms, losses


def _layer_of(v):
    return v.path.rsplit("/", 1)[0].split("/", 1)[-1]


def _log(tmp_path, model, x, y, **kwargs):
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y, ids):
        with writer.as_default(step=3):
            loss = tf.reduce_mean(_per_example_loss(model(x), y))
            extra = {} if ids is None else {"example_ids": ids}
            return gradmom.summary.moments(loss, model.trainable_variables, **extra, **kwargs)

    ids = kwargs.pop("ids", None)
    step(tf.constant(x), tf.constant(y), ids)
    writer.close()


def _check_rows(rec, model, norms, losses, ids=None):
    pos = rec.positions
    np.testing.assert_allclose(rec.model, sum(norms)[pos], rtol=TOL)
    np.testing.assert_allclose(rec.losses, losses[pos], rtol=1e-12)
    layers = {}
    for v, nv in zip(model.trainable_variables, norms):
        layers[_layer_of(v)] = layers.get(_layer_of(v), 0) + nv
    assert sorted(rec.layers) == sorted(layers)
    for name, want in layers.items():
        np.testing.assert_allclose(rec.layers[name], want[pos], rtol=TOL, err_msg=name)
    if ids is not None:
        np.testing.assert_array_equal(rec.ids, np.asarray(ids)[pos])


def test_logged_norms_equal_brute_force_with_ids(tmp_path):
    model = _model()
    x, y = _data(12)
    ids = np.arange(100, 112) * 7
    _log(tmp_path, model, x, y, ids=tf.constant(ids), per_variable_norms=True)
    norms, losses = _brute(model, x, y)

    recs = data.load(tmp_path, examples=True)["."]["_examples"]
    assert [r.step for r in recs] == [3]
    rec = recs[0]
    assert rec.batch_size == 12 and list(rec.positions) == list(range(12))
    _check_rows(rec, model, norms, losses, ids)
    tags = gradmom.summary.tag_names(model.trainable_variables)
    for tag, nv in zip(tags, norms):
        np.testing.assert_allclose(rec.variables[tag], nv, rtol=TOL, err_msg=tag)
    # the moments are logged beside them as before
    assert "hidden/kernel" in data.load(tmp_path)["."]

    # TensorBoard's own reader sees the same tensors, under their own plugin name
    acc = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    assert "_examples" in acc.Tags()["tensors"]
    table = tf.make_ndarray(acc.Tensors("_examples")[0].tensor_proto)
    content = metadata.parse_examples_content(acc.SummaryMetadata("_examples").plugin_data.content)
    assert acc.SummaryMetadata("_examples").plugin_data.plugin_name == "gradmom_examples"
    col = {c: table[:, i] for i, c in enumerate(content.columns)}
    np.testing.assert_allclose(col["model"], sum(norms), rtol=TOL)
    np.testing.assert_array_equal(
        tf.make_ndarray(acc.Tensors("_examples/ids")[0].tensor_proto), ids
    )


def test_cap_keeps_the_largest_and_smallest_norms_with_their_ids(tmp_path):
    model = _model()
    n, cap = 40, 12
    x, y = _data(n, seed=1)
    ids = np.array([f"key-{j}" for j in range(n)])
    _log(tmp_path, model, x, y, ids=tf.constant(ids), max_examples=cap)
    norms, losses = _brute(model, x, y)
    total = sum(norms)

    rec = data.load_examples(tmp_path)["."]["_examples"][0]
    assert rec.batch_size == n and len(rec.positions) == cap and rec.max_examples == cap
    assert list(rec.positions) == sorted(rec.positions)
    order = np.argsort(-total, kind="stable")
    kept = set(rec.positions.tolist())
    assert set(order[: cap // 4]) <= kept, "the largest norms are always kept"
    assert set(order[-(cap // 4) :]) <= kept, "the smallest norms are always kept"
    _check_rows(rec, model, norms, losses, ids)
    assert list(rec.ids) == [f"key-{j}" for j in rec.positions]


def test_keep_examples_matches_numpy_ranks():
    rng = np.random.default_rng(4)
    model = rng.exponential(size=101)
    for cap in (1, 4, 10, 101, 200):
        got = gradmom.summary.keep_examples(tf.constant(model), cap).numpy()
        if cap >= len(model):
            assert list(got) == list(range(len(model)))
            continue
        order = np.argsort(-model, kind="stable")
        k, mid, rest = cap // 4, cap - 2 * (cap // 4), len(model) - 2 * (cap // 4)
        want = list(order[:k]) + [order[k + i * rest // mid] for i in range(mid)]
        want += list(order[len(model) - k :])
        assert list(got) == sorted(want), cap


def test_nothing_is_computed_or_written_when_not_recording(tmp_path):
    model = _model()
    x, y = _data(6)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y, on):
        with writer.as_default(step=0), tf.summary.record_if(on):
            loss = tf.reduce_mean(_per_example_loss(model(x), y))
            return gradmom.summary.moments(loss, model.trainable_variables, log_examples=True)

    plain = tf.function(
        lambda x, y: tf.gradients(
            tf.reduce_mean(_per_example_loss(model(x), y)), model.trainable_variables
        )
    )
    for on in (False, True):
        got = step(tf.constant(x), tf.constant(y), tf.constant(on))
        for a, b in zip(got, plain(tf.constant(x), tf.constant(y))):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    writer.close()
    recs = data.load_examples(tmp_path)["."]["_examples"]
    assert [r.step for r in recs] == [0]  # only the recorded call wrote


def test_example_ids_errors():
    model = _model()
    x, y = _data(4)

    @tf.function
    def step(ids):
        loss = tf.reduce_mean(_per_example_loss(model(tf.constant(x)), tf.constant(y)))
        return gradmom.summary.moments(loss, model.trainable_variables, example_ids=ids, step=0)

    with pytest.raises(TypeError, match="example_ids must be a \\[n\\] tensor of integers"):
        step(tf.constant([0.5, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="example_ids must be a \\[n\\] vector"):
        step(tf.zeros([2, 2], tf.int64))


class WithIds(keras.Model):
    """A model whose train_step takes ``(x, y, ids)`` and logs the ids through the tape."""

    def __init__(self):
        super().__init__(dtype="float64")  # float64 inputs stay float64
        self.inner = _model()

    def call(self, x):
        return self.inner(x)

    def train_step(self, data):
        x, y, ids = data
        with gradmom.GradientTape(example_ids=ids) as tape:
            loss = tf.reduce_mean(_per_example_loss(self(x), y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_callback_logs_norms_with_ids_from_the_dataset(tmp_path):
    keras.utils.set_random_seed(2)
    model = WithIds()
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    model(np.zeros((1, 5)))
    x, y = _data(24, seed=3)
    ids = np.arange(24) + 1000
    ds = tf.data.Dataset.from_tensor_slices((x, y, ids)).batch(8)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2, log_examples=True)
    model.fit(ds, epochs=1, verbose=0, callbacks=[cb])

    recs = data.load(tmp_path, examples=True)["."]["_examples"]
    assert [r.step for r in recs] == [0, 2]
    # step 0: the initial weights and the first batch
    fresh = _model()
    for v, value in zip(fresh.trainable_variables, initial):
        v.assign(value)
    norms, losses = _brute(fresh, x[:8], y[:8])
    _check_rows(recs[0], fresh, norms, losses, ids[:8])
    assert list(recs[1].ids) == list(ids[16:24])


@pytest.mark.parametrize("exact_gradients", [True, False])
def test_conv_and_fallback_norms_under_a_gate(tmp_path, exact_gradients):
    """A convolution (its gradient from the moments' sums with exact_gradients=False) and a
    variable on the exact fallback (the scale of a fused batch norm, which has no rule: its
    norms are taken outside the cond, under the gate), logged on one step of two. float32
    (the fused batch norm has no float64 kernel): 1e-4 relative."""
    rng = np.random.default_rng(7)
    kernel = tf.Variable(rng.normal(size=(3, 5, 4)).astype("float32"), name="conv_k")
    scale = tf.Variable(rng.normal(size=(4,)).astype("float32"), name="bn_scale")
    weight = tf.Variable(rng.normal(size=(16, 3)).astype("float32"), name="w")
    variables = [kernel, scale, weight]

    def forward(x):
        h = tf.tanh(tf.nn.conv1d(x, kernel, 1, "VALID"))
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(
            tf.reshape(h, [-1, 4, 1, 4]),
            scale,
            tf.zeros([4]),
            mean=tf.zeros([4]),
            variance=tf.ones([4]),
            epsilon=0.0,
            is_training=False,
        )
        return tf.reshape(h, [-1, 16]) @ weight

    x = rng.normal(size=(6, 6, 5)).astype("float32")
    y = rng.integers(0, 3, size=6)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y, s):
        with writer.as_default(step=s), tf.summary.record_if(s % 2 == 1):
            loss = tf.reduce_mean(_per_example_loss(forward(x), y))
            return gradmom.summary.moments(
                loss,
                variables,
                log_examples=True,
                per_variable_norms=True,
                exact_gradients=exact_gradients,
            )

    with pytest.warns(UserWarning, match="no exact rule for 'bn_scale"):
        for s in range(2):
            step(tf.constant(x), tf.constant(y), tf.constant(s, tf.int64))
    writer.close()
    per_ex = reference.per_example_gradients(forward, variables, _per_example_loss, x, y)
    norms = [np.sum(g.reshape(6, -1).astype(np.float64) ** 2, axis=1) for g in per_ex]
    recs = data.load_examples(tmp_path)["."]["_examples"]
    assert [r.step for r in recs] == [1]
    rec = recs[0]
    np.testing.assert_allclose(rec.model, sum(norms), rtol=1e-4)
    tags = gradmom.summary.tag_names(variables)
    for tag, want in zip(tags, norms):
        np.testing.assert_allclose(rec.variables[tag], want, rtol=1e-4, err_msg=tag)


def test_callback_with_gradient_accumulation_logs_every_micro_batch_example(tmp_path):
    """Keras' default train_step (the callback's copy with the tape), two micro-batches per
    update: the logged step holds the examples of both, positions over the two, each norm
    that of its example at the update's starting weights."""
    model = _model()
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, gradient_accumulation_steps=2),
        # float64 (a Keras loss computes in floatx, float32, by default)
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64"),
    )
    x, y = _data(16, seed=9)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2, log_examples=True)
    model.fit(ds, epochs=1, verbose=0, callbacks=[cb])

    recs = data.load_examples(tmp_path)["."]["_examples"]
    assert [r.step for r in recs] == [0]  # updates 0 and 1; logged: 0
    rec = recs[0]
    assert rec.batch_size == 8 and list(rec.positions) == list(range(8))
    fresh = _model()
    for v, value in zip(fresh.trainable_variables, initial):
        v.assign(value)
    norms, losses = _brute(fresh, x[:8], y[:8])
    _check_rows(rec, fresh, norms, losses)


def test_tf1_graph_merged_summary_holds_the_examples(tmp_path):
    """In a TF1 graph the merged summary op carries the examples tag, read back by
    `data.load_examples` from a ``FileWriter``'s file."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(6, 4))
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=rng.normal(size=(4, 2)), use_resource=True)
        x = tf.compat.v1.placeholder(tf.float64, [None, 4])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(tf.matmul(x, w)), axis=1))
        summary_op = gradmom.summary.moments(loss, [w], example_ids=ids)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            serialized = sess.run(summary_op, {x: x_np, ids: np.arange(6) + 50})
            w_np = sess.run(w)
        fw = tf.compat.v1.summary.FileWriter(str(tmp_path))
        fw.add_summary(serialized, global_step=3)
        fw.close()
    rec = data.load_examples(tmp_path)["."]["_examples"][0]
    # per-example gradient of sum((x w)^2) wrt w: 2 x_j (x_j w)^T
    g = np.einsum("ni,no->nio", x_np, 2 * (x_np @ w_np))
    np.testing.assert_allclose(rec.model, np.sum(g.reshape(6, -1) ** 2, 1), rtol=TOL)
    np.testing.assert_allclose(rec.losses, np.sum((x_np @ w_np) ** 2, 1), rtol=TOL)
    assert rec.step == 3 and list(rec.ids) == list(range(50, 56))


def test_log_examples_adds_no_op_outside_the_logged_branch(tmp_path):
    """Skipped steps cost nothing more with log_examples: the step's graph outside the
    ``cond`` holds the same ops with and without it (the norms live in the branch)."""
    model = _model()
    x, y = _data(6)
    writer = tf.summary.create_file_writer(str(tmp_path))

    def ops(**kw):
        @tf.function
        def step(x, y, on):
            with writer.as_default(step=0), tf.summary.record_if(on):
                loss = tf.reduce_mean(_per_example_loss(model(x), y))
                return gradmom.summary.moments(loss, model.trainable_variables, **kw)

        graph = step.get_concrete_function(tf.constant(x), tf.constant(y), tf.constant(True)).graph
        return sorted(op.type for op in graph.get_operations())

    assert ops(log_examples=True) == ops()
