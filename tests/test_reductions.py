"""reductions.py against brute-force per-example gradients and explicit loops (numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tb_gradmom import metadata
from tb_gradmom.analysis import reductions

# Problem settings: per-example gradients g [n, *shape] drawn from a distribution.
CASES = [
    {"id": "dense-normal-n8", "n": 8, "shape": (3, 4), "dist": "normal"},
    {"id": "bias-n2", "n": 2, "shape": (5,), "dist": "normal"},
    {"id": "conv-exponential-n16", "n": 16, "shape": (2, 2, 3, 2), "dist": "exponential"},
    {"id": "scalar-heavy-tail-n32", "n": 32, "shape": (), "dist": "student"},
    {"id": "offset-mean-n5", "n": 5, "shape": (7,), "dist": "offset"},
]


def _per_example(case, seed=0):
    rng = np.random.default_rng(seed)
    size = (case["n"], *case["shape"])
    if case["dist"] == "normal":
        return rng.normal(size=size)
    if case["dist"] == "exponential":
        return rng.exponential(size=size) - 0.3
    if case["dist"] == "student":
        return rng.standard_t(3, size=size)
    return rng.normal(size=size) * 0.1 + 2.0


def _moments(g, orders=(1, 2, 3, 4)):
    return {p: np.mean(g**p, axis=0) for p in orders}


def _reference(g, stat):
    """Each statistic from its textbook definition on the per-example gradients."""
    n = g.shape[0]
    mean = g.sum(axis=0) / n
    dev = g - mean
    biased = (dev**2).sum(axis=0) / n
    unbiased = (dev**2).sum(axis=0) / (n - 1)
    return {
        "mean": mean,
        "second_moment": (g * g).sum(axis=0) / n,
        "variance": unbiased,
        "biased_variance": biased,
        "std": np.sqrt(unbiased),
        "snr": mean**2 / unbiased,
        "third_moment": (g * g * g).sum(axis=0) / n,
        "fourth_moment": (g * g * g * g).sum(axis=0) / n,
        "skewness": (dev**3).sum(axis=0) / n / biased**1.5,
        "kurtosis": (dev**4).sum(axis=0) / n / biased**2,
    }[stat]


@pytest.mark.parametrize("stat", reductions.STATS)
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_stat_array_matches_brute_force(case, stat):
    g = _per_example(case)
    got = reductions.stat_array(_moments(g), case["n"], stat)
    assert got.shape == case["shape"]
    # Raw-moment formulas lose a few digits to cancellation (offset-mean case: mean 2, std 0.1).
    np.testing.assert_allclose(got, _reference(g, stat), rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("stat", reductions.STATS)
def test_stat_array_float32_moments(stat):
    g = _per_example(CASES[0], seed=3)
    m32 = {p: v.astype(np.float32) for p, v in _moments(g).items()}
    got = reductions.stat_array(m32, 8, stat)
    assert got.dtype == np.float64
    # float32 moments: relative error up to ~1e-5 after cancellation in M2 - M1**2 etc.
    np.testing.assert_allclose(got, _reference(g, stat), rtol=2e-3, atol=1e-5)


def test_required_orders_and_missing_orders_message():
    assert reductions.required_orders("kurtosis") == (1, 2, 3, 4)
    assert reductions.required_orders("mean") == (1,)
    with pytest.raises(
        ValueError, match=r"'skewness' needs moment orders \[1, 2, 3\].*missing \[3\]"
    ):
        reductions.stat_array({1: np.zeros(2), 2: np.zeros(2)}, 4, "skewness")
    with pytest.raises(ValueError, match="unknown statistic 'varaince'.*variance"):
        reductions.required_orders("varaince")
    with pytest.raises(ValueError, match="n must be >= 1"):
        reductions.stat_array({1: np.zeros(2)}, 0, "mean")


def test_every_stat_has_a_label_naming_the_variance():
    assert set(reductions.STAT_LABELS) == set(reductions.STATS)
    assert "unbiased" in reductions.stat_label("variance")
    assert "biased" in reductions.stat_label("biased_variance")
    assert "unbiased" not in reductions.stat_label("biased_variance")


def test_n_equals_one_gives_nan_unbiased_quantities():
    g = np.array([[1.0, -2.0, 0.0]])
    m = _moments(g)
    for stat in ("variance", "std", "snr"):
        assert np.isnan(reductions.stat_array(m, 1, stat)).all(), stat
    np.testing.assert_array_equal(reductions.stat_array(m, 1, "biased_variance"), 0.0)
    # A single example has zero biased variance: no defined skewness or kurtosis.
    assert np.isnan(reductions.stat_array(m, 1, "skewness")).all()
    assert np.isnan(reductions.stat_array(m, 1, "kurtosis")).all()


def test_zero_variance_snr_is_inf_or_nan_and_no_warning():
    # Element 0: constant non-zero gradient; element 1: constant zero gradient.
    g = np.array([[3.0, 0.0], [3.0, 0.0], [3.0, 0.0]])
    with np.errstate(all="raise"):
        snr = reductions.stat_array(_moments(g), 3, "snr")
        skew = reductions.stat_array(_moments(g), 3, "skewness")
    assert snr[0] == np.inf
    assert np.isnan(snr[1])
    assert np.isnan(skew).all()


def test_negative_rounding_variance_is_clipped_and_nan_propagates():
    m = {1: np.array([1.0, np.nan, 2.0]), 2: np.array([1.0 - 1e-12, 1.0, np.inf])}
    var = reductions.stat_array(m, 4, "variance")
    assert var[0] == 0.0
    assert np.isnan(var[1])
    assert var[2] == np.inf
    assert np.isnan(reductions.stat_array(m, 4, "snr")[1])


@pytest.mark.parametrize(
    "shape,expected",
    [((), (1, 1)), ((5,), (1, 5)), ((3, 4), (3, 4)), ((2, 3, 4, 5), (24, 5))],
)
def test_to_2d_uses_metadata_view(shape, expected):
    a = np.arange(math.prod(shape), dtype=float).reshape(shape)
    got = reductions.to_2d(a)
    assert got.shape == expected == metadata.to_2d_shape(shape)
    if len(shape) == 4:
        kh, kw, cin, cout = shape
        i, j, c, o = 1, 2, 3, 4
        assert got[(i * kw + j) * cin + c, o] == a[i, j, c, o]


def _pool_loop(grid, br, bc):
    rows, cols = grid.shape
    out = []
    for r0 in range(0, rows, br):
        row = []
        for c0 in range(0, cols, bc):
            cells = [
                grid[r, c]
                for r in range(r0, min(r0 + br, rows))
                for c in range(c0, min(c0 + bc, cols))
                if not np.isnan(grid[r, c])
            ]
            row.append(sum(cells) / len(cells) if cells else np.nan)
        out.append(row)
    return np.array(out)


@pytest.mark.parametrize(
    "shape,max_rows,max_cols,block",
    [
        ((7, 10), 3, 4, (3, 3)),  # ragged on both edges
        ((6, 9), 2, 3, (3, 3)),  # exact blocks
        ((5, 5), 10, 10, (1, 1)),  # fits already
        ((1, 17), 1, 5, (1, 4)),  # a bias vector
        ((13, 2), 4, 1, (4, 2)),
    ],
)
def test_pool_2d_matches_loops(shape, max_rows, max_cols, block):
    rng = np.random.default_rng(1)
    grid = rng.normal(size=shape)
    grid[rng.random(shape) < 0.2] = np.nan
    pooled, got_block = reductions.pool_2d(grid, max_rows, max_cols)
    assert got_block == block
    assert pooled.shape[0] <= max_rows and pooled.shape[1] <= max_cols
    np.testing.assert_allclose(pooled, _pool_loop(grid, *block), rtol=1e-12)


def test_pool_2d_all_nan_block_and_inf():
    grid = np.array([[np.nan, np.nan, 1.0, 3.0], [np.nan, np.nan, np.inf, 0.0]])
    with np.errstate(all="raise"):
        pooled, block = reductions.pool_2d(grid, 1, 2)
    assert block == (2, 2)
    assert np.isnan(pooled[0, 0])
    assert pooled[0, 1] == np.inf
    grid2 = np.array([[np.inf, -np.inf]])
    assert np.isnan(reductions.pool_2d(grid2, 1, 1)[0][0, 0])


def test_pool_2d_errors():
    with pytest.raises(ValueError, match="2-D grid"):
        reductions.pool_2d(np.zeros(3), 2, 2)
    with pytest.raises(ValueError, match=">= 1"):
        reductions.pool_2d(np.zeros((3, 3)), 0, 2)


@pytest.mark.parametrize("bins", [1, 7, 30])
def test_histogram_linear_matches_numpy(bins):
    rng = np.random.default_rng(2)
    v = rng.normal(size=(40, 3))
    edges, counts = reductions.histogram(v, bins=bins)
    ref_counts, ref_edges = np.histogram(v.ravel(), bins=bins)
    np.testing.assert_allclose(edges, ref_edges, rtol=1e-12)
    np.testing.assert_array_equal(counts, ref_counts)
    assert counts.sum() == v.size


def test_histogram_drops_nan_inf_and_respects_range():
    v = np.array([np.nan, np.inf, -np.inf, 0.0, 0.5, 1.0, 2.0, -3.0])
    edges, counts = reductions.histogram(v, bins=4, value_range=(0.0, 1.0))
    np.testing.assert_allclose(edges, [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(counts, [1, 0, 1, 1])
    _, counts_all = reductions.histogram(v, bins=5)
    assert counts_all.sum() == 5


def test_histogram_log_scale():
    rng = np.random.default_rng(3)
    v = np.concatenate([10.0 ** rng.uniform(-6, 2, size=200), [0.0, -1.0, np.nan]])
    edges, counts = reductions.histogram(v, bins=16, scale="log")
    positive = v[np.isfinite(v) & (v > 0)]
    ref_counts, ref_log_edges = np.histogram(np.log10(positive), bins=16)
    np.testing.assert_allclose(np.log10(edges), ref_log_edges, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(counts, ref_counts)
    assert edges[0] == positive.min() and edges[-1] == positive.max()
    assert counts.sum() == positive.size


def test_histogram_degenerate_inputs():
    edges, counts = reductions.histogram(np.array([np.nan, np.inf]), bins=3)
    assert counts.sum() == 0 and edges[0] == 0.0 and edges[-1] == 1.0
    edges, counts = reductions.histogram(np.full(4, 2.0), bins=2)
    np.testing.assert_allclose(edges, [1.5, 2.0, 2.5])
    assert counts.sum() == 4
    edges, counts = reductions.histogram(np.zeros(5), bins=3, scale="log")
    assert counts.sum() == 0
    with pytest.raises(ValueError, match="scale 'sqrt'"):
        reductions.histogram(np.ones(3), scale="sqrt")
    with pytest.raises(ValueError, match="bins must be >= 1"):
        reductions.histogram(np.ones(3), bins=0)


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_histograms_over_steps_share_edges(scale):
    rng = np.random.default_rng(4)
    arrays = [rng.exponential(size=10) * (t + 1) for t in range(4)]
    arrays.append(np.full(3, np.nan))
    edges, counts = reductions.histograms_over_steps(arrays, bins=8, scale=scale)
    everything = np.concatenate(arrays[:4])
    lo, hi = everything.min(), everything.max()
    if scale == "log":
        ref_edges = np.logspace(np.log10(lo), np.log10(hi), 9)
        ref_edges[0], ref_edges[-1] = lo, hi  # the extremes must be counted
    else:
        ref_edges = np.linspace(lo, hi, 9)
    np.testing.assert_allclose(edges, ref_edges, rtol=1e-10)
    assert len(counts) == 5
    for a, c in zip(arrays[:4], counts[:4], strict=True):
        np.testing.assert_array_equal(c, np.histogram(a, bins=ref_edges)[0])
    assert counts[4].sum() == 0
    assert sum(c.sum() for c in counts) == everything.size
