"""plot.py, export.py and the `tb-gradmom export` command on event files written by real TF.

The numbers in CSV and JSON files are checked against the event files read independently
(TensorBoard's EventAccumulator) with the statistics written out here from docs/math.md.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import types
import xml.etree.ElementTree as ET

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from tb_gradmom import cli, metadata
from tb_gradmom.analysis import data, encode, stats
from tb_gradmom.viz import export, plot  # noqa: E402

try:  # the real-TF event files of test_data (tests as a package, or tests/ on sys.path)
    from tests.test_data import LAYOUT, STEPS, _write_logdir
except ImportError:  # pragma: no cover
    from test_data import LAYOUT, STEPS, _write_logdir

NF = len(metadata.STATS_FIELDS)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("plotlogs"))
    _write_logdir(root)
    return root


@pytest.fixture(scope="module")
def logged(logdir):
    """{(run, tag): {step: (moments tensor or None, stats tensor)}} via EventAccumulator."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    out = {}
    for run in LAYOUT:
        acc = event_accumulator.EventAccumulator(
            os.path.join(logdir, run), size_guidance={event_accumulator.TENSORS: 0}
        )
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            if acc.SummaryMetadata(tag).plugin_data.plugin_name != "gradmom":
                continue
            base, is_stats = (
                (tag[: -len("/_stats")], True) if tag.endswith("/_stats") else (tag, False)
            )
            entry = out.setdefault((run, base), {})
            for ev in acc.Tensors(tag):
                arr = tensor_util.make_ndarray(ev.tensor_proto).astype(np.float64)
                m, s = entry.get(ev.step, (None, None))
                entry[ev.step] = (m, arr) if is_stats else (arr, s)
    return out


def _variance(m1, m2, n):
    return n / (n - 1) * (m2 - m1 * m1)


def _run(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


# ----------------------------------------------------------------------------- files


def test_png_decodes_with_expected_size(logdir, tmp_path, capsys):
    code, out, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--tag",
            "^dense/kernel$",
            "--dpi",
            "100",
        ],
        capsys,
    )
    assert code == 0, err
    path = tmp_path / f"dense_kernel-step{STEPS[-1]}-variance.png"
    assert out.strip() == f"wrote 1 file to {tmp_path}"
    # Default figure: one paper column, 3.4 x 2.72 inches.
    assert _png_size(path) == (340, 272)
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        assert im.size == (340, 272)
        assert len(im.convert("RGB").getcolors(1 << 24)) > 20  # an image, not a blank page


def test_svg_parses_and_is_labelled(logdir, tmp_path, capsys):
    code, _, err = _run(
        ["export", "--logdir", logdir, "--out", str(tmp_path), "--run", "eval", "--format", "svg"],
        capsys,
    )
    assert code == 0, err
    (path,) = tmp_path.iterdir()
    assert path.name == f"eval_a-conv_kernel-step{STEPS[-1]}-variance.svg"
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    # Text is kept as <text> (svg.fonttype none), so it stays editable and searchable.
    texts = " ".join("".join(t.itertext()) for t in root.iter() if t.tag.endswith("}text"))
    texts = " ".join(texts.split())
    assert "conv/kernel" in texts and f"step {STEPS[-1]}" in texts and "eval/a" in texts
    assert "variance (unbiased, n/(n−1))" in texts
    assert "logged as 2×2 block means" in texts
    assert "output index" in texts


def test_pdf_has_one_page(logdir, tmp_path, capsys):
    code, _, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--plot",
            "curves",
            "--format",
            "pdf",
            "--tag",
            "_model",
        ],
        capsys,
    )
    assert code == 0, err
    blob = (tmp_path / "model-curves.pdf").read_bytes()
    assert blob.startswith(b"%PDF-")
    assert blob.rstrip().endswith(b"%%EOF")
    assert len(re.findall(rb"/Type\s*/Page[^s]", blob)) == 1
    assert b"/MediaBox" in blob


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("stat", ["variance", "mean"])
def test_heatmap_csv_equals_logged_data(logdir, logged, tmp_path, capsys, stat):
    code, _, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--format",
            "csv",
            "--step",
            "5",
            "--stat",
            stat,
        ],
        capsys,
    )
    assert code == 0, err
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        f"dense_bias-step5-{stat}.csv",
        f"dense_kernel-step5-{stat}.csv",
        f"eval_a-conv_kernel-step5-{stat}.csv",
    ]
    for run, tag, name in [(".", "dense/kernel", files[1]), ("eval/a", "conv/kernel", files[2])]:
        moments, st = logged[(run, tag)][5]
        n = st[0]
        expected = moments[0] if stat == "mean" else _variance(moments[0], moments[1], n)
        expected = expected.reshape(-1, expected.shape[-1])
        with open(tmp_path / name, newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["row", "col", stat]
        got = np.full(expected.shape, np.nan)
        for r, c, v in rows[1:]:
            got[int(r), int(c)] = float(v)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    assert (tmp_path / files[1]).read_bytes().count(b"\r\n") == 13  # header + 12 cells, CRLF


def test_heatmap_json_equals_logged_data(logdir, logged, tmp_path, capsys):
    code, _, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--format",
            "json",
            "--tag",
            "bias",
            "--stat",
            "kurtosis",
            "--step",
            "all",
        ],
        capsys,
    )
    assert code == 0, err
    for step in STEPS:
        payload = json.loads((tmp_path / f"dense_bias-step{step}-kurtosis.json").read_text())
        moments, st = logged[(".", "dense/bias")][step]
        m1, m2, m3, m4 = moments
        mu4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4
        expected = mu4 / (m2 - m1**2) ** 2
        assert payload["run"] == "." and payload["tag"] == "dense/bias" and payload["step"] == step
        assert payload["batch_size"] == int(st[0])
        assert payload["shape"] == [4]
        np.testing.assert_allclose(np.array(payload["grid"])[0], expected, rtol=1e-9)


def test_histogram_csv_counts_every_element(logdir, logged, tmp_path, capsys):
    code, _, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--format",
            "csv",
            "--plot",
            "histogram",
            "--tag",
            "dense/kernel",
            "--bins",
            "5",
            "--scale",
            "log",
        ],
        capsys,
    )
    assert code == 0, err
    moments, st = logged[(".", "dense/kernel")][STEPS[-1]]
    var = _variance(moments[0], moments[1], st[0]).ravel()
    with open(tmp_path / f"dense_kernel-step{STEPS[-1]}-variance-histogram.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["bin_lo", "bin_hi", "count"]
    lo = [float(r[0]) for r in rows[1:]]
    hi = [float(r[1]) for r in rows[1:]]
    counts = [int(r[2]) for r in rows[1:]]
    assert len(counts) == 5 and sum(counts) == var.size
    assert lo[0] == pytest.approx(var.min(), rel=1e-12) and hi[-1] == pytest.approx(
        var.max(), rel=1e-12
    )
    np.testing.assert_allclose(np.diff(np.log10(lo + hi[-1:])), np.log10(hi[-1] / lo[0]) / 5)
    for a, b, c in zip(lo, hi, counts, strict=True):
        inside = ((var >= a) & (var < b)) | ((var == b) & (b == hi[-1]))
        assert c == inside.sum()


def test_curves_and_summary_equal_formulas(logdir, logged, tmp_path, capsys):
    code, _, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--format",
            "csv",
            "--plot",
            "curves",
            "--tag",
            "^_model$",
            "--quantities",
            "noise_scale,norm_test,cabs_batch_size",
        ],
        capsys,
    )
    assert code == 0, err
    with open(tmp_path / "model-curves.csv", newline="") as f:
        rows = list(csv.reader(f))
    # Each quantity per step, then smoothed (default 0.9, the tab's) from separately smoothed
    # numerator and denominator.
    assert rows[0] == [
        "run",
        "step",
        "noise_scale",
        "noise_scale_smoothed",
        "norm_test",
        "norm_test_smoothed",
        "cabs_batch_size",
        "cabs_batch_size_smoothed",
    ]
    rows = [r for r in rows[1:] if r[0] == "."]
    assert [int(r[1]) for r in rows] == list(STEPS)
    beta, num, den, w = plot.DEFAULT_SMOOTHING, 0.0, 0.0, 0.0
    for r in rows:
        _, st = logged[(".", "_model")][int(r[1])]
        s = dict(zip(metadata.STATS_FIELDS, st[:NF], strict=True))
        n = s["batch_size"]
        assert float(r[2]) == pytest.approx(
            s["sum_var"] / (s["sum_m2"] - s["sum_var"] / n), rel=1e-12
        )
        assert float(r[4]) == pytest.approx(np.sqrt(s["sum_var"] / (n * s["sum_m2"])), rel=1e-12)
        assert float(r[6]) == pytest.approx(
            s["learning_rate"] * (s["sum_m2_raw"] - s["sum_m2"]) / s["loss"], rel=1e-12
        )
        # EMA(tr Sigma) / EMA(|G|^2), both bias-corrected by the same weight (docs/math.md).
        num = beta * num + (1 - beta) * s["sum_var"]
        den = beta * den + (1 - beta) * (s["sum_m2"] - s["sum_var"] / n)
        w = beta * w + (1 - beta)
        assert float(r[3]) == pytest.approx((num / w) / (den / w), rel=1e-9)

    code, _, err = _run(
        [
            "export",
            "--logdir",
            logdir,
            "--out",
            str(tmp_path),
            "--format",
            "json",
            "--plot",
            "summary",
            "--run",
            r"^\.$",
            "--step",
            "0",
        ],
        capsys,
    )
    assert code == 0, err
    payload = json.loads((tmp_path / "step0-summary.json").read_text())
    assert [row["tag"] for row in payload["rows"]] == ["_model", "dense/bias", "dense/kernel"]
    for row in payload["rows"]:
        _, st = logged[(".", row["tag"])][0]
        s = dict(zip(metadata.STATS_FIELDS, st[:NF], strict=True))
        assert row["total_variance"] == pytest.approx(s["sum_var"], rel=1e-12)
        assert row["gsnr_mean"] == pytest.approx(s["sum_gsnr"] / s["gsnr_count"], rel=1e-12)
        assert row["eb_criterion"] == pytest.approx(
            1 - s["batch_size"] / s["num_elements"] * s["sum_gsnr"], rel=1e-12
        )


def test_non_finite_numbers_are_spelled_out():
    payload = {"a": [float("nan"), float("inf"), -np.inf, np.float32(1.5)], "b": np.array([0.1])}
    assert json.loads(encode.to_json(payload, digits=None)) == {
        "a": ["NaN", "Infinity", "-Infinity", 1.5],
        "b": [0.1],
    }
    text = encode.csv_table(["x", "y"], [[float("nan"), 0.1], ["a,b", -np.inf]], digits=None)
    assert text == 'x,y\r\nNaN,0.1\r\n"a,b",-Infinity\r\n'


def test_file_names():
    assert encode.file_name([".", "dense/kernel", "step10", "variance"], "png") == (
        "dense_kernel-step10-variance.png"
    )
    assert encode.file_name(["train/a b", "x:y"], "csv") == "train_a_b-x_y.csv"
    assert encode.file_name([], "json") == "gradmom.json"


def test_file_name_cases_shared_with_the_tab():
    """tests/js/file_names.json holds the cases the tab's ``fileName`` is tested on (node); they
    must be this function's answers, so the tab and the Python side name files alike."""
    cases = json.loads(
        (pathlib.Path(__file__).parent / "js" / "file_names.json").read_text("utf-8")
    )
    assert len(cases) >= 10
    for c in cases:
        assert encode.file_name(c["parts"], c["ext"]) == c["name"], c
    assert any(len(c["name"]) == encode.NAME_MAX for c in cases)  # the hashed long names


def test_progress_bar_with_many_files(logdir, tmp_path, monkeypatch):
    monkeypatch.setattr(export, "PROGRESS_MIN_FILES", 5)
    err, out = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(
        ["export", "--logdir", logdir, "--out", str(tmp_path), "--step", "all", "--format", "csv"]
    )
    assert export.run_from_args(args, stderr=err, stdout=out) == 0
    assert "exporting [" in err.getvalue() and "9/9 files" in err.getvalue()
    assert len(list(tmp_path.iterdir())) == 9
    argv = ["export", "--logdir", logdir, "--out", str(tmp_path), "--format", "csv", "--quiet"]
    err = io.StringIO()
    # The latest steps' files exist now: refused, nothing written, unless --overwrite.
    assert export.run_from_args(cli.build_parser().parse_args(argv), stderr=err, stdout=out) == 1
    assert "already has 3 of the 3 files to write" in err.getvalue()
    err = io.StringIO()
    quiet = cli.build_parser().parse_args([*argv, "--overwrite"])
    assert export.run_from_args(quiet, stderr=err, stdout=out) == 0
    assert err.getvalue() == ""


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--logdir", "MISSING"], "error: logdir '.*MISSING' does not exist"),
        (["--run", "nothere"], r"error: no run matches --run 'nothere'; runs: \., eval/a$"),
        (["--tag", "nothere"], "error: no tag matches --tag 'nothere'; tags: _model, conv/kernel"),
        (["--tag", "("], r"error: --tag '\(' is not a valid regular expression"),
        (["--step", "7"], "error: step 7 was not logged for any matching tag; steps: 0, 5, 10$"),
        (["--step", "soon"], "error: --step must be an integer, 'latest' or 'all', got 'soon'"),
        (["--tag", "kernel", "--stat", "kurtosis"], r"needs moment orders \[1, 2, 3, 4\]"),
        (["--tag", "_model"], "hold stats only .*use --plot curves or --plot summary"),
        (["--plot", "curves", "--quantities", "noise"], r"unknown quantities \['noise'\]"),
    ],
)
def test_bad_input_one_line_error(logdir, tmp_path, capsys, extra, message):
    argv = ["export", "--logdir", logdir, "--out", str(tmp_path / "o"), "--format", "csv", *extra]
    if extra[0] == "--logdir":
        argv = ["export", "--out", str(tmp_path / "o"), "--logdir", str(tmp_path / extra[1])]
    code, out, err = _run(argv, capsys)
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tb-gradmom export: error: ")
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in err


def test_no_gradmom_data_and_subprocess_exit_code(tmp_path):
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tb_gradmom.cli",
            "export",
            "--logdir",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"tb-gradmom export: error: no Grad Moments data in logdir {str(tmp_path)!r}; log some "
        "with tb_gradmom.writers.summary or the Keras callback"
    ]


def test_missing_matplotlib_message(logdir, tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from tb_gradmom import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))"
    )
    base = [sys.executable, "-c", code, "export", "--logdir", logdir, "--out", str(tmp_path)]
    proc = subprocess.run([*base, "--format", "png"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "tb-gradmom export: error: tb_gradmom.viz.plot needs matplotlib, which is not installed: "
        'pip install "tb_gradmom[plots]"'
    )
    proc = subprocess.run([*base, "--format", "json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr  # numbers need no matplotlib
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_truncated_file_warns_in_one_line(logdir, tmp_path, capsys):
    import shutil

    from tb_gradmom.analysis import data

    src = data.list_runs(logdir)["."][0]
    dst = tmp_path / "logs"
    dst.mkdir()
    shutil.copy(src, dst / os.path.basename(src))
    with open(dst / os.path.basename(src), "r+b") as f:
        f.seek(0, 2)
        f.truncate(f.tell() - 3)
    code, _, err = _run(
        ["export", "--logdir", str(dst), "--out", str(tmp_path / "o"), "--format", "csv"], capsys
    )
    assert code == 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tb-gradmom export: warning: ")
    assert "truncated last record" in lines[0]


def test_demo_subcommand_calls_demo_main_lazily(monkeypatch):
    seen = {}
    fake = types.ModuleType("tb_gradmom.demo")

    def main(args):
        seen["args"] = args
        return 0

    fake.main = main
    monkeypatch.setitem(sys.modules, "tb_gradmom.demo", fake)
    # `from tb_gradmom import demo` reads the package's attribute first: set once an earlier
    # test imported the real module
    import tb_gradmom

    monkeypatch.setattr(tb_gradmom, "demo", fake, raising=False)
    assert cli.main(["demo", "--quick"]) == 0
    args = seen["args"]
    assert (args.logdir, args.steps, args.quick) == ("runs/demo", None, True)
    assert cli.main(["demo", "--logdir", "x", "--steps", "3"]) == 0
    assert (seen["args"].logdir, seen["args"].steps, seen["args"].quick) == ("x", 3, False)


# ----------------------------------------------------------------------------- python API


def test_heatmap_figure_draws_the_statistic(logdir, logged):
    from matplotlib import colors

    runs = plot.load_source(logdir)
    fig = plot.heatmap(runs, "dense/kernel", step=0, stat="variance", scale="log", cmap="magma")
    ax = fig.axes[0]
    (image,) = ax.collections
    moments, st = logged[(".", "dense/kernel")][0]
    expected = _variance(moments[0], moments[1], st[0])
    np.testing.assert_allclose(np.ma.filled(image.get_array(), np.nan), expected, rtol=1e-12)
    assert image.get_cmap().name.startswith("magma")
    assert isinstance(image.norm, colors.LogNorm)
    assert image.norm.vmin == pytest.approx(expected.min()) and image.norm.vmax == pytest.approx(
        expected.max()
    )
    assert ax.get_title().startswith(". · dense/kernel · step 0")
    assert "unbiased" in fig.axes[1].get_ylabel() and "n = 4" in fig.axes[1].get_ylabel()
    assert ax.get_xlabel() and ax.get_ylabel()


def test_heatmap_display_pooling_matches_reductions(logdir, logged):
    fig = plot.heatmap(logdir, "conv/kernel", stat="mean", max_cells=(4, 2))
    (image,) = fig.axes[0].collections
    m1 = logged[("eval/a", "conv/kernel")][STEPS[-1]][0][0]  # stored [6, 3]
    # Blocks of 2 x 2 over the 6 x 3 grid: 3 x 2 cells, the right column ragged.
    expected = np.array([[m1[r : r + 2, c : c + 2].mean() for c in (0, 2)] for r in (0, 2, 4)])
    np.testing.assert_allclose(image.get_array(), expected, rtol=1e-12)
    assert "shown as 2×2 block means" in " ".join(fig.axes[0].get_title().split())
    # Cells in element indices of the [12, 5] view: logged 2 x 2 blocks, shown 2 x 2 of those.
    coords = image.get_coordinates()
    np.testing.assert_array_equal(coords[:, 0, 1], [-0.5, 3.5, 7.5, 11.5])
    np.testing.assert_array_equal(coords[0, :, 0], [-0.5, 3.5, 4.5])
    assert fig.axes[0].get_ylim() == (11.5, -0.5)


def test_plot_api_errors(logdir):
    with pytest.raises(
        ValueError, match=r"step 3 was not logged for run '\.' tag 'dense/kernel'; steps: 0, 5, 10"
    ):
        plot.heatmap_data(logdir, "dense/kernel", step=3)
    with pytest.raises(ValueError, match="no tag 'nope' in any run"):
        plot.heatmap_data(logdir, "nope")
    with pytest.raises(ValueError, match="unknown colour map 'jet'"):
        plot.heatmap(logdir, "dense/kernel", cmap="jet")
    with pytest.raises(ValueError, match="holds stats only"):
        plot.heatmap_data(logdir, "_model")


def _outside_figure(fig) -> list[str]:
    """What a drawn figure puts outside itself (clipped in PNG/SVG): matplotlib's tight box of
    everything it draws, and each title, axis label and note text, against the figure's box."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height
    out = []
    tight = fig.get_tightbbox(renderer)  # inches, of what is drawn
    if tight.x0 < -0.01 or tight.y0 < -0.01 or tight.x1 > w / fig.dpi + 0.01:
        out.append(f"tight box {tight.bounds}")
    elif tight.y1 > h / fig.dpi + 0.01:
        out.append(f"tight box {tight.bounds}")
    texts = [*fig.texts]
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
    for t in texts:
        if t.get_visible() and t.get_text():
            b = t.get_window_extent(renderer)
            if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > w + 0.5 or b.y1 > h + 0.5:
                out.append(t.get_text())
    return out


def _noisy_logdir(root) -> str:
    """One run whose whole-model noise scale is negative (|G|^2 < 0) at some steps and NaN
    (n = 1) at one, written by `test_data._write_logdir`'s writer with the sums overridden."""
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(root))
    rng = np.random.default_rng(0)
    with writer.as_default():
        for step in range(12):
            n = 1.0 if step == 7 else 8.0
            # n = 1: no unbiased variance (NaN, as the writer logs it).
            sum_var = float(rng.uniform(1, 2)) if n > 1 else float("nan")
            # |m|^2 below tr(Sigma)/n on every third step: a negative estimate of |G|^2.
            sum_m2 = (1.5 if n == 1 else sum_var) / n * (0.5 if step % 3 == 0 else 4.0)
            sums = {
                "batch_size": n,
                "num_elements": 10.0,
                "sum_m2": sum_m2,
                "sum_var": sum_var,
                "sum_gsnr": 1.0,
                "gsnr_count": 10.0,
                "sum_m2_raw": sum_m2 + sum_var,
                "loss": 1.0,
                "learning_rate": 0.1,
            }
            values = [sums[f] for f in metadata.STATS_FIELDS]
            values += [0.0] * (len(metadata.HIST_EDGES) + 1)
            tf.summary.write(
                metadata.stats_tag(metadata.MODEL_TAG),
                np.asarray(values, np.float32),
                step=step,
                metadata=metadata.create_summary_metadata(
                    metadata.StatsContent(variable=metadata.MODEL_TAG)
                ),
            )
    writer.close()
    return str(root)


def test_curves_smooth_mark_and_keep_labels_inside(logdir, tmp_path):
    """Curves: the smoothed line (stats.smoothed) over faint raw values, noise-dominated and
    undefined steps marked (not dropped, also on a log axis), every label inside the figure
    and inside the SVG's view box."""
    root = _noisy_logdir(tmp_path / "noisy")
    d = plot.curves_data(root, quantities=["noise_scale"], smoothing=0.9)["runs"]["."]
    fields = {f: [] for f in metadata.STATS_FIELDS}
    for rec in data.load(root)["."]["_model"]:
        for f in fields:
            fields[f].append(rec.stats[f])
    want = stats.smoothed({f: np.asarray(v) for f, v in fields.items()}, 0.9)["noise_scale"]
    np.testing.assert_array_equal(d["noise_scale_smoothed"], want)
    raw = d["noise_scale"]
    noisy = int(np.sum(~np.isnan(raw) & ~(raw > 0)))
    assert noisy >= 3 and np.isnan(raw[7])
    for yscale in ("linear", "log"):
        fig = plot.curves(root, quantities=["noise_scale"], smoothing=0, yscale=yscale)
        ax = fig.axes[0]
        marks = {
            m: sum(len(line.get_xdata()) for line in ax.get_lines() if line.get_marker() == m)
            for m in ("v", "x")
        }
        assert marks == {"v": noisy, "x": 1}, (yscale, marks)
        assert "noise-dominated" in ax.get_xlabel()
        assert _outside_figure(fig) == [], yscale
    fig = plot.curves(root)  # every default quantity, smoothed: raw faint under the line
    ax = fig.axes[0]
    assert "smoothing 0.9" in ax.get_title()
    faint = [ln for ln in ax.get_lines() if ln.get_alpha() == 0.3]
    assert len(faint) == 1
    assert _outside_figure(fig) == []
    # The y range fits the smoothed line, not the raw spikes.
    line = [ln for ln in ax.get_lines() if ln.get_label() == "."][0]
    y = np.asarray(line.get_ydata(), dtype=float)
    y = y[np.isfinite(y)]
    lo, hi = ax.get_ylim()
    assert lo <= y.min() and hi >= y.max() and hi - lo < 3 * (y.max() - y.min()) + 1e-9


def _svg_text_outside(svg: bytes) -> list[str]:
    """Texts of an SVG whose anchor lies outside its view box (what a viewer clips)."""
    tree = ET.fromstring(svg)
    _, _, vw, vh = (float(v) for v in tree.get("viewBox").split())
    out = []
    for g in tree.iter("{http://www.w3.org/2000/svg}text"):
        m = re.search(r"translate\(([-0-9.e]+)[ ,]+([-0-9.e]+)\)", g.get("transform", ""))
        x = float(g.get("x", m.group(1) if m else 0))
        y = float(g.get("y", m.group(2) if m else 0))
        if not (0 <= x <= vw and 0 <= y <= vh):
            out.append("".join(g.itertext()))
    return out


def test_figures_keep_every_label_inside(logdir, tmp_path):
    """Heatmap (colour-bar title), histogram and curves: matplotlib's tight box of every text
    inside the figure, and every SVG text anchored inside the view box."""
    figs = {
        "heatmap": plot.heatmap(logdir, "dense/kernel", run="."),
        "histogram": plot.histogram(logdir, "dense/bias", step="all", stat="snr"),
        "curves": plot.curves(logdir, tag="_model"),
    }
    for name, fig in figs.items():
        assert _outside_figure(fig) == [], name
        buf = io.BytesIO()
        fig.savefig(buf, format="svg")
        assert _svg_text_outside(buf.getvalue()) == [], name


def test_signed_statistics_get_a_diverging_symmetric_map(logdir):
    fig = plot.heatmap(logdir, "dense/kernel", run=".", stat="mean")
    mesh = fig.axes[0].collections[0]
    assert mesh.get_cmap().name == "RdBu_r"
    lo, hi = mesh.norm.vmin, mesh.norm.vmax
    assert lo == -hi and hi > 0
    fig = plot.heatmap(logdir, "dense/kernel", run=".", stat="variance")
    assert fig.axes[0].collections[0].get_cmap().name == "viridis"
    fig = plot.heatmap(logdir, "dense/kernel", run=".", stat="mean", cmap="magma")
    assert fig.axes[0].collections[0].get_cmap().name == "magma"


def test_histogram_and_curves_figures(logdir):
    fig = plot.histogram(logdir, "dense/bias", step="all", stat="snr")
    ax = fig.axes[0]
    assert len(ax.patches) == len(STEPS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"step {s}" for s in STEPS]
    assert ax.get_ylabel() == "number of elements"
    fig = plot.curves(logdir, tag="_model", ema=0.5)
    assert len(fig.axes) == len(plot.CURVE_DEFAULTS) + 1
    assert fig.axes[-1].get_xlabel() == "step"
    fig = plot.summary(logdir, run=".")
    assert fig.axes[0].get_title() == ". · latest step · variance unbiased"


# ----------------------------------------------------------------------------- safety


def _csv_export(logdir, out, *extra):
    return ["export", "--logdir", logdir, "--out", str(out), "--format", "csv", *extra]


def test_export_refuses_to_overwrite_unless_asked(logdir, tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main(_csv_export(logdir, out, "--quiet")) == 0
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    victim = out / sorted(written)[0]
    victim.write_text("mine")
    capsys.readouterr()
    code, stdout, err = _run(_csv_export(logdir, out), capsys)
    assert code == 1 and stdout == ""
    assert re.fullmatch(
        r"tb-gradmom export: error: --out '.*' already has 3 of the 3 files to write "
        r"\(.*\); nothing was written; pass --overwrite to replace them\n",
        err,
    ), err
    assert victim.read_text() == "mine"  # nothing touched
    code, _, _ = _run(_csv_export(logdir, out, "--overwrite"), capsys)
    assert code == 0 and victim.read_bytes() == written[victim.name]
    assert sorted(p.name for p in out.iterdir()) == sorted(written)  # no temporary left


def test_export_never_follows_a_symlink_out_of_out(logdir, tmp_path, capsys):
    out, outside = tmp_path / "o", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    target = outside / "precious.txt"
    target.write_text("keep")
    name = encode.file_name(["eval/a", "conv/kernel", "step10", "variance"], "csv")
    (out / name).symlink_to(target)
    dangling = encode.file_name(["dense/kernel", "step10", "variance"], "csv")
    (out / dangling).symlink_to(outside / "does-not-exist.txt")
    code, _, err = _run(_csv_export(logdir, out), capsys)
    assert code == 1 and "already has 2 of the 3 files" in err  # a dangling link counts too
    assert target.read_text() == "keep" and not (outside / "does-not-exist.txt").exists()
    code, _, err = _run(_csv_export(logdir, out, "--overwrite"), capsys)
    assert code == 0, err
    # The links were replaced by files; their targets were not written.
    assert not (out / name).is_symlink() and (out / name).read_text().startswith("row,col,")
    assert not (out / dangling).is_symlink()
    assert target.read_text() == "keep" and sorted(p.name for p in outside.iterdir()) == [
        "precious.txt"
    ]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--bins", "3000000"], "--bins must be an integer from 1 to 1000, got 3000000"),
        (["--bins", "0"], "--bins must be an integer from 1 to 1000, got 0"),
        (["--dpi", "100000"], "--dpi must be an integer from 1 to 1200, got 100000"),
        (["--ema", "1.5", "--plot", "curves"], r"--ema must be a number in \[0, 1\), got 1.5"),
    ],
)
def test_export_options_are_bounded(logdir, tmp_path, capsys, extra, message):
    out = tmp_path / "o"
    code, _, err = _run(_csv_export(logdir, out, "--plot", "histogram", *extra), capsys)
    assert code == 1 and re.search(message, err), err
    assert not out.exists() or not list(out.iterdir())


def test_bins_are_capped_in_reductions_and_plot(logdir):
    from tb_gradmom.analysis import reductions

    assert reductions.MAX_BINS == 1000
    reductions.histogram(np.arange(5.0), bins=1000)
    with pytest.raises(ValueError, match="<= 1000"):
        reductions.histogram(np.arange(5.0), bins=1001)
    with pytest.raises(ValueError, match="<= 1000"):
        plot.histogram_data(logdir, "conv/kernel", bins=3_000_000)


def test_long_names_are_shortened_and_stay_distinct():
    a = encode.file_name(["run", "x" * 400 + "a", "step1", "variance"], "png")
    b = encode.file_name(["run", "x" * 400 + "b", "step1", "variance"], "png")
    assert len(a) <= 255 and len(b) <= 255 and a != b
    assert a.startswith("run-xxxx") and a.endswith(".png")
    assert encode.file_name(["run", "x" * 400], "csv", max_bytes=40).__len__() <= 40
    short = encode.file_name(["run", "dense/kernel"], "csv")
    assert short == "run-dense_kernel.csv"  # short names are unchanged


def test_export_of_a_tag_longer_than_a_file_name(tmp_path, capsys):
    """A 1000-character tag (and one that differs only at its end): whole files, distinct."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_robustness as tr

    tags = ["layer/" + "w" * 1000 + "/a", "layer/" + "w" * 1000 + "/b"]
    events = [e for t in tags for e in tr.variable_events("r", t)]
    tr._write(str(tmp_path / "logs" / "r"), events)
    out = tmp_path / "o"
    code, _, err = _run(_csv_export(str(tmp_path / "logs"), out, "--quiet"), capsys)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 2 and all(len(n) <= 255 for n in names)
    for n in names:
        assert (out / n).read_text().startswith("row,col,variance")


def test_export_writes_a_figure_whole_or_not_at_all(logdir, tmp_path, monkeypatch, capsys):
    """A failure while a file is written leaves neither a partial file nor a temporary one;
    the files written before it are complete."""
    calls = []
    real = export._render

    def failing(job, runs, opts, fmt, dpi):
        write = real(job, runs, opts, fmt, dpi)
        calls.append(job)
        if len(calls) < 2:
            return write

        def half(f):
            f.write(b"row,col,var")  # a partial file...
            raise OSError(28, "No space left on device")  # ...then the disk fills up

        return half

    monkeypatch.setattr(export, "_render", failing)
    out = tmp_path / "o"
    code, _, err = _run(_csv_export(logdir, out, "--quiet"), capsys)
    assert code == 1 and "No space left on device" in err
    names = [p.name for p in out.iterdir()]
    assert len(names) == 1 and not names[0].startswith(".")  # the first file, no temporary
    assert (out / names[0]).read_bytes().count(b"\r\n") == 5  # header and 4 rows
