"""Element-wise statistics, 2-D views, pooling and histograms of logged moments (numpy only).

One implementation shared by the TensorBoard plugin, the plots and the exporter: whoever shows
a variance, an SNR or a histogram computes it here, so the tab, the figures and the CSV files
agree to the last bit.

From raw moments ``M_p = (1/n) sum_j g_j**p`` (element-wise over a variable, ``n`` examples):

* biased variance ``v = M_2 - M_1**2``; unbiased variance ``s2 = n/(n-1) * v``;
* ``snr = M_1**2 / s2`` (the per-element gradient signal-to-noise ratio, Liu et al. 2020);
* central moments ``mu3 = M_3 - 3 M_1 M_2 + 2 M_1**3`` and
  ``mu4 = M_4 - 4 M_1 M_3 + 6 M_1**2 M_2 - 3 M_1**4``;
  skewness ``mu3 / v**1.5`` and kurtosis ``mu4 / v**2`` (``v`` the *biased* variance).

This module imports neither TensorFlow nor TensorBoard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeGuard

import numpy as np

from tb_gradmom import metadata

__all__ = [
    "STATS",
    "STAT_LABELS",
    "SCALES",
    "MAX_BINS",
    "NEEDS_BATCH_SIZE",
    "check_stat",
    "valid_batch_size",
    "required_orders",
    "stat_array",
    "stat_label",
    "to_2d",
    "pool_2d",
    "histogram",
    "histograms_over_steps",
]

# Element-wise statistics, in display order.
STATS: tuple[str, ...] = (
    "mean",
    "second_moment",
    "variance",
    "biased_variance",
    "std",
    "snr",
    "third_moment",
    "fourth_moment",
    "skewness",
    "kurtosis",
)

# Readable labels (colour bars, axis labels, CSV headers), naming which variance is meant.
STAT_LABELS: dict[str, str] = {
    "mean": "mean gradient M₁",
    "second_moment": "second raw moment M₂",
    "variance": "variance (unbiased, n/(n−1))",
    "biased_variance": "variance (biased, M₂ − M₁²)",
    "std": "standard deviation (√ of the unbiased variance)",
    "snr": "SNR M₁² / variance (unbiased)",
    "third_moment": "third raw moment M₃",
    "fourth_moment": "fourth raw moment M₄",
    "skewness": "skewness μ₃ / v¹·⁵ (biased v)",
    "kurtosis": "kurtosis μ₄ / v² (biased v)",
}

SCALES: tuple[str, ...] = ("linear", "log")
# The most histogram bins (the tab, its HTTP API and the exporter): a bin costs memory and
# time, and no screen or figure shows more.
MAX_BINS = 1000

_REQUIRED: dict[str, tuple[int, ...]] = {
    "mean": (1,),
    "second_moment": (2,),
    "variance": (1, 2),
    "biased_variance": (1, 2),
    "std": (1, 2),
    "snr": (1, 2),
    "third_moment": (3,),
    "fourth_moment": (4,),
    "skewness": (1, 2, 3),
    "kurtosis": (1, 2, 3, 4),
}


# Statistics whose value depends on the batch size n (the unbiased variance's n/(n-1)).
NEEDS_BATCH_SIZE = frozenset({"variance", "std", "snr"})


def valid_batch_size(n: float | None) -> TypeGuard[float]:
    """Whether ``n`` is a usable batch size (finite, >= 1)."""
    return n is not None and math.isfinite(n) and n >= 1


def check_stat(stat: str, orders: Sequence[int], n: float | None, where: str = "this tag") -> None:
    """Whether ``stat`` can be computed from what was logged: the one check of the plugin, the
    figures and the export.

    Args:
      stat: the statistic asked for.
      orders: the moment orders logged.
      n: the batch size of that step (None when the step has no stats).
      where: what is being read, for the message (``"run 'train' tag 'dense/kernel' step 10"``).

    Raises:
      ValueError: for an unknown statistic, missing orders, or a statistic of
        `NEEDS_BATCH_SIZE` without a batch size; the message says what to do instead.
    """
    _check_orders(stat, orders, f"{where} has orders")
    if stat in NEEDS_BATCH_SIZE and not valid_batch_size(n):
        raise ValueError(
            f"statistic {stat!r} needs the batch size, stored in the tag's "
            f"'{metadata.STATS_SUFFIX}' tag, which {where} does not have; use "
            "'biased_variance' instead"
        )


def _check_orders(stat: str, orders, what: str) -> tuple[int, ...]:
    """The orders ``stat`` needs; ValueError naming the missing ones if ``orders`` lacks any."""
    needed = required_orders(stat)
    missing = [p for p in needed if p not in orders]
    if missing:
        raise ValueError(
            f"statistic {stat!r} needs moment orders {list(needed)}, but {what} "
            f"{sorted(orders)} (missing {missing}); log them with orders="
            f"{tuple(sorted(set(orders) | set(needed)))} or pick another statistic"
        )
    return needed


def _check_stat(stat: str) -> None:
    if stat not in _REQUIRED:
        raise ValueError(f"unknown statistic {stat!r}; expected one of: {', '.join(STATS)}")


def required_orders(stat: str) -> tuple[int, ...]:
    """The moment orders a statistic needs.

    Args:
      stat: one of `STATS`.

    Returns:
      The orders, ascending; e.g. ``(1, 2)`` for ``"variance"``.

    Raises:
      ValueError: for an unknown statistic (the message lists the known ones).
    """
    _check_stat(stat)
    return _REQUIRED[stat]


def stat_label(stat: str) -> str:
    """A readable label for a statistic, saying which variance it uses.

    Args:
      stat: one of `STATS`.

    Returns:
      The label, e.g. ``"variance (unbiased, n/(n-1))"``.
    """
    _check_stat(stat)
    return STAT_LABELS[stat]


def _biased_variance(m1: np.ndarray, m2: np.ndarray) -> np.ndarray:
    # M2 - M1**2 is >= 0 in exact arithmetic; small negative values are rounding (float32
    # cancellation), so clip them to 0. NaN stays NaN (np.maximum propagates it).
    return np.maximum(m2 - m1 * m1, 0.0)


def stat_array(moments: Mapping[int, np.ndarray], n: int | float, stat: str) -> np.ndarray:
    """An element-wise statistic from raw moments.

    Computed in float64 whatever the input dtype. Conventions for undefined values (no warnings
    are emitted; the results are explicit):

    * Variances: ``M2 - M1**2`` is clipped at 0 (negative values are float rounding).
      For ``n == 1`` the unbiased variance, ``std`` and ``snr`` are NaN (``n - 1 == 0``).
    * ``snr``: where the unbiased variance is 0, ``+inf`` if ``M1 != 0`` (a noiseless non-zero
      gradient) and NaN if ``M1 == 0`` (0/0).
    * ``skewness`` and ``kurtosis``: NaN where the biased variance is 0 (a constant
      per-example gradient has no defined shape).
    * NaN and Inf in the moments propagate by IEEE rules.

    Pooled moments (block means) give the statistic of the block-mean moments, e.g. for the
    variance ``mean(M2) - mean(M1)**2`` over the block, which includes the spread of ``M1``
    inside the block; it is not the mean of the per-element variances.

    Args:
      moments: order -> array of ``M_order``; all arrays of one shape.
      n: the batch size the moments average over (>= 1).
      stat: one of `STATS`.

    Returns:
      A float64 array of the moments' shape.

    Raises:
      ValueError: for an unknown statistic, missing orders (the message names the statistic,
        the orders it needs and the ones given), or ``n < 1``.
    """
    needed = _check_orders(stat, moments, "orders given were")
    n = float(n)
    if not n >= 1:
        raise ValueError(f"batch size n must be >= 1 for statistic {stat!r}, got {n}")
    m = {p: np.asarray(moments[p], dtype=np.float64) for p in needed}
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if stat == "mean":
            return m[1].copy()
        if stat == "second_moment":
            return m[2].copy()
        if stat == "third_moment":
            return m[3].copy()
        if stat == "fourth_moment":
            return m[4].copy()
        v = _biased_variance(m[1], m[2])
        if stat == "biased_variance":
            return v
        if stat in ("variance", "std", "snr"):
            if n == 1:
                return np.full(v.shape, np.nan)
            s2 = v * (n / (n - 1.0))
            if stat == "variance":
                return s2
            if stat == "std":
                return np.sqrt(s2)
            sq = m[1] * m[1]
            out = sq / np.where(s2 > 0, s2, 1.0)
            out = np.where(s2 > 0, out, np.where(sq > 0, np.inf, np.nan))
            return np.where(np.isnan(s2) | np.isnan(sq), np.nan, out)
        m1, m2, m3 = m[1], m[2], m[3]
        safe_v = np.where(v > 0, v, 1.0)
        if stat == "skewness":
            mu3 = m3 - 3.0 * m1 * m2 + 2.0 * m1**3
            out = mu3 / safe_v**1.5
        else:  # kurtosis
            m4 = m[4]
            mu4 = m4 - 4.0 * m1 * m3 + 6.0 * m1**2 * m2 - 3.0 * m1**4
            out = mu4 / safe_v**2
        return np.where(v > 0, out, np.nan)


def to_2d(array: np.ndarray) -> np.ndarray:
    """The 2-D view of an array used for heatmaps and pooling (`metadata.to_2d_shape`).

    Args:
      array: any shape; e.g. a Conv2D kernel statistic ``[kh, kw, c_in, c_out]``.

    Returns:
      A view ``[rows, cols]``: all axes but the last become rows; a scalar is ``[1, 1]`` and a
      vector ``[d]`` is ``[1, d]``.
    """
    array = np.asarray(array)
    return array.reshape(metadata.to_2d_shape(array.shape))


def pool_2d(grid: np.ndarray, max_rows: int, max_cols: int) -> tuple[np.ndarray, tuple[int, int]]:
    """NaN-aware block means of a 2-D grid so it fits into ``max_rows x max_cols`` cells.

    The block is ``(ceil(rows / max_rows), ceil(cols / max_cols))``. Blocks at the bottom and
    right edges may be smaller (ragged) and average over the cells they have. NaN cells are
    ignored; a block of NaN only is NaN. Inf cells propagate (a block holding both ``+inf`` and
    ``-inf`` is NaN).

    Args:
      grid: ``[rows, cols]``.
      max_rows: the most rows wanted (>= 1).
      max_cols: the most columns wanted (>= 1).

    Returns:
      ``(pooled, (block_rows, block_cols))``; pooled is float64
      ``[ceil(rows / block_rows), ceil(cols / block_cols)]``, the grid itself (as float64) when
      it already fits.

    Raises:
      ValueError: if the grid is not 2-D or a limit is below 1.
    """
    grid = np.asarray(grid, dtype=np.float64)
    if grid.ndim != 2:
        raise ValueError(f"pool_2d expects a 2-D grid, got shape {grid.shape}; use to_2d first")
    if max_rows < 1 or max_cols < 1:
        raise ValueError(
            f"pool_2d limits must be >= 1, got max_rows={max_rows}, max_cols={max_cols}"
        )
    rows, cols = grid.shape
    br = max(1, math.ceil(rows / max_rows))
    bc = max(1, math.ceil(cols / max_cols))
    if br == 1 and bc == 1:
        return grid.copy(), (1, 1)
    out_r, out_c = math.ceil(rows / br), math.ceil(cols / bc)
    padded = np.full((out_r * br, out_c * bc), np.nan)
    padded[:rows, :cols] = grid
    blocks = padded.reshape(out_r, br, out_c, bc)
    valid = ~np.isnan(blocks)
    count = valid.sum(axis=(1, 3))
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.where(valid, blocks, 0.0).sum(axis=(1, 3))
        pooled = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return pooled, (br, bc)


def _finite_for_scale(values: np.ndarray, scale: str) -> np.ndarray:
    if scale not in SCALES:
        raise ValueError(f"unknown histogram scale {scale!r}; expected 'linear' or 'log'")
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if scale == "log":
        v = v[v > 0]
    return v


def _edges(lo: float, hi: float, bins: int, scale: str) -> np.ndarray:
    if not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be >= 1 and <= {MAX_BINS}, got {bins}")
    if scale == "log":
        if not (lo > 0 and hi > 0):
            raise ValueError(f"a log-scale histogram needs a positive range, got [{lo}, {hi}]")
        llo, lhi = math.log10(lo), math.log10(hi)
        if llo == lhi:
            return np.logspace(llo - 0.5, lhi + 0.5, bins + 1)
        edges = np.logspace(llo, lhi, bins + 1)
        # 10**log10(x) need not round-trip: pin the ends so the extremes are counted.
        edges[0], edges[-1] = lo, hi
        return edges
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, bins + 1)


def _counts(values: np.ndarray, edges: np.ndarray, uniform: bool = False) -> np.ndarray:
    if uniform:
        # Equal-width edges from np.linspace: numpy's uniform-bin path computes the same
        # linspace edges and corrects rounding against them, so the counts are identical to
        # passing the edges, at about half the cost.
        counts, _ = np.histogram(values, bins=len(edges) - 1, range=(edges[0], edges[-1]))
    else:
        counts, _ = np.histogram(values, bins=edges)
    return counts.astype(np.int64)


def _range(values: np.ndarray, scale: str) -> tuple[float, float]:
    if values.size == 0:
        return (1.0, 10.0) if scale == "log" else (0.0, 1.0)
    return float(values.min()), float(values.max())


def histogram(
    values: np.ndarray,
    bins: int = 30,
    scale: str = "linear",
    value_range: Sequence[float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A histogram of the finite values of an array.

    NaN and +-Inf are dropped; with ``scale="log"`` values <= 0 are dropped too and the edges
    are log-spaced. Values outside ``value_range`` are dropped. The last bin includes its right
    edge (as `numpy.histogram`). With no value left the range is ``[0, 1]`` (linear) or
    ``[1, 10]`` (log) and every count is 0; a single distinct value gets a range one unit (one
    decade for log) wide around it.

    Args:
      values: any shape.
      bins: the number of bins (>= 1).
      scale: ``"linear"`` or ``"log"``.
      value_range: ``(lo, hi)``; default the min and max of the kept values.

    Returns:
      ``(edges [bins + 1] float64, counts [bins] int64)``.

    Raises:
      ValueError: for an unknown scale, ``bins < 1`` or a non-positive log range.
    """
    v = _finite_for_scale(values, scale)
    lo, hi = _range(v, scale) if value_range is None else map(float, value_range)
    edges = _edges(lo, hi, bins, scale)
    return edges, _counts(v, edges, uniform=scale == "linear")


def histograms_over_steps(
    arrays: Sequence[np.ndarray], bins: int = 30, scale: str = "linear"
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Histograms of several arrays (one per step) over shared edges.

    The edges span the finite (for ``log``: finite positive) values of all arrays together;
    see `histogram` for the handling of NaN, Inf and empty input.

    Args:
      arrays: one array per step, any shapes.
      bins: the number of bins (>= 1).
      scale: ``"linear"`` or ``"log"``.

    Returns:
      ``(edges [bins + 1], [counts [bins] per array])``.
    """
    kept = [_finite_for_scale(a, scale) for a in arrays]
    nonempty = [k for k in kept if k.size]
    if nonempty:
        lo = min(float(k.min()) for k in nonempty)
        hi = max(float(k.max()) for k in nonempty)
    else:
        lo, hi = _range(np.empty(0), scale)
    edges = _edges(lo, hi, bins, scale)
    return edges, [_counts(k, edges, uniform=scale == "linear") for k in kept]
