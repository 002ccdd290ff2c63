"""Cost of `gradmom.gradients_and_moments` against a plain SGD step and `tf.vectorized_map`.

    python benchmarks/bench_core.py                # full run (all 4 models, orders 1,2), ~3 min
    python benchmarks/bench_core.py --quick        # smoke run, ~1 min
    python benchmarks/bench_core.py --models transformer,lstm
    python benchmarks/bench_core.py --models mlp --orders 1,2,3,4 --repeats 31
    PYTHONPATH=/path/to/candidate python benchmarks/bench_core.py --also pkg:gradients_and_moments

Models: "mlp" (784-512-512-10, batch 128), "3c3d" (conv net, batch 64), "transformer" (one
encoder block: 4-head self-attention, LayerNorm, MLP 512, LayerNorm, pooled Dense head; batch 32,
sequence 64, width 128) and "lstm" (LSTM(64) over 20 steps of 16 features, Dense head; batch 32).
The LSTM's variables live in a tf.while_loop and go through the loop rule (a copy of the loop
with taps at each use of the variables); the library's warnings are echoed.

For each model, in ONE process, `tf.function` training steps (jit_compile off) are fed the same
synthetic batch and timed interleaved, round after round (the order rotates every round):

- plain:   forward + `tf.gradients` + `v.assign_sub(lr * g)`;
- moments: forward + `gradmom.gradients_and_moments(loss, vars, orders)` + the same update; the
  moments are consumed (a scalar sum of every moment of order >= 2 is returned, so nothing is
  pruned);
- vmap:    per-example gradients by `tf.vectorized_map` over the examples of a per-example
  gradient function (forward included), the mean gradient applied with the same update,
  moments `mean_j g_j ** p` (see `_vmap_matmul_workaround` for the transformer);
- also:    (with --also) the moments step with another implementation, side by side.

Every step is timed on its own (`.numpy()` on a scalar output is the sync point). A variant's time
is the median over all its timed steps; a ratio is the median over rounds of the per-round ratio
of medians (robust to the load of other processes drifting between rounds).

Peak memory: each (model, variant) runs in fresh subprocesses
(`--memory-child plain|moments --model NAME`) with `TF_CPU_ALLOCATOR_USE_BFC=true`, which makes
`tf.config.experimental.get_memory_info("CPU:0")` count every allocation; the peak is reset after
a warm-up step and read after a few steps; median of several runs. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

try:
    import tb_gradmom as gradmom
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import tb_gradmom as gradmom

import keras  # noqa: E402

MODELS = {
    # name: (batch, input shape, classes)
    "mlp": (128, (784,), 10),
    "3c3d": (64, (32, 32, 3), 10),
    # one encoder block on [batch, sequence, width] inputs (no embedding: the inputs are the
    # token vectors)
    "transformer": (32, (64, 128), 10),
    # [batch, time steps, features]
    "lstm": (32, (20, 16), 10),
}
TARGETS = {"mlp": 1.3, "3c3d": 1.6, "transformer": 1.6, "lstm": 2.5}  # moments / plain
VMAP_TARGET = {"mlp": 10.0}  # vmap / ours, at least
MEMORY_TARGET = 1.5  # peak moments / peak plain, conv net
LR = 1e-3
MB = 1 << 20
# Steps timed per variant per round (vmap is slow: fewer of its steps, same number of rounds).
PER_ROUND = {
    "mlp": {"plain": 20, "moments": 20, "vmap": 3, "also": 20},
    "3c3d": {"plain": 5, "moments": 5, "vmap": 2, "also": 5},
    "transformer": {"plain": 5, "moments": 5, "vmap": 5, "also": 5},
    # the fallback makes the moments step ~20x a plain one: fewer of its steps per round
    "lstm": {"plain": 20, "moments": 4, "vmap": 6, "also": 4},
}
PER_ROUND_QUICK = {
    "mlp": {"plain": 10, "moments": 10, "vmap": 2, "also": 10},
    "3c3d": {"plain": 3, "moments": 3, "vmap": 1, "also": 3},
    "transformer": {"plain": 3, "moments": 3, "vmap": 3, "also": 3},
    "lstm": {"plain": 10, "moments": 2, "vmap": 3, "also": 2},
}
# Models whose variables (some or all) have no exact rule and go through the library's exact
# fallback (per-example gradients of the per-example losses by vectorised autodiff): no target.
# None since the loop rule covers the LSTM.
FALLBACK_NOTE: dict[str, str] = {}


# --------------------------------------------------------------------------------------- models
def build_model(name: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = keras.layers
    batch, shape, classes = MODELS[name]
    if name == "mlp":
        model = keras.Sequential(
            [
                keras.Input(shape),
                layers.Dense(512, activation="relu"),
                layers.Dense(512, activation="relu"),
                layers.Dense(classes),
            ]
        )
    elif name == "3c3d":
        model = keras.Sequential(
            [
                keras.Input(shape),
                layers.Conv2D(64, 5, padding="valid", activation="relu"),
                layers.MaxPooling2D(3, strides=2, padding="same"),
                layers.Conv2D(96, 3, padding="valid", activation="relu"),
                layers.MaxPooling2D(3, strides=2, padding="same"),
                layers.Conv2D(128, 3, padding="same", activation="relu"),
                layers.MaxPooling2D(3, strides=2, padding="same"),
                layers.Flatten(),
                layers.Dense(512, activation="relu"),
                layers.Dense(256, activation="relu"),
                layers.Dense(classes),
            ]
        )
    elif name == "transformer":
        seq, width = shape
        inp = keras.Input(shape)
        att = layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(inp, inp)
        h = layers.LayerNormalization()(inp + att)
        f = layers.Dense(4 * width, activation="relu")(h)
        f = layers.Dense(width)(f)
        h = layers.LayerNormalization()(h + f)
        h = layers.GlobalAveragePooling1D()(h)
        model = keras.Model(inp, layers.Dense(classes)(h))
    elif name == "lstm":
        model = keras.Sequential([keras.Input(shape), layers.LSTM(64), layers.Dense(classes)])
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return model


def make_data(name: str):
    batch, shape, classes = MODELS[name]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, *shape)).astype(np.float32))
    y = tf.constant(rng.integers(0, classes, size=batch).astype(np.int32))
    return x, y


def per_example_losses(logits, y):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


# ---------------------------------------------------------------------------------------- steps
@contextlib.contextmanager
def _vmap_matmul_workaround():
    """Works around a crash of TF 2.21's oneDNN batch matmul under `tf.vectorized_map`.

    `tf.matmul` of a ``[a, 1, m, k]`` tensor with a ``[k, n]`` one segfaults on CPU with oneDNN on
    (the default), eagerly and in graphs (``[2, 1, 64, 16]`` by ``[16, 8]`` does, ``[2, 1, 8, 128]``
    by ``[128, 8]`` does not; ``[32, 2, 64, 128]`` does not). Keras' EinsumDense (the projections
    of MultiHeadAttention) does ``tf.matmul(x[1, seq, width], kernel)`` on a batch of one
    example, which pfor turns into exactly that. While this context is active (the tracing of
    the vmap step only), pfor's converter for BatchMatMulV2 computes "stacked ``x`` of rank >= 4
    times an unstacked matrix" as one 2-D MatMul on ``x`` reshaped to ``[-1, k]``, the way pfor
    already converts MatMul; every other case goes to TF's own converter. The same numbers, and
    the same time as TF's conversion where that one runs (1.00x, measured with oneDNN off).
    The MLP, 3C3D and LSTM vmap graphs have no such op: for them nothing changes.
    """
    try:
        from tensorflow.python.ops.parallel_for import pfor as pfor_lib

        registry = pfor_lib._pfor_converter_registry
        original = registry["BatchMatMulV2"]
    except (ImportError, AttributeError, KeyError):  # another TF layout: nothing to patch
        yield
        return

    def converter(pfor_input):
        x, x_stacked, _ = pfor_input.input(0)
        y, y_stacked, _ = pfor_input.input(1)
        if (
            x_stacked
            and not y_stacked
            and x.shape.rank is not None
            and x.shape.rank >= 4
            and y.shape.rank == 2
            and not pfor_input.get_attr("adj_x")
        ):
            shape = tf.shape(x)
            out = tf.matmul(
                tf.reshape(x, [-1, shape[-1]]), y, adjoint_b=pfor_input.get_attr("adj_y")
            )
            out = tf.reshape(out, tf.concat([shape[:-1], tf.shape(out)[-1:]], 0))
            return pfor_lib.wrap(out, True)
        return original(pfor_input)

    registry["BatchMatMulV2"] = converter
    try:
        yield
    finally:
        registry["BatchMatMulV2"] = original


def make_steps(model, orders, chunk_size=None, with_vmap=True, also=None) -> dict:
    """The training steps as tf.functions returning a scalar (the sync point).

    `also`: another ``gradients_and_moments``-compatible function, timed as "also".
    """
    variables = list(model.trainable_variables)
    higher = [p for p in orders if p > 1]

    def update(grads):
        for v, g in zip(variables, grads):
            v.assign_sub(LR * g)

    @tf.function(jit_compile=False)
    def plain(x, y):
        loss = tf.reduce_mean(per_example_losses(model(x, training=True), y))
        grads = tf.gradients(loss, variables)
        update(grads)
        return loss

    def moments_step(fn):
        @tf.function(jit_compile=False)
        def moments(x, y):
            loss = tf.reduce_mean(per_example_losses(model(x, training=True), y))
            grads, mom = fn(loss, variables, orders=orders, chunk_size=chunk_size)
            update(grads)
            used = [tf.reduce_sum(m[p]) for m in mom for p in higher]
            return loss + 0.0 * tf.add_n(used) if used else loss

        return moments

    steps = {"plain": plain, "moments": moments_step(gradmom.gradients_and_moments)}
    if also is not None:
        steps["also"] = moments_step(also)
    if with_vmap:

        def one_example(xy):
            xi, yi = xy
            with tf.GradientTape() as tape:
                loss = per_example_losses(model(xi[None], training=True), yi[None])[0]
            return tape.gradient(loss, variables)

        @tf.function(jit_compile=False)
        def vmap(x, y):
            with _vmap_matmul_workaround():
                per_ex = tf.vectorized_map(one_example, (x, y))
            grads = [tf.reduce_mean(g, axis=0) for g in per_ex]
            update(grads)
            out = tf.constant(0.0)
            for g in per_ex:
                for p in higher:
                    out += tf.reduce_sum(tf.reduce_mean(g**p, axis=0))
            return 0.0 * out

        steps["vmap"] = vmap
    return steps


def time_interleaved(steps: dict, x, y, rounds: int, per_round: dict, warmup: int = 2):
    """Per-variant lists of per-round lists of step times (seconds), interleaved, rotating.

    `per_round[name]` is how many steps of that variant one round times, one by one.
    """
    names = list(steps)
    for name in names:  # trace + warm up (not timed)
        for _ in range(warmup):
            steps[name](x, y).numpy()
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, samples = steps[name], []
            for _ in range(per_round[name]):
                t0 = time.perf_counter()
                fn(x, y).numpy()
                samples.append(time.perf_counter() - t0)
            times[name].append(samples)
    return times


def summarize(times: dict) -> dict:
    med = {k: statistics.median([t for rnd in v for t in rnd]) for k, v in times.items()}
    per_round = {k: [statistics.median(rnd) for rnd in v] for k, v in times.items()}

    def ratio(a, b):
        if a not in per_round or b not in per_round:
            return None
        return statistics.median([x / y for x, y in zip(per_round[a], per_round[b])])

    return {
        "ms": {k: 1e3 * v for k, v in med.items()},
        "moments/plain": ratio("moments", "plain"),
        "vmap/moments": ratio("vmap", "moments"),
        "also/plain": ratio("also", "plain"),
        "also/moments": ratio("also", "moments"),
        "per_round_ms": {k: [1e3 * t for t in v] for k, v in per_round.items()},
    }


# --------------------------------------------------------------------------------------- memory
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _load(path: str | None):
    if not path:
        return None
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr or "gradients_and_moments")


def memory_child(
    model_name: str, variant: str, orders, steps: int, chunk_size=None, also=None
) -> dict:
    """Runs in a fresh process: peak allocator bytes and RSS growth of one step variant."""
    model = build_model(model_name)
    x, y = make_data(model_name)
    fn = make_steps(
        model, orders, chunk_size=chunk_size, with_vmap=variant == "vmap", also=_load(also)
    )[variant]
    fn.get_concrete_function(x, y)  # trace, no execution
    rss0 = _rss_bytes()
    fn(x, y).numpy()  # warm-up: graph optimisation, kernel caches, oneDNN primitives
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]  # held between steps
    tf.config.experimental.reset_memory_stats("CPU:0")
    for _ in range(steps):
        fn(x, y).numpy()
    info = tf.config.experimental.get_memory_info("CPU:0")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "model": model_name,
        "variant": variant,
        "allocator": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "default"),
        "alloc_peak": int(info["peak"]),
        "alloc_base": int(base),
        "alloc_step": int(info["peak"] - base),
        "rss_traced": int(rss0),
        "maxrss": int(maxrss),
        "rss_growth": int(maxrss - rss0),
    }


def run_memory(
    model_name: str, variant: str, orders, steps: int, chunk_size=None, bfc: bool = True, also=None
) -> dict:
    """One memory child. `bfc`: TF_CPU_ALLOCATOR_USE_BFC=true, so every allocation is counted."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-child",
        variant,
        "--model",
        model_name,
        "--orders",
        ",".join(map(str, orders)),
        "--memory-steps",
        str(steps),
    ]
    if chunk_size:
        cmd += ["--chunk-size", str(chunk_size)]
    if also:
        cmd += ["--also", also]
    env = dict(os.environ)
    env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)
    if bfc:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"memory child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_memory_set(name: str, orders, args) -> dict:
    """Fresh-process peaks, plain and moments interleaved, `args.memory_repeats` of each.

    The peak depends on the order in which the executor runs independent ops, which varies
    from run to run, so the median (and the range) over repeats is reported.
    """
    steps = 2 if args.quick else 5
    repeats = args.memory_repeats or (1 if args.quick else 3)
    modes = [("bfc", True)] + ([("default", False)] if args.memory_default_allocator else [])
    out = {}
    for mode, bfc in modes:
        runs = {"plain": [], "moments": []}
        if args.also:
            runs["also"] = []
        for _ in range(repeats):
            for v in runs:
                runs[v].append(
                    run_memory(name, v, orders, steps, args.chunk_size, bfc=bfc, also=args.also)
                )
        out[mode] = {
            v: {
                "runs": rs,
                **{
                    k: statistics.median(r[k] for r in rs)
                    for k in ("alloc_peak", "alloc_base", "alloc_step", "rss_growth")
                },
                "alloc_peak_min": min(r["alloc_peak"] for r in rs),
                "alloc_peak_max": max(r["alloc_peak"] for r in rs),
            }
            for v, rs in runs.items()
        }
    return out


# ----------------------------------------------------------------------------------------- main
def _fmt(v, spec):
    return "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)


def _mark(ok):
    return "ok" if ok else "MISS"


def print_table(results: list[dict], orders) -> None:
    print()
    print(f"orders {tuple(orders)}; times: median ms per step; ratios: median of per-round ratios")
    w = max([5] + [len(r["model"]) for r in results])
    head = (
        f"{'model':<{w}} {'plain':>7} {'moments':>8} {'ratio':>6} {'target':<10} "
        f"{'vmap':>8} {'vmap/ours':>9} {'target':<9} "
        f"{'peak MB plain':>13} {'moments':>8} {'ratio':>6} {'target':<9}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        name, s, mem = r["model"], r["summary"], r.get("memory")
        ms = s["ms"]
        ratio, vr = s["moments/plain"], s["vmap/moments"]
        t, vt = TARGETS.get(name), VMAP_TARGET.get(name)
        tcol = f"<={t} {_mark(ratio <= t)}" if t else ("fallback" if name in FALLBACK_NOTE else "")
        vcol = f">={vt:g} {_mark(vr >= vt)}" if vt and vr is not None else ""
        vspec = "9.2f" if vr is not None and vr < 10 else "9.1f"  # vmap can beat ours
        mp = mm = mr = None
        mcol = ""
        if mem:
            mp, mm = (
                mem["bfc"]["plain"]["alloc_peak"] / MB,
                mem["bfc"]["moments"]["alloc_peak"] / MB,
            )
            mr = mm / mp
            if name == "3c3d":
                mcol = f"<={MEMORY_TARGET} {_mark(mr <= MEMORY_TARGET)}"
        print(
            f"{name:<{w}} {ms['plain']:>7.2f} {ms['moments']:>8.2f} {ratio:>6.2f} {tcol:<10} "
            f"{_fmt(ms.get('vmap'), '8.1f')} {_fmt(vr, vspec)} {vcol:<9} "
            f"{_fmt(mp, '13.1f')} {_fmt(mm, '8.1f')} {_fmt(mr, '6.2f')} {mcol:<9}"
        )
    for r in results:
        s = r["summary"]
        if s.get("also/plain") is not None:
            print(
                f"{r['model']:<{w}} --also: {s['ms']['also']:.2f} ms, "
                f"{s['also/plain']:.2f}x plain, "
                f"{s['also/moments']:.2f}x the current gradients_and_moments"
            )
    for r in results:
        # the library's warnings were echoed while timing; here: the expected fallback (the
        # LSTM), and any warning on a model that should not have one (every variable of the
        # MLP, 3C3D and the transformer has an exact rule)
        if r["model"] in FALLBACK_NOTE:
            print(f"{r['model']:<{w}} {FALLBACK_NOTE[r['model']]}")
        else:
            for msg in r.get("warnings", []):
                print(f"{r['model']:<{w}} UNEXPECTED library warning: {msg}")
    if any(r.get("memory") for r in results):
        print()
        print(
            "peak MB: TF CPU allocator peak bytes in use during the steps, in a fresh process per"
        )
        print(
            "run with TF_CPU_ALLOCATOR_USE_BFC=true (every allocation counted), median of the runs;"
        )
        print(
            "it includes what is held between steps (variables, inputs). Step-only = peak - held."
        )
        for r in results:
            mem = r.get("memory")
            if not mem:
                continue
            for mode in mem:
                p, m = mem[mode]["plain"], mem[mode]["moments"]
                print(
                    f"  {r['model']:<{w}} {mode:<8} peak plain {p['alloc_peak'] / MB:.1f} "
                    f"[{p['alloc_peak_min'] / MB:.1f}-{p['alloc_peak_max'] / MB:.1f}] MB, "
                    f"moments {m['alloc_peak'] / MB:.1f} "
                    f"[{m['alloc_peak_min'] / MB:.1f}-{m['alloc_peak_max'] / MB:.1f}] MB; "
                    f"held {p['alloc_base'] / MB:.1f} MB; step-only {p['alloc_step'] / MB:.1f} / "
                    f"{m['alloc_step'] / MB:.1f} MB "
                    f"({m['alloc_step'] / max(p['alloc_step'], 1):.2f}x); {len(p['runs'])} runs each"
                )
                if "also" in mem[mode]:
                    a = mem[mode]["also"]
                    print(
                        f"  {r['model']:<{w}} {mode:<8} --also peak {a['alloc_peak'] / MB:.1f} "
                        f"[{a['alloc_peak_min'] / MB:.1f}-{a['alloc_peak_max'] / MB:.1f}] MB "
                        f"({a['alloc_peak'] / p['alloc_peak']:.2f}x plain)"
                    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated, from: {', '.join(MODELS)} (default: all)",
    )
    ap.add_argument("--orders", default="1,2", help="comma-separated moment orders (1-4)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 21)")
    ap.add_argument("--quick", action="store_true", help="few rounds, short memory runs (~1 min)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: the MLP, two rounds, one memory run per variant (checks it runs, not times)",
    )
    ap.add_argument("--no-vmap", action="store_true", help="skip the tf.vectorized_map variant")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    ap.add_argument("--chunk-size", type=int, default=None, help="chunk_size= for ours")
    ap.add_argument(
        "--memory-repeats", type=int, default=None, help="fresh-process runs per variant (3)"
    )
    ap.add_argument(
        "--memory-default-allocator",
        action="store_true",
        help="also measure with TF's default CPU allocator (counts only allocations >= 256 KiB)",
    )
    ap.add_argument("--json", default=None, help="also write the full results to this file")
    ap.add_argument(
        "--also",
        default=None,
        metavar="MODULE:FUNCTION",
        help="time another gradients_and_moments-compatible function side by side "
        "(e.g. a candidate implementation on PYTHONPATH)",
    )
    ap.add_argument(
        "--memory-child", choices=["plain", "moments", "vmap", "also"], help=argparse.SUPPRESS
    )
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--memory-steps", type=int, default=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    orders = tuple(int(p) for p in args.orders.split(",") if p.strip())
    if args.smoke:
        args.quick, args.models, args.repeats, args.memory_repeats = True, "mlp", 2, 1

    if args.memory_child:
        res = memory_child(
            args.model, args.memory_child, orders, args.memory_steps, args.chunk_size, args.also
        )
        print(json.dumps(res))
        return 0

    rounds = args.repeats or (3 if args.quick else 21)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    print(
        f"TF {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs, "
        f"load avg {os.getloadavg()[0]:.1f}, orders {orders}, {rounds} rounds",
        flush=True,
    )
    also = _load(args.also)
    results = []
    for name in models:
        t0 = time.perf_counter()
        model = build_model(name)
        x, y = make_data(name)
        steps = make_steps(
            model, orders, chunk_size=args.chunk_size, with_vmap=not args.no_vmap, also=also
        )
        per_round = PER_ROUND_QUICK[name] if args.quick else PER_ROUND[name]
        with warnings.catch_warnings(record=True) as caught:  # the steps are traced in here
            warnings.simplefilter("always")
            times = time_interleaved(steps, x, y, rounds, per_round)
        # the library's own warnings (e.g. "no exact rule ... exact fallback"), once each
        msgs = list(dict.fromkeys(str(c.message) for c in caught if "tb_gradmom" in str(c.message)))
        for msg in msgs:
            print(f"  {name}: {msg}", flush=True)
        summ = summarize(times)
        res = {"model": name, "summary": summ, "warnings": msgs}
        spread = ", ".join(
            f"{k} {min(v):.1f}-{max(v):.1f}" for k, v in summ["per_round_ms"].items()
        )
        print(
            f"  {name}: timed in {time.perf_counter() - t0:.0f}s; per-round ms {spread}", flush=True
        )
        if not args.no_memory:
            res["memory"] = run_memory_set(name, orders, args)
        results.append(res)
    print_table(results, orders)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"orders": orders, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
