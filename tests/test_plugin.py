"""The TensorBoard plugin over real event files, through TensorBoard's own app and data provider.

The logdir is written by `tests/plugin_logdir.py` with TensorFlow's summary writer (in a
subprocess, so this test process never imports TensorFlow). The app is TensorBoard's
`TensorBoardWSGIApp` with the real `LocalDataIngester` (the Python loader) configured by
`program.TensorBoard.configure`, so the plugin loader's flag handling runs as in `tensorboard`.
References are computed here from the per-example gradient samples the fixture drew
(``np.var(g, ddof=1)`` and friends), independently of the moment formulas.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from tensorboard import context, program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_ingester
from tensorboard.plugins import base_plugin
from tensorboard.plugins.core import core_plugin
from werkzeug.test import Client

from tb_gradmom import metadata
from tb_gradmom.analysis import encode, reductions, stats, views
from tb_gradmom.plugin import _cache, _payloads, _static
from tb_gradmom.plugin.loader import DEFAULT_SAMPLES, GradMomentsPluginLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plugin_logdir as fx  # noqa: E402

P = "/data/plugin/gradmom/"
VARS = {v.tag: v for v in fx.TRAIN_VARS}


# ----------------------------------------------------------------------------- harness


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gradmom_logdir"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run(
        [sys.executable, os.path.join(HERE, "plugin_logdir.py"), d],
        check=True,
        env=env,
        capture_output=True,
    )
    with open(os.path.join(d, "fixture.json")) as f:
        desc = json.load(f)
    return d, desc


class _CapturingLoader(GradMomentsPluginLoader):
    plugin = None

    def load(self, context):
        self.plugin = super().load(context)
        return self.plugin


def make_app(logdir_path, *argv, wrap_provider=None):
    """(werkzeug Client, plugin, flags) over a real TensorBoard app and Python data loader."""
    loader = _CapturingLoader()
    loaders = [core_plugin.CorePluginLoader(), loader]
    tb = program.TensorBoard(plugins=loaders, assets_zip_provider=lambda: None)
    tb.configure(
        ["", "--logdir", logdir_path, "--reload_interval", "0", "--reload_task", "blocking", *argv]
    )
    ingester = data_ingester.LocalDataIngester(tb.flags)
    ingester.start()
    provider = ingester.data_provider
    if wrap_provider is not None:
        provider = wrap_provider(provider)
    app = application.TensorBoardWSGIApp(
        tb.flags, loaders, provider, None, ingester.deprecated_multiplexer
    )
    return Client(app), loader.plugin, tb.flags


@pytest.fixture(scope="module")
def env(logdir):
    client, plugin, flags = make_app(logdir[0])
    return client, plugin


def _no_bare_constants(c):
    raise AssertionError(f"bare {c} in JSON (not valid JSON)")


def get(client, route, status=200, **params):
    r = client.get(P + route, query_string=params)
    assert r.status_code == status, (route, params, r.status_code, r.get_data(as_text=True))
    return r


def get_json(client, route, **params):
    r = get(client, route, **params)
    assert r.headers["Content-Type"] == "application/json"
    return json.loads(r.get_data(as_text=True), parse_constant=_no_bare_constants)


def num(v):
    """Decodes the documented JSON encoding of numbers."""
    if v is None:
        return None
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[v]
    return float(v)


def nums(vs):
    return np.asarray([num(v) for v in vs], dtype=np.float64)


# -------------------------------------------------------------------------- references


def ref_stat(g: np.ndarray, stat: str) -> np.ndarray:
    """Element-wise statistic straight from per-example gradients g [n, ...] (float64)."""
    mean = g.mean(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "mean": lambda: mean,
            "second_moment": lambda: (g**2).mean(axis=0),
            "third_moment": lambda: (g**3).mean(axis=0),
            "fourth_moment": lambda: (g**4).mean(axis=0),
            "variance": lambda: g.var(axis=0, ddof=1),
            "biased_variance": lambda: g.var(axis=0),
            "std": lambda: g.std(axis=0, ddof=1),
            "snr": lambda: mean**2 / g.var(axis=0, ddof=1),
            "skewness": lambda: ((g - mean) ** 3).mean(axis=0) / g.var(axis=0) ** 1.5,
            "kurtosis": lambda: ((g - mean) ** 4).mean(axis=0) / g.var(axis=0) ** 2,
        }[stat]()


def ref_2d(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.ndim == 1:
        return a.reshape(1, -1)
    return a.reshape(-1, a.shape[-1])


def ref_pool(grid: np.ndarray, max_rows: int, max_cols: int):
    br, bc = -(-grid.shape[0] // max_rows), -(-grid.shape[1] // max_cols)
    out = np.empty((-(-grid.shape[0] // br), -(-grid.shape[1] // bc)))
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            block = grid[i * br : (i + 1) * br, j * bc : (j + 1) * bc]
            ok = block[~np.isnan(block)]
            out[i, j] = ok.mean() if ok.size else np.nan
    return out, [br, bc]


# ---------------------------------------------------------------------- loader & listing


def test_plugins_listing_has_the_tab(env):
    client, _ = env
    r = client.get("/data/plugins_listing")
    entry = json.loads(r.get_data(as_text=True))["gradmom"]
    assert entry["enabled"] is True
    assert entry["tab_name"] == "Grad Moments"
    assert entry["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": "/data/plugin/gradmom/index.js",
    }


def test_setup_declares_the_entry_point():
    with open(os.path.join(os.path.dirname(HERE), "setup.py")) as f:
        assert "gradmom = tb_gradmom.plugin.loader:GradMomentsPluginLoader" in f.read()


def test_default_samples_per_plugin_keeps_more_than_tensorboards_10(logdir, env):
    client, _ = env
    tags = get_json(client, "tags")["runs"]["long"]
    assert DEFAULT_SAMPLES >= logdir[1]["long_steps"] > 10
    assert tags["dense/bias"]["steps"] == list(range(logdir[1]["long_steps"]))


def test_user_samples_per_plugin_is_honoured(logdir):
    client, _, flags = make_app(logdir[0], "--samples_per_plugin=gradmom=7,scalars=5")
    # the per-example norms' own plugin name gets the default unless given too
    assert flags.samples_per_plugin == {"gradmom": 7, "scalars": 5, "gradmom_examples": 500}
    steps = get_json(client, "tags")["runs"]["long"]["dense/bias"]["steps"]
    assert len(steps) == 7 and steps[-1] == logdir[1]["long_steps"] - 1


def test_loader_never_raises(monkeypatch):
    loader = GradMomentsPluginLoader()
    # A broken plugin module: load() logs and returns None instead of raising.
    monkeypatch.setitem(sys.modules, "tb_gradmom.plugin.plugin", None)
    assert loader.load(base_plugin.TBContext(flags=None, data_provider=None)) is None
    monkeypatch.undo()

    class Flags:
        samples_per_plugin = "not a dict"

    loader.fix_flags(Flags())  # left alone, no exception
    assert Flags.samples_per_plugin == "not a dict"
    loader.fix_flags(object())  # no attribute at all

    import argparse

    parser = argparse.ArgumentParser()
    loader.define_flags(parser)
    loader.define_flags(parser)  # defined twice: argparse raises, the loader must not
    assert parser.parse_args([]).gradmom_cache_mb is None


# --------------------------------------------------------------------------------- /tags


def test_tags_lists_moments_tags_with_their_metadata(logdir, env):
    client, _ = env
    d = get_json(client, "tags")
    train = d["runs"]["train"]
    assert set(train) == set(VARS)  # no `_stats` tags, no scalar `loss`
    for tag, var in VARS.items():
        t = train[tag]
        assert t["shape"] == list(var.shape)
        assert t["stored_shape"] == list(var.stored_shape)
        assert t["pooled"] is var.pooled
        assert t["block"] == list(var.block)
        assert t["orders"] == list(var.orders)
        assert t["op"] == var.op and t["dtype"] == "float32"
        assert t["steps"] == list(fx.TRAIN_STEPS)
        assert t["has_stats"] is var.stats
    assert train["big/kernel"]["block"] == [4, 3] and train["big/kernel"]["stored_shape"] == [
        10,
        10,
    ]
    assert train["conv/kernel"]["grid_shape"] == [18, 4]
    assert d["model"]["train"] == {"steps": list(fx.TRAIN_STEPS)}
    assert "future/kernel" not in d["runs"]["eval"]  # newer format version: skipped
    assert d["runs"]["corrupt"]["dense/kernel"]["steps"] == [0, 1]
    assert d["runs"]["truncated"]["dense/kernel"]["steps"][:4] == [0, 1, 2, 3]
    if logdir[1]["xss_run"]:
        assert d["runs"][fx.XSS_RUN]["dense/kernel"]["steps"] == [0, 5]


def test_tags_reads_no_moments_values(logdir):
    reads = []

    class Recording:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def read_tensors(self, ctx=None, **kw):
            reads.extend(kw["run_tag_filter"].tags)
            return self._inner.read_tensors(ctx, **kw)

    client, _, _ = make_app(logdir[0], wrap_provider=Recording)
    get_json(client, "tags")
    # Only stats tags, plus the moments tags that have no stats tag to take the steps from.
    assert reads and {t for t in reads if not t.endswith("/_stats")} == {
        "nostats/kernel",
        "mismatch/kernel",
    }


# ----------------------------------------------------- the real writer (summary.moments)


@pytest.fixture(scope="module")
def keras_ref(logdir):
    r = np.load(os.path.join(logdir[0], f"{fx.KERAS_RUN}_reference.npz"))
    names = [str(n) for n in r["names"]]
    steps = [int(s) for s in r["steps"]]
    return names, steps, {(name, s): r[f"g{i}_{s}"] for i, name in enumerate(names) for s in steps}


def test_keras_run_tags(env, keras_ref):
    client, _ = env
    names, steps, g = keras_ref
    tags = get_json(client, "tags")["runs"][fx.KERAS_RUN]
    assert set(tags) == set(names)
    for name in names:
        shape = g[(name, 0)].shape[1:]
        t = tags[name]
        assert t["shape"] == list(shape) and t["steps"] == steps and t["has_stats"] is True
        assert t["pooled"] is (math.prod(shape) > fx.KERAS_MAX_ELEMENTS)
    assert tags["hidden/kernel"]["block"] == [2, 1]
    assert tags["conv/kernel"]["op"] == "Conv2D"


def _pooled_moment_stat(g, stat, block):
    """The statistic of the block-mean moments (the documented meaning for pooled tags)."""
    n = g.shape[0]
    m1 = fx.block_means(g.mean(0), g.shape[1:], block)
    m2 = fx.block_means((g**2).mean(0), g.shape[1:], block)
    var = n / (n - 1) * (m2 - m1**2)
    return {"mean": m1, "variance": var, "snr": m1**2 / var}[stat]


@pytest.mark.parametrize("stat", ["mean", "variance", "snr"])
def test_keras_heatmaps_match_per_example_gradients(env, keras_ref, stat):
    client, _ = env
    names, steps, g = keras_ref
    for name in names:
        for step in steps:
            d = get_json(client, "heatmap", run=fx.KERAS_RUN, tag=name, step=step, stat=stat)
            ge = g[(name, step)]
            if d["stored_shape"] != d["shape"]:
                want = _pooled_moment_stat(ge, stat, d["block"])
            else:
                want = ref_2d(ref_stat(ge, stat))
            got = nums(d["values"]).reshape(want.shape)
            # The writer's default float16 maps (docs/format.md) hold M1 and the variance to
            # half a float16 ulp, 2**-11 relative; the snr combines three such factors.
            np.testing.assert_allclose(
                got,
                want,
                rtol=3 * 2.0**-11 if stat == "snr" else 2.0**-11,
                atol=1e-7 * np.abs(want).max(),
                err_msg=f"{name} step {step} {stat}",
            )


def test_keras_series_matches_per_example_gradients(env, keras_ref):
    client, _ = env
    names, steps, g = keras_ref
    d = get_json(client, "series", run=fx.KERAS_RUN)
    n = fx.KERAS_BATCH
    assert d["steps"] == steps
    for i, step in enumerate(steps):
        tr = sum(g[(nm, step)].var(0, ddof=1).sum() for nm in names)
        m2 = sum((g[(nm, step)].mean(0) ** 2).sum() for nm in names)
        v = {k: num(d["values"][k][i]) for k in ("total_variance", "grad_norm_sq", "noise_scale")}
        assert v["total_variance"] == pytest.approx(tr, rel=1e-5)
        assert v["grad_norm_sq"] == pytest.approx(m2, rel=1e-5)
        # |G|^2 = |m|^2 - tr/n can be small: compare the noise scale through its parts.
        assert v["noise_scale"] * (m2 - tr / n) == pytest.approx(tr, rel=1e-3)
        assert num(d["values"]["learning_rate"][i]) == pytest.approx(fx.KERAS_LR)


# ------------------------------------------------------------------------------ /heatmap

HEATMAP_CASES = [
    # id, run, tag, step, stat, max_rows, max_cols
    ("dense-variance-latest", "train", "dense/kernel", None, "variance", 256, 256),
    ("dense-mean-step10", "train", "dense/kernel", 10, "mean", 256, 256),
    ("bias-std", "train", "dense/bias", 20, "std", 256, 256),
    ("conv2d-snr", "train", "conv/kernel", 30, "snr", 256, 256),
    ("conv2d-variance-server-pooled", "train", "conv/kernel", 0, "variance", 4, 3),
    ("conv1d-biased-variance", "train", "conv1d/kernel", 40, "biased_variance", 256, 256),
    ("scalar-second-moment", "train", "scale", 50, "second_moment", 256, 256),
    ("skew-third-moment", "train", "skew/kernel", 10, "third_moment", 256, 256),
    ("skew-fourth-moment", "train", "skew/kernel", 10, "fourth_moment", 256, 256),
    ("skew-skewness", "train", "skew/kernel", 10, "skewness", 256, 256),
    ("skew-kurtosis-pooled", "train", "skew/kernel", 20, "kurtosis", 2, 2),
    ("nostats-mean", "train", "nostats/kernel", 30, "mean", 256, 256),
    ("n1-mean", "n1", "dense/kernel", 1, "mean", 256, 256),
    ("xss-variance", fx.XSS_RUN, "dense/kernel", 5, "variance", 256, 256),
]

# float32 storage of the moments: M2 - M1**2 loses ~M2/var ulps (< 10 here); the central
# moments of skewness/kurtosis combine up to 4 float32 terms (measured max rel. error 3e-5).
RTOL = {"skewness": 2e-4, "kurtosis": 2e-4}


@pytest.mark.parametrize("case", HEATMAP_CASES, ids=[c[0] for c in HEATMAP_CASES])
def test_heatmap_matches_numpy_reference(env, logdir, case):
    _, run, tag, step, stat, max_rows, max_cols = case
    if run == fx.XSS_RUN and not logdir[1]["xss_run"]:
        pytest.skip("the file system refused the run name")
    client, _ = env
    params = {"run": run, "tag": tag, "stat": stat, "max_rows": max_rows, "max_cols": max_cols}
    if step is not None:
        params["step"] = step
    d = get_json(client, "heatmap", **params)
    want_step = fx.TRAIN_STEPS[-1] if step is None else step
    var = VARS.get(tag, fx.TRAIN_VARS[0])
    n = 1 if run == "n1" else fx.BATCH
    g = fx.samples(run, tag, want_step, var.shape, n)
    expected, block = ref_pool(ref_2d(ref_stat(g, stat)), max_rows, max_cols)
    assert d["run"] == run and d["tag"] == tag and d["step"] == want_step and d["stat"] == stat
    assert d["shape"] == list(var.shape)
    assert d["grid_shape"] == list(ref_2d(np.zeros(var.shape)).shape)
    assert [d["rows"], d["cols"]] == list(expected.shape) and d["block"] == block
    assert d["batch_size"] == (None if tag == "nostats/kernel" else n)
    assert d["unbiased"] is (stat != "biased_variance")
    values = nums(d["values"]).reshape(expected.shape)
    np.testing.assert_allclose(values, expected, rtol=RTOL.get(stat, 2e-6), atol=1e-12)
    finite = expected[np.isfinite(expected)]
    assert num(d["min"]) == pytest.approx(finite.min(), rel=RTOL.get(stat, 2e-6))
    assert num(d["max"]) == pytest.approx(finite.max(), rel=RTOL.get(stat, 2e-6))


@pytest.mark.parametrize("stat", ["mean", "variance", "second_moment"])
def test_heatmap_of_a_writer_pooled_variable(env, stat):
    """Stored block means: the statistic of the block-mean moments, blocks composed."""
    client, _ = env
    var = VARS["big/kernel"]
    d = get_json(
        client, "heatmap", run="train", tag="big/kernel", step=20, stat=stat, max_rows=5, max_cols=4
    )
    g = fx.samples("train", "big/kernel", 20, var.shape)
    m1 = fx.block_means(g.mean(0), var.shape, var.block)
    m2 = fx.block_means((g**2).mean(0), var.shape, var.block)
    n = fx.BATCH
    stored = {"mean": m1, "second_moment": m2, "variance": n / (n - 1) * (m2 - m1**2)}[stat]
    expected, block = ref_pool(stored, 5, 4)
    assert d["block"] == [var.block[0] * block[0], var.block[1] * block[1]] == [8, 9]
    assert d["pooled"] is True and d["grid_shape"] == [40, 30] and d["stored_shape"] == [10, 10]
    np.testing.assert_allclose(nums(d["values"]).reshape(expected.shape), expected, rtol=2e-6)


def test_heatmap_nan_and_inf_are_served_json_safe(env):
    client, _ = env
    d = get_json(client, "heatmap", run="train", tag="nonfinite/kernel", step=10, stat="variance")
    raw = d["values"]
    assert raw[0] == "NaN"  # M1 NaN
    assert raw[1] == "Infinity"  # M2 Inf, M1 finite
    assert raw[3] == "NaN"  # M1 -Inf, M2 Inf: Inf - Inf
    assert all(isinstance(v, (int, float)) for i, v in enumerate(raw) if i not in (0, 1, 3))
    values = nums(raw)
    # min/max over finite values (exact; values have 9 significant digits)
    assert num(d["max"]) == pytest.approx(values[np.isfinite(values)].max(), rel=1e-8)
    snr = get_json(client, "heatmap", run="train", tag="nonfinite/kernel", step=10, stat="snr")
    assert snr["values"][1] == 0  # finite M1**2 / Inf
    mean = get_json(client, "heatmap", run="train", tag="nonfinite/kernel", step=10, stat="mean")
    assert mean["values"][3] == "-Infinity"


def test_heatmap_batch_size_one_gives_nan_variance(env):
    client, _ = env
    d = get_json(client, "heatmap", run="n1", tag="dense/kernel", stat="variance")
    assert d["batch_size"] == 1 and set(d["values"]) == {"NaN"}
    assert d["min"] is None and d["max"] is None


def test_latest_step_of_a_truncated_run_is_the_last_complete_one(env):
    client, _ = env
    d = get_json(client, "heatmap", run="truncated", tag="dense/kernel")
    g = fx.samples("truncated", "dense/kernel", d["step"], (6, 4))
    assert d["step"] == 3
    np.testing.assert_allclose(nums(d["values"]), g.var(0, ddof=1).ravel(), rtol=2e-6)


def test_torn_last_step_is_left_out_of_every_route(env):
    """Run `truncated` is cut inside its last stats record: step 4 has moments, no stats."""
    client, _ = env
    assert get_json(client, "tags")["runs"]["truncated"]["dense/kernel"]["steps"] == [0, 1, 2, 3]
    q = {"run": "truncated", "tag": "dense/kernel"}
    h = get_json(client, "histogram", step="all", bins=5, **q)  # was 400 (no batch size)
    assert [s["step"] for s in h["series"]] == [0, 1, 2, 3] and h["stored_steps"] == 4
    per_step = [fx.samples("truncated", "dense/kernel", s, (6, 4)).var(0, ddof=1) for s in range(4)]
    assert [sum(s["counts"]) for s in h["series"]] == [v.size for v in per_step]
    e = json.loads(
        get(client, "export", what="histogram", format="json", step="all", **q).get_data()
    )
    assert [s["step"] for s in e["series"]] == [0, 1, 2, 3]
    assert get_json(client, "histogram", **q)["series"][0]["step"] == 3
    get(client, "export", 404, what="moments", step=4, **q)


def test_reads_over_grpc_are_capped_and_say_so(logdir, monkeypatch):
    """A gRPC provider (RustBoard) gets at most GRPC_READ_BUDGET bytes per read."""
    from tb_gradmom.plugin import _reader

    class GrpcLike:  # any provider that is not the Python MultiplexerDataProvider
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

    client, _, _ = make_app(logdir[0], wrap_provider=GrpcLike)
    per_step = 4 * 2 * 10 * 10  # big/kernel: 2 orders of a stored [10, 10] grid
    monkeypatch.setattr(_reader, "GRPC_READ_BUDGET", 3 * per_step)
    h = get_json(client, "histogram", run="train", tag="big/kernel", step="all")
    assert h["downsampled"] is True and len(h["series"]) == 3
    assert h["series"][-1]["step"] == fx.TRAIN_STEPS[-1]  # the sample keeps the last step
    sampled = {s["step"] for s in h["series"]}
    missing = next(s for s in fx.TRAIN_STEPS if s not in sampled)
    r = get(client, "heatmap", 404, run="train", tag="big/kernel", step=missing)
    assert "lower --samples_per_plugin" in r.get_data(as_text=True)
    get_json(client, "heatmap", run="train", tag="big/kernel")  # the latest: one step, fine


class _Recording:
    """A data provider that records its reads: ``(tag, downsample, points returned)``.

    Not being TensorBoard's `MultiplexerDataProvider`, it also makes the plugin treat the
    provider as a gRPC one (RustBoard's read budget applies).
    """

    def __init__(self, inner, reads, listings=None):
        self._inner, self._reads, self._listings = inner, reads, listings

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def list_tensors(self, ctx=None, **kw):
        if self._listings is not None:
            self._listings.append(kw.get("run_tag_filter"))
        return self._inner.list_tensors(ctx, **kw)

    def read_tensors(self, ctx=None, **kw):
        out = self._inner.read_tensors(ctx, **kw)
        for tags in out.values():
            for tag, series in tags.items():
                self._reads.append((tag, kw["downsample"], len(series)))
        return out


def _recording(reads, listings=None):
    return lambda inner: _Recording(inner, reads, listings)


@pytest.mark.parametrize("step", [0, 37, 75, 112, 148])
def test_one_step_of_a_big_series_is_read_with_a_targeted_sample(logdir, monkeypatch, step):
    """A missed step is read with a sample that holds it, found from the stats tag's steps."""
    from tb_gradmom.plugin import _reader

    monkeypatch.setattr(_reader, "TARGETED_READ_MIN_BYTES", 0)  # every series counts as big
    reads = []
    client, _, _ = make_app(logdir[0], wrap_provider=_recording(reads))
    d = get_json(client, "heatmap", run="long", tag="dense/bias", step=step, stat="variance")
    g = fx.samples("long", "dense/bias", step, (4,))
    assert d["step"] == step
    np.testing.assert_allclose(nums(d["values"]), g.var(0, ddof=1), rtol=2e-6)
    (moments_read,) = [r for r in reads if r[0] == "dense/bias"]
    _, downsample, points = moments_read
    # A sample, not the whole series (these steps are not the last of the sampling order).
    assert downsample == points < fx.LONG_STEPS
    # The probes read only the stats tag, a bisection's worth of times.
    probes = [r for r in reads if r[0] == "dense/bias/_stats" and r[1] != _reader.ALL_STEPS]
    assert 1 <= len(probes) <= 8


def test_targeted_samples_serve_scrubbing_and_stay_exact(logdir, monkeypatch):
    """Every step of a series, in order, each exact; most served from steps read before."""
    from tb_gradmom.plugin import _reader

    monkeypatch.setattr(_reader, "TARGETED_READ_MIN_BYTES", 0)
    reads = []
    client, _, _ = make_app(logdir[0], wrap_provider=_recording(reads))
    for step in range(0, fx.LONG_STEPS, 3):
        d = get_json(client, "heatmap", run="long", tag="dense/bias", step=step, stat="mean")
        g = fx.samples("long", "dense/bias", step, (4,))
        np.testing.assert_allclose(nums(d["values"]), g.mean(0), rtol=2e-6, atol=1e-7)
    # Each read is cached whole, and a step missed later comes later in the sampling order,
    # so its sample holds what was read before: a few reads serve all 50 steps (here 5,
    # the last one the whole series).
    moment_reads = [r for r in reads if r[0] == "dense/bias"]
    assert len(moment_reads) <= 8


def test_targeted_read_falls_back_when_the_stats_steps_differ(logdir, monkeypatch):
    """Run `truncated`: its moments tag has a step more than its stats tag, so the stats
    tag's samples do not predict the moments tag's: the whole series is read instead."""
    from tb_gradmom.plugin import _reader

    monkeypatch.setattr(_reader, "TARGETED_READ_MIN_BYTES", 0)
    for step in (0, 1, 2, 3):
        reads = []
        client, plugin, _ = make_app(logdir[0], wrap_provider=_recording(reads))
        d = get_json(client, "heatmap", run="truncated", tag="dense/kernel", step=step)
        g = fx.samples("truncated", "dense/kernel", step, (6, 4))
        np.testing.assert_allclose(nums(d["values"]), g.var(0, ddof=1).ravel(), rtol=2e-6)
        moment_reads = [r for r in reads if r[0] == "dense/kernel"]
        assert moment_reads[-1][1] == _reader.ALL_STEPS  # the whole series in the end
        if len(moment_reads) == 2:  # a sample was tried, missed, and is not tried again
            assert any(k[0] == "untargeted" for k in plugin._cache.keys())


def test_one_listing_per_heatmap_request(logdir):
    listings = []
    client, _, _ = make_app(logdir[0], wrap_provider=_recording([], listings))
    q = {"run": "train", "tag": "dense/kernel", "step": 20}
    get_json(client, "heatmap", **q)
    listings.clear()
    get_json(client, "heatmap", stat="mean", **q)  # not cached yet: reads the cached moments
    get_json(client, "heatmap", stat="mean", **q)  # cached response
    assert len(listings) == 2


# ---------------------------------------------------------------------------- /histogram


@pytest.mark.parametrize("scale", ["linear", "log"])
@pytest.mark.parametrize("stat", ["variance", "mean", "snr"])
def test_histogram_one_step(env, stat, scale):
    client, _ = env
    d = get_json(
        client, "histogram", run="train", tag="conv/kernel", step=20, stat=stat, bins=7, scale=scale
    )
    v = ref_stat(fx.samples("train", "conv/kernel", 20, (3, 3, 2, 4)), stat).ravel()
    v = v[np.isfinite(v)]
    if scale == "log":
        v = v[v > 0]
        edges = np.logspace(np.log10(v.min()), np.log10(v.max()), 8)
    else:
        edges = np.linspace(v.min(), v.max(), 8)
    assert d["scale"] == scale and d["stat"] == stat and d["bins"] == 7
    np.testing.assert_allclose(nums(d["edges"]), edges, rtol=1e-5)
    (s,) = d["series"]
    assert s["step"] == 20 and s["nonfinite"] == 0
    # Binned on the served edges: the extremes (float32 data vs float64 samples) clipped in.
    served = nums(d["edges"])
    assert s["counts"] == np.histogram(np.clip(v, served[0], served[-1]), served)[0].tolist()


def test_histogram_over_all_steps_shares_edges(env):
    client, _ = env
    d = get_json(client, "histogram", run="train", tag="dense/kernel", step="all", bins=5)
    per_step = [
        ref_stat(fx.samples("train", "dense/kernel", s, (6, 4)), "variance").ravel()
        for s in fx.TRAIN_STEPS
    ]
    allv = np.concatenate(per_step)
    edges = np.linspace(allv.min(), allv.max(), 6)
    np.testing.assert_allclose(nums(d["edges"]), edges, rtol=1e-5)
    assert [s["step"] for s in d["series"]] == list(fx.TRAIN_STEPS)
    assert d["downsampled"] is False
    for s, v in zip(d["series"], per_step):
        # Values on an edge may fall either side within float32 rounding: compare totals
        # exactly and bins within one count.
        assert sum(s["counts"]) == v.size
        assert np.abs(np.asarray(s["counts"]) - np.histogram(v, edges)[0]).max() <= 1


def test_histogram_over_all_steps_of_a_big_series_is_a_sample(logdir, env, monkeypatch):
    """Above HISTOGRAM_READ_BYTES the all-steps histogram bins TensorBoard's sample of the
    steps, says so, and is exact for the steps it lists; exports bin every step."""
    from tb_gradmom.analysis import data
    from tb_gradmom.plugin import _reader

    q = {"run": "train", "tag": "big/kernel", "step": "all", "bins": 9, "stat": "variance"}
    # Below the budget (the default): every step.
    d = get_json(env[0], "histogram", **q)
    assert d["downsampled"] is False and [s["step"] for s in d["series"]] == list(fx.TRAIN_STEPS)
    assert d["stored_steps"] == len(fx.TRAIN_STEPS)

    per_step = 4 * 2 * 10 * 10  # big/kernel: 2 orders of a stored [10, 10] grid
    monkeypatch.setattr(_reader, "HISTOGRAM_READ_BYTES", 3 * per_step)
    client, _, _ = make_app(logdir[0])
    recs = {r.step: r for r in data.load(logdir[0])["train"]["big/kernel"]}
    for scale in ("linear", "log"):
        d = get_json(client, "histogram", scale=scale, **q)
        steps = [s["step"] for s in d["series"]]
        assert d["downsampled"] is True and d["stored_steps"] == len(fx.TRAIN_STEPS)
        assert len(steps) == 3 and steps == sorted(steps) and set(steps) <= set(fx.TRAIN_STEPS)
        assert steps[-1] == fx.TRAIN_STEPS[-1]  # the sample keeps the latest step
        # Exact: the same numbers as reductions.histograms_over_steps of the stored moments
        # of the listed steps (and only those: the edges span them alone).
        arrays = [
            reductions.stat_array(recs[s].moments, recs[s].batch_size, "variance") for s in steps
        ]
        edges, counts = reductions.histograms_over_steps(arrays, bins=9, scale=scale)
        np.testing.assert_allclose(nums(d["edges"]), edges, rtol=1e-8)  # 9 digits in JSON
        assert [s["counts"] for s in d["series"]] == [c.tolist() for c in counts]
        # Against the per-example gradients (independent of the moment formulas).
        ref = [
            _pooled_moment_stat(
                fx.samples("train", "big/kernel", s, (40, 30)), "variance", VARS["big/kernel"].block
            )
            for s in steps
        ]
        allv = np.concatenate([v.ravel() for v in ref])
        if scale == "log":
            ref_edges = np.logspace(np.log10(allv.min()), np.log10(allv.max()), 10)
        else:
            ref_edges = np.linspace(allv.min(), allv.max(), 10)
        np.testing.assert_allclose(nums(d["edges"]), ref_edges, rtol=1e-5)
    r = get(client, "export", what="histogram", format="json", **q)
    full = json.loads(r.get_data(as_text=True))
    assert full["downsampled"] is False and len(full["series"]) == len(fx.TRAIN_STEPS)
    # The single-step histogram is never a sample.
    one = get_json(client, "histogram", run="train", tag="big/kernel", step=20)
    assert one["downsampled"] is False and one["stored_steps"] == len(fx.TRAIN_STEPS)


def test_histogram_counts_nonfinite_values(env):
    client, _ = env
    d = get_json(client, "histogram", run="train", tag="nonfinite/kernel", step="all")
    assert all(s["nonfinite"] == 3 for s in d["series"])  # NaN at [0,0] and [1,0]; Inf at [0,1]
    assert all(sum(s["counts"]) == 12 - 3 for s in d["series"])


def _hist_cases():
    rng = np.random.default_rng(3)
    return {
        "normal": [rng.normal(size=50) for _ in range(4)],
        "with-nonfinite": [np.array([np.nan, 1.0, np.inf, -2.0]), np.array([-np.inf, 0.5])],
        "single-value": [np.full(5, 3.0), np.full(2, 3.0)],
        "empty": [np.array([np.nan]), np.empty(0)],
        "log-with-negatives": [np.array([-1.0, 0.0, 1e-3, 10.0]), np.array([5.0, -3.0])],
    }


@pytest.mark.parametrize("scale", ["linear", "log"])
@pytest.mark.parametrize("name", list(_hist_cases()))
@pytest.mark.parametrize("keep", [0, 1 << 30], ids=["recompute", "keep"])
def test_streaming_histograms_equal_reductions(monkeypatch, name, scale, keep):
    monkeypatch.setattr(_payloads, "_STREAM_KEEP_BYTES", keep)
    arrays = _hist_cases()[name]
    calls = []

    def compute(i):
        calls.append(i)
        return arrays[i]

    edges, counts, nonfinite = _payloads.histograms_streaming(compute, len(arrays), 6, scale)
    want_edges, want_counts = reductions.histograms_over_steps(arrays, 6, scale)
    np.testing.assert_array_equal(edges, want_edges)
    for c, w in zip(counts, want_counts):
        np.testing.assert_array_equal(c, w)
    assert nonfinite == [int(np.count_nonzero(~np.isfinite(a))) for a in arrays]
    recomputed = sum(a.nbytes > 0 for a in arrays) if keep == 0 else 0
    assert len(calls) == len(arrays) + recomputed


# ------------------------------------------------------------------------------- /series


def _ref_sums(run, tags, step, n=fx.BATCH):
    tr = m2 = gsnr = count = raw = d = 0.0
    for tag in tags:
        g = fx.samples(run, tag, step, VARS[tag].shape, n)
        mean, var = g.mean(0), g.var(0, ddof=1)
        tr += var.sum()
        m2 += (mean**2).sum()
        gsnr += (mean**2 / var).sum()
        count += var.size
        raw += (g**2).mean(0).sum()
        d += var.size
    return dict(tr=tr, m2=m2, gsnr=gsnr, count=count, raw=raw, d=d)


@pytest.mark.parametrize("tag", [None, "_model", "conv/kernel", "big/kernel"])
def test_series_matches_reference(env, tag):
    client, _ = env
    params = {"run": "train"} | ({} if tag is None else {"tag": tag})
    d = get_json(client, "series", **params)
    assert d["tag"] == (tag or "_model") and d["steps"] == list(fx.TRAIN_STEPS)
    assert len(d["wall_times"]) == len(fx.TRAIN_STEPS)
    tags = (
        [t for t, v in VARS.items() if v.stats and not v.special]
        if tag in (None, "_model")
        else [tag]
    )
    n = fx.BATCH
    for i, step in enumerate(fx.TRAIN_STEPS):
        r = _ref_sums("train", tags, step)
        v = {k: num(d["values"][k][i]) for k in d["values"]}
        unbiased = r["m2"] - r["tr"] / n
        loss = fx.loss_at(step)
        want = {
            "batch_size": n,
            "total_variance": r["tr"],
            "grad_norm_sq": r["m2"],
            "grad_norm_sq_unbiased": unbiased,
            "noise_scale": r["tr"] / unbiased,
            "gsnr_mean": r["gsnr"] / r["count"],
            "norm_test": math.sqrt(r["tr"] / (n * r["m2"])),
            "eb_criterion": 1 - n / r["d"] * r["gsnr"],
            # sum(M2 - M1**2) is the biased total variance.
            "cabs_batch_size": fx.LEARNING_RATE * (r["raw"] - r["m2"]) / loss,
            "loss": loss,
            "learning_rate": fx.LEARNING_RATE,
        }
        for k, w in want.items():
            # stats tensors are float32: ~1e-7 relative per sum, ~1e-6 after the derivations.
            assert v[k] == pytest.approx(w, rel=2e-5), (k, step)


def test_series_ema_and_bad_ema(env):
    client, _ = env
    d = get_json(client, "series", run="train", ema=0.9)
    tv = nums(d["values"]["total_variance"])
    gu = nums(d["values"]["grad_norm_sq_unbiased"])
    # Bias-corrected EMAs of numerator and denominator, by hand.
    num_ema = den_ema = w = 0.0
    want = []
    for a, b in zip(tv, gu):
        num_ema, den_ema, w = 0.9 * num_ema + 0.1 * a, 0.9 * den_ema + 0.1 * b, 0.9 * w + 0.1
        want.append((num_ema / w) / (den_ema / w))
    np.testing.assert_allclose(nums(d["values"]["noise_scale_ema"]), want, rtol=1e-6)
    assert "noise_scale_ema" not in get_json(client, "series", run="train")["values"]
    r = get(client, "series", 400, run="train", ema=1)
    assert "`ema`" in r.get_data(as_text=True)


def test_series_smoothing_and_statistics(env):
    client, _ = env
    d = get_json(client, "series", run="train", smoothing=0.6)
    assert d["smoothing"] == 0.6
    tv = nums(d["values"]["total_variance"])
    gu = nums(d["values"]["grad_norm_sq_unbiased"])
    m2 = nums(d["values"]["grad_norm_sq"])
    loss = nums(d["values"]["loss"])
    # Adam-style bias-corrected EMAs of each part, by hand, then the ratios.
    acc = {"tv": 0.0, "gu": 0.0, "m2": 0.0, "loss": 0.0}
    want = {"noise_scale": [], "total_variance": [], "loss": []}
    for t, parts in enumerate(zip(tv, gu, m2, loss, strict=True), start=1):
        for k, x in zip(acc, parts, strict=True):
            acc[k] = 0.6 * acc[k] + 0.4 * x
        c = 1 - 0.6**t
        want["noise_scale"].append((acc["tv"] / c) / (acc["gu"] / c))
        want["total_variance"].append(acc["tv"] / c)
        want["loss"].append(acc["loss"] / c)
    for k, w in want.items():
        np.testing.assert_allclose(nums(d["smoothed"][k]), w, rtol=1e-6, err_msg=k)
    assert set(d["smoothed"]) >= set(stats.STATISTICS)
    # What each statistic is, from stats.STATISTICS (the tab shows these).
    assert d["statistics"]["noise_scale"]["formula"] == stats.STATISTICS["noise_scale"].formula
    assert "examples" in d["statistics"]["noise_scale"]["unit"]
    assert "smoothed" not in get_json(client, "series", run="train")
    r = get(client, "series", 400, run="train", smoothing=1)
    assert "`smoothing`" in r.get_data(as_text=True)


# ------------------------------------------------------------------------------ /summary


def test_summary_rows(env):
    client, _ = env
    d = get_json(client, "summary", run="train")
    rows = {r["tag"]: r for r in d["rows"]}
    assert set(rows) == set(VARS)
    r = rows["conv/kernel"]
    ref = _ref_sums("train", ["conv/kernel"], fx.TRAIN_STEPS[-1])
    assert r["size"] == 72 and r["step"] == fx.TRAIN_STEPS[-1] and r["batch_size"] == fx.BATCH
    assert r["total_variance"] == pytest.approx(ref["tr"], rel=1e-5)
    assert r["gsnr_mean"] == pytest.approx(ref["gsnr"] / ref["count"], rel=1e-5)
    assert r["noise_scale"] == pytest.approx(
        ref["tr"] / (ref["m2"] - ref["tr"] / fx.BATCH), rel=2e-5
    )
    assert rows["nostats/kernel"]["total_variance"] is None
    assert rows["nonfinite/kernel"]["total_variance"] == "NaN"
    assert d["model"]["tag"] == "_model" and d["model"]["step"] == fx.TRAIN_STEPS[-1]
    at10 = {r["tag"]: r for r in get_json(client, "summary", run="train", step=10)["rows"]}
    ref10 = _ref_sums("train", ["conv/kernel"], 10)
    assert at10["conv/kernel"]["total_variance"] == pytest.approx(ref10["tr"], rel=1e-5)


def _window_se(a, b, beta):
    """The standard error of the smoothed ratio at the last step, from explicit EMA weights
    (docs/math.md, "Uncertainty of the smoothed statistics")."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    w = (1 - beta) * beta ** np.arange(a.size)[::-1]
    w = w / w.sum()
    r = (w @ a) / (w @ b)
    return math.sqrt((w**2 @ (a - r * b) ** 2) / ((w @ b) ** 2 * (1 - w @ w)))


def test_series_smoothed_se_is_the_window_standard_error(env):
    client, _ = env
    d = get_json(client, "series", run="train", smoothing=0.6)
    tv = nums(d["values"]["total_variance"])
    gu = nums(d["values"]["grad_norm_sq_unbiased"])
    se = nums(d["smoothed_se"]["noise_scale"])
    assert set(d["smoothed_se"]) == set(stats.STATISTICS)
    assert math.isnan(se[0])
    for k in range(1, len(tv)):
        assert se[k] == pytest.approx(_window_se(tv[: k + 1], gu[: k + 1], 0.6), rel=1e-6)
    tv_se = nums(d["smoothed_se"]["total_variance"])
    assert tv_se[-1] == pytest.approx(_window_se(tv, np.ones_like(tv), 0.6), rel=1e-6)


def test_summary_with_smoothing_is_the_curves_value_at_that_step(env):
    client, _ = env
    series = get_json(client, "series", run="train", tag="conv/kernel", smoothing=0.6)
    d = get_json(client, "summary", run="train", step=series["steps"][-2], smoothing=0.6)
    assert d["smoothing"] == 0.6
    row = {r["tag"]: r for r in d["rows"]}["conv/kernel"]
    for k in stats.STATISTICS:
        want = num(series["smoothed"][k][-2])
        assert num(row["smoothed"][k]) == pytest.approx(want, rel=1e-7, nan_ok=True), k
        want_se = num(series["smoothed_se"][k][-2])
        assert num(row["smoothed_se"][k]) == pytest.approx(want_se, rel=1e-7, nan_ok=True), k
        # The per-step values stay where they were.
        assert num(row[k]) == pytest.approx(num(series["values"][k][-2]), rel=1e-7, nan_ok=True)
    assert {r["tag"]: r for r in d["rows"]}["nostats/kernel"]["smoothed"] is None
    assert "smoothed" not in get_json(client, "summary", run="train")["rows"][0]


# --------------------------------------------------------------------------------- /meta


def test_meta_is_views_meta_and_needs_no_data(env, tmp_path):
    client, _ = env
    r = get(client, "meta")
    d = get_json(client, "meta")
    assert d == views.meta()
    # What the tab reads from it: one source for the labels, orders, palettes and defaults.
    assert [s["key"] for s in d["element_statistics"]] == list(reductions.STATS)
    for s in d["element_statistics"]:
        assert s["label"] == reductions.STAT_LABELS[s["key"]]
        assert tuple(s["orders"]) == reductions.required_orders(s["key"])
        assert s["needs_batch_size"] == (s["key"] in reductions.NEEDS_BATCH_SIZE)
        assert s["signed"] == (s["key"] in d["signed_stats"])
    assert set(d["signed_stats"]) <= set(reductions.STATS)
    # The statistics in display order, as /series and /summary explain them.
    assert list(d["statistics"]) == list(stats.STATISTICS) == d["summary_statistics"]
    series = get_json(client, "series", run="train")
    assert d["statistics"] == series["statistics"]
    assert list(series["values"]) == d["series_keys"] == list(_payloads.SERIES_KEYS)
    assert set(d["series_names"]) == set(d["series_keys"]) - set(stats.STATISTICS)
    assert set(d["positive_only"]) | set(d["curve_defaults"]) <= set(stats.STATISTICS)
    assert d["default_smoothing"] == stats.DEFAULT_SMOOTHING
    assert len(d["run_palette"]["light"]) == len(d["run_palette"]["dark"]) >= 7
    assert d["landing"]["stat"] in reductions.STATS
    assert d["landing"]["curve"] in d["series_keys"]
    assert d["landing"]["sort"] in d["summary_statistics"]
    assert (d["scales"], d["max_bins"]) == (list(reductions.SCALES), reductions.MAX_BINS)
    # No experiment data: the same payload from a TensorBoard over an empty log directory.
    empty, _, _ = make_app(str(tmp_path))
    assert get(empty, "meta").get_data() == r.get_data()


# ------------------------------------------------------------------------------- /export


def _csv(r):
    return list(csv.reader(io.StringIO(r.get_data(as_text=True))))


def test_export_moments_npy_is_the_stored_tensor(env):
    client, _ = env
    r = get(client, "export", run="train", tag="skew/kernel", step=30, what="moments", format="npy")
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert (
        'filename="gradmom-train-skew_kernel-moments-step30.npy"'
        in r.headers["Content-Disposition"]
    )
    got = np.load(io.BytesIO(r.get_data()), allow_pickle=False)
    var = VARS["skew/kernel"]
    want = fx.stored_moments(var, fx.var_moments("train", var, 30, fx.BATCH))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_export_moments_csv_and_json(env):
    client, _ = env
    rows = _csv(
        get(
            client,
            "export",
            run="train",
            tag="nonfinite/kernel",
            step=0,
            what="moments",
            format="csv",
        )
    )
    assert rows[0] == ["index", "m1", "m2"] and len(rows) == 13
    var = VARS["nonfinite/kernel"]
    want = fx.stored_moments(var, fx.var_moments("train", var, 0, fx.BATCH))
    got = np.asarray([[float(x) for x in row[1:]] for row in rows[1:]], dtype=np.float32)
    # 9 significant digits read back to the same float32; "NaN", "Infinity" read back too.
    np.testing.assert_array_equal(got.T, want.reshape(2, -1))
    assert rows[1][1] == "NaN"
    d = get_json(
        client, "export", run="train", tag="nonfinite/kernel", step=0, what="moments", format="json"
    )
    assert d["orders"] == [1, 2] and d["moments"]["2"][1] == "Infinity"


def test_export_heatmap_formats_agree(env):
    client, _ = env
    q = {"run": "train", "tag": "conv/kernel", "step": 10, "stat": "std", "what": "heatmap"}
    grid = np.load(io.BytesIO(get(client, "export", format="npy", **q).get_data()))
    assert grid.shape == (18, 4)  # full resolution by default
    rows = _csv(get(client, "export", format="csv", **q))
    assert rows[0] == ["row", "0", "1", "2", "3"]
    np.testing.assert_allclose(np.asarray(rows[1:], dtype=float)[:, 1:], grid, rtol=1e-8)
    d = get_json(client, "export", format="json", **q)
    np.testing.assert_allclose(nums(d["values"]).reshape(18, 4), grid, rtol=1e-8)
    ref = ref_2d(ref_stat(fx.samples("train", "conv/kernel", 10, (3, 3, 2, 4)), "std"))
    np.testing.assert_allclose(grid, ref, rtol=2e-6)


def test_export_histogram_and_series_csv(env):
    client, _ = env
    rows = _csv(
        get(
            client,
            "export",
            run="train",
            tag="dense/kernel",
            step="all",
            bins=4,
            what="histogram",
            format="csv",
        )
    )
    assert rows[0] == ["step", "wall_time", "bin_lo", "bin_hi", "count"]
    assert len(rows) == 1 + 4 * len(fx.TRAIN_STEPS)
    d = get_json(client, "histogram", run="train", tag="dense/kernel", step="all", bins=4)
    assert [int(r[4]) for r in rows[1:5]] == d["series"][0]["counts"]
    rows = _csv(get(client, "export", run="train", what="series", format="csv"))
    assert rows[0][:3] == ["step", "wall_time", "batch_size"] and len(rows) == 7
    series = get_json(client, "series", run="train")
    col = rows[0].index("noise_scale")
    np.testing.assert_allclose(
        [float(r[col]) for r in rows[1:]], nums(series["values"]["noise_scale"]), rtol=1e-8
    )


def test_export_file_name_is_safe(env, logdir):
    if not logdir[1]["xss_run"]:
        pytest.skip("the file system refused the run name")
    client, _ = env
    r = get(client, "export", run=fx.XSS_RUN, tag="dense/kernel", what="moments", format="csv")
    cd = r.headers["Content-Disposition"]
    name = encode.file_name(["gradmom", fx.XSS_RUN, "dense/kernel", "moments"], "x")[:-2]
    assert cd.startswith(f'attachment; filename="{name}-step'), cd
    assert name.startswith("gradmom-img_src_x_onerror_alert_1"), name
    assert "<" not in cd and ">" not in cd and "(" not in cd


# -------------------------------------------------------------------------------- errors

ERROR_CASES = [
    # id, route, params, status, message fragment
    ("heatmap-no-run", "heatmap", {"tag": "dense/kernel"}, 400, "`run`"),
    ("heatmap-no-tag", "heatmap", {"run": "train"}, 400, "`tag`"),
    (
        "heatmap-bad-stat",
        "heatmap",
        {"run": "train", "tag": "dense/kernel", "stat": "x"},
        400,
        "`stat`",
    ),
    (
        "heatmap-bad-step",
        "heatmap",
        {"run": "train", "tag": "dense/kernel", "step": "abc"},
        400,
        "`step`",
    ),
    (
        "heatmap-rows-0",
        "heatmap",
        {"run": "train", "tag": "dense/kernel", "max_rows": 0},
        400,
        "`max_rows`",
    ),
    (
        "heatmap-cols-huge",
        "heatmap",
        {"run": "train", "tag": "dense/kernel", "max_cols": 10**9},
        400,
        "`max_cols`",
    ),
    ("heatmap-unknown-run", "heatmap", {"run": "nope", "tag": "dense/kernel"}, 404, "'nope'"),
    ("heatmap-unknown-tag", "heatmap", {"run": "train", "tag": "nope"}, 404, "'nope'"),
    (
        "heatmap-stats-tag",
        "heatmap",
        {"run": "train", "tag": "dense/kernel/_stats"},
        404,
        "stats tag",
    ),
    (
        "heatmap-unknown-step",
        "heatmap",
        {"run": "train", "tag": "dense/kernel", "step": 7},
        404,
        "no step 7",
    ),
    (
        "heatmap-missing-orders",
        "heatmap",
        {"run": "train", "tag": "dense/kernel", "stat": "skewness"},
        400,
        "orders",
    ),
    (
        "heatmap-no-batch-size",
        "heatmap",
        {"run": "train", "tag": "nostats/kernel"},
        400,
        "batch size",
    ),
    (
        "heatmap-mismatched-tensor",
        "heatmap",
        {"run": "eval", "tag": "mismatch/kernel"},
        404,
        "shape [2, 4, 4]",
    ),
    (
        "heatmap-newer-format",
        "heatmap",
        {"run": "eval", "tag": "future/kernel"},
        404,
        "future/kernel",
    ),
    ("heatmap-other-plugin-run", "heatmap", {"run": "train", "tag": "loss"}, 404, "'loss'"),
    (
        "histogram-bad-bins",
        "histogram",
        {"run": "train", "tag": "dense/kernel", "bins": 0},
        400,
        "`bins`",
    ),
    (
        "histogram-too-many-bins",
        "histogram",
        {"run": "train", "tag": "dense/kernel", "bins": 1001},
        400,
        "`bins`",
    ),
    (
        "heatmap-torn-step",
        "heatmap",
        {"run": "truncated", "tag": "dense/kernel", "step": 4},
        404,
        "no step 4",
    ),
    (
        "histogram-bad-scale",
        "histogram",
        {"run": "train", "tag": "dense/kernel", "scale": "cubic"},
        400,
        "`scale`",
    ),
    (
        "histogram-bad-step",
        "histogram",
        {"run": "train", "tag": "dense/kernel", "step": "1.5"},
        400,
        "`step`",
    ),
    ("series-no-run", "series", {}, 400, "`run`"),
    ("series-unknown-run", "series", {"run": "nope"}, 404, "'nope'"),
    ("series-no-stats", "series", {"run": "train", "tag": "nostats/kernel"}, 404, "stats"),
    ("series-no-model", "series", {"run": "eval"}, 404, "_model"),
    ("summary-unknown-step", "summary", {"run": "train", "step": 7}, 404, "step 7"),
    ("export-no-what", "export", {"run": "train", "tag": "dense/kernel"}, 400, "`what`"),
    (
        "export-npy-series",
        "export",
        {"run": "train", "what": "series", "format": "npy"},
        400,
        "npy",
    ),
    (
        "export-bad-format",
        "export",
        {"run": "train", "what": "series", "format": "xls"},
        400,
        "`format`",
    ),
    ("export-no-tag", "export", {"run": "train", "what": "heatmap"}, 400, "`tag`"),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors(env, case):
    client, _ = env
    _, route, params, status, fragment = case
    r = get(client, route, status, **params)
    assert fragment in r.get_data(as_text=True)


ODD_VALUES = [
    "",
    " ",
    "-1",
    "0",
    "9" * 30,
    "1e3",
    "nan",
    "inf",
    "all",
    "latest",
    "\u00e9\u4e2d",
    "a\x00b",
    "../../etc/passwd",
    "%00",
    "<script>",
    "_model",
    "dense/kernel/_stats",
]


@pytest.mark.parametrize("route", ["tags", "heatmap", "histogram", "series", "summary", "export"])
def test_no_parameter_value_gives_a_server_error(env, route):
    client, _ = env
    base = {"run": "train", "tag": "dense/kernel", "what": "heatmap"}
    for name in [
        "run",
        "tag",
        "step",
        "stat",
        "max_rows",
        "max_cols",
        "bins",
        "scale",
        "what",
        "format",
        "ema",
    ]:
        for value in ODD_VALUES:
            r = client.get(P + route, query_string=base | {name: value})
            assert r.status_code in (200, 400, 404), (route, name, value, r.status_code)


def test_unexpected_failure_is_logged_and_answered_404(env, monkeypatch):
    client, plugin = env

    def boom(*a, **k):
        raise RuntimeError("simulated provider failure")

    monkeypatch.setattr(plugin._reader, "index", boom)
    r = get(client, "tags", 404)
    assert "RuntimeError: simulated provider failure" in r.get_data(as_text=True)


# -------------------------------------------------------------------------------- static


def test_static_index_js_and_mime(env):
    client, _ = env
    r = client.get(P + "index.js")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/javascript")
    root = _static.frontend_dir()
    with open(os.path.join(root, "index.js"), "rb") as f:
        assert r.get_data() == f.read()


@pytest.mark.parametrize(
    "path",
    [
        "../plugin_loader.py",
        "..%2F..%2Fsetup.py",
        "%2e%2e/setup.py",
        "views/../index.js",
        "__init__.py",
        ".hidden.js",
        "nope.js",
        "index.js%00.css",
        "x\\..\\index.js",
        "",
    ],
)
def test_static_rejects_unsafe_paths(env, path):
    client, _ = env
    assert client.get(P + path).status_code == 404


def test_static_resolve(tmp_path):
    root = tmp_path / "front"
    (root / "views").mkdir(parents=True)
    for name in ["a.js", "b.css", "c.svg", "d.json", "a.js.map", "views/e.mjs", "f.py"]:
        (root / name).write_text("x")
    (tmp_path / "secret.js").write_text("s")
    os.symlink(tmp_path / "secret.js", root / "link.js")
    r = str(root.resolve())
    assert _static.resolve(r, "a.js")[1] == "text/javascript"
    assert _static.resolve(r, "views/e.mjs")[1] == "text/javascript"
    assert _static.resolve(r, "b.css")[1] == "text/css"
    assert _static.resolve(r, "c.svg")[1] == "image/svg+xml"
    assert _static.resolve(r, "d.json")[1] == "application/json"
    assert _static.resolve(r, "a.js.map")[1] == "application/json"
    for bad in ["f.py", "link.js", "../secret.js", "views/../a.js", "/a.js", "views", "a.js/"]:
        assert _static.resolve(r, bad) is None, bad


# --------------------------------------------------------------------- caching & encoding


def test_cache_budget_bounds_memory(logdir):
    client, plugin, _ = make_app(logdir[0], "--gradmom_cache_mb=1")
    budget = plugin._cache.budget_bytes
    assert budget == 1 << 20
    for step in fx.TRAIN_STEPS:
        for stat in reductions.STATS[:6]:
            get_json(client, "heatmap", run="train", tag="big/kernel", step=step, stat=stat)
            assert plugin._cache.size_bytes <= budget


def test_warm_heatmap_is_served_from_cache(env):
    client, plugin = env
    q = {"run": "train", "tag": "conv1d/kernel", "step": 30, "stat": "snr"}
    first = get(client, "heatmap", **q).get_data()
    hits = plugin._cache.hits
    assert get(client, "heatmap", **q).get_data() == first
    assert plugin._cache.hits > hits


def test_byte_lru():
    c = _cache.ByteLRU(300)
    c.put("a", b"", size=100)
    c.put("b", b"", size=100)
    c.put("c", b"", size=100)
    assert c.get("a") == b""  # a is now the most recent
    c.put("d", b"", size=100)  # evicts b, the least recently used
    assert c.get("b") is None and c.get("a") == b"" and c.get("d") == b""
    assert c.size_bytes == 300
    c.put("big", b"", size=301)  # bigger than the budget: not kept, nothing evicted
    assert c.get("big") is None and len(c) == 3


def test_byte_lru_loads_once_under_concurrency():
    c = _cache.ByteLRU(1 << 20)
    calls = []
    start = threading.Barrier(16)

    def load():
        calls.append(1)
        threading.Event().wait(0.05)
        return "v"

    results = []

    def worker():
        start.wait()
        results.append(c.get_or_load("k", load))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["v"] * 16 and len(calls) == 1


def test_json_encoding():
    text = encode.to_json(
        {
            "a": np.array([1.5, np.nan, np.inf, -np.inf]),
            "b": math.nan,
            "c": [1, None, "x"],
            "d": np.array([1, 2], dtype=np.int64),
            "w": 1795214310.563185,
        }
    )
    d = json.loads(text, parse_constant=_no_bare_constants)
    assert d == {
        "a": [1.5, "NaN", "Infinity", "-Infinity"],
        "b": "NaN",
        "c": [1, None, "x"],
        "d": [1, 2],
        "w": 1795214310.563185,
    }
    f32 = np.float32(0.1)
    assert np.float32(json.loads(encode.to_json(np.array([f32], dtype=np.float32)))[0]) == f32


def test_stats_table_split_equals_stats_split_stats_tensor(env):
    _, plugin = env
    ctx = context.RequestContext()
    ri = plugin._reader.run_index(ctx, "", "train")
    entry = ri.stats["conv/kernel/_stats"]
    s = plugin._reader.stats_for(ctx, "", entry)
    var = VARS["conv/kernel"]
    for i, step in enumerate(fx.TRAIN_STEPS):
        m = fx.var_moments("train", var, step, fx.BATCH)
        row = fx.stats_values(m[1], m[2], fx.BATCH, fx.loss_at(step), fx.LEARNING_RATE)
        sums, counts = stats.split_stats_tensor(row.astype(np.float32))
        for f in metadata.STATS_FIELDS:
            assert s.sums[f][i] == pytest.approx(sums[f], rel=1e-7, nan_ok=True)
        np.testing.assert_array_equal(s.hist_counts[i], counts)


# ----------------------------------------------------------------------------- groups

_GAN_SCRIPT = """
import pathlib, sys, warnings
sys.path.insert(0, sys.argv[1])
from test_summary import _gan
warnings.simplefilter("ignore")
root = pathlib.Path(sys.argv[2])
_gan(root / "default")
_gan(root / "named", names=("discriminator", "generator"))
"""


def write_gan_logdir(path) -> None:
    """Two GAN-style runs (two `summary.moments` calls per step on one writer, steps 0-2):
    ``default`` without ``name=`` (groups ``""`` and ``moments_1``) and ``named``
    (``discriminator``, ``generator``), written by tests/test_summary.py's ``_gan``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    subprocess.run(
        [sys.executable, "-c", _GAN_SCRIPT, HERE, str(path)],
        check=True,
        env=env,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def gan_env(tmp_path_factory):
    d = tmp_path_factory.mktemp("gan_logdir")
    write_gan_logdir(d)
    from tb_gradmom.analysis import data

    client, plugin, _ = make_app(str(d))
    return client, data.load(str(d))


def test_groups_are_listed_and_served_apart(gan_env):
    """Each `summary.moments` call is a group: /tags lists each run's groups (whole-model tag
    and steps) and each variable's group; /summary?group= gives that group's variables and its
    whole-model row only; /series serves each group's whole-model tag."""
    client, loaded = gan_env
    tags = get_json(client, "tags")
    groups = tags["groups"]
    assert set(groups) == {"default", "named"}
    assert {g: v["tag"] for g, v in groups["default"].items()} == {
        "": "_model",
        "moments_1": "moments_1/_model",
    }
    assert {g: v["tag"] for g, v in groups["named"].items()} == {
        "discriminator": "discriminator/_model",
        "generator": "generator/_model",
    }
    assert all(v["steps"] == [0, 1, 2] for r in groups.values() for v in r.values())
    # The unnamed group is also the old `model` entry; a run without `_model` has none.
    assert tags["model"] == {"default": {"steps": [0, 1, 2]}}
    for run, want in (("default", {"", "moments_1"}), ("named", {"discriminator", "generator"})):
        run_tags = tags["runs"][run]
        assert {t["group"] for t in run_tags.values()} == want
        for tag, info in run_tags.items():
            prefix = info["group"] + "/" if info["group"] else ""
            assert tag.startswith(prefix), tag
            if not prefix:
                assert not tag.startswith("moments_1/"), tag
    for run, group in (
        ("default", ""),
        ("default", "moments_1"),
        ("named", "generator"),
        ("named", "discriminator"),
    ):
        s = get_json(client, "summary", run=run, group=group)
        want = {t for t, i in tags["runs"][run].items() if i["group"] == group}
        assert {r["tag"] for r in s["rows"]} == want and want
        model_tag = metadata.model_tag(group)
        assert s["model"]["tag"] == model_tag and s["group"] == group
        # The group's model row is its own call's sums: the sum over its variables' |m|^2.
        rec = loaded[run][model_tag][-1]
        assert s["model"]["grad_norm_sq"] == pytest.approx(rec.stats["sum_m2"])
        assert s["model"]["grad_norm_sq"] == pytest.approx(
            sum(loaded[run][t][-1].stats["sum_m2"] for t in want), rel=1e-5
        )
        series = get_json(client, "series", run=run, tag=model_tag)
        assert series["steps"] == [0, 1, 2]
        got = nums(series["values"]["grad_norm_sq"])
        np.testing.assert_allclose(got, [r.stats["sum_m2"] for r in loaded[run][model_tag]])
    # Without group=, every variable (the old payload); the model row is `_model` if any.
    everything = get_json(client, "summary", run="named")
    assert {r["tag"] for r in everything["rows"]} == set(tags["runs"]["named"])
    assert everything["model"] is None and "group" not in everything
    # The table's column tooltips come from stats.STATISTICS, every statistic in its order.
    assert list(everything["statistics"]) == list(stats.STATISTICS)
    assert everything["statistics"]["gsnr_mean"] == stats.STATISTICS["gsnr_mean"].as_dict()
    # An unknown group names the run's groups.
    r = get(client, "summary", status=404, run="named", group="nope")
    assert "'discriminator', 'generator'" in r.get_data(as_text=True)


# ------------------------------------------- binary form, screen pooling, single flight

_WIRE = {"float32": "<f4", "float64": "<f8", "uint32": "<u4"}


def decode_gmb1(body: bytes):
    """The binary form read as docs/http_api.md lays it out (independently of `_payloads`):
    ``(header without "$arrays", arrays, payload with the arrays in place)``."""
    assert body[:4] == b"GMB1"
    n = int.from_bytes(body[4:8], "little")
    assert (8 + n) % 8 == 0
    head = json.loads(body[8 : 8 + n].decode("utf-8"), parse_constant=_no_bare_constants)
    arrays = []
    for spec in head.pop("$arrays"):
        assert spec["offset"] % 8 == 0
        count = math.prod(spec["shape"])
        a = np.frombuffer(body, _WIRE[spec["dtype"]], count, 8 + n + spec["offset"])
        arrays.append(a.reshape(spec["shape"]))

    def put(v):
        if isinstance(v, dict):
            return (
                arrays[v["$array"]] if set(v) == {"$array"} else {k: put(x) for k, x in v.items()}
            )
        return [put(x) for x in v] if isinstance(v, list) else v

    return head, arrays, put(head)


def get_binary(client, route, **params):
    r = get(client, route, format="binary", **params)
    assert r.headers["Content-Type"] == "application/octet-stream"
    return r.get_data()


@pytest.mark.parametrize("case", HEATMAP_CASES, ids=[c[0] for c in HEATMAP_CASES])
def test_heatmap_binary_form_decodes_to_the_reference(env, logdir, case):
    """/heatmap?format=binary on a real log through TensorBoard's app: float32 values equal to
    numpy's statistic of the per-example gradients, the header equal to the JSON form's."""
    _, run, tag, step, stat, max_rows, max_cols = case
    if run == fx.XSS_RUN and not logdir[1]["xss_run"]:
        pytest.skip("the file system refused the run name")
    client, _ = env
    params = {"run": run, "tag": tag, "stat": stat, "max_rows": max_rows, "max_cols": max_cols}
    if step is not None:
        params["step"] = step
    body = get_binary(client, "heatmap", **params)
    head, arrays, d = decode_gmb1(body)
    as_json = get_json(client, "heatmap", **params)
    assert {k: v for k, v in head.items() if k != "values"} == {
        k: v for k, v in as_json.items() if k != "values"
    }
    assert len(arrays) == 1 and arrays[0].dtype == np.dtype("<f4")
    var = VARS.get(tag, fx.TRAIN_VARS[0])
    n = 1 if run == "n1" else fx.BATCH
    g = fx.samples(run, tag, fx.TRAIN_STEPS[-1] if step is None else step, var.shape, n)
    expected, _ = ref_pool(ref_2d(ref_stat(g, stat)), max_rows, max_cols)
    assert d["values"].shape == expected.shape == (d["rows"], d["cols"])
    np.testing.assert_allclose(d["values"], expected, rtol=RTOL.get(stat, 2e-6), atol=1e-12)
    np.testing.assert_allclose(
        d["values"].ravel(), nums(as_json["values"]), rtol=1.2e-7, atol=0, equal_nan=True
    )
    got = _payloads.from_binary(body)
    np.testing.assert_array_equal(got["values"], d["values"])


def test_binary_form_keeps_nan_and_infinities(env):
    client, _ = env
    q = {"run": "train", "tag": "nonfinite/kernel", "step": 10}
    _, _, d = decode_gmb1(get_binary(client, "heatmap", **q))
    want = nums(get_json(client, "heatmap", **q)["values"])
    assert np.isnan(want).any() and np.isinf(want).any()
    got = d["values"].ravel().astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])


def test_binary_form_sends_float64_where_float32_would_change_a_value():
    for values, dtype in [
        (np.array([1.0, np.nan, np.inf, 0.0]), "float32"),
        (np.array([1.0, 1e39]), "float64"),  # beyond float32's range
        (np.array([1.0, 1e-40]), "float64"),  # below float32's normal range
        (np.array([0, 3, 2**32 - 1], dtype=np.int64), "uint32"),
        (np.array([0, 2**32], dtype=np.int64), "float64"),
    ]:
        _, arrays, d = decode_gmb1(_payloads.to_binary({"a": values, "b": [values], "c": 1.5}))
        assert arrays[0].dtype.name == dtype, values
        np.testing.assert_array_equal(d["a"].astype(np.float64), values.astype(np.float64))
        assert d["c"] == 1.5 and len(d["b"]) == 1
    with pytest.raises(ValueError, match="not a Grad Moments binary payload"):
        _payloads.from_binary(b"{}")


@pytest.mark.parametrize("step", [None, 20, "all"])
def test_histogram_binary_form_equals_the_json_form(env, step):
    client, _ = env
    q = {"run": "train", "tag": "big/kernel", "stat": "variance", "bins": 7, "scale": "log"}
    if step is not None:
        q["step"] = step
    head, arrays, d = decode_gmb1(get_binary(client, "histogram", **q))
    as_json = get_json(client, "histogram", **q)
    assert {k: v for k, v in head.items() if k not in ("edges", "series")} == {
        k: v for k, v in as_json.items() if k not in ("edges", "series")
    }
    assert d["edges"].dtype == np.dtype("<f8")  # the bins' boundaries as computed
    np.testing.assert_allclose(d["edges"], nums(as_json["edges"]), rtol=5e-9)
    assert len(d["series"]) == len(as_json["series"]) >= 1
    for got, want in zip(d["series"], as_json["series"]):
        assert got["counts"].dtype == np.dtype("<u4")
        assert got["counts"].tolist() == want["counts"]
        assert {k: got[k] for k in ("step", "wall_time", "nonfinite")} == {
            k: want[k] for k in ("step", "wall_time", "nonfinite")
        }


def ref_block_means(grid: np.ndarray, br: int, bc: int) -> np.ndarray:
    """NaN-ignoring means of ``br x bc`` blocks (ragged at the bottom and right edges)."""
    rows, cols = -(-grid.shape[0] // br), -(-grid.shape[1] // bc)
    out = np.empty((rows, cols))
    for i in range(rows):
        for j in range(cols):
            block = grid[i * br : (i + 1) * br, j * bc : (j + 1) * bc]
            ok = block[~np.isnan(block)]
            out[i, j] = ok.mean() if ok.size else np.nan
    return out


@pytest.mark.parametrize(
    "tag, max_cells", [("conv/kernel", 20), ("conv/kernel", 7), ("dense/bias", 2), ("scale", 1)]
)
def test_heatmap_max_cells_serves_numpy_block_means(env, tag, max_cells):
    """``max_cells`` pools to at most that many cells; each served cell is the mean of the
    statistic over the block it covers."""
    client, _ = env
    var = VARS[tag]
    _, _, d = decode_gmb1(
        get_binary(client, "heatmap", run="train", tag=tag, step=30, max_cells=max_cells)
    )
    assert d["rows"] * d["cols"] <= max_cells
    grid = ref_2d(ref_stat(fx.samples("train", tag, 30, var.shape), "variance"))
    br, bc = d["block"]
    assert (d["rows"], d["cols"]) == (-(-grid.shape[0] // br), -(-grid.shape[1] // bc))
    assert d["pooled"] is (br * bc > 1)
    np.testing.assert_allclose(d["values"], ref_block_means(grid, br, bc), rtol=2e-6)


def test_screen_limits_keep_the_aspect_and_the_cap():
    for rows, cols, cells in [(1000, 1000, 65536), (18, 4, 20), (1, 5000, 100), (5000, 3, 64)]:
        r, c = _payloads.screen_limits(rows, cols, 4096, 4096, cells)
        br, bc = -(-rows // r), -(-cols // c)
        served = -(-rows // br) * -(-cols // bc)
        assert served <= cells
        # no smaller uniform block fits: the grid is not pooled more than the cap needs
        assert served * 4 > cells or (br == 1 and bc == 1)
    assert _payloads.screen_limits(1000, 1000, 256, 4096, None) == (256, 1000)


def _counting(monkeypatch, module, name, delay=0.3):
    """Counts the calls of ``module.name`` (each made slow, so concurrent requests overlap)."""
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(threading.current_thread().name)
        threading.Event().wait(delay)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _concurrently(client, requests):
    start = threading.Barrier(len(requests))
    out = [None] * len(requests)

    def ask(i, route, params):
        start.wait()
        r = client.get(P + route, query_string=params)
        out[i] = (r.status_code, r.get_data())

    threads = [threading.Thread(target=ask, args=(i, *rq)) for i, rq in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_concurrent_requests_for_one_heatmap_compute_it_once(logdir, monkeypatch, fmt):
    client, plugin, _ = make_app(logdir[0])
    calls = _counting(monkeypatch, _payloads, "heatmap")
    q = {"run": "train", "tag": "conv/kernel", "step": 20, "stat": "snr", "format": fmt}
    out = _concurrently(client, [("heatmap", q)] * 12)
    assert len(calls) == 1
    assert {status for status, _ in out} == {200} and len({body for _, body in out}) == 1
    _concurrently(client, [("heatmap", q)] * 4)  # then from the cache
    assert len(calls) == 1
    other = {**q, "stat": "mean"}
    _concurrently(client, [("heatmap", q), ("heatmap", other)] * 3)
    assert len(calls) == 2  # one more view, computed once


def test_concurrent_histograms_and_exports_compute_once(logdir, monkeypatch):
    client, plugin, _ = make_app(logdir[0])
    binned = _counting(monkeypatch, _payloads, "histograms_streaming")
    one = _counting(monkeypatch, reductions, "histogram", delay=0.0)
    q = {"run": "train", "tag": "big/kernel", "step": "all", "bins": 9, "format": "binary"}
    out = _concurrently(client, [("histogram", q)] * 8)
    assert len(binned) == 1 and len({body for _, body in out}) == 1
    calls = len(one)
    q1 = {"run": "train", "tag": "dense/kernel", "step": 10, "bins": 9}
    out = _concurrently(client, [("histogram", {**q1, "format": "binary"})] * 8)
    assert len(one) == calls + 1 and {s for s, _ in out} == {200}
    tables = _counting(monkeypatch, _payloads, "moments_table")
    x = {"run": "train", "tag": "conv/kernel", "step": 30, "what": "moments", "format": "csv"}
    out = _concurrently(client, [("export", x)] * 8)
    assert len(tables) == 1 and len({body for _, body in out}) == 1
    assert out[0][1].decode().startswith("index,m1,m2")


def test_single_flight_shares_a_result_that_is_not_kept():
    c = _cache.ByteLRU(1 << 20)
    calls = []
    start = threading.Barrier(8)

    def load():
        calls.append(1)
        threading.Event().wait(0.2)
        return b"x" * 1000

    results = []

    def worker():
        start.wait()
        results.append(c.get_or_load("k", load, max_size=10))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [b"x" * 1000] * 8 and c.get("k") is None
    assert c.loads == 1


def test_grid_csv_is_csv_table():
    """The heatmap export's fast CSV writes what `encode.csv_table` writes, cell for cell."""
    rng = np.random.default_rng(3)
    grid = rng.normal(size=(7, 5)) * 10.0 ** rng.integers(-40, 40, size=(7, 5))
    grid[1, 2], grid[2, 0], grid[3, 3], grid[4, 1] = np.nan, np.inf, -np.inf, 3.0
    grid[5] = [0.0, -2.0, 1e15, 1e16, 0.5]
    header = ["row", *[str(j) for j in range(grid.shape[1])]]
    want = encode.csv_table(header, ([i, *r] for i, r in enumerate(grid.tolist())))
    assert _payloads.grid_csv(grid) == want
    assert list(csv.reader(io.StringIO(want)))[2][3] == "NaN"


def test_byte_lru_parts_evict_only_their_own():
    c = _cache.ByteLRU(1000, parts={"results": 0.3})
    assert c.part_budgets == {"results": 300, None: 700}
    c.put("h", b"", size=250, part="results")
    for i in range(20):  # many big values of the default part
        c.put(("step", i), b"", size=200)
    assert c.get("h") == b"" and c.part_size(None) <= 700 and c.size_bytes <= 1000
    c.put("h2", b"", size=100, part="results")  # the results' part evicts its own
    assert c.get("h") is None and c.get("h2") == b"" and c.get(("step", 19)) == b""
    c.put("too-big", b"", size=301, part="results")
    assert c.get("too-big") is None and len(c) == 4 and c.size_bytes == 3 * 200 + 100
