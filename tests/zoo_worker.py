"""Checks zoo entries (`tests/zoo.py`) against the brute-force reference.

`evaluate(entry)` runs one entry in this process and returns a JSON-able result: per variable
the path the core took (rule or fallback) and, per order, the relative error (`max_rel_err`).
`tests/test_zoo.py` asserts on it. From the command line it runs one entry, in this process:

    python -m tests.zoo_worker app-resnet50            # prints the result as JSON
    python -m tests.zoo_worker app-resnet50 --fit      # through model.fit and the callback
    python -m tests.zoo_worker --report [--full] [--jobs 2] [--out results.json]

``--report`` runs every selected entry, each in a child process of its own, and prints a
status table (exact / wrong number / crash / fallback) with timings.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import importlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_gradmom as gb  # noqa: E402
from tests import reference, zoo  # noqa: E402

ORDERS = (1, 2, 3, 4)
# float64: the core and the reference differ by summation order only.
TOLERANCE = 1e-9
# Variables that Keras creates in float32 inside a float64 model (LoRA adapters: Keras 3 makes
# them float32 whatever the layer's dtype) get float32 moments and test_core's float32 bound.
FLOAT32_TOLERANCE = 2e-5
# Entries whose layers compute in float32 whatever the dtype (`Entry.float32_inside`) run inside
# `zoo.float64_inside`; their "floor", the relative error of TensorFlow's own batch gradient (a
# plain tf.gradients, no tb_gradmom) against the per-example reference, must then be at float64
# rounding too, or the patch missed a float32 cast and the entry fails.
# A variable's true moment of order p "vanishes" when its largest magnitude is at most this
# fraction of the largest true moment of order p over the whole model (an attention key bias:
# softmax does not see it, what is left is rounding noise). Its error is then judged against the
# model's largest moment of that order instead of its own.
VANISH = 1e-7


def max_rel_err(got, want, model_max: float) -> float:
    """``max |got - want| / scale``, element-wise over one variable's moment of one order.

    ``scale`` is the largest ``|want|`` of this variable, or ``model_max`` (the largest true
    moment of the same order over every variable of the model) when the variable's own
    moments vanish (``<= VANISH * model_max``). NaN or a shape mismatch gives ``inf``.
    """
    return _relative(*_abs_err(got, want), model_max)


def _abs_err(got, want) -> tuple[float, float]:
    """``(max |got - want|, max |want|)``: `max_rel_err` before the model's scale is known
    (``inf`` error for NaN or a shape mismatch)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf"), 0.0
    if want.size == 0:
        return 0.0, 0.0
    err = float(np.max(np.abs(got - want)))
    return (err if np.isfinite(err) else float("inf")), float(np.max(np.abs(want)))


def _relative(err: float, own: float, model_max: float) -> float:
    if err == float("inf"):
        return err
    scale = own if own > VANISH * model_max else model_max
    if scale == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / scale


@contextlib.contextmanager
def spy_plans():
    """Collects the `Plan`s that `gradients_and_moments` makes while tracing.

    `tb_gradmom.core.plan.make_plan(...)` returns a `Plan` whose ``variables[i].path`` says
    how variable ``i`` is computed. If the core stops calling it by that name the list stays
    empty and the path is reported as ``"unknown"`` (which `tests/test_zoo.py` fails).
    """
    seen: list = []
    try:
        module = importlib.import_module("tb_gradmom.core.plan")
    except ImportError:
        module = None
    orig = getattr(module, "make_plan", None)
    if orig is None:
        yield seen
        return

    def spy(*args, **kwargs):
        out = orig(*args, **kwargs)
        seen.append(out)
        return out

    module.make_plan = spy
    try:
        yield seen
    finally:
        module.make_plan = orig


def _paths(plan, count: int) -> list[str]:
    """Per variable: ``rule:<op type>``, ``fallback: <reason>`` or ``unknown``."""
    out = []
    for i in range(count):
        try:
            vplan = plan.variables[i]
            if vplan.fallback is not None:
                out.append(f"fallback: {vplan.fallback}")
                continue
            op = plan.op_type(i)
            out.append(f"rule:{op}" if op else "rule")
        except Exception:  # noqa: BLE001 - the core's internals changed: report, do not fail
            out.append("unknown")
    return out


def _name(v) -> str:
    try:
        return importlib.import_module("tb_gradmom.core.plan").variable_name(v)
    except Exception:  # noqa: BLE001
        return getattr(v, "path", None) or getattr(v, "name", "variable")


def evaluate(entry, dtype: str = "float64") -> dict:
    """`_evaluate`, inside `zoo.float64_inside` for a float64 run of a ``float32_inside`` entry."""
    if getattr(entry, "float32_inside", "") and dtype == "float64":
        with zoo.float64_inside():
            return _evaluate(entry, dtype)
    return _evaluate(entry, dtype)


# Above this many bytes of trainable parameters (float64: 8 per parameter) `evaluate` checks the
# variables in groups (see `_groups`): ConvNeXtLarge/XLarge and EfficientNetV2L in the full zoo.
# Every other entry is one group, evaluated as before.
GROUP_BYTES = int(float(os.environ.get("GRADMOM_ZOO_GROUP_MB", "800")) * 2**20)


def _groups(variables, budget: int | None = None) -> list[list[int]]:
    """Consecutive variable indices, about equal bytes each and at most ``budget`` (default
    `GROUP_BYTES`; a variable bigger than that is a group of its own); one group when the model
    fits in ``budget``."""
    budget = GROUP_BYTES if budget is None else budget
    sizes = [int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables]
    total = sum(sizes)
    if total <= budget:
        return [list(range(len(variables)))]
    target = total / -(-total // budget)
    groups, current, filled = [], [], 0
    for i, s in enumerate(sizes):
        if current and (filled + s > budget or filled + s / 2 > target):
            groups.append(current)
            current, filled = [], 0
        current.append(i)
        filled += s
    return groups + [current]


def streamed_moments(
    forward, variables, per_example_loss, x, y, orders, budget: int, in_batch: bool = False
):
    """``[{p: M_p}]`` per variable, as ``reference.moments(reference.per_example_gradients(...))``
    (one gradient per example: on its own slice, or with ``in_batch`` its loss taken from the
    whole batch's forward pass) without holding the per-example gradients: the power sums are
    accumulated one example at a time, over consecutive chunks of at most ``budget`` bytes of
    variables (one forward and backward pass per example and chunk, in a `tf.function` traced
    once per chunk). Yields ``(indices, moments)`` per chunk."""
    for chunk in _groups(variables, budget):
        part = [variables[i] for i in chunk]
        sums = [{p: np.zeros(v.shape, np.float64) for p in orders} for v in part]
        one = reference.example_gradient_fn(forward, part, per_example_loss, x, y, in_batch)
        for j in range(x.shape[0]):
            grads = one(j)
            for s, g in zip(sums, grads):
                g = g.astype(np.float64)
                for p in orders:
                    s[p] += g**p
            del grads
        del one
        yield chunk, [{p: s[p] / x.shape[0] for p in orders} for s in sums]
        del sums


# Above this relative difference between the outputs of the batch's forward pass and of each
# example's own (`forward_spread`), the model amplifies float64 rounding so much that a forward
# pass on one example is not the same function as on the batch (EfficientNetV2L at random
# initialisation: 0.35, its gradients up to 1e21): the reference then takes each example's loss
# from the batch's forward pass (`reference.per_example_jacobian`), still one gradient per
# example, and the report says so.
SPREAD_TOLERANCE = 1e-12


def forward_spread(forward, x) -> float:
    """``max_j |f(x)[j] - f(x[j:j+1])[0]| / max |f(x)|`` over the (flattened) outputs."""
    whole = np.asarray(zoo._flat_outputs(forward(tf.constant(x))), np.float64)
    scale = float(np.max(np.abs(whole))) if whole.size else 0.0
    worst = 0.0
    for j in range(x.shape[0]):
        one = np.asarray(zoo._flat_outputs(forward(tf.constant(x[j : j + 1]))), np.float64)
        worst = max(worst, float(np.max(np.abs(one[0] - whole[j]))) if one.size else 0.0)
    if scale == 0.0:
        return 0.0 if worst == 0.0 else float("inf")
    return worst / scale


def rows_jacobian(forward, variables, per_example_loss, x, y) -> list[np.ndarray]:
    """`tests.reference.per_row_jacobian`: one example per entry of the loss vector of the
    whole batch's forward pass (``Entry.reference == "rows"``)."""
    return reference.per_row_jacobian(forward, variables, per_example_loss, x, y)


def _scalar_loss(per_example_loss, scalar):
    """``(out, y) -> scalar loss``: `zoo.ScalarLoss.scalar`, else the mean."""
    if scalar is not None:
        return scalar
    return lambda out, y: tf.reduce_mean(per_example_loss(out, y))


def _step(forward, per_example_loss, var_list, fallback, scalar=None):
    total = _scalar_loss(per_example_loss, scalar)

    def step(x, y):
        loss = total(forward(x), y)
        return gb.gradients_and_moments(loss, var_list, orders=ORDERS, fallback=fallback)

    return step


def _plain(forward, per_example_loss, var_list, scalar=None):
    """TensorFlow's own batch gradient (no tb_gradmom)."""
    total = _scalar_loss(per_example_loss, scalar)

    def plain(x, y):
        return tf.gradients(total(forward(x), y), var_list)

    return plain


def _evaluate(entry, dtype: str) -> dict:
    """Builds the entry, runs `gradients_and_moments` in a `tf.function` and the reference.

    A model whose trainable parameters exceed `GROUP_BYTES` is checked in groups of variables
    (`_groups`): per group its own `gradients_and_moments` trace over that ``var_list``, against
    the reference of those variables accumulated one example at a time (`streamed_moments`),
    each group freed before the next; every variable and order is still checked and judged
    against the whole model's largest moments. The reference differentiates each example's loss
    on its own slice, or in the batch's forward pass when the model's outputs differ between the
    two beyond `SPREAD_TOLERANCE` (`forward_spread`). Exceptions from the core propagate.
    Returns ``{"id", "vars": [{"name", "shape", "path", "rel": {p: error}, "grad_rel"}],
    "timing": {...}, "groups", "spread", "reference"}``.
    """
    t0 = time.perf_counter()
    forward, variables, (x, y), per_example_loss = entry.build(dtype)
    scalar, grad_scale = None, 1.0
    if isinstance(per_example_loss, zoo.ScalarLoss):  # grads are n * M_1 for a sum
        scalar, grad_scale = per_example_loss.scalar, 1.0
        if per_example_loss.reduction == "sum":
            grad_scale = float(x.shape[0])
        per_example_loss = per_example_loss.per_example
    t_build = time.perf_counter() - t0
    xt, yt = tf.constant(x), tf.constant(y)
    spread = forward_spread(forward, x)
    in_batch = getattr(entry, "reference", "auto") == "batch" or not spread <= SPREAD_TOLERANCE
    # The reference differentiates the tf.Variables behind Keras variables (the same reads; its
    # zeros for a variable without a gradient need a tf.DType, which Keras variables lack).
    tf_vars = [
        v.value if isinstance(getattr(v, "value", None), tf.Variable) else v for v in variables
    ]
    groups = _groups(variables)
    paths = ["unknown"] * len(variables)
    # per variable: {p: (max |got - want|, max |want|)}, "grad" and "floor" likewise
    errs: list[dict] = [{} for _ in variables]
    model_max = dict.fromkeys(ORDERS, 0.0)
    fallback_warned, ops, floored = False, 0, False
    timing = {"build": t_build, "trace": 0.0, "run": 0.0, "reference": 0.0}
    for group in groups:
        part = [variables[i] for i in group]

        fn = tf.function(_step(forward, per_example_loss, part, entry.fallback, scalar))
        t0 = time.perf_counter()
        # The core warns once per set of variable names and process; entries share names ("w").
        getattr(importlib.import_module("tb_gradmom.core.plan"), "WARNED", set()).clear()
        with spy_plans() as seen, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            concrete = fn.get_concrete_function(xt, yt)
        fallback_warned |= any("exact fallback" in str(w.message) for w in caught)
        ops += len(concrete.graph.get_operations())
        timing["trace"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        grads, moments = fn(xt, yt)
        timing["run"] += time.perf_counter() - t0
        if seen:
            for k, path in enumerate(_paths(seen[0], len(part))):
                paths[group[k]] = path
        del seen, concrete, fn

        plain = None
        if getattr(entry, "float32_inside", ""):
            part_tf = [tf_vars[i] for i in group]

            plain = list(tf.function(_plain(forward, per_example_loss, part_tf, scalar))(xt, yt))

        t0 = time.perf_counter()
        if getattr(entry, "reference", "auto") == "rows":
            ref = rows_jacobian(forward, tf_vars, per_example_loss, x, y)
            chunks = [(group, [reference.moments(r, ORDERS) for r in ref])]
            del ref
        elif len(groups) == 1:
            brute = reference.per_example_jacobian if in_batch else reference.per_example_gradients
            ref = brute(forward, tf_vars, per_example_loss, x, y)
            chunks = [(group, [reference.moments(r, ORDERS) for r in ref])]
            del ref
        else:
            streamed = streamed_moments(
                forward,
                [tf_vars[i] for i in group],
                per_example_loss,
                x,
                y,
                ORDERS,
                max(1, GROUP_BYTES // 2),
                in_batch,
            )
            chunks = (([group[k] for k in c], want) for c, want in streamed)
        pos = {i: k for k, i in enumerate(group)}
        for chunk, want in chunks:
            for i, w in zip(chunk, want):
                for p in ORDERS:
                    if w[p].size:
                        model_max[p] = max(model_max[p], float(np.max(np.abs(w[p]))))
                m = moments[pos[i]]
                for p in ORDERS:
                    got = m.get(p) if isinstance(m, dict) else None
                    if got is None or tf.as_dtype(got.dtype) != _moment_dtype(variables[i]):
                        errs[i][p] = (float("inf"), 0.0)
                    else:
                        errs[i][p] = _abs_err(got, w[p])
                g = grads[pos[i]]
                errs[i]["grad"] = _abs_err(
                    np.zeros(w[1].shape)
                    if g is None
                    else np.asarray(tf.convert_to_tensor(g)) / grad_scale,
                    w[1],
                )
                if plain is not None:
                    g = plain[pos[i]]
                    floored = True
                    errs[i]["floor"] = _abs_err(
                        np.zeros(w[1].shape)
                        if g is None
                        else np.asarray(tf.convert_to_tensor(g)) / grad_scale,
                        w[1],
                    )
                # free this variable's outputs before the next chunk's reference
                moments[pos[i]] = grads[pos[i]] = None
        timing["reference"] += time.perf_counter() - t0
        del grads, moments, chunks, plain
        if len(groups) > 1:
            gc.collect()

    out_vars = []
    for v, path, e in zip(variables, paths, errs):
        out_vars.append(
            {
                "name": _name(v),
                "shape": list(v.shape),
                "dtype": _moment_dtype(v).name,
                "tol": _tolerance(v, None),
                "path": path,
                "rel": {p: _relative(*e[p], model_max[p]) for p in ORDERS},
                "grad_rel": _relative(*e["grad"], model_max[1]),
            }
        )
    floor = None
    if floored:
        floor = max([_relative(*e["floor"], model_max[1]) for e in errs] or [0.0])
    return {
        "id": entry.id,
        "vars": out_vars,
        "floor": floor,
        "fallback_warned": fallback_warned,
        "ops": ops,
        "params": int(sum(int(np.prod(v.shape)) for v in variables)),
        "groups": len(groups),
        "spread": spread,
        "reference": (
            "rows"
            if getattr(entry, "reference", "auto") == "rows"
            else ("batch forward" if in_batch else "own slice")
        ),
        "timing": {k: round(t, 2) for k, t in timing.items()},
    }


def _moment_dtype(v) -> tf.DType:
    """float64 moments for float64 variables, float32 otherwise (the API's contract)."""
    return tf.float64 if tf.as_dtype(v.dtype) == tf.float64 else tf.float32


def _tolerance(v, floor) -> float:
    return TOLERANCE if _moment_dtype(v) == tf.float64 else FLOAT32_TOLERANCE


def failures(result: dict, entry) -> list[str]:
    """The reasons a result is not exact (empty when it is)."""
    out = []
    floor = result.get("floor")
    if getattr(entry, "float32_inside", "") and floor is not None and not floor <= TOLERANCE:
        out.append(
            f"TensorFlow's own gradient is off the reference by {floor:.2g} inside "
            "zoo.float64_inside: a float32 computation was not turned into float64"
        )
    on_fallback = [v["name"] for v in result["vars"] if v["path"].startswith("fallback")]
    if on_fallback and not result.get("fallback_warned", True):
        out.append(f"{', '.join(on_fallback)}: on the exact fallback without its warning")
    for v in result["vars"]:
        tol = v.get("tol", TOLERANCE)
        for p, e in sorted(v["rel"].items(), key=lambda kv: int(kv[0])):
            if not e <= tol:
                out.append(f"{v['name']} M{p}: relative error {e:.3g} > {tol:g}")
        if not v["grad_rel"] <= tol:
            out.append(f"{v['name']} grad: relative error {v['grad_rel']:.3g} > {tol:g}")
        if (
            entry.fallback == "error"
            and v["path"] != "unknown"
            and not v["path"].startswith("rule")
        ):
            out.append(f"{v['name']}: not rule-based ({v['path']})")
    return out


def status(result: dict, entry) -> str:
    """A one-line verdict for the report."""
    if result.get("error"):
        return f"crash: {result['error']['type']}: {result['error']['first_line']}"
    fb = [v for v in result["vars"] if v["path"].startswith("fallback")]
    worst = max(
        [e for v in result["vars"] for e in list(v["rel"].values()) + [v["grad_rel"]]] or [0.0]
    )
    word = "wrong" if failures(result, _NoFallback) else "exact"
    s = f"{word} (max rel err {worst:.2g})"
    if result.get("reference") == "batch forward" and getattr(entry, "reference", "") == "batch":
        s += " [reference from the batch's forward pass: the entry couples the examples]"
    elif result.get("reference") == "batch forward":
        s += (
            f" [forward pass not batch-invariant at float64 (outputs differ by "
            f"{result['spread']:.2g} between the batch and one example): reference from the "
            "batch's forward pass]"
        )
    if result.get("floor") is not None:
        s += f" [float32 casts made float64: TF's own gradient off by {result['floor']:.2g}]"
    if any(v.get("dtype") == "float32" for v in result["vars"]):
        s += " [float32 variables judged at 2e-5]"
    if fb:
        s += f", fallback for {len(fb)}/{len(result['vars'])} variables"
    return s


class _NoFallback:
    """For `status`: judge the numbers only (the path is reported separately)."""

    fallback = "exact"
    float32_inside = ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # TF wraps errors raised while tracing: "in user code:" ... the real message is last.
    if lines and lines[0].endswith("in user code:"):
        return lines[-1][:500]
    # A failed tf.debugging assert at run time: "Graph execution error:", a stack, then the
    # assertion's message.
    for ln in lines:
        if ln.startswith("assertion failed:"):
            return (lines[0] + " " + ln)[:500]
    if lines and lines[0].startswith("Graph execution error"):
        return (lines[0] + " " + lines[-1])[:500]
    return (lines[0] if lines else "")[:500]


def run_one(entry_id: str) -> dict:
    """`evaluate` with errors captured (the child process's job)."""
    entry = zoo.ENTRIES_BY_ID[entry_id]
    t0 = time.perf_counter()
    try:
        result = evaluate(entry)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result = {
            "id": entry_id,
            "vars": [],
            "error": {
                "type": type(e).__name__,
                "first_line": _first_line(e),
                "traceback": traceback.format_exc()[-6000:],
            },
        }
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    # CPU seconds of the whole process (TensorFlow's import included): less sensitive than wall
    # time to other processes sharing the machine.
    result["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)
    result["maxrss_mb"] = usage.ru_maxrss // 1024
    return result


# -- keras.applications through `model.fit` and the callback ---------------------------------

# One member per architecture family, for `fit_through_callback` (tests/test_integration.py):
# id -> what the family brings to the step.
FIT_MEMBERS: dict[str, str] = {
    "app-mobilenetv3small": "hard-swish, squeeze-excite, dropout before the head",
    "app-mobilenetv2": "inverted residuals, ReLU6, depthwise convolutions",
    "app-resnet50": "bottleneck residual blocks, batch normalisation after every convolution",
    "app-efficientnetb0": "squeeze-excite, swish, drop connect (stochastic depth), top dropout",
    "app-convnexttiny": "LayerScale, depthwise 7x7, LayerNormalization, GELU, no batch norm",
    "app-densenet121": "dense concatenations, batch norm before each convolution",
    "app-inceptionv3": "parallel towers, 1x7/7x1 convolutions, concatenations",
}
# Members trained with one inter-op thread (`run_fit`): id -> why. TensorFlow does not repeat
# InceptionV3's step bit for bit otherwise, op determinism on. Grappler's memory optimizer (its
# scheduling pass, when the estimated peak memory passes 80% of the device's: 256 MiB for the
# CPU in Grappler's view) rewrites the AddN summing the gradient that reaches mixed9's output
# from mixed10's four towers (AddN_20 in Keras' train function) into a TemporaryVariable and
# one AssignAdd per tower, run as the towers finish: with ops in parallel, the order of the sum
# varies. Measured 2026-11-28: a step computing and applying the gradients as Keras' does,
# from one state on one batch, gave other gradients in 5 to 13 of 16 runs (up to 3e-10,
# every variable below mixed10); the model fitted 3 steps twice without Grad Moments ended
# 2.6e-7 apart. With one inter-op thread, or that pass off (no public option), 16 of 16 runs
# were equal, and 3 steps with and without the callback (logged at 0 and 2) bit-identical;
# with only that pass off (ops in parallel), 3 fits without and 1 with it, bit-identical too.
# The other members' train functions have no such rewrite (their optimized graphs, same day).
FIT_ONE_INTER_OP_THREAD: dict[str, str] = {
    "app-inceptionv3": "Grappler's memory optimizer sums a 4-input AddN in arrival order",
}
# The smallest member: its logged moments are also checked against one gradient per example.
FIT_BRUTE = "app-mobilenetv3small"
FIT_STEPS = 3  # steps of `model.fit`, logged at 0 and 2 (every_n_steps=2)


def _fit_model(entry_id: str):
    """The entry's application, float64, compiled for `fit` (SGD with momentum, "mse")."""
    import keras

    name = entry_id[len("app-") :]
    ctor = next(
        (c for members in zoo.APPLICATIONS.values() for c, *_ in members if c.lower() == name),
        None,
    )
    if ctor is None:
        raise ValueError(f"{entry_id!r} is not a keras.applications zoo entry")
    side = next(s for m in zoo.APPLICATIONS.values() for c, s, *_ in m if c == ctor)
    keras.utils.set_random_seed(0)
    with zoo.dtype_policy("float64"):
        model = getattr(keras.applications, ctor)(
            weights=None,
            input_shape=(side, side, 3),
            include_top=True,
            classes=3,
            classifier_activation=None,
        )
    model.compile(keras.optimizers.SGD(0.01, momentum=0.5), "mse")
    return model, side


def _mse(out, t):
    """Keras' "mse" per example: the mean over the classes."""
    return tf.reduce_mean(tf.square(out - tf.cast(t, out.dtype)), axis=1)


def fit_through_callback(entry_id: str, log_dir: str, brute: bool | None = None) -> dict:
    """Trains a ``keras.applications`` member `FIT_STEPS` steps with ``model.fit`` (Keras'
    own ``train_step``, ``training=True``: batch statistics, drop connect and dropout live)
    twice from the same state (one model, put back between the two), without and with
    `GradMoments` (``every_n_steps=2``, every variable at full resolution), and checks, returning the failures found (empty when none; call
    it with TensorFlow's op determinism enabled, as `run_fit` does):

    - training identical: the loss history, every weight (moving statistics and seed states
      included) and every optimizer variable, bit for bit;
    - the moments logged at steps 0 and 2, read back with `gradmom.data.load`, equal to
      `gradients_and_moments` of the same loss at the state (every model variable) that step
      started from, relative error <= 1e-6 (the log holds float32);
    - with ``brute`` (default: for `FIT_BRUTE`), step 0's logged moments against one gradient
      per example (rows of the jacobian of the batch's per-example losses: a training-mode
      batch norm couples the examples), dropout's seed state put back before each pass.
    """
    import keras

    from tb_gradmom.analysis import data

    brute = entry_id == FIT_BRUTE if brute is None else brute
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    model, side = _fit_model(entry_id)
    batch = zoo.APP_BATCH
    # float32 values in float64 arrays: `fit` casts numpy floats to floatx (float32) and the
    # model back to float64, exactly; the core and the reference get the same numbers.
    x = rng.normal(size=(FIT_STEPS * batch, side, side, 3)).astype(np.float32).astype(np.float64)
    y = rng.normal(size=(FIT_STEPS * batch, 3)).astype(np.float32).astype(np.float64)
    # One model trained twice from the same state: a second model built in this process gets
    # other layer names and, with them, another graph (InceptionV3: two such models trained
    # without any callback end up to 2e-10 apart after 3 steps, op determinism on; measured
    # before the race of `FIT_ONE_INTER_OP_THREAD` was found, which alone may explain it).
    model.optimizer.build(model.trainable_variables)
    start = [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = model.fit(x, y, batch_size=batch, shuffle=False, verbose=0)
    trained = [np.array(v.numpy()) for v in model.variables]
    trained_opt = [np.array(v.numpy()) for v in model.optimizer.variables]
    for v, value in zip(model.variables + model.optimizer.variables, start):
        v.assign(value)
    states: list[list[np.ndarray]] = []

    class Keep(keras.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            states.append([np.array(v.numpy()) for v in model.variables])

    cb = gb.keras.GradMoments(log_dir, every_n_steps=2, max_elements=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the batch norms' exact fallback, said per trace
        got = model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=[Keep(), cb])
    t_fit = time.perf_counter() - t0
    failures: list[str] = []
    if got.history != want.history:
        failures.append(f"loss history {got.history} != {want.history} without the callback")
    for kind, ours, theirs in (
        ("weight", model.variables, trained),
        ("optimizer variable", model.optimizer.variables, trained_opt),
    ):
        if len(ours) != len(theirs):
            failures.append(f"{len(ours)} {kind}s against {len(theirs)} without the callback")
        for u, v in zip(ours, theirs):
            if not np.array_equal(u.numpy(), v):
                diff = float(np.max(np.abs(u.numpy() - v))) if u.shape == v.shape else math.inf
                failures.append(
                    f"{kind} {u.path} differs from training without the callback by {diff:.3g}"
                )

    variables = model.trainable_variables
    tags = gb.summary.tag_names(variables)
    run = data.load(log_dir)["."]
    logged = sorted({r.step for r in run[tags[0]]}) if tags[0] in run else []
    if logged != [0, 2]:
        failures.append(f"logged steps {logged}, expected [0, 2]")

    @tf.function
    def core(bx, by):
        loss = keras.losses.MeanSquaredError()(by, model(bx, training=True))
        return gb.gradients_and_moments(loss, variables)[1]

    worst = {}
    t1 = time.perf_counter()
    for step in (0, 2):
        for v, value in zip(model.variables, states[step]):
            v.assign(value)
        bx, by = x[step * batch : (step + 1) * batch], y[step * batch : (step + 1) * batch]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            moments = core(tf.constant(bx), tf.constant(by))
        wants = [{p: m[p].numpy() for p in (1, 2)} for m in moments]
        worst[step] = _compare_logged(run, tags, wants, step, batch, failures, "the core")
    t_core = time.perf_counter() - t1
    brute_worst = None
    t_brute = 0.0
    if brute:
        t1 = time.perf_counter()
        for v, value in zip(model.variables, states[0]):
            v.assign(value)
        seeds = [(v, v.numpy()) for v in model.variables if "seed_generator" in v.path]

        def forward(t):
            for v, value in seeds:  # every pass draws step 0's dropout masks
                v.assign(value)
            return model(t, training=True)

        tf_vars = [
            v.value if isinstance(getattr(v, "value", None), tf.Variable) else v for v in variables
        ]
        rows = reference.per_example_jacobian(forward, tf_vars, _mse, x[:batch], y[:batch])
        wants = [reference.moments(r, (1, 2)) for r in rows]
        brute_worst = _compare_logged(run, tags, wants, 0, batch, failures, "brute force")
        t_brute = time.perf_counter() - t1
    return {
        "id": entry_id,
        "variables": len(variables),
        "params": int(sum(int(np.prod(v.shape)) for v in variables)),
        "logged": logged,
        "worst": worst,
        "brute": brute_worst,
        "failures": failures,
        "timing": {
            "fit": round(t_fit, 2),
            "core": round(t_core, 2),
            "brute": round(t_brute, 2),
        },
    }


def _compare_logged(run, tags, wants, step, batch, failures, against) -> float:
    """Step ``step``'s logged M_1, M_2 of every tag against ``wants`` (``[{p: array}]``):
    relative error per variable, judged as `max_rel_err` does against the model's largest
    moment of the order where a variable's own vanish; the worst, failures appended."""
    model_max = {p: max(float(np.max(np.abs(w[p]))) for w in wants) for p in (1, 2)}
    worst = 0.0
    for tag, want in zip(tags, wants):
        rec = next((r for r in run.get(tag, []) if r.step == step), None)
        if rec is None:
            failures.append(f"{tag}: nothing logged at step {step}")
            continue
        if rec.batch_size != batch:
            failures.append(f"{tag} step {step}: batch size {rec.batch_size}, not {batch}")
        for p in (1, 2):
            err = max_rel_err(rec.moments[p], want[p], model_max[p])
            worst = max(worst, err)
            if not err <= FIT_TOLERANCE:
                failures.append(
                    f"{tag} M{p} step {step}: relative error {err:.3g} against {against} "
                    f"> {FIT_TOLERANCE:g}"
                )
    return worst


# The logged moments are float32 (full resolution): 1e-6 of the float64 values they round.
FIT_TOLERANCE = 1e-6


def _rss_mb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def run_fit(entry_id: str) -> dict:
    """`fit_through_callback` into a temporary log dir, errors captured (the child's job).

    TensorFlow's op determinism is enabled first (for the whole process), so that the two
    trainings may be asked to be bit-identical whatever kernels the model runs; a member of
    `FIT_ONE_INTER_OP_THREAD` also runs its ops one at a time (each op keeps its intra-op
    threads), without which TensorFlow does not repeat its own training step bit for bit.
    """
    if entry_id in FIT_ONE_INTER_OP_THREAD:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradmom-fit-") as log_dir:
        try:
            result = fit_through_callback(entry_id, log_dir)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            result = {
                "id": entry_id,
                "error": {
                    "type": type(e).__name__,
                    "first_line": _first_line(e),
                    "traceback": traceback.format_exc()[-6000:],
                },
            }
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)
    result["maxrss_mb"] = usage.ru_maxrss // 1024
    return result


def run_in_subprocess(entry_id: str, timeout: float | None = None, fit: bool = False) -> dict:
    """`run_one` (with ``fit``: `run_fit`) in a fresh Python (one process per entry).

    The child is killed after ``GRADMOM_ZOO_TIMEOUT`` seconds (default 3600) or when its
    resident memory passes ``GRADMOM_ZOO_MAX_RSS_MB`` (default 14000: the machine is shared).
    """
    timeout = timeout or float(os.environ.get("GRADMOM_ZOO_TIMEOUT", "3600"))
    max_rss = int(os.environ.get("GRADMOM_ZOO_MAX_RSS_MB", "14000"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zoo_worker", entry_id] + (["--fit"] if fit else []),
            stdout=out,
            stderr=err,
            text=True,
            cwd=root,
            env=env,
        )
        peak = 0
        killed = None
        while proc.poll() is None:
            peak = max(peak, _rss_mb(proc.pid))
            if peak > max_rss:
                killed = ("MemoryLimit", f"killed at {peak} MB resident (> {max_rss} MB)")
            elif time.perf_counter() - t0 > timeout:
                killed = ("Timeout", f"no result after {timeout:.0f} s")
            if killed:
                proc.kill()
                proc.wait()
                return _crashed(entry_id, killed[0], killed[1], t0)
            time.sleep(0.5)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    marker = "ZOO_RESULT "
    for line in stdout.splitlines():
        if line.startswith(marker):
            return json.loads(line[len(marker) :])
    tail = (stderr or "").strip().splitlines()[-15:]
    return _crashed(
        entry_id,
        "WorkerDied",
        f"exit code {proc.returncode}: {tail[-1] if tail else ''}",
        t0,
        "\n".join(tail),
    )


def _crashed(entry_id, kind, line, t0, tb=""):
    return {
        "id": entry_id,
        "vars": [],
        "error": {"type": kind, "first_line": line, "traceback": tb},
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _report(args) -> int:
    entries = zoo.selected("full" if args.full else None)
    if args.only:
        keep = set(args.only.split(","))
        entries = [e for e in entries if e.id in keep]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {e.id: pool.submit(run_in_subprocess, e.id) for e in entries}
        results = {}
        for e in entries:
            r = futures[e.id].result()
            results[e.id] = r
            t = r.get("timing", {})
            print(
                f"{e.id:45s} {r['seconds']:7.1f}s cpu={r.get('cpu_seconds', '-')}s "
                f"rss={r.get('maxrss_mb', '-')}MB "
                f"trace={t.get('trace', '-')} run={t.get('run', '-')} ref={t.get('reference', '-')}"
                f"  {status(r, e)}",
                flush=True,
            )
    cpu = sum(r.get("cpu_seconds", 0.0) for r in results.values())
    print(f"total wall {time.perf_counter() - t0:.1f}s, cpu {cpu:.0f}s, load {os.getloadavg()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _paths_summary(result: dict) -> str:
    """``rules: MatMul 12, Conv2D 4; fallback 2`` for one result."""
    counts: dict[str, int] = {}
    for v in result.get("vars", []):
        path = v["path"]
        key = path.split(":", 1)[1] if path.startswith("rule:") else path.split(":", 1)[0]
        counts[key] = counts.get(key, 0) + 1
    rules = [f"{k} {c}" for k, c in sorted(counts.items(), key=lambda kv: -kv[1])]
    return ", ".join(rules)


def markdown_table(results) -> str:
    """The README's table: per entry, its family, what it is, the variables' paths (rule op
    types), the worst relative error over orders 1-4 and the gradient, and its seconds."""
    if isinstance(results, dict):
        results = list(results.values())
    rows = [
        "| entry | family | model | variables by path | max rel. error | status | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        entry = zoo.ENTRIES_BY_ID.get(r["id"])
        if entry is None:
            continue
        worst = max(
            [e for v in r.get("vars", []) for e in list(v["rel"].values()) + [v["grad_rel"]]]
            or [float("nan")]
        )
        verdict = status(r, entry).split(" (")[0]
        if r.get("error"):
            verdict = f"{r['error']['type']}: {r['error']['first_line'][:120]}"
        elif r.get("floor") is not None:
            verdict += f" (float32 casts made float64; TF's own gradient: {r['floor']:.1e})"
        rows.append(
            f"| `{r['id']}` | {entry.family} | {entry.note or ''} | {_paths_summary(r)} | "
            f"{worst:.1e} | {verdict} | {r.get('seconds', '')} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entry", nargs="?", help="a zoo id (see tests/zoo.py)")
    parser.add_argument("--report", action="store_true", help="run every selected entry")
    parser.add_argument("--full", action="store_true", help="with --report: heavy entries too")
    parser.add_argument("--only", help="with --report: comma-separated ids")
    parser.add_argument(
        "--fit",
        action="store_true",
        help="train the entry (a keras.applications member) with model.fit and the callback "
        "instead (fit_through_callback)",
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="with --report: write every result as JSON")
    parser.add_argument(
        "--markdown", help="print the README's zoo table from a JSON file written by --out"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown_table(json.load(f)))
        return 0
    if args.report:
        return _report(args)
    if not args.entry:
        parser.error("give an entry id or --report")
    result = run_fit(args.entry) if args.fit else run_one(args.entry)
    print("ZOO_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
