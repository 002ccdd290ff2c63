"""Cost of the Keras callback, `gradmom.keras.GradMoments`, with and without XLA.

    python benchmarks/bench_callback.py                 # MLP and 3C3D, a few minutes
    python benchmarks/bench_callback.py --models mlp --rounds 5

For each model (`bench_core.py`'s MLP and 3C3D, batch and data as there) and for
``jit_compile`` False and True, four Keras models with the same weights are compiled with SGD,
and their train functions (what ``model.fit`` calls once per step) are timed in one process,
interleaved, on one repeated batch:

* plain: no callback;
* attached: the callback attached (``on_train_begin``), on steps it does not log;
* logged: the callback attached, logging every step (its dry run of the step, the moments,
  the statistics and the event writes, then the step itself).

Ratios are medians over rounds of the per-round ratio of median call times. Targets (issue
27): with ``jit_compile=True``, attached / plain <= 1.05; a logged step under XLA no slower
than a logged step without XLA.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402

PER_ROUND = {"mlp": 20, "3c3d": 4}


def _compiled(name: str, jit: bool) -> keras.Model:
    model = bench_core.build_model(name)  # seeded: the same weights every time
    model.compile(
        keras.optimizers.SGD(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit,
    )
    return model


def _variants(name: str, jit: bool, logdir: str) -> dict:
    x, y = bench_core.make_data(name)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    out = {}
    for variant, every in (("plain", None), ("attached", 10**9), ("logged", 1)):
        model = _compiled(name, jit)
        model.make_train_function()
        if every is not None:
            cb = gradmom.keras.GradMoments(os.path.join(logdir, f"{name}-{jit}-{variant}"), every)
            cb.set_model(model)
            cb.on_train_begin()
            if variant == "attached":
                model.optimizer.iterations.assign(1)  # off the schedule: never due
        out[variant] = (model, iter(data))
    return out


def _time(variants: dict, rounds: int, per_round: int) -> dict:
    for model, it in variants.values():  # trace and compile
        for _ in range(2):
            model.train_function(it)
    times: dict = {k: [] for k in variants}
    for _ in range(rounds):
        for k, (model, it) in variants.items():
            samples = []
            for _ in range(per_round):
                t0 = time.perf_counter()
                logs = model.train_function(it)
                float(logs["loss"])  # wait for the step
                samples.append(time.perf_counter() - t0)
            times[k].append(statistics.median(samples))
    return times


def _ratio(times: dict, a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def _ratio_of(a: dict, b: dict, k: str) -> float:
    """The median over rounds of ``a[k] / b[k]`` (two settings timed in the same rounds)."""
    return statistics.median(x / y for x, y in zip(a[k], b[k]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,3c3d")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the MLP, one round (checks it runs, not times)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.rounds = "mlp", 1
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in PER_ROUND]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(PER_ROUND)}")
    rows = []
    with tempfile.TemporaryDirectory() as logdir:
        for name in names:
            # Both settings of jit_compile timed in the same rounds, so that the comparison of
            # the logged steps with and without XLA sees the same load.
            print(f"{name}: tracing and timing, jit_compile False and True ...", flush=True)
            variants = {
                (jit, k): v
                for jit in (False, True)
                for k, v in _variants(name, jit, logdir).items()
            }
            t = _time(variants, args.rounds, PER_ROUND[name])
            times = {jit: {k: t[(j, k)] for j, k in t if j == jit} for jit in (False, True)}
            rows.append((name, times))
    print()
    print("| model | jit | plain ms | attached / plain | logged / plain |")
    print("| --- | --- | --- | --- | --- |")
    for name, times in rows:
        for jit in (False, True):
            t = times[jit]
            print(
                f"| {name} | {jit} | {1e3 * statistics.median(t['plain']):.2f} | "
                f"{_ratio(t, 'attached', 'plain'):.3f} | {_ratio(t, 'logged', 'plain'):.2f} |"
            )
    print()
    for name, times in rows:
        xla, nox = times[True], times[False]
        logged = _ratio_of(xla, nox, "logged")
        attached = _ratio(xla, "attached", "plain")
        # What logging adds to a step, in ms, with and without XLA (medians of the rounds).
        added = {
            jit: 1e3 * statistics.median(a - b for a, b in zip(t["logged"], t["plain"]))
            for jit, t in times.items()
        }
        print(
            f"{name}: with XLA, attached / plain {attached:.3f} (target <= 1.05); logged step "
            f"with XLA / logged step without {logged:.2f} (target <= 1; the plain XLA step / "
            f"plain step without XLA: {_ratio_of(xla, nox, 'plain'):.2f}); logging adds "
            f"{added[True]:.1f} ms to the XLA step, {added[False]:.1f} ms without XLA"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
