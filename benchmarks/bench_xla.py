"""The moments step under XLA (`jit_compile=True`) against the plain XLA step and against the
moments step without XLA.

    python benchmarks/bench_xla.py                    # mlp and 3c3d, orders 1,2, ~3 min
    python benchmarks/bench_xla.py --models mlp --orders 1,2,3,4 --rounds 11
    python benchmarks/bench_xla.py --unknown-batch    # the batch unknown at trace time

The models, data and steps are those of benchmarks/bench_core.py (`build_model`, `make_data`,
the same update and the same consumption of the moments); for each model, in ONE process, four
`tf.function` steps are fed the same batch and timed interleaved, round after round, the order
rotating (`bench_core.time_interleaved`):

- plain:       forward + `tf.gradients` + update, jit_compile off;
- moments:     forward + `gradients_and_moments` + update, jit_compile off;
- xla plain:   the plain step with jit_compile=True;
- xla moments: the moments step with jit_compile=True.

A ratio is the median over rounds of the per-round ratio of medians. With ``--unknown-batch``
each step is traced with an input signature whose batch is None (Keras' train function under
``reduce_retracing``, a tf.data pipeline): under XLA each rule then works on the whole batch at
once (one chunk, see docs/math.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_core  # noqa: E402  (sets the TF log level, imports tb_gradmom)
import tensorflow as tf  # noqa: E402

gradmom = bench_core.gradmom


def make_steps(model, orders, x, y, unknown_batch: bool) -> dict:
    variables = list(model.trainable_variables)
    higher = [p for p in orders if p > 1]
    signature = None
    if unknown_batch:
        signature = [
            tf.TensorSpec([None, *x.shape[1:]], x.dtype),
            tf.TensorSpec([None, *y.shape[1:]], y.dtype),
        ]

    def update(grads):
        for v, g in zip(variables, grads):
            v.assign_sub(bench_core.LR * g)

    def plain(x, y):
        loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
        update(tf.gradients(loss, variables))
        return loss

    def moments(x, y):
        loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
        grads, mom = gradmom.gradients_and_moments(loss, variables, orders=orders)
        update(grads)
        used = [tf.reduce_sum(m[p]) for m in mom for p in higher]
        return loss + 0.0 * tf.add_n(used) if used else loss

    def compiled(fn, jit):
        return tf.function(fn, jit_compile=jit, input_signature=signature)

    return {
        "plain": compiled(plain, False),
        "moments": compiled(moments, False),
        "xla plain": compiled(plain, True),
        "xla moments": compiled(moments, True),
    }


def run(name: str, orders, rounds: int, per_round: int, unknown_batch: bool) -> dict:
    model = bench_core.build_model(name)
    x, y = bench_core.make_data(name)
    steps = make_steps(model, orders, x, y, unknown_batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = bench_core.time_interleaved(steps, x, y, rounds, {k: per_round for k in steps})
    per = {k: [statistics.median(r) for r in v] for k, v in times.items()}

    def ratio(a, b):
        return statistics.median([p / q for p, q in zip(per[a], per[b])])

    return {
        "model": name,
        "ms": {k: 1e3 * statistics.median([t for r in v for t in r]) for k, v in times.items()},
        "xla moments / xla plain": ratio("xla moments", "xla plain"),
        "xla moments / moments": ratio("xla moments", "moments"),
        "moments / plain": ratio("moments", "plain"),
        "xla plain / plain": ratio("xla plain", "plain"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,3c3d")
    parser.add_argument("--orders", default="1,2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--unknown-batch", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the MLP, one round (checks it runs, not times)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.rounds, args.per_round = "mlp", 1, 1
    orders = tuple(int(p) for p in args.orders.split(","))
    batch = "unknown at trace time" if args.unknown_batch else "static"
    print(f"orders {orders}, batch {batch}, {args.rounds} rounds x {args.per_round} steps")
    print(
        f"{'model':8} {'plain':>8} {'moments':>8} {'xla plain':>10} {'xla mom.':>9}   "
        f"{'xla mom./xla plain':>18} {'xla mom./moments':>16} {'moments/plain':>13}"
    )
    for name in args.models.split(","):
        r = run(name, orders, args.rounds, args.per_round, args.unknown_batch)
        ms = r["ms"]
        print(
            f"{name:8} {ms['plain']:8.2f} {ms['moments']:8.2f} {ms['xla plain']:10.2f} "
            f"{ms['xla moments']:9.2f}   {r['xla moments / xla plain']:18.2f} "
            f"{r['xla moments / moments']:16.2f} {r['moments / plain']:13.2f}",
            flush=True,
        )
    print("(ms: median step time; ratios: median over rounds of the per-round ratio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
