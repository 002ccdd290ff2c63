"""The readers on what live training, several writers and hostile log directories produce.

Issues 30 and 31, the readers' side: the plugin (through TensorBoard's own app and Python
loader, and RustBoard in the slow tests), `data.load` and ``tb-gradmom export``. Every log
directory is made of real event files: written with TensorBoard's protos and TFRecord framing
as TensorFlow's writer makes them (`test_robustness._write`), so this test process never
imports TensorFlow.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tb_gradmom import metadata
from tb_gradmom.plugin import _cache, loader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_robustness as tr  # noqa: E402
from test_plugin import make_app  # noqa: E402

P = "/data/plugin/gradmom/"
OK = tr.OK


class _Logs(logging.Handler):
    """The plugin's warnings while a block runs."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("tb_gradmom").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("tb_gradmom").removeHandler(self)


def _get(client, route, **q):
    r = client.get(P + route, query_string=q)
    return r.status_code, r.get_data(as_text=True)


def _json(client, route, **q):
    status, body = _get(client, route, **q)
    assert status == 200, (route, q, status, body[:500])
    return json.loads(body)


def _good_run(root, run, steps=tr.STEPS, seed=None):
    """A run of `OK` and ``_model`` over ``steps``, its values drawn for ``seed`` (the run)."""
    seed = run if seed is None else seed
    tr._write(
        os.path.join(root, run),
        [*tr.variable_events(seed, OK, steps=steps), *tr.model_events(seed, [OK], steps=steps)],
    )


def _variance(run, tag, step):
    m = tr.moments(run, tag, step)
    m1, m2 = (np.asarray(a, dtype=np.float32).astype(np.float64) for a in (m[1], m[2]))
    return tr.fx.BATCH / (tr.fx.BATCH - 1) * (m2 - m1**2)


# ------------------------------------------------------------------- the plugin's cache


def test_cache_clear_empties_it():
    """`ByteLRU.clear` (the benchmark's cold requests; it was removed and the benchmark broke)."""
    c = _cache.ByteLRU(1 << 20)
    c.put("a", np.zeros(100), group="g")
    c.put("b", b"x" * 100)
    assert len(c) == 2 and c.size_bytes > 0
    c.clear()
    assert len(c) == 0 and c.size_bytes == 0 and c.get("a") is None
    c.put("a2", np.zeros(10), group="g")  # the group forgot "a": nothing to evict
    assert c.get("a2") is not None


# ------------------------------------------------- isolation: a tag TensorBoard cannot list


def _no_tensor_event(tag, content, step=0):
    """A summary value with the plugin's metadata and no tensor (a crafted or foreign event)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=content
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    value = summary_pb2.Summary.Value(tag=tag, metadata=md)
    return event_pb2.Event(
        wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value])
    )


ROUTES = [
    ("heatmap", {"tag": OK}),
    ("heatmap", {"tag": OK, "step": 1, "stat": "snr"}),
    ("histogram", {"tag": OK, "step": "all"}),
    ("histogram", {"tag": OK, "step": 1}),
    ("series", {}),
    ("series", {"tag": OK}),
    ("summary", {}),
    ("export", {"tag": OK, "what": "moments", "format": "json"}),
    ("export", {"tag": OK, "what": "heatmap", "format": "csv"}),
]


def test_a_tag_tensorboard_cannot_list_affects_no_other(tmp_path):
    """A value with metadata and no tensor made TensorBoard's Python loader raise `KeyError`
    from `list_tensors`, and /tags answered 404 for every run (issue 30). Now only that tag is
    left out, on every route, and /tags says which and why."""
    root = str(tmp_path)
    _good_run(root, "good")
    bad_m = "notensor/kernel"
    bad_s = "lonely/kernel/_stats"
    tr._write(
        os.path.join(root, "bad"),
        [
            *tr.variable_events("bad", OK),
            *tr.model_events("bad", [OK]),
            _no_tensor_event(bad_m, tr.GOOD_M),
            _no_tensor_event(bad_s, tr.GOOD_S),
        ],
    )
    with _Logs() as logs:
        client, _, _ = make_app(root)
        tags = _json(client, "tags")
        for run in ("good", "bad"):
            assert list(tags["runs"][run]) == [OK], run
            assert tags["runs"][run][OK]["steps"] == list(tr.STEPS)
            assert tags["model"][run]["steps"] == list(tr.STEPS)
            for route, q in ROUTES:
                status, body = _get(client, route, run=run, **q)
                assert status == 200, (run, route, q, status, body[:300])
            d = _json(client, "heatmap", run=run, tag=OK)
            assert d["step"] == 2
            np.testing.assert_allclose(
                np.asarray(d["values"], dtype=np.float64).reshape(tr.SHAPE),
                _variance(run, OK, 2),
                rtol=1e-5,
            )
    assert set(tags["skipped"]) == {"bad"}
    assert set(tags["skipped"]["bad"]) == {bad_m, bad_s}
    assert all("KeyError" in r for r in tags["skipped"]["bad"].values())
    for tag in (bad_m, bad_s):
        assert any(
            f"run 'bad' tag {tag!r} step (all)" in m and "KeyError" in m for m in logs.messages
        )
    status, body = _get(client, "heatmap", run="bad", tag=bad_m)
    assert status == 404 and "no moments tag" in body


# ------------------------------------------------------------ torn steps in a live run


def _append(path, events):
    (name,) = [f for f in os.listdir(path) if "tfevents" in f]
    with open(os.path.join(path, name), "ab") as f:
        for e in events:
            f.write(tr._frame(e.SerializeToString()))


def _moments_event(run, tag, step):
    return tr._event(tag, step, tr._proto(tr._stored(tr.moments(run, tag, step))), tr.GOOD_M)


def _stats_events(run, tag, step):
    m = tr.moments(run, tag, step)
    return [
        tr._event(metadata.stats_tag(tag), step, tr._proto(tr._stats(m)), tr.GOOD_S),
        *tr.model_events(run, [tag], steps=(step,)),
    ]


LATEST_ROUTES = [
    ("heatmap", {"stat": "snr"}),
    ("heatmap", {"stat": "std", "max_rows": 2}),
    ("histogram", {"stat": "snr"}),
    ("export", {"what": "heatmap", "stat": "variance", "format": "json"}),
    ("export", {"what": "moments", "format": "json"}),
]


def test_a_step_written_while_a_request_runs_is_not_taken_for_the_latest(tmp_path):
    """A live run: the next step's moments land between the request's listing and its read of
    the latest record. That record's step has no stats yet, and /heatmap answered 400
    ("statistic 'snr' needs the batch size ... step 3 does not have"). Every route now shows the
    step it listed, the latest complete one, with its batch size (issue 30)."""
    root = str(tmp_path)
    run = "live"
    _good_run(root, run)
    client, plugin, _ = make_app(root)
    mux = plugin._reader._mux  # noqa: SLF001 - the multiplexer TensorBoard reloads
    provider = plugin._data_provider  # noqa: SLF001
    listed = provider.list_tensors
    torn = []  # the step whose moments the next listing lets in

    def list_then_write(*args, **kwargs):
        out = listed(*args, **kwargs)
        if torn:
            _append(os.path.join(root, run), [_moments_event(run, OK, torn.pop())])
            mux.Reload()
        return out

    provider.list_tensors = list_then_write
    complete = tr.STEPS[-1]
    for route, q in LATEST_ROUTES:
        torn.append(complete + 1)
        d = _json(client, route, run=run, tag=OK, **q)
        assert not torn  # the moments of the next step came in during the request
        if route == "histogram":
            assert [s["step"] for s in d["series"]] == [complete], route
        else:
            assert d["step"] == complete, (route, q)
            assert d["batch_size"] == tr.fx.BATCH, (route, q)
        if route == "export" and q["what"] == "moments":
            m = tr.moments(run, OK, complete)
            np.testing.assert_array_equal(
                np.asarray(d["moments"]["2"], dtype=np.float32).reshape(tr.SHAPE),
                np.asarray(m[2], dtype=np.float32),
            )
        _append(os.path.join(root, run), _stats_events(run, OK, complete + 1))
        mux.Reload()
        complete += 1
    steps = _json(client, "tags")["runs"][run][OK]["steps"]
    assert steps == list(range(complete + 1))


def _launch(logdir, tmp_path, *flags):
    """A ``tensorboard`` process serving ``logdir`` (the plugin found by its entry point)."""
    import test_plugin_subprocess as tps

    pythonpath = [tps.ROOT]
    if not tps._entry_point_installed():  # noqa: SLF001
        dist = tmp_path / "ep" / "tb_gradmom-0.1.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tb_gradmom\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text(f"[tensorboard_plugins]\n{tps.ENTRY_POINT}\n")
        pythonpath.insert(0, str(tmp_path / "ep"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath), TF_CPP_MIN_LOG_LEVEL="3")
    log = str(tmp_path / f"tensorboard{len(os.listdir(tmp_path))}.log")
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1"]
            + ["--port", "0", *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    deadline = time.time() + 180
    while time.time() < deadline:
        m = re.search(r"(http://127\.0\.0\.1:\d+)/", open(log).read())
        if m:
            return tps.Server(m.group(1), proc, log)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"tensorboard did not start: {open(log).read()[-3000:]}")


def _loaders():
    import test_plugin_subprocess as tps

    rust = pytest.param(
        "true",
        id="rustboard",
        marks=pytest.mark.skipif(bool(tps._data_server_problem()), reason="no data server"),  # noqa: SLF001
    )
    return [pytest.param("false", id="python"), rust]


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", _loaders())
def test_clients_polling_a_run_being_written(tmp_path, load_fast):
    """A real ``tensorboard`` reloading every second while a writer appends steps (each step's
    moments first, its stats a moment later) and clients poll the latest step on every route:
    every answer is 200 and shows a complete step with its batch size."""
    import test_plugin_subprocess as tps

    root = tmp_path / "logs"
    run = "live"
    _good_run(str(root), run)
    server = _launch(str(root), tmp_path, f"--load_fast={load_fast}", "--reload_interval", "1")
    last = 40
    done = threading.Event()
    try:
        deadline = time.time() + 60
        while time.time() < deadline:  # loading is asynchronous
            status, _, body = server.get(P + "tags")
            if status == 200 and OK in json.loads(body)["runs"].get(run, {}):
                break
            time.sleep(0.3)

        def write():
            try:
                for step in range(tr.STEPS[-1] + 1, last + 1):
                    _append(str(root / run), [_moments_event(run, OK, step)])
                    time.sleep(0.08)
                    _append(str(root / run), _stats_events(run, OK, step))
                    time.sleep(0.08)
            finally:
                done.set()

        routes = [
            ("heatmap", {"tag": OK, "stat": "snr"}),
            ("histogram", {"tag": OK, "stat": "std"}),
            ("export", {"tag": OK, "what": "moments", "format": "json"}),
            ("summary", {}),
            ("series", {"tag": OK}),
            ("tags", None),
        ]

        def poll(c):
            seen = []
            i = c
            while not done.is_set():
                route, q = routes[i % len(routes)]
                i += 1
                status, _, body = server.get(P + route, **({} if q is None else {"run": run, **q}))
                seen.append((route, status, body))
            return seen

        writer = threading.Thread(target=write)
        writer.start()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = [a for batch in pool.map(poll, range(4)) for a in batch]
        writer.join()
        bad = [(r, s, b[:200]) for r, s, b in answers if s != 200]
        assert not bad, bad[:5]
        for route, _, body in answers:
            d = json.loads(body)
            if route in ("heatmap", "export"):
                assert d["batch_size"] == tr.fx.BATCH, (route, d["step"])
            elif route == "histogram":
                assert len(d["series"]) == 1 and d["series"][0]["step"] < d["stored_steps"]
            elif route == "summary":
                assert d["rows"][0]["batch_size"] == tr.fx.BATCH
        print(f"\n{load_fast=}: {len(answers)} requests while {last - tr.STEPS[-1]} steps came in")
        deadline = time.time() + 30
        while time.time() < deadline:
            steps = json.loads(server.get(P + "tags")[2])["runs"][run][OK]["steps"]
            if steps[-1] == last:
                break
            time.sleep(0.5)
        assert steps == list(range(last + 1))
        d = server.json(P + "heatmap", run=run, tag=OK)
        assert d["step"] == last and d["batch_size"] == tr.fx.BATCH
    finally:
        done.set()
        tps.stop(server)


# ------------------------------------------------------------------- flags and names


@pytest.mark.parametrize("value", ["0", "-5", "99999999", "1.5", "lots"])
def test_cache_flag_out_of_bounds_stops_tensorboard_with_the_fix(tmp_path, value, capsys):
    """``--gradmom_cache_mb=0`` or ``-5`` silently became 512 and 99999999 was taken
    (issue 31): TensorBoard's own parser now stops with the flag, the value and the fix."""
    with pytest.raises(SystemExit) as stopped:
        make_app(str(tmp_path), f"--gradmom_cache_mb={value}")
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --gradmom_cache_mb" in err and value in err, err
    assert f"pass an integer from 1 to {loader.max_cache_mb()} (MiB)" in err, err


def test_cache_flag_in_bounds_sets_the_budget(tmp_path):
    _good_run(str(tmp_path), "r")
    client, plugin, _ = make_app(str(tmp_path), "--gradmom_cache_mb=64")
    assert plugin._cache.budget_bytes == 64 << 20  # noqa: SLF001
    _, plugin, _ = make_app(str(tmp_path))
    assert plugin._cache.budget_bytes == loader.DEFAULT_CACHE_MB << 20  # noqa: SLF001


def test_cache_flag_set_without_the_parser_is_checked(caplog):
    """Flags set without TensorBoard's parser (``configure(**kwargs)``): the plugin is not
    loaded, and the log says why, instead of a silent default."""
    import argparse

    from tensorboard.plugins import base_plugin

    from tb_gradmom.plugin.plugin import GradMomentsPlugin

    ctx = base_plugin.TBContext(flags=argparse.Namespace(gradmom_cache_mb=-5), data_provider=None)
    with pytest.raises(ValueError, match=r"--gradmom_cache_mb=-5 is out of range"):
        GradMomentsPlugin(ctx)
    with caplog.at_level(logging.ERROR):
        assert loader.GradMomentsPluginLoader().load(ctx) is None
    assert "could not be loaded" in caplog.text and "--gradmom_cache_mb=-5" in caplog.text


def test_a_rejected_long_name_is_named_and_explained(tmp_path, capsys):
    """A layer name over 4,096 characters (``name="x" * 5000``): every reader rejects the
    tag, and the tab listed the run with 0 variables, silently (issue 31). /tags now lists the
    tag as skipped with the reason, and every warning names it readably (start, length, end)."""
    from tb_gradmom import cli
    from tb_gradmom.analysis import data

    root = str(tmp_path / "logs")
    long_tag = "x" * 5000 + "/d/kernel"
    content = tr.mc(layer="x" * 5000 + "/d", variable=long_tag + ":0")
    for run, tags in (("mixed", [OK, long_tag]), ("only", [long_tag])):
        events = []
        for tag in tags:
            if tag == long_tag:
                s_content = tr.sc(variable=long_tag + ":0")
                events += tr.variable_events(run, tag, m_content=content, s_content=s_content)
            else:
                events += tr.variable_events(run, tag)
        tr._write(os.path.join(root, run), events)
    short = data.short_name(long_tag)
    assert (
        short.startswith("'xxx") and "(5,009 characters)" in short and short.endswith("/d/kernel'")
    )
    reason = "`layer` must be a string of at most 4096 characters; the tag is skipped"

    with _Logs() as logs:
        client, _, _ = make_app(root)
        tags = _json(client, "tags")
    assert list(tags["runs"]["mixed"]) == [OK] and tags["runs"]["only"] == {}
    for run in ("mixed", "only"):
        assert tags["skipped"][run][long_tag].endswith(reason), tags["skipped"][run]
        stats_reason = tags["skipped"][run][metadata.stats_tag(long_tag)]
        assert "`variable` must be a string of at most 4096 characters" in stats_reason
    named = [m for m in logs.messages if short in m and reason in m]
    assert named and all(len(m) < 600 for m in logs.messages)

    with pytest.warns(data.DataWarning) as caught:
        runs = data.load(root, run="mixed")
    assert list(runs["mixed"]) == [OK]
    msgs = [str(w.message) for w in caught]
    assert any(short in m and reason in m for m in msgs) and all(len(m) < 800 for m in msgs)
    with (
        pytest.raises(ValueError, match="no Grad Moments data") as e,
        pytest.warns(data.DataWarning),
    ):
        data.load(root, run="only")
    assert short in str(e.value) and "`layer` must be a string" in str(e.value)
    assert len(str(e.value)) < 800

    out = str(tmp_path / "out")
    assert cli.main(["export", "--logdir", root, "--out", out, "--format", "csv"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if short in x]
    assert lines and all(len(x) < 800 for x in lines), err[:2000]


# --------------------------------------------------------- two writers on one run


def _two_writers(root):
    """Run ``two``: two event files with the same steps (writers ``A`` then ``B``), and a
    run ``good`` beside it."""
    _good_run(root, "good")
    path = os.path.join(root, "two")
    for i, who in enumerate("AB"):
        events = [*tr.variable_events(who, OK), *tr.model_events(who, [OK])]
        tr._write(path, events, name=f"events.out.tfevents.170000000{i}.{who}")


def _check_latest_wins(get_json, logs):
    tags = get_json("tags")
    assert tags["runs"]["two"][OK]["steps"] == list(tr.STEPS)
    assert tags["model"]["two"]["steps"] == list(tr.STEPS)
    for step in tr.STEPS:
        d = get_json("heatmap", run="two", tag=OK, step=step)
        np.testing.assert_allclose(
            np.asarray(d["values"], dtype=np.float64).reshape(tr.SHAPE),
            _variance("B", OK, step),
            rtol=1e-5,
        )
    assert get_json("heatmap", run="two", tag=OK)["step"] == tr.STEPS[-1]
    hist = get_json("histogram", run="two", tag=OK, step="all")
    assert [s["step"] for s in hist["series"]] == list(tr.STEPS)
    series = get_json("series", run="two", tag=OK)
    assert series["steps"] == list(tr.STEPS)
    want = [float(tr._stats(tr.moments("B", OK, s))[3]) for s in tr.STEPS]  # sum_var
    np.testing.assert_allclose(series["values"]["total_variance"], want, rtol=1e-6)
    row = get_json("summary", run="two")["rows"][0]
    np.testing.assert_allclose(row["total_variance"], want[-1], rtol=1e-6)
    assert get_json("tags")["runs"]["good"][OK]["steps"] == list(tr.STEPS)
    assert logs is None or any(
        f"run 'two' tag {OK!r}" in m and "3 steps are stored more than once (0, 1, 2)" in m
        for m in logs.messages
    ), logs.messages


def test_two_writers_on_one_run_python_loader(tmp_path):
    """Two processes writing one run: TensorBoard's Python loader keeps both records of every
    step and the tab listed each step twice (issue 31). The plugin keeps the latest record, as
    RustBoard and `data.load` do, and says so once per tag."""
    from tb_gradmom.analysis import data

    root = str(tmp_path)
    _two_writers(root)
    assert metadata.STATS_FIELDS[3] == "sum_var"
    with _Logs() as logs:
        client, plugin, _ = make_app(root)
        assert plugin._reader._mux is not None  # noqa: SLF001
        _check_latest_wins(lambda route, **q: _json(client, route, **q), logs)
    with pytest.warns(data.DataWarning, match=r"3 steps are stored more than once \(0, 1, 2\)"):
        recs = data.load(root, run="two")["two"][OK]
    assert [r.step for r in recs] == list(tr.STEPS)
    for r in recs:
        np.testing.assert_array_equal(r.moments[2], tr._stored(tr.moments("B", OK, r.step))[1])


@pytest.mark.slow
def test_two_writers_on_one_run_rustboard(tmp_path):
    """The same log directory through RustBoard's data server (which keeps one record per step
    itself): the same answers."""
    import test_plugin_subprocess as tps
    from tensorboard import context
    from tensorboard.data import provider, server_ingester
    from tensorboard.util import grpc_util

    problem = tps._data_server_problem()  # noqa: SLF001
    if problem:
        pytest.skip(problem)
    root = str(tmp_path)
    _two_writers(root)
    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        root,
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={"gradmom": 500},
    )
    ingester.start()
    dp = ingester.data_provider
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            got = dp.list_tensors(
                context.RequestContext(),
                experiment_id="",
                plugin_name="gradmom",
                run_tag_filter=provider.RunTagFilter(runs=["two", "good"]),
            )
            if all(got.get(r, {}).get(OK) and got[r][OK].max_step == 2 for r in ("two", "good")):
                break
            time.sleep(0.3)
        client, plugin = tr._app_over(root, dp)  # noqa: SLF001
        assert plugin._reader._stub is not None  # noqa: SLF001
        # RustBoard hands one record per step: nothing for the plugin to warn about.
        _check_latest_wins(lambda route, **q: _json(client, route, **q), None)
    finally:
        stdin = getattr(ingester, "_stdin_handle", None)
        if stdin is not None:
            stdin.close()


# ------------------------------------------------------------ readers that read what is asked

BIG = tr.fx.Var("big/kernel", (100, 500))
BIG_STEPS = range(20)  # 400 KB of moments per step: 8 MB


def _big_logdir(root):
    """Runs ``a`` and ``b``: `OK` (small) and `BIG` (8 MB of moments) over 20 steps."""
    content = metadata.create_summary_metadata(tr.fx.moments_content(BIG)).plugin_data.content
    rng = np.random.default_rng(0)
    for run in ("a", "b"):
        events = tr.variable_events(run, OK, steps=BIG_STEPS)
        for step in BIG_STEPS:
            m1 = rng.normal(size=BIG.shape).astype(np.float32)
            m2 = m1**2 + 1
            events.append(tr._event(BIG.tag, step, tr._proto(np.stack([m1, m2])), content))
            stats = tr.fx.stats_values(m1, m2, tr.fx.BATCH).astype(np.float32)
            events.append(tr._event(metadata.stats_tag(BIG.tag), step, tr._proto(stats), tr.GOOD_S))
        tr._write(os.path.join(root, run), events)


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _same_records(got, want):
    assert [r.step for r in got] == [r.step for r in want]
    for g, w in zip(got, want):
        assert g.batch_size == w.batch_size and list(g.stats) == list(w.stats)
        np.testing.assert_array_equal(list(g.stats.values()), list(w.stats.values()))
        for p in w.moments:
            np.testing.assert_array_equal(g.moments[p], w.moments[p])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_data_load_reads_only_the_runs_and_tags_asked(tmp_path):
    """``data.load(logdir, runs=..., tags=...)`` (issue 31: one tag cost the whole log
    directory): the other runs' files are not opened and the other tags' records are skipped
    after their first bytes. The records are those of a whole load; ``run=`` still works."""
    from tb_gradmom.analysis import data

    root = str(tmp_path)
    _big_logdir(root)
    before = _bytes_read()
    everything = data.load(root)
    whole = _bytes_read() - before
    assert whole > 16e6  # both runs' 8 MB of moments

    before = _bytes_read()
    one = data.load(root, runs=["a"], tags=[OK])
    read = _bytes_read() - before
    assert list(one) == ["a"] and list(one["a"]) == [OK]
    _same_records(one["a"][OK], everything["a"][OK])
    assert read < 1.2e6, read  # the first big record (to know it is a Grad Moments tag)

    by_function = data.load(root, runs=lambda r: r == "b", tags=lambda t: t.startswith("big"))
    assert list(by_function) == ["b"] and list(by_function["b"]) == [BIG.tag]
    _same_records(by_function["b"][BIG.tag], everything["b"][BIG.tag])
    assert list(data.load(root, run="a", tags=[OK])) == ["a"]

    with pytest.raises(
        data.SelectionError, match="no tag .* is selected; tags: 'big/kernel', 'ok/kernel'"
    ):
        data.load(root, tags=["nope"])
    with pytest.raises(ValueError, match="no run 'c' under logdir .*; runs: 'a', 'b'"):
        data.load(root, runs=["a", "c"])
    with pytest.raises(TypeError, match="tags= takes a list of names"):
        data.load(root, tags=OK)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_export_reads_only_the_runs_and_tags_selected(tmp_path, capsys, monkeypatch):
    """``tb-gradmom export --run --tag`` read the whole log directory (issue 31: 198 s for one
    tag of a 4.9 GB log). Now it reads what it exports, and says how far a long read is."""
    from tb_gradmom import cli
    from tb_gradmom.analysis import data

    root = str(tmp_path / "logs")
    _big_logdir(root)
    out = str(tmp_path / "out")
    before = _bytes_read()
    args = ["export", "--logdir", root, "--out", out, "--format", "csv", "--quiet"]
    assert cli.main([*args, "--run", "^a$", "--tag", "^ok"]) == 0
    assert _bytes_read() - before < 1.2e6
    assert sorted(os.listdir(out)) == ["a-ok_kernel-step19-variance.csv"]

    monkeypatch.setattr(data, "PROGRESS_MIN_BYTES", 1)
    assert cli.main([*args[:-1], "--tag", "^big", "--overwrite"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("tb_gradmom: reading event files: ")]
    assert len(lines) == 4 and lines[-1].endswith("s") and "(100%), run 2 of 2" in lines[-1], err
    assert sorted(os.listdir(out)) == [
        "a-big_kernel-step19-variance.csv",
        "a-ok_kernel-step19-variance.csv",
        "b-big_kernel-step19-variance.csv",
    ]
    assert cli.main([*args, "--tag", "nope"]) == 1
    assert "no tag matches --tag 'nope'; tags: big/kernel, ok/kernel" in capsys.readouterr().err


def test_symlinked_runs_are_read_by_the_tab_data_load_and_the_export(tmp_path, capsys):
    """A run directory that is a symbolic link: TensorBoard follows it and the tab showed it,
    while `data.load` and the export left it out silently (issue 31). All three read it now;
    a link back up the tree is not followed (warned), instead of looping."""
    from tb_gradmom import cli
    from tb_gradmom.analysis import data

    root = tmp_path / "logs"
    _good_run(str(root), "real")
    _good_run(str(tmp_path / "elsewhere"), "linked")
    os.symlink(tmp_path / "elsewhere" / "linked", root / "linked")

    client, _, _ = make_app(str(root))
    tags = _json(client, "tags")
    assert sorted(tags["runs"]) == ["linked", "real"]
    d = _json(client, "heatmap", run="linked", tag=OK)
    np.testing.assert_allclose(
        np.asarray(d["values"], dtype=np.float64).reshape(tr.SHAPE),
        _variance("linked", OK, 2),
        rtol=1e-5,
    )

    runs = data.load(str(root))
    assert sorted(runs) == ["linked", "real"]
    np.testing.assert_array_equal(
        runs["linked"][OK][-1].moments[2], tr._stored(tr.moments("linked", OK, 2))[1]
    )
    out = str(tmp_path / "out")
    args = ["export", "--logdir", str(root), "--out", out, "--format", "csv", "--quiet"]
    assert cli.main(args) == 0
    assert sorted(os.listdir(out)) == [
        "linked-ok_kernel-step2-variance.csv",
        "real-ok_kernel-step2-variance.csv",
    ]

    os.symlink(root, root / "real" / "loop")  # a cycle
    with pytest.warns(data.DataWarning, match="a symbolic link to a directory above it"):
        assert sorted(data.load(str(root))) == ["linked", "real"]


# ------------------------------------------ what stops TensorBoard's own Python loader

NON_UTF8 = os.fsdecode(b"caf\xe9")  # a directory name that is not UTF-8 ('caf\udce9')


def _loader_breakers(root):
    """The cases of README's troubleshooting section beside two good runs: a record with a
    valid checksum that is not an Event (``not_event``), a FIFO named like an event file
    (``fifo``), a run directory whose name is not UTF-8, one flipped byte (``flipped``: in the
    moments record of step 1)."""
    for run in ("a_good", "z_good"):
        _good_run(root, run)
    _good_run(root, "not_event")
    path = os.path.join(root, "not_event")
    (name,) = os.listdir(path)
    with open(os.path.join(path, name), "rb") as f:
        blob = f.read()
    records = tr._records(os.path.join(path, name))
    cut = records[3][0]  # before step 1's moments: the bad record, then the rest
    with open(os.path.join(path, name), "wb") as f:
        f.write(blob[:cut] + tr._frame(b"\x0a\xff\xff\xff\xff\x0f" + b"\x01" * 64) + blob[cut:])
    os.makedirs(os.path.join(root, "fifo"))
    os.mkfifo(os.path.join(root, "fifo", "events.out.tfevents.1700000000.fifo"))
    _good_run(root, NON_UTF8, seed="cafe")
    tr._write(os.path.join(root, "flipped"), tr.variable_events("flipped", OK))
    path = os.path.join(root, "flipped")
    (name,) = os.listdir(path)
    tr._damage(os.path.join(path, name), "flipped-data")  # record 3 of 7: step 1's moments


def test_data_load_and_export_survive_what_stops_tensorboards_python_loader(tmp_path, capsys):
    """TensorBoard's Python loader stops serving the other runs for each of these (README,
    "Troubleshooting"; they are TensorBoard's). The plugin's own readers read everything else:
    every good run whole, the run after a bad record on, and a flipped byte costs one record."""
    from tb_gradmom import cli
    from tb_gradmom.analysis import data

    root = str(tmp_path / "logs")
    _loader_breakers(root)
    with pytest.warns(data.DataWarning) as caught:
        runs = data.load(root)
    messages = [str(w.message) for w in caught]
    assert sorted(runs) == sorted(["a_good", "z_good", "not_event", NON_UTF8, "flipped"])
    for run in ("a_good", "z_good", "not_event", NON_UTF8):
        assert [r.step for r in runs[run][OK]] == list(tr.STEPS), run
        assert [r.step for r in runs[run]["_model"]] == list(tr.STEPS), run
        seed = "cafe" if run == NON_UTF8 else run
        np.testing.assert_array_equal(
            runs[run][OK][-1].moments[2], tr._stored(tr.moments(seed, OK, 2))[1]
        )
    assert [r.step for r in runs["flipped"][OK]] == [0, 2]  # only the flipped record is lost
    assert any("a record is not an Event" in m for m in messages)
    assert any("not a regular file; skipped" in m and "fifo" in m for m in messages)
    assert any("fails its checksum" in m and "flipped" in m for m in messages)

    out = str(tmp_path / "out")
    assert cli.main(["export", "--logdir", root, "--out", out, "--format", "csv"]) == 0
    written = sorted(os.listdir(out))
    assert written == sorted(
        f"{r}-ok_kernel-step2-variance.csv"
        for r in ("a_good", "z_good", "not_event", "caf", "flipped")
    )
    err = capsys.readouterr().err
    assert "not a regular file" in err  # (the flipped record is not read: not the latest)


@pytest.mark.slow
def test_rustboard_serves_what_stops_tensorboards_python_loader(tmp_path):
    """The workaround the README gives (``--load_fast=true``): RustBoard serves every run of
    that log directory, and the plugin over it answers as it does for good data."""
    import test_plugin_subprocess as tps

    if tps._data_server_problem():  # noqa: SLF001
        pytest.skip(tps._data_server_problem())  # noqa: SLF001
    root = tmp_path / "logs"
    _loader_breakers(str(root))
    server = _launch(str(root), tmp_path, "--load_fast=true", "--reload_interval", "0")
    try:
        want = {"a_good", "z_good", "not_event", "flipped", "caf\ufffd"}
        deadline = time.time() + 60
        while time.time() < deadline:
            status, _, body = server.get(P + "tags")
            runs = json.loads(body)["runs"] if status == 200 else {}
            if want <= set(runs) and all(
                runs[r].get(OK, {}).get("steps", [-1])[-1] == 2 for r in want - {"not_event"}
            ):
                break
            time.sleep(0.5)
        assert want <= set(runs), sorted(runs)
        for run in ("a_good", "z_good"):
            assert runs[run][OK]["steps"] == list(tr.STEPS)
            d = server.json(P + "heatmap", run=run, tag=OK)
            np.testing.assert_allclose(
                np.asarray(d["values"], dtype=np.float64).reshape(tr.SHAPE),
                _variance(run, OK, 2),
                rtol=1e-5,
            )
        # RustBoard stops reading a file at a record that is not an Event (the steps before it
        # are served); data.load and the export read on.
        assert runs["not_event"][OK]["steps"][0] == 0
        assert runs["flipped"][OK]["steps"][-1] == 2
    finally:
        tps.stop(server)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_data_load_and_export_read_only_the_steps_asked(tmp_path, capsys):
    """``steps="latest"`` (the export's default), a step or a list: the other steps' records
    are skipped after their first bytes (a tag's first record is read for its metadata). The
    latest is the latest complete step, as a whole load shows it (a torn last step is not)."""
    from tb_gradmom import cli
    from tb_gradmom.analysis import data

    root = str(tmp_path / "logs")
    _big_logdir(root)
    torn = np.zeros((2, *BIG.shape), np.float32)
    content = metadata.create_summary_metadata(tr.fx.moments_content(BIG)).plugin_data.content
    _append(os.path.join(root, "a"), [tr._event(BIG.tag, 20, tr._proto(torn), content)])
    with pytest.warns(data.DataWarning, match="step 20: has its moments but no"):
        everything = data.load(root)

    before = _bytes_read()
    latest = data.load(root, steps="latest")
    assert _bytes_read() - before < 2.5e6  # per run: a big tag's first and latest records
    for run, tags in everything.items():
        assert list(latest[run]) == list(tags)
        for tag, recs in tags.items():
            _same_records(latest[run][tag], recs[-1:])
    assert latest["a"][BIG.tag][0].step == 19

    before = _bytes_read()
    picked = data.load(root, steps=[3, 5])
    assert _bytes_read() - before < 4e6
    for run, tags in everything.items():
        for tag, recs in tags.items():
            _same_records(picked[run][tag], [r for r in recs if r.step in (3, 5)])
    assert [r.step for r in data.load(root, runs=["b"], steps=7)["b"][OK]] == [7]
    with pytest.raises(
        data.SelectionError, match=r"no Grad Moments record at step 99 .*; steps: 0, 1,"
    ):
        data.load(root, steps=[99])
    with pytest.raises(TypeError, match="steps= takes a step, a list of steps or 'latest'"):
        data.load(root, steps="last")

    out = str(tmp_path / "out")
    args = ["export", "--logdir", root, "--out", out, "--format", "csv", "--quiet"]
    before = _bytes_read()
    assert cli.main([*args, "--tag", "big", "--step", "5"]) == 0
    assert _bytes_read() - before < 4e6
    assert sorted(os.listdir(out)) == [
        "a-big_kernel-step5-variance.csv",
        "b-big_kernel-step5-variance.csv",
    ]
    capsys.readouterr()
    assert cli.main([*args, "--tag", "big", "--step", "99"]) == 1
    err = capsys.readouterr().err
    assert "step 99 was not logged for any matching tag; steps: 0, 1, 2" in err, err


# ------------------------------------- two writers of the real summary writer on one run

# Writes steps 0-3 of a Dense(3 -> 2) layer's moments with `summary.moments` into LOGDIR, for
# each seed given: with WRITERS=one-process, all seeds' writers in this one process (each its
# own `create_file_writer` on LOGDIR, steps interleaved); else one writer (one seed).
_WRITER_SCRIPT = r"""
import sys
import tensorflow as tf, keras
import tb_gradmom as gradmom

logdir, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
jobs = []
for seed in seeds:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")])
    x = tf.random.normal([8, 3], seed=seed)
    y = tf.random.normal([8, 2], seed=seed + 1)
    writer = tf.summary.create_file_writer(logdir)

    def make(model, writer):
        @tf.function
        def step_fn(x, y, step):
            with writer.as_default(step=step):
                loss = tf.reduce_mean(tf.square(model(x) - y))
                gradmom.summary.moments(loss, model.trainable_variables)
        return step_fn

    jobs.append((make(model, writer), x, y, writer))
for step in range(4):
    for fn, x, y, _ in jobs:
        fn(x, y, tf.constant(step, tf.int64))
for *_, writer in jobs:
    writer.flush()
"""
KERNEL = "dense/kernel"


def _write_with(logdir, *seed_groups):
    """Runs `_WRITER_SCRIPT` once per group of seeds, all processes at once."""
    env = dict(os.environ, PYTHONPATH=tr.fx.ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER_SCRIPT, logdir, *map(str, seeds)],
            env=env,
            stderr=subprocess.PIPE,
        )
        for seeds in seed_groups
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-3000:]


def _cut_last_stats(logdir):
    """Cuts the event file read last at its record of ``dense/kernel/_stats`` at step 3 (a
    writer killed there): step 3's latest moments record is then that writer's, its latest
    stats record the other writer's."""
    import struct

    from tensorboard.compat.proto import event_pb2

    names = sorted(n for n in os.listdir(logdir) if "tfevents" in n)
    assert len(names) == 2, names
    path = os.path.join(logdir, names[-1])
    with open(path, "rb") as f:
        raw = f.read()
    offset = 0
    while offset < len(raw):
        (length,) = struct.unpack("<Q", raw[offset : offset + 8])
        event = event_pb2.Event.FromString(raw[offset + 12 : offset + 12 + length])
        if event.step == 3 and any(
            v.tag == metadata.stats_tag(KERNEL) for v in event.summary.value
        ):
            break
        offset += 12 + length + 4
    assert offset < len(raw)
    with open(path, "r+b") as f:
        f.truncate(offset)


def _consistent(moments1, sums, shape=(3, 2)):
    """A step's moments are the ones its stats record was logged with: the exact sums the
    writer computed in float64 from them (sum_m2 = sum of M_1**2) agree with the stored M_1."""
    m1 = np.asarray(moments1, dtype=np.float64).reshape(shape)
    return np.isclose(float((m1**2).sum()), sums["sum_m2"], rtol=1e-5, atol=0)


def _exported_means(logdir, out, capsys) -> tuple[dict[int, np.ndarray], str]:
    """``tb-gradmom export`` of `KERNEL`'s M_1 at every step, as CSV: ``({step: [3, 2]},
    stderr)``."""
    from tb_gradmom import cli

    args = ["export", "--logdir", logdir, "--out", out, "--format", "csv", "--quiet"]
    capsys.readouterr()
    assert cli.main([*args, "--tag", KERNEL, "--stat", "mean", "--step", "all"]) == 0
    err = capsys.readouterr().err
    grids = {}
    for name in os.listdir(out):
        step = int(re.search(r"-step(\d+)-mean\.csv$", name).group(1))
        grid = np.zeros((3, 2))
        with open(os.path.join(out, name), encoding="utf-8") as f:
            for line in f.read().splitlines()[1:]:
                r, c, v = line.split(",")
                grid[int(r), int(c)] = float(v)
        grids[step] = grid
    return grids, err


def _all_steps_histogram_pairs(get_json, recs):
    """The all-steps histogram of `KERNEL`'s M_1 bins, at each step, the moments `data.load`
    paired with that step's statistics."""
    from tb_gradmom.analysis import reductions

    hist = get_json("histogram", run=".", tag=KERNEL, step="all", stat="mean", bins=8)
    steps = [s["step"] for s in hist["series"]]
    by_step = {r.step: r for r in recs}
    assert set(steps) <= set(by_step) and hist["unpaired_steps"] == [], hist["unpaired_steps"]
    grids = [by_step[s].moments[1].astype(np.float64) for s in steps]
    want = reductions.histograms_over_steps(grids, bins=8)[1]
    assert [s["counts"] for s in hist["series"]] == [c.tolist() for c in want]
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("processes", ["one-process", "two-processes"])
def test_two_real_writers_on_one_run_never_mix_moments_and_stats(tmp_path, processes, capsys):
    """Two `summary.moments` writers on one log directory (in one process, or two processes
    at once), the last file cut between a step's moments and stats records (a writer killed):
    `data.load`, the Python loader's tab (each step listed once, as `data.load` has it, and
    the run flagged in /tags) and the export pair each step's moments only with the
    statistics they were logged with (format 3's source fields), and all say that two writers
    wrote the run; before, step 3 paired one writer's moments with the other's statistics,
    and the all-steps histogram binned one writer's moments of step 3."""
    from tb_gradmom.analysis import data

    logdir = str(tmp_path / "log")
    groups = [(1, 2)] if processes == "one-process" else [(1,), (2,)]
    _write_with(logdir, *groups)
    _cut_last_stats(logdir)

    with pytest.warns(data.DataWarning, match=r"holds the records of 2 writers \(sources ") as w:
        recs = data.load(logdir)["."][KERNEL]
    (said,) = [str(x.message) for x in w if "holds the records of" in str(x.message)]
    assert "at 4 steps (0, 1, 2, 3)" in said, said  # the model's stats: step 3 twice too
    assert [r.step for r in recs] == [0, 1, 2, 3]
    for r in recs:
        assert _consistent(r.moments[1], r.stats), r.step
        assert r.stats["source_hi"] * 2**24 + r.stats["source_lo"] > 0

    client, plugin, _ = make_app(logdir)
    assert plugin._reader._mux is not None  # noqa: SLF001
    tags = _json(client, "tags")
    assert tags["runs"]["."][KERNEL]["steps"] == [r.step for r in recs]
    assert tags["writers"]["."]["count"] == 2 and tags["writers"]["."]["message"] == said
    stats = {r.step: r.stats for r in recs}
    for step in range(4):
        d = _json(client, "heatmap", run=".", tag=KERNEL, step=step, stat="mean")
        assert _consistent(d["values"], stats[step]), step
        np.testing.assert_array_equal(
            np.asarray(d["values"], np.float32).ravel(), recs[step].moments[1].ravel()
        )
    steps = _all_steps_histogram_pairs(lambda route, **q: _json(client, route, **q), recs)
    assert steps == [0, 1, 2, 3]

    exported, err = _exported_means(logdir, str(tmp_path / "out"), capsys)
    assert f"tb-gradmom export: warning: {said}" in err, err
    assert sorted(exported) == [0, 1, 2, 3]
    for r in recs:
        np.testing.assert_array_equal(exported[r.step], r.moments[1].astype(np.float64))


@pytest.mark.slow
def test_two_real_writers_on_one_run_rustboard(tmp_path, monkeypatch):
    """The same log (two writers in one process, the last file cut between step 3's two
    records) through RustBoard's data server, which keeps one record per step: read from the
    event files, every step is paired with its own statistics; read from the data server
    alone (the files unavailable), a step whose kept records come from two writers is refused
    with the reason, never shown with the other writer's statistics."""
    import test_plugin_subprocess as tps
    from tensorboard import context
    from tensorboard.data import provider, server_ingester
    from tensorboard.util import grpc_util

    from tb_gradmom.analysis import data
    from tb_gradmom.plugin import _eventfiles

    problem = tps._data_server_problem()  # noqa: SLF001
    if problem:
        pytest.skip(problem)
    logdir = str(tmp_path / "log")
    _write_with(logdir, (1, 2))
    _cut_last_stats(logdir)
    stats = {r.step: r.stats for r in data.load(logdir)["."][KERNEL]}
    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        logdir,
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={"gradmom": 500},
    )
    ingester.start()
    dp = ingester.data_provider
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            got = dp.list_tensors(
                context.RequestContext(),
                experiment_id="",
                plugin_name="gradmom",
                run_tag_filter=provider.RunTagFilter(runs=["."]),
            )
            if got.get(".", {}).get(KERNEL) and got["."][KERNEL].max_step == 3:
                break
            time.sleep(0.3)
        client, plugin = tr._app_over(logdir, dp)  # noqa: SLF001
        assert plugin._reader.files is not None  # noqa: SLF001
        # RustBoard drops a series' steps above a step read again (a restart, to TensorBoard):
        # the steps it lists are the second file's; its step 3 has no stats record.
        listed = _json(client, "tags")["runs"]["."][KERNEL]["steps"]
        assert listed[:3] == [0, 1, 2], listed
        for step in listed:
            d = _json(client, "heatmap", run=".", tag=KERNEL, step=step, stat="mean")
            assert _consistent(d["values"], stats[step]), step
        recs = data.load(logdir)["."][KERNEL]
        get = lambda route, **q: _json(client, route, **q)  # noqa: E731
        assert _all_steps_histogram_pairs(get, recs) == listed
        # RustBoard keeps one record per step: the run's event files say that two writers
        # wrote it, once the plugin has indexed them (in the background).
        deadline = time.time() + 30
        while not _json(client, "tags")["writers"] and time.time() < deadline:
            time.sleep(0.3)
        who = _json(client, "tags")["writers"]["."]
        assert who["count"] == 2 and who["steps"] == [0, 1, 2, 3], who
        monkeypatch.setattr(_eventfiles.StepFiles, "read", lambda self, run, tag, step: [])
        client, plugin = tr._app_over(logdir, dp)  # noqa: SLF001
        refused = []
        for step in listed:
            status, body = _get(client, "heatmap", run=".", tag=KERNEL, step=step, stat="mean")
            if status == 200:
                assert _consistent(json.loads(body)["values"], stats[step]), step
            else:
                assert status == 404 and "two writers or processes wrote this run" in body, body
                refused.append(step)
        # The all-steps histogram leaves out (and names) the steps the one-step route refuses.
        hist = _json(client, "histogram", run=".", tag=KERNEL, step="all", stat="mean")
        assert hist["unpaired_steps"] == refused
        assert [s["step"] for s in hist["series"]] == [s for s in listed if s not in refused]
    finally:
        stdin = getattr(ingester, "_stdin_handle", None)
        if stdin is not None:
            stdin.close()


def test_one_record_read_from_the_event_files(tmp_path):
    """`_eventfiles.StepFiles` (the plugin's reads under RustBoard): a step of a tag is found
    by reading the records' first bytes and read as its one record, equal to what was written;
    steps appended later are found; a record whose bytes changed (checksum) is not served."""
    from tensorboard.util import tensor_util

    from tb_gradmom.plugin import _eventfiles

    root = str(tmp_path)
    _good_run(root, "r", steps=(0, 1))
    files = _eventfiles.StepFiles(root)
    for step in (0, 1):
        (found,) = files.read("r", OK, step)
        assert found.step == step
        np.testing.assert_array_equal(
            tensor_util.make_ndarray(found.proto), tr._stored(tr.moments("r", OK, step))
        )
    assert files.read("r", OK, 2) == [] and files.read("nope", OK, 0) == []
    assert set(files._run("r").where) == {OK}  # noqa: SLF001 - only the tags asked for
    path = os.path.join(root, "r")
    _append(path, [_moments_event("r", OK, 2), *_stats_events("r", OK, 2)])
    (found,) = files.read("r", OK, 2)  # the files grew: indexed again from where they were
    np.testing.assert_array_equal(
        tensor_util.make_ndarray(found.proto), tr._stored(tr.moments("r", OK, 2))
    )
    assert files.reads == 3
    name, offset, length = files._run("r").where[OK][1][0]  # noqa: SLF001
    with open(os.path.join(path, name), "r+b") as f:
        f.seek(offset + 12 + length - 8)  # a byte of the tensor's values
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    assert files.read("r", OK, 1) == []
    assert _eventfiles.StepFiles("gs://bucket/logs").read("r", OK, 0) == []  # not local
