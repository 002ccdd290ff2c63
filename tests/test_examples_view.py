"""The per-example view's reductions (`analysis.examples`) against numpy on a real log.

The log (`tests/examples_logdir.py`) has each step's batch twice: uncapped (``full/_examples``,
every example) and capped (``capped/_examples``, 24 of 96 rows). The uncapped records are
checked against plain numpy (``np.quantile``, ``np.histogram``, a per-id loop), and the capped
ones against the uncapped batch they were cut from.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math

import numpy as np
import pytest

from tb_gradmom.analysis import data
from tb_gradmom.analysis import examples as ex
from tests import examples_logdir as log


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    d = tmp_path_factory.mktemp("examples")
    log.write_examples_run(d / "ex")
    got = data.load_examples(d)["ex"]
    return got["full/_examples"], got["capped/_examples"]


def _g(rec, column="model"):
    if column == "model":
        sq = rec.model
    else:
        sq = {**rec.layers, **rec.variables}[column]
    return np.sqrt(np.maximum(sq, 0))


def test_the_log_is_what_the_tests_assume(records):
    full, capped = records
    assert [r.step for r in full] == list(log.STEPS) == [r.step for r in capped]
    for f, c in zip(full, capped):
        assert f.batch_size == len(f.model) == log.BATCH
        assert c.batch_size == log.BATCH and len(c.model) == log.CAP
        np.testing.assert_allclose(c.model, f.model[c.positions], rtol=1e-14)  # two sums
    assert ex.columns(full) == ["model", "full/hidden", "full/out"]


def test_uncapped_quantiles_are_numpys(records):
    full, _ = records
    for column in ex.columns(full):
        q = ex.quantiles(full, column)
        assert q["steps"] == list(log.STEPS) and not any(q["capped"])
        for i, rec in enumerate(full):
            g = _g(rec, column)
            want = np.quantile(g, ex.QUANTILES)
            got = [q["quantiles"][k][i] for k in ex.QUANTILE_KEYS]
            np.testing.assert_allclose(got, want, rtol=1e-14, err_msg=column)
            assert q["max"][i] == g.max()
            np.testing.assert_allclose(q["mean_sq"][i], np.mean(g**2), rtol=1e-14)


def test_capped_rows_stand_for_their_rank_strata(records):
    full, capped = records
    k = log.CAP // 4
    for f, c in zip(full, capped):
        w = ex.row_weights(c)
        assert w.sum() == f.batch_size
        # descending rank of every example of the batch, ties in batch order
        rank = np.empty(f.batch_size, dtype=np.int64)
        rank[np.argsort(-f.model, kind="stable")] = np.arange(f.batch_size)
        kept = np.sort(rank[c.positions])
        assert list(kept[:k]) == list(range(k)) and list(kept[-k:]) == list(
            range(f.batch_size - k, f.batch_size)
        )
        # a kept row weighs the ranks from it to the next kept one (1 in the two quarters)
        want_by_rank = np.diff(np.append(kept, f.batch_size))
        want = want_by_rank[np.searchsorted(kept, rank[c.positions])]
        np.testing.assert_array_equal(w, want)


def test_capped_quantiles_exact_in_the_kept_quarters_close_between(records):
    full, capped = records
    qf, qc = ex.quantiles(full), ex.quantiles(capped)
    n, k = log.BATCH, log.CAP // 4
    assert all(qc["capped"])
    for key, level in zip(ex.QUANTILE_KEYS, ex.QUANTILES):
        h = level * (n - 1)
        exact = math.ceil(h) < k or math.floor(h) >= n - k
        for i, rec in enumerate(full):
            if exact:
                assert qc["quantiles"][key][i] == pytest.approx(qf["quantiles"][key][i], 1e-14)
            else:  # within a stratum of ranks (at most `width` ranks) of the true quantile
                g = np.sort(_g(rec))
                width = int(ex.row_weights(capped[i]).max())
                lo, hi = g[max(0, math.floor(h) - width)], g[min(n - 1, math.ceil(h) + width)]
                assert lo <= qc["quantiles"][key][i] <= hi, (key, i)
    np.testing.assert_allclose(qc["max"], qf["max"], rtol=1e-14)


def test_histogram_is_numpys_on_log_bins(records):
    full, capped = records
    for column in ("model", "full/out"):
        h = ex.histogram(full, step=10, column=column, per_decade=5)
        g = _g(full[2], column)
        e = np.asarray(h["edges"])
        np.testing.assert_allclose(np.diff(np.log10(e[1:-1])), 0.2, rtol=1e-9)
        assert e[0] <= g[g > 0].min() and e[-1] >= g.max()
        want, _ = np.histogram(g[g > 0], bins=e)
        np.testing.assert_array_equal(h["counts"], want)
        assert h["zeros"] == np.sum(g == 0) and h["step"] == 10
    # latest step by default; a capped step's counts add up to its batch
    hc = ex.histogram(capped)
    assert hc["step"] == log.STEPS[-1] and hc["capped"]
    assert sum(hc["counts"]) + hc["zeros"] == log.BATCH


def _numpy_outliers(records, threshold):
    """Per id: [outlier steps, seen, ratios, last loss], one pass per step, plain numpy."""
    out: dict = {}
    for rec in records:
        g = _g(rec)
        ratio = g / np.median(g)
        for j, i in enumerate(rec.ids):
            e = out.setdefault(int(i), [0, 0, [], None, []])
            e[0] += bool(ratio[j] > threshold)
            e[1] += 1
            e[2].append(ratio[j])
            e[3] = rec.losses[j]
            e[4].append(rec.step)
    return {i: e for i, e in out.items() if e[0]}


@pytest.mark.parametrize("threshold", [ex.DEFAULT_OUTLIER_RATIO, 3.0])
def test_outliers_by_id_are_a_per_step_loop(records, threshold):
    full, _ = records
    got = ex.outliers(full, threshold=threshold)
    want = _numpy_outliers(full, threshold)
    assert got["keyed_by"] == "id" and got["total"] == len(want)
    assert {r["id"] for r in got["rows"]} == set(want)
    for r in got["rows"]:
        n_out, seen, ratios, last_loss, steps = want[r["id"]]
        assert (r["outlier_steps"], r["seen"]) == (n_out, seen)
        assert r["max_ratio"] == pytest.approx(max(ratios), rel=1e-14)
        assert r["max_step"] == steps[int(np.argmax(ratios))]
        assert r["mean_ratio"] == pytest.approx(np.mean(ratios), rel=1e-14)
        assert r["last_loss"] == last_loss and r["last_step"] == steps[-1]
    key = [(-r["outlier_steps"], -r["max_ratio"]) for r in got["rows"]]
    assert key == sorted(key), "ranked by outlier steps, then max ratio"
    if threshold == ex.DEFAULT_OUTLIER_RATIO:
        # the corrupted targets are what the table finds, and nothing else
        assert {r["id"] for r in got["rows"]} == set(log.CORRUPTED)
    assert ex.outliers(full, threshold=threshold, limit=2)["rows"] == got["rows"][:2]


def test_capped_outliers_keep_the_corrupted_ids(records):
    _, capped = records
    got = ex.outliers(capped)
    assert {r["id"] for r in got["rows"]} == set(log.CORRUPTED)
    # the largest quarter is always kept: every corrupted id is seen at every step
    assert all(r["seen"] == len(log.STEPS) for r in got["rows"])


def test_outliers_without_ids_are_keyed_by_position(records):
    full, _ = records
    no_ids = [data.ExamplesRecord(**{**r.__dict__, "ids": None}) for r in full]
    got = ex.outliers(no_ids)
    assert got["keyed_by"] == "position"
    want = set()
    for rec in full:
        g = _g(rec)
        want |= set(rec.positions[g / np.median(g) > ex.DEFAULT_OUTLIER_RATIO].tolist())
    assert {r["id"] for r in got["rows"]} == want


def test_clipped_fraction_is_numpys(records):
    full, capped = records
    c = 30.0
    got = ex.clipped(full, c)
    want = [np.mean(_g(r) > c) for r in full]
    np.testing.assert_allclose(got["fraction"], want, rtol=1e-15)
    assert got["clipped"] == [float(np.sum(_g(r) > c)) for r in full]
    # a clipping norm among the kept largest quarter: the capped count is exact
    for f, cr in zip(full, capped):
        g = np.sort(_g(f))
        between = (g[-4] + g[-3]) / 2
        assert ex.clipped([cr], between)["clipped"] == [3.0]


def test_csv_tables_hold_the_payloads(records):
    full, _ = records
    q = ex.quantiles(full, "full/hidden")
    rows = list(csv.reader(io.StringIO(ex.quantiles_csv(q))))
    assert rows[0][:4] == ["step", "batch_size", "rows", "capped"]
    assert [int(r[0]) for r in rows[1:]] == q["steps"]
    col = rows[0].index("p50")
    assert [float(r[col]) for r in rows[1:]] == q["quantiles"]["p50"]
    o = ex.outliers(full)
    rows = list(csv.reader(io.StringIO(ex.outliers_csv(o))))
    assert rows[0] == list(ex.OUTLIER_FIELDS)
    assert [int(r[0]) for r in rows[1:]] == [r["id"] for r in o["rows"]]
    c = ex.clipped(full, 12.5)
    rows = list(csv.reader(io.StringIO(ex.clipped_csv(c))))
    assert [float(r[-1]) for r in rows[1:]] == c["fraction"]


def test_errors_name_the_argument_and_the_fix(records):
    full, _ = records
    with pytest.raises(ValueError, match=r"column 'dense' is not logged at step 0.*'full/hidden'"):
        ex.quantiles(full, "dense")
    with pytest.raises(ValueError, match="step 7 has no per-example norms; the logged steps"):
        ex.histogram(full, step=7)
    with pytest.raises(ValueError, match="threshold must be a positive finite number, got -1"):
        ex.outliers(full, threshold=-1)
    with pytest.raises(ValueError, match="clip_norm must be a positive number, got 'x'"):
        ex.clipped(full, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per_decade must be an integer from 1 to 100"):
        ex.histogram(full, per_decade=0)


# ------------------------------------------------------------------ the plugin's routes
# Through TensorBoard's own app (flags handled by the plugin loader) over the Python loader and
# over RustBoard (`--load_fast=true`'s data server); references are numpy on the records
# `data.load_examples` reads from the event files directly.

P = "/data/plugin/gradmom/examples/"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("examples_plugin")
    log.write_examples_run(d / "ex")
    log.write_other_runs(d)
    return d


def _rustboard_app(logdir):
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.data import server_ingester
    from tensorboard.plugins.core import core_plugin
    from tensorboard.util import grpc_util
    from werkzeug.test import Client

    from tb_gradmom.plugin.loader import GradMomentsPluginLoader

    try:
        binary = server_ingester.get_server_binary()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"tensorboard-data-server unavailable: {e}")
    loaders = [core_plugin.CorePluginLoader(), GradMomentsPluginLoader()]
    tb = program.TensorBoard(plugins=loaders, assets_zip_provider=lambda: None)
    tb.configure(["", "--logdir", str(logdir), "--load_fast=true"])
    ingester = server_ingester.SubprocessServerDataIngester(
        binary,
        str(logdir),
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin=tb.flags.samples_per_plugin,
    )
    ingester.start()
    app = application.TensorBoardWSGIApp(tb.flags, loaders, ingester.data_provider, None, None)
    return Client(app), ingester


@pytest.fixture(scope="module", params=["python", "rustboard"])
def client(request, logdir):
    import time

    from tests.test_plugin import make_app

    if request.param == "python":
        yield make_app(str(logdir))[0]
        return
    c, ingester = _rustboard_app(logdir)
    deadline = time.time() + 120
    while time.time() < deadline:  # RustBoard loads asynchronously
        r = c.get(P + "tags")
        runs = json.loads(r.get_data(as_text=True))["runs"] if r.status_code == 200 else {}
        if runs.get("ex", {}).get("capped/_examples", {}).get("max_step") == log.STEPS[-1]:
            break
        time.sleep(0.5)
    yield c
    stdin = getattr(ingester, "_stdin_handle", None)  # the server exits when stdin closes
    if stdin is not None:
        stdin.close()


def _get(c, route, status=200, **params):
    r = c.get(P + route, query_string=params, headers={"Accept-Encoding": "gzip"})
    body = r.get_data()
    if r.headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    text = body.decode("utf-8")
    assert r.status_code == status, (route, params, r.status_code, text)
    return json.loads(text) if status == 200 else text


@pytest.fixture(scope="module")
def reference(logdir):
    with pytest.warns(data.DataWarning):  # the bad tag and step of runs `bad` and `only`
        return data.load_examples(logdir)


def test_tags_list_every_run_with_norms_also_without_moments(client):
    d = _get(client, "tags")
    assert sorted(d["runs"]) == ["bad", "ex", "only"]
    assert sorted(d["runs"]["ex"]) == ["capped/_examples", "full/_examples"]
    full = d["runs"]["ex"]["full/_examples"]
    assert full["group"] == "full" and full["ids"] == "int64" and full["max_examples"] == 1024
    assert full["columns"] == ["model", "full/hidden", "full/out"]
    assert full["layers"] == ["full/hidden", "full/out"] and full["variables"] == []
    assert d["runs"]["only"]["_examples"]["ids"] == "string"
    assert list(d["runs"]["bad"]) == ["good/_examples"]
    assert "not valid JSON" in d["skipped"]["bad"]["_examples"]
    assert d["view"]["keys"] == list(ex.QUANTILE_KEYS)
    assert d["view"]["default_threshold"] == ex.DEFAULT_OUTLIER_RATIO
    # answered gzip-compressed, like /series
    r = client.get(
        P + "quantiles", query_string={"run": "only"}, headers={"Accept-Encoding": "gzip"}
    )
    assert (
        r.headers["Content-Encoding"] == "gzip" and r.headers["Content-Type"] == "application/json"
    )
    # the moments' listing is unchanged: `only` has no moments
    r = client.get("/data/plugin/gradmom/tags")
    assert "only" not in json.loads(r.get_data(as_text=True))["runs"]


def test_quantiles_route_is_numpy_on_the_event_files(client, reference):
    for tag in ("full/_examples", "capped/_examples"):
        for column in ("model", "out"):
            asked = column if column == "model" else tag.split("/")[0] + "/" + column
            d = _get(client, "quantiles", run="ex", tag=tag, column=asked)
            recs = reference["ex"]["full/_examples"]  # the whole batch
            assert d["steps"] == list(log.STEPS) and d["column"] == asked
            assert all(d["capped"]) == (tag == "capped/_examples")
            for i, rec in enumerate(recs):
                g = _g(rec, column if column == "model" else "full/" + column)
                want = np.quantile(g, ex.QUANTILES)
                got = [d["quantiles"][k][i] for k in ex.QUANTILE_KEYS]
                if tag == "full/_examples":
                    np.testing.assert_allclose(got, want, rtol=1e-14)
                elif column == "model":  # the kept quarters' quantiles and the max are exact
                    np.testing.assert_allclose(
                        np.array(got)[[0, 1, 5, 6]], want[[0, 1, 5, 6]], 1e-14
                    )
                np.testing.assert_allclose(d["max"][i], g.max(), rtol=1e-14)


def test_outliers_route_finds_the_corrupted_ids(client, reference):
    d = _get(client, "outliers", run="ex", tag="full/_examples")
    want = _numpy_outliers(reference["ex"]["full/_examples"], ex.DEFAULT_OUTLIER_RATIO)
    assert {r["id"] for r in d["rows"]} == set(want) == set(log.CORRUPTED)
    for r in d["rows"]:
        assert r["outlier_steps"] == want[r["id"]][0] == len(log.STEPS)
        assert r["last_loss"] == pytest.approx(want[r["id"]][3], rel=1e-15)
    assert (
        _get(client, "outliers", run="ex", tag="full/_examples", limit=2)["rows"] == d["rows"][:2]
    )
    loose = _get(client, "outliers", run="ex", tag="full/_examples", threshold=3)
    assert loose["threshold"] == 3 and loose["total"] >= d["total"]


def test_clip_and_histogram_routes_are_numpys(client, reference):
    recs = reference["ex"]["full/_examples"]
    d = _get(client, "clip", run="ex", tag="full/_examples", clip_norm=25)
    np.testing.assert_allclose(d["fraction"], [np.mean(_g(r) > 25) for r in recs], rtol=1e-15)
    h = _get(client, "histogram", run="ex", tag="full/_examples", step=15, per_decade=4)
    g = _g(recs[3])
    want, _ = np.histogram(g[g > 0], bins=np.asarray(h["edges"]))
    assert h["step"] == 15 and h["counts"] == want.tolist()
    assert _get(client, "histogram", run="ex", tag="full/_examples")["step"] == log.STEPS[-1]


def test_examples_only_run_with_string_ids(client):
    d = _get(client, "quantiles", run="only")
    assert d["steps"] == [1, 2], "step 3's tensor has the wrong width: skipped"
    for i, sq in enumerate(log.ONLY_NORMS):
        np.testing.assert_allclose(
            [d["quantiles"][k][i] for k in ex.QUANTILE_KEYS], np.quantile(np.sqrt(sq), ex.QUANTILES)
        )
    o = _get(client, "outliers", run="only", threshold=3)
    # step 2: norms 4, 0, 1, 20, median 2.5: "d" (ratio 8) is an outlier; step 1 has none
    assert [(r["id"], r["outlier_steps"], r["seen"]) for r in o["rows"]] == [("d", 1, 2)]
    assert o["rows"][0]["max_ratio"] == pytest.approx(8.0)
    assert _get(client, "quantiles", run="only", column="dense")["max"] == [
        math.sqrt(4.5),  # the column is half the model's norms
        math.sqrt(200.0),
    ]


def test_route_errors_name_the_parameter(client):
    assert "run 'nope' has no per-example norms" in _get(client, "quantiles", 404, run="nope")
    text = _get(client, "quantiles", 404, run="bad", tag="_examples")
    assert "not valid JSON" in text
    text = _get(client, "quantiles", 400, run="ex", tag="full/_examples", column="dense")
    assert "column 'dense' is not logged" in text and "full/hidden" in text
    assert "`clip_norm`" in _get(client, "clip", 400, run="ex", tag="full/_examples")
    text = _get(client, "clip", 400, run="ex", tag="full/_examples", clip_norm="x")
    assert "`clip_norm` must be a number" in text
    text = _get(client, "histogram", 400, run="ex", tag="full/_examples", step=7)
    assert "step 7 has no per-example norms" in text
    assert "`threshold`" in _get(
        client, "outliers", 400, run="ex", tag="full/_examples", threshold=0
    )
    # the other runs are unaffected
    assert _get(client, "quantiles", run="bad", tag="good/_examples")["max"] == [3.0]


# ------------------------------------------------------------- gradmom.plot and the export


def test_plot_figures_draw_the_analysis_numbers(logdir, reference):
    pytest.importorskip("matplotlib")
    from tb_gradmom.viz import plot

    recs = reference["ex"]["full/_examples"]
    d = plot.norms_data(reference, run="ex", tag="full/_examples")
    assert d["quantiles"] == ex.quantiles(recs)["quantiles"]
    with pytest.warns(data.DataWarning):  # a logdir is read: runs `bad` and `only` warn
        fig = plot.norms(logdir, run="ex", tag="full/_examples")
    ax = fig.axes[0]
    median, top = ax.lines[0], ax.lines[1]
    np.testing.assert_allclose(median.get_ydata(), [np.median(_g(r)) for r in recs], rtol=1e-12)
    np.testing.assert_allclose(top.get_ydata(), [_g(r).max() for r in recs], rtol=1e-12)
    # the 90 % band's polygon spans numpy's 5 % and 95 % quantiles at each step
    band = ax.collections[1].get_paths()[0].vertices
    for s, r in zip(log.STEPS, recs):
        ys = band[np.isclose(band[:, 0], s), 1]
        lo, hi = np.quantile(_g(r), [0.05, 0.95])
        assert np.isclose(ys, lo, rtol=1e-12).any() and np.isclose(ys, hi, rtol=1e-12).any()
    assert ax.get_yscale() == "log"
    fig = plot.outliers(reference, run="ex", tag="full/_examples")
    texts = [c.get_text().get_text() for c in fig.axes[0].tables[0].get_celld().values()]
    assert {int(t) for t in texts if t.isdigit() and int(t) in log.CORRUPTED} == set(log.CORRUPTED)
    fig = plot.clipped(reference, 25.0, run="ex", tag="full/_examples")
    np.testing.assert_allclose(
        fig.axes[0].lines[0].get_ydata(), [np.mean(_g(r) > 25) for r in recs], rtol=1e-15
    )
    with pytest.raises(ValueError, match=r"several per-example tags .*; pass tag="):
        plot.norms_data(reference, run="ex")
    with pytest.raises(ValueError, match="run 'nope' has no per-example norms"):
        plot.norms_data(reference, run="nope", tag="_examples")


def test_export_writes_the_tabs_numbers(logdir, reference, tmp_path, capsys):
    from tb_gradmom import cli

    recs = reference["ex"]["full/_examples"]
    base = ["export", "--logdir", str(logdir), "--run", "^ex$", "--tag", "full", "--quiet"]
    assert cli.main([*base, "--plot", "norms", "--format", "csv", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.csv")
    assert path.name == "ex-full__examples-model-norm_quantiles.csv"
    rows = list(csv.DictReader(path.open()))
    assert [int(r["step"]) for r in rows] == list(log.STEPS)
    for key, level in zip(ex.QUANTILE_KEYS, ex.QUANTILES):
        want = [np.quantile(_g(r), level) for r in recs]
        np.testing.assert_allclose([float(r[key]) for r in rows], want, rtol=1e-14)
    out = tmp_path / "o"
    assert cli.main([*base, "--plot", "outliers", "--format", "csv", "--out", str(out)]) == 0
    rows = list(csv.DictReader(next(out.glob("*.csv")).open()))
    assert sorted(int(r["id"]) for r in rows) == sorted(log.CORRUPTED)
    assert all(int(r["outlier_steps"]) == len(log.STEPS) for r in rows)
    args = ["--plot", "clipped", "--clip-norm", "25", "--column", "full/out", "--format", "json"]
    assert cli.main([*base, *args, "--out", str(out)]) == 0
    (path,) = out.glob("*clipped*.json")
    assert path.name == "ex-full__examples-full_out-clipped_C25.json"
    got = json.loads(path.read_text())
    want = [np.mean(_g(r, "full/out") > 25) for r in recs]
    np.testing.assert_allclose(got["fraction"], want, rtol=1e-15)
    if __import__("importlib").util.find_spec("matplotlib"):
        assert cli.main([*base, "--plot", "norms", "--format", "png", "--out", str(out)]) == 0
        assert next(out.glob("*.png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    # errors: one line naming the option and the fix
    assert cli.main([*base, "--plot", "clipped", "--format", "csv", "--out", str(out)]) == 1
    assert "--plot clipped needs --clip-norm C" in capsys.readouterr().err
    assert cli.main([*base, "--plot", "norms", "--column", "x", "--out", str(out / "x")]) == 1
    err = capsys.readouterr().err
    assert "column 'x' is not logged" in err and "every one of the 1 plots was skipped" in err
    bad = ["export", "--logdir", str(logdir), "--run", "nothing", "--plot", "norms"]
    assert cli.main([*bad, "--out", str(out)]) == 1
    assert "no per-example norms match --run 'nothing'" in capsys.readouterr().err


def test_rustboard_reads_at_most_its_reply_budget(logdir, monkeypatch):
    """Over gRPC a series is read with at most GRPC_READ_BUDGET bytes of the largest possible
    steps (RustBoard's replies are capped at 256 MiB); the payload says so. A budget of three
    steps of `full/_examples` (1024 rows x 6 columns + ids): three steps, the last among them."""
    from tb_gradmom.plugin import _examples

    per_step = 8 * 1024 * (4 + 2 + 1)
    monkeypatch.setattr(_examples, "GRPC_READ_BUDGET", 3 * per_step)
    c, ingester = _rustboard_app(logdir)
    try:
        import time

        deadline = time.time() + 120
        while time.time() < deadline:
            r = c.get(P + "tags")
            runs = json.loads(r.get_data(as_text=True))["runs"] if r.status_code == 200 else {}
            if runs.get("ex", {}).get("full/_examples", {}).get("max_step") == log.STEPS[-1]:
                break
            time.sleep(0.5)
        d = _get(c, "quantiles", run="ex", tag="full/_examples")
        assert len(d["steps"]) == 3 and d["steps"][-1] == log.STEPS[-1]
        assert set(d["steps"]) <= set(log.STEPS) and d["max_steps_read"] == 3
        # the Python loader reads every step and says nothing
        from tests.test_plugin import make_app

        py = _get(make_app(str(logdir))[0], "quantiles", run="ex", tag="full/_examples")
        assert py["steps"] == list(log.STEPS) and "max_steps_read" not in py
    finally:
        stdin = getattr(ingester, "_stdin_handle", None)
        if stdin is not None:
            stdin.close()
