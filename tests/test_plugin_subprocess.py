"""The plugin in a real ``tensorboard`` process (slow but for one listing check), and without
TensorFlow (fast).

The ``tensorboard`` subprocess finds the plugin through the ``tensorboard_plugins`` entry point,
as after ``pip install``. When tb_gradmom is not installed in this environment, the entry
point declared in setup.py is provided by a throw-away ``.dist-info`` directory on the
subprocess's PYTHONPATH (the environment itself is not modified).
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import plugin_logdir as fx  # noqa: E402

ENTRY_POINT = "gradmom = tb_gradmom.plugin.loader:GradMomentsPluginLoader"


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
    return d


# ---------------------------------------------------------------- no TensorFlow needed

_NO_TF_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, os, sys, traceback
    attempts = []

    class BlockTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" or name.startswith("tensorflow."):
                attempts.append([f.filename for f in traceback.extract_stack()])
                raise ImportError("tensorflow is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockTensorFlow())
    import tb_gradmom.plugin.loader as loader_module
    loaded_before_plugin = "tensorflow" in sys.modules
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug.test import EnvironBuilder

    logdir = sys.argv[1]
    m = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gradmom": 500})
    m.AddRunsFromDirectory(logdir)
    m.Reload()  # TensorBoard falls back to its TensorFlow stub
    ctx = base_plugin.TBContext(
        data_provider=data_provider.MultiplexerDataProvider(m, logdir), flags=None)
    plugin = loader_module.GradMomentsPluginLoader().load(ctx)
    apps = plugin.get_plugin_apps()
    statuses = {}
    for route, query in [
        ("/tags", ""), ("/heatmap", "run=train&tag=conv/kernel&stat=snr"),
        ("/histogram", "run=train&tag=big/kernel&step=all&scale=log"),
        ("/series", "run=train"), ("/summary", "run=train"),
        ("/export", "run=train&tag=skew/kernel&what=moments&format=npy"),
        ("/*", ""),
    ]:
        path = "/data/plugin/gradmom" + (route if route != "/*" else "/index.js")
        env = EnvironBuilder(path=path, query_string=query).get_environ()
        context.set_in_environ(env, context.RequestContext())
        captured = {}
        def start_response(status, headers, exc_info=None):
            captured["status"] = status
        b"".join(apps[route](env, start_response))
        statuses[route] = captured["status"]
    ours = [a for a in attempts if any("tb_gradmom" in f for f in a)]
    print(json.dumps({"statuses": statuses, "ours": ours, "attempts": len(attempts),
                      "tf_loaded": "tensorflow" in sys.modules,
                      "loaded_before_plugin": loaded_before_plugin}))
    """
)


def test_plugin_works_without_tensorflow_and_never_imports_it(logdir, tmp_path):
    script = tmp_path / "no_tf.py"
    script.write_text(_NO_TF_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, str(script), logdir], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ours"] == []  # no import of tensorflow started from tb_gradmom code
    assert result["tf_loaded"] is False and result["loaded_before_plugin"] is False
    assert all(s.startswith("200") for s in result["statuses"].values()), result["statuses"]


# ------------------------------------------------------------ a real tensorboard process


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="tensorboard_plugins")
    return any(ep.name == "gradmom" for ep in eps)


def _data_server_problem() -> str | None:
    """Why RustBoard cannot run here, or None."""
    try:
        from tensorboard.data import server_ingester

        binary = server_ingester.get_server_binary()
        subprocess.run([binary.path, "--version"], check=True, capture_output=True, timeout=30)
    except Exception as e:  # noqa: BLE001
        return f"tensorboard-data-server unavailable: {type(e).__name__}: {e}"
    return None


class Server:
    def __init__(self, url: str, proc: subprocess.Popen, log: str):
        self.url, self.proc, self.log = url, proc, log

    def get(self, path: str, **params):
        """(status, headers, body bytes)."""
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        try:
            with urllib.request.urlopen(self.url + path + q, timeout=60) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def json(self, path: str, **params):
        status, _, body = self.get(path, **params)
        assert status == 200, (path, params, status, body[:500])
        return json.loads(body)


def start_tensorboard(logdir: str, tmp_path, *flags: str) -> Server:
    tmp_path.mkdir(parents=True, exist_ok=True)
    pythonpath = [ROOT]
    if not _entry_point_installed():
        dist = tmp_path / "ep" / "tb_gradmom-0.1.0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tb_gradmom\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text(f"[tensorboard_plugins]\n{ENTRY_POINT}\n")
        pythonpath.insert(0, str(tmp_path / "ep"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath), TF_CPP_MIN_LOG_LEVEL="3")
    log = str(tmp_path / f"tensorboard{len(os.listdir(tmp_path))}.log")
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                logdir,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--reload_interval",
                "0",
                *flags,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    deadline = time.time() + 180
    url = None
    while time.time() < deadline and url is None:
        if proc.poll() is not None:
            raise AssertionError(f"tensorboard exited: {open(log).read()[-3000:]}")
        m = re.search(r"(http://127\.0\.0\.1:\d+)/", open(log).read())
        url = m.group(1) if m else None
        time.sleep(0.2)
    if url is None:
        proc.kill()
        raise AssertionError(f"tensorboard did not start: {open(log).read()[-3000:]}")
    server = Server(url, proc, log)
    # Loading is asynchronous: wait until the last step of every run is in.
    last = {"train": fx.TRAIN_STEPS[-1], "long": fx.LONG_STEPS - 1, "truncated": 3, "corrupt": 1}
    tag = {"long": "dense/bias"}
    while time.time() < deadline:
        status, _, body = server.get("/data/plugin/gradmom/tags")
        if status == 200:
            runs = json.loads(body)["runs"]
            steps = {
                r: runs.get(r, {}).get(tag.get(r, "dense/kernel"), {}).get("steps") or [-1]
                for r in last
            }
            if all(steps[r][-1] >= last[r] for r in last):
                return server
        time.sleep(0.5)
    stop(server)
    raise AssertionError(f"data never appeared: {open(log).read()[-3000:]}")


def stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=20)


# The python loader's server is in the quick set for `test_listed_and_frontend_served` (one
# real tensorboard process); every other use, and RustBoard's, is marked slow.
@pytest.fixture(
    scope="module",
    params=[
        pytest.param("false", id="python"),
        pytest.param("true", id="rustboard", marks=pytest.mark.slow),
    ],
)
def server(request, logdir, tmp_path_factory):
    if request.param == "true":
        problem = _data_server_problem()
        if problem:
            pytest.skip(problem)
    s = start_tensorboard(logdir, tmp_path_factory.mktemp("tb"), f"--load_fast={request.param}")
    # RustBoard logs the garbage event file of run `corrupt` as a read error.
    assert ("rustboard" in open(s.log).read()) == (request.param == "true")
    yield s
    stop(s)


def test_listed_and_frontend_served(server):
    listing = server.json("/data/plugins_listing")
    assert listing["gradmom"]["enabled"] is True
    assert listing["gradmom"]["tab_name"] == "Grad Moments"
    status, headers, body = server.get("/data/plugin/gradmom/index.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert body.startswith(b"//") or b"export" in body
    assert server.get("/data/plugin/gradmom/../../../setup.py")[0] == 404


@pytest.mark.slow
def test_routes_serve_the_right_numbers(server):
    tags = server.json("/data/plugin/gradmom/tags")
    # The plugin's default samples_per_plugin (500) applies, not TensorBoard's 10 / 100.
    assert tags["runs"]["long"]["dense/bias"]["steps"] == list(range(fx.LONG_STEPS))
    d = server.json(
        "/data/plugin/gradmom/heatmap", run="train", tag="conv/kernel", step=30, stat="variance"
    )
    g = fx.samples("train", "conv/kernel", 30, (3, 3, 2, 4))
    np.testing.assert_allclose(
        np.asarray(d["values"], dtype=float), g.var(0, ddof=1).reshape(18, 4).ravel(), rtol=2e-6
    )
    h = server.json("/data/plugin/gradmom/histogram", run="train", tag="big/kernel", step="all")
    assert [s["step"] for s in h["series"]] == list(fx.TRAIN_STEPS)
    s = server.json("/data/plugin/gradmom/series", run="train")
    assert s["steps"] == list(fx.TRAIN_STEPS) and len(s["values"]["noise_scale"]) == 6
    assert len(server.json("/data/plugin/gradmom/summary", run="train")["rows"]) == 9
    status, headers, body = server.get(
        "/data/plugin/gradmom/export", run="train", tag="dense/kernel", what="moments", format="npy"
    )
    assert status == 200 and "attachment" in headers["Content-Disposition"]
    nan = server.json("/data/plugin/gradmom/heatmap", run="train", tag="nonfinite/kernel")
    assert nan["values"][:2] == ["NaN", "Infinity"]
    assert (
        server.json("/data/plugin/gradmom/heatmap", run="truncated", tag="dense/kernel")["step"]
        == 3
    )


@pytest.mark.slow
def test_errors_are_400_and_404(server):
    assert server.get("/data/plugin/gradmom/heatmap", tag="x")[0] == 400
    assert (
        server.get("/data/plugin/gradmom/heatmap", run="train", tag="dense/kernel", max_rows="x")[0]
        == 400
    )
    assert server.get("/data/plugin/gradmom/heatmap", run="nope", tag="dense/kernel")[0] == 404
    assert (
        server.get("/data/plugin/gradmom/heatmap", run="train", tag="dense/kernel", step=7)[0]
        == 404
    )
    assert server.get("/data/plugin/gradmom/heatmap", run="eval", tag="mismatch/kernel")[0] == 404


@pytest.mark.slow
def test_twenty_concurrent_clients(server):
    requests = []
    for c in range(20):
        for i in range(10):
            step = fx.TRAIN_STEPS[(c + i) % len(fx.TRAIN_STEPS)]
            requests.append(
                [
                    (
                        "/data/plugin/gradmom/heatmap",
                        {"run": "train", "tag": "big/kernel", "step": step, "stat": "snr"},
                    ),
                    (
                        "/data/plugin/gradmom/histogram",
                        {"run": "train", "tag": "conv/kernel", "step": "all", "bins": 10 + c},
                    ),
                    ("/data/plugin/gradmom/tags", {}),
                    ("/data/plugin/gradmom/series", {"run": "train", "tag": "dense/kernel"}),
                    ("/data/plugin/gradmom/summary", {"run": "train", "step": step}),
                ][(c + i) % 5]
            )

    def client(c):
        return [server.get(path, **params)[0] for path, params in requests[c * 10 : (c + 1) * 10]]

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        statuses = [s for batch in pool.map(client, range(20)) for s in batch]
    assert statuses == [200] * 200


@pytest.mark.slow
def test_user_samples_per_plugin_with_each_loader(logdir, tmp_path):
    for load_fast in ("false", "true"):
        if load_fast == "true" and _data_server_problem():
            continue
        s = start_tensorboard(
            logdir,
            tmp_path / load_fast,
            f"--load_fast={load_fast}",
            "--samples_per_plugin=gradmom=5",
        )
        try:
            steps = s.json("/data/plugin/gradmom/tags")["runs"]["long"]["dense/bias"]["steps"]
        finally:
            stop(s)
        assert len(steps) == 5 and steps[-1] == fx.LONG_STEPS - 1, (load_fast, steps)


# ------------------------------------------- RustBoard's data provider, in this process


@pytest.fixture(scope="module")
def rustboard_provider(logdir):
    """TensorBoard's gRPC data provider over a RustBoard data server on the fixture."""
    problem = _data_server_problem()
    if problem:
        pytest.skip(problem)
    from tensorboard import context
    from tensorboard.data import provider, server_ingester
    from tensorboard.util import grpc_util

    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        logdir,
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={"gradmom": 500},
    )
    ingester.start()
    dp = ingester.data_provider
    ctx = context.RequestContext()
    deadline = time.time() + 120
    while time.time() < deadline:  # loading is asynchronous
        got = dp.list_tensors(
            ctx,
            experiment_id="",
            plugin_name="gradmom",
            run_tag_filter=provider.RunTagFilter(runs=["long", "train"]),
        )
        if (
            got.get("long", {}).get("dense/bias/_stats")
            and got["long"]["dense/bias/_stats"].max_step == fx.LONG_STEPS - 1
            and got.get("train", {}).get("_model/_stats")
            and got["train"]["_model/_stats"].max_step == fx.TRAIN_STEPS[-1]
        ):
            break
        time.sleep(0.5)
    yield dp
    stdin = getattr(ingester, "_stdin_handle", None)  # the server exits when stdin closes
    if stdin is not None:
        stdin.close()


class _Recording:
    """Records ``(tag, downsample, points returned)`` of each read."""

    def __init__(self, inner, reads):
        self._inner, self._reads = inner, reads

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def read_tensors(self, ctx=None, **kw):
        out = self._inner.read_tensors(ctx, **kw)
        for tags in out.values():
            for tag, series in tags.items():
                self._reads.append((tag, kw["downsample"], len(series)))
        return out


def _plugin_over(dp, reads):
    from tensorboard.plugins import base_plugin

    from tb_gradmom.plugin.plugin import GradMomentsPlugin

    return GradMomentsPlugin(base_plugin.TBContext(data_provider=_Recording(dp, reads), flags=None))


@pytest.mark.slow
def test_rustboard_sampled_all_steps_histogram(rustboard_provider, logdir, monkeypatch):
    """Over RustBoard, an all-steps histogram above its read budget is exact for the steps it
    lists (the same numbers as `reductions` on the stored moments of those steps)."""
    from tensorboard import context

    from tb_gradmom.analysis import data, reductions
    from tb_gradmom.plugin import _reader

    monkeypatch.setattr(_reader, "HISTOGRAM_READ_BYTES", 3 * 4 * 2 * 10 * 10)  # 3 steps
    plugin = _plugin_over(rustboard_provider, [])
    ctx = context.RequestContext()
    recs = {r.step: r for r in data.load(logdir)["train"]["big/kernel"]}
    for scale in ("linear", "log"):
        h = plugin.histogram_body(
            ctx, "", run="train", tag="big/kernel", step="all", stat="variance", bins=7, scale=scale
        )
        steps = [s["step"] for s in h["series"]]
        assert h["downsampled"] is True and h["stored_steps"] == len(fx.TRAIN_STEPS)
        assert len(steps) == 3 and steps[-1] == fx.TRAIN_STEPS[-1]
        arrays = [
            reductions.stat_array(recs[s].moments, recs[s].batch_size, "variance") for s in steps
        ]
        edges, counts = reductions.histograms_over_steps(arrays, bins=7, scale=scale)
        np.testing.assert_array_equal(h["edges"], edges)
        assert [s["counts"].tolist() for s in h["series"]] == [c.tolist() for c in counts]


@pytest.mark.slow
def test_rustboard_targeted_reads(rustboard_provider, monkeypatch):
    """Over RustBoard, a step read with a targeted sample is exact, and the sample is mostly
    much smaller than the series."""
    from tensorboard import context

    from tb_gradmom.plugin import _reader

    monkeypatch.setattr(_reader, "TARGETED_READ_MIN_BYTES", 0)
    ctx = context.RequestContext()
    sampled = 0
    for step in (0, 30, 61, 97, 140):
        reads = []
        body = _plugin_over(rustboard_provider, reads).heatmap_impl(
            ctx,
            "",
            run="long",
            tag="dense/bias",
            step=step,
            stat="variance",
            max_rows=9,
            max_cols=9,
        )
        d = json.loads(body)
        g = fx.samples("long", "dense/bias", step, (4,))
        assert d["step"] == step
        np.testing.assert_allclose(np.asarray(d["values"], float), g.var(0, ddof=1), rtol=2e-6)
        (read,) = [r for r in reads if r[0] == "dense/bias"]
        assert read[1] == read[2] or read[1] == _reader.ALL_STEPS
        sampled += read[2] < fx.LONG_STEPS
    assert sampled >= 3  # RustBoard's samples are prefixes of one permutation: mostly small


def _plugin_with_files(dp, logdir):
    """The plugin over RustBoard's own gRPC provider (not wrapped) with ``--logdir``: one step
    is read from the run's event files."""
    from tensorboard.plugins import base_plugin

    from tb_gradmom.plugin.plugin import GradMomentsPlugin

    return GradMomentsPlugin(base_plugin.TBContext(data_provider=dp, flags=None, logdir=logdir))


def _grpc_reads(monkeypatch) -> list:
    """Records the tags of every read the plugin sends to the data server."""
    from tb_gradmom.plugin import _reader, _tb_compat

    reads = []
    real = _tb_compat.grpc_read_tensors

    def recording(stub, experiment_id, plugin_name, run, tags, downsample):
        reads.append((run, tuple(tags), downsample))
        return real(stub, experiment_id, plugin_name, run, tags, downsample)

    monkeypatch.setattr(_reader._tb_compat, "grpc_read_tensors", recording)
    return reads


@pytest.mark.slow
def test_rustboard_one_step_is_read_from_its_event_file(rustboard_provider, logdir, monkeypatch):
    """Over RustBoard with a local --logdir, every step of a series is read as its one record
    of the event file (no gRPC read of the moments tag), with the numbers `data.load` reads
    and the moments the fixture drew (unbiased variance of its per-example gradients)."""
    from tensorboard import context

    from tb_gradmom.analysis import data

    reads = _grpc_reads(monkeypatch)
    plugin = _plugin_with_files(rustboard_provider, logdir)
    ctx = context.RequestContext()
    recs = {r.step: r for r in data.load(logdir, runs=["long"])["long"]["dense/bias"]}
    for step in (0, 1, 30, 97, fx.LONG_STEPS - 2, fx.LONG_STEPS - 1):
        d = json.loads(
            plugin.heatmap_impl(
                ctx,
                "",
                run="long",
                tag="dense/bias",
                step=step,
                stat="mean",
                max_rows=9,
                max_cols=9,
            )
        )
        assert d["step"] == step
        np.testing.assert_array_equal(
            np.asarray(d["values"], np.float32).ravel(), recs[step].moments[1].ravel()
        )
        g = fx.samples("long", "dense/bias", step, (4,))
        np.testing.assert_allclose(np.asarray(d["values"], float).ravel(), g.mean(0), rtol=1e-6)
    assert plugin._reader.files.reads == 6
    assert not [r for r in reads if "dense/bias" in r[1]], reads


@pytest.mark.slow
def test_rustboard_step_the_files_cannot_give_is_read_over_grpc(
    rustboard_provider, logdir, monkeypatch
):
    """A step the files cannot serve (here: every record fails its checksum) is read through
    the data server, with the same numbers; nothing is served from a bad record."""
    from tensorboard import context

    from tb_gradmom.analysis import data
    from tb_gradmom.plugin import _eventfiles

    recs = {r.step: r for r in data.load(logdir, runs=["long"])["long"]["dense/bias"]}
    reads = _grpc_reads(monkeypatch)
    monkeypatch.setattr(_eventfiles.data, "masked_crc32c", lambda b: -1)
    plugin = _plugin_with_files(rustboard_provider, logdir)
    ctx = context.RequestContext()
    d = json.loads(
        plugin.heatmap_impl(
            ctx, "", run="long", tag="dense/bias", step=30, stat="mean", max_rows=9, max_cols=9
        )
    )
    np.testing.assert_array_equal(
        np.asarray(d["values"], np.float32).ravel(), recs[30].moments[1].ravel()
    )
    assert plugin._reader.files.reads == 0
    assert [r for r in reads if "dense/bias" in r[1]]
