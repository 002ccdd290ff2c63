"""The plugin's responses as plain functions of numpy data (no HTTP, no TensorBoard).

Every statistic, pooling, histogram and derived quantity comes from `tb_gradmom.analysis.reductions`
and `tb_gradmom.analysis.stats`; this module only arranges their results into the documented payloads
(docs/http_api.md). Functions raise `ValueError` for requests the data cannot answer; the
plugin turns those into HTTP 400.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable

import numpy as np

from tb_gradmom import metadata
from tb_gradmom.analysis import reductions, stats, views

__all__ = [
    "work_bytes",
    "stat_grid",
    "screen_limits",
    "heatmap",
    "grid_csv",
    "to_binary",
    "from_binary",
    "BINARY_MAGIC",
    "BINARY_MIME",
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


def work_bytes(content: metadata.MomentsContent, output_cells: int = 0, binary=False) -> int:
    """An upper estimate of the memory one step's statistic and its response take.

    Args:
      content: the tag's content message (its stored shape and orders).
      output_cells: the numbers the response writes.
      binary: they are written in the binary form (`to_binary`: at most 8 bytes each), not
        as text.
    """
    cells = math.prod(content.stored_shape)
    per_cell = _WORK_PER_CELL + _WORK_PER_ORDER_CELL * len(content.orders)
    per_output = 8 if binary else _WORK_PER_OUTPUT_CELL
    return cells * per_cell + output_cells * per_output


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


def screen_limits(
    rows: int, cols: int, max_rows: int, max_cols: int, max_cells: int | None
) -> tuple[int, int]:
    """The most rows and columns a ``rows x cols`` grid is pooled to (`reductions.pool_2d`)
    so that it has at most ``max_rows`` rows, ``max_cols`` columns and ``max_cells`` cells
    (None: no cap on cells), keeping its aspect ratio where the caps allow.

    With ``max_cells`` the served grid is at most ``r x c`` with ``r * c <= max_cells``: ``r``
    near ``sqrt(max_cells * rows / cols)`` (so the blocks are about square), and a side that
    needs fewer cells than its share gives the rest to the other.
    """
    r, c = min(rows, max_rows), min(cols, max_cols)
    if max_cells is None or r * c <= max_cells:
        return max(1, r), max(1, c)
    r = max(1, min(r, math.isqrt(max_cells * rows // max(1, cols))))
    c = max(1, min(c, max_cells // r))
    r = max(1, min(rows, max_rows, max_cells // c))  # a narrow grid gives its rows the rest
    return r, c


def heatmap(
    content: metadata.MomentsContent,
    arrays: dict[int, np.ndarray],
    n: float | None,
    stat: str,
    max_rows: int,
    max_cols: int,
    where: str = "this step",
    max_cells: int | None = None,
) -> dict:
    """The body of /heatmap without run, tag and step (see docs/http_api.md).

    The statistic's 2-D grid is block-averaged (`reductions.pool_2d`) to at most ``max_rows``
    x ``max_cols`` cells, and at most ``max_cells`` cells (`screen_limits`).
    """
    grid = stat_grid(arrays, n, stat, where)
    rows, cols = grid.shape
    limit_rows, limit_cols = screen_limits(rows, cols, max_rows, max_cols, max_cells)
    pooled, (br, bc) = reductions.pool_2d(grid, limit_rows, limit_cols)
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


def grid_csv(grid: np.ndarray) -> str:
    """A 2-D grid as the CSV of ``/export?what=heatmap&format=csv``: header ``row,0,1,...``
    and one line per row, each cell as `encode.csv_table` writes it (`encode.float_token`),
    the same text, several times faster (rows with no integral or non-finite value are
    formatted by ``str.format`` in one call)."""
    from tb_gradmom.analysis import encode

    grid = np.asarray(grid, dtype=np.float64)
    token = encode.float_token
    fast = "{:.9g}".format
    with np.errstate(invalid="ignore"):
        special = ~np.isfinite(grid) | ((grid == np.round(grid)) & (np.abs(grid) < 1e15))
    lines = ["row," + ",".join(map(str, range(grid.shape[1])))]
    for i, (row, slow) in enumerate(zip(grid.tolist(), special.any(axis=1).tolist())):
        cells = ",".join([token(v) for v in row]) if slow else ",".join(map(fast, row))
        lines.append(f"{i},{cells}")
    return "\r\n".join(lines) + "\r\n"


def moments_table(arrays: dict[int, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """Header and rows ``[index, m1, m2, ...]`` of raw moments, one row per stored element."""
    orders = sorted(arrays)
    cols = [np.asarray(arrays[p], dtype=np.float64).ravel() for p in orders]
    size = cols[0].size if cols else 0
    table = np.column_stack([np.arange(size, dtype=np.float64), *cols])
    return ["index", *[f"m{p}" for p in orders]], table


# ------------------------------------------------------------------ the binary form

BINARY_MAGIC = b"GMB1"
BINARY_MIME = "application/octet-stream"
_ALIGN = 8
_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
_DTYPES = {"float32": "<f4", "float64": "<f8", "uint32": "<u4"}


def _wire(a: np.ndarray) -> np.ndarray:
    """The array as sent: float32 when that keeps every value (finite values stay finite and
    nonzero ones stay normal, so precision is float32's everywhere), else float64; integers as
    uint32 when they fit, else float64. Little-endian."""
    if a.dtype.kind in "iub":
        if a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < 2**32):
            return a.astype("<u4")
        return a.astype("<f8")
    a = np.asarray(a, dtype=np.float64)
    finite = np.abs(a[np.isfinite(a)])
    nonzero = finite[finite > 0]
    if nonzero.size and (nonzero.max() > _F32_MAX or nonzero.min() < _F32_TINY):
        return a.astype("<f8")
    return a.astype("<f4")


def to_binary(payload: dict, float64: tuple[str, ...] = ()) -> bytes:
    """A payload as the binary form of docs/http_api.md ("Binary responses").

    Every numpy array of one dimension or more in ``payload`` (at any depth of dicts and
    lists) is sent as raw little-endian numbers (`_wire`: float32, float64 or uint32); the rest
    is a JSON header in which each such array is ``{"$array": i}``, ``i`` indexing the
    header's ``"$arrays"`` list of ``{"dtype", "shape", "offset"}`` (``offset`` in bytes from
    the start of the data, a multiple of 8). Arrays under a key named in ``float64`` are
    sent as float64 whatever their values (a histogram's ``edges``: bin boundaries). Layout: ``GMB1``, the header's length as a
    little-endian uint32, the header (UTF-8 JSON, padded with spaces to a multiple of 8
    bytes), then the data.
    """
    from tb_gradmom.analysis import encode

    arrays: list[np.ndarray] = []
    specs: list[dict] = []
    offset = 0

    def walk(v, exact=False):
        nonlocal offset
        if isinstance(v, np.ndarray) and v.ndim >= 1:
            w = v.astype("<f8") if exact and v.dtype.kind == "f" else _wire(v)
            specs.append({"dtype": w.dtype.name, "shape": list(w.shape), "offset": offset})
            arrays.append(w)
            offset += -(-w.nbytes // _ALIGN) * _ALIGN
            return {"$array": len(arrays) - 1}
        if isinstance(v, dict):
            return {k: walk(x, k in float64) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    head = walk(payload)
    head["$arrays"] = specs
    text = encode.to_json(head).encode("utf-8")
    text += b" " * (-(len(text) + 8) % _ALIGN)
    out = bytearray(BINARY_MAGIC + struct.pack("<I", len(text)) + text)
    for w in arrays:
        out += w.tobytes()
        out += bytes(-len(out) % _ALIGN)
    return bytes(out)


def from_binary(body: bytes) -> dict:
    """The payload of a `to_binary` body: its header with every ``{"$array": i}`` replaced by
    the array (float32, float64 or uint32 as sent; ``"$arrays"`` removed).

    Raises:
      ValueError: if ``body`` is not in the binary form (magic, lengths, dtypes, offsets).
    """
    if len(body) < 8 or body[:4] != BINARY_MAGIC:
        raise ValueError(f"not a Grad Moments binary payload (starts {body[:4]!r}, not GMB1)")
    (n,) = struct.unpack_from("<I", body, 4)
    if 8 + n > len(body):
        raise ValueError(f"binary payload header of {n} bytes is longer than the body")
    head = json.loads(body[8 : 8 + n].decode("utf-8"))
    start = 8 + n
    arrays = []
    for spec in head.pop("$arrays"):
        if spec["dtype"] not in _DTYPES:
            raise ValueError(
                f"binary payload array dtype {spec['dtype']!r} is not one of {list(_DTYPES)}"
            )
        dtype = np.dtype(_DTYPES[spec["dtype"]])
        count = math.prod(spec["shape"])
        begin = start + int(spec["offset"])
        if begin + count * dtype.itemsize > len(body):
            raise ValueError(f"binary payload array {spec} runs past the body's end")
        a = np.frombuffer(body, dtype=dtype, count=count, offset=begin)
        arrays.append(a.reshape(spec["shape"]))

    def walk(v):
        if isinstance(v, dict):
            if set(v) == {"$array"}:
                return arrays[v["$array"]]
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(head)
