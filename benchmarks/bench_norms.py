"""Cost of `gradmom.per_example_norms` against a plain SGD step and the moments step.

    python benchmarks/bench_norms.py                  # MLP, 3C3D, transformer block, ~3 min
    python benchmarks/bench_norms.py --quick          # smoke run
    python benchmarks/bench_norms.py --models transformer --rounds 15

The models, batches and data are `bench_core.py`'s ("mlp": 784-512-512-10, batch 128;
"3c3d": batch 64, 32x32x3; "transformer": one encoder block, batch 32, sequence 64, width 128).
For each model, in ONE process, three `tf.function` training steps (jit_compile off) are timed
interleaved, round after round, the order rotating (`bench_core.time_interleaved`):

- plain:   forward + `tf.gradients` + `v.assign_sub(lr * g)`;
- moments: forward + `gradmom.gradients_and_moments(loss, vars, orders=(1, 2))` + the update,
  the second moments consumed (a scalar sum is returned);
- norms:   forward + `gradmom.per_example_norms(loss, vars)` + the update, the per-example
  squared norms consumed (their sum over variables, a [n] vector, is summed into the output).

A variant's time is the median of its steps; a ratio is the median over rounds of the per-round
ratio of medians. The per-variable form each norm took is printed (Gram or materialised for the
Dense layers on sequences).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_core  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402

LR = bench_core.LR
MODELS = ("mlp", "3c3d", "transformer")
PER_ROUND = {"mlp": 20, "3c3d": 5, "transformer": 5}
PER_ROUND_QUICK = {"mlp": 8, "3c3d": 2, "transformer": 2}


def make_steps(model) -> dict:
    variables = list(model.trainable_variables)

    def update(grads):
        for v, g in zip(variables, grads):
            v.assign_sub(LR * g)

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
        return loss + 0.0 * tf.add_n([tf.reduce_sum(m[2]) for m in mom])

    @tf.function(jit_compile=False)
    def norms(x, y):
        loss = loss_of(x, y)
        grads, sq = gradmom.per_example_norms(loss, variables)
        update(grads)
        return loss + 0.0 * tf.reduce_sum(tf.add_n(sq))

    return {"plain": plain, "moments": moments, "norms": norms}


def forms(model, x, y, batch: int) -> list[str]:
    """Per variable, the norms form its plan takes (traced once, nothing run)."""
    from tb_gradmom.core import plan as _plan
    from tb_gradmom.core.rules import base

    out: list[str] = []
    variables = list(model.trainable_variables)

    @tf.function
    def trace(x, y):
        loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
        plan = _plan.make_plan(loss, variables, _plan.Options.check((1,)), name="forms")
        for v in plan.variables:
            if v.fallback is not None:
                form = "fallback"
            elif len(v.sites) != 1 or v.sites[0][1].sq_norms is None:
                form = "materialised (several sites or no norms form)"
            else:
                site = v.sites[0][0]
                form = f"{site.op.type} norms form"
                if site.op.type in ("MatMul", "BatchMatMulV2") and site.view.shape.rank == 2:
                    t = _positions(site, batch)
                    if t is not None and t > 1:
                        d_in, d_out = (int(d) for d in site.view.shape)
                        ghost = base.ghost_form(t, d_in, d_out)
                        form += f" (T={t}: {'Gram' if ghost else 'materialised'})"
            out.append(f"{v.name} {list(v.variable.shape)}: {form}")
        return loss

    trace.get_concrete_function(x, y)
    return out


def _positions(site, batch: int) -> int | None:
    """Positions per example of the Dense input ``site`` reads (1 for rows), if static."""
    x = site.op.inputs[1 - site.index]
    if not x.shape.is_fully_defined():
        return None
    d_in = int(site.view.shape[0 if site.index == 1 else 1])
    return x.shape.num_elements() // (batch * d_in)


def run(name: str, rounds: int, quick: bool) -> dict:
    model = bench_core.build_model(name)
    x, y = bench_core.make_data(name)
    steps = make_steps(model)
    per = (PER_ROUND_QUICK if quick else PER_ROUND)[name]
    times = bench_core.time_interleaved(steps, x, y, rounds, dict.fromkeys(steps, per))
    per_round = {k: [statistics.median(r) for r in v] for k, v in times.items()}

    def ratio(a, b):
        return statistics.median([p / q for p, q in zip(per_round[a], per_round[b])])

    return {
        "model": name,
        "ms": {k: 1e3 * statistics.median([t for r in v for t in r]) for k, v in times.items()},
        "norms/plain": ratio("norms", "plain"),
        "norms/moments": ratio("norms", "moments"),
        "moments/plain": ratio("moments", "plain"),
        "forms": forms(model, x, y, bench_core.MODELS[name][0]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the MLP, one round (checks it runs, not times)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.rounds, args.quick = "mlp", 1, True
    rounds = args.rounds or (3 if args.quick else 11)
    results = []
    print(
        f"{'model':<12} {'plain ms':>9} {'moments ms':>11} {'norms ms':>9} "
        f"{'norms/plain':>12} {'norms/moments':>14} {'moments/plain':>14}"
    )
    for name in args.models.split(","):
        r = run(name, rounds, args.quick)
        results.append(r)
        ms = r["ms"]
        print(
            f"{name:<12} {ms['plain']:>9.1f} {ms['moments']:>11.1f} {ms['norms']:>9.1f} "
            f"{r['norms/plain']:>12.2f} {r['norms/moments']:>14.2f} {r['moments/plain']:>14.2f}",
            flush=True,
        )
    for r in results:
        print(f"\n{r['model']}: the form of each variable's norms")
        for line in r["forms"]:
            print("  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
