"""Cost of `gradmom.gradients_and_moments` on real networks, against a plain SGD step and
per-example gradients by `tf.vectorized_map`.

    python benchmarks/bench_zoo.py --quick                   # short run: 3 rounds, 1 memory run
    python benchmarks/bench_zoo.py --smoke                   # CI: the LSTM, small, 2 rounds
    python benchmarks/bench_zoo.py                           # every model, 11 rounds, 3 memory runs
    python benchmarks/bench_zoo.py --models bert,gpt2 --rounds 21 --json zoo.json
    python benchmarks/bench_zoo.py --models resnet50 --batch 8   # a smaller size, labelled
    python benchmarks/bench_zoo.py --models DenseNet121,Xception --no-vmap   # other applications

Models (float32, seed 0, no download; see `MODELS`):

- CNNs from `keras.applications` (``weights=None``, 10 classes, logits), batch 16 of 64x64x3:
  "resnet50", "mobilenetv2" (alpha 1.0), "efficientnetb0", "convnexttiny"; any other
  `keras.applications` model by its class name (``--models DenseNet121,Xception``), built the
  same way (96x96x3 for the models that need more than 64x64, see `APP_SIDES`);
- transformer backbones from `keras_hub` configs, 4 layers, width 256, 4 heads, MLP 1024,
  sequence 128, vocabulary 8192, batch 16 (dropout 0.1 as in the presets): "bert" (`BertBackbone`,
  `Dense(10)` on the pooled output) and "gpt2" (`GPT2Backbone`, mean over positions,
  `Dense(10)`);
- "lstm" and "gru": `LSTM(128)` / `GRU(128)` over 50 steps of 32 features, `Dense(10)`,
  batch 64. Their recurrent variables live in a ``tf.while_loop`` and go through the loop rule
  (``tb_gradmom/core/rules/loops/``).

The loss is ``mean(sparse_softmax_cross_entropy_with_logits)``; ``training=True`` everywhere
(BatchNormalization uses the batch statistics; dropout is on).

Method (the one of `bench_core.py`). Each model runs in its own fresh process
(``--timing-child MODEL``), which builds the model and three `tf.function` steps (jit_compile
off), fed the same synthetic batch:

- plain:   forward, `tf.GradientTape` gradient, ``optimizer.apply_gradients`` (Keras SGD);
- moments: forward, ``gradmom.gradients_and_moments(loss, vars, orders=(1, 2))``, the same
  ``apply_gradients``; the step returns ``loss + 0 * sum(M_2)`` so no moment op is pruned;
- vmap:    per-example gradients by ``tf.vectorized_map`` of a one-example forward and tape
  gradient, the mean gradient applied, and ``mean_j g_j ** 2`` consumed likewise
  (`bench_core._vmap_matmul_workaround` avoids a oneDNN crash on the transformers).

Each step is traced and called twice (untimed), then timed in interleaved rounds whose variant
order rotates; per round, each variant runs as many steps as fill about ``--budget`` seconds (at
least one). A variant's time is the median of all its steps; a ratio is the median over rounds
of the per-round ratio of medians. While the moments step is traced, `tb_gradmom.core.plan.make_plan`
is wrapped to read, per variable, the rule that computes it or why it is on the exact fallback
(``Plan.variables[i].fallback``); the library's warnings are recorded.

Peak memory and compile time: for each model, plain and moments alternate in fresh processes
(``--memory-child VARIANT``) with ``TF_CPU_ALLOCATOR_USE_BFC=true`` (every allocation counted by
``tf.config.experimental.get_memory_info("CPU:0")``). Each child builds the model, runs one
eager forward pass (Keras' one-off costs, shared by both variants), imports tb_gradmom's
lazily loaded modules (about 0.1 s, a one-off cost that would otherwise fall in the moments
step's trace), then times the trace
(``get_concrete_function``) and the first call (graph optimisation, kernels), reads the bytes
held, resets the peak, runs a few steps and reads the peak. Median over ``--memory-repeats``.

The load average (`os.getloadavg`) is recorded at the start and end of every model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1 << 20
LR = 1e-3
ORDERS = (1, 2)
CLASSES = 10

# name: family, default batch, size (CNN side or sequence length), short label
MODELS = {
    "resnet50": ("cnn", 16, 64, "ResNet50"),
    "mobilenetv2": ("cnn", 16, 64, "MobileNetV2 (alpha 1.0)"),
    "efficientnetb0": ("cnn", 16, 64, "EfficientNetB0"),
    "convnexttiny": ("cnn", 16, 64, "ConvNeXtTiny"),
    "bert": ("hub", 16, 128, "BERT backbone (keras_hub)"),
    "gpt2": ("hub", 16, 128, "GPT-2 backbone (keras_hub)"),
    "lstm": ("rnn", 64, 50, "LSTM(128) classifier"),
    "gru": ("rnn", 64, 50, "GRU(128) classifier"),
}
# moments / plain, at most (issue 12, orders (1, 2), this 2-core CPU)
TARGETS = {"cnn": 1.6, "hub": 1.4, "rnn": 2.5}
VMAP_TARGET = 1.0  # vmap / ours, more than
MEMORY_TARGET = 1.5  # peak moments / peak plain, at most
COMPILE_TARGET = 2.0  # (trace + first call) moments / plain, at most
# Any other `keras.applications` model by its class name (e.g. "DenseNet121"), as a CNN at batch
# 16 of 64x64x3, or of APP_SIDES' side where the model needs a larger input.
APP_SIDES = {"Xception": 96, "InceptionV3": 96, "InceptionResNetV2": 96}
HUB = dict(num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, dropout=0.1)
VOCAB = 8192
RNN_FEATURES = 32
RNN_UNITS = 128


def _tf():
    import tensorflow as tf

    return tf


def _gradmom():
    try:
        import tb_gradmom as gradmom
    except ImportError:  # running from a checkout without installing
        sys.path.insert(0, os.path.join(HERE, ".."))
        import tb_gradmom as gradmom
    return gradmom


def _bench_core():
    sys.path.insert(0, HERE)
    import bench_core

    return bench_core


# --------------------------------------------------------------------------------------- models
def model_spec(name: str) -> tuple:
    """(family, default batch, default size, label) of a model of `MODELS` or of a
    `keras.applications` model given by its class name; ValueError for anything else."""
    if name in MODELS:
        return MODELS[name]
    import keras

    app = getattr(keras.applications, name, None)
    if name[:1].isupper() and callable(app):
        return ("cnn", 16, APP_SIDES.get(name, 64), f"{name} (keras.applications)")
    raise ValueError(
        f"unknown model {name!r}; choose from {', '.join(MODELS)}, or a keras.applications "
        "model by its class name (e.g. DenseNet121)"
    )


def build(name: str, batch: int, size: int):
    """(model, x, y): the model, a synthetic batch (a tensor, or a dict of tensors) and labels."""
    import keras
    import numpy as np

    tf = _tf()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    family = model_spec(name)[0]
    y = tf.constant(rng.integers(0, CLASSES, size=batch).astype(np.int32))
    if family == "cnn":
        shape = (size, size, 3)
        kw = dict(input_shape=shape, weights=None, classes=CLASSES, classifier_activation=None)
        if name == "resnet50":
            model = keras.applications.ResNet50(**kw)
        elif name == "mobilenetv2":
            model = keras.applications.MobileNetV2(alpha=1.0, **kw)
        elif name == "efficientnetb0":
            model = keras.applications.EfficientNetB0(**kw)
        elif name == "convnexttiny":
            model = keras.applications.ConvNeXtTiny(**kw)
        else:
            model = getattr(keras.applications, name)(**kw)
        x = tf.constant(rng.standard_normal((batch, *shape)).astype(np.float32))
    elif family == "hub":
        import keras_hub

        if name == "bert":
            backbone = keras_hub.models.BertBackbone(
                vocabulary_size=VOCAB, max_sequence_length=size, **HUB
            )
            features = backbone(backbone.input)["pooled_output"]
        else:
            backbone = keras_hub.models.GPT2Backbone(
                vocabulary_size=VOCAB, max_sequence_length=size, **HUB
            )
            features = keras.layers.GlobalAveragePooling1D()(backbone(backbone.input))
        logits = keras.layers.Dense(CLASSES)(features)
        model = keras.Model(backbone.input, logits)
        x = {
            "token_ids": tf.constant(rng.integers(1, VOCAB, size=(batch, size)).astype(np.int32)),
            "padding_mask": tf.ones((batch, size), tf.int32),
        }
        if name == "bert":
            seg = np.zeros((batch, size), np.int32)
            seg[:, size // 2 :] = 1
            x["segment_ids"] = tf.constant(seg)
    else:
        layer = keras.layers.LSTM if name == "lstm" else keras.layers.GRU
        model = keras.Sequential(
            [
                keras.Input((size, RNN_FEATURES)),
                layer(RNN_UNITS),
                keras.layers.Dense(CLASSES),
            ]
        )
        x = tf.constant(rng.standard_normal((batch, size, RNN_FEATURES)).astype(np.float32))
    return model, x, y


def describe(name: str, batch: int, size: int) -> str:
    family = model_spec(name)[0]
    if family == "cnn":
        return f"b{batch} {size}x{size}x3"
    if family == "hub":
        return f"b{batch} T{size}"
    return f"b{batch} T{size}"


# ---------------------------------------------------------------------------------------- steps
def make_steps(model, variants=("plain", "moments", "vmap")) -> dict:
    """The training steps, tf.functions of (x, y) returning a scalar (the sync point)."""
    import keras

    tf = _tf()
    gradmom = _gradmom()
    variables = list(model.trainable_variables)
    optimizer = keras.optimizers.SGD(LR)
    optimizer.build(variables)

    def loss_of(x, y):
        logits = model(x, training=True)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        )

    @tf.function(jit_compile=False)
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(x, y)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    @tf.function(jit_compile=False)
    def moments(x, y):
        loss = loss_of(x, y)
        grads, mom = gradmom.gradients_and_moments(loss, variables, orders=ORDERS)
        optimizer.apply_gradients(zip(grads, variables))
        used = [tf.reduce_sum(m[p]) for m in mom for p in ORDERS if p > 1]
        return loss + 0.0 * tf.add_n(used)

    def one_example(xy):
        xi, yi = xy
        xi = tf.nest.map_structure(lambda t: t[None], xi)
        with tf.GradientTape() as tape:
            logits = model(xi, training=True)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yi[None], logits=logits)
            loss = loss[0]
        return tape.gradient(loss, variables)

    @tf.function(jit_compile=False)
    def vmap(x, y):
        with _bench_core()._vmap_matmul_workaround():
            per_ex = tf.vectorized_map(one_example, (x, y))
        per_ex = [tf.convert_to_tensor(g) for g in per_ex]
        optimizer.apply_gradients(zip([tf.reduce_mean(g, axis=0) for g in per_ex], variables))
        out = tf.add_n(
            [tf.reduce_sum(tf.reduce_mean(g**p, axis=0)) for g in per_ex for p in ORDERS if p > 1]
        )
        return 0.0 * out

    steps = {"plain": plain, "moments": moments, "vmap": vmap}
    return {k: steps[k] for k in variants}


def spy_plans():
    """Collects the `Plan`s `gradients_and_moments` makes while tracing (the zoo test's spy,
    `tests.zoo_worker.spy_plans`)."""
    root = os.path.dirname(HERE)
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.zoo_worker import spy_plans as spy

    return spy()


def paths_of(plan) -> list[dict]:
    """Per variable: its name, shape, and the rule (first consumer's op type) or the fallback."""
    out = []
    for i, vplan in enumerate(plan.variables):
        shape = [int(d) for d in vplan.variable.shape]
        if vplan.fallback is not None:
            out.append({"name": vplan.name, "shape": shape, "fallback": str(vplan.fallback)})
        else:
            try:
                rule = plan.op_type(i)
            except Exception:  # noqa: BLE001 - informational only
                rule = "?"
            out.append(
                {"name": vplan.name, "shape": shape, "rule": rule, "coupled": bool(vplan.coupling)}
            )
    return out


# ----------------------------------------------------------------------------------- timing child
def _sync(fn, x, y):
    return fn(x, y).numpy()


def timing_child(name: str, batch: int, size: int, rounds: int, budget: float, vmap: bool) -> dict:
    tf = _tf()
    load0 = os.getloadavg()
    model, x, y = build(name, batch, size)
    variants = ("plain", "moments", "vmap") if vmap else ("plain", "moments")
    steps = make_steps(model, variants)
    model(x, training=False)  # Keras' one-off costs, outside the timed traces
    compile_s, prepared, caught, vmap_error = {}, [], [], None
    for v in variants:
        with warnings.catch_warnings(record=True) as rec, spy_plans() as seen:
            warnings.simplefilter("always")
            try:
                t0 = time.perf_counter()
                steps[v].get_concrete_function(x, y)
                t1 = time.perf_counter()
                _sync(steps[v], x, y)
                t2 = time.perf_counter()
            except Exception as e:  # noqa: BLE001 - tf.vectorized_map fails on some models
                if v != "vmap":
                    raise
                vmap_error = f"{type(e).__name__}: " + " ".join(
                    ln.strip() for ln in str(e).splitlines() if ln.strip() and "File " not in ln
                )
                continue
        compile_s[v] = {"trace": t1 - t0, "first_call": t2 - t1}
        if v == "moments":
            prepared = seen
        caught += [str(r.message) for r in rec]
        _sync(steps[v], x, y)
    if vmap_error is not None:
        variants = tuple(v for v in variants if v != "vmap")
    msgs = list(dict.fromkeys(m for m in caught if m.startswith("tb_gradmom")))
    # steps per round: enough to fill `budget` seconds, at least one
    probe = {}
    for v in variants:
        t0 = time.perf_counter()
        _sync(steps[v], x, y)
        probe[v] = time.perf_counter() - t0
    per_round = {v: max(1, min(20, round(budget / probe[v]))) for v in variants}
    times = {v: [] for v in variants}
    names = list(variants)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for v in order:
            samples = []
            for _ in range(per_round[v]):
                t0 = time.perf_counter()
                _sync(steps[v], x, y)
                samples.append(time.perf_counter() - t0)
            times[v].append(samples)
    load1 = os.getloadavg()
    per = {v: [statistics.median(s) for s in times[v]] for v in variants}

    def ratios(a, b):
        return [p / q for p, q in zip(per[a], per[b])]

    out = {
        "model": name,
        "shape": describe(name, batch, size),
        "batch": batch,
        "size": size,
        "params": int(sum(int(tf.size(v)) for v in model.trainable_variables)),
        "variables": len(model.trainable_variables),
        "rounds": rounds,
        "per_round": per_round,
        "ms": {v: 1e3 * statistics.median([t for s in times[v] for t in s]) for v in variants},
        "per_round_ms": {v: [1e3 * t for t in per[v]] for v in variants},
        "moments/plain": statistics.median(ratios("moments", "plain")),
        "moments/plain_range": [min(ratios("moments", "plain")), max(ratios("moments", "plain"))],
        "compile_s_in_process": compile_s,
        "warnings": msgs,
        "paths": paths_of(prepared[0]) if prepared else None,
        "load": [load0[0], load1[0]],
        "tf": tf.__version__,
    }
    out["gradmom"] = os.path.dirname(_gradmom().__file__)
    if vmap_error is not None:
        out["vmap_error"] = vmap_error[-600:]
    elif vmap:
        out["vmap/moments"] = statistics.median(ratios("vmap", "moments"))
        out["vmap/moments_range"] = [
            min(ratios("vmap", "moments")),
            max(ratios("vmap", "moments")),
        ]
    return out


# ----------------------------------------------------------------------------------- memory child
def memory_child(name: str, batch: int, size: int, variant: str, steps: int) -> dict:
    tf = _tf()
    model, x, y = build(name, batch, size)
    fn = make_steps(model, (variant,))[variant]
    model(x, training=False)  # Keras' one-off costs (shared by every variant)
    # tb_gradmom imports its modules lazily, on first use: the moments step's trace would
    # include the import (about 0.1 s), a one-off cost like Keras' and TF's own imports
    _gradmom().gradients_and_moments  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        fn.get_concrete_function(x, y)
        t1 = time.perf_counter()
        _sync(fn, x, y)
        t2 = time.perf_counter()
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]  # held between steps
    tf.config.experimental.reset_memory_stats("CPU:0")
    for _ in range(steps):
        _sync(fn, x, y)
    info = tf.config.experimental.get_memory_info("CPU:0")
    return {
        "variant": variant,
        "allocator": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "default"),
        "trace": t1 - t0,
        "first_call": t2 - t1,
        "alloc_peak": int(info["peak"]),
        "alloc_base": int(base),
        "alloc_step": int(info["peak"] - base),
        "load": os.getloadavg()[0],
    }


# ------------------------------------------------------------------------------------ profiling
def _op_self_times(xspace_path: str) -> dict:
    """``{op name: (op type, self time in ms)}`` summed over a profile's executor threads.

    TF's profiler records each kernel as a ``"<op name>:<op type>"`` event on the executor's
    threads; a nested event (a function call's ops run inline) is subtracted from its parent.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xspace_path, "rb") as f:
        space.ParseFromString(f.read())
    out: dict = {}
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        md = plane.event_metadata
        for line in plane.lines:
            if line.name == "python" or "Eigen" in line.name:
                continue
            evs = []
            for e in line.events:
                nm = md[e.metadata_id].name
                if ":" not in nm or ": " in nm or nm.startswith(("Threadpool", "Executor")):
                    continue
                evs.append((e.offset_ps, e.offset_ps + e.duration_ps, nm))
            evs.sort(key=lambda t: (t[0], -t[1]))
            stack: list = []  # [end, name, child time]
            for start, end, nm in evs:
                while stack and stack[-1][0] <= start:
                    _close(stack.pop(), out, stack)
                stack.append([end, nm, 0, end - start])
            while stack:
                _close(stack.pop(), out, stack)
    return out


def _close(item, out, stack):
    end, nm, child, dur = item
    if stack:
        stack[-1][2] += dur
    name, _, typ = nm.rpartition(":")
    prev = out.get(name, (typ, 0.0))
    out[name] = (typ, prev[1] + (dur - child) / 1e9)


def _frames(gdi) -> dict:
    """``{node name: [(file, function), ...]}`` (outermost first) from a GraphDebugInfo."""
    out = {}
    for name, tid in gdi.name_to_trace_id.items():
        trace = gdi.traces_by_id[tid]
        out[name] = [
            (
                gdi.files[gdi.frames_by_id[i].file_index],
                gdi.frames_by_id[i].func,
                gdi.frames_by_id[i].line,
            )
            for i in trace.frame_id
        ]
    return out


def _origin(frames, line: bool = False) -> str:
    """Where an op was created: the innermost frame in tb_gradmom (``summary.py:_pool``, with
    ``line``: ``summary.py:_pool:123``), else keras / the benchmark / other."""
    for path, func, ln in reversed(frames):
        if "/tb_gradmom/" in path:
            return path.split("/tb_gradmom/", 1)[1] + ":" + func + (f":{ln}" if line else "")
    for path, func, _ in reversed(frames):
        if "/keras/" in path or "/keras_hub/" in path:
            return "keras"
        if "/benchmarks/" in path:
            return "bench:" + func
    return "other"


def op_origins(concrete, line: bool = False) -> tuple[dict, dict]:
    """Origins of the ops of a traced step: (top-level graph, nested function bodies)."""
    main = {
        k: _origin(v, line)
        for k, v in _frames(concrete._inference_function.graph_debug_info).items()
    }
    nested: dict = {}
    stack = list(getattr(concrete.graph, "_functions", {}).values())
    seen = set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        gdi = getattr(fn, "graph_debug_info", None)
        if gdi is not None:
            for k, v in _frames(gdi).items():
                nested.setdefault(k, _origin(v, line))
        graph = getattr(fn, "graph", None)
        stack += list(getattr(graph, "_functions", {}).values()) if graph is not None else []
    return main, nested


def _lookup_origin(name: str, origins) -> str:
    main, nested = origins
    if name in main:
        return main[name]
    inner = re.split(r"/_\d+/", name)[-1]  # a lowered cond/while body: "<op>/then/_0/<inner>"
    return nested.get(inner) or main.get(inner) or "unmapped (rewritten by grappler)"


_PROFILE_DIR: list = []


def _profile_dir() -> str:
    """A fresh temporary directory for this process's profiler traces."""
    if not _PROFILE_DIR:
        import tempfile

        _PROFILE_DIR.append(tempfile.mkdtemp(prefix="bench_zoo_prof_"))
    return _PROFILE_DIR[0]


def profile_fn(fn, x, y, steps: int, logdir: str) -> dict:
    """Runs ``steps`` calls of ``fn`` under TF's profiler: wall ms per step and op self times
    (ms per step) by op name."""
    import glob
    import shutil

    tf = _tf()
    shutil.rmtree(logdir, ignore_errors=True)
    _sync(fn, x, y)
    tf.profiler.experimental.start(logdir)
    t0 = time.perf_counter()
    for _ in range(steps):
        _sync(fn, x, y)
    wall = (time.perf_counter() - t0) / steps
    tf.profiler.experimental.stop()
    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    ops = {k: (t, ms / steps) for k, (t, ms) in _op_self_times(path).items()}
    try:
        concrete = fn.get_concrete_function(x, y)
        origins, lines = op_origins(concrete), op_origins(concrete, line=True)
        where = {k: _lookup_origin(k, origins) for k in ops}
        where_line = {k: _lookup_origin(k, lines) for k in ops}
    except Exception as e:  # noqa: BLE001 - informational only
        where = where_line = {k: f"unknown ({type(e).__name__})" for k in ops}
    return {"wall_ms": 1e3 * wall, "ops": ops, "origin": where, "origin_line": where_line}


def part_of(name: str) -> str:
    """Which part of a step an op belongs to, from its name scope."""
    if "gradmom" in name or "gradients_and_moments" in name:
        scope = name.split("/")
        # the library's sub-scope (fused, fallback, chunks, ...) when there is one
        sub = next((p for p in scope[1:-1] if not p.startswith("gradients")), "")
        return "gradmom" + (f"/{sub.split('_')[0]}" if sub else "")
    if name.startswith(("gradients", "gradient_tape")) or "/gradients/" in name:
        return "backward"
    if "SGD" in name or "sgd" in name or name.startswith(("Assign", "optimizer")):
        return "update"
    return "forward/other"


def _groups(ops: dict, key) -> dict:
    out: dict = {}
    for name, (typ, ms) in ops.items():
        k = key(name, typ)
        out[k] = out.get(k, 0.0) + ms
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize_profile(prof: dict, top: int = 12) -> dict:
    ops = prof["ops"]
    return {
        "wall_ms": prof["wall_ms"],
        "op_ms": sum(ms for _, ms in ops.values()),
        "by_part": _groups(ops, lambda n, t: part_of(n)),
        "by_type": dict(list(_groups(ops, lambda n, t: t).items())[:top]),
        "by_origin": dict(list(_groups(ops, lambda n, t: prof["origin"][n]).items())[:top]),
        "by_line_type": dict(
            list(_groups(ops, lambda n, t: f"{prof['origin_line'][n]} {t}").items())[:top]
        ),
        "by_origin_type": dict(
            list(_groups(ops, lambda n, t: f"{prof['origin'][n]} {t}").items())[: 2 * top]
        ),
        "top_ops": sorted(((n, t, ms) for n, (t, ms) in ops.items()), key=lambda r: -r[2])[:top],
        "gradmom_by_type": dict(
            list(
                _groups(
                    {n: v for n, v in ops.items() if part_of(n).startswith("gradmom")},
                    lambda n, t: t,
                ).items()
            )[:top]
        ),
    }


def print_profile(title: str, summ: dict) -> None:
    print(f"\n{title}: wall {summ['wall_ms']:.1f} ms/step, op self time {summ['op_ms']:.1f} ms")
    print("  by part:  " + ", ".join(f"{k} {v:.1f}" for k, v in summ["by_part"].items()))
    print("  by type:  " + ", ".join(f"{k} {v:.1f}" for k, v in summ["by_type"].items()))
    if summ["gradmom_by_type"]:
        print(
            "  gradmom ops by type: "
            + ", ".join(f"{k} {v:.1f}" for k, v in summ["gradmom_by_type"].items())
        )
    print("  by origin: " + ", ".join(f"{k} {v:.1f}" for k, v in summ["by_origin"].items()))
    print(
        "  by origin and type: "
        + ", ".join(f"{k} {v:.1f}" for k, v in summ["by_origin_type"].items())
    )
    print(
        "  by source line and type: "
        + ", ".join(f"{k} {v:.1f}" for k, v in summ["by_line_type"].items())
    )
    for n, t, ms in summ["top_ops"][:8]:
        print(f"    {ms:7.2f} ms  {t:<22} {n[:110]}")


def profile_child(name: str, batch: int, size: int, steps: int) -> dict:
    model, x, y = build(name, batch, size)
    fns = make_steps(model, ("plain", "moments"))
    out = {"model": name, "shape": describe(name, batch, size), "load": [os.getloadavg()[0]]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v, fn in fns.items():
            _sync(fn, x, y)
            prof = profile_fn(fn, x, y, steps, os.path.join(_profile_dir(), f"{name}_{v}"))
            out[v] = summarize_profile(prof)
    out["load"].append(os.getloadavg()[0])
    return out


def _graph_size(concrete) -> int:
    """Ops in a traced step, nested function bodies (cond branches, loops) included."""
    total = len(concrete.graph.get_operations())
    stack = list(getattr(concrete.graph, "_functions", {}).values())
    seen = set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        graph = getattr(fn, "graph", None)
        if graph is not None:
            total += len(graph.get_operations())
            stack += list(getattr(graph, "_functions", {}).values())
    return total


def trace_profile_child(name: str, batch: int, size: int, top: int = 25) -> dict:
    """cProfile of the traces of the plain and moments steps; graph sizes; first-call times."""
    import cProfile
    import pstats

    model, x, y = build(name, batch, size)
    fns = make_steps(model, ("plain", "moments"))
    model(x, training=False)
    out = {"model": name, "shape": describe(name, batch, size), "load": [os.getloadavg()[0]]}
    for v, fn in fns.items():
        prof = cProfile.Profile()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            prof.enable()
            concrete = fn.get_concrete_function(x, y)
            prof.disable()
            t1 = time.perf_counter()
            _sync(fn, x, y)
            t2 = time.perf_counter()
        st = pstats.Stats(prof)
        rows = []
        for (path, line, func), (_, ncalls, tt, ct, _) in st.stats.items():
            rows.append((path, line, func, ncalls, tt, ct))
        lib = [r for r in rows if "/tb_gradmom/" in r[0]]
        out[v] = {
            "trace": t1 - t0,
            "first_call": t2 - t1,
            "graph_ops": _graph_size(concrete),
            "lib_cumtime_top": [
                (f"{r[0].split('/tb_gradmom/')[1]}:{r[2]}", r[3], round(r[5], 2))
                for r in sorted(lib, key=lambda r: -r[5])[:top]
            ],
            "lib_tottime": round(sum(r[4] for r in lib), 2),
            "tottime_top": [
                (
                    "/".join(r[0].split("/")[-2:]) + f":{r[2]}",
                    r[3],
                    round(r[4], 2),
                )
                for r in sorted(rows, key=lambda r: -r[4])[:top]
            ],
        }
    out["load"].append(os.getloadavg()[0])
    return out


def print_trace_profile(res: dict) -> None:
    print(f"\n{res['model']} ({res['shape']}), load {res['load']}: trace and first call")
    for v in ("plain", "moments"):
        r = res[v]
        print(
            f"  {v}: trace {r['trace']:.1f} s (cProfile on), first call {r['first_call']:.1f} s, "
            f"{r['graph_ops']} ops in the traced graph (nested bodies included); "
            f"tb_gradmom self time {r['lib_tottime']:.1f} s"
        )
    r = res["moments"]
    print("  moments trace, tb_gradmom functions by cumulative time (s):")
    for nm, calls, ct in r["lib_cumtime_top"]:
        print(f"    {ct:8.2f}  {calls:>8}  {nm}")
    print("  moments trace, all functions by self time (s):")
    for nm, calls, tt in r["tottime_top"][:15]:
        print(f"    {tt:8.2f}  {calls:>8}  {nm}")


def summary_child(rounds: int, steps: int, name: str = "mlp") -> dict:
    """bench_summary.py's steps of model ``name`` ("mlp", "3c3d"): op profile of the logged
    step, and the logged step with parts of `gradmom.summary.moments` switched off (patched
    while tracing), interleaved."""
    import tempfile

    import numpy as np

    tf = _tf()
    bench_core = _bench_core()
    import bench_summary

    from tb_gradmom.writers import summary as gsum

    model = bench_core.build_model(name)
    x, y = bench_core.make_data(name)
    logdir = tempfile.mkdtemp(prefix="bench_zoo_summary_")
    load0 = os.getloadavg()[0]

    real_write, real_stats, real_pool = tf.summary.write, gsum._stats_fields, gsum._pool
    real_scalars, real_records, real_bins = gsum._selected_scalars, gsum._records_of, gsum._bins
    real_xla, real_pool_xla = gsum._elementwise_xla, gsum._pool_xla

    sink = tf.Variable(0.0)

    def fake_write(tag, tensor, step=None, metadata=None, name=None):
        # consumes the tensor in a stateful op (else the whole cond, whose output is unused,
        # would be pruned), serialises and writes nothing
        sink.assign_add(tf.reduce_sum(tf.cast(tensor, tf.float32)))
        return tf.constant(True)

    def bins_none(s2, offsets=None):
        # no key, no gathers: every element in its variable's first bin
        base = tf.zeros(tf.shape(s2), tf.int32)
        return base if offsets is None else base + offsets

    def stats_none(moms, n, loss, lr):  # the same ops on one element per variable
        return real_stats([{p: tf.reshape(m[p], [-1])[:1] for p in m} for m in moms], n, loss, lr)

    def pool_none(x, shape, block):
        from tb_gradmom import metadata

        rows, cols = metadata.to_2d_shape(shape)
        r, c = -(-rows // block[0]), -(-cols // block[1])
        return tf.reshape(x, [-1])[: r * c] * 0.0 + tf.zeros([r * c])  # keeps x, no pooling

    def records_moments_only(moms, n, loss, tags, contents, orders, lr, group):
        total = tf.add_n([tf.reduce_sum(m[p]) for m in moms for p in orders])
        return [("moments_only", tf.reshape(total, [1]), None)], []

    ablations = {
        "logged": {},
        "no_event_writes": {"write": fake_write},
        "no_scalar_summaries": {"_selected_scalars": lambda values, per: []},
        "no_histogram": {"_bins": bins_none},
        "no_statistics": {"_stats_fields": stats_none},
        "no_pooling": {"_pool": pool_none},
        "no_xla": {"env": "0"},
        "moments_in_cond_only": {"_records_of": records_moments_only, "write": fake_write},
    }
    steps_by = {}
    base, writer = bench_summary.make_steps(model, os.path.join(logdir, "base"))
    steps_by["plain"] = base["plain"]
    steps_by["moments"] = base["moments"]
    steps_by["skipped"] = base["skipped"]
    writers = [writer]
    env0 = os.environ.get("TB_GRADMOM_XLA")
    for abl, patch in ablations.items():
        fns, w = bench_summary.make_steps(model, os.path.join(logdir, abl))
        writers.append(w)
        fn = fns["logged"]
        saved = {}
        try:
            for k, v in patch.items():
                if k == "write":
                    saved[k] = tf.summary.write
                    tf.summary.write = v
                elif k == "env":
                    os.environ["TB_GRADMOM_XLA"] = v
                else:
                    saved[k] = getattr(gsum, k)
                    setattr(gsum, k, v)
            # fresh XLA functions: traced (and compiled) with this ablation's patches
            gsum._elementwise_xla = tf.function(
                lambda m1, m2, f, o, pads, group: gsum._elementwise(
                    m1, m2, f, o, pads, True, group
                ),
                jit_compile=True,
                autograph=False,
            )
            gsum._pool_xla = tf.function(gsum._pool_all, jit_compile=True, autograph=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn.get_concrete_function(x, y)  # traced with the patch
        finally:
            for k, v in saved.items():
                if k == "write":
                    tf.summary.write = v
                else:
                    setattr(gsum, k, v)
            gsum._elementwise_xla, gsum._pool_xla = real_xla, real_pool_xla
            if env0 is None:
                os.environ.pop("TB_GRADMOM_XLA", None)
            else:
                os.environ["TB_GRADMOM_XLA"] = env0
        steps_by[abl] = fn
    assert tf.summary.write is real_write and gsum._stats_fields is real_stats
    assert gsum._pool is real_pool and gsum._selected_scalars is real_scalars
    assert gsum._records_of is real_records and gsum._bins is real_bins
    per_round = {k: 10 if name == "mlp" else 3 for k in steps_by}
    times = bench_core.time_interleaved(steps_by, x, y, rounds, per_round)
    per = {k: [statistics.median(r) for r in v] for k, v in times.items()}
    ms = {k: 1e3 * statistics.median([t for r in v for t in r]) for k, v in times.items()}
    ratio = {k: statistics.median([a / b for a, b in zip(per[k], per["plain"])]) for k in steps_by}
    ratio_m = {
        k: statistics.median([a / b for a, b in zip(per[k], per["moments"])]) for k in steps_by
    }
    profs = {}
    for k in ("plain", "moments", "logged"):
        profs[k] = summarize_profile(
            profile_fn(steps_by[k], x, y, steps, os.path.join(_profile_dir(), f"summary_{k}")),
            top=25,
        )
    # the logged step's ops by what they do in summary.py
    for w in writers:
        w.close()
    sizes = {}
    for root, _, files in os.walk(os.path.join(logdir, "logged")):
        for f in files:
            sizes[f] = os.path.getsize(os.path.join(root, f))
    out = {
        "ms": ms,
        "x_plain": ratio,
        "x_moments": ratio_m,
        "model": name,
        "rounds": rounds,
        "profiles": profs,
        "load": [load0, os.getloadavg()[0]],
        "event_bytes": sizes,
    }
    del np
    return out


def print_summary_profile(res: dict) -> None:
    model = res.get("model", "mlp")
    print(f"\nbench_summary.py {model}, {res['rounds']} interleaved rounds, load {res['load']}:")
    for k, v in res["ms"].items():
        print(
            f"  {k:<22} {v:8.2f} ms  {res['x_plain'][k]:6.2f}x plain"
            f"  {res['x_moments'][k]:6.2f}x moments"
        )
    for k, v in res["profiles"].items():
        print_profile(f"profile, {k} step", v)


# ------------------------------------------------------------------------------------- the parent
def _child(args: list[str], bfc: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    env = dict(os.environ)
    env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)
    if bfc:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(
            f"child {' '.join(args)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_memory_set(name, batch, size, repeats, steps) -> dict:
    runs = {"plain": [], "moments": []}
    for _ in range(repeats):
        for v in runs:
            runs[v].append(
                _child(
                    [
                        "--memory-child",
                        v,
                        "--model",
                        name,
                        "--batch",
                        str(batch),
                        "--size",
                        str(size),
                        "--memory-steps",
                        str(steps),
                    ],
                    bfc=True,
                )
            )
    out = {}
    for v, rs in runs.items():
        out[v] = {
            "runs": rs,
            **{
                k: statistics.median(r[k] for r in rs)
                for k in ("alloc_peak", "alloc_base", "alloc_step", "trace", "first_call")
            },
            "compile": statistics.median(r["trace"] + r["first_call"] for r in rs),
            "alloc_peak_range": [
                min(r["alloc_peak"] for r in rs),
                max(r["alloc_peak"] for r in rs),
            ],
        }
    ratios = [m["alloc_peak"] / p["alloc_peak"] for p, m in zip(runs["plain"], runs["moments"])]
    out["peak_ratio"] = out["moments"]["alloc_peak"] / out["plain"]["alloc_peak"]
    out["peak_ratio_range"] = [min(ratios), max(ratios)]
    comp = [
        (m["trace"] + m["first_call"]) / (p["trace"] + p["first_call"])
        for p, m in zip(runs["plain"], runs["moments"])
    ]
    out["compile_ratio"] = statistics.median(comp)
    out["compile_ratio_range"] = [min(comp), max(comp)]
    return out


def _mark(ok) -> str:
    return "ok" if ok else "MISS"


def _f(v, spec) -> str:
    return "-" if v is None else format(v, spec)


def fallback_summary(res) -> str:
    paths = res.get("paths")
    if paths is None:
        return "unknown"
    fb = [p["name"] for p in paths if "fallback" in p]
    return ", ".join(fb) if fb else "none"


def print_table(results: list[dict]) -> None:
    print()
    print(
        "orders (1, 2); ms: median per step; ratios: median of per-round ratios; "
        "peak MB and compile s: fresh processes (BFC allocator), median"
    )
    head = (
        f"{'model':<15} {'shape':<14} {'plain ms':>9} {'ours ms':>9} {'ratio':>6} {'tgt':<8} "
        f"{'vmap ms':>9} {'vmap/ours':>9} {'peak MB p/o':>13} {'mem':>5} "
        f"{'compile s p/o':>14} {'comp':>5}  load"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['model']:<15} FAILED: {r['error'].splitlines()[-1][:150]}")
            continue
        fam = model_spec(r["model"])[0]
        ms, ratio, vr = r["ms"], r["moments/plain"], r.get("vmap/moments")
        t = TARGETS[fam]
        mem = r.get("memory")
        peak = mr = comp = cr = None
        if mem:
            peak = f"{mem['plain']['alloc_peak'] / MB:.0f}/{mem['moments']['alloc_peak'] / MB:.0f}"
            mr = mem["peak_ratio"]
            comp = f"{mem['plain']['compile']:.1f}/{mem['moments']['compile']:.1f}"
            cr = mem["compile_ratio"]
        loads = [r["load"][0], r["load"][1]]
        if mem:
            loads += [x["load"] for v in ("plain", "moments") for x in mem[v]["runs"]]
        print(
            f"{r['model']:<15} {r['shape']:<14} {ms['plain']:>9.1f} {ms['moments']:>9.1f} "
            f"{ratio:>6.2f} {'<=' + str(t) + ' ' + _mark(ratio <= t):<8} "
            f"{_f(ms.get('vmap'), '9.1f'):>9} {_f(vr, '9.2f'):>9} {peak or '-':>13} "
            f"{_f(mr, '5.2f'):>5} {comp or '-':>14} {_f(cr, '5.2f'):>5}  "
            f"{min(loads):.1f}-{max(loads):.1f}"
        )
    print()
    for r in results:
        if "error" in r:
            continue
        marks = []
        if r.get("vmap/moments") is not None:
            marks.append(f"vmap/ours > {VMAP_TARGET:g} {_mark(r['vmap/moments'] > VMAP_TARGET)}")
        mem = r.get("memory")
        if mem:
            marks.append(f"memory <= {MEMORY_TARGET} {_mark(mem['peak_ratio'] <= MEMORY_TARGET)}")
            marks.append(
                f"compile <= {COMPILE_TARGET} {_mark(mem['compile_ratio'] <= COMPILE_TARGET)}"
            )
        lo, hi = r["moments/plain_range"]
        print(
            f"{r['model']:<15} {r['params'] / 1e6:.2f}M params, {r['variables']} variables; "
            f"ratio per round {lo:.2f}-{hi:.2f}; steps/round {r['per_round']}; " + "; ".join(marks)
        )
        print(f"{'':<15} exact fallback: {fallback_summary(r)}")
        if r.get("vmap_error"):
            print(f"{'':<15} tf.vectorized_map FAILED: {r['vmap_error'][-300:]}")
        if mem:
            p, m = mem["plain"], mem["moments"]
            print(
                f"{'':<15} trace / first call s: plain {p['trace']:.1f} / {p['first_call']:.1f}, "
                f"moments {m['trace']:.1f} / {m['first_call']:.1f}; held {p['alloc_base'] / MB:.0f}"
                f" MB; step-only peak {p['alloc_step'] / MB:.0f} / {m['alloc_step'] / MB:.0f} MB; "
                f"peak ratio per run {mem['peak_ratio_range'][0]:.2f}-"
                f"{mem['peak_ratio_range'][1]:.2f}"
            )
        for msg in r.get("warnings", []):
            print(f"{'':<15} warning: {msg[:300]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"from: {', '.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 11)")
    ap.add_argument("--quick", action="store_true", help="short run: 3 rounds, 1 memory run")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: the smallest model (lstm at batch 8, 10 steps), 2 rounds, 1 memory run; "
        "fails if a child fails (checks it runs, not times)",
    )
    ap.add_argument("--budget", type=float, default=None, help="seconds per variant per round")
    ap.add_argument("--batch", type=int, default=None, help="override every model's batch")
    ap.add_argument("--size", type=int, default=None, help="override the side / sequence length")
    ap.add_argument("--no-vmap", action="store_true", help="skip the tf.vectorized_map variant")
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process children")
    ap.add_argument("--memory-repeats", type=int, default=None, help="fresh runs per variant (3)")
    ap.add_argument("--memory-steps", type=int, default=3, help="steps measured per memory run")
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument(
        "--profile",
        default=None,
        metavar="MODELS",
        help="instead of timing: op profile (TF profiler) of the plain and moments steps",
    )
    ap.add_argument(
        "--profile-summary",
        nargs="?",
        const="mlp",
        default=None,
        metavar="MODEL",
        help="instead of timing: bench_summary.py's logged step of MODEL (mlp, the default, or "
        "3c3d), profiled and with parts of summary.moments switched off (patched at trace time, "
        "in the child process only)",
    )
    ap.add_argument("--profile-steps", type=int, default=5, help="steps under the profiler")
    ap.add_argument(
        "--profile-trace",
        default=None,
        metavar="MODELS",
        help="instead of timing: cProfile of the plain and moments traces, graph sizes",
    )
    ap.add_argument("--trace-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--timing-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--summary-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--memory-child", choices=["plain", "moments", "vmap"], help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.quick, args.models, args.rounds, args.budget = True, "lstm", 2, 0.05
        args.batch, args.size, args.memory_repeats = args.batch or 8, args.size or 10, 1
    rounds = args.rounds or (3 if args.quick else 11)
    budget = args.budget or (0.3 if args.quick else 1.0)

    if args.summary_child:
        print(json.dumps(summary_child(rounds, args.profile_steps, args.model or "mlp")))
        return 0
    if args.timing_child or args.memory_child or args.profile_child or args.trace_child:
        name = args.model
        batch = args.batch or model_spec(name)[1]
        size = args.size or model_spec(name)[2]
        if args.timing_child:
            res = timing_child(name, batch, size, rounds, budget, not args.no_vmap)
        elif args.trace_child:
            res = trace_profile_child(name, batch, size)
        elif args.profile_child:
            res = profile_child(name, batch, size, args.profile_steps)
        else:
            res = memory_child(name, batch, size, args.memory_child, args.memory_steps)
        print(json.dumps(res))
        return 0

    if args.profile_summary:
        rounds = args.rounds or (5 if args.quick else 21)
        res = _child(
            [
                "--summary-child",
                "--model",
                args.profile_summary,
                "--rounds",
                str(rounds),
                "--profile-steps",
                str(args.profile_steps),
            ],
            bfc=False,
        )
        print_summary_profile(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    if args.profile_trace:
        out = []
        for name in [m.strip() for m in args.profile_trace.split(",") if m.strip()]:
            batch = args.batch or model_spec(name)[1]
            size = args.size or model_spec(name)[2]
            res = _child(
                ["--trace-child", "--model", name, "--batch", str(batch), "--size", str(size)],
                bfc=False,
            )
            print_trace_profile(res)
            out.append(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0
    if args.profile:
        out = []
        for name in [m.strip() for m in args.profile.split(",") if m.strip()]:
            batch = args.batch or model_spec(name)[1]
            size = args.size or model_spec(name)[2]
            res = _child(
                ["--profile-child", "--model", name, "--batch", str(batch), "--size", str(size)]
                + ["--profile-steps", str(args.profile_steps)],
                bfc=False,
            )
            for v in ("plain", "moments"):
                print_profile(f"{name} ({res['shape']}, load {res['load']}) {v}", res[v])
            out.append(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        try:
            model_spec(m)
        except ValueError as e:
            ap.error(str(e))
    repeats = args.memory_repeats or (1 if args.quick else 3)
    print(
        f"{os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}, orders {ORDERS}, "
        f"{rounds} rounds, ~{budget:g} s per variant per round, {repeats} memory runs",
        flush=True,
    )
    results = []
    for name in models:
        batch = args.batch or model_spec(name)[1]
        size = args.size or model_spec(name)[2]
        t0 = time.perf_counter()
        cargs = ["--timing-child", "--model", name, "--batch", str(batch), "--size", str(size)]
        cargs += ["--rounds", str(rounds), "--budget", str(budget)]
        if args.no_vmap:
            cargs.append("--no-vmap")
        try:
            res = _child(cargs, bfc=False)
        except RuntimeError as e:
            print(f"  {name}: {e}", flush=True)
            results.append({"model": name, "error": str(e)})
            continue
        if (batch, size) != model_spec(name)[1:3]:
            res["shape"] += " (SMALLER)"
        t1 = time.perf_counter()
        if not args.no_memory:
            try:
                res["memory"] = run_memory_set(name, batch, size, repeats, args.memory_steps)
            except RuntimeError as e:
                print(f"  {name}: memory: {e}", flush=True)
        print(
            f"  {name} ({res['shape']}): timed in {t1 - t0:.0f}s, memory in "
            f"{time.perf_counter() - t1:.0f}s; {res['ms']['plain']:.1f} / "
            f"{res['ms']['moments']:.1f} ms, ratio {res['moments/plain']:.2f}, "
            f"vmap/ours {_f(res.get('vmap/moments'), '.2f')}; load {res['load']}",
            flush=True,
        )
        results.append(res)
        if args.json:  # written after every model, so a long run leaves partial results
            with open(args.json, "w") as f:
                json.dump({"orders": ORDERS, "results": results}, f, indent=1)
    print_table(results)
    if args.smoke and any("error" in r for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
