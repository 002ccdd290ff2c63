"""MirroredStrategy over 2 logical CPU devices against one device on the same global batch.

Run by `tests/test_distribute.py` in a fresh process: logical devices must be configured
before TensorFlow initialises its devices, which the rest of the test session has done.

    python -m tests.distributed_check LOGDIR

Exits non-zero (an AssertionError with the variable and order) on any mismatch.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

# One strategy for the whole process: collective instance keys restart with each new strategy
# and would collide with the previous one's in the shared collective executor.
STRATEGY = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

import tb_gradmom as gradmom  # noqa: E402
from tb_gradmom.analysis import data  # noqa: E402
from tests import reference  # noqa: E402
from tests.cases import SinCell, sparse_ce  # noqa: E402

ORDERS = (1, 2, 3, 4)


def conv_net():
    return keras.Sequential(
        [
            keras.Input((5, 5, 2)),
            keras.layers.Conv2D(3, 3, activation="tanh", dtype="float64"),
            keras.layers.Flatten(dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )


def sin_rnn_net():  # the kernel through the exact fallback
    return keras.Sequential(
        [
            keras.Input((4, 3)),
            keras.layers.RNN(SinCell(3, dtype="float64"), dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )


def lstm_net():  # through the loop rule
    return keras.Sequential(
        [
            keras.Input((4, 3)),
            keras.layers.LSTM(3, dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )


def close(a, b, what, tol=1e-10):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.max(np.abs(b))), 1e-300)
    err = float(np.max(np.abs(a - b)))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} * {scale:.3g}"


def penalty(variables):
    """A weight penalty ``R``: part of every example's loss (``l_j + R`` for a mean,
    ``l_j + R / n`` for a sum)."""
    return 0.05 * tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables])


def run(build, x_shape, n, loss_kind):
    """``loss_kind``: "mean", "sum", "vector", or "mean+penalty"/"sum+penalty" (each replica
    adds its share ``R / replicas`` of a weight penalty)."""
    strategy = STRATEGY
    assert strategy.num_replicas_in_sync == 2
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(n, *x_shape))
    y = rng.integers(0, 3, size=n)
    with strategy.scope():
        model = build()
    variables = model.trainable_variables
    single = build()
    single.set_weights(model.get_weights())

    def per_example(x, y):
        return sparse_ce(model(x), y)

    @tf.function
    def dist_step(batch):
        def replica_fn(x, y):
            losses = per_example(x, y)
            if loss_kind == "vector":
                loss = losses
            elif loss_kind.startswith("sum"):
                loss = tf.reduce_sum(losses)
            else:
                loss = tf.nn.compute_average_loss(losses, global_batch_size=n)
            if loss_kind.endswith("+penalty"):
                loss += penalty(variables) / strategy.num_replicas_in_sync
            reduction = "sum" if loss_kind.startswith("sum") else "mean"
            _, moments = gradmom.gradients_and_moments(
                loss, variables, orders=ORDERS, reduction=reduction
            )
            return moments

        return strategy.run(replica_fn, args=batch)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(n)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    sizes = [int(t.shape[0]) for t in strategy.experimental_local_results(batch[0])]
    assert sum(sizes) == n and len(sizes) == 2, sizes
    per_replica = strategy.experimental_local_results(dist_step(batch))

    @tf.function
    def one_device(x, y):
        loss = tf.reduce_mean(sparse_ce(single(x), y))
        return gradmom.gradients_and_moments(loss, single.trainable_variables, orders=ORDERS)[1]

    want = one_device(tf.constant(x), tf.constant(y))
    loss_fn = sparse_ce
    if loss_kind.endswith("+penalty"):
        share = 1.0 if loss_kind.startswith("mean") else 1.0 / n

        def loss_fn(out, y):
            return sparse_ce(out, y) + share * penalty(single.trainable_variables)

    brute = reference.per_example_gradients(single, single.trainable_variables, loss_fn, x, y)
    for r, moments in enumerate(per_replica):
        for v, m, w, g in zip(variables, moments, want, brute):
            ref = reference.moments(g, ORDERS)
            for p in ORDERS:
                what = f"{build.__name__} {loss_kind} n={n} {sizes} replica {r} {v.path} M{p}"
                if not loss_kind.endswith("+penalty"):
                    close(m[p], w[p], what)
                close(m[p], ref[p], what + " (brute force)")
    print(f"ok {build.__name__} {loss_kind} n={n} split {sizes}")


def summary(logdir):
    """summary.moments inside strategy.run: replica 0 writes the global-batch moments once."""
    strategy = STRATEGY
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(6)
    n = 6
    x, y = rng.normal(size=(n, 5, 5, 2)), rng.integers(0, 3, size=n)
    with strategy.scope():
        model = conv_net()
    single = conv_net()
    single.set_weights(model.get_weights())
    writer = tf.summary.create_file_writer(logdir)

    @tf.function
    def step(batch, s):
        def replica_fn(x, y):
            loss = tf.nn.compute_average_loss(sparse_ce(model(x), y), global_batch_size=n)
            with writer.as_default(step=s), tf.summary.record_if(s % 2 == 0):
                return gradmom.summary.moments(loss, model.trainable_variables)

        return strategy.run(replica_fn, args=batch)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(n)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    for s in range(3):
        step(batch, tf.constant(s, tf.int64))
    writer.close()
    logged = data.load(logdir)["."]
    brute = reference.per_example_gradients(single, single.trainable_variables, sparse_ce, x, y)
    tags = gradmom.summary.tag_names(model.trainable_variables)
    for v, g, tag in zip(model.trainable_variables, brute, tags):
        records = logged[tag]
        assert [r.step for r in records] == [0, 2], [r.step for r in records]
        ref = reference.moments(g, (1, 2))
        for rec in records:
            assert rec.batch_size == n, rec.batch_size
            for p in (1, 2):
                close(rec.moments[p], ref[p], f"summary {v.path} M{p} step {rec.step}", 1e-5)
    print("ok summary")


def keras_fit(logdir):
    """The Keras callback under MirroredStrategy with model.fit: global-batch moments."""
    import os

    strategy = STRATEGY
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(8)
    n = 6
    x, y = rng.normal(size=(n, 5, 5, 2)), rng.integers(0, 3, size=n)
    with strategy.scope():
        model = conv_net()
        model.compile(
            optimizer=keras.optimizers.SGD(0.0),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    single = conv_net()
    single.set_weights(model.get_weights())
    logdir = os.path.join(logdir, "fit")
    cb = gradmom.keras.GradMoments(logdir, every_n_steps=1)
    model.fit(x, y, batch_size=n, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    run = data.load(logdir)["."]
    brute = reference.per_example_gradients(single, single.trainable_variables, sparse_ce, x, y)
    tags = gradmom.summary.tag_names(model.trainable_variables)
    for v, g, tag in zip(model.trainable_variables, brute, tags):
        records = run[tag]
        assert len(records) == 1, [r.step for r in records]
        assert records[0].batch_size == n, records[0].batch_size
        ref = reference.moments(g, (1, 2))
        for p in (1, 2):
            close(records[0].moments[p], ref[p], f"fit {v.path} M{p}", 1e-5)

    # training with the callback attached is training without it
    trained = []
    for attach in (True, False):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            m = conv_net()
            m.compile(
                optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        cbs = [gradmom.keras.GradMoments(logdir + "-train", every_n_steps=2)] if attach else []
        m.fit(x, y, batch_size=2, epochs=2, verbose=0, shuffle=False, callbacks=cbs)
        trained.append([w.numpy() for w in m.weights])
    for a, b in zip(*trained):
        assert np.array_equal(a, b), np.max(np.abs(a - b))
    print("ok keras fit")


if __name__ == "__main__":
    for build, shape in ((conv_net, (5, 5, 2)), (lstm_net, (4, 3)), (sin_rnn_net, (4, 3))):
        for kind in ("mean", "sum", "vector"):
            run(build, shape, 8, kind)
        run(build, shape, 7, "mean")  # the replicas see 4 and 3 examples
    for build, shape in ((conv_net, (5, 5, 2)), (sin_rnn_net, (4, 3))):  # a rule, the fallback
        for kind in ("mean+penalty", "sum+penalty"):
            run(build, shape, 7, kind)
    summary(sys.argv[1])
    keras_fit(sys.argv[1])
