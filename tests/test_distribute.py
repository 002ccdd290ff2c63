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
    # conv (rules) and LSTM (fallback) x (mean, sum, vector, uneven split), and the summary
    assert len(lines) == 9, proc.stdout
    assert "ok lstm_net mean n=7 split [4, 3]" in lines
