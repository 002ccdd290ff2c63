"""What the plugin, the figures (`tb_gradmom.viz.plot`) and the export show, defined once (numpy only).

* The presentation constants: the element-wise statistics as shown (labels, moment orders,
  whether they need the batch size, whether they take both signs), the run palettes, the
  curves' defaults, the default smoothing, what the tab opens with. `meta` returns all of it
  as JSON-ready data: the plugin serves it (``GET /meta``) and the tab takes every label,
  order and colour from there (its node tests from ``tests/js/meta.json``, a copy of `meta`
  checked by ``tests/test_stats.py``); `tb_gradmom.viz.plot` imports the same constants.
* The model summary table: one row per variable (and one for the whole model) at one step,
  with the same columns wherever it is shown: the tab's table (``/summary``),
  ``plot.summary_data`` and its figure, and ``tb-gradmom export --plot summary``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tb_gradmom.analysis import reductions, stats

__all__ = [
    "SIGNED_STATS",
    "default_scale",
    "RUN_PALETTE",
    "RUN_PALETTE_DARK",
    "CURVE_DEFAULTS",
    "POSITIVE_ONLY",
    "DEFAULT_SMOOTHING",
    "SERIES_KEYS",
    "SERIES_NAMES",
    "LANDING",
    "SUMMARY_STATISTICS",
    "STATISTIC_GROUPS",
    "META_VERSION",
    "element_statistics",
    "meta",
    "summary_row",
    "smoothed_columns",
]

# Element-wise statistics that take both signs: drawn with a diverging colour map (RdBu_r)
# symmetric around zero by default (the tab's heatmap, `plot.heatmap`, the export).
SIGNED_STATS: tuple[str, ...] = ("mean", "third_moment", "skewness")
# Run colours: TensorBoard's palette, assigned in sorted run order (the tab, `plot.curves`).
RUN_PALETTE: tuple[str, ...] = (
    "#425066",
    "#12b5cb",
    "#e52592",
    "#f9ab00",
    "#9334e6",
    "#7cb342",
    "#e8710a",
)
# The same in TensorBoard's dark mode: its first colour is lighter, to show on a dark page.
RUN_PALETTE_DARK: tuple[str, ...] = ("#8e98a3", *RUN_PALETTE[1:])
# Derived quantities drawn by `plot.curves` when none are named.
CURVE_DEFAULTS: tuple[str, ...] = ("noise_scale", "gsnr_mean", "total_variance", "grad_norm_sq")
# Curves whose non-positive values are not estimates of a positive quantity but a sign that
# the noise dominates (docs/math.md): marked, not drawn (the tab's curves, `plot.curves`).
POSITIVE_ONLY: tuple[str, ...] = ("noise_scale", "cabs_batch_size")
# The curves' default smoothing (an EMA decay; `stats.DEFAULT_SMOOTHING`): higher than
# TensorBoard's 0.6 for raw scalars, as these are ratios of estimates logged every N steps.
DEFAULT_SMOOTHING: float = stats.DEFAULT_SMOOTHING
# The keys of /series ``values``, in display order: the batch size, every derived statistic
# (`stats.STATISTICS`), the logged loss and learning rate.
SERIES_KEYS: tuple[str, ...] = ("batch_size", *stats.STATISTICS, "loss", "learning_rate")
# What the /series quantities that are not derived statistics are (those have
# `stats.STATISTICS`): name, meaning, unit; the tab titles and explains their curves with them.
SERIES_NAMES: dict[str, dict[str, str]] = {
    "batch_size": {
        "name": "Batch size",
        "meaning": "the number of examples the moments average over at each step",
        "unit": "examples",
    },
    "loss": {
        "name": "Training loss",
        "meaning": "the loss logged with the moments",
        "unit": "",
    },
    "learning_rate": {
        "name": "Learning rate",
        "meaning": "the learning rate logged with the moments",
        "unit": "",
    },
}
# What kinds of statistics there are, in display order: each `stats.Statistic.group` is one
# of these keys. The tab groups its curve selector and explains each kind with them; two
# statistics in examples from different groups (the noise scale and the CABS batch size)
# answer different questions and may be a thousand times apart.
STATISTIC_GROUPS: dict[str, dict[str, str]] = {
    "noise_scale": {
        "name": "Noise scale (critical batch size)",
        "description": "the batch size, in examples, at which the gradient's noise and signal "
        "balance (McCandlish et al. 2018): a property of the problem at this point of "
        "training, not of the optimizer's settings",
    },
    "signal_to_noise": {
        "name": "Signal-to-noise",
        "description": "dimensionless ratios of the mean gradient to the spread of the "
        "per-example gradients, and the tests built on them",
    },
    "step_size": {
        "name": "Step-size rules",
        "description": "what an adaptive rule would set for the current learning rate: CABS "
        "(Balles et al. 2017) picks a batch size proportional to lr · tr(Σ) / loss; in "
        "examples too, but not an estimate of the noise scale and usually far below it",
    },
    "magnitude": {
        "name": "Gradient magnitudes",
        "description": "the sizes the ratios are made of: the total variance tr(Σ) and the "
        "squared norms of the batch and true gradients",
    },
}
# What the tab opens with: the heatmap's statistic, the curves' quantity, and the summary
# column it sorts by (descending) and lands on (the variable with the largest value).
LANDING: dict[str, str] = {"stat": "variance", "curve": "noise_scale", "sort": "total_variance"}
# The version of `meta`'s layout: bumped when a key is renamed or removed.
META_VERSION = 1

# The summary table's statistic columns, in display order: every derived statistic.
SUMMARY_STATISTICS: tuple[str, ...] = tuple(stats.STATISTICS)


def summary_row(
    tag: str, step: int | None, sums: Mapping[str, float] | None, **info: Any
) -> dict[str, Any]:
    """One row of the summary table.

    Args:
      tag: the variable's tag (or the whole-model tag).
      step: the step shown; None when the tag has nothing at the asked step.
      sums: the `metadata.STATS_FIELDS` sums at that step, or None (no stats).
      **info: what the caller knows of the variable (``shape``, ``size``, ``layer``, ``op``,
        ``pooled``), placed after ``tag``.

    Returns:
      ``{"tag", **info, "step", "batch_size", <each of SUMMARY_STATISTICS>}``: floats from
      `stats.derived` (NaN where a statistic is undefined, e.g. a batch of one has no
      variance; a noise-dominated noise scale is negative, as computed); the batch size and
      the statistics are None without sums.
    """
    row: dict[str, Any] = {"tag": tag, **info, "step": None if step is None else int(step)}
    row["batch_size"] = None
    row.update(dict.fromkeys(SUMMARY_STATISTICS))
    if sums is None or step is None:
        return row
    d = stats.derived(sums)
    row["batch_size"] = float(sums["batch_size"])
    row.update({k: float(d[k]) for k in SUMMARY_STATISTICS})
    return row


def smoothed_columns(history: Mapping[str, Any] | None, smoothing: float) -> dict[str, Any]:
    """The summary row's smoothed statistics at its step: the curves' estimator there.

    Args:
      history: the sums of the steps up to and including the row's step (1-D arrays, oldest
        first), or None (the row has no stats).
      smoothing: the decay in ``[0, 1)`` (`stats.smoothed_at`).

    Returns:
      ``{"smoothed": {statistic: float}, "smoothed_se": {statistic: float}}`` over
      SUMMARY_STATISTICS (`stats.smoothed` and `stats.smoothed_se` at the last step), each
      None without a history.
    """
    if history is None:
        return {"smoothed": None, "smoothed_se": None}
    size = len(next(iter(history.values())))
    values, se = stats.smoothed_at(history, size - 1, smoothing)
    return {
        "smoothed": {k: values[k] for k in SUMMARY_STATISTICS},
        "smoothed_se": {k: se[k] for k in SUMMARY_STATISTICS},
    }


def default_scale(stat: str) -> str:
    """The colour scale a heatmap of ``stat`` opens with, in the tab and in exports: log for the
    non-negative statistics (variances span decades; log shows dead filters at once), linear
    (a diverging map around zero) for the signed ones (`SIGNED_STATS`)."""
    return "linear" if stat in SIGNED_STATS else "log"


def element_statistics() -> list[dict[str, Any]]:
    """The element-wise statistics as shown, in display order (`reductions.STATS`).

    Returns:
      One dict per statistic: ``key``, ``label`` (`reductions.STAT_LABELS`), ``orders`` (the
      moment orders it needs, `reductions.required_orders`), ``needs_batch_size``
      (`reductions.NEEDS_BATCH_SIZE`), ``signed`` (`SIGNED_STATS`) and ``default_scale``
      (`default_scale`).
    """
    return [
        {
            "key": s,
            "label": reductions.stat_label(s),
            "orders": list(reductions.required_orders(s)),
            "needs_batch_size": s in reductions.NEEDS_BATCH_SIZE,
            "signed": s in SIGNED_STATS,
            "default_scale": default_scale(s),
        }
        for s in reductions.STATS
    ]


def meta() -> dict[str, Any]:
    """Everything the tab shows that is not data: served by ``GET /meta`` (docs/http_api.md).

    JSON-ready (lists, dicts, strings, numbers, booleans); the same on every call.

    Returns:
      ``{"version", "element_statistics" (`element_statistics`), "signed_stats",
      "statistics" ({key: `stats.Statistic` as a dict}, in display order), "statistic_groups"
      (`STATISTIC_GROUPS`), "summary_statistics",
      "series_keys", "series_names", "positive_only", "curve_defaults", "default_smoothing",
      "run_palette": {"light", "dark"}, "landing", "scales", "max_bins", "ratio_parts"
      (`stats.RATIO_PARTS`), "noise_note" (`stats.NOISE_SCALE_NOTE`)}``.
    """
    return {
        "version": META_VERSION,
        "element_statistics": element_statistics(),
        "signed_stats": list(SIGNED_STATS),
        "statistics": {k: v.as_dict() for k, v in stats.STATISTICS.items()},
        "statistic_groups": {k: dict(v) for k, v in STATISTIC_GROUPS.items()},
        "summary_statistics": list(SUMMARY_STATISTICS),
        "series_keys": list(SERIES_KEYS),
        "series_names": {k: dict(v) for k, v in SERIES_NAMES.items()},
        "positive_only": list(POSITIVE_ONLY),
        "curve_defaults": list(CURVE_DEFAULTS),
        "default_smoothing": DEFAULT_SMOOTHING,
        "run_palette": {"light": list(RUN_PALETTE), "dark": list(RUN_PALETTE_DARK)},
        "landing": dict(LANDING),
        "scales": list(reductions.SCALES),
        "max_bins": reductions.MAX_BINS,
        "ratio_parts": {k: list(v) for k, v in stats.RATIO_PARTS.items()},
        "noise_note": stats.NOISE_SCALE_NOTE,
    }
