"""The tab's noise-scale views in real Chromium against a real TensorBoard: the per-layer
curve, the noise scale's separately smoothed tr(Σ) and |G|² beside it, and the info panel.

Fixtures (the logdir, TensorBoard, Debian's Chromium) are `tests/test_frontend_browser.py`'s.
The references are numpy on the log as `data.load` reads it (not the plugin's code): a layer's
sums added over its variables, ``|G|^2 = |m|^2 - tr(Sigma)/n``, a bias-corrected EMA written
out here, and the ratio of the two EMAs. Screenshots go to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from tb_gradmom.analysis import data
from tests.test_frontend_browser import (  # noqa: F401 - the fixtures: browser, logdir, page, tensorboard
    SHOTS,
    browser,
    choose,
    download,
    get_json,
    logdir,
    open_variable_page,
    page,
    shot,
    tensorboard,
)

pytestmark = pytest.mark.slow

LAYER = ("dense/kernel", "dense/bias")  # the fixture's layer "dense" (tests/test_frontend_browser)


def _ema(x: np.ndarray, beta: float) -> np.ndarray:
    out, acc = [], 0.0
    for k, v in enumerate(x, start=1):
        acc = beta * acc + (1 - beta) * v
        out.append(acc / (1 - beta**k))
    return np.array(out)


def _reference(root, run: str, tags, beta: float) -> dict[str, np.ndarray]:
    """Per step: tr(Sigma), |G|^2, their EMAs and the noise scale, summed over ``tags``."""
    recs = data.load(root / run)["."]
    steps = [r.step for r in recs[tags[0]]]
    for t in tags:
        assert [r.step for r in recs[t]] == steps
    tv = np.sum([[r.stats["sum_var"] for r in recs[t]] for t in tags], axis=0)
    m2 = np.sum([[r.stats["sum_m2"] for r in recs[t]] for t in tags], axis=0)
    n = np.array([r.stats["batch_size"] for r in recs[tags[0]]])
    g2 = m2 - tv / n
    return {
        "steps": np.array(steps),
        "noise_scale": tv / g2,
        "tv_smoothed": _ema(tv, beta),
        "g2_smoothed": _ema(g2, beta),
        "noise_scale_smoothed": _ema(tv, beta) / _ema(g2, beta),
    }


def _drawn(pg, view: str, run: str, part: int | None = None) -> dict:
    """What a curves view (or one of its part panels) holds for a run."""
    return pg.evaluate(
        """([view, run, part]) => {
          let v = window.gradmom.views[view];
          if (part !== null) v = v.partViews[part];
          const s = v.model.series.find((x) => x.run === run);
          return {metric: v.model.metric, label: v.model.label, steps: s.steps,
                  values: s.values.map((x) => Number.isFinite(x) ? x : String(x)),
                  smoothed: s.smoothed.map((x) => Number.isFinite(x) ? x : String(x))};
        }""",
        [view, run, part],
    )


def _close(got, want, rtol=1e-8):
    # The JSON payloads carry 9 significant digits (`encode.to_json`): 5e-9 relative at most.
    got = np.array([float(x) for x in got])
    np.testing.assert_allclose(got, want, rtol=rtol)


def test_layer_curve_and_the_noise_scales_parts_equal_numpy_on_the_log(page, logdir):  # noqa: F811
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    choose(pg, "select.metric-select", "noise_scale", page)
    beta = float(pg.locator("input.smoothing").input_value())
    assert beta == 0.9
    pg.wait_for_selector(".curves-layer-total path.curve")
    for run in ("alpha", "beta"):
        ref = _reference(logdir, run, LAYER, beta)
        got = _drawn(pg, "layerTotalCurves", run)
        assert got["label"] == "layer dense (2 variables summed)"
        assert got["steps"] == ref["steps"].tolist()
        _close(got["values"], ref["noise_scale"])
        _close(got["smoothed"], ref["noise_scale_smoothed"])
        tv = _drawn(pg, "layerTotalCurves", run, 0)
        g2 = _drawn(pg, "layerTotalCurves", run, 1)
        assert (tv["metric"], g2["metric"]) == ("total_variance", "grad_norm_sq_unbiased")
        _close(tv["smoothed"], ref["tv_smoothed"])
        _close(g2["smoothed"], ref["g2_smoothed"])
        # The whole model's parts: every variable of the run (its _model sums).
        model = _reference(logdir, run, ("_model",), beta)
        _close(_drawn(pg, "modelCurves", run, 0)["smoothed"], model["tv_smoothed"])
        _close(_drawn(pg, "modelCurves", run, 1)["smoothed"], model["g2_smoothed"])
        _close(_drawn(pg, "modelCurves", run)["smoothed"], model["noise_scale_smoothed"])
    # Drawn: a line per run in the layer's plot and in each part's panel.
    total = pg.locator(".curves-layer-total")
    runs_with_layer = sorted(
        r for r, tags in get_json(page.base, "tags")["runs"].items() if "dense/kernel" in tags
    )
    assert total.locator("path.curve").count() == len(runs_with_layer)
    parts = pg.locator(".curves-layer-parts")
    for metric in ("total_variance", "grad_norm_sq_unbiased"):
        part = parts.locator(f'.curves-part[data-metric="{metric}"]')
        assert part.locator("path.curve").count() == len(runs_with_layer)
        assert part.locator("path.curve").first.get_attribute("d").startswith("M")
    # The tr(Σ) panel's CSV export holds the numbers numpy computes.
    part = parts.locator('.curves-part[data-metric="total_variance"]')
    _, body = download(pg, part.get_by_role("button", name="CSV"))
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0][:5] == ["run", "step", "wall_time", "total_variance", "total_variance_smoothed"]
    ref = _reference(logdir, "alpha", LAYER, beta)
    alpha = [r for r in rows[1:] if r[0] == "alpha"]
    _close([r[4] for r in alpha], ref["tv_smoothed"])
    total.scroll_into_view_if_needed()
    shot(pg, "noise_layer_and_parts.png")
    box_top, box_bottom = total.bounding_box(), parts.bounding_box()
    pg.screenshot(
        path=str(SHOTS / "noise_layer_panel.png"),
        full_page=True,
        clip={
            "x": box_top["x"],
            "y": box_top["y"],
            "width": box_top["width"],
            "height": box_bottom["y"] + box_bottom["height"] - box_top["y"],
        },
    )


def test_info_panel_says_what_the_noise_scale_estimates(page):  # noqa: F811
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    choose(pg, "select.metric-select", "noise_scale", page)
    assert pg.locator(".stat-info").is_hidden()
    pg.click("button.info-button")
    page.settle()
    note = pg.locator(".stat-info .noise-note")
    note.wait_for(state="visible")
    meta = get_json(page.base, "meta")["noise_note"]
    assert note.locator("h4").text_content() == meta["title"]
    text = note.text_content()
    assert "critical batch size only under those assumptions" in text
    links = note.locator("ol.noise-refs a")
    assert [links.nth(k).get_attribute("href") for k in range(links.count())] == [
        r["url"] for r in meta["references"]
    ]
    assert "Critical Batch Size Revisited" in links.nth(2).text_content()
    pg.locator("#curves-card").screenshot(path=str(SHOTS / "noise_info_panel.png"))
    # tr(Σ) is a part of the noise scale: the note stays; the GSNR is not: it goes, and only
    # the noise scale gets the part panels.
    choose(pg, "select.metric-select", "total_variance", page)
    assert pg.locator(".stat-info .noise-note").is_visible()
    assert pg.locator(".curves-part").count() == 0
    choose(pg, "select.metric-select", "gsnr_mean", page)
    assert pg.locator(".stat-info .noise-note").count() == 0
    assert math.isfinite(float(pg.locator("input.smoothing").input_value()))
