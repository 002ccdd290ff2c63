"""README.md's Python examples run as written (in order, in one fresh interpreter)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    script = "\n".join(blocks) + "\nprint('README OK', step(x, y)[1][0][2].shape)\n"
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "README OK (784, 512)" in proc.stdout
    # The training-step example logged real moments to runs/exp1, the callback to runs/exp2.
    from tb_gradmom.analysis import data

    for run in ("exp1", "exp2", "exp3", "exp4"):
        logged = data.load(tmp_path / "runs" / run)["."]
        assert "dense/kernel" in logged, sorted(logged)
    gan = data.load(tmp_path / "runs" / "gan")["."]
    assert {"discriminator/d/kernel", "generator/g/kernel"} <= set(gan), sorted(gan)
    assert [r.step for r in gan["generator/g/kernel"]] == [0]
    vae = data.load(tmp_path / "runs" / "vae")["."]
    kernels = [t for t in vae if t.endswith("/kernel")]
    assert len(kernels) == 4 and all([r.step for r in vae[t]] == [0, 2] for t in kernels), vae
