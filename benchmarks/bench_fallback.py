"""How the exact fallback's cost grows with the batch, against a plain step and against
per-example gradients by `tf.vectorized_map`.

    python benchmarks/bench_fallback.py                  # batches 16, 32, 64, 128
    python benchmarks/bench_fallback.py --batches 16,64 --rounds 5

The model is the kind that still takes the fallback: a sparse embedding lookup
(``tf.nn.embedding_lookup_sparse``, mean of up to 16 ids per example, some padded with -1) under
a two-layer head. The examples' axis is lost at the SparseTensor's ``Where`` (an example's row
is a value there, not an axis), so no rule can prove that example ``j``'s loss depends on
example ``j`` alone, and every variable past the lookup takes the fallback: row ``j`` of the
jacobian of the per-example losses, one backward pass of the whole batch per example
(vectorised by ``pfor``), so the work per example grows with the batch.

For each batch size, in one process and interleaved (`bench_core.time_interleaved`): a plain
SGD step, the moments step (``gradients_and_moments(orders=(1, 2))``, fallback for every
variable) and per-example gradients by ``tf.vectorized_map`` (each example's loss computed on
its own slice, with its moments). Printed: median step times, time per example, ours / plain,
vmap / ours, and the growth of our time per example from the smallest batch to each other one
(1.0 is linear in the batch; the batch ratio is quadratic).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402

VOCAB, DIM, IDS, HIDDEN, CLASSES = 1000, 64, 16, 256, 10
LR = 0.01
ORDERS = (1, 2)


class SparseModel(tf.Module):
    """Mean of the embeddings of an example's ids (-1: padding), then Dense-ReLU-Dense."""

    def __init__(self, seed: int = 0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.table = tf.Variable(rng.normal(0, 0.1, (VOCAB, DIM)).astype("float32"), name="table")
        self.w1 = tf.Variable(rng.normal(0, 0.2, (DIM, HIDDEN)).astype("float32"), name="w1")
        self.b1 = tf.Variable(np.zeros(HIDDEN, "float32"), name="b1")
        self.w2 = tf.Variable(rng.normal(0, 0.2, (HIDDEN, CLASSES)).astype("float32"), name="w2")

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        where = tf.where(ids >= 0)
        sp = tf.SparseTensor(where, tf.gather_nd(ids, where), tf.shape(ids, tf.int64))
        rows = tf.nn.embedding_lookup_sparse(self.table, sp, None, combiner="mean")
        return tf.matmul(tf.nn.relu(tf.matmul(rows, self.w1) + self.b1), self.w2)


def make_data(batch: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(batch, IDS)).astype("int64")
    lengths = rng.integers(1, IDS + 1, size=batch)
    for j, length in enumerate(lengths):
        ids[j, length:] = -1
    return tf.constant(ids), tf.constant(rng.integers(0, CLASSES, size=batch).astype("int32"))


def _losses(logits, y):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


def make_steps(model: SparseModel, with_vmap: bool = True) -> dict:
    variables = list(model.trainable_variables)

    def update(grads):
        for v, g in zip(variables, grads):
            v.assign_sub(LR * tf.convert_to_tensor(g))

    @tf.function(jit_compile=False)
    def plain(x, y):
        loss = tf.reduce_mean(_losses(model(x), y))
        update(tf.gradients(loss, variables))
        return loss

    @tf.function(jit_compile=False)
    def moments(x, y):
        loss = tf.reduce_mean(_losses(model(x), y))
        grads, mom = gradmom.gradients_and_moments(loss, variables, orders=ORDERS)
        update(grads)
        return loss + 0.0 * tf.add_n([tf.reduce_sum(m[2]) for m in mom])

    steps = {"plain": plain, "moments": moments}
    if with_vmap:

        def one_example(xy):
            xi, yi = xy
            with tf.GradientTape() as tape:
                loss = _losses(model(xi[None]), yi[None])[0]
            return [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

        @tf.function(jit_compile=False)
        def vmap(x, y):
            per_ex = tf.vectorized_map(one_example, (x, y))
            update([tf.reduce_mean(g, axis=0) for g in per_ex])
            return 0.0 * tf.add_n([tf.reduce_sum(tf.reduce_mean(g**2, axis=0)) for g in per_ex])

        steps["vmap"] = vmap
    return steps


def paths(model: SparseModel, x, y) -> list[str]:
    """What the core takes for each variable (`plan_moments`), to check it is the fallback."""
    out: list[str] = []

    @tf.function
    def trace(x, y):
        loss = tf.reduce_mean(_losses(model(x), y))
        plan = gradmom.plan_moments(loss, list(model.trainable_variables))
        out.extend(f"{p.name}: {p.path}" for p in plan.variables)
        return loss

    trace(x, y)
    return out


def _reason(message: str) -> str:
    """The line of a TensorFlow error that says what went wrong (not where)."""
    skip = ("Graph execution error", "Detected at node", "File ", "[[", "<")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(skip)]
    return (useful[0] if useful else lines[0] if lines else "")[:200]


def run(batch: int, rounds: int, budget_steps: int, with_vmap: bool) -> dict:
    model = SparseModel()
    x, y = make_data(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning: expected here
        how = paths(model, x, y)
        steps = make_steps(model, with_vmap)
        vmap_error = None
        if "vmap" in steps:
            try:
                steps["vmap"](x, y).numpy()
            except (tf.errors.OpError, ValueError, TypeError) as e:  # pfor cannot vectorise it
                vmap_error = f"{type(e).__name__}: {_reason(str(e))}"
                del steps["vmap"]
        per_round = {name: budget_steps for name in steps}
        times = bench_core.time_interleaved(steps, x, y, rounds, per_round)
    s = bench_core.summarize(times)
    return {
        "batch": batch,
        "paths": how,
        "ms": s["ms"],
        "moments/plain": s["moments/plain"],
        "vmap/moments": s["vmap/moments"],
        "vmap_error": vmap_error,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="16,32,64,128", help="comma-separated batch sizes")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds per batch size")
    ap.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    ap.add_argument("--no-vmap", action="store_true", help="skip tf.vectorized_map")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: batches 8 and 16, one round of one step (checks it runs, not times)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.batches, args.rounds, args.steps = "8,16", 1, 1
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if not batches or min(batches) < 1:
        ap.error(f"--batches needs positive batch sizes, got {args.batches!r}")
    print(
        f"{os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}, orders {ORDERS}, "
        f"{args.rounds} rounds x {args.steps} steps per variant, batches {batches}",
        flush=True,
    )
    results = []
    for batch in batches:
        res = run(batch, args.rounds, args.steps, not args.no_vmap)
        res["load"] = os.getloadavg()[0]
        results.append(res)
        if batch == batches[0]:
            print("paths: " + "; ".join(res["paths"]), flush=True)
        print(f"  batch {batch} done (load {res['load']:.1f})", flush=True)
        if res["vmap_error"]:
            print(f"  tf.vectorized_map fails at batch {batch}: {res['vmap_error']}", flush=True)
    base = results[0]
    base_per_ex = base["ms"]["moments"] / base["batch"]
    print()
    print(
        f"{'batch':>5} {'plain ms':>9} {'ours ms':>9} {'vmap ms':>9} {'ours ms/ex':>10} "
        f"{'vmap ms/ex':>10} {'ours/plain':>10} {'vmap/ours':>9} {'ours/ex growth':>14} "
        f"{'batch ratio':>11}"
    )
    for r in results:
        ms = r["ms"]
        vm = ms.get("vmap")
        growth = (ms["moments"] / r["batch"]) / base_per_ex
        vr = r["vmap/moments"]
        vm_ex = "-" if vm is None else f"{vm / r['batch']:.3f}"
        print(
            f"{r['batch']:>5} {ms['plain']:>9.2f} {ms['moments']:>9.2f} "
            f"{'-' if vm is None else f'{vm:.2f}':>9} {ms['moments'] / r['batch']:>10.3f} "
            f"{vm_ex:>10} {r['moments/plain']:>10.2f} "
            f"{'-' if vr is None else f'{vr:.2f}':>9} {growth:>14.2f} "
            f"{r['batch'] / base['batch']:>11.1f}"
        )
        r["ours_per_example_growth"] = growth
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
