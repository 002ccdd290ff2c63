"""What the plugin, the figures (`tb_gradmom.plot`) and the export show, defined once (numpy only).

The model summary table: one row per variable (and one for the whole model) at one step, with
the same columns wherever it is shown: the tab's table (``/summary``), ``plot.summary_data``
and its figure, and ``tb-gradmom export --plot summary``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tb_gradmom import stats

__all__ = ["SUMMARY_STATISTICS", "summary_row"]

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
