"""stats.py against definitions written from per-example gradients (numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tb_gradmom import metadata
from tb_gradmom.analysis import stats

CASES = [
    {"id": "signal-dominated-n16", "n": 16, "d": 12, "mean": 1.0, "noise": 0.3},
    {"id": "noise-dominated-n4", "n": 4, "d": 30, "mean": 0.01, "noise": 1.0},
    {"id": "n2-d3", "n": 2, "d": 3, "mean": 0.5, "noise": 0.5},
    {"id": "n64-d5", "n": 64, "d": 5, "mean": -0.2, "noise": 2.0},
]


def _grads(case, seed=0):
    rng = np.random.default_rng(seed)
    g = case["mean"] + case["noise"] * rng.normal(size=(case["n"], case["d"]))
    return g


def _reference(g, loss=float("nan"), lr=float("nan")):
    """Every quantity from its paper's definition, element by element."""
    n, d = g.shape
    m = [sum(g[j, i] for j in range(n)) / n for i in range(d)]
    s = [sum(g[j, i] ** 2 for j in range(n)) / n for i in range(d)]
    var = [sum((g[j, i] - m[i]) ** 2 for j in range(n)) / (n - 1) for i in range(d)]
    tr_sigma = sum(var)
    norm_sq = sum(x * x for x in m)
    true_norm_sq = norm_sq - tr_sigma / n
    gsnr = [m[i] ** 2 / var[i] for i in range(d) if var[i] > 0]
    return {
        "sums": {
            "batch_size": n,
            "num_elements": d,
            "sum_m2": norm_sq,
            "sum_var": tr_sigma,
            "sum_gsnr": sum(gsnr),
            "gsnr_count": len(gsnr),
            "sum_m2_raw": sum(s),
        },
        "derived": {
            "total_variance": tr_sigma,
            "grad_norm_sq": norm_sq,
            "grad_norm_sq_unbiased": true_norm_sq,
            "noise_scale": tr_sigma / true_norm_sq,
            "gsnr_mean": sum(gsnr) / len(gsnr),
            "norm_test": math.sqrt(tr_sigma / (n * norm_sq)),
            "eb_criterion": 1 - n / d * sum(gsnr),
            "cabs_batch_size": lr * sum(s[i] - m[i] ** 2 for i in range(d)) / loss,
        },
    }


def _sums(g, loss=float("nan"), lr=float("nan")):
    m1, m2 = g.mean(axis=0), (g**2).mean(axis=0)
    out = stats.sums_from_moments(m1, m2, g.shape[0])
    out["loss"], out["learning_rate"] = loss, lr
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_sums_from_moments_matches_definitions(case):
    g = _grads(case)
    got = stats.sums_from_moments(g.mean(axis=0), (g**2).mean(axis=0), case["n"])
    assert list(got) == list(metadata.STATS_FIELDS)
    ref = _reference(g)["sums"]
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-9), k
    assert math.isnan(got["loss"]) and math.isnan(got["learning_rate"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_derived_matches_definitions(case):
    g = _grads(case)
    got = stats.derived(_sums(g, loss=0.7, lr=0.05))
    ref = _reference(g, loss=0.7, lr=0.05)["derived"]
    assert list(got) == list(stats.DERIVED)
    for k, v in ref.items():
        assert isinstance(got[k], float)
        assert got[k] == pytest.approx(v, rel=1e-8), k


def test_noise_dominated_noise_scale_is_negative_not_hidden():
    g = _grads(CASES[1])
    ref = _reference(g)["derived"]
    assert ref["grad_norm_sq_unbiased"] < 0  # the setting is chosen so
    got = stats.derived(_sums(g))
    assert got["noise_scale"] < 0
    assert got["noise_scale"] == pytest.approx(ref["noise_scale"], rel=1e-8)


def test_missing_loss_and_zero_counts_give_nan_without_warnings():
    g = np.ones((4, 3))  # no variance at all
    with np.errstate(all="raise"):
        sums = stats.sums_from_moments(g.mean(axis=0), (g**2).mean(axis=0), 4)
        got = stats.derived(sums)
    assert sums["gsnr_count"] == 0 and sums["sum_var"] == 0
    assert math.isnan(got["gsnr_mean"])
    assert math.isnan(got["cabs_batch_size"])
    assert got["noise_scale"] == 0.0
    assert got["norm_test"] == 0.0
    zero = dict(sums, sum_m2=0.0, sum_var=1.0)
    with np.errstate(all="raise"):
        z = stats.derived(zero)
    assert z["norm_test"] == np.inf


def test_batch_of_one_has_nan_variance():
    g = np.array([[1.0, 2.0]])
    sums = stats.sums_from_moments(g[0], g[0] ** 2, 1)
    assert math.isnan(sums["sum_var"])
    assert sums["gsnr_count"] == 0
    assert math.isnan(stats.derived(sums)["noise_scale"])


def test_derived_is_vectorised_over_steps():
    per_step = [_sums(_grads(c, seed=i), loss=1.0 + i, lr=0.1) for i, c in enumerate(CASES)]
    stacked = {k: np.array([s[k] for s in per_step]) for k in per_step[0]}
    got = stats.derived(stacked)
    for t, s in enumerate(per_step):
        one = stats.derived(s)
        for k in stats.DERIVED:
            assert got[k].shape == (len(CASES),)
            np.testing.assert_allclose(got[k][t], one[k], rtol=1e-12, err_msg=k)


def test_ema_smooths_numerator_and_denominator_separately():
    rng = np.random.default_rng(5)
    num = rng.uniform(1, 2, size=6)
    den = rng.uniform(0.5, 1.0, size=6)
    den[3] = np.nan  # a step without data keeps the previous average
    n = 8.0
    # sum_m2 - sum_var / n == den  <=>  sum_m2 = den + num / n
    sums = {
        "batch_size": np.full(6, n),
        "num_elements": np.full(6, 10.0),
        "sum_m2": den + num / n,
        "sum_var": num,
        "sum_gsnr": np.ones(6),
        "gsnr_count": np.ones(6),
        "sum_m2_raw": np.ones(6),
    }
    decay = 0.9
    got = stats.derived(sums, ema=decay)
    # Reference: bias-corrected EMAs of numerator and denominator, then their ratio; the
    # first step is the raw ratio.
    assert got["noise_scale_ema"][0] == pytest.approx(num[0] / den[0], rel=1e-12)
    ratio_of_emas = _bias_corrected_ratio(num, den, decay)
    np.testing.assert_allclose(got["noise_scale_ema"], ratio_of_emas, rtol=1e-12)
    # Unsmoothed noise scale is untouched.
    np.testing.assert_allclose(got["noise_scale"][[0, 1, 2, 4, 5]], (num / den)[[0, 1, 2, 4, 5]])
    assert got["noise_scale_ema"][-1] != pytest.approx(num[-1] / den[-1], rel=1e-3)


def _bias_corrected_ratio(num, den, decay):
    out = []
    acc_n = w_n = acc_d = w_d = 0.0
    for x, y in zip(num, den, strict=True):
        acc_n, w_n = decay * acc_n + (1 - decay) * x, decay * w_n + (1 - decay)
        if not math.isnan(y):
            acc_d, w_d = decay * acc_d + (1 - decay) * y, decay * w_d + (1 - decay)
        out.append((acc_n / w_n) / (acc_d / w_d))
    return np.array(out)


def test_ema_zero_decay_is_the_raw_noise_scale_and_bad_decay_raises():
    g = _grads(CASES[0])
    s = _sums(g)
    got = stats.derived(s, ema=0.0)
    assert got["noise_scale_ema"] == pytest.approx(got["noise_scale"], rel=1e-12)
    with pytest.raises(ValueError, match=r"smoothing must be a decay in \[0, 1\)"):
        stats.derived(s, ema=1.0)
    with pytest.raises(KeyError, match="missing \\['sum_var'\\]"):
        stats.derived({k: v for k, v in s.items() if k != "sum_var"})


def _adam_ema(xs, beta):
    """Bias-corrected EMA written as Adam's m_hat_t = m_t / (1 - beta**t), t counting steps."""
    out, m, t = [], 0.0, 0
    for x in xs:
        t += 1
        m = beta * m + (1 - beta) * x
        out.append(m / (1 - beta**t))
    return np.array(out)


def test_smoothed_takes_every_ratio_of_separately_smoothed_parts():
    # Per-step gradients of several steps (per-example, brute force), smoothed by the paper's
    # recipe: smooth each numerator and denominator, then divide.
    beta, steps = 0.7, 7
    per_step = [
        _reference(_grads(CASES[k % 4], seed=k), loss=0.5 + k, lr=0.1) for k in range(steps)
    ]
    case_n = [CASES[k % 4]["n"] for k in range(steps)]
    case_d = [CASES[k % 4]["d"] for k in range(steps)]
    sums = {k: np.array([r["sums"][k] for r in per_step], dtype=float) for k in per_step[0]["sums"]}
    sums["loss"] = np.array([0.5 + k for k in range(steps)])
    sums["learning_rate"] = np.full(steps, 0.1)
    got = stats.smoothed(sums, beta)
    assert list(got) == list(stats.STATISTICS)
    tv = _adam_ema(sums["sum_var"], beta)
    m2 = _adam_ema(sums["sum_m2"], beta)
    g2 = _adam_ema([r["derived"]["grad_norm_sq_unbiased"] for r in per_step], beta)
    tv_n = _adam_ema([sums["sum_var"][k] / case_n[k] for k in range(steps)], beta)
    gs, gc = _adam_ema(sums["sum_gsnr"], beta), _adam_ema(sums["gsnr_count"], beta)
    eb = _adam_ema([case_n[k] / case_d[k] * sums["sum_gsnr"][k] for k in range(steps)], beta)
    cabs = _adam_ema(
        [r["derived"]["cabs_batch_size"] * (0.5 + k) for k, r in enumerate(per_step)], beta
    )
    loss = _adam_ema(sums["loss"], beta)
    want = {
        "total_variance": tv,
        "grad_norm_sq": m2,
        "grad_norm_sq_unbiased": g2,
        "noise_scale": tv / g2,
        "gsnr_mean": gs / gc,
        "norm_test": np.sqrt(tv_n / m2),
        "eb_criterion": 1 - eb,
        "cabs_batch_size": cabs / loss,
    }
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-10, err_msg=k)
    # Not the EMA of the per-step ratios.
    raw_ratio = _adam_ema([r["derived"]["noise_scale"] for r in per_step], beta)
    assert not np.allclose(got["noise_scale"], raw_ratio, rtol=1e-3)
    # beta = 0 is the per-step statistic.
    zero = stats.smoothed(sums, 0.0)
    raw = stats.derived(sums)
    for k in stats.STATISTICS:
        np.testing.assert_allclose(zero[k], raw[k], rtol=1e-12, err_msg=k)


def test_statistics_table_explains_every_derived_quantity():
    assert list(stats.STATISTICS) == list(stats.DERIVED)
    for key, s in stats.STATISTICS.items():
        for field in ("name", "meaning", "formula", "unit", "reading", "smoothing"):
            assert getattr(s, field).strip(), (key, field)
        assert key in stats.describe(key) and s.formula in stats.describe(key)
    assert "examples" in stats.STATISTICS["noise_scale"].unit
    assert "batch size" in stats.STATISTICS["cabs_batch_size"].unit
    assert "McCandlish" in stats.STATISTICS["noise_scale"].reference


def test_variance_histogram_buckets():
    edges = metadata.HIST_EDGES
    values = np.array(
        [0.0, -1.0, edges[0] / 2, edges[0], edges[5] * 1.01, edges[-1], 1e300, np.nan]
    )
    got = stats.variance_histogram(values)
    assert got.shape == (metadata.NUM_HIST_BUCKETS,)
    expected = np.zeros(metadata.NUM_HIST_BUCKETS)
    for v in values:
        if math.isnan(v):
            continue
        b = 0
        for i, e in enumerate(edges):
            if v >= e:
                b = i + 1
        expected[b] += 1
    np.testing.assert_array_equal(got, expected)
    assert got[0] == 3 and got[1] == 1 and got[-1] == 2


def test_split_stats_tensor_round_trip():
    g = _grads(CASES[0])
    sums = _sums(g, loss=0.3, lr=0.01)
    counts = stats.variance_histogram(g.var(axis=0, ddof=1))
    tensor = np.concatenate([[sums[f] for f in metadata.STATS_FIELDS], counts]).astype(np.float32)
    assert tensor.size == metadata.STATS_LENGTH
    got_sums, got_counts = stats.split_stats_tensor(tensor)
    for f in metadata.STATS_FIELDS:
        assert got_sums[f] == pytest.approx(sums[f], rel=1e-6)
    np.testing.assert_array_equal(got_counts, counts)
    with pytest.raises(ValueError, match="at least 9 values"):
        stats.split_stats_tensor(np.zeros(3))


def test_the_tabs_meta_fixture_is_views_meta():
    """tests/js/meta.json, the node tests' /meta, is `views.meta()`: the tab's labels, orders,
    palettes and default smoothing (0.9, `stats.DEFAULT_SMOOTHING`, also the figures' and the
    export's) come from there, so a change on the Python side the fixture does not follow
    fails here. Rewrite it with ``python tests/js/meta_fixture.py``."""
    import importlib.util
    import json
    import pathlib

    from tb_gradmom.analysis import views
    from tb_gradmom.viz import plot

    path = pathlib.Path(__file__).parent / "js" / "meta_fixture.py"
    spec = importlib.util.spec_from_file_location("meta_fixture", path)
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    got = fixture.PATH.read_text("utf-8")
    rewrite = "run: python tests/js/meta_fixture.py"
    assert json.loads(got) == views.meta(), (
        f"tests/js/meta.json differs from views.meta(); {rewrite}"
    )
    assert got == fixture.text(), f"tests/js/meta.json: keys out of order or reformatted; {rewrite}"
    assert views.meta()["default_smoothing"] == stats.DEFAULT_SMOOTHING == plot.DEFAULT_SMOOTHING


def _direct_se(a, b, beta, ratio=False):
    """SE of the EMA ratio at every step from explicit weights (docs/math.md, Uncertainty);
    with ``ratio`` also the ratio itself over the same steps."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    out = np.full(a.size, np.nan)
    rs = np.full(a.size, np.nan)
    for k in range(a.size):
        idx = np.flatnonzero(ok[: k + 1])
        if idx.size < 1:
            continue
        age = idx.size - 1 - np.arange(idx.size)
        w = (1 - beta) * beta**age
        w = w / w.sum()
        rs[k] = (w @ a[idx]) / (w @ b[idx])
        if idx.size < 2 or beta == 0:
            continue
        age = idx.size - 1 - np.arange(idx.size)  # finite steps after each one
        w = (1 - beta) * beta**age
        w = w / w.sum()
        big_a, big_b = w @ a[idx], w @ b[idx]
        r = big_a / big_b
        out[k] = math.sqrt((w**2 @ (a[idx] - r * b[idx]) ** 2) / (big_b**2 * (1 - w @ w)))
    return (out, rs) if ratio else out


def _series_sums(steps=40, seed=3):
    rng = np.random.default_rng(seed)
    n = np.full(steps, 64.0)
    tv = 100 * np.exp(rng.normal(0, 0.3, steps))
    m2 = tv / n + 0.5 + rng.normal(0, 0.4, steps)  # |G|^2 = m2 - tv/n, sometimes < 0
    return {
        "batch_size": n,
        "num_elements": np.full(steps, 1000.0),
        "sum_m2": m2,
        "sum_var": tv,
        "sum_gsnr": 30 + rng.normal(0, 5, steps),
        "gsnr_count": np.full(steps, 990.0) - rng.integers(0, 5, steps),
        "sum_m2_raw": m2 + tv * 63 / 64,
        "loss": 2 * np.exp(-np.arange(steps) / 30) + rng.normal(0, 0.05, steps),
        "learning_rate": np.full(steps, 0.01),
    }


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.99])
def test_smoothed_se_is_the_delta_method_over_the_window(beta):
    sums = _series_sums()
    sums["sum_var"][[5, 6]] = np.nan  # skipped steps (both parts of the noise scale)
    got = stats.smoothed_se(sums, beta)
    assert list(got) == list(stats.STATISTICS)
    n = sums["batch_size"]
    tv, m2 = sums["sum_var"], sums["sum_m2"]
    ones = np.ones_like(tv)
    cabs_num = sums["learning_rate"] * (sums["sum_m2_raw"] - m2)
    want = {
        "total_variance": _direct_se(tv, ones, beta),
        "grad_norm_sq": _direct_se(m2, ones, beta),
        "grad_norm_sq_unbiased": _direct_se(m2 - tv / n, ones, beta),
        "noise_scale": _direct_se(tv, m2 - tv / n, beta),
        "gsnr_mean": _direct_se(sums["sum_gsnr"], sums["gsnr_count"], beta),
        "eb_criterion": _direct_se(n / 1000 * sums["sum_gsnr"], ones, beta),
        "cabs_batch_size": _direct_se(cabs_num, sums["loss"], beta),
    }
    se_r, r = _direct_se(tv / n, m2, beta, ratio=True)
    want["norm_test"] = se_r / (2 * np.sqrt(r))
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-8, atol=0, err_msg=k)
    if beta == 0:
        assert np.isnan(got["noise_scale"]).all()
    else:
        assert np.isnan(got["noise_scale"][0]) and np.isfinite(got["noise_scale"][-1])


def test_smoothed_se_shrinks_with_a_longer_window_on_stationary_data():
    sums = _series_sums(steps=400, seed=5)
    se = [np.nanmedian(stats.smoothed_se(sums, b)["total_variance"][200:]) for b in (0.5, 0.9)]
    assert se[1] < se[0]
    # About sd / sqrt(effective steps (1 + beta) / (1 - beta)) for independent steps.
    sd = np.std(sums["sum_var"], ddof=1)
    assert se[1] == pytest.approx(sd / math.sqrt(19), rel=0.35)


def test_smoothed_at_is_smoothed_and_se_at_one_step():
    sums = _series_sums()
    values, se = stats.smoothed_at(sums, 17, 0.9)
    full, full_se = stats.smoothed(sums, 0.9), stats.smoothed_se(sums, 0.9)
    for k in stats.STATISTICS:
        assert values[k] == pytest.approx(full[k][17], rel=1e-12, nan_ok=True), k
        assert se[k] == pytest.approx(full_se[k][17], rel=1e-12, nan_ok=True), k


def test_statistics_have_human_names_typeset_formulas_and_a_group():
    from tb_gradmom.analysis import views

    for key, s in stats.STATISTICS.items():
        # No code names or ASCII math in what people read.
        for text in (s.name, s.short, s.formula, s.reading, s.smoothing):
            assert key not in text and "Sigma" not in text and "^2" not in text, (key, text)
            assert "sqrt(" not in text and "sum_" not in text, (key, text)
        assert s.group in views.STATISTIC_GROUPS, key
    assert stats.STATISTICS["total_variance"].symbol == "tr(Σ)"
    assert "|G|²" in stats.STATISTICS["noise_scale"].formula
    # The two batch sizes are in different groups, with different units.
    ns, cabs = stats.STATISTICS["noise_scale"], stats.STATISTICS["cabs_batch_size"]
    assert (ns.group, cabs.group) == ("noise_scale", "step_size")
    assert ns.unit != cabs.unit and "learning rate" in cabs.unit
