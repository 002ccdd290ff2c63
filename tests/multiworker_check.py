"""One worker of a two-worker `MultiWorkerMirroredStrategy` on 127.0.0.1 (``TF_CONFIG``).

Run by `tests/test_distribute.py`, two processes at once:

    python -m tests.multiworker_check PORT0 PORT1 INDEX LOGDIR

Each worker feeds its half of a global batch of 8 and checks that the moments it gets equal the
moments of the whole batch computed in one process (and brute force), then logs them with
``summary.moments`` in a training loop; worker 0 checks what was written. Prints ``ok ...``
lines; exits non-zero on any mismatch.
"""

from __future__ import annotations

import json
import os
import sys

PORT0, PORT1, INDEX, LOGDIR = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["TF_CONFIG"] = json.dumps(
    {
        "cluster": {"worker": [f"127.0.0.1:{PORT0}", f"127.0.0.1:{PORT1}"]},
        "task": {"type": "worker", "index": INDEX},
    }
)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STRATEGY = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402
from tb_gradmom.analysis import data  # noqa: E402
from tests import reference  # noqa: E402
from tests.cases import sparse_ce  # noqa: E402

ORDERS = (1, 2, 3, 4)
N = 8


def conv_net():  # as in distributed_check (which sets up logical devices on import)
    return keras.Sequential(
        [
            keras.Input((5, 5, 2)),
            keras.layers.Conv2D(3, 3, activation="tanh", dtype="float64"),
            keras.layers.Flatten(dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )


def close(a, b, what, tol=1e-10):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.max(np.abs(b))), 1e-300)
    err = float(np.max(np.abs(a - b)))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} * {scale:.3g}"


def _data():
    rng = np.random.default_rng(4)
    return rng.normal(size=(N, 5, 5, 2)), rng.integers(0, 3, size=N)


def moments_match():
    strategy = STRATEGY
    assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync
    keras.utils.set_random_seed(3)
    x, y = _data()
    with strategy.scope():
        model = conv_net()
    single = conv_net()
    single.set_weights(model.get_weights())
    variables = model.trainable_variables

    def dataset_fn(ctx):  # worker i feeds examples [4 i, 4 i + 4)
        i = ctx.input_pipeline_id
        half = (x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
        return tf.data.Dataset.from_tensor_slices(half).batch(4)

    batch = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def step(batch):
        def replica_fn(x, y):
            loss = tf.nn.compute_average_loss(sparse_ce(model(x), y), global_batch_size=N)
            return gradmom.gradients_and_moments(loss, variables, orders=ORDERS)[1]

        return strategy.run(replica_fn, args=batch)

    got = strategy.experimental_local_results(step(batch))[0]
    brute = reference.per_example_gradients(single, single.trainable_variables, sparse_ce, x, y)
    for v, m, g in zip(variables, got, brute):
        ref = reference.moments(g, ORDERS)
        for p in ORDERS:
            close(m[p], ref[p], f"worker {INDEX} {v.path} M{p}")
    print(f"ok worker {INDEX} moments over the global batch")


def summary_loop():
    """`summary.moments` in a custom training loop: the global replica 0 (worker 0) writes the
    global-batch moments. (Keras 3.15's own ``model.fit`` fails under this strategy before any
    callback runs: "Attempt to convert a value (PerReplica...)", so the loop is written out.)"""
    strategy = STRATEGY
    keras.utils.set_random_seed(5)
    x, y = _data()
    with strategy.scope():
        model = conv_net()
    single = conv_net()
    single.set_weights(model.get_weights())
    logdir = os.path.join(LOGDIR, f"worker{INDEX}")
    writer = tf.summary.create_file_writer(logdir)

    def dataset_fn(ctx):
        i = ctx.input_pipeline_id
        return tf.data.Dataset.from_tensor_slices(
            (x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
        ).batch(4)

    batch = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def step(batch, s):
        def replica_fn(x, y):
            loss = tf.nn.compute_average_loss(sparse_ce(model(x), y), global_batch_size=N)
            with writer.as_default(step=s), tf.summary.record_if(s % 2 == 0):
                return gradmom.summary.moments(loss, model.trainable_variables)

        return strategy.run(replica_fn, args=batch)

    for s in range(3):
        step(batch, tf.constant(s, tf.int64))
    writer.close()
    if INDEX != 0:
        print(f"ok worker {INDEX} summary loop")
        return
    run = data.load(logdir)["."]
    brute = reference.per_example_gradients(single, single.trainable_variables, sparse_ce, x, y)
    tags = gradmom.summary.tag_names(model.trainable_variables)
    for v, g, tag in zip(model.trainable_variables, brute, tags):
        records = run[tag]
        assert [r.step for r in records] == [0, 2], [r.step for r in records]
        ref = reference.moments(g, (1, 2))
        for rec in records:
            assert rec.batch_size == N, rec.batch_size
            for p in (1, 2):
                close(rec.moments[p], ref[p], f"summary {v.path} M{p} step {rec.step}", 1e-5)
    print(f"ok worker {INDEX} summary: global-batch moments logged once")


def keras_fit():
    """``model.fit`` with the `GradMoments` callback under this strategy. Keras 3.15's own
    ``fit`` fails under MultiWorkerMirroredStrategy before any callback runs; this shows that
    the failure is Keras' own (the same ``fit`` without the callback fails), and once a Keras
    fixes it, checks that the callback logs the global batch's moments."""
    keras.utils.set_random_seed(5)
    x, y = _data()

    def compiled():
        with STRATEGY.scope():
            model = conv_net()
            model.compile(
                optimizer=keras.optimizers.SGD(0.0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        return model

    plain = compiled()
    try:
        plain.fit(x, y, batch_size=N, epochs=1, verbose=0, shuffle=False)
    except Exception as e:  # noqa: BLE001 - Keras' own failure, reported
        first = (str(e).strip().splitlines() or [""])[-1][:200]
        print(
            f"keras fit without the callback fails on worker {INDEX}: {type(e).__name__}: {first}"
        )
        return
    model = compiled()
    model.set_weights(plain.get_weights())
    logdir = os.path.join(LOGDIR, "fit")
    cb = gradmom.keras.GradMoments(logdir, every_n_steps=1)
    model.fit(x, y, batch_size=N, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    if INDEX == 0:
        single = conv_net()
        single.set_weights(model.get_weights())
        brute = reference.per_example_gradients(single, single.trainable_variables, sparse_ce, x, y)
        run = data.load(logdir)["."]
        tags = gradmom.summary.tag_names(model.trainable_variables)
        for v, g, tag in zip(model.trainable_variables, brute, tags):
            rec = run[tag][0]
            assert rec.batch_size == N, rec.batch_size
            ref = reference.moments(g, (1, 2))
            for p in (1, 2):
                close(rec.moments[p], ref[p], f"fit {v.path} M{p}", 1e-5)
    print(f"ok worker {INDEX} keras fit: global-batch moments logged")


if __name__ == "__main__":
    moments_match()
    summary_loop()
    keras_fit()
