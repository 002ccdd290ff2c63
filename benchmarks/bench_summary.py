"""Cost of `gradmom.summary.moments` on logged and on skipped steps, against a plain step and
against the moments step of `gradients_and_moments`.

    python benchmarks/bench_summary.py                     # MLP and 3C3D, a few minutes
    python benchmarks/bench_summary.py --models resnet50   # ResNet50 (64x64, batch 16)
    python benchmarks/bench_summary.py --quick
    python benchmarks/bench_summary.py --baseline old/summary.py   # also time another version
    python benchmarks/bench_summary.py --ops               # op counts of the logging branch
    python benchmarks/bench_summary.py --overlap           # the statistics beside the step

Training steps per model in one process, interleaved as in `bench_core.py` (same models, data
and timing helpers; ResNet50 as in `bench_zoo.py`):

* plain: forward, ``tf.gradients``, SGD update;
* moments: ``gradmom.gradients_and_moments(loss, variables, orders=(1, 2))`` and the update
  (the moments step of `bench_core.py`);
* skipped: the plain step with ``gradmom.summary.moments`` under ``tf.summary.record_if(False)``
  (a step off the logging schedule: the moment ops sit in the untaken ``tf.cond`` branch);
* logged: ``record_if(True)``: moments, statistics and event writes (to a temporary logdir);
* baseline (with ``--baseline FILE``): the logged step with the ``summary.py`` in FILE, to
  compare two versions of the logging in the same interleaved rounds.

Ratios are medians over rounds of the per-round ratio of median step times.

``--overlap`` asks what moving the statistics off the step would buy on this machine: it times,
interleaved, the moments step alone, the logged step's statistics alone (`summary._stats_fields`
on fixed moments of the model, the float64 sums and variance histograms of every logged
variable, without pooling or event writes), the two one after the other, and the two at once
(the statistics in a second Python thread, started as the step starts: the best case of a
logging that hands the moments to a background worker).
Targets: skipped / plain <= 1.05 (issue 4); logged / moments <= 1.15 (the logging issue).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402

SKIPPED_TARGET = 1.05
LOGGED_TARGET = 1.15  # logged / moments
# steps per variant per round
PER_ROUND = {"mlp": 20, "3c3d": 5, "resnet50": 1}


def load_summary(path: str):
    """A ``summary.py`` (e.g. an older version) loaded as its own module."""
    spec = importlib.util.spec_from_file_location("tb_gradmom._summary_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(name: str):
    """(model, x, y)."""
    if name == "resnet50":
        import bench_zoo

        _, batch, size, _ = bench_zoo.MODELS[name]
        return bench_zoo.build(name, batch, size)
    model = bench_core.build_model(name)
    return (model, *bench_core.make_data(name))


def make_steps(model, logdir, baseline=None):
    variables = list(model.trainable_variables)
    writer = tf.summary.create_file_writer(logdir)

    def update(grads):
        for v, g in zip(variables, grads):
            v.assign_sub(bench_core.LR * g)

    def loss_of(x, y):
        return tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))

    @tf.function(jit_compile=False)
    def plain(x, y):
        loss = loss_of(x, y)
        update(tf.gradients(loss, variables))
        return loss

    @tf.function(jit_compile=False)
    def moments(x, y):
        loss = loss_of(x, y)
        grads, mom = gradmom.gradients_and_moments(loss, variables, orders=(1, 2))
        update(grads)
        # as bench_core's moments step: the second moments are used, so not pruned
        return loss + 0.0 * tf.add_n([tf.reduce_sum(m[2]) for m in mom])

    def with_summary(record, module):
        @tf.function(jit_compile=False)
        def step(x, y):
            loss = loss_of(x, y)
            with writer.as_default(step=0), tf.summary.record_if(record()):
                grads = module.moments(loss, variables)
            update(grads)
            return loss

        return step

    # record_if takes a callable or a tensor; a variable keeps the condition dynamic, as a
    # `step % N == 0` schedule is.
    off = tf.Variable(False)
    on = tf.Variable(True)
    steps = {
        "plain": plain,
        "moments": moments,
        "skipped": with_summary(lambda: off, gradmom.summary),
        "logged": with_summary(lambda: on, gradmom.summary),
    }
    if baseline is not None:
        steps["baseline"] = with_summary(lambda: on, baseline)
    return steps, writer


def overlap(model, x, y, rounds: int, per_round: int) -> dict:
    """Step times (ms) and ratios for ``--overlap`` (see the module docstring)."""
    import threading

    import numpy as np

    from tb_gradmom.writers import summary as gsum

    variables = list(model.trainable_variables)
    steps, writer = make_steps(model, tempfile.mkdtemp(prefix="bench_summary_"))
    writer.close()
    moments = steps["moments"]

    @tf.function(jit_compile=False)
    def moments_of(x, y):
        loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
        _, mom = gradmom.gradients_and_moments(loss, variables, orders=(1, 2))
        return [(m[1], m[2]) for m in mom]

    fixed = [(None, tf.constant(m1), tf.constant(m2)) for m1, m2 in moments_of(x, y)]
    n = tf.constant(int(x.shape[0]))

    @tf.function(jit_compile=False)
    def statistics_only():
        fields, hist = gsum._stats_fields(fixed, n, tf.constant(1.0, tf.float64), None)
        return tf.reduce_sum(hist) + tf.add_n([tf.reduce_sum(v) for v in fields.values()])

    def both_at_once():
        worker = threading.Thread(target=lambda: float(statistics_only()))
        worker.start()
        float(moments(x, y))
        worker.join()

    variants = {
        "moments": lambda: float(moments(x, y)),
        "statistics": lambda: float(statistics_only()),
        "one_then_other": lambda: (float(moments(x, y)), float(statistics_only())),
        "at_once": both_at_once,
    }
    for f in variants.values():
        f()
        f()
    times: dict = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                f()
            times[k].append((time.perf_counter() - t0) / per_round)
    arr = {k: np.array(v) for k, v in times.items()}
    return {
        "ms": {k: 1e3 * float(np.median(v)) for k, v in arr.items()},
        "one_then_other/moments": float(np.median(arr["one_then_other"] / arr["moments"])),
        "at_once/moments": float(np.median(arr["at_once"] / arr["moments"])),
        "at_once/one_then_other": float(np.median(arr["at_once"] / arr["one_then_other"])),
    }


def write_branch_ops(step, x, y, files=("summary.py", "summary_before.py")) -> dict:
    """Ops in the logging branch (the taken side of ``gradmom_record``) of a traced step,
    nested function bodies included: ``{"all": ..., "logging": ...}``, where "logging" counts
    the ops created by ``summary.py`` itself (statistics, pooling, writes), not by the moments
    it asks `_core` for."""
    graph = step.get_concrete_function(x, y).graph
    funcs = {}
    stack = [graph]
    while stack:
        g = stack.pop()
        for name, fn in getattr(g, "_functions", {}).items():
            if name not in funcs and hasattr(fn, "graph"):
                funcs[name] = fn
                stack.append(fn.graph)
    ifs = [op for op in graph.get_operations() if "gradmom_record" in op.name and "If" in op.type]
    if len(ifs) != 1:
        raise RuntimeError(f"expected one gradmom_record cond, found {len(ifs)}")

    def origin(op):
        for frame in reversed(op.traceback):
            if "/tb_gradmom/" in frame.filename or frame.filename.endswith(files):
                return os.path.basename(frame.filename)
        return ""

    def count(fname, seen, out):
        for op in funcs[fname].graph.get_operations():
            out["all"] += 1
            out["logging"] += origin(op) in files
            for attr in ("then_branch", "else_branch", "f", "body", "cond"):
                try:
                    inner = op.get_attr(attr)
                except ValueError:
                    continue
                if inner.name in funcs and inner.name not in seen:
                    seen.add(inner.name)
                    count(inner.name, seen, out)
        return out

    return count(ifs[0].get_attr("then_branch").name, set(), {"all": 0, "logging": 0})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,3c3d", help="mlp, 3c3d, resnet50")
    parser.add_argument("--repeats", type=int, default=21, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the MLP, two rounds (checks it runs, not times)"
    )
    parser.add_argument("--baseline", default=None, help="a summary.py to time as 'baseline'")
    parser.add_argument("--ops", action="store_true", help="only count the logging ops")
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="only time the statistics beside the moments step, in a second thread",
    )
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else args.repeats
    if args.smoke:
        args.models, rounds = "mlp", 2
    baseline = load_summary(args.baseline) if args.baseline else None
    print(f"TF {tf.__version__}, {os.cpu_count()} CPUs, {rounds} interleaved rounds")
    with tempfile.TemporaryDirectory() as logdir:
        for name in args.models.split(","):
            model, x, y = build(name)
            if args.overlap:
                load0 = os.getloadavg()[0]
                out = overlap(model, x, y, rounds, PER_ROUND.get(name, 5))
                print(
                    f"\n{name} (load {load0:.1f} -> {os.getloadavg()[0]:.1f}): "
                    + ", ".join(f"{k} {v:.2f} ms" for k, v in out["ms"].items())
                )
                print(
                    "  moments step, then the statistics: "
                    f"{out['one_then_other/moments']:.2f}x the moments step; both at once "
                    f"(the statistics in a second thread): {out['at_once/moments']:.2f}x "
                    f"({out['at_once/one_then_other']:.2f}x one after the other)"
                )
                continue
            steps, writer = make_steps(model, os.path.join(logdir, name), baseline)
            if args.ops:
                versions = ["logged"] + (["baseline"] if baseline else [])
                counts = {k: write_branch_ops(steps[k], x, y) for k in versions}
                print(
                    f"{name}: {len(model.trainable_variables)} variables, ops in the logging "
                    "branch (by summary.py / all): "
                    + ", ".join(f"{k} {v['logging']} / {v['all']}" for k, v in counts.items())
                )
                writer.close()
                continue
            load0 = os.getloadavg()[0]
            per_round = {k: PER_ROUND.get(name, 5) for k in steps}
            times = bench_core.time_interleaved(steps, x, y, rounds, per_round)
            writer.close()
            per = {k: [statistics.median(r) for r in v] for k, v in times.items()}
            ms = {k: 1e3 * statistics.median([t for r in v for t in r]) for k, v in times.items()}

            def ratio(a, b, per=per):
                return statistics.median([p / q for p, q in zip(per[a], per[b])])

            print(
                f"\n{name} (load {load0:.1f} -> {os.getloadavg()[0]:.1f}): "
                + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items())
            )
            skipped = ratio("skipped", "plain")
            print(
                f"  skipped/plain {skipped:.3f} "
                f"({'ok' if skipped <= SKIPPED_TARGET else 'MISS'}, target {SKIPPED_TARGET})"
            )
            for k in ("logged", "baseline"):
                if k in steps:
                    lm = ratio(k, "moments")
                    print(
                        f"  {k}/moments {lm:.2f} "
                        f"({'ok' if lm <= LOGGED_TARGET else 'MISS'}, target {LOGGED_TARGET}), "
                        f"{k}/plain {ratio(k, 'plain'):.2f}"
                    )
            print(f"  moments/plain {ratio('moments', 'plain'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
