"""Cost of the two answers to a coupling: a network with batch normalisation in training mode.

    python benchmarks/bench_coupled.py             # a few minutes
    python benchmarks/bench_coupled.py --smoke     # one round

Three Conv2D-BatchNormalization(training)-ReLU blocks and a Dense head (batch 32, 32x32x3),
timed in one process, interleaved: a plain step (``tf.gradients``), the moments step with
``coupled="exact"`` (the default: every variable before the last training-mode batch norm on
the exact fallback, one backward pass of the batch per example) and with ``coupled="rules"``
(the rules, whose higher moments are those of each example's share of the batch gradient).
Ratios are medians over rounds of the per-round ratio of median step times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((32, 32, 3))]
    for filters in (16, 32, 32):
        layers += [
            keras.layers.Conv2D(filters, 3, strides=2, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
        ]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one round of one step")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.per_round = 1, 1
    model = build()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, 32))
    variables = model.trainable_variables

    def loss_of(x, y):
        logits = model(x, training=True)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    steps = {
        "plain": tf.function(lambda x, y: tf.gradients(loss_of(x, y), variables)),
        "exact": tf.function(
            lambda x, y: gradmom.gradients_and_moments(loss_of(x, y), variables)[1]
        ),
        "rules": tf.function(
            lambda x, y: gradmom.gradients_and_moments(loss_of(x, y), variables, coupled="rules")[1]
        ),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f in steps.values():
            tf.nest.map_structure(lambda t: t.numpy(), f(x, y))
    times: dict = {k: [] for k in steps}
    for _ in range(args.rounds):
        for k, f in steps.items():
            samples = []
            for _ in range(args.per_round):
                t0 = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), f(x, y))
                samples.append(time.perf_counter() - t0)
            times[k].append(statistics.median(samples))

    def ratio(a, b):
        return statistics.median(p / q for p, q in zip(times[a], times[b]))

    print("| step | ms | / plain |")
    print("| --- | --- | --- |")
    for k in steps:
        print(f"| {k} | {1e3 * statistics.median(times[k]):.1f} | {ratio(k, 'plain'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
