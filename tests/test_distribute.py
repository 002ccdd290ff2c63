"""tf.distribute.MirroredStrategy over 2 logical CPUs: moments over the global batch.

The checks live in `tests/distributed_check.py`, run in a fresh process (logical devices
must be set before TensorFlow initialises its devices).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_mirrored_strategy_matches_one_device_on_the_global_batch(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.distributed_check", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    # conv (rules), LSTM (the loop rule) and an RNN whose kernel takes the exact fallback x
    # (mean, sum, vector, uneven split), conv and the fallback with a weight penalty (mean,
    # sum), the summary and the Keras callback under model.fit
    assert len(lines) == 18, proc.stdout
    assert "ok sin_rnn_net sum+penalty n=7 split [4, 3]" in lines
    assert "ok keras fit" in lines
    assert "ok lstm_net mean n=7 split [4, 3]" in lines
    assert "ok sin_rnn_net mean n=7 split [4, 3]" in lines


def _free_ports(count):
    import socket

    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_multi_worker_mirrored_strategy_two_processes(tmp_path):
    """Two workers on 127.0.0.1 (TF_CONFIG): the moments equal one process's on the global
    batch, and summary.moments logs them once (worker 0 checks)."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    p0, p1 = _free_ports(2)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.multiworker_check",
                str(p0),
                str(p1),
                str(i),
                str(tmp_path),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=600))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, out[-3000:] + err[-5000:]
    text = outs[0][0] + outs[1][0]
    assert "ok worker 0 moments over the global batch" in text, text
    assert "ok worker 1 moments over the global batch" in text, text
    assert "ok worker 0 summary: global-batch moments logged once" in text, text
    # model.fit: Keras' own fit fails under this strategy without any callback (Keras 3.15),
    # or, with a Keras that fixes it, the callback logs the global batch's moments.
    assert (
        "keras fit without the callback fails on worker 0" in text
        or "ok worker 0 keras fit: global-batch moments logged" in text
    ), text
