"""A real log of per-example norms for the per-example view's tests (analysis, plugin, plots,
export, browser): `summary.moments(..., example_ids=...)` in a float64 training loop on a
fixed data set with a few corrupted targets, so that some ids are outliers at several steps.

Run ``ex`` (written by `write_examples_run`): 8 logged steps of a batch of `BATCH` examples
drawn from `DATASET` ids, logged twice per step: uncapped (group ``full``, ``max_examples``
above the batch) and capped (group ``capped``, ``max_examples=CAP``), with the same norms. So the
``full`` records are the whole batch, the reference for what the capped ones estimate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATASET = 200
BATCH = 96
CAP = 24
STEPS = (0, 5, 10, 15, 20, 25, 30, 35)
CORRUPTED = (3, 17, 42, 101, 150, 177)  # ids whose targets are off by CORRUPTION
CORRUPTION = 40.0


def write_examples_run(run_dir: Path) -> None:
    """Writes the run (TensorFlow imported here, so that importers stay light)."""
    import keras
    import tensorflow as tf

    import tb_gradmom as gradmom

    keras.utils.set_random_seed(11)
    rng = np.random.default_rng(11)
    x_all = rng.normal(size=(DATASET, 6))
    y_all = x_all @ rng.normal(size=(6, 2)) + 0.1 * rng.normal(size=(DATASET, 2))
    y_all[list(CORRUPTED)] += CORRUPTION
    inp = keras.Input((6,), dtype="float64")
    h = keras.layers.Dense(8, activation="tanh", dtype="float64", name="hidden")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, dtype="float64", name="out")(h))
    opt = keras.optimizers.SGD(0.01)
    writer = tf.summary.create_file_writer(str(run_dir))

    @tf.function
    def step(x, y, ids, s):
        with writer.as_default(step=s):
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(model(x) - y), axis=1))
            grads = gradmom.summary.moments(
                loss, model.trainable_variables, name="full", example_ids=ids, max_examples=1024
            )
            gradmom.summary.moments(
                loss, model.trainable_variables, name="capped", example_ids=ids, max_examples=CAP
            )
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for s in STEPS:
        # every corrupted id is in every batch (each an outlier at every step), once
        clean = np.setdiff1d(np.arange(DATASET), CORRUPTED)
        ids = np.concatenate([CORRUPTED, rng.choice(clean, BATCH - len(CORRUPTED), replace=False)])
        rng.shuffle(ids)
        step(
            tf.constant(x_all[ids]),
            tf.constant(y_all[ids]),
            tf.constant(ids.astype(np.int64)),
            tf.constant(s, tf.int64),
        )
    writer.close()


# The examples-only run: norms with string ids, no moments at all.
ONLY_NORMS = np.array([[4.0, 1.0, 9.0, 0.25], [16.0, 0.0, 1.0, 400.0]])  # [step, example]
ONLY_IDS = ["a", "b", "c", "d"]


def write_other_runs(logdir: Path) -> None:
    """Runs written with `tf.summary.write` and the format's own metadata: ``only`` (per-example
    norms with string ids and no moments: steps 1 and 2 of 4 examples, plus a step 3 whose
    tensor has the wrong width, skipped) and ``bad`` (an examples tag whose content is not
    JSON, left out; and a good ``good/_examples`` tag beside it)."""
    import tensorflow as tf

    from tb_gradmom import metadata

    content = metadata.ExamplesContent(
        columns=(*metadata.EXAMPLE_COLUMNS, "dense"), norms=("layer",), max_examples=8, ids="string"
    )
    meta = metadata.create_examples_metadata(content)
    with tf.summary.create_file_writer(str(logdir / "only")).as_default():
        for step, sq in zip((1, 2), ONLY_NORMS):
            n = len(sq)
            table = np.stack([np.full(n, n), np.arange(n), np.arange(n) + 0.5, sq, sq / 2], 1)
            tf.summary.write("_examples", tf.constant(table, tf.float64), step=step, metadata=meta)
            tf.summary.write("_examples/ids", tf.constant(ONLY_IDS), step=step, metadata=meta)
        tf.summary.write("_examples", tf.zeros([4, 3], tf.float64), step=3, metadata=meta)
        tf.summary.write("_examples/ids", tf.constant(ONLY_IDS), step=3, metadata=meta)
    bad = metadata.create_examples_metadata(content)
    bad.plugin_data.content = b"not json"
    good = metadata.create_examples_metadata(
        metadata.ExamplesContent(columns=metadata.EXAMPLE_COLUMNS, norms=(), max_examples=8)
    )
    with tf.summary.create_file_writer(str(logdir / "bad")).as_default():
        tf.summary.write("_examples", tf.ones([2, 5], tf.float64), step=0, metadata=bad)
        table = tf.constant([[2.0, 0.0, 1.0, 9.0], [2.0, 1.0, 1.0, 1.0]], tf.float64)
        tf.summary.write("good/_examples", table, step=0, metadata=good)
