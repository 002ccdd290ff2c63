"""Cost of `gradmom.summary.moments` on logged and on skipped steps, against a plain step.

    python benchmarks/bench_summary.py            # MLP and 3C3D, about a minute
    python benchmarks/bench_summary.py --quick

Three `tf.function` training steps per model in one process, interleaved as in
`bench_core.py` (same models, data and timing helpers):

* plain: forward, ``tf.gradients``, SGD update;
* skipped: the same with ``gradmom.summary.moments`` under ``tf.summary.record_if(False)``
  (a step off the logging schedule: the moment ops sit in the untaken ``tf.cond`` branch);
* logged: ``record_if(True)``: moments, statistics and event writes (to a temporary logdir).

Targets: skipped / plain <= 1.05 (issue 4).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402


def make_steps(model, logdir):
    variables = list(model.trainable_variables)
    writer = tf.summary.create_file_writer(logdir)

    def update(grads):
        for v, g in zip(variables, grads):
            v.assign_sub(bench_core.LR * g)

    @tf.function(jit_compile=False)
    def plain(x, y):
        loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
        update(tf.gradients(loss, variables))
        return loss

    def with_summary(record):
        @tf.function(jit_compile=False)
        def step(x, y):
            loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
            with writer.as_default(step=0), tf.summary.record_if(record()):
                grads = gradmom.summary.moments(loss, variables)
            update(grads)
            return loss

        return step

    # record_if takes a callable or a tensor; a variable keeps the condition dynamic, as a
    # `step % N == 0` schedule is.
    off = tf.Variable(False)
    on = tf.Variable(True)
    return {
        "plain": plain,
        "skipped": with_summary(lambda: off),
        "logged": with_summary(lambda: on),
    }, writer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,3c3d")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else args.repeats
    print(f"TF {tf.__version__}, {os.cpu_count()} CPUs, {rounds} interleaved rounds")
    print(
        f"{'model':<6} {'plain ms':>9} {'skipped ms':>11} {'logged ms':>10} "
        f"{'skipped/plain':>14} {'logged/plain':>13}"
    )
    with tempfile.TemporaryDirectory() as logdir:
        for name in args.models.split(","):
            model = bench_core.build_model(name)
            x, y = bench_core.make_data(name)
            steps, writer = make_steps(model, os.path.join(logdir, name))
            per_round = {k: (20 if name == "mlp" else 5) for k in steps}
            times = bench_core.time_interleaved(steps, x, y, rounds, per_round)
            writer.close()
            per = {k: [sorted(r)[len(r) // 2] for r in v] for k, v in times.items()}
            med = {
                k: 1e3 * sorted(t for r in v for t in r)[len(v) * len(v[0]) // 2]
                for k, v in times.items()
            }

            def ratio(a, b, per=per):
                rs = sorted(x / y for x, y in zip(per[a], per[b]))
                return rs[len(rs) // 2]

            skipped = ratio("skipped", "plain")
            mark = "ok" if skipped <= 1.05 else "MISS"
            print(
                f"{name:<6} {med['plain']:9.2f} {med['skipped']:11.2f} {med['logged']:10.2f} "
                f"{skipped:9.3f} {mark:<4} {ratio('logged', 'plain'):13.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
