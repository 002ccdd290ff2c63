"""Matplotlib figures of logged gradient moments: the plots of the TensorBoard tab, for papers.

    from tb_gradmom.viz import plot
    fig = plot.heatmap("runs/demo", "dense/kernel", stat="variance", scale="log")
    plot.save(fig, "variance.pdf")   # or fig.savefig(...)

Every figure is built from `tb_gradmom.analysis.data.load` and the statistics of
`tb_gradmom.analysis.reductions` and `tb_gradmom.analysis.stats` (the same code the tab's backend uses). The
``*_data`` functions return the plotted numbers without matplotlib (the exporter writes them
as CSV and JSON); the figure functions draw exactly those numbers.

Matplotlib is an optional dependency: ``pip install "tb_gradmom[plots]"``. Figures are
`matplotlib.figure.Figure` objects made without pyplot, so no GUI backend is touched; sized
for one column of a two-column paper (3.4 inches wide) with 8-point text.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tb_gradmom import metadata
from tb_gradmom.analysis import data, reductions, stats, views
from tb_gradmom.analysis import examples as ex

__all__ = [
    "COLORMAPS",
    "SIGNED_STATS",
    "DEFAULT_SMOOTHING",
    "PLOTS",
    "RUN_PALETTE",
    "CURVE_DEFAULTS",
    "load_source",
    "select_record",
    "heatmap_data",
    "histogram_data",
    "curves_data",
    "summary_data",
    "heatmap",
    "histogram",
    "curves",
    "summary",
    "save",
    "EXAMPLE_PLOTS",
    "load_examples_source",
    "norms_data",
    "outliers_data",
    "clipped_data",
    "norms",
    "outliers",
    "clipped",
]

# The colour maps of the tab (same names and lookup tables as matplotlib's).
COLORMAPS: tuple[str, ...] = (
    "viridis",
    "magma",
    "inferno",
    "plasma",
    "cividis",
    "gray",
    "RdBu_r",
)
PLOTS: tuple[str, ...] = ("heatmap", "histogram", "curves", "summary")
# The figures of the per-example norms (tags ``_examples``): the fan chart of their quantiles,
# the outlier table, the fraction clipped at a clipping norm.
EXAMPLE_PLOTS: tuple[str, ...] = ("norms", "outliers", "clipped")
# The presentation constants shared with the tab (served by the plugin's /meta), from `views`:
# statistics that take both signs get a diverging map (RdBu_r) symmetric around zero by
# default; the curves' default smoothing; curves whose non-positive values are marked (noise
# dominated), not drawn; the run colours (TensorBoard's palette, in sorted run order); the
# derived quantities drawn by `curves` when none are named.
SIGNED_STATS: tuple[str, ...] = views.SIGNED_STATS
DEFAULT_SMOOTHING = views.DEFAULT_SMOOTHING
_POSITIVE_ONLY = views.POSITIVE_ONLY
RUN_PALETTE: tuple[str, ...] = views.RUN_PALETTE
CURVE_DEFAULTS: tuple[str, ...] = views.CURVE_DEFAULTS

_COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper
_MISSING = "#cccccc"  # NaN cells, and cells <= 0 on a log scale (the tab's light theme)
_RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "figure.dpi": 100,
    "svg.fonttype": "none",
    "pdf.fonttype": 42,
}

Runs = Mapping[str, Mapping[str, Sequence[data.Record]]]


def _mpl():
    try:
        import matplotlib
        import matplotlib.ticker
        from matplotlib import colors
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            'tb_gradmom.viz.plot needs matplotlib, which is not installed: pip install "tb_gradmom[plots]"'
        ) from None
    return matplotlib, colors, Figure


# ----------------------------------------------------------------------------- selection


def load_source(source: str | os.PathLike | Runs) -> Runs:
    """The loaded runs of a source.

    Args:
      source: a logdir (loaded with `data.load`) or the result of `data.load` (used as is, so
        one load can serve many figures).

    Returns:
      ``{run: {tag: [Record, ...]}}``.
    """
    if isinstance(source, (str, os.PathLike)):
        return data.load(source)
    return source


def _pick_run(runs: Runs, tag: str, run: str | None) -> str:
    if run is not None:
        if run not in runs:
            raise ValueError(f"no run {run!r}; runs: {', '.join(map(repr, runs)) or 'none'}")
        if tag not in runs[run]:
            raise ValueError(
                f"no tag {tag!r} in run {run!r}; tags: {', '.join(map(repr, runs[run]))}"
            )
        return run
    having = [r for r in runs if tag in runs[r]]
    if not having:
        tags = sorted({t for r in runs.values() for t in r})
        raise ValueError(f"no tag {tag!r} in any run; tags: {', '.join(map(repr, tags))}")
    if len(having) > 1:
        raise ValueError(
            f"tag {tag!r} is in several runs ({', '.join(map(repr, having))}); pass run="
        )
    return having[0]


def _steps_text(records: Sequence[data.Record]) -> str:
    steps = [r.step for r in records]
    if len(steps) > 8:
        return ", ".join(map(str, steps[:3])) + ", ..., " + ", ".join(map(str, steps[-3:]))
    return ", ".join(map(str, steps))


def select_record(
    records: Sequence[data.Record], step: int | str | None = None, where: str = ""
) -> data.Record:
    """The record of one step.

    Args:
      records: one tag's records, sorted by step.
      step: an exact step, or None / ``"latest"`` for the last one.
      where: a description for error messages (``"run '.' tag 'dense/kernel'"``).

    Returns:
      The record.

    Raises:
      ValueError: if there is no record or no record at ``step`` (the message lists the
        logged steps).
    """
    if not records:
        raise ValueError(f"no logged steps for {where or 'this tag'}")
    if step is None or step == "latest":
        return records[-1]
    try:
        wanted = int(step)
    except (TypeError, ValueError):
        raise ValueError(f"step must be an integer or 'latest', got {step!r}") from None
    for r in records:
        if r.step == wanted:
            return r
    raise ValueError(
        f"step {wanted} was not logged for {where or 'this tag'}; steps: {_steps_text(records)}"
    )


def _stat_of(rec: data.Record, stat: str, where: str) -> np.ndarray:
    if not rec.moments:
        raise ValueError(f"{where} holds stats only (no moments); use curves or summary")
    n = rec.batch_size
    reductions.check_stat(stat, tuple(rec.moments), n, f"{where} step {rec.step}")
    # Statistics that do not depend on n take any valid one.
    return reductions.stat_array(rec.moments, n if reductions.valid_batch_size(n) else 1, stat)


# ----------------------------------------------------------------------------- data


def heatmap_data(
    source: str | os.PathLike | Runs,
    tag: str,
    run: str | None = None,
    step: int | str | None = None,
    stat: str = "variance",
) -> dict[str, Any]:
    """The numbers of a heatmap: an element-wise statistic on the variable's 2-D view.

    Args:
      source: a logdir or the result of `data.load`.
      tag: the variable tag, e.g. ``"dense/kernel"``.
      run: the run; may be omitted when only one run has the tag.
      step: an exact step, or None / ``"latest"``.
      stat: one of `reductions.STATS`.

    Returns:
      A dict with ``run``, ``tag``, ``step``, ``wall_time``, ``stat``, ``label``,
      ``batch_size``, ``shape`` (the variable's), ``pooled``, ``block`` (the logging block),
      and ``grid``: float64 ``[rows, cols]``, the statistic on `metadata.to_2d_shape` of the
      variable (block means when the variable was logged pooled).
    """
    runs = load_source(source)
    run = _pick_run(runs, tag, run)
    where = f"run {run!r} tag {tag!r}"
    rec = select_record(runs[run][tag], step, where)
    grid = reductions.to_2d(_stat_of(rec, stat, where))
    block: tuple[int, ...] = (1, 1)
    if rec.pooled and isinstance(rec.content, metadata.MomentsContent):
        block = tuple(rec.content.block)
    return {
        "run": run,
        "tag": tag,
        "step": rec.step,
        "wall_time": rec.wall_time,
        "stat": stat,
        "label": reductions.stat_label(stat),
        "batch_size": rec.batch_size,
        "shape": tuple(rec.shape),
        "pooled": rec.pooled,
        "block": block,
        "grid": grid,
    }


def histogram_data(
    source: str | os.PathLike | Runs,
    tag: str,
    run: str | None = None,
    step: int | str | Sequence[int] | None = None,
    stat: str = "variance",
    bins: int = 30,
    scale: str = "linear",
) -> dict[str, Any]:
    """The numbers of a histogram of an element-wise statistic over a variable's elements.

    Args:
      source: a logdir or the result of `data.load`.
      tag: the variable tag.
      run: the run; may be omitted when only one run has the tag.
      step: an exact step, None / ``"latest"``, ``"all"``, or a list of steps (one histogram
        per step over shared edges, `reductions.histograms_over_steps`).
      stat: one of `reductions.STATS`.
      bins: the number of bins.
      scale: ``"linear"`` or ``"log"`` (log-spaced bins over the positive values).

    Returns:
      A dict with ``run``, ``tag``, ``steps`` (list), ``stat``, ``label``, ``scale``,
      ``pooled``, ``edges`` ``[bins + 1]`` and ``counts`` (one ``[bins]`` array per step);
      ``dropped`` per step counts the values a bin cannot hold (NaN, Inf, <= 0 on log).
    """
    runs = load_source(source)
    run = _pick_run(runs, tag, run)
    where = f"run {run!r} tag {tag!r}"
    records = runs[run][tag]
    if step == "all":
        recs = list(records)
    elif isinstance(step, Sequence) and not isinstance(step, str):
        recs = [select_record(records, s, where) for s in step]
    else:
        recs = [select_record(records, step, where)]
    arrays = [_stat_of(r, stat, where) for r in recs]
    edges, counts = reductions.histograms_over_steps(arrays, bins=bins, scale=scale)
    return {
        "run": run,
        "tag": tag,
        "steps": [r.step for r in recs],
        "stat": stat,
        "label": reductions.stat_label(stat),
        "scale": scale,
        "pooled": any(r.pooled for r in recs),
        "edges": edges,
        "counts": counts,
        "dropped": [int(a.size - c.sum()) for a, c in zip(arrays, counts, strict=True)],
    }


def curves_data(
    source: str | os.PathLike | Runs,
    tag: str = metadata.MODEL_TAG,
    runs: Sequence[str] | None = None,
    quantities: Sequence[str] | None = None,
    ema: float | None = None,
    smoothing: float | None = None,
    over: str = "variable",
) -> dict[str, Any]:
    """The numbers of curves: derived quantities (`stats.DERIVED`) of one tag over steps.

    Args:
      source: a logdir or the result of `data.load`.
      tag: a tag with stats: a variable tag, or ``"_model"`` for the whole model.
      runs: the runs to include; default every run that has the tag.
      quantities: names from `stats.DERIVED`; default `CURVE_DEFAULTS`. ``"noise_scale_ema"``
        is allowed with ``ema``.
      ema: a decay in ``[0, 1)`` to smooth the noise scale (`stats.derived`).
      smoothing: a decay in ``[0, 1)``: adds ``<quantity>_smoothed`` for each quantity, from
        separately smoothed numerators and denominators (`stats.smoothed`).
      over: ``"variable"`` (the tag's own statistics) or ``"layer"``: those of the layer of
        variable ``tag``, its variables' sums added (`stats.layer_members`,
        `stats.layer_sums`), as the tab's layer curve and ``/series?over=layer``.

    Returns:
      A dict with ``tag``, ``quantities``, ``smoothing``, ``over`` and ``runs``: run ->
      {``"step"``: int64 ``[T]``, quantity: float64 ``[T]``, and ``<quantity>_smoothed`` with
      ``smoothing``}, using only the steps that have stats; with ``over="layer"`` also
      ``layers``: run -> (layer name, the tags summed).
    """
    if over not in ("variable", "layer"):
        raise ValueError(f"over must be 'variable' or 'layer', got {over!r}")
    loaded = load_source(source)
    quantities = tuple(quantities or CURVE_DEFAULTS)
    known = set(stats.DERIVED) | ({"noise_scale_ema"} if ema is not None else set())
    bad = [q for q in quantities if q not in known]
    if bad:
        raise ValueError(
            f"unknown quantities {bad}; expected names from: {', '.join(stats.DERIVED)}"
            + (" (noise_scale_ema needs ema=)" if "noise_scale_ema" in bad else "")
        )
    if runs is None:
        runs = [r for r in loaded if tag in loaded[r]]
    out: dict[str, dict[str, np.ndarray]] = {}
    layers: dict[str, tuple[str, list[str]]] = {}

    def sums_of(run: str, t: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        recs = [r for r in loaded[run][t] if r.stats is not None]
        fields = {
            f: np.array([(r.stats or {}).get(f, np.nan) for r in recs])
            for f in metadata.STATS_FIELDS
        }
        return np.array([r.step for r in recs], dtype=np.int64), fields

    for run in runs:
        _pick_run(loaded, tag, run)
        if not any(r.stats is not None for r in loaded[run][tag]):
            continue
        steps, fields = sums_of(run, tag)
        if over == "layer":
            names = {
                t: recs[0].content.layer
                for t, recs in loaded[run].items()
                if recs and isinstance(recs[0].content, metadata.MomentsContent)
            }
            if tag not in names or not names[tag]:
                raise ValueError(f"tag {tag!r} of run {run!r} is no variable with a layer name")
            groups = [
                t[: -len(metadata.MODEL_TAG)].rstrip("/")
                for t in loaded[run]
                if metadata.is_model_tag(t)
            ]
            members = [
                t
                for t in stats.layer_members(names, tag, groups)
                if any(r.stats is not None for r in loaded[run][t])
            ]
            steps, sums = stats.layer_sums({t: sums_of(run, t) for t in members})
            fields = dict(sums)
            layers[run] = (names[tag], members)
        d = stats.derived(fields, ema=ema)
        out[run] = {"step": steps}
        out[run].update({q: np.asarray(d[q], dtype=np.float64) for q in quantities})
        if smoothing is not None:
            sm = stats.smoothed(fields, smoothing)
            for q in quantities:
                if q in sm:
                    out[run][f"{q}_smoothed"] = np.asarray(sm[q], dtype=np.float64)
    if not out:
        raise ValueError(f"no stats logged for tag {tag!r} in runs {list(runs)}")
    result: dict[str, Any] = {
        "tag": tag,
        "quantities": quantities,
        "smoothing": smoothing,
        "over": over,
    }
    if over == "layer":
        result["layers"] = layers
    return {**result, "runs": out}


def summary_data(
    source: str | os.PathLike | Runs, run: str | None = None, step: int | str | None = None
) -> dict[str, Any]:
    """The numbers of a summary table: one row per tag of a run at one step.

    Args:
      source: a logdir or the result of `data.load`.
      run: the run; may be omitted when there is only one.
      step: an exact step, or None / ``"latest"`` (each tag's latest step).

    Returns:
      A dict with ``run``, ``step`` (the requested step, or None for latest) and ``rows``:
      `views.summary_row` dicts with ``tag``, ``shape``, ``pooled``, ``step``, ``batch_size``
      and every statistic of `views.SUMMARY_STATISTICS` (None without stats), the columns of
      the tab's table; tags without the step are left out.
    """
    runs = load_source(source)
    if run is None:
        if len(runs) != 1:
            raise ValueError(f"several runs ({', '.join(map(repr, runs))}); pass run=")
        run = next(iter(runs))
    if run not in runs:
        raise ValueError(f"no run {run!r}; runs: {', '.join(map(repr, runs))}")
    rows = []
    for tag, records in runs[run].items():
        try:
            rec = select_record(records, step, f"run {run!r} tag {tag!r}")
        except ValueError:
            continue
        info = {"shape": tuple(rec.shape), "pooled": rec.pooled}
        rows.append(views.summary_row(tag, rec.step, rec.stats, **info))
    if not rows:
        raise ValueError(f"step {step} was not logged for any tag of run {run!r}")
    return {"run": run, "step": None if step in (None, "latest") else int(step), "rows": rows}


# ----------------------------------------------------------------------------- figures


def save(fig, path: str | os.PathLike, dpi: int = 300, fmt: str | None = None) -> None:
    """Saves a figure with the publication settings: text kept as text in SVG, TrueType in PDF.

    Args:
      fig: a figure from this module.
      path: the file; the format follows its extension unless ``fmt`` is given.
      dpi: resolution of raster formats (PNG).
      fmt: ``"png"``, ``"svg"``, ``"pdf"``, ... (default from the extension).
    """
    matplotlib, _, _ = _mpl()
    with matplotlib.rc_context(_RC):
        fig.savefig(path, format=fmt, dpi=dpi)


def _figure(figsize, height_ratio=0.8):
    matplotlib, _, Figure = _mpl()
    if figsize is None:
        figsize = (_COLUMN_WIDTH, _COLUMN_WIDTH * height_ratio)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=figsize, layout="constrained")
    return fig


def _title(*parts: str) -> str:
    text = " · ".join(p for p in parts if p)
    return "\n".join(textwrap.wrap(text, 48)) or text


def _check_cmap(cmap: str) -> None:
    if cmap not in COLORMAPS:
        raise ValueError(f"unknown colour map {cmap!r}; expected one of: {', '.join(COLORMAPS)}")


def _axis_labels(shape: tuple[int, ...]) -> tuple[str, str]:
    rows, cols = metadata.to_2d_shape(shape)
    if len(shape) <= 1:
        return ("", f"element index (0–{cols - 1})")
    if len(shape) == 2:
        return (f"input index, axis 0 (0–{rows - 1})", f"output index, axis 1 (0–{cols - 1})")
    dims = "×".join(str(s) for s in shape[:-1])
    return (
        f"flattened axes 0–{len(shape) - 2} ({dims} = {rows})",
        f"output index, axis {len(shape) - 1} (0–{cols - 1})",
    )


def heatmap(
    source: str | os.PathLike | Runs,
    tag: str,
    run: str | None = None,
    *,
    scale: str = "linear",
    cmap: str | None = None,
    max_cells: tuple[int, int] = (512, 512),
    vmin: float | None = None,
    vmax: float | None = None,
    figsize: tuple[float, float] | None = None,
    step: int | str | None = None,
    stat: str = "variance",
):
    """A heatmap of an element-wise statistic of one variable at one step.

    The variable is drawn on its 2-D view (`metadata.to_2d_shape`: all axes but the last are
    rows), axes in element indices of the variable also when it was logged pooled. Grids bigger
    than ``max_cells`` are shown as NaN-aware block means (`reductions.pool_2d`), said in the
    title. Cells are a rasterized mesh, so SVG and PDF files stay small. NaN cells, and cells <= 0 on a log scale,
    are grey.

    Args:
      source, tag, run: which variable, as in `heatmap_data`.
      scale: colour scale, ``"linear"`` or ``"log"``.
      cmap: one of `COLORMAPS`; default ``"RdBu_r"`` on a range symmetric around zero for the
        signed statistics (`SIGNED_STATS`: mean, third moment, skewness), else ``"viridis"``.
      max_cells: the most ``(rows, cols)`` drawn.
      vmin: lower end of the colour scale; default the smallest finite (positive) value.
      vmax: upper end; default the largest finite value.
      figsize: inches; default one paper column.
      step, stat: which numbers, as in `heatmap_data`.

    Returns:
      A `matplotlib.figure.Figure`.
    """
    diverging = cmap is None and stat in SIGNED_STATS and scale == "linear"
    if cmap is None:
        cmap = "RdBu_r" if diverging else "viridis"
    _check_cmap(cmap)
    if scale not in reductions.SCALES:
        raise ValueError(f"unknown scale {scale!r}; expected 'linear' or 'log'")
    d = heatmap_data(source, tag, run=run, step=step, stat=stat)
    matplotlib, colors, _ = _mpl()
    grid = d["grid"]
    shown, view_block = reductions.pool_2d(grid, *max_cells)
    finite = grid[np.isfinite(grid)]
    if scale == "log":
        finite = finite[finite > 0]
    lo = vmin if vmin is not None else (float(finite.min()) if finite.size else None)
    hi = vmax if vmax is not None else (float(finite.max()) if finite.size else None)
    if scale == "log":
        lo, hi = lo or 1.0, hi or 10.0
        if lo == hi:
            lo, hi = lo / math.sqrt(10), hi * math.sqrt(10)
        norm = colors.LogNorm(vmin=lo, vmax=hi)
        shown = np.where(shown > 0, shown, np.nan)
    else:
        lo, hi = (0.0, 1.0) if lo is None or hi is None else (lo, hi)
        if diverging and vmin is None and vmax is None:
            a = max(abs(lo), abs(hi)) or 1.0
            lo, hi = -a, a  # zero in the middle of the map
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        norm = colors.Normalize(vmin=lo, vmax=hi)
    colour_map = matplotlib.colormaps[cmap].with_extremes(bad=_MISSING)
    fig = _figure(figsize)
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
        # Cell edges in element indices of the variable's 2-D view: a cell is a block of the
        # logging pool times a block of the display pool; blocks at the edges may be ragged.
        rows, cols = metadata.to_2d_shape(d["shape"])
        br, bc = d["block"][0] * view_block[0], d["block"][1] * view_block[1]
        y_edges = np.minimum(np.arange(shown.shape[0] + 1) * br, rows) - 0.5
        x_edges = np.minimum(np.arange(shown.shape[1] + 1) * bc, cols) - 0.5
        image = ax.pcolormesh(
            x_edges,
            y_edges,
            np.ma.masked_invalid(shown),
            cmap=colour_map,
            norm=norm,
            rasterized=True,
        )
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)  # row 0 at the top, as in a matrix
        ylabel, xlabel = _axis_labels(d["shape"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if rows == 1:
            ax.set_yticks([])
        label = d["label"]
        if d["batch_size"] is not None:
            label += f", n = {d['batch_size']}"
        bar = fig.colorbar(image, ax=ax, extend="neither")
        bar.set_label(label)
        if scale != "log":
            # Tick labels carry their own exponent (e.g. 5e-10): matplotlib's offset text
            # would sit on top of the title.
            bar.formatter = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}")
            bar.update_ticks()
        notes = []
        if d["pooled"]:
            notes.append(f"logged as {d['block'][0]}×{d['block'][1]} block means")
        if view_block != (1, 1):
            notes.append(f"shown as {view_block[0]}×{view_block[1]} block means")
        shape = "×".join(map(str, d["shape"])) or "scalar"
        ax.set_title(_title(d["run"], d["tag"], f"step {d['step']}", f"[{shape}]", *notes))
    return fig


def histogram(
    source: str | os.PathLike | Runs,
    tag: str,
    run: str | None = None,
    *,
    cmap: str | None = "viridis",
    figsize: tuple[float, float] | None = None,
    step: int | str | Sequence[int] | None = None,
    stat: str = "variance",
    bins: int = 30,
    scale: str = "linear",
):
    """A histogram of an element-wise statistic over the elements of one variable.

    Several steps (``step="all"`` or a list) are drawn as outlines over shared bins, coloured
    from early (dark) to late (bright) with ``cmap``.

    Args:
      source, tag, run: which variable, as in `histogram_data`.
      cmap: one of `COLORMAPS` (for several steps).
      figsize: inches; default one paper column.
      step, stat, bins, scale: which numbers, as in `histogram_data` (``scale="log"``:
        log-spaced bins and a log x axis).

    Returns:
      A `matplotlib.figure.Figure`.
    """
    cmap = cmap or "viridis"
    _check_cmap(cmap)
    d = histogram_data(source, tag, run=run, step=step, stat=stat, bins=bins, scale=scale)
    matplotlib, _, _ = _mpl()
    fig = _figure(figsize, height_ratio=0.7)
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
        edges, counts = d["edges"], d["counts"]
        if len(counts) == 1:
            ax.stairs(counts[0], edges, fill=True, color=RUN_PALETTE[0], alpha=0.85)
        else:
            colour_map = matplotlib.colormaps[cmap]
            for i, (s, c) in enumerate(zip(d["steps"], counts, strict=True)):
                t = i / max(1, len(counts) - 1)
                ax.stairs(c, edges, color=colour_map(0.1 + 0.8 * t), label=f"step {s}")
            if len(counts) <= 8:
                ax.legend(frameon=False)
        if scale == "log":
            ax.set_xscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel(d["label"] + (" (log scale)" if scale == "log" else ""))
        ax.set_ylabel("number of elements" + (" (block means)" if d["pooled"] else ""))
        steps = d["steps"]
        when = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
        ax.set_title(_title(d["run"], d["tag"], when))
    return fig


def curves(
    source: str | os.PathLike | Runs,
    tag: str = metadata.MODEL_TAG,
    *,
    yscale: str = "linear",
    figsize: tuple[float, float] | None = None,
    smoothing: float | None = DEFAULT_SMOOTHING,
    runs: Sequence[str] | None = None,
    quantities: Sequence[str] | None = None,
    ema: float | None = None,
    over: str = "variable",
):
    """Derived quantities (`stats.DERIVED`) of one tag over steps: one panel per quantity.

    As in the tab: with ``smoothing`` (default 0.9) the line is each statistic from separately
    smoothed numerator and denominator (`stats.smoothed`) and the raw per-step values are drawn
    faint; the y range fits the line, so single-step spikes of the raw values are clipped
    rather than flattening the curve. Steps whose value cannot be drawn are marked along the
    bottom, never dropped: a triangle for a noise-dominated estimate (a noise scale or CABS
    batch size <= 0 or infinite, or any value <= 0 on a log axis), a cross for an undefined one
    (NaN).

    Args:
      source, tag: which statistics, as in `curves_data`.
      yscale: ``"linear"``, ``"log"`` or ``"symlog"`` (the noise scale can be negative).
      figsize: inches; default one paper column, 1.1 inches per panel.
      smoothing: EMA decay in ``[0, 1)`` (`DEFAULT_SMOOTHING`); ``None`` or 0 for raw values.
      runs, quantities, ema, over: as in `curves_data`; ``runs`` get one line each in the
        tab's run colours, ``quantities`` default to `CURVE_DEFAULTS`; ``over="layer"`` draws
        the layer of variable ``tag``.

    Returns:
      A `matplotlib.figure.Figure`.
    """
    if quantities is None and ema is not None:
        quantities = (*CURVE_DEFAULTS, "noise_scale_ema")
    smoothing = smoothing or None
    d = curves_data(
        source, tag=tag, runs=runs, quantities=quantities, ema=ema, smoothing=smoothing, over=over
    )
    matplotlib, _, _ = _mpl()
    qs = d["quantities"]
    if figsize is None:
        figsize = (_COLUMN_WIDTH, 0.6 + 1.1 * len(qs))
    fig = _figure(figsize)
    run_names = sorted(d["runs"])
    colours = {r: RUN_PALETTE[i % len(RUN_PALETTE)] for i, r in enumerate(run_names)}
    with matplotlib.rc_context(_RC):
        axes = fig.subplots(len(qs), 1, sharex=True, squeeze=False)[:, 0]
        marked_any = False
        for ax, q in zip(axes, qs, strict=True):
            positive = yscale == "log" or q in _POSITIVE_ONLY
            shown = []
            for run in run_names:
                series = d["runs"][run]
                smooth = series.get(f"{q}_smoothed")
                raw = series[q]
                line = raw if smooth is None else smooth
                drawn, noisy, undefined = _split_curve(line, positive)
                if smooth is not None:
                    faint, _, _ = _split_curve(raw, positive)
                    ax.plot(series["step"], faint, color=colours[run], lw=0.6, alpha=0.3)
                ax.plot(series["step"], drawn, color=colours[run], lw=1.0, label=run)
                shown.append(drawn[np.isfinite(drawn)])
                # Marks along the bottom of the axes (x in data, y in axes coordinates).
                at = ax.get_xaxis_transform()
                steps = series["step"]
                for mask, marker in ((noisy, "v"), (undefined, "x")):
                    if mask.any():
                        ax.plot(
                            steps[mask],
                            np.full(mask.sum(), 0.04),
                            marker,
                            ms=3,
                            transform=at,
                            color=colours[run],
                            clip_on=False,
                        )
                marked_any = marked_any or bool(noisy.any() or undefined.any())
            ax.set_ylabel(q.replace("_", " "))
            ax.set_yscale(yscale)
            _fit_ylim(ax, np.concatenate(shown) if shown else np.array([]), yscale)
            ax.grid(True, color="#e0e0e0", lw=0.5)
        axes[-1].set_xlabel(
            "step\n▼ noise-dominated (≤ 0 or ∞) · × undefined" if marked_any else "step"
        )
        # At most 6 integer step ticks: long runs' 5-digit steps would overlap otherwise.
        axes[-1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=6, integer=True))
        if len(run_names) > 1:
            axes[0].legend(frameon=False, ncols=min(3, len(run_names)))
        name = "whole model" if tag == metadata.MODEL_TAG else tag
        if metadata.is_model_tag(tag) and tag != metadata.MODEL_TAG:
            name = f"whole model {tag[: -len(metadata.MODEL_TAG) - 1]}"
        if over == "layer":
            layer, members = next(iter(d["layers"].values()))
            name = f"layer {layer} ({len(members)} variables summed)"
        smooth_note = f"smoothing {smoothing} (raw faint)" if smoothing else ""
        axes[0].set_title(_title(name, "derived quantities", smooth_note))
    return fig


def _split_curve(values: np.ndarray, positive: bool):
    """(line with gaps, noise-dominated mask, undefined mask), as core.js splitCurve."""
    v = np.asarray(values, dtype=np.float64)
    undefined = np.isnan(v)
    noisy = ~undefined & (~np.isfinite(v) | ((v <= 0) if positive else False))
    return np.where(undefined | noisy, np.nan, v), noisy, undefined


def _fit_ylim(ax, values: np.ndarray, yscale: str) -> None:
    """The y range of the drawn line (padded), so that faint raw spikes are clipped."""
    if yscale == "log":
        values = values[values > 0]
    if not values.size:
        return
    lo, hi = float(values.min()), float(values.max())
    if yscale == "log":
        lo, hi = (lo / 1.5, hi * 1.5) if lo < hi else (lo / 3, hi * 3)
    else:
        pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi), 1.0) * 0.5
        lo, hi = lo - pad, hi + pad
    ax.set_ylim(lo, hi)


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.3g}"
    return str(v)


def summary(
    source: str | os.PathLike | Runs,
    run: str | None = None,
    *,
    step: int | str | None = None,
    quantities: Sequence[str] = ("total_variance", "grad_norm_sq", "noise_scale", "gsnr_mean"),
    figsize: tuple[float, float] | None = None,
):
    """A table of derived quantities per tag of one run at one step.

    Args:
      source, run, step: which numbers, as in `summary_data`.
      quantities: columns from `stats.DERIVED`.
      figsize: inches; default two paper columns wide, 0.22 inches per row.

    Returns:
      A `matplotlib.figure.Figure`.
    """
    d = summary_data(source, run=run, step=step)
    matplotlib, _, _ = _mpl()
    bad = [q for q in quantities if q not in stats.DERIVED]
    if bad:
        raise ValueError(
            f"unknown quantities {bad}; expected names from: {', '.join(stats.DERIVED)}"
        )
    header = ["tag", "step", "shape", "n", *[q.replace("_", " ") for q in quantities]]
    cells = [
        [
            r["tag"],
            str(r["step"]),
            "×".join(map(str, r["shape"])) or "–",
            _fmt(r["batch_size"]),
            *[_fmt(r[q]) for q in quantities],
        ]
        for r in d["rows"]
    ]
    if figsize is None:
        figsize = (2 * _COLUMN_WIDTH, 0.5 + 0.22 * (len(cells) + 1))
    fig = _figure(figsize)
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
        ax.axis("off")
        table = ax.table(cellText=cells, colLabels=header, loc="upper center", cellLoc="left")
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        table.auto_set_column_width(list(range(len(header))))
        when = "latest step" if d["step"] is None else f"step {d['step']}"
        ax.set_title(_title(d["run"], when, "variance unbiased"))
    return fig


# ----------------------------------------------------------------------- per-example norms

ExampleRuns = Mapping[str, Mapping[str, Sequence[data.ExamplesRecord]]]


def load_examples_source(source: str | os.PathLike | ExampleRuns) -> ExampleRuns:
    """The per-example norms of a source: a logdir (read with `data.load_examples`) or the
    result of `data.load_examples` (used as is)."""
    if isinstance(source, (str, os.PathLike)):
        return data.load_examples(source)
    return source


def _pick_examples(
    source: str | os.PathLike | ExampleRuns, run: str | None, tag: str | None
) -> tuple[str, str, Sequence[data.ExamplesRecord]]:
    """(run, tag, records) of one per-example tag; run and tag may be left out when only one
    fits."""
    runs = load_examples_source(source)
    if not runs:
        raise ValueError(
            "no per-example norms were logged here: log them with "
            "summary.moments(..., log_examples=True) or example_ids="
        )
    if run is None:
        having = [r for r in runs if tag is None or tag in runs[r]]
        if len(having) != 1:
            shown = ", ".join(map(repr, having or list(runs)))
            raise ValueError(
                f"per-example norms {'of tag ' + repr(tag) + ' ' if tag else ''}are in "
                f"{len(having)} runs ({shown}); pass run="
            )
        run = having[0]
    if run not in runs:
        raise ValueError(
            f"run {run!r} has no per-example norms; runs with them: {', '.join(map(repr, runs))}"
        )
    tags = list(runs[run])
    if tag is None:
        if len(tags) != 1:
            raise ValueError(f"run {run!r} has several per-example tags ({tags}); pass tag=")
        tag = tags[0]
    if tag not in runs[run]:
        raise ValueError(f"run {run!r} has no per-example tag {tag!r}; its tags: {tags}")
    return run, tag, runs[run][tag]


def norms_data(
    source: str | os.PathLike | ExampleRuns,
    run: str | None = None,
    tag: str | None = None,
    column: str = ex.MODEL,
) -> dict[str, Any]:
    """The numbers of `norms`: `analysis.examples.quantiles` of one per-example tag (the
    tab's fan chart), with ``run`` and ``tag``."""
    run, tag, recs = _pick_examples(source, run, tag)
    return {"run": run, "tag": tag, **ex.quantiles(recs, column)}


def outliers_data(
    source: str | os.PathLike | ExampleRuns,
    run: str | None = None,
    tag: str | None = None,
    column: str = ex.MODEL,
    threshold: float = ex.DEFAULT_OUTLIER_RATIO,
    limit: int | None = None,
) -> dict[str, Any]:
    """The numbers of `outliers`: `analysis.examples.outliers` (the tab's outlier table)."""
    run, tag, recs = _pick_examples(source, run, tag)
    return {"run": run, "tag": tag, **ex.outliers(recs, column, threshold, limit)}


def clipped_data(
    source: str | os.PathLike | ExampleRuns,
    clip_norm: float,
    run: str | None = None,
    tag: str | None = None,
    column: str = ex.MODEL,
) -> dict[str, Any]:
    """The numbers of `clipped`: `analysis.examples.clipped` at ``clip_norm``."""
    run, tag, recs = _pick_examples(source, run, tag)
    return {"run": run, "tag": tag, **ex.clipped(recs, clip_norm, column)}


def _subject(d: Mapping[str, Any]) -> str:
    column = "whole model" if d["column"] == ex.MODEL else d["column"]
    return _title(d["run"], d["tag"], column)


def norms(
    source: str | os.PathLike | ExampleRuns,
    run: str | None = None,
    tag: str | None = None,
    column: str = ex.MODEL,
    *,
    yscale: str | None = None,
    figsize: tuple[float, float] | None = None,
):
    """The fan chart of the per-example gradient norms ``||g_j||`` over steps: the median,
    the 50 %, 90 % and 99 % bands and the max (`norms_data`), as the tab draws it.

    Args:
      source: a logdir or the result of `data.load_examples`.
      run, tag: which per-example tag (may be left out when only one fits).
      column: ``"model"``, a layer or a variable.
      yscale: ``"log"`` or ``"linear"``; default log when every drawn value is positive.
      figsize: inches; default one paper column.

    Returns:
      A `matplotlib.figure.Figure`.
    """
    d = norms_data(source, run, tag, column)
    matplotlib, _, _ = _mpl()
    steps = np.asarray(d["steps"], dtype=np.float64)
    q = {k: np.asarray(v, dtype=np.float64) for k, v in d["quantiles"].items()}
    top = np.asarray(d["max"], dtype=np.float64)
    drawn = np.concatenate([*q.values(), top]) if len(steps) else np.array([])
    if yscale is None:
        yscale = "log" if len(drawn) and np.all(drawn[np.isfinite(drawn)] > 0) else "linear"
    fig = _figure(figsize)
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
        color = "#1565c0"
        for (label, lo, hi), alpha in zip(ex.BANDS, (0.12, 0.18, 0.3)):
            ax.fill_between(steps, q[lo], q[hi], color=color, alpha=alpha, lw=0, label=label)
        ax.plot(steps, q["p50"], color=color, lw=1.5, marker="o", ms=2, label="median")
        ax.plot(steps, top, color=color, lw=1, ls="--", label="max")
        ax.set_yscale(yscale)
        ax.set_xlabel("step")
        ax.set_ylabel("per-example gradient norm ||g_j||")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=6, integer=True))
        ax.legend(frameon=False, ncols=3, loc="best")
        capped = sum(d["capped"])
        note = f"{capped} capped steps: quantiles estimated" if capped else ""
        ax.set_title(_title(_subject(d), note))
    return fig


def outliers(
    source: str | os.PathLike | ExampleRuns,
    run: str | None = None,
    tag: str | None = None,
    column: str = ex.MODEL,
    *,
    threshold: float = ex.DEFAULT_OUTLIER_RATIO,
    limit: int = 30,
    figsize: tuple[float, float] | None = None,
):
    """The outlier table: the examples whose norm exceeded ``threshold`` times their step's
    median, by id, ranked as the tab ranks them (`outliers_data`), the first ``limit`` rows.

    Returns:
      A `matplotlib.figure.Figure`.
    """
    d = outliers_data(source, run, tag, column, threshold, limit)
    matplotlib, _, _ = _mpl()
    header = ["id", "outlier steps", "seen", "max ratio", "at step", "mean ratio", "last loss"]
    keys = ["id", "outlier_steps", "seen", "max_ratio", "max_step", "mean_ratio", "last_loss"]
    cells = [[str(r["id"]) if k == "id" else _fmt(r[k]) for k in keys] for r in d["rows"]]
    if figsize is None:
        figsize = (2 * _COLUMN_WIDTH, 0.6 + 0.22 * (max(1, len(cells)) + 1))
    fig = _figure(figsize)
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
        ax.axis("off")
        shown = f"{len(cells)} of {d['total']}" if d["total"] > len(cells) else str(d["total"])
        by = "batch position (no ids logged)" if d["keyed_by"] == "position" else "id"
        ax.set_title(
            _title(_subject(d), f"{shown} outliers (norm / median > {threshold:g}) by {by}")
        )
        if cells:
            table = ax.table(cellText=cells, colLabels=header, loc="upper center", cellLoc="left")
            table.auto_set_font_size(False)
            table.set_fontsize(7)
            table.auto_set_column_width(list(range(len(header))))
        else:
            ax.text(0.5, 0.5, "no outliers at this threshold", ha="center", va="center")
    return fig


def clipped(
    source: str | os.PathLike | ExampleRuns,
    clip_norm: float,
    run: str | None = None,
    tag: str | None = None,
    column: str = ex.MODEL,
    *,
    figsize: tuple[float, float] | None = None,
):
    """The fraction of examples whose norm exceeds the clipping norm ``C`` per step
    (`clipped_data`): what DP-SGD's per-example clipping at ``C`` would scale down.

    Returns:
      A `matplotlib.figure.Figure`.
    """
    d = clipped_data(source, clip_norm, run, tag, column)
    matplotlib, _, _ = _mpl()
    fig = _figure(figsize, height_ratio=0.6)
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
        ax.plot(d["steps"], d["fraction"], color="#c62828", lw=1.5, marker="o", ms=2)
        ax.set_ylim(0, max(0.05, *[f for f in d["fraction"] if math.isfinite(f)], 0.05) * 1.05)
        ax.set_xlabel("step")
        ax.set_ylabel("fraction clipped")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=6, integer=True))
        ax.set_title(_title(_subject(d), f"||g_j|| > C = {clip_norm:g}"))
    return fig
