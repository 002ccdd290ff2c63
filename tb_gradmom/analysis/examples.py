"""What the per-example view shows, from logged per-example squared norms (numpy only).

The one implementation behind the tab's per-example section (the plugin's ``/examples/*``
routes), `gradmom.plot`'s per-example figures and ``tb-gradmom export --examples``. Input:
`data.ExamplesRecord` lists (tag ``_examples``, docs/format.md "Per-example norms"). Every
quantity is of the **gradient norm** ``||g_j|| = sqrt(||g_j||^2)`` of example ``j``, for the
whole model (column ``"model"``), a layer or a variable:

* `quantiles`: per step, the quantiles `QUANTILES` (the median, the 50 %, 90 % and 99 % bands)
  and the max, numpy's default (linear) definition;
* `histogram`: the distribution at one step on log-spaced bins;
* `outliers`: examples whose norm is more than ``threshold`` times the step's median
  (`DEFAULT_OUTLIER_RATIO`), tracked across steps by id;
* `clipped`: for a clipping norm ``C``, the fraction of examples with ``||g_j|| > C`` per step
  (what DP-SGD's per-example clipping changes).

**Capped steps.** A step with more examples than ``max_examples`` keeps only some rows: the
``max_examples // 4`` largest and smallest whole-model norms, and the rest evenly spaced in
rank between them (`summary.keep_examples`). Each kept row stands for the examples of its
rank stratum: weight 1 in the two kept quarters, and for a middle row the number of ranks from
it to the next kept one (`row_weights`; the weights sum to the batch size). Quantiles,
histogram counts and clipped fractions are those of the batch with every example replaced by
its stratum's kept row. So on an uncapped step (``rows == batch_size``) everything is exact;
on a capped step the whole-model quantiles whose rank falls in the kept quarters (for
``max_examples = 1024``, the 5 % and 95 % ones up to 5,120 examples, the 0.5 % and 99.5 % ones
up to 51,200) and the max are exact, the others are within one stratum of ranks
(``(batch_size - max_examples // 2) / (max_examples - 2 * (max_examples // 4))`` ranks); a
layer's come from the same rows, a stratified sample of the layer's norms. An outlier is
always among the kept rows (the largest quarter is kept) unless a quarter of the rows are
outliers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tb_gradmom.analysis import encode

__all__ = [
    "QUANTILES",
    "QUANTILE_KEYS",
    "BANDS",
    "DEFAULT_OUTLIER_RATIO",
    "DEFAULT_PER_DECADE",
    "MAX_HIST_BINS",
    "MODEL",
    "columns",
    "norms",
    "row_weights",
    "weighted_quantile",
    "quantiles",
    "histogram",
    "outliers",
    "clipped",
    "quantiles_csv",
    "outliers_csv",
    "clipped_csv",
    "view_info",
]

MODEL = "model"
# The quantiles of the fan chart: its 99 %, 90 % and 50 % bands and the median.
QUANTILES = (0.005, 0.05, 0.25, 0.5, 0.75, 0.95, 0.995)
QUANTILE_KEYS = ("p0.5", "p5", "p25", "p50", "p75", "p95", "p99.5")
# Each band: (label, lower key, upper key), widest first.
BANDS = (("99 %", "p0.5", "p99.5"), ("90 %", "p5", "p95"), ("50 %", "p25", "p75"))
# An example is an outlier at a step when its norm is more than this many times the step's
# median norm (a default; the tab, the plots and the export take another threshold). In the
# tests' log (tests/examples_logdir.py), targets shifted by 40 sit at about 15 to 30 times the median.
DEFAULT_OUTLIER_RATIO = 10.0
# Log-spaced histogram bins per decade of the norm, and the most bins a histogram has.
DEFAULT_PER_DECADE = 10
MAX_HIST_BINS = 1000


def columns(records: Sequence[Any]) -> list[str]:
    """The columns the records offer: ``"model"``, then the layers, then the variables."""
    layers: dict[str, None] = {}
    variables: dict[str, None] = {}
    for r in records:
        layers.update(dict.fromkeys(r.layers))
        variables.update(dict.fromkeys(r.variables))
    return [MODEL, *layers, *[v for v in variables if v not in layers]]


def _squared(rec: Any, column: str) -> np.ndarray:
    if column == MODEL:
        return rec.model
    if column in rec.layers:
        return rec.layers[column]
    if column in rec.variables:
        return rec.variables[column]
    known = [MODEL, *rec.layers, *rec.variables]
    raise ValueError(
        f"column {column!r} is not logged at step {rec.step}: the per-example norms there are "
        f"of {known}; pass one of these (layers and, with per_variable_norms=True, variables)"
    )


def norms(rec: Any, column: str = MODEL) -> np.ndarray:
    """``||g_j||`` (float64 ``[rows]``) of the kept rows of one record, for ``column``
    (``"model"``, a layer or a variable). A negative squared norm (round-off of a difference)
    counts as 0."""
    sq = np.asarray(_squared(rec, column), dtype=np.float64)
    return np.sqrt(np.maximum(sq, 0.0))


def row_weights(rec: Any) -> np.ndarray:
    """How many examples of the batch each kept row stands for (int64 ``[rows]``, summing to
    the batch size): all 1 on an uncapped step; on a capped one 1 in the kept quarters and, for
    a middle row, the ranks from it to the next kept row (see the module docstring)."""
    rows = len(rec.model)
    n = int(rec.batch_size)
    cap = int(rec.max_examples)
    if rows >= n or rows != cap or cap < 4:
        return np.ones(rows, dtype=np.int64)
    k = cap // 4
    mid = cap - 2 * k
    rest = n - 2 * k
    # The writer ranked the whole batch by descending model norm with a stable sort (ties in
    # batch order); the rows are in batch order, so the same stable sort ranks them alike.
    order = np.argsort(-np.asarray(rec.model, dtype=np.float64), kind="stable")
    picks = k + (np.arange(mid + 1, dtype=np.int64) * rest) // mid  # picks[mid] == n - k
    w = np.ones(rows, dtype=np.int64)
    w[order[k : k + mid]] = np.diff(picks)
    return w


def weighted_quantile(values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """numpy's default (linear) quantiles of the array in which each value is repeated its
    (integer) weight times, without building it. NaN for no values; NaNs in ``values`` are
    left out."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.int64)
    keep = ~np.isnan(v) & (w > 0)
    v, w = v[keep], w[keep]
    if not len(v):
        return np.full(len(qs), np.nan)
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    total = int(cum[-1])
    h = np.asarray(qs, dtype=np.float64) * (total - 1)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, total - 1)
    at_lo = v[np.searchsorted(cum, lo, side="right")]
    at_hi = v[np.searchsorted(cum, hi, side="right")]
    frac = h - lo
    with np.errstate(invalid="ignore"):  # inf - inf at an infinite norm: the value itself
        out = at_lo + (at_hi - at_lo) * frac
    return np.where(frac == 0, at_lo, out)


def quantiles(records: Sequence[Any], column: str = MODEL) -> dict[str, Any]:
    """Per step, the quantiles of ``||g_j||`` (`QUANTILE_KEYS`), the max, the mean of
    ``||g_j||^2`` and how many examples and rows there were.

    Returns ``{"column", "steps", "batch_size", "rows", "capped", "quantiles": {key: [...]},
    "max": [...], "mean_sq": [...], "bands", "keys", "levels"}``; lists are per step.
    """
    keys = QUANTILE_KEYS
    qs: dict[str, list[float]] = {k: [] for k in keys}
    out: dict[str, Any] = {
        "column": column,
        "steps": [],
        "batch_size": [],
        "rows": [],
        "capped": [],
        "quantiles": qs,
        "max": [],
        "mean_sq": [],
        "keys": list(keys),
        "levels": list(QUANTILES),
        "bands": [{"label": b[0], "lower": b[1], "upper": b[2]} for b in BANDS],
    }
    for rec in records:
        g = norms(rec, column)
        w = row_weights(rec)
        values = weighted_quantile(g, w, QUANTILES)
        for k, v in zip(keys, values):
            qs[k].append(float(v))
        out["steps"].append(int(rec.step))
        out["batch_size"].append(int(rec.batch_size))
        out["rows"].append(len(g))
        out["capped"].append(len(g) < int(rec.batch_size))
        finite = g[~np.isnan(g)]
        out["max"].append(float(finite.max()) if len(finite) else math.nan)
        sq = np.square(g)
        out["mean_sq"].append(float(np.sum(sq * w) / np.sum(w)) if len(g) else math.nan)
    return out


def _record_at(records: Sequence[Any], step: int | None) -> Any:
    if not records:
        raise ValueError("no per-example norms were logged for this tag")
    if step is None:
        return records[-1]
    for rec in records:
        if rec.step == step:
            return rec
    steps = [r.step for r in records]
    raise ValueError(
        f"step {step} has no per-example norms; the logged steps are {steps[:5]}"
        + (f" ... {steps[-1]}" if len(steps) > 5 else "")
        + " (pass one of them, or none for the latest)"
    )


def histogram(
    records: Sequence[Any],
    step: int | None = None,
    column: str = MODEL,
    per_decade: int = DEFAULT_PER_DECADE,
) -> dict[str, Any]:
    """The distribution of ``||g_j||`` at ``step`` (None: the latest) on log-spaced bins
    ``10 ** (i / per_decade)`` covering the positive norms; zero norms are counted apart.

    Returns ``{"column", "step", "batch_size", "rows", "capped", "per_decade", "edges",
    "counts", "zeros", "nonfinite"}``: ``counts[i]`` examples (rows weighted by `row_weights`)
    in ``[edges[i], edges[i + 1])``, the last bin closed.
    """
    if not (isinstance(per_decade, int) and 1 <= per_decade <= 100):
        raise ValueError(f"per_decade must be an integer from 1 to 100, got {per_decade!r}")
    rec = _record_at(records, step)
    g = norms(rec, column)
    w = row_weights(rec).astype(np.float64)
    finite = np.isfinite(g)
    pos = finite & (g > 0)
    edges: list[float] = []
    counts: list[float] = []
    if pos.any():
        lo = math.floor(math.log10(g[pos].min()) * per_decade)
        hi = math.ceil(math.log10(g[pos].max()) * per_decade)
        hi = max(hi, lo + 1)
        if hi - lo > MAX_HIST_BINS:
            lo = hi - MAX_HIST_BINS
        e = 10.0 ** (np.arange(lo, hi + 1) / per_decade)
        # round-off of 10 ** x: the edges must cover the smallest and largest norm
        e[0] = min(e[0], g[pos].min())
        e[-1] = max(e[-1], g[pos].max())
        c, _ = np.histogram(g[pos], bins=e, weights=w[pos])
        edges, counts = e.tolist(), c.tolist()
    return {
        "column": column,
        "step": int(rec.step),
        "batch_size": int(rec.batch_size),
        "rows": len(g),
        "capped": len(g) < int(rec.batch_size),
        "per_decade": per_decade,
        "edges": edges,
        "counts": counts,
        "zeros": float(np.sum(w[finite & (g == 0)])),
        "nonfinite": float(np.sum(w[~finite])),
    }


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def outliers(
    records: Sequence[Any],
    column: str = MODEL,
    threshold: float = DEFAULT_OUTLIER_RATIO,
    limit: int | None = None,
) -> dict[str, Any]:
    """The examples whose ``||g_j||`` exceeded ``threshold`` times their step's median norm
    at least once, tracked across the logged steps by id.

    Rows are keyed by the logged ``example_ids``; when a step was logged without ids they are
    keyed by batch position (``"keyed_by": "position"``), which names the same example at
    every step only if the data order is fixed. Per key: ``outlier_steps`` (steps it was an
    outlier), ``seen`` (steps it was among the kept rows), ``max_ratio`` and its step,
    ``mean_ratio`` (over the steps seen), ``last_step``, ``last_ratio`` and ``last_loss``
    (its loss at the last step seen). Ranked by ``outlier_steps``, then ``max_ratio``, both
    descending; ``limit`` keeps the first rows (``total`` says how many there were).
    """
    threshold = _check_positive("threshold", threshold)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    keyed_by = "id" if records and all(r.ids is not None for r in records) else "position"
    keys, ratios, steps, losses, medians = [], [], [], [], []
    for rec in records:
        g = norms(rec, column)
        med = float(weighted_quantile(g, row_weights(rec), [0.5])[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            r = g / med if med > 0 else np.where(g > 0, np.inf, np.nan)
        k = rec.ids if keyed_by == "id" else rec.positions
        keys.append(np.asarray(k, dtype=object))
        ratios.append(r)
        steps.append(np.full(len(g), int(rec.step), dtype=np.int64))
        losses.append(np.asarray(rec.losses, dtype=np.float64))
        medians.append(med)
    header = {
        "column": column,
        "threshold": threshold,
        "keyed_by": keyed_by,
        "steps": [int(r.step) for r in records],
        "medians": medians,
        "outliers_per_step": [int(np.sum(r > threshold)) for r in ratios],
    }
    if not records:
        return {**header, "total": 0, "rows": []}
    key = np.concatenate(keys)
    ratio = np.concatenate(ratios)
    step = np.concatenate(steps)
    loss = np.concatenate(losses)
    # group by key (ids may be int64 or strings; as strings they sort and compare alike)
    names = np.array([str(k) for k in key])
    uniq, first, inv = np.unique(names, return_index=True, return_inverse=True)
    hit = ratio > threshold
    # a key counts once per step (an id may repeat in a batch drawn with replacement)
    pair, pair_of = np.unique(np.stack([inv, step]), axis=1, return_inverse=True)
    pair_hit = np.zeros(pair.shape[1], dtype=bool)
    np.logical_or.at(pair_hit, pair_of.ravel(), hit)
    seen = np.bincount(pair[0], minlength=len(uniq))
    n_out = np.bincount(pair[0], weights=pair_hit, minlength=len(uniq)).astype(np.int64)
    by_key = np.argsort(inv, kind="stable")  # each key's rows together, in step order
    starts = np.concatenate([[0], np.cumsum(np.bincount(inv, minlength=len(uniq)))])
    rows = []
    for u in np.flatnonzero(n_out > 0):
        idx = by_key[starts[u] : starts[u + 1]]
        r = ratio[idx]
        rr = np.where(np.isnan(r), -np.inf, r)
        best = int(np.argmax(rr))
        last = idx[-1]
        k = key[first[u]]
        rows.append(
            {
                "id": k.item() if isinstance(k, np.generic) else k,
                "outlier_steps": int(n_out[u]),
                "seen": int(seen[u]),
                "max_ratio": float(r[best]),
                "max_step": int(step[idx[best]]),
                "mean_ratio": float(np.mean(r)),
                "last_step": int(step[last]),
                "last_ratio": float(ratio[last]),
                "last_loss": float(loss[last]),
            }
        )
    rows.sort(key=lambda x: (-x["outlier_steps"], -_order(x["max_ratio"]), str(x["id"])))
    total = len(rows)
    if limit is not None:
        rows = rows[:limit]
    return {**header, "total": total, "rows": rows}


def _order(x: float) -> float:
    return -math.inf if math.isnan(x) else x


def clipped(records: Sequence[Any], clip_norm: float, column: str = MODEL) -> dict[str, Any]:
    """For a clipping norm ``C``: per step, the fraction of examples with ``||g_j|| > C``
    (rows weighted by `row_weights`), the number of them, and the batch size.

    Returns ``{"column", "clip_norm", "steps", "fraction", "clipped", "batch_size",
    "capped"}``.
    """
    c = _check_positive("clip_norm", clip_norm)
    out: dict[str, Any] = {
        "column": column,
        "clip_norm": c,
        "steps": [],
        "fraction": [],
        "clipped": [],
        "batch_size": [],
        "capped": [],
    }
    for rec in records:
        g = norms(rec, column)
        w = row_weights(rec)
        over = float(np.sum(w[g > c]))
        total = float(np.sum(w))
        out["steps"].append(int(rec.step))
        out["clipped"].append(over)
        out["fraction"].append(over / total if total else math.nan)
        out["batch_size"].append(int(rec.batch_size))
        out["capped"].append(len(g) < int(rec.batch_size))
    return out


# ------------------------------------------------------------------------------ tables


def quantiles_table(q: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """`quantiles`' payload as a table: one row per step."""
    header = ["step", "batch_size", "rows", "capped", *q["keys"], "max", "mean_sq"]
    rows = [
        [
            s,
            q["batch_size"][i],
            q["rows"][i],
            int(q["capped"][i]),
            *[q["quantiles"][k][i] for k in q["keys"]],
            q["max"][i],
            q["mean_sq"][i],
        ]
        for i, s in enumerate(q["steps"])
    ]
    return header, rows


OUTLIER_FIELDS = (
    "id",
    "outlier_steps",
    "seen",
    "max_ratio",
    "max_step",
    "mean_ratio",
    "last_step",
    "last_ratio",
    "last_loss",
)


def quantiles_csv(q: dict[str, Any]) -> str:
    """`quantiles`' payload as CSV, one row per step (full precision)."""
    return encode.csv_table(*quantiles_table(q), digits=None)


def outliers_csv(o: dict[str, Any]) -> str:
    """`outliers`' rows as CSV, ranked as in the payload."""
    return encode.csv_table(
        OUTLIER_FIELDS, ([r[f] for f in OUTLIER_FIELDS] for r in o["rows"]), digits=None
    )


def clipped_csv(c: dict[str, Any]) -> str:
    """`clipped`'s payload as CSV, one row per step."""
    header = ["step", "batch_size", "capped", "clipped", "fraction"]
    rows = [
        [s, c["batch_size"][i], int(c["capped"][i]), c["clipped"][i], c["fraction"][i]]
        for i, s in enumerate(c["steps"])
    ]
    return encode.csv_table(header, rows, digits=None)


def view_info() -> dict[str, Any]:
    """What the per-example view shows, for the tab (``/examples/tags``' ``view``): the
    quantiles and bands, the defaults, and the explanations it shows, defined once here."""
    return {
        "keys": list(QUANTILE_KEYS),
        "levels": list(QUANTILES),
        "bands": [{"label": b[0], "lower": b[1], "upper": b[2]} for b in BANDS],
        "default_threshold": DEFAULT_OUTLIER_RATIO,
        "default_per_decade": DEFAULT_PER_DECADE,
        "norm": "per-example gradient norm ||g_j||",
        "notes": {
            "quantiles": (
                "Quantiles of the per-example gradient norm ||g_j|| at each logged step: the "
                "median, the 50 %, 90 % and 99 % bands (25-75 %, 5-95 %, 0.5-99.5 %) and the max."
            ),
            "capped": (
                "Steps with more examples than max_examples keep only some rows: the largest "
                "and smallest quarters and the rest evenly spaced in rank. There the quantiles "
                "in the kept quarters (and the max) are exact, the others within one rank "
                "stratum; on uncapped steps everything is exact."
            ),
            "outliers": (
                "An example is an outlier at a step when its norm is more than the threshold "
                "times the step's median norm. Rows are tracked by example id across the "
                "logged steps (by batch position when no ids were logged)."
            ),
            "clip": (
                "Per step, the fraction of examples whose gradient norm exceeds the clipping "
                "norm C: the examples DP-SGD's per-example clipping would scale down."
            ),
        },
    }
