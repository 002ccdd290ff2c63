"""The plugin's memory bound: what the cache counts, old versions, shared reads, concurrency.

The bound (docs/http_api.md, "Speed and memory"): the cache holds at most
``--gradmom_cache_mb`` as measured by `_cache.nbytes` (every array, each buffer once); what
requests hold beyond it is reserved on two gates, `plugin.WORK_BUDGET_BYTES` (arrays being
computed, responses being encoded) and `_reader.READ_BUDGET_BYTES` (tensors being read). The
slow test runs 200 concurrent clients against TensorBoard's app in a subprocess and checks the
process's peak resident memory against that bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tb_gradmom import metadata
from tb_gradmom.plugin import _cache, _reader
from tb_gradmom.plugin import plugin as plugin_module

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import test_robustness as tr  # noqa: E402 - its TensorFlow-free event writer
from test_plugin import _recording, make_app  # noqa: E402

P = "/data/plugin/gradmom/"


def _write_run(root, run, tags, steps, shape=(3, 4)):
    """A run written without TensorFlow: moments and stats of ``tags`` at ``steps``."""
    events = []
    for step in steps:
        for tag in tags:
            rng = np.random.default_rng(step)
            m1 = rng.standard_normal(shape).astype(np.float32)
            m = {1: m1, 2: m1 * m1 + rng.random(shape, dtype=np.float32)}
            content = metadata._encode(tr.fx.moments_content(tr.fx.Var(tag, shape)))  # noqa: SLF001
            stats = tr.fx.stats_values(m[1], m[2], tr.fx.BATCH).astype(np.float32)
            events.append(tr._event(tag, step, tr._proto(tr._stored(m)), content))  # noqa: SLF001
            events.append(
                tr._event(metadata.stats_tag(tag), step, tr._proto(stats), tr.GOOD_S)  # noqa: SLF001
            )
    name = f"events.out.tfevents.{1700000000 + steps[0]}.part"
    tr._write(os.path.join(root, run), events, name=name)  # noqa: SLF001


# ----------------------------------------------------------------------- accounting


def test_nbytes_counts_every_array_once():
    rows = [(s, 1.0 * s, np.arange(metadata.STATS_LENGTH, dtype=np.float32)) for s in range(500)]
    series = _reader._stats_series(rows, metadata.StatsContent())  # noqa: SLF001
    table = 500 * metadata.STATS_LENGTH * 8
    # The old estimate counted a stats series as ~56 bytes whatever it held.
    assert table <= _cache.nbytes(series) <= table + 20_000
    stacked = np.zeros((2, 100, 100), np.float32)
    m = _reader.MomentsAt(step=3, wall_time=1.0, arrays={1: stacked[0], 2: stacked[1]})
    assert stacked.nbytes <= _cache.nbytes(m) <= stacked.nbytes + 2_000  # views: base once
    blob = bytes(10_000)
    assert _cache.nbytes(np.frombuffer(blob, np.float32)) >= len(blob)
    assert _cache.nbytes(frozenset(range(1000))) > 1000 * 28
    text = "x" * 100_000
    assert _cache.nbytes({"a": [text, text]}) < 2 * len(text)  # the same string once


def test_cache_counts_what_it_holds_and_keeps_its_budget(tmp_path):
    _write_run(str(tmp_path), "r", ["a/kernel", "b/kernel"], list(range(40)), shape=(64, 64))
    client, plugin, _ = make_app(str(tmp_path), "--gradmom_cache_mb=1")
    cache = plugin._cache  # noqa: SLF001
    for step in range(0, 40, 3):
        for stat in ("variance", "mean", "snr"):
            for tag in ("a/kernel", "b/kernel"):
                q = {"run": "r", "tag": tag, "step": step, "stat": stat}
                assert client.get(P + "heatmap", query_string=q).status_code == 200
                assert cache.size_bytes <= cache.budget_bytes
        assert (
            client.get(
                P + "histogram", query_string={"run": "r", "tag": "a/kernel", "step": "all"}
            ).status_code
            == 200
        )
        assert client.get(P + "tags").status_code == 200
    items = [(value, size) for _, value, size in cache.items()]
    assert items and cache.size_bytes == sum(size for _, size in items) <= cache.budget_bytes
    for value, size in items:
        assert size >= _cache.nbytes(value), type(value)


def test_a_growing_run_keeps_one_version_of_each_series(tmp_path):
    """Polling /tags while a run grows: each new data version replaces the one before."""
    root = str(tmp_path)
    tags = ["a/kernel", "b/kernel"]
    _write_run(root, "live", tags, [0, 1])
    client, plugin, _ = make_app(root)
    cache = plugin._cache  # noqa: SLF001
    mux = plugin._reader._mux  # noqa: SLF001
    for chunk in range(1, 8):
        _write_run(root, "live", tags, [2 * chunk, 2 * chunk + 1])
        mux.Reload()
        for _ in range(2):
            d = json.loads(client.get(P + "tags").get_data())
            assert d["runs"]["live"]["a/kernel"]["steps"] == list(range(2 * chunk + 2))
            for tag in tags:
                q = {"run": "live", "tag": tag, "step": "all", "bins": 5}
                assert client.get(P + "histogram", query_string=q).status_code == 200
                q = {"run": "live", "tag": tag}
                assert client.get(P + "heatmap", query_string=q).status_code == 200
        keys = cache.keys()
        for tag in tags:
            for kind in ("stats", "histogram", "heatmap"):
                want = metadata.stats_tag(tag) if kind == "stats" else tag
                versions = [k for k in keys if k[0] == kind and k[3] == want]
                assert len(versions) == 1, (kind, tag, versions)


def test_concurrent_requests_for_one_series_share_one_read(tmp_path):
    """30 clients asking for 30 different old steps of one series at once: one whole-series
    read serves them all (the old plugin read the series once per client)."""
    _write_run(str(tmp_path), "r", ["a/kernel"], list(range(60)), shape=(16, 16))
    reads = []
    client, plugin, _ = make_app(str(tmp_path), wrap_provider=_recording(reads))
    assert client.get(P + "tags").status_code == 200
    start = threading.Barrier(30)
    results = {}

    def ask(step):
        start.wait()
        r = client.get(P + "heatmap", query_string={"run": "r", "tag": "a/kernel", "step": step})
        results[step] = (r.status_code, json.loads(r.get_data()).get("step"))

    threads = [threading.Thread(target=ask, args=(s,)) for s in range(0, 60, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {s: (200, s) for s in range(0, 60, 2)}
    whole = [r for r in reads if r[0] == "a/kernel" and r[1] == _reader.ALL_STEPS]
    assert 1 <= len(whole) <= 2, (
        whole
    )  # a client that registers after a read starts may wait for a second


def test_memory_gate_bounds_and_serves_first_come_first():
    gate = _cache.MemoryGate(100)
    inside, peak, order = [0], [0], []
    lock = threading.Lock()

    def work(i, size):
        with gate.reserve(size):
            with lock:
                inside[0] += size
                peak[0] = max(peak[0], inside[0])
                order.append(i)
            threading.Event().wait(0.01)
            with lock:
                inside[0] -= size

    threads = [threading.Thread(target=work, args=(i, 30 if i % 5 else 250)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(order) == 40 and gate.used_bytes == 0
    assert peak[0] <= 250  # a reservation above the budget runs alone
    assert gate.peak_bytes <= 250


# ---------------------------------------------------------------- 200 clients at once

_LOAD_SCRIPT = textwrap.dedent(
    """
    import concurrent.futures, json, os, random, sys, threading, time
    sys.path[:0] = [sys.argv[2], os.path.join(sys.argv[2], "tests")]
    from test_plugin import make_app
    from tb_gradmom.plugin import _reader
    from tb_gradmom.plugin import plugin as plugin_module

    def rss(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024

    client, plugin, _ = make_app(sys.argv[1], "--gradmom_cache_mb=16")
    assert client.get("/data/plugin/gradmom/tags").status_code == 200
    before = rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM: the peak from here on
    steps = int(sys.argv[3])
    rng = random.Random(0)
    jobs = []
    for c in range(200):
        for i in range(2):
            kind = rng.randrange(4)
            if kind < 2:
                q = {"run": "r", "tag": "big/kernel", "step": rng.randrange(steps),
                     "stat": rng.choice(["variance", "mean", "snr", "std"])}
                jobs.append(("heatmap", q))
            elif kind == 2:
                jobs.append(("histogram", {"run": "r", "tag": "big/kernel", "step": "all",
                                           "bins": 10 + 10 * (c % 3)}))
            else:
                jobs.append(("export", {"run": "r", "tag": "big/kernel", "what": "heatmap",
                                        "step": rng.randrange(steps), "format": "npy"}))
    errors = []
    def client_run(c):
        for route, q in jobs[2 * c: 2 * c + 2]:
            r = client.get("/data/plugin/gradmom/" + route, query_string=q)
            if r.status_code != 200:
                errors.append((route, q, r.status_code))
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(200) as pool:
        list(pool.map(client_run, range(200)))
    elapsed = time.perf_counter() - t
    print(json.dumps({
        "before": before, "peak": rss("VmHWM"), "after": rss("VmRSS"),
        "errors": errors[:5], "n_errors": len(errors), "seconds": elapsed,
        "cache_budget": plugin._cache.budget_bytes, "cache_size": plugin._cache.size_bytes,
        "work_peak": plugin._work.peak_bytes, "read_peak": plugin._reader.read_gate.peak_bytes,
        "work_budget": plugin_module.WORK_BUDGET_BYTES, "read_budget": _reader.READ_BUDGET_BYTES,
    }))
    """
)


@pytest.mark.slow
def test_memory_under_200_concurrent_clients(tmp_path):
    """200 clients at once (heatmaps of random old steps, all-steps histograms, full-size
    exports) of a 512 x 512 variable (2 MB per step): the process's resident memory grows by
    at most the cache budget plus the gates' budgets (and 128 MiB for threads, Python objects
    and allocator slack)."""
    steps = 30
    _write_run(str(tmp_path / "logs"), "r", ["big/kernel"], list(range(steps)), shape=(512, 512))
    script = tmp_path / "load.py"
    script.write_text(_LOAD_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "logs"), ROOT, str(steps)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps({k: v for k, v in r.items() if k != "errors"}))
    assert r["n_errors"] == 0, r["errors"]
    assert r["work_peak"] <= max(r["work_budget"], 0) + 64 * 2**20  # one oversize runs alone
    bound = r["cache_budget"] + r["work_budget"] + r["read_budget"] + 128 * 2**20
    assert r["peak"] - r["before"] <= bound, (r["peak"] - r["before"]) / 2**20
    assert plugin_module.WORK_BUDGET_BYTES == r["work_budget"]
