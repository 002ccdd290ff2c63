"""The tab's per-example section in real Chromium over a real TensorBoard (end to end).

The log is `tests/examples_logdir.py`'s: run ``ex`` (a float64 training loop with six corrupted
targets, each step logged uncapped as ``full/_examples`` and capped as ``capped/_examples``),
run ``only`` (per-example norms with string ids and no moments) and run ``bad`` (a corrupt
examples tag beside a good one). What the page draws (the fan chart's bands, median and max,
the histogram's bars, the outlier table's ids and counts, the clipped fraction: read from the
SVG's ``data-values`` and the table's cells) is checked against numpy on the records
`data.load_examples` reads from the event files. Screenshots (1024 and 1440 px, light and dark)
go to ``artifacts/screenshots/examples_*.png``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tb_gradmom.analysis import data
from tb_gradmom.analysis import examples as ex
from tests import examples_logdir as log
from tests.test_frontend_browser import (  # noqa: F401 - `browser` is a fixture
    ROOT,
    SHOTS,
    Page,
    _tensorboard_command,
    browser,
    free_port,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("examples_browser")
    log.write_examples_run(d / "ex")
    log.write_other_runs(d)
    return d


@pytest.fixture(scope="module")
def reference(logdir):
    with pytest.warns(data.DataWarning):  # run `bad`'s corrupt tag, run `only`'s bad step
        return data.load_examples(logdir)


def _serve(logdir, tmp_path_factory, ready):
    """TensorBoard on ``logdir`` until ``ready(examples/tags' runs)``; yields its base URL."""
    port = free_port()
    out = (tmp_path_factory.mktemp("tb") / "tensorboard.log").open("w")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        _tensorboard_command(logdir, port), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, f"tensorboard exited: see {out.name}"
            try:
                url = base + "/data/plugin/gradmom/examples/tags"
                with urllib.request.urlopen(url, timeout=30) as r:
                    if ready(json.load(r)["runs"]):
                        break
            except (OSError, ValueError):
                pass
            assert time.time() < deadline, f"tensorboard did not serve the norms: see {out.name}"
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


@pytest.fixture(scope="module")
def tensorboard(logdir, tmp_path_factory):
    def ready(runs):
        steps = [runs.get("ex", {}).get(t, {}).get("max_step") for t in log_tags()]
        return steps == [log.STEPS[-1]] * 2 and "only" in runs

    yield from _serve(logdir, tmp_path_factory, ready)


def log_tags():
    return ["capped/_examples", "full/_examples"]


@pytest.fixture
def page(browser, tensorboard):  # noqa: F811 - `browser` is the imported fixture
    p = Page(browser, tensorboard)
    yield p
    p.close()
    assert not p.errors, f"console errors: {p.errors}"
    assert not p.dialogs, f"a dialog fired: {p.dialogs}"


def _open(p: Page, hash_: str = ""):
    page = p.page
    page.goto(p.base + "/data/plugin_entry.html?name=gradmom" + hash_)
    page.wait_for_function(
        "() => window.gradmom && window.gradmom.pending !== undefined", timeout=60000
    )
    _settle(p)
    page.wait_for_selector("#examples-card:not([hidden]) .ex-median", timeout=60000)
    return page


def _settle(p: Page):
    p.page.evaluate("() => window.gradmom.pending")
    p.page.wait_for_timeout(150)


def _choose(p: Page, selector: str, value: str):
    p.page.select_option(selector, value)
    _settle(p)


def _values(page, selector: str):
    return json.loads(page.get_attribute(selector, "data-values"))


def _g(rec, column="model"):
    sq = rec.model if column == "model" else {**rec.layers, **rec.variables}[column]
    return np.sqrt(np.maximum(sq, 0))


def test_fan_chart_draws_numpys_quantiles(page, reference):
    pg = _open(page)
    _choose(page, "select.ex-tag", "full/_examples")
    assert "No step capped: every quantile is exact." in pg.text_content(".ex-exactness")
    recs = reference["ex"]["full/_examples"]
    want = np.array([np.quantile(_g(r), ex.QUANTILES) for r in recs])  # [steps, 7]
    for label, lo, hi in ex.BANDS:
        got = np.array(_values(pg, f'path.ex-band[data-band="{label}"]'))
        assert got[:, 0].tolist() == list(log.STEPS)
        np.testing.assert_allclose(got[:, 1], want[:, ex.QUANTILE_KEYS.index(lo)], rtol=1e-12)
        np.testing.assert_allclose(got[:, 2], want[:, ex.QUANTILE_KEYS.index(hi)], rtol=1e-12)
    median = np.array(_values(pg, "path.ex-median"))
    np.testing.assert_allclose(median[:, 1], [np.median(_g(r)) for r in recs], rtol=1e-12)
    top = np.array(_values(pg, "path.ex-max"))
    np.testing.assert_allclose(top[:, 1], [_g(r).max() for r in recs], rtol=1e-12)
    # the CSV export holds the same numbers, in full precision
    with pg.expect_download() as dl:
        pg.click(".ex-fan .export button:text('CSV')")
    rows = list(csv.DictReader(io.StringIO(open(dl.value.path()).read())))
    assert [int(r["step"]) for r in rows] == list(log.STEPS)
    for j, key in enumerate(ex.QUANTILE_KEYS):
        np.testing.assert_allclose([float(r[key]) for r in rows], want[:, j], rtol=1e-14)
    # a layer: the same drawn from its own column
    _choose(page, "select.ex-column", "full/out")
    median = np.array(_values(pg, "path.ex-median"))
    np.testing.assert_allclose(median[:, 1], [np.median(_g(r, "full/out")) for r in recs], 1e-12)
    # the capped tag: its kept quarters' quantiles (5 %, 95 %, ...) are the whole batch's
    _choose(page, "select.ex-tag", "capped/_examples")
    _choose(page, "select.ex-column", "model")
    band = np.array(_values(pg, 'path.ex-band[data-band="90 %"]'))
    np.testing.assert_allclose(band[:, 1], want[:, 1], rtol=1e-12)
    np.testing.assert_allclose(band[:, 2], want[:, 5], rtol=1e-12)
    assert "capped step" in pg.text_content(".ex-fan svg .subtitle")
    note = pg.text_content(".ex-exactness")
    assert f"{len(log.STEPS)} of {len(log.STEPS)} steps capped" in note
    assert ex.view_info()["notes"]["capped"] in note
    # the selection is in the URL
    assert "extag=capped%2F_examples" in pg.evaluate("() => location.hash")


def test_outlier_table_finds_the_corrupted_ids_and_sorts(page, reference):
    pg = _open(page, "#extag=full%2F_examples")
    recs = reference["ex"]["full/_examples"]
    ids = pg.eval_on_selector_all("table.ex-outliers tbody tr", "rs => rs.map(r => r.dataset.id)")
    assert sorted(int(i) for i in ids) == sorted(log.CORRUPTED)
    for i in ids:
        cells = {
            k: float(pg.get_attribute(f'tr[data-id="{i}"] td[data-key="{k}"]', "data-value"))
            for k in ("outlier_steps", "seen", "max_ratio", "last_loss")
        }
        ratios = [
            (_g(r) / np.median(_g(r)))[list(r.ids).index(int(i))] for r in recs if int(i) in r.ids
        ]
        assert cells["outlier_steps"] == cells["seen"] == len(log.STEPS)
        assert cells["max_ratio"] == pytest.approx(max(ratios), rel=1e-9)
        last = recs[-1]
        assert cells["last_loss"] == pytest.approx(
            last.losses[list(last.ids).index(int(i))], rel=1e-9
        )
    # sorted by max ratio, descending, on a click
    pg.click('table.ex-outliers th[data-key="max_ratio"]')
    shown = pg.eval_on_selector_all(
        'table.ex-outliers tbody td[data-key="max_ratio"]', "cs => cs.map(c => +c.dataset.value)"
    )
    assert shown == sorted(shown, reverse=True)
    # a lower threshold: more rows, as numpy counts them
    pg.fill("input.ex-threshold", "3")
    pg.dispatch_event("input.ex-threshold", "change")
    _settle(page)
    want = set()
    for r in recs:
        g = _g(r)
        want |= set(r.ids[g / np.median(g) > 3].tolist())
    ids = pg.eval_on_selector_all("table.ex-outliers tbody tr", "rs => rs.map(r => r.dataset.id)")
    assert {int(i) for i in ids} == want
    # the CSV export holds the table as shown
    with pg.expect_download() as dl:
        pg.click(".ex-outlier-part .export button:text('CSV')")
    rows = list(csv.DictReader(io.StringIO(open(dl.value.path()).read())))
    assert [r["id"] for r in rows] == ids
    # the SVG export draws it as shown, cell for cell
    with pg.expect_download() as dl:
        pg.click(".ex-outlier-part .export button:text('SVG')")
    svg = ET.parse(dl.value.path()).getroot()
    texts = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert texts[0] == "Outlier examples", texts[:2]
    shown = pg.eval_on_selector_all(
        "table.ex-outliers tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    ncol = len(shown[0])
    drawn = texts[2 + ncol :]
    assert [drawn[k : k + ncol] for k in range(0, len(drawn), ncol)] == shown


def test_clipped_fraction_and_histogram_are_numpys(page, reference):
    pg = _open(page, "#extag=full%2F_examples")
    recs = reference["ex"]["full/_examples"]
    assert "Enter a clipping norm C" in pg.text_content(".ex-clip svg")
    pg.fill("input.ex-clip-norm", "25")
    pg.dispatch_event("input.ex-clip-norm", "change")
    _settle(page)
    pg.wait_for_selector("path.ex-clip-line")
    got = np.array(_values(pg, "path.ex-clip-line"))
    assert got[:, 0].tolist() == list(log.STEPS)
    np.testing.assert_allclose(got[:, 1], [np.mean(_g(r) > 25) for r in recs], rtol=1e-12)
    assert "clip=25" in pg.evaluate("() => location.hash")
    # the histogram at step 15: its bars are numpy's counts on the drawn bins
    _choose(page, "select.ex-step", "15")
    bars = pg.eval_on_selector_all(
        "rect.ex-bar", "bs => bs.map(b => [+b.dataset.lo, +b.dataset.hi, +b.dataset.count])"
    )
    g = _g(recs[3])
    assert sum(b[2] for b in bars) == len(g)
    for lo, hi, count in bars:
        inside = (g >= lo) & ((g < hi) | (hi == max(b[1] for b in bars)) & (g <= hi))
        assert count == np.sum(inside), (lo, hi)
    # the fan chart's PNG export is a PNG
    with pg.expect_download() as dl:
        pg.click(".ex-fan .export button:text('PNG')")
    assert open(dl.value.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_examples_only_run_with_string_ids(page):
    pg = _open(page)
    _choose(page, "select.ex-run", "only")
    pg.fill("input.ex-threshold", "3")
    pg.dispatch_event("input.ex-threshold", "change")
    _settle(page)
    ids = pg.eval_on_selector_all("table.ex-outliers tbody tr", "rs => rs.map(r => r.dataset.id)")
    assert ids == ["d"]
    median = np.array(_values(pg, "path.ex-median"))
    np.testing.assert_allclose(median[:, 1], [np.median(np.sqrt(n)) for n in log.ONLY_NORMS])


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1024, 1440])
def test_screenshots(browser, tensorboard, scheme, width):  # noqa: F811
    p = Page(browser, tensorboard, color_scheme=scheme)
    try:
        p.page.set_viewport_size({"width": width, "height": 900})
        pg = _open(p, "#extag=full%2F_examples&clip=25")
        pg.wait_for_selector("path.ex-clip-line")
        SHOTS.mkdir(parents=True, exist_ok=True)
        box = pg.query_selector("#examples-card").bounding_box()
        pg.evaluate("() => window.scrollTo(0, 0)")  # the full page: the sticky toolbar on top
        pg.screenshot(path=str(SHOTS / f"examples_{width}_{scheme}.png"), full_page=True, clip=box)
        # nothing sticks out of the card
        overflow = pg.evaluate(
            "() => [...document.querySelectorAll('#examples-card svg')].some("
            "s => s.getBoundingClientRect().right > document.documentElement.clientWidth + 1)"
        )
        assert not overflow
        assert not p.errors, p.errors
    finally:
        p.close()


def test_a_logdir_with_per_example_norms_only(browser, tmp_path_factory):  # noqa: F811
    """No moments anywhere: TensorBoard still lists the tab (the plugin reads the norms' own
    plugin name too) and the tab shows the per-example section, saying why nothing else."""
    d = tmp_path_factory.mktemp("only_norms")
    log.write_other_runs(d)
    shutil.rmtree(d / "bad")
    for base in _serve(d, tmp_path_factory, lambda runs: "only" in runs):
        with urllib.request.urlopen(base + "/data/plugins_listing", timeout=30) as r:
            assert json.load(r)["gradmom"]["enabled"]
        p = Page(browser, base)
        try:
            pg = _open(p)
            assert "per-example norms only" in pg.text_content(".status")
            median = np.array(_values(pg, "path.ex-median"))
            want = [np.median(np.sqrt(n)) for n in log.ONLY_NORMS]
            np.testing.assert_allclose(median[:, 1], want, rtol=1e-12)
            assert pg.eval_on_selector_all(
                "select.ex-run option", "os => os.map(o => o.value)"
            ) == ["only"]
            assert not p.errors, p.errors
        finally:
            p.close()
