"""The demo, end to end: `tb-gradmom demo --quick` writes real moments for both runs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tb_gradmom import metadata
from tb_gradmom.analysis import data


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path):
    logdir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "tb_gradmom.cli", "demo", "--quick", "--logdir", str(logdir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"tensorboard --logdir {logdir}" in proc.stdout
    assert "mlp" in proc.stderr and "cnn" in proc.stderr  # the progress bars
    runs = data.load(logdir)
    assert set(runs) == {"mlp", "cnn"}

    # Quick mode: 12 MLP steps logged every 2 -> 0..10; 6 CNN steps -> 0, 2, 4.
    # Tags with or without the Keras model name ("mlp/hidden1/kernel" or "hidden1/kernel").
    def one(run, suffix):
        (tag,) = [t for t in runs[run] if t.split("/")[-2:] == suffix.split("/")]
        return runs[run][tag]

    assert [r.step for r in one("mlp", "hidden1/kernel")] == [0, 2, 4, 6, 8, 10]
    assert [r.step for r in one("cnn", "conv1/kernel")] == [0, 2, 4]
    for run in runs.values():
        for tag, records in run.items():
            for rec in records:
                assert rec.stats is not None, tag
                assert rec.stats["batch_size"] == rec.batch_size > 1
                if tag.split("/")[-1] == metadata.MODEL_TAG:
                    continue
                m1, m2 = rec.moments[1], rec.moments[2]
                assert np.all(np.isfinite(m1)) and np.all(np.isfinite(m2))
                # Second raw moment >= squared mean, element-wise (Jensen), up to rounding.
                assert np.all(m2 >= m1**2 - 1e-6 * (np.abs(m2) + 1e-12)), tag


def test_progress_eta_is_measured_after_the_first_step_and_prints_lines_off_a_terminal():
    import io

    from tb_gradmom import demo

    out = io.StringIO()
    bar = demo._Progress(100, "mlp", out, tty=False)
    clock = [0.0]
    demo.time.monotonic = lambda: clock[0]  # restored below
    try:
        bar.start = 0.0
        clock[0] = 30.0  # the first step traces the function: 30 s
        bar.step(1)
        for k in range(2, 101):
            clock[0] = 30.0 + 0.1 * (k - 1)  # then 0.1 s per step
            bar.step(k, "loss 1.0")
    finally:
        import time

        demo.time.monotonic = time.monotonic
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 10  # one line per update, 10 updates
    first = lines[0]
    assert "10/100" in first and "eta    9s" in first, first  # 90 steps left at 0.1 s
    assert lines[-1].startswith("mlp ") and "100/100" in lines[-1] and "eta    0s" in lines[-1]
