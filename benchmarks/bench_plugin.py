"""Benchmark of the TensorBoard plugin's routes on a big logdir (not a test).

    python benchmarks/bench_plugin.py                 # Python loader, in process
    python benchmarks/bench_plugin.py --rustboard     # also a `tensorboard --load_fast=true`
    python benchmarks/bench_plugin.py --clients 200 --cache-mb 64    # memory under load

``--clients N`` runs, instead of the timings, two phases against a real ``tensorboard``
process with each loader (``--loaders python,rustboard``): a *burst* of ``--burst`` (50)
requests at once for distinct old steps of the big kernel, then N concurrent *mixed* clients,
each doing what a user opening the tab does (/tags, a heatmap of the latest step of a random
variable, a heatmap of the big kernel at a random old step with a random statistic, an
all-steps histogram, and /summary or /series, in a random order). Each phase reports the
resident memory of the TensorBoard process (and of RustBoard's data server) before it, at its
peak and after it, the latency of every request (median, 99th percentile) and the errors.
``--plugin-path DIR`` serves another checkout of the plugin (e.g. an older commit).

``--duration S`` (with ``--clients``): in the mixed phase each client asks round after round
(a new seeded plan each round, with one download: a heatmap's CSV or npy or an all-steps
histogram's CSV) until S seconds have passed, and the latencies are also reported per route
(``routes``). Heatmaps and histograms are asked as the tab asks them (``format=binary``); a
plugin that does not know the parameter answers JSON.

``--smoke`` (CI) runs every part once on a small logdir (3 runs x 12 steps x 4 variables, in
``--cache``-smoke): the timings with each loader (RustBoard if its data server runs here), then
4 concurrent clients and a burst of 4 against a ``tensorboard`` process with each loader, two
rounds each. It asserts nothing about time, only that every request answers 200, and prints
the tables.

The logdir (3 runs x 500 steps x 20 variables, one a 1000 x 1000 kernel) is written once by
`tests/plugin_logdir.py --bench` and cached in ``--cache`` (default /tmp/gradmom_bench). By
default the big kernel is stored pooled to 65,536 float32 cells, what
`tb_gradmom.writers.summary.moments` wrote by default before format version 2 (now 2,048
float16 cells, ``DEFAULT_MAX_ELEMENTS``): the heavier case; ``--full`` also measures a run
storing it at full resolution (1M cells, fewer steps, to keep the logdir on disk and in
TensorBoard's memory).

Cold = the plugin's cache emptied before the request (Python loader; for RustBoard, which runs
in its own process, the first request for a run); warm = the same request again. Figures are
medians over ``--repeat`` requests; peak RSS is the process's high-water mark (for RustBoard,
the TensorBoard process plus its data server).

A step that is not the latest is read with a targeted sample (see tb_gradmom/plugin/_reader.py)
whose size depends on where the step falls in the data provider's sampling order, so the cold
step rows use several steps spread over the run (``*_max_ms``: the slowest of them).
``histogram_all_export_ms`` bins every step (what an export does; a whole-series read), while
``/histogram?step=all`` reads at most 64 MiB (a sample of the steps of the big kernel).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
GEN = os.path.join(ROOT, "tests", "plugin_logdir.py")
P = "/data/plugin/gradmom/"
BIG = "big/kernel"
SMALL = "dense_0/kernel"


def ensure_logdir(path: str, *gen_args: str) -> str:
    """Writes the logdir with the fixture generator unless a complete one is cached."""
    if os.path.isdir(path):
        return path
    tmp = path + ".tmp"
    subprocess.run(["rm", "-rf", tmp], check=True)
    print(f"writing {path} (once; several minutes) ...", flush=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run([sys.executable, GEN, tmp, "--bench", *gen_args], check=True, env=env)
    os.rename(tmp, path)
    return path


def times_ms(fn, repeat: int, before=None):
    """Milliseconds of each of ``repeat`` calls of ``fn()``, or the error text if one failed."""
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported in the table
            return f"error: {type(e).__name__}: {e}"[:120]
        times.append((time.perf_counter() - t) * 1000)
    return times


def median_ms(fn, repeat: int, before=None):
    """Median milliseconds of ``fn()``, or the error text if any call failed."""
    times = times_ms(fn, repeat, before)
    return times if isinstance(times, str) else statistics.median(times)


def spread_steps(steps: int, count: int) -> list[int]:
    """``count`` steps evenly inside ``range(steps)``, neither the first nor the last."""
    return [steps * (i + 1) // (count + 1) for i in range(count)]


def record(out: dict, name: str, times) -> None:
    """``name``_ms (median) and ``name``_max_ms of a list of times (or the error text)."""
    if isinstance(times, str):
        out[name + "_ms"] = times
        return
    out[name + "_ms"] = statistics.median(times)
    out[name + "_max_ms"] = max(times)


# ------------------------------------------------------------------ Python loader


def python_app(logdir: str):
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_ingester
    from tensorboard.plugins.core import core_plugin
    from werkzeug.test import Client

    from tb_gradmom.plugin.loader import GradMomentsPluginLoader

    class Loader(GradMomentsPluginLoader):
        plugin = None

        def load(self, context):
            self.plugin = super().load(context)
            return self.plugin

    loader = Loader()
    loaders = [core_plugin.CorePluginLoader(), loader]
    tb = program.TensorBoard(plugins=loaders, assets_zip_provider=lambda: None)
    tb.configure(["", "--logdir", logdir, "--reload_interval", "0", "--reload_task", "blocking"])
    t = time.perf_counter()
    ingester = data_ingester.LocalDataIngester(tb.flags)
    ingester.start()
    load_s = time.perf_counter() - t
    app = application.TensorBoardWSGIApp(
        tb.flags, loaders, ingester.data_provider, None, ingester.deprecated_multiplexer
    )
    return Client(app), loader.plugin, load_s


def bench_python(
    logdir: str, repeat: int, label: str, steps: int, runs=("run0", "run1", "run2")
) -> dict:
    client, plugin, load_s = python_app(logdir)
    clear = plugin._cache.clear

    def get(route, **q):
        r = client.get(P + route, query_string=q)
        assert r.status_code == 200, (route, q, r.status_code, r.get_data()[:300])
        return r.get_data()

    mid = steps // 2
    out = {"logdir": label, "loader": "python", "ingest_s": round(load_s, 1)}
    out["tags_cold_ms"] = median_ms(lambda: get("tags"), repeat, before=clear)
    out["tags_warm_ms"] = median_ms(lambda: get("tags"), repeat)
    r0, r1, r2 = (list(runs) * 3)[:3]
    hm = {"run": r0, "tag": BIG, "stat": "variance"}
    out["heatmap_latest_cold_ms"] = median_ms(lambda: get("heatmap", **hm), repeat, before=clear)
    out["heatmap_latest_warm_ms"] = median_ms(lambda: get("heatmap", **hm), repeat)
    cold_steps = iter(spread_steps(steps, repeat))
    record(
        out,
        "heatmap_step_cold",
        times_ms(lambda: get("heatmap", step=next(cold_steps), **hm), repeat, before=clear),
    )
    out["heatmap_step_warm_ms"] = median_ms(lambda: get("heatmap", step=mid, **hm), repeat)
    # The same in the binary form the tab asks for (an older plugin answers JSON).
    hb = {**hm, **TAB_ARRAYS}
    out["heatmap_latest_cold_binary_ms"] = median_ms(lambda: get("heatmap", **hb), repeat, clear)
    cold_binary = iter(spread_steps(steps, repeat))
    record(
        out,
        "heatmap_step_cold_binary",
        times_ms(lambda: get("heatmap", step=next(cold_binary), **hb), repeat, before=clear),
    )
    # Scrubbing: after one full read, neighbouring steps are cached (moments, not responses).
    near = iter(range(mid + 1, mid + 1 + repeat))
    out["heatmap_next_step_ms"] = median_ms(lambda: get("heatmap", step=next(near), **hm), repeat)
    stats_cycle = iter(["snr", "std", "mean", "biased_variance", "second_moment"] * repeat)
    out["heatmap_new_stat_ms"] = median_ms(
        lambda: get("heatmap", run=r0, tag=BIG, stat=next(stats_cycle)), repeat
    )
    big1024 = {"run": r0, "tag": BIG, "max_rows": 1024, "max_cols": 1024}
    out["heatmap_1024_cold_ms"] = median_ms(lambda: get("heatmap", **big1024), repeat, clear)
    hist = {"run": r0, "tag": BIG, "step": "all", "bins": 30}
    out["histogram_all_cold_ms"] = median_ms(lambda: get("histogram", **hist), repeat, clear)
    out["histogram_all_warm_ms"] = median_ms(lambda: get("histogram", **hist), repeat)
    export = {**hist, "what": "histogram", "format": "json"}
    out["histogram_all_export_ms"] = median_ms(lambda: get("export", **export), 3, clear)
    small = {"run": r1, "tag": SMALL, "step": "all", "scale": "log"}
    out["histogram_all_small_cold_ms"] = median_ms(lambda: get("histogram", **small), repeat, clear)
    out["series_cold_ms"] = median_ms(lambda: get("series", run=r2), repeat, clear)
    out["summary_cold_ms"] = median_ms(lambda: get("summary", run=r2), repeat, clear)
    out["heatmap_bytes"] = len(get("heatmap", **hm))
    out["heatmap_binary_bytes"] = len(get("heatmap", **hm, **TAB_ARRAYS))
    out["cache_mb"] = round(plugin._cache.size_bytes / 2**20, 1)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


# ---------------------------------------------------------------------- RustBoard


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def bench_rustboard(logdir: str, repeat: int, label: str, steps: int) -> dict:
    import gc
    import tempfile

    # The Python loader's app of `bench_python` (GBs of event data in reference cycles) is
    # garbage now: collect it before timing, or its collection runs in this process during
    # the first requests and takes a core from the TensorBoard server on a 2-core machine
    # (it doubled the first cold request: 2.2 s instead of 1.0 s).
    gc.collect()

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import pathlib

    import test_plugin_subprocess as tps

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gradmom_bench_tb_"))
    t = time.perf_counter()
    server = _launch(tps, logdir, tmp)
    try:
        while True:  # ready when every run's whole-model stats are in
            d = json.loads(urllib.request.urlopen(server.url + P + "tags", timeout=600).read())
            if len(d.get("model", {})) == 3 and all(
                len(m["steps"]) == steps for m in d["model"].values()
            ):
                break
            time.sleep(1)
        load_s = time.perf_counter() - t

        def get(route, **q):
            url = server.url + P + route + ("?" + urllib.parse.urlencode(q) if q else "")
            with urllib.request.urlopen(url, timeout=120) as r:
                assert r.status == 200
                return r.read()

        mid = steps // 2
        runs = itertools.cycle(["run0", "run1", "run2"])
        out = {"logdir": label, "loader": "rustboard", "ready_s": round(load_s, 1)}
        out["tags_first_ms"] = median_ms(lambda: get("tags"), 1)
        out["tags_warm_ms"] = median_ms(lambda: get("tags"), repeat)
        # Cold: each run once (nothing of it cached yet).
        out["heatmap_latest_cold_ms"] = median_ms(
            lambda: get("heatmap", run=next(runs), tag=BIG), 3
        )
        out["heatmap_latest_warm_ms"] = median_ms(
            lambda: get("heatmap", run="run0", tag=BIG), repeat
        )
        # Cold: the first step other than the latest asked of each run, at 3 places.
        cold = iter(zip(["run0", "run1", "run2"], spread_steps(steps, 3)))
        record(
            out,
            "heatmap_step_cold",
            times_ms(lambda: get("heatmap", tag=BIG, **dict(zip(("run", "step"), next(cold)))), 3),
        )
        near = iter(range(mid + 1, mid + 1 + repeat))
        out["heatmap_next_step_ms"] = median_ms(
            lambda: get("heatmap", run="run1", tag=BIG, step=next(near)), repeat
        )
        out["histogram_all_cold_ms"] = median_ms(
            lambda: get("histogram", run=next(runs), tag=BIG, step="all", bins=31), 3
        )
        out["histogram_all_warm_ms"] = median_ms(
            lambda: get("histogram", run="run0", tag=BIG, step="all", bins=31), repeat
        )
        out["histogram_all_export_ms"] = median_ms(
            lambda: get(
                "export",
                run=next(runs),
                tag=BIG,
                step="all",
                bins=31,
                what="histogram",
                format="json",
            ),
            3,
        )
        pids = [server.proc.pid, *_children(server.proc.pid)]
        out["peak_rss_mb"] = round(sum(_hwm_mb(p) for p in pids))
    finally:
        tps.stop(server)
    return out


def _launch(tps, logdir, tmp, *flags, plugin_path=None):
    import re

    pythonpath = [plugin_path or ROOT]
    if not tps._entry_point_installed():
        dist = tmp / "ep" / "tb_gradmom-0.1.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tb_gradmom\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text(f"[tensorboard_plugins]\n{tps.ENTRY_POINT}\n")
        pythonpath.insert(0, str(tmp / "ep"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath), TF_CPP_MIN_LOG_LEVEL="3")
    log = str(tmp / "tensorboard.log")
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
                *(flags or ("--load_fast=true",)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    deadline = time.time() + 300
    while time.time() < deadline:
        m = re.search(r"(http://127\.0\.0\.1:\d+)/", open(log).read())
        if m:
            return tps.Server(m.group(1), proc, log)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(open(log).read()[-2000:])


# ------------------------------------------------------------ concurrent clients


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _reset_hwm(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # the kernel's peak RSS (VmHWM) restarts from the current RSS
    except OSError:
        pass


# What the tab asks for its arrays (the binary form, pooled to fit the screen); a plugin that
# does not know these parameters (an older checkout) ignores them and answers JSON.
TAB_ARRAYS = {"format": "binary"}


def _client_plan(
    c: int, steps: int, variables: list[str], runs: int = 3, round_: int = 0, export=False
) -> list[tuple[str, dict]]:
    """What client ``c`` asks in its round ``round_``, in order (seeded): what opening the tab
    and looking around does; with ``export``, also one download (`_export_request`)."""
    import random

    rng = random.Random(c if round_ == 0 else f"{c}/{round_}")
    run = f"run{rng.randrange(runs)}"
    other = rng.choice(variables)
    stat = rng.choice(["variance", "mean", "snr", "std", "biased_variance"])
    old = rng.randrange(steps - 1)
    plan = [
        ("tags", {}),
        ("heatmap", {"run": run, "tag": other, **TAB_ARRAYS}),
        ("heatmap", {"run": run, "tag": BIG, "step": old, "stat": stat, **TAB_ARRAYS}),
        ("histogram", {"run": run, "tag": rng.choice([BIG, other]), "step": "all", **TAB_ARRAYS}),
        rng.choice([("summary", {"run": run}), ("series", {"run": run, "tag": other})]),
    ]
    if export:
        plan.append(_export_request(rng, run, rng.choice([BIG, other]), old))
    rng.shuffle(plan[1:])
    return plan


def _export_request(rng, run: str, tag: str, step: int) -> tuple[str, dict]:
    """One of the tab's downloads: a heatmap's CSV or npy, or a histogram's CSV over all steps."""
    what, fmt = rng.choice([("heatmap", "csv"), ("heatmap", "npy"), ("histogram", "csv")])
    q = {"run": run, "tag": tag, "what": what, "format": fmt}
    q["step"] = "all" if what == "histogram" else step
    return "export", q


# TensorBoard's own route that reads nothing (its environment: the data location, version):
# the floor of the harness, HTTP and TensorBoard's middleware under the same clients.
FLOOR_ROUTE = "/data/environment"


def _route_name(route: str, q: dict) -> str:
    """The latency table's row of a request: the route, and for heatmaps which step kind."""
    if route == "heatmap":
        return "heatmap_old_step" if "step" in q else "heatmap_latest"
    if route == "export":
        return f"export_{q['what']}_{q['format']}"
    return route


def _percentiles(times: list[float]) -> dict:
    lat = sorted(times)
    return {
        "n": len(lat),
        "p50_ms": round(1000 * lat[len(lat) // 2]),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]),
        "max_ms": round(1000 * lat[-1]),
    }


def _phase(server, plans, duration: float = 0.0) -> dict:
    """All ``plans`` (one per client) at once: RSS before/peak/after, latencies, errors.

    ``plans``: a list of request lists, one per client; or with ``duration`` (seconds), a
    function ``plan(client, round)`` that each client calls again and again, asking each round's
    requests in order, until ``duration`` has passed (a request started before the end is
    waited for and counted). Latencies are also given per route (`_route_name`).
    """
    import concurrent.futures
    import threading

    def pids():
        return [server.proc.pid, *_children(server.proc.pid)]

    time.sleep(2)
    before = {p: _rss_mb(p) for p in pids()}
    for p in before:
        _reset_hwm(p)
    peak = dict(before)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            for p in pids():
                peak[p] = max(peak.get(p, 0.0), _rss_mb(p))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    latencies: list[float] = []
    per_route: dict[str, list[float]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    clients = len(plans) if not callable(plans) else plans.clients  # type: ignore[attr-defined]
    start = threading.Barrier(clients)
    end = [math.inf]

    def ask(route, q):
        path = route if route.startswith("/") else P + route  # "/...": TensorBoard's own
        url = server.url + path + ("?" + urllib.parse.urlencode(q) if q else "")
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=1800) as r:
                r.read()
                err = None if r.status == 200 else f"{route} {r.status}"
        except Exception as e:  # noqa: BLE001 - counted
            err = f"{route} {type(e).__name__}: {str(e)[:80]}"
        dt = time.perf_counter() - t
        with lock:
            latencies.append(dt)
            per_route.setdefault(_route_name(route, q), []).append(dt)
            if err:
                errors.append(err)

    def client(c):
        start.wait()
        if not callable(plans):
            for route, q in plans[c]:
                ask(route, q)
            return
        for round_ in itertools.count():
            for route, q in plans(c, round_):
                if time.perf_counter() >= end[0]:
                    return
                ask(route, q)

    t = time.perf_counter()
    end[0] = t + duration if duration else math.inf
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    out = {"wall_s": round(time.perf_counter() - t, 1)}
    time.sleep(2)
    stop.set()
    sampler.join()
    after = {p: _rss_mb(p) for p in pids()}
    hwm = {p: _rss_mb(p, "VmHWM") for p in pids()}
    tb = server.proc.pid
    lat = sorted(latencies)
    out.update(
        requests=len(lat),
        errors=len(errors),
        error_examples=sorted(set(errors))[:3],
        p50_ms=round(1000 * lat[len(lat) // 2]),
        p99_ms=round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]),
        max_ms=round(1000 * lat[-1]),
        routes={k: _percentiles(v) for k, v in sorted(per_route.items())},
        tb_rss_before_mb=round(before[tb]),
        tb_rss_peak_mb=round(max(peak[tb], hwm[tb])),
        tb_rss_after_mb=round(after[tb]),
    )
    servers = [p for p in after if p != tb]
    if servers:
        out["data_server_rss_before_mb"] = round(sum(before.get(p, 0) for p in servers))
        out["data_server_rss_peak_mb"] = round(
            sum(max(peak.get(p, 0), hwm.get(p, 0)) for p in servers)
        )
        out["data_server_rss_after_mb"] = round(sum(after[p] for p in servers))
    return out


def bench_clients(
    logdir: str,
    loader: str,
    clients: int,
    cache_mb: int,
    steps: int,
    label: str,
    plugin_path: str | None = None,
    burst: int = 50,
    runs: int = 3,
    duration: float = 0.0,
    floor: bool = False,
) -> dict:
    """A burst of ``burst`` requests for distinct old steps of the big kernel at once, then
    ``clients`` concurrent clients (`_client_plan`), against one `tensorboard` process: each
    client asks one round of requests, or with ``duration`` (seconds) asks round after round,
    with a download in each, until that time has passed. With ``floor``, then the same
    clients (for the same time, or one round of 5 requests each) asking only TensorBoard's
    own route `FLOOR_ROUTE` (no plugin code): the latency this harness gives a request that
    costs nothing, on the same server under the same clients."""
    import gc
    import pathlib
    import tempfile

    gc.collect()
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_plugin_subprocess as tps

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gradmom_bench_clients_"))
    flags = [f"--load_fast={'true' if loader == 'rustboard' else 'false'}"]
    if cache_mb:
        flags.append(f"--gradmom_cache_mb={cache_mb}")
    t0 = time.perf_counter()
    server = _launch(tps, logdir, tmp, *flags, plugin_path=plugin_path)
    out = {"logdir": label, "loader": loader, "clients": clients, "cache_mb": cache_mb}
    try:
        while True:  # ready when every run's whole-model stats are in
            try:
                d = json.loads(urllib.request.urlopen(server.url + P + "tags", timeout=600).read())
            except OSError:
                d = {}
            if len(d.get("model", {})) == runs and all(
                len(m["steps"]) == steps for m in d["model"].values()
            ):
                break
            time.sleep(1)
        out["ready_s"] = round(time.perf_counter() - t0, 1)
        variables = sorted(d["runs"]["run0"])
        if burst:
            stride = max(1, (steps - 1) // burst)
            plans = [
                [("heatmap", {"run": "run0", "tag": BIG, "step": (i * stride) % (steps - 1)})]
                for i in range(burst)
            ]
            out["burst"] = {"requests_at_once": burst, **_phase(server, plans)}
        if clients and duration:

            def plan(c, round_):
                return _client_plan(c, steps, variables, runs, round_, export=True)

            plan.clients = clients  # type: ignore[attr-defined]
            out["mixed"] = {"duration_s": duration, **_phase(server, plan, duration)}
        elif clients:
            plans = [_client_plan(c, steps, variables, runs) for c in range(clients)]
            out["mixed"] = _phase(server, plans)
        if clients and floor and duration:

            def floor_plan(c, round_):
                return [(FLOOR_ROUTE, {})]

            floor_plan.clients = clients  # type: ignore[attr-defined]
            out["floor"] = {"duration_s": duration, **_phase(server, floor_plan, duration)}
        elif clients and floor:  # one round: as many requests per client as a mixed round
            out["floor"] = _phase(server, [[(FLOOR_ROUTE, {})] * 5 for _ in range(clients)])
    finally:
        tps.stop(server)
    return out


def _print_table(r: dict) -> None:
    print(f"\n== {r['loader']}: {r['logdir']}")
    for k, v in r.items():
        if k in ("loader", "logdir"):
            continue
        if isinstance(v, dict):
            for kk, vv in v.items():
                print(f"  {k + '.' + kk:32s} {vv!s:>10}")
        else:
            print(f"  {k:32s} {v:10.1f}" if isinstance(v, float) else f"  {k:32s} {v!s:>10}")


def smoke(cache: str) -> None:
    """Every part of the benchmark once on a small logdir (CI): raises if a request fails."""
    import test_plugin_subprocess as tps

    steps, label = 12, "3x12x4 (smoke), 1M kernel pooled to 64K"
    logdir = ensure_logdir(
        os.path.join(cache, "pooled"),
        *("--big-max-elements", "65536", "--steps", str(steps), "--variables", "4"),
    )
    results = [bench_python(logdir, 2, label, steps)]
    loaders = ["python"]
    problem = tps._data_server_problem()  # noqa: SLF001
    if problem is None:
        results.append(bench_rustboard(logdir, 2, label, steps))
        loaders.append("rustboard")
    else:
        print(f"RustBoard skipped: {problem}", flush=True)
    for loader in loaders:
        results.append(bench_clients(logdir, loader, 4, 64, steps, label, burst=4, floor=True))
    for r in results:
        print(json.dumps(r), flush=True)
    for r in results:
        _print_table(r)
    failed = [
        (r["loader"], k, v)
        for r in results
        for k, v in r.items()
        if isinstance(v, str) and v.startswith("error")
    ]
    failed += [
        (r["loader"], phase, r[phase]["error_examples"])
        for r in results
        for phase in ("burst", "mixed", "floor")
        if phase in r and r[phase]["errors"]
    ]
    if failed:
        raise SystemExit(f"bench_plugin --smoke: failed requests: {failed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default="/tmp/gradmom_bench")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--steps", type=int, default=500, help="steps per run of the main logdir")
    ap.add_argument("--rustboard", action="store_true", help="also time --load_fast=true")
    ap.add_argument(
        "--full",
        action="store_true",
        help="also a run storing the 1M kernel unpooled (1 run x 100 steps)",
    )
    ap.add_argument("--clients", type=int, default=0, help="concurrent clients (memory bench)")
    ap.add_argument("--cache-mb", type=int, default=0, help="--gradmom_cache_mb (0: default)")
    ap.add_argument("--loaders", default="python,rustboard", help="for --clients")
    ap.add_argument("--plugin-path", default=None, help="serve the plugin from this checkout")
    ap.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="with --clients: each client asks round after round (with a download each) for "
        "this many seconds, instead of one round",
    )
    ap.add_argument(
        "--burst",
        type=int,
        default=50,
        help="with --clients: first this many requests for distinct old steps at once",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="with --clients and --duration: then the same clients asking only TensorBoard's "
        "own /data/environment for as long (the harness's floor)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: every part once on a small logdir (in CACHE-smoke), both loaders, 4 clients",
    )
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    if a.smoke:
        smoke(a.cache.rstrip("/") + "-smoke")
        return
    pooled = ensure_logdir(
        os.path.join(a.cache, "pooled"), "--big-max-elements", "65536", "--steps", str(a.steps)
    )
    label = f"3x{a.steps}x20, 1M kernel pooled to 64K"
    if a.clients:
        for loader in a.loaders.split(","):
            if a.full:
                full = ensure_logdir(os.path.join(a.cache, "full"), "--runs", "1", "--steps", "100")
                args = (full, loader, a.clients, a.cache_mb, 100, "1x100x20, 1M kernel unpooled")
                r = bench_clients(
                    *args, a.plugin_path, a.burst, runs=1, duration=a.duration, floor=a.floor
                )
            else:
                args = (pooled, loader, a.clients, a.cache_mb, a.steps, label)
                r = bench_clients(*args, a.plugin_path, a.burst, duration=a.duration, floor=a.floor)
            print(json.dumps(r), flush=True)
        return
    results = [bench_python(pooled, a.repeat, label, a.steps)]
    if a.rustboard:
        results.append(bench_rustboard(pooled, a.repeat, label, a.steps))
    if a.full:
        import gc

        gc.collect()  # see bench_rustboard
        full = ensure_logdir(os.path.join(a.cache, "full"), "--runs", "1", "--steps", "100")
        results.append(
            bench_python(full, a.repeat, "1x100x20, 1M kernel unpooled", 100, runs=("run0",))
        )
    for r in results:
        print(json.dumps(r))
    for r in results:
        _print_table(r)


if __name__ == "__main__":
    main()
