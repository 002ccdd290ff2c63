"""The per-example view's reductions (`analysis.examples`) against numpy on a real log.

The log (`tests/examples_logdir.py`) has each step's batch twice: uncapped (``full/_examples``,
every example) and capped (``capped/_examples``, 24 of 96 rows). The uncapped records are
checked against plain numpy (``np.quantile``, ``np.histogram``, a per-id loop), and the capped
ones against the uncapped batch they were cut from.
"""

from __future__ import annotations

import csv
import io
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
