"""The norms logging mode (``summary.moments(..., mode="norms")``) against the moments mode and
brute force.

The norms mode logs the noise statistics' sums from the batch gradient and the per-example
squared norms, never ``g_j**2`` element-wise. Its sums must be those of the element-wise
moments: ``sum_m2 = |M_1|^2``, ``sum_m2_raw = sum_i M_2,i = (1/n) sum_j ||g_j||^2`` and
``sum_var = n/(n-1) (sum_m2_raw - sum_m2)``. Each case is checked in float64 three ways:

- in the graph (the core's `Logged.sums`, float64) against the moments mode's sums of the same
  step (`stats.sums_from_moments` of its ``M_1``, ``M_2``) and against numpy sums of brute-force
  per-example gradients (`tests.reference`), at 1e-12 relative;
- in the event files (the stats tensors are float32 on disk): the norms run's values equal the
  moments run's to float32 rounding, read with `gradmom.data.load` and with TensorBoard's own
  `EventAccumulator`, and the derived statistics (`stats.derived`) agree.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import tb_gradmom as gradmom
from tb_gradmom import metadata
from tb_gradmom.analysis import data, stats
from tb_gradmom.core import moments as core_moments
from tb_gradmom.core import plan as core_plan
from tests import reference
from tests.cases import SinCell, sparse_ce

TOL = 1e-12
# The stats tensors are stored as float32: two float64 values that agree to 1e-12 round to the
# same float32 or to neighbours (when they straddle a rounding boundary).
F32 = 2.0**-23
SUMS = ("sum_m2", "sum_var", "sum_m2_raw")


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    build: object  # () -> keras.Model (float64)
    x_shape: tuple
    reduction: str = "mean"  # "mean", "sum" or "vector" (the [n] per-example losses)
    penalty: float = 0.0  # a weight penalty lam * sum |W|^2 added to the loss
    n: int = 6
    x_kind: str = "normal"  # or "ids" (integer inputs for an embedding)


def _mlp():
    return keras.Sequential(
        [
            keras.Input((5,), dtype="float64"),
            keras.layers.Dense(7, activation="tanh", dtype="float64", name="hidden"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def _conv():
    return keras.Sequential(
        [
            keras.Input((6, 6, 2), dtype="float64"),
            keras.layers.Conv2D(4, 3, activation="tanh", dtype="float64", name="conv"),
            keras.layers.Conv2D(3, 2, strides=2, dtype="float64", name="conv2"),
            keras.layers.Flatten(dtype="float64"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def _sequence():  # Dense on [n, T, d]: the Gram or materialised norm form
    return keras.Sequential(
        [
            keras.Input((4, 5), dtype="float64"),
            keras.layers.Dense(6, activation="tanh", dtype="float64", name="proj"),
            keras.layers.LayerNormalization(dtype="float64", name="norm"),
            keras.layers.GlobalAveragePooling1D(dtype="float64"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def _embedding():
    return keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(9, 4, dtype="float64", name="emb"),
            keras.layers.GlobalAveragePooling1D(dtype="float64"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def _rnn_fallback():  # SinCell's kernel takes the exact fallback (jacobian rows)
    return keras.Sequential(
        [
            keras.Input((4, 3), dtype="float64"),
            keras.layers.RNN(SinCell(3, dtype="float64"), dtype="float64", name="rnn"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def _lstm():  # the loop rule
    return keras.Sequential(
        [
            keras.Input((4, 3), dtype="float64"),
            keras.layers.LSTM(3, dtype="float64", name="lstm"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


CASES = [
    Case("mlp-mean", _mlp, (5,)),
    Case("mlp-sum", _mlp, (5,), reduction="sum"),
    Case("mlp-vector", _mlp, (5,), reduction="vector"),
    Case("mlp-mean-penalty", _mlp, (5,), penalty=0.03),
    Case("mlp-sum-penalty", _mlp, (5,), reduction="sum", penalty=0.03),
    Case("mlp-n1", _mlp, (5,), n=1),
    Case("conv-mean", _conv, (6, 6, 2)),
    Case("conv-sum-penalty", _conv, (6, 6, 2), reduction="sum", penalty=0.02),
    Case("dense-on-sequence-layernorm", _sequence, (4, 5)),
    Case("embedding-repeated-ids", _embedding, (5,), x_kind="ids"),
    Case("rnn-exact-fallback", _rnn_fallback, (4, 3)),
    Case("lstm-loop-rule", _lstm, (4, 3), reduction="sum"),
]


def _inputs(case: Case, seed: int = 0):
    rng = np.random.default_rng(seed)
    if case.x_kind == "ids":
        x = rng.integers(0, 9, size=(case.n, *case.x_shape)).astype(np.int32)
    else:
        x = rng.normal(size=(case.n, *case.x_shape))
    return x, rng.integers(0, 3, size=case.n)


def _built(case: Case):
    keras.utils.set_random_seed(7)
    return case.build()


def _loss_of(case: Case, model, x, y):
    losses = sparse_ce(model(x), y)
    if case.reduction == "vector":
        return losses
    loss = tf.reduce_sum(losses) if case.reduction == "sum" else tf.reduce_mean(losses)
    if case.penalty:
        loss += case.penalty * tf.add_n(
            [tf.reduce_sum(tf.square(v)) for v in model.trainable_variables]
        )
    return loss


def _brute_sums(case: Case, model, x, y) -> list[dict[str, float]]:
    """Per variable, the three sums from one gradient per example (numpy, float64).

    A weight penalty ``R`` is part of every example's loss: ``l_j + R`` for a mean,
    ``l_j + R / n`` for a sum (docs/math.md)."""
    share = 0.0
    if case.penalty:
        share = case.penalty * (1.0 if case.reduction == "mean" else 1.0 / case.n)

    def loss_fn(out, yy):
        base = sparse_ce(out, yy)
        if share:
            base += share * tf.add_n(
                [tf.reduce_sum(tf.square(v)) for v in model.trainable_variables]
            )
        return base

    per_ex = reference.per_example_gradients(model, model.trainable_variables, loss_fn, x, y)
    out = []
    n = case.n
    for g in per_ex:
        g = g.reshape(n, -1).astype(np.float64)
        m1 = g.mean(0)
        raw = float(np.sum(g * g) / n)
        m2 = float(m1 @ m1)
        var = n / (n - 1) * (raw - m2) if n > 1 else math.nan
        out.append({"sum_m2": m2, "sum_var": var, "sum_m2_raw": raw})
    return out


def _core(case: Case, model, x, y, mode: str):
    """The core's `Logged` of one step (float64 tensors), as numpy: (sums per variable, M_1)."""
    variables = model.trainable_variables
    orders = (1,) if mode == "norms" else (1, 2)
    reduction = None if case.reduction == "vector" else case.reduction

    @tf.function
    def step(x, y):
        loss = _loss_of(case, model, x, y)
        options = core_plan.Options.check(orders, reduction, None, None, "exact", None)
        plan = core_plan.make_plan(loss, variables, options, name="test")
        logged = core_moments.compute_logged(plan, mode=mode).logged
        return logged.moments, logged.sums

    moms, sums = step(tf.constant(x), tf.constant(y))
    m = [{p: np.asarray(t) for p, t in d.items()} for d in moms]
    if sums is None:
        return None, m
    return [{k: float(v) for k, v in s.items()} for s in sums], m


def _close(a, b, what, tol=TOL):
    assert math.isnan(a) == math.isnan(b), f"{what}: {a} vs {b}"
    if not math.isnan(a):
        assert abs(a - b) <= tol * max(abs(b), 1e-300), f"{what}: {a!r} vs {b!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_norms_sums_equal_moments_sums_and_brute_force(case):
    model = _built(case)
    x, y = _inputs(case)
    norms_sums, norms_m = _core(case, model, x, y, "norms")
    _, moments_m = _core(case, model, x, y, "moments")
    brute = _brute_sums(case, model, x, y)
    for v, got, m, mm, want in zip(
        model.trainable_variables, norms_sums, norms_m, moments_m, brute
    ):
        assert set(m) == {1}  # no element-wise second moment in the norms mode
        np.testing.assert_allclose(m[1], mm[1], rtol=0, atol=1e-15 * np.abs(mm[1]).max())
        ref = stats.sums_from_moments(mm[1], mm[2], case.n)
        for key in SUMS:
            _close(got[key], want[key], f"{v.path} {key} (brute force)")
            # the moments mode's element-wise sums: the same numbers up to rounding (its
            # variance is clipped at 0 per element, where M_2 - M_1^2 is rounding)
            _close(got[key], ref[key], f"{v.path} {key} (moments mode)", tol=1e-11)


def _write_both(tmp_path, case: Case, model, x, y, **kwargs):
    """Logs the same step in both modes to two runs; returns their directories."""
    variables = model.trainable_variables
    reduction = None if case.reduction == "vector" else case.reduction
    dirs = {}
    for mode in ("moments", "norms"):
        logdir = tmp_path / mode
        writer = tf.summary.create_file_writer(str(logdir))

        @tf.function
        def step(x, y, mode=mode, writer=writer):
            loss = _loss_of(case, model, x, y)
            with writer.as_default(step=4):
                return gradmom.summary.moments(
                    loss,
                    variables,
                    reduction=reduction,
                    learning_rate=0.1,
                    mode=mode,
                    **kwargs,
                )

        step(tf.constant(x), tf.constant(y))
        writer.flush()
        dirs[mode] = logdir
    return dirs


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[6], CASES[10]], ids=lambda c: c.id)
def test_logged_norms_run_reads_like_the_moments_run(tmp_path, case):
    model = _built(case)
    x, y = _inputs(case)
    dirs = _write_both(tmp_path, case, model, x, y)
    runs = {mode: data.load(str(d))["."] for mode, d in dirs.items()}
    norms, moms = runs["norms"], runs["moments"]
    # the same stats tags; the norms run has no moments (maps) at all
    assert set(norms) == set(moms)
    brute = _brute_sums(case, model, x, y)
    model_want = {k: sum(b[k] for b in brute) for k in SUMS}
    for tag in moms:
        (a,), (b,) = norms[tag], moms[tag]
        assert a.moments == {} and a.content.source == "norms"
        assert getattr(b.content, "source", "moments") == "moments"
        if not metadata.is_model_tag(tag):
            assert b.moments  # a variable's maps in the moments run only
        for key in ("batch_size", "num_elements", *SUMS, "loss", "learning_rate"):
            _close(a.stats[key], b.stats[key], f"{tag} {key}", tol=2 * F32)
        assert math.isnan(a.stats["sum_gsnr"]) and math.isnan(a.stats["gsnr_count"])
        assert np.isnan(a.hist).all() and np.isfinite(b.hist).all()
        da, db = stats.derived(a.stats), stats.derived(b.stats)
        for key in ("total_variance", "grad_norm_sq_unbiased", "noise_scale", "norm_test"):
            _close(da[key], db[key], f"{tag} {key}", tol=1e-5)
        assert math.isnan(da["gsnr_mean"]) and math.isnan(da["eb_criterion"])
    for key in SUMS:  # the model's sums against brute force (float32 on disk)
        _close(norms["_model"][0].stats[key], model_want[key], f"_model {key}", tol=2 * F32)

    # TensorBoard's own reader sees the same tensors and scalars
    acc = {}
    for mode, d in dirs.items():
        ea = event_accumulator.EventAccumulator(str(d), size_guidance={"tensors": 0})
        ea.Reload()
        acc[mode] = ea
    tensors_n = set(acc["norms"].Tags()["tensors"])
    tensors_m = set(acc["moments"].Tags()["tensors"])
    stats_tags = {t for t in tensors_m if t.endswith(metadata.STATS_SUFFIX)}
    assert {t for t in tensors_n if t.startswith(("gradmom/",)) is False} == stats_tags
    for tag in stats_tags:
        (en,) = acc["norms"].Tensors(tag)
        (em,) = acc["moments"].Tensors(tag)
        vn = tf.make_ndarray(en.tensor_proto)
        vm = tf.make_ndarray(em.tensor_proto)
        content = metadata.parse_plugin_content(
            acc["norms"].SummaryMetadata(tag).plugin_data.content
        )
        assert content.source == "norms"
        for i, key in enumerate(metadata.STATS_FIELDS):
            if key in ("sum_gsnr", "gsnr_count"):
                assert np.isnan(vn[i])
            else:
                _close(float(vn[i]), float(vm[i]), f"{tag} {key}", tol=2 * F32)
    scalars_n = {t for t in tensors_n if t.startswith("gradmom/")}
    scalars_m = {t for t in tensors_m if t.startswith("gradmom/")}
    dropped = {t for t in scalars_m if t.endswith(("/gsnr_mean", "/eb_criterion"))}
    assert dropped and scalars_n == scalars_m - dropped
    for tag in scalars_n:
        (en,) = acc["norms"].Tensors(tag)
        (em,) = acc["moments"].Tensors(tag)
        _close(
            float(tf.make_ndarray(en.tensor_proto)),
            float(tf.make_ndarray(em.tensor_proto)),
            tag,
            tol=1e-5,
        )


def test_norms_mode_with_log_examples_reuses_the_norms(tmp_path):
    case = CASES[0]
    model = _built(case)
    x, y = _inputs(case)
    dirs = _write_both(tmp_path, case, model, x, y, log_examples=True)
    (rec,) = data.load_examples(str(dirs["norms"]))["."]["_examples"]
    brute = _brute_sums(case, model, x, y)
    model_raw = sum(b["sum_m2_raw"] for b in brute)
    np.testing.assert_allclose(rec.model.mean(), model_raw, rtol=1e-12)


def test_mode_errors_name_the_fix(tmp_path):
    model = _mlp()
    writer = tf.summary.create_file_writer(str(tmp_path))

    def step(mode, orders=(1, 2)):
        @tf.function
        def f(x, y):
            with writer.as_default(step=0):
                loss = tf.reduce_mean(sparse_ce(model(x), y))
                return gradmom.summary.moments(
                    loss, model.trainable_variables, mode=mode, orders=orders
                )

        return f(tf.zeros([2, 5], tf.float64), tf.zeros([2], tf.int32))

    with pytest.raises(ValueError, match="mode must be one of 'moments', 'norms', 'replicas'"):
        step("variance")
    with pytest.raises(ValueError, match="orders=\\(1, 2, 3\\) needs the element-wise moments"):
        step("norms", (1, 2, 3))
    with pytest.raises(ValueError, match="mode='replicas' estimates the noise .* use mode='norms'"):
        step("replicas")


@pytest.mark.slow
def test_norms_and_replicas_modes_under_mirrored_strategy(tmp_path):
    """`tests/norms_distributed_check.py` in a fresh process (2 logical CPUs): the norms mode's
    sums over the global batch and the replicas estimator's algebra against brute force, the
    replicas estimator equal to the exact one with one example per replica and agreeing with
    it in the mean over 300 batches, `summary.moments(mode="replicas")` read back, and
    ``log_examples`` (moments and norms modes) gathered from both replicas against brute
    force."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.norms_distributed_check", str(tmp_path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert len(lines) == 16, proc.stdout
    assert "ok per_example_norms sin_rnn sum+penalty n=7 split [4, 3]" in lines
    assert "ok log_examples norms mlp mean+penalty n=7 split [4, 3]" in lines
    assert "ok log_examples moments sin_rnn mean n=7 split [4, 3]" in lines
    assert "ok mlp sum+penalty n=7 split [4, 3]" in lines
    assert "ok sin_rnn sum n=7 split [4, 3]" in lines
    assert "ok replicas == norms with one example per replica" in lines
    assert "ok summary replicas" in lines


def _sums_of_model(model, x, y):
    """The model's three sums from brute force (the mean loss, no penalty)."""
    case = Case("callback", _mlp, (5,), n=len(x))
    return {k: sum(v[k] for v in _brute_sums(case, model, x, y)) for k in SUMS}


@pytest.mark.parametrize("accumulation", [1, 2], ids=["one-batch", "two-micro-batches"])
def test_callback_norms_mode_equals_brute_force(tmp_path, accumulation):
    """`GradMoments(mode="norms")` under `fit` (Keras' own train_step, the dry run): the
    logged model sums are those of the update's examples at the update's starting weights;
    with gradient accumulation, over both micro-batches (their sums added, as the moments)."""
    keras.utils.set_random_seed(7)
    model = _mlp()
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, gradient_accumulation_steps=accumulation)
        if accumulation > 1
        else keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64"),
    )
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(16, 5)), rng.integers(0, 3, size=16)
    initial = [v.numpy().copy() for v in model.trainable_variables]
    cb = gradmom.keras.GradMoments(tmp_path, every_n_steps=2, mode="norms")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), verbose=0, callbacks=[cb])

    run = data.load(str(tmp_path))["."]
    recs = run["_model"]
    assert recs[0].step == 0 and recs[0].content.source == "norms"
    assert all(not r.moments for rs in run.values() for r in rs)
    fresh = _mlp()
    for v, value in zip(fresh.trainable_variables, initial):
        v.assign(value)
    n = 4 * accumulation
    want = _sums_of_model(fresh, x[:n], y[:n])
    assert recs[0].batch_size == n
    for key in SUMS:
        _close(recs[0].stats[key], want[key], f"_model {key}", tol=4 * F32)


def test_tape_norms_mode_and_source_check(tmp_path):
    """`gradmom.GradientTape(mode="norms")` logs as `summary.moments` does; a content message
    with an unknown `source` is refused by the parser, naming the field."""
    model = _built(CASES[0])
    x, y = _inputs(CASES[0])
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y):
        with writer.as_default(step=1):
            with gradmom.GradientTape(mode="norms") as tape:
                loss = tf.reduce_mean(sparse_ce(model(x), y))
            return tape.gradient(loss, model.trainable_variables)

    step(tf.constant(x), tf.constant(y))
    writer.flush()
    (rec,) = data.load(str(tmp_path))["."]["_model"]
    want = _sums_of_model(model, x, y)
    for key in SUMS:
        _close(rec.stats[key], want[key], f"_model {key}", tol=2 * F32)
    content = metadata.create_summary_metadata(metadata.StatsContent(variable="v", source="norms"))
    raw = content.plugin_data.content.replace(b'"norms"', b'"bogus"')
    with pytest.raises(metadata.FormatError, match="`source` must be one of moments, norms"):
        metadata.parse_plugin_content(raw)


def test_plugin_serves_a_norms_run_without_maps(tmp_path):
    """A real TensorBoard app (`tests/test_plugin.py`'s harness, the Python loader) over a
    norms-mode run: /tags lists its variables with ``maps: false`` and the note the tab shows
    in place of the heatmap and histograms; /series and /summary serve the same statistics as
    for the moments run of the same step; /heatmap says there is no moments tag."""
    import json

    from tests.test_plugin import make_app

    case = CASES[0]
    model = _built(case)
    x, y = _inputs(case)
    _write_both(tmp_path, case, model, x, y)
    client, _, _ = make_app(str(tmp_path))
    p = "/data/plugin/gradmom/"

    def get(route):
        resp = client.get(p + route)
        return resp.status_code, json.loads(resp.get_data(as_text=True))

    code, tags = get("tags")
    assert code == 200
    norms, moms = tags["runs"]["norms"], tags["runs"]["moments"]
    assert set(norms) == set(moms) and norms
    for tag, info in norms.items():
        assert info["maps"] is False and info["source"] == "norms", tag
        assert "Maps are off in norms mode" in info["maps_note"]
        assert info["steps"] == moms[tag]["steps"] == [4]
        assert "maps" not in moms[tag]
    assert tags["model"]["norms"]["steps"] == [4]
    tag = "hidden/kernel"
    series = {run: get(f"series?run={run}&tag={tag}")[1]["values"] for run in ("norms", "moments")}
    for key in ("total_variance", "grad_norm_sq_unbiased", "noise_scale", "norm_test"):
        _close(series["norms"][key][0], series["moments"][key][0], key, tol=1e-5)
    assert series["norms"]["gsnr_mean"][0] == "NaN"  # the encoder's NaN (not JSON's)
    code, summary = get("summary?run=norms")
    assert code == 200
    assert [r["tag"] for r in summary["rows"]] == sorted(norms)
    resp = client.get(p + f"heatmap?run=norms&tag={tag}")
    assert resp.status_code == 404
    assert "has no moments tag" in resp.get_data(as_text=True)


@pytest.mark.slow
def test_tab_shows_curves_and_says_maps_are_off_in_real_chromium(tmp_path):
    """A real TensorBoard (subprocess) and Debian's headless Chromium on a log directory with
    only a norms-mode run: the tab lists its variables, draws the noise curves, and shows the
    backend's note in place of the heatmap and the histograms; no console error."""
    from tests import test_frontend_browser as fb

    if not os.path.exists(fb.CHROMIUM):
        pytest.skip(f"{fb.CHROMIUM} is missing (install Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    case = CASES[0]
    model = _built(case)
    rng = np.random.default_rng(3)
    writer = tf.summary.create_file_writer(str(tmp_path / "norms"))

    @tf.function
    def step(x, y, s):
        loss = _loss_of(case, model, x, y)
        with writer.as_default(step=s):
            return gradmom.summary.moments(loss, model.trainable_variables, mode="norms")

    for s in range(0, 50, 10):
        x, y = rng.normal(size=(16, 5)), rng.integers(0, 3, size=16)
        step(tf.constant(x), tf.constant(y), tf.constant(s, tf.int64))
    writer.flush()

    port = fb.free_port()
    log = (tmp_path / "tensorboard.log").open("w")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        fb._tensorboard_command(tmp_path, port), cwd=root, env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{port}"
    try:
        import time

        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, f"tensorboard exited: see {log.name}"
            try:
                if fb.get_json(base, "tags")["runs"].get("norms"):
                    break
            except (OSError, ValueError):
                pass
            assert time.time() < deadline, f"tensorboard did not serve gradmom: see {log.name}"
            time.sleep(1)
        note = fb.get_json(base, "tags")["runs"]["norms"]["hidden/kernel"]["maps_note"]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=fb.CHROMIUM, headless=True, args=fb.CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "console",
                lambda m: (
                    errors.append(f"{m.text} ({m.location.get('url', '')})")
                    if m.type == "error" and "favicon" not in m.location.get("url", "")
                    else None
                ),
            )
            page.goto(base + "/data/plugin_entry.html?name=gradmom")
            page.wait_for_function("() => window.gradmom && window.gradmom.pending !== undefined")
            page.evaluate("() => window.gradmom.pending")
            page.click('.tag-list button[data-tag="hidden/kernel"]')
            page.evaluate("() => window.gradmom.pending")
            page.wait_for_timeout(300)
            heatmap = page.inner_text("#heatmap-card")
            histograms = page.inner_text("#histogram-card")
            assert note in heatmap and note in histograms
            assert "Could not load" not in heatmap + histograms
            # the noise curves are drawn: one line per curve view, over the 5 logged steps
            assert page.locator("path.curve").count() >= 1
            fb.SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(fb.SHOTS / "norms_mode_tab.png"), full_page=True)
            browser.close()
        assert not errors, errors
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
