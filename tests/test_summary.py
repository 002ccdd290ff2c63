"""gradmom.summary.moments: event files read back by TensorBoard's own readers equal brute force."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

import tb_gradmom as gradmom
from tb_gradmom import metadata
from tests import reference
from tests.cases import sparse_ce


def _model():
    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(40, activation="tanh", name="wide"),
            keras.layers.Dense(3, name="out"),
        ],
        name="net",
    )


def _data(n=8):
    rng = np.random.default_rng(1)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, size=n)


def _accumulator(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def _tensor(acc, tag, step):
    events = [e for e in acc.Tensors(tag) if e.step == step]
    assert len(events) == 1, f"{tag} at step {step}: {len(events)} events"
    array = tensor_util.make_ndarray(events[0].tensor_proto)
    content = acc.SummaryMetadata(tag).plugin_data.content
    parsed = metadata.parse_plugin_content(content) if content else None
    if isinstance(parsed, metadata.MomentsContent):
        # the moments as the format decodes them ([k, *stored_shape], any encoding)
        decoded = metadata.decode_moments(parsed, array)
        return np.stack([decoded[p] for p in parsed.orders])
    return array


def _write_steps(logdir, steps, record, **kwargs):
    model = _model()
    x, y = _data()
    writer = tf.summary.create_file_writer(str(logdir))

    @tf.function
    def step_fn(x, y, step):
        loss = tf.reduce_mean(sparse_ce(model(x), y))
        with writer.as_default(step=step), tf.summary.record_if(record(step)):
            grads = gradmom.summary.moments(loss, model.trainable_variables, **kwargs)
        return grads, loss

    outs = [step_fn(x, y, tf.constant(s, tf.int64)) for s in steps]
    writer.close()
    return model, x, y, outs


def test_round_trip_equals_brute_force_through_event_accumulator(tmp_path):
    model, x, y, outs = _write_steps(
        tmp_path, [0], lambda s: True, orders=(1, 2, 3), max_elements=60, learning_rate=0.1
    )
    per_ex = reference.per_example_gradients(model, model.trainable_variables, sparse_ce, x, y)
    acc = _accumulator(tmp_path)
    loss = float(outs[0][1])
    tags = gradmom.summary.tag_names(model.trainable_variables)
    for v, g, tag in zip(model.trainable_variables, per_ex, tags):
        want = reference.moments(g, (1, 2, 3))
        md = acc.SummaryMetadata(tag)
        assert md.plugin_data.plugin_name == "gradmom"
        assert md.data_class == metadata.summary_pb2.DATA_CLASS_TENSOR
        content = metadata.parse_plugin_content(md.plugin_data.content)
        assert content.orders == (1, 2, 3)
        assert content.shape == tuple(v.shape)
        logged = _tensor(acc, tag, 0)
        if content.pooled:  # the 5x40 kernel: 200 elements > 60
            rows, cols = metadata.to_2d_shape(v.shape)
            br, bc = content.block
            for k, p in enumerate((1, 2, 3)):
                grid = want[p].reshape(rows, cols)
                expect = np.array(
                    [
                        [grid[i : i + br, j : j + bc].mean() for j in range(0, cols, bc)]
                        for i in range(0, rows, br)
                    ]
                )
                np.testing.assert_allclose(logged[k], expect, rtol=2e-4, atol=1e-9)
        else:
            for k, p in enumerate((1, 2, 3)):
                np.testing.assert_allclose(logged[k], want[p], rtol=2e-4, atol=1e-9)
        # The exact sums, from brute force in float64.
        stats = _tensor(acc, tag + "/_stats", 0)
        fields = dict(zip(metadata.STATS_FIELDS, stats[: len(metadata.STATS_FIELDS)]))
        n = g.shape[0]
        s2 = np.var(g.astype(np.float64), axis=0, ddof=1)
        m1 = g.astype(np.float64).mean(0)
        assert fields["batch_size"] == n
        assert fields["num_elements"] == v.shape.num_elements()
        np.testing.assert_allclose(fields["sum_m2"], np.sum(m1**2), rtol=1e-4)
        np.testing.assert_allclose(fields["sum_var"], np.sum(s2), rtol=1e-4)
        pos = s2 > 1e-30
        np.testing.assert_allclose(fields["sum_gsnr"], np.sum(m1[pos] ** 2 / s2[pos]), rtol=1e-3)
        np.testing.assert_allclose(fields["loss"], loss, rtol=1e-6)
        np.testing.assert_allclose(fields["learning_rate"], 0.1, rtol=1e-6)
        hist = stats[len(metadata.WRITER_STATS_FIELDS) :]
        assert hist.sum() == v.shape.num_elements()
        want_hist = np.bincount(
            np.searchsorted(np.asarray(metadata.HIST_EDGES), s2.ravel(), side="right"),
            minlength=metadata.NUM_HIST_BUCKETS,
        )
        # Bucket boundaries can differ by one for values within float32 rounding of an edge.
        assert np.abs(hist - want_hist).sum() <= 2
        # The derived statistics also land as scalars (Scalars dashboard).
        ns = _tensor(acc, f"gradmom/{tag}/noise_scale", 0)
        gnorm = np.sum(m1**2) - np.sum(s2) / n
        np.testing.assert_allclose(ns, np.sum(s2) / gnorm, rtol=2e-3)
    model_stats = _tensor(acc, "_model/_stats", 0)
    total = sum(v.shape.num_elements() for v in model.trainable_variables)
    assert model_stats[1] == total
    scalar_md = acc.SummaryMetadata("gradmom/_model/noise_scale")
    assert scalar_md.plugin_data.plugin_name == "scalars"


def test_gradients_returned_equal_plain_gradients(tmp_path):
    model, x, y, outs = _write_steps(tmp_path, [0], lambda s: True)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(sparse_ce(model(x), y))
    plain = tape.gradient(loss, model.trainable_variables)
    for a, b in zip(outs[0][0], plain):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-8)


def test_record_if_skips_steps(tmp_path):
    _write_steps(tmp_path, range(5), lambda s: s % 2 == 0)
    acc = _accumulator(tmp_path)
    for tag in ("wide/kernel", "out/bias/_stats", "_model/_stats"):
        assert [e.step for e in acc.Tensors(tag)] == [0, 2, 4]


def test_skipped_steps_run_no_moment_ops(tmp_path):
    """The moment ops sit behind the record condition: a failing check inside them never fires."""
    w = tf.Variable(tf.ones([3, 2]), name="k")
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([], tf.bool)])
    def step(x, record):
        per_example = tf.reduce_sum(tf.matmul(x, w), axis=1)
        with writer.as_default(step=0), tf.summary.record_if(record):
            # batch_size=5 disagrees with the 4 rows: the check only runs with the moments.
            grads = gradmom.summary.moments(per_example, [w], batch_size=5)
        return grads[0]

    g = step(tf.ones([4, 3]), tf.constant(False))
    np.testing.assert_allclose(g.numpy(), np.ones([3, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch size mismatch"):
        step(tf.ones([4, 3]), tf.constant(True))


def test_skipped_steps_run_no_fallback_ops(tmp_path):
    """The exact fallback's per-example gradients live outside the cond (a gradient cannot be
    taken inside a branch) and are gated by dead tensors: a check that only its backward pass
    contains never fires on a skipped step, and fires on a recorded one."""
    w = tf.Variable(tf.ones([3]), name="k")
    calls = []
    step_graphs = []

    @tf.custom_gradient
    def custom(v):
        def grad(dy):
            if dy.graph is not step_graphs[-1]:
                # gradmom traces a custom gradient's backward on its own, in a graph of its
                # own, to prove it per example (tb_gradmom.core.couplings): not a backward pass
                return dy
            calls.append(1)
            if len(calls) == 1:  # the step's own backward pass
                return dy
            # the fallback's vectorised backward pass, built second
            check = tf.debugging.Assert(tf.reduce_any(dy > 1e30), ["the fallback ran"])
            with tf.control_dependencies([check]):
                return tf.identity(dy)

        return tf.identity(v), grad

    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(input_signature=[tf.TensorSpec([4, 3]), tf.TensorSpec([], tf.bool)])
    def step(x, record):
        step_graphs.append(tf.compat.v1.get_default_graph())
        # a fused batch norm (several outputs) has no rule: 'k' takes the exact fallback
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            tf.reshape(x, [4, 1, 1, 3]),
            w,
            tf.zeros([3]),
            mean=tf.zeros([3]),
            variance=tf.ones([3]),
            epsilon=0.0,
            is_training=False,
        )
        loss = tf.reduce_mean(tf.reduce_sum(custom(y), axis=[1, 2, 3]))
        with writer.as_default(step=0), tf.summary.record_if(record):
            with pytest.warns(UserWarning, match="no exact rule for 'k'"):
                grads = gradmom.summary.moments(loss, [w])
        return grads[0]

    g = step(tf.ones([4, 3]), tf.constant(False))
    assert len(calls) == 2  # the fallback's backward was built
    np.testing.assert_allclose(g.numpy(), np.ones([3]), rtol=1e-6)  # d mean(x w) / dw, x = 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="the fallback ran"):
        step(tf.ones([4, 3]), tf.constant(True))


def test_no_writer_builds_no_moment_ops():
    w = tf.Variable(tf.ones([3, 2]))

    @tf.function
    def step(x):
        loss = tf.reduce_mean(tf.reduce_sum(tf.matmul(x, w), axis=1))
        return gradmom.summary.moments(loss, [w])

    graph = step.get_concrete_function(tf.ones([4, 3])).graph
    types = {op.type for op in graph.get_operations()}
    assert "If" not in types and "StatelessIf" not in types and "WriteSummary" not in types


def test_log_only_subset_and_errors(tmp_path):
    model = _model()
    x, y = _data()
    writer = tf.summary.create_file_writer(str(tmp_path))
    wide_kernel = model.trainable_variables[0]

    @tf.function
    def step_fn(x, y):
        loss = tf.reduce_mean(sparse_ce(model(x), y))
        with writer.as_default(step=0):
            return gradmom.summary.moments(loss, model.trainable_variables, log_only=[wide_kernel])

    grads = step_fn(x, y)
    writer.close()
    assert all(g is not None for g in grads)
    tags = set(_accumulator(tmp_path).Tags()["tensors"])
    assert "wide/kernel" in tags and "out/kernel" not in tags

    @tf.function
    def bad(x, y):
        loss = tf.reduce_mean(sparse_ce(model(x), y))
        with writer.as_default(step=0):
            return gradmom.summary.moments(
                loss, model.trainable_variables[1:], log_only=[wide_kernel]
            )

    with pytest.raises(ValueError, match=r"log_only holds 'net/wide/kernel'.*not in var_list"):
        bad(x, y)


def test_missing_step_is_a_clear_error(tmp_path):
    w = tf.Variable(tf.ones([3, 2]))
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x):
        loss = tf.reduce_mean(tf.reduce_sum(tf.matmul(x, w), axis=1))
        with writer.as_default():
            return gradmom.summary.moments(loss, [w])

    tf.summary.experimental.set_step(None)
    with pytest.raises(ValueError, match=r"needs a step: pass step="):
        step(tf.ones([4, 3]))


def test_tf1_graph_returns_merged_summary(tmp_path):
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(6, 4))
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=rng.normal(size=(4, 2)), use_resource=True)
        x = tf.compat.v1.placeholder(tf.float64, [None, 4])
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(tf.matmul(x, w)), axis=1))
        summary_op = gradmom.summary.moments(loss, [w])
        assert summary_op.dtype == tf.string
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            serialized = sess.run(summary_op, {x: x_np})
            w_np = sess.run(w)
        fw = tf.compat.v1.summary.FileWriter(str(tmp_path))
        fw.add_summary(serialized, global_step=3)
        fw.close()
    acc = _accumulator(tmp_path)
    logged = _tensor(acc, "w", 3)
    # per-example gradient of sum((x w)^2) wrt w: 2 x_j (x_j w)^T
    g = np.einsum("ni,no->nio", x_np, 2 * (x_np @ w_np))
    np.testing.assert_allclose(logged[0], g.mean(0), rtol=1e-5)
    np.testing.assert_allclose(logged[1], (g**2).mean(0), rtol=1e-5)


def test_summary_arguments_are_checked_naming_the_argument(tmp_path):
    w = tf.Variable(tf.ones([3, 2]))
    writer = tf.summary.create_file_writer(str(tmp_path))

    def run(**kw):
        @tf.function
        def step(x):
            loss = tf.reduce_mean(tf.reduce_sum(tf.matmul(x, w), axis=1))
            with writer.as_default(step=0):
                return gradmom.summary.moments(loss, [w], **kw)

        return step(tf.ones([4, 3]))

    with pytest.raises(TypeError, match=r"step must be an integer.*1\.5"):
        run(step=1.5)
    with pytest.raises(TypeError, match=r"learning_rate must be a number.*'0\.1'"):
        run(learning_rate="0.1")
    with pytest.raises(TypeError, match=r"max_elements must be a positive integer.*10\.5"):
        run(max_elements=10.5)


def _gan(logdir, names=(None, None)):
    """A GAN-style step: the discriminator's and the generator's moments logged by two calls on
    one writer, at the same steps (``names``: the calls' ``name=``)."""
    keras.utils.set_random_seed(3)
    disc = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)]
    )
    gen = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="g_out")])
    rng = np.random.default_rng(5)
    real = rng.normal(size=(6, 4)).astype("float32")
    noise = rng.normal(size=(6, 3)).astype("float32")
    writer = tf.summary.create_file_writer(str(logdir))

    @tf.function
    def step_fn(real, noise, step):
        with writer.as_default(step=step):
            d_loss = tf.reduce_mean(
                tf.nn.softplus(-disc(real)[:, 0]) + tf.nn.softplus(disc(gen(noise))[:, 0])
            )
            gradmom.summary.moments(d_loss, disc.trainable_variables, name=names[0])
            g_loss = tf.reduce_mean(tf.nn.softplus(-disc(gen(noise))[:, 0]))
            gradmom.summary.moments(g_loss, gen.trainable_variables, name=names[1])

    for s in range(3):
        step_fn(real, noise, tf.constant(s, tf.int64))
    writer.close()
    return disc, gen, real, noise


def test_two_calls_per_step_keep_their_data_apart(tmp_path):
    """A discriminator and a generator logged on one writer at every step: by default the
    second call's tags (its model statistics included) go under ``moments_1/`` with a warning,
    nothing is mixed or lost, and each model row equals its own call's variables."""
    from tb_gradmom.analysis import data

    with pytest.warns(UserWarning, match="moments_1/"):
        disc, gen, real, noise = _gan(tmp_path)
    run = data.load(tmp_path)["."]
    d_tags = gradmom.summary.tag_names(disc.trainable_variables)
    g_tags = [f"moments_1/{t}" for t in gradmom.summary.tag_names(gen.trainable_variables)]
    assert set(run) == set(d_tags) | set(g_tags) | {"_model", "moments_1/_model"}
    for tag in run:
        assert [r.step for r in run[tag]] == [0, 1, 2], tag
    # Each group's model statistics sum over its own variables only.
    for model_tag, tags in (("_model", d_tags), ("moments_1/_model", g_tags)):
        for s in range(3):
            want = sum(float(np.sum(run[t][s].moments[1].astype(np.float64) ** 2)) for t in tags)
            got = run[model_tag][s].stats["sum_m2"]
            assert got == pytest.approx(want, rel=1e-5), (model_tag, s)
    # The generator's moments are its own brute-force ones.
    x_noise = noise

    def g_forward(z):
        return disc(gen(z))[:, 0]

    per_ex = reference.per_example_gradients(
        g_forward,
        gen.trainable_variables,
        lambda out, _y: tf.nn.softplus(-out),
        x_noise,
        np.zeros(len(x_noise)),
    )
    for tag, g in zip(g_tags, per_ex):
        want = reference.moments(g, (1, 2))
        np.testing.assert_allclose(run[tag][0].moments[2], want[2], rtol=1e-4, atol=1e-9)


def test_named_calls_and_bad_names(tmp_path):
    from tb_gradmom.analysis import data

    _gan(tmp_path, names=("discriminator", "generator"))
    run = data.load(tmp_path)["."]
    assert {"discriminator/_model", "generator/_model", "generator/g_out/kernel"} <= set(run)
    assert not any(t.startswith("moments_") for t in run)
    for bad in ("", "a b", "x/_model", "../up", 3):
        with pytest.raises(ValueError, match="name="):
            gradmom.summary.tag_names([tf.Variable(1.0)], name=bad)


def test_tags_leave_out_the_model_name(tmp_path):
    """Keras numbers automatic model names per process; the tags do not depend on them."""
    first = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="head")])
    second = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="head")])
    assert first.trainable_variables[0].path != second.trainable_variables[0].path
    assert gradmom.summary.tag_names(first.trainable_variables) == ["head/kernel", "head/bias"]
    assert gradmom.summary.tag_names(second.trainable_variables) == ["head/kernel", "head/bias"]
    # Variables without a common model name keep their paths.
    a, b = tf.Variable(1.0, name="a"), tf.Variable(2.0, name="b")
    assert gradmom.summary.tag_names([a, b]) == ["a", "b"]


def test_variance_histogram_equals_numpy_searchsorted():
    """The variance histogram (buckets from a log, a binary search only near an edge) equals
    numpy's ``bincount(searchsorted(HIST_EDGES, s2, side="right"))`` exactly, values at and
    next to every edge included; values that are not finite are left out."""
    from tb_gradmom.writers import summary

    edges = np.asarray(metadata.HIST_EDGES, np.float64)
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            edges,
            np.nextafter(edges, 0.0),
            np.nextafter(edges, np.inf),
            10.0 ** rng.uniform(-30, 12, size=20000),
            [0.0, 0.0, 5e-324, 1e-300, 1e300, np.finfo(np.float64).max],
        ]
    )
    nb = metadata.NUM_HIST_BUCKETS
    want = np.bincount(np.searchsorted(edges, values, side="right"), minlength=nb)
    got = summary._histogram(tf.constant(values)).numpy()
    np.testing.assert_array_equal(got, want)
    odd = np.concatenate([values[:50], [np.nan, np.inf, -np.inf]])
    got = summary._histogram(tf.constant(odd)).numpy()
    want = np.bincount(np.searchsorted(edges, values[:50], side="right"), minlength=nb)
    np.testing.assert_array_equal(got, want)


def test_logging_goes_on_when_tensorflow_hides_the_default_writer(tmp_path, monkeypatch):
    """On a TensorFlow without the private summary state, the default groups count the calls on
    every writer together (a warning says so and suggests name=); nothing is lost."""
    from tb_gradmom._compat import PrivateAPIError, tf_private
    from tb_gradmom.analysis import data
    from tb_gradmom.writers import summary

    def missing():
        raise PrivateAPIError("summary_ops_v2._summary_state", "tensorflow", "writer lookup")

    monkeypatch.setattr(tf_private, "default_summary_writer", missing)
    monkeypatch.setattr(summary._current_writer, "warned", False, raising=False)
    with pytest.warns(UserWarning, match="cannot tell summary writers apart.*name="):
        disc, gen, _, _ = _gan(tmp_path)
    run = data.load(tmp_path)["."]
    d_tags = gradmom.summary.tag_names(disc.trainable_variables)
    g_tags = [f"moments_1/{t}" for t in gradmom.summary.tag_names(gen.trainable_variables)]
    assert set(run) == set(d_tags) | set(g_tags) | {"_model", "moments_1/_model"}
    assert all([r.step for r in run[t]] == [0, 1, 2] for t in run)


@pytest.mark.parametrize("kind", ["conv2d", "conv1d", "conv3d"])
def test_conv_gradients_come_from_the_cond_exact_on_both_sides(kind, tmp_path):
    """Convolution filters take their gradient inside the record cond (from the moments' sums
    when logging, from TensorFlow's filter gradient otherwise): equal to tf.gradients on both
    sides, and the logged moments equal `gradients_and_moments`'."""
    keras.utils.set_random_seed(3)
    if kind == "conv2d":
        shape = (9, 9, 3)
        convs = [
            keras.layers.Conv2D(4, 3, strides=2, padding="same", name="c1"),
            keras.layers.DepthwiseConv2D(3, padding="valid", name="dw"),
        ]
    elif kind == "conv1d":
        shape = (12, 3)
        convs = [keras.layers.Conv1D(5, 3, padding="causal", name="c1")]
    else:
        shape = (5, 5, 5, 2)
        convs = [keras.layers.Conv3D(3, 2, name="c1")]
    model = keras.Sequential(
        [keras.Input(shape), *convs, keras.layers.Flatten(), keras.layers.Dense(3, name="out")]
    )
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, *shape)).astype("float32")
    y = rng.integers(0, 3, size=6)
    variables = model.trainable_variables
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y, record):
        loss = tf.reduce_mean(sparse_ce(model(x), y))
        want = tf.gradients(loss, variables)
        _, moms = gradmom.gradients_and_moments(loss, variables)
        with writer.as_default(step=tf.cast(record, tf.int64)), tf.summary.record_if(record):
            got = gradmom.summary.moments(loss, variables, exact_gradients=False)
        return want, got, moms

    for record in (False, True):
        want, got, moms = step(x, y, tf.constant(record))
        for w, g, v in zip(want, got, variables):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=v.path)
    writer.close()
    acc = _accumulator(tmp_path)
    tags = gradmom.summary.tag_names(variables)
    for tag, m in zip(tags, moms):
        logged = _tensor(acc, tag, 1)
        for k, p in enumerate((1, 2)):
            np.testing.assert_allclose(logged[k], m[p].numpy(), rtol=1e-5, atol=1e-7, err_msg=tag)
