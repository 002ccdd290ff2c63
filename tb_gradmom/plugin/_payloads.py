"""The plugin's responses as plain functions of numpy data (no HTTP, no TensorBoard).

Every statistic, pooling, histogram and derived quantity comes from `tb_gradmom.analysis.reductions`
and `tb_gradmom.analysis.stats`; this module only arranges their results into the documented payloads
(docs/http_api.md). Functions raise `ValueError` for requests the data cannot answer; the
plugin turns those into HTTP 400.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tb_gradmom import metadata
from tb_gradmom.analysis import reductions, stats, views

__all__ = [
    "work_bytes",
    "stat_grid",
    "heatmap",
    "histograms_streaming",
    "series",
    "SERIES_KEYS",
]

# The keys of /series "values", in display order (one definition: `views.SERIES_KEYS`).
SERIES_KEYS = views.SERIES_KEYS

# Pass-one stat arrays kept for pass two of `histograms_streaming` (the rest is recomputed).
_STREAM_KEEP_BYTES = 32 * 1024 * 1024
# Bytes of working memory per stored cell and order of a statistic being computed: the
# float32 moments, their float64 copies, and about six float64 temporaries (the statistic,
# pooling's padded grid and masks); and per cell of text in a response (a Python float, its
# string, and the joined text).
_WORK_PER_CELL = 8 * 6
_WORK_PER_ORDER_CELL = 4 + 8
_WORK_PER_OUTPUT_CELL = 110


def work_bytes(content: metadata.MomentsContent, output_cells: int = 0) -> int:
    """An upper estimate of the memory one step's statistic and its response take.

    Args:
      content: the tag's content message (its stored shape and orders).
      output_cells: the numbers the response writes as text.
    """
    cells = math.prod(content.stored_shape)
    per_cell = _WORK_PER_CELL + _WORK_PER_ORDER_CELL * len(content.orders)
    return cells * per_cell + output_cells * _WORK_PER_OUTPUT_CELL


def stat_grid(
    arrays: dict[int, np.ndarray], n: float | None, stat: str, where: str = "this step"
) -> np.ndarray:
    """The statistic on the 2-D view (`metadata.to_2d_shape`) of the stored arrays."""
    reductions.check_stat(stat, tuple(arrays), n, where)
    # Statistics that do not depend on n still need a valid n for `stat_array`.
    values = reductions.stat_array(arrays, n if reductions.valid_batch_size(n) else 1, stat)
    return reductions.to_2d(values)


def finite_range(values: np.ndarray) -> tuple[float | None, float | None]:
    """Min and max of the finite values (None, None if there is none)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return None, None
    return float(v.min()), float(v.max())


def heatmap(
    content: metadata.MomentsContent,
    arrays: dict[int, np.ndarray],
    n: float | None,
    stat: str,
    max_rows: int,
    max_cols: int,
    where: str = "this step",
) -> dict:
    """The body of /heatmap without run, tag and step (see docs/http_api.md)."""
    grid = stat_grid(arrays, n, stat, where)
    pooled, (br, bc) = reductions.pool_2d(grid, max_rows, max_cols)
    sbr, sbc = content.block if content.pooled else (1, 1)
    lo, hi = finite_range(pooled)
    return {
        "stat": stat,
        "label": reductions.stat_label(stat),
        "batch_size": n if reductions.valid_batch_size(n) else None,
        "shape": list(content.shape),
        "grid_shape": list(metadata.to_2d_shape(content.shape)),
        "stored_shape": list(content.stored_shape),
        "rows": int(pooled.shape[0]),
        "cols": int(pooled.shape[1]),
        "block": [int(sbr * br), int(sbc * bc)],
        "pooled": bool(content.pooled or br > 1 or bc > 1),
        "values": pooled,
        "min": lo,
        "max": hi,
        "unbiased": stat != "biased_variance",
    }


def _kept(values: np.ndarray, scale: str) -> np.ndarray:
    # The values `reductions.histogram` bins: finite, and positive on a log scale.
    v = values[np.isfinite(values)]
    return v[v > 0] if scale == "log" else v


def histograms_streaming(
    compute: Callable[[int], np.ndarray], count: int, bins: int, scale: str
) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    """`reductions.histograms_over_steps` without holding every step's array at once.

    Pass one computes each array and the shared range; pass two bins each array with
    `reductions.histogram` over that range (recomputing arrays beyond a memory budget). The
    result equals ``histograms_over_steps([compute(i) for i in range(count)], bins, scale)``
    (tested).

    Returns:
      ``(edges, counts per array, non-finite count per array)``.
    """
    if scale not in reductions.SCALES:
        raise ValueError(
            f"unknown scale {scale!r}; expected one of: {', '.join(reductions.SCALES)}"
        )
    lo, hi = math.inf, -math.inf
    kept: dict[int, np.ndarray] = {}
    kept_bytes = 0
    nonfinite: list[int] = []
    for i in range(count):
        a = np.asarray(compute(i), dtype=np.float64)
        nonfinite.append(int(a.size - np.count_nonzero(np.isfinite(a))))
        v = _kept(a, scale)
        if v.size:
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
        if kept_bytes + a.nbytes <= _STREAM_KEEP_BYTES:
            kept[i] = a
            kept_bytes += a.nbytes
    value_range = (lo, hi) if lo <= hi else None
    edges = None
    counts = []
    for i in range(count):
        a = kept.pop(i) if i in kept else np.asarray(compute(i), dtype=np.float64)
        e, c = reductions.histogram(a, bins=bins, scale=scale, value_range=value_range)
        edges = e if edges is None else edges
        counts.append(c)
    if edges is None:
        edges, _ = reductions.histogram(np.empty(0), bins=bins, scale=scale)
    return edges, counts, nonfinite


def smoothed_series(sums: dict[str, np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """The /series ``smoothed``: every `stats.STATISTICS` entry by `stats.smoothed`, and the
    loss by the same bias-corrected EMA."""
    if next(iter(sums.values())).size == 0:
        return {k: np.empty(0) for k in (*stats.STATISTICS, "loss")}
    out = {k: np.atleast_1d(v) for k, v in stats.smoothed(sums, beta).items()}
    loss = np.asarray(sums.get("loss", np.full(out["noise_scale"].shape, np.nan)), np.float64)
    out["loss"] = stats.ema(np.atleast_1d(loss), beta)
    return out


def smoothed_series_se(sums: dict[str, np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """The /series ``smoothed_se``: the standard error of every `stats.STATISTICS` entry of
    ``smoothed`` over the steps in its window (`stats.smoothed_se`, docs/math.md)."""
    if next(iter(sums.values())).size == 0:
        return {k: np.empty(0) for k in stats.STATISTICS}
    return {k: np.atleast_1d(v) for k, v in stats.smoothed_se(sums, beta).items()}


def series(sums: dict[str, np.ndarray], ema: float | None = None) -> dict[str, np.ndarray]:
    """The /series ``values``: batch size, `stats.DERIVED`, loss and learning rate per step."""
    if next(iter(sums.values())).size == 0:
        return {k: np.empty(0) for k in SERIES_KEYS}
    d = stats.derived(sums, ema=ema)
    out = {"batch_size": np.asarray(sums["batch_size"], dtype=np.float64)}
    for k in stats.DERIVED:
        out[k] = np.atleast_1d(d[k])
    if "noise_scale_ema" in d:
        out["noise_scale_ema"] = np.atleast_1d(d["noise_scale_ema"])
    for k in ("loss", "learning_rate"):
        out[k] = np.asarray(sums.get(k, np.full_like(out["batch_size"], np.nan)), dtype=np.float64)
    return out


def moments_table(arrays: dict[int, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """Header and rows ``[index, m1, m2, ...]`` of raw moments, one row per stored element."""
    orders = sorted(arrays)
    cols = [np.asarray(arrays[p], dtype=np.float64).ravel() for p in orders]
    size = cols[0].size if cols else 0
    table = np.column_stack([np.arange(size, dtype=np.float64), *cols])
    return ["index", *[f"m{p}" for p in orders]], table
