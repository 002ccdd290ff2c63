"""TensorBoard on a ResNet50-sized Grad Moments log: time to ready and memory (not a test).

    python benchmarks/bench_resnet_log.py                  # 2,000 steps logged every 10
    python benchmarks/bench_resnet_log.py --smoke          # CI: 3 logged steps, both loaders

The log is ResNet50's real 214 variables (Keras' names and shapes, 25.6M parameters,
`tests/test_format.py`'s `RESNET50_VARIABLES`) logged with the writer's defaults (format
version 3: maps pooled to 2,048 float16 cells, exact statistics beside them) through the real
writer, `gradmom.summary.write`, every 10 steps for 2,000 steps (200 logged steps). The
moments are random (4 draws, cycled: their values change neither the size nor the work of a
reader). It is written once into ``--cache`` (default /tmp/gradmom_bench_resnet).

For each loader (``--loaders python,rustboard``), a real ``tensorboard`` process
(``--load_fast=false`` / ``true``) is started on the log. *Ready* is when the tab's ``/tags``
lists every logged step of the whole-model statistics (what the tab needs to draw its first
view), polled every 0.5 s; then one heatmap (the latest step of the biggest kernel) and one
``/summary`` are timed. Memory is the peak resident memory (``VmHWM``) of the TensorBoard
process and, for RustBoard, of its data server, read when ready. Targets (issue 30): ready in
at most 30 s and at most 2 GB with either loader.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
P = "/data/plugin/gradmom/"
BIGGEST = "conv5_block1_0_conv/kernel"  # 1 x 1 x 1024 x 2048


def write_log(path: str, steps: int, every: int) -> dict:
    """Writes the log unless a complete one is there; returns its size and the time taken."""
    done = os.path.join(path, "DONE.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    import tensorflow as tf
    from test_format import RESNET50_SHAPES, RESNET50_VARIABLES, _moments_of

    import tb_gradmom as gradmom

    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    variables = [tf.Variable(tf.zeros(s), name=p) for p, s in RESNET50_VARIABLES]
    draws = [_moments_of(RESNET50_SHAPES, seed) for seed in range(4)]
    writer = tf.summary.create_file_writer(path)
    t = time.perf_counter()
    logged = list(range(0, steps, every))
    with writer.as_default():
        for i, step in enumerate(logged):
            gradmom.summary.write(
                draws[i % len(draws)], variables, n=32, step=step, loss=0.5, learning_rate=0.1
            )
            if i % 20 == 0:
                print(f"  wrote step {step} ({time.perf_counter() - t:.0f} s)", flush=True)
    writer.close()
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    info = {
        "logged_steps": len(logged),
        "bytes": size,
        "bytes_per_logged_step": round(size / len(logged)),
        "write_s": round(time.perf_counter() - t, 1),
    }
    with open(done, "w") as f:
        json.dump(info, f)
    return info


def _hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure(path: str, loader: str, logged: int, timeout: float) -> dict:
    """Starts ``tensorboard`` with ``loader`` on the log: time to ready, peak RSS, two requests."""
    import bench_plugin as bp
    import test_plugin_subprocess as tps

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gradmom_resnet_tb_"))
    t0 = time.perf_counter()
    flag = f"--load_fast={'true' if loader == 'rustboard' else 'false'}"
    server = bp._launch(tps, path, tmp, flag)  # noqa: SLF001
    out: dict = {"loader": loader}
    try:
        steps = 0
        while time.perf_counter() - t0 < timeout:
            try:
                with urllib.request.urlopen(server.url + P + "tags", timeout=600) as r:
                    d = json.loads(r.read())
                steps = len(d.get("model", {}).get(".", {}).get("steps", []))
            except OSError:
                steps = 0
            if steps >= logged:
                break
            time.sleep(0.5)
        out["ready_s"] = round(time.perf_counter() - t0, 1)
        out["listed_steps"] = steps
        pids = [server.proc.pid, *bp._children(server.proc.pid)]  # noqa: SLF001
        out["tensorboard_peak_rss_mb"] = round(_hwm_mb(server.proc.pid))
        if len(pids) > 1:
            out["data_server_peak_rss_mb"] = round(sum(_hwm_mb(p) for p in pids[1:]))
        for name, q in (
            ("heatmap_latest_ms", f"heatmap?run=.&tag={BIGGEST}&format=binary"),
            ("summary_ms", "summary?run=."),
        ):
            t = time.perf_counter()
            with urllib.request.urlopen(server.url + P + q, timeout=600) as r:
                r.read()
                assert r.status == 200
            out[name] = round(1000 * (time.perf_counter() - t))
        out["total_peak_rss_mb"] = round(sum(_hwm_mb(p) for p in pids))
    finally:
        tps.stop(server)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default="/tmp/gradmom_bench_resnet")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--loaders", default="python,rustboard")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for ready")
    ap.add_argument("--smoke", action="store_true", help="CI: 3 logged steps, both loaders")
    a = ap.parse_args()
    if a.smoke:
        a.steps, a.every, a.cache = 30, 10, a.cache.rstrip("/") + "-smoke"
    path = os.path.join(a.cache, f"resnet50_{a.steps}_every{a.every}")
    info = write_log(path, a.steps, a.every)
    print(json.dumps({"log": path, **info}), flush=True)
    import test_plugin_subprocess as tps

    for loader in a.loaders.split(","):
        if loader == "rustboard" and tps._data_server_problem():  # noqa: SLF001
            print(f"RustBoard skipped: {tps._data_server_problem()}", flush=True)  # noqa: SLF001
            continue
        r = measure(path, loader, info["logged_steps"], a.timeout)
        print(json.dumps(r), flush=True)
        if r["listed_steps"] < info["logged_steps"]:
            raise SystemExit(f"{loader}: not ready in {a.timeout} s ({r['listed_steps']} steps)")


if __name__ == "__main__":
    main()
