"""``tb-gradmom export``: the tab's plots as files (png, svg, pdf) or their numbers (csv, json).

    tb-gradmom export --logdir runs/demo --out figures                 # variance heatmaps, latest step
    tb-gradmom export --logdir runs/demo --tag 'dense' --plot histogram --stat snr --format pdf --out f
    tb-gradmom export --logdir runs/demo --plot curves --format csv --out numbers
    tb-gradmom export --logdir runs/x --plot norms --format csv --out numbers      # per-example
    tb-gradmom export --logdir runs/x --plot clipped --clip-norm 1.0 --format json --out numbers

One file per plot, named ``<run>-<tag>-step<N>-<stat>.<ext>`` (characters other than letters,
digits, ``.``, ``_`` and ``-`` become ``_``; the root run ``"."`` is left out of names; a name
longer than the file system allows is cut and ends with a hash of the whole name). The
figures come from `tb_gradmom.viz.plot` and the numbers from its ``*_data`` functions, so a CSV
holds exactly what the figure of the same name draws.

Writing is safe in a shared or hostile ``--out``: existing files are never replaced unless
``--overwrite`` is given (checked for every file before anything is written); each file is
written to a fresh temporary file in ``--out`` and renamed into place, so a figure is there
whole or not at all and a symbolic link planted in ``--out`` is replaced, never followed.
A plot the data cannot give (e.g. a variance without a batch size) is skipped with a warning
and the others are written. Only the runs, tags and steps ``--run``, ``--tag`` and ``--step``
select are read (`data.load`'s ``runs=``, ``tags=`` and ``steps=``, with their ``/_stats``;
curves read every step), with the read's progress on stderr when the event files to read are
big (`data.PROGRESS_MIN_BYTES`). ``--bins`` is capped like the tab's (`reductions.MAX_BINS`) and
``--dpi`` at `MAX_DPI`.

CSV: RFC 4180 with a header row, CRLF line ends, floats in shortest round-trip form, and
non-finite numbers spelled ``NaN``, ``Infinity``, ``-Infinity``. JSON: the same numbers, with
non-finite ones as those strings (the convention of the plugin's HTTP API). Both, and the file
names, come from `tb_gradmom.analysis.encode`, the encoder the plugin uses too.

The per-example norms (tags ``_examples``, `data.load_examples`) export with ``--plot norms``
(the quantiles per step: the tab's fan chart), ``outliers`` (the outlier table; ``--threshold``)
and ``clipped`` (the fraction clipped per step at ``--clip-norm``), for the whole model or
``--column`` (a layer or variable): one file per run and per-example tag, named
``<run>-<tag>-<column>-norm_quantiles.<ext>`` (``-outliers``, ``-clipped_C<C>``), the numbers
of `tb_gradmom.analysis.examples`, as the tab shows them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from tb_gradmom import metadata
from tb_gradmom.analysis import data, encode, reductions, stats, views
from tb_gradmom.analysis import examples as ex
from tb_gradmom.viz import plot

__all__ = [
    "FORMATS",
    "ExportError",
    "ExportWarning",
    "MAX_DPI",
    "Job",
    "plan",
    "export",
    "add_arguments",
    "run_from_args",
]

FORMATS: tuple[str, ...] = ("png", "svg", "pdf", "csv", "json")
IMAGE_FORMATS = ("png", "svg", "pdf")
PROGRESS_MIN_FILES = 10  # a progress bar from this many files on
MAX_DPI = 1200  # a one-column figure at 1200 dpi is 4080 pixels wide (~50 MB of RGBA)
NAME_MAX = encode.NAME_MAX  # shorter if --out's file system says so


class ExportError(ValueError):
    """Bad input for an export (no match, a step that was not logged, ...): one-line message."""


class ExportWarning(UserWarning):
    """A plot was skipped (the data cannot give it); the others were written."""


@dataclass(frozen=True)
class Job:
    """One file to write.

    Attributes:
      plot: one of `plot.PLOTS`.
      run: the run (for curves: None, all matched runs in one figure).
      tag: the tag (for summary: None).
      step: the step (None for curves).
      runs: for curves, the matched runs that have the tag.
      layer: for curves of a layer (``--over layer``), its name (``tag`` is one of its
        variables).
    """

    plot: str
    run: str | None
    tag: str | None
    step: int | None
    runs: tuple[str, ...] = ()
    layer: str | None = None


def _compile(pattern: str | None, what: str):
    if pattern is None:
        return None
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise ExportError(f"--{what} {pattern!r} is not a valid regular expression: {e}") from None


def _parse_step(step: int | str | None) -> int | Literal["latest", "all"]:
    if step is None or step == "latest":
        return "latest"
    if step == "all":
        return "all"
    try:
        return int(step)
    except (TypeError, ValueError):
        raise ExportError(f"--step must be an integer, 'latest' or 'all', got {step!r}") from None


def plan(
    runs: Mapping[str, Mapping[str, Sequence[data.Record]]],
    plot_kind: str = "heatmap",
    run: str | None = None,
    tag: str | None = None,
    step: int | str | None = "latest",
    stat: str = "variance",
) -> list[Job]:
    """The files an export writes, without writing them.

    Args:
      runs: the result of `data.load`.
      plot_kind: one of `plot.PLOTS`.
      run: a regular expression searched in run names (case-insensitive); default all.
      tag: a regular expression searched in tag names (case-insensitive); default all.
      step: an integer, ``"latest"`` or ``"all"`` (ignored by curves).
      stat: the element-wise statistic (heatmap and histogram).

    Returns:
      The jobs, in run, tag, step order.

    Raises:
      ExportError: with a one-line message when nothing matches, the step was not logged, the
        statistic is unknown or no tag logged the moment orders it needs.
    """
    if plot_kind not in plot.PLOTS:
        raise ExportError(f"unknown plot {plot_kind!r}; expected one of: {', '.join(plot.PLOTS)}")
    step = _parse_step(step)
    run_re, tag_re = _compile(run, "run"), _compile(tag, "tag")
    run_names = [r for r in runs if run_re is None or run_re.search(r)]
    if not run_names:
        raise ExportError(f"no run matches --run {run!r}; runs: {', '.join(runs)}")
    pairs = [(r, t) for r in run_names for t in runs[r] if tag_re is None or tag_re.search(t)]
    if not pairs:
        tags = sorted({t for r in run_names for t in runs[r]})
        raise ExportError(f"no tag matches --tag {tag!r}; tags: {', '.join(tags)}")

    def steps_of(records) -> list[int]:
        if step == "latest":
            return [records[-1].step] if records else []
        if step == "all":
            return [r.step for r in records]
        return [step] if any(r.step == step for r in records) else []  # an int here

    jobs: list[Job] = []
    if plot_kind in ("heatmap", "histogram"):
        try:
            needed = reductions.required_orders(stat)
        except ValueError as e:
            raise ExportError(str(e)) from None
        with_moments = [(r, t) for r, t in pairs if runs[r][t] and runs[r][t][0].moments]
        if not with_moments:
            raise ExportError(
                f"the matching tags hold stats only ({', '.join(t for _, t in pairs)}); "
                "use --plot curves or --plot summary"
            )
        usable = [
            (r, t) for r, t in with_moments if all(p in runs[r][t][0].moments for p in needed)
        ]
        if not usable:
            raise ExportError(
                f"--stat {stat} needs moment orders {list(needed)}, which no matching tag logged"
            )
        for r, t in usable:
            jobs += [Job(plot_kind, r, t, s) for s in steps_of(runs[r][t])]
    elif plot_kind == "curves":
        tags = sorted({t for _, t in pairs})
        for t in tags:
            having = tuple(
                r for r in run_names if (r, t) in set(pairs) and any(x.stats for x in runs[r][t])
            )
            if having:
                jobs.append(Job("curves", None, t, None, having))
        if not jobs:
            raise ExportError("no matching tag has stats to draw curves of")
    else:  # summary
        for r in run_names:
            tags = [t for rr, t in pairs if rr == r]
            if step == "latest":
                jobs.append(Job("summary", r, None, None))
            else:
                found = sorted({s for t in tags for s in steps_of(runs[r][t])})
                jobs += [Job("summary", r, None, s) for s in found]
    if not jobs:
        all_steps = sorted({x.step for r, t in pairs for x in runs[r][t]})
        shown = ", ".join(map(str, all_steps[:10])) + (", ..." if len(all_steps) > 10 else "")
        raise ExportError(f"step {step} was not logged for any matching tag; steps: {shown}")
    return jobs


# ----------------------------------------------------------------------------- writing


def _tag(job: Job) -> str:
    """The tag of a heatmap, histogram or curves job (a summary job has none)."""
    if job.tag is None:
        raise ValueError(f"a {job.plot} job has a tag")
    return job.tag


def _numbers(
    job: Job, runs: plot.Runs, opts: dict[str, Any]
) -> tuple[dict[str, Any], list[str], list[list[Any]]]:
    """(json payload, csv header, csv rows) of one job."""
    rows: list[list[Any]]
    if job.plot == "heatmap":
        d = plot.heatmap_data(runs, _tag(job), run=job.run, step=job.step, stat=opts["stat"])
        grid = d["grid"]
        rows = [
            [i, j, float(grid[i, j])] for i in range(grid.shape[0]) for j in range(grid.shape[1])
        ]
        d = {**d, "grid_shape": list(grid.shape)}
        return d, ["row", "col", opts["stat"]], rows
    if job.plot == "histogram":
        d = plot.histogram_data(
            runs,
            _tag(job),
            run=job.run,
            step=job.step,
            stat=opts["stat"],
            bins=opts["bins"],
            scale=opts["scale"] or "linear",
        )
        e, c = d["edges"], d["counts"][0]
        rows = [[float(e[k]), float(e[k + 1]), int(c[k])] for k in range(len(c))]
        return d, ["bin_lo", "bin_hi", "count"], rows
    if job.plot == "curves":
        d = plot.curves_data(
            runs,
            tag=_tag(job),
            runs=job.runs,
            quantities=opts["quantities"],
            ema=opts["ema"],
            smoothing=opts["smoothing"],
            over="variable" if job.layer is None else "layer",
        )
        qs = list(d["quantities"])
        # Each quantity, then its smoothed values (from separately smoothed parts) if any.
        cols = [c for q in qs for c in (q, f"{q}_smoothed")]
        cols = [c for c in cols if all(c in series for series in d["runs"].values())]
        rows = []
        for r, series in d["runs"].items():
            for k, s in enumerate(series["step"]):
                rows.append([r, int(s), *[float(series[c][k]) for c in cols]])
        return d, ["run", "step", *cols], rows
    d = plot.summary_data(runs, run=job.run, step=job.step)
    qs = list(views.SUMMARY_STATISTICS)
    rows = [
        [
            r["tag"],
            r["step"],
            "x".join(map(str, r["shape"])),
            int(r["pooled"]),
            r["batch_size"],
            *[r[q] for q in qs],
        ]
        for r in d["rows"]
    ]
    return d, ["tag", "step", "shape", "pooled", "batch_size", *qs], rows


def _figure(job: Job, runs, opts: dict):
    if job.plot in ("heatmap", "histogram"):
        common = {"run": job.run, "step": job.step, "stat": opts["stat"], "cmap": opts["cmap"]}
        if job.plot == "heatmap":
            scale = opts["scale"] or views.default_scale(opts["stat"])
            return plot.heatmap(runs, _tag(job), **common, scale=scale)
        scale = opts["scale"] or "linear"
        return plot.histogram(runs, _tag(job), **common, bins=opts["bins"], scale=scale)
    if job.plot == "curves":
        keys = ("quantities", "ema", "yscale", "smoothing")
        over = "variable" if job.layer is None else "layer"
        return plot.curves(
            runs, tag=_tag(job), runs=job.runs, over=over, **{k: opts[k] for k in keys}
        )
    return plot.summary(runs, run=job.run, step=job.step)


def _job_name(job: Job, opts: dict, fmt: str, max_bytes: int = NAME_MAX) -> str:
    if job.plot == "curves":
        if job.layer is not None:
            return encode.file_name([f"layer-{job.layer}", "curves"], fmt, max_bytes)
        return encode.file_name([job.tag, "curves"], fmt, max_bytes)
    if job.plot == "summary":
        step = "latest" if job.step is None else f"step{job.step}"
        return encode.file_name([job.run, step, "summary"], fmt, max_bytes)
    parts = [job.run, job.tag, f"step{job.step}", opts["stat"]]
    if job.plot == "histogram":
        parts.append("histogram")
    return encode.file_name(parts, fmt, max_bytes)


def _job_where(job: Job) -> str:
    where = [f"{job.plot}"]
    if job.run is not None:
        where.append(f"run {job.run!r}")
    if job.tag is not None:
        where.append(f"tag {job.tag!r}")
    if job.step is not None:
        where.append(f"step {job.step}")
    return " ".join(where)


def _name_max(out: str) -> int:
    try:
        return min(NAME_MAX, int(os.pathconf(out, "PC_NAME_MAX")))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def _names(jobs: list[Job], opts: dict, fmt: str, max_bytes: int) -> list[str]:
    """One distinct file name per job (a ``-2``, ``-3``, ... for tags that clean alike)."""
    names, used = [], set()
    for job in jobs:
        name = _job_name(job, opts, fmt, max_bytes)
        stem, ext = os.path.splitext(name)
        k = 2
        while name in used:
            name = encode.file_name([stem, k], ext[1:], max_bytes)
            k += 1
        used.add(name)
        names.append(name)
    return names


def _publish(tmp: str, path: str, overwrite: bool) -> None:
    """Moves a finished temporary file to ``path``: replacing whatever is there (a symbolic
    link itself, never its target) with ``overwrite``, else only if nothing is there."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # atomic and never replaces: fails if anything is at `path`
    except FileExistsError:
        raise ExportError(
            f"{path} appeared while exporting; pass --overwrite to replace it"
        ) from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            raise
        if os.path.lexists(path):  # a file system without hard links
            raise ExportError(f"{path} exists; pass --overwrite to replace it") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _write_atomic(out: str, path: str, overwrite: bool, write) -> None:
    """Calls ``write(binary_file)`` on a new temporary file in ``out``, then publishes it."""
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".tb-gradmom-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        _publish(tmp, path, overwrite)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _Progress:
    def __init__(self, total: int, stream: TextIO | None):
        self.total = total
        self.stream = stream if total >= PROGRESS_MIN_FILES else None
        self.tty = bool(self.stream is not None and getattr(self.stream, "isatty", lambda: False)())
        self.last_quarter = -1

    def update(self, done: int) -> None:
        if self.stream is None:
            return
        width = 30
        filled = int(width * done / self.total)
        bar = f"exporting [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} files"
        if self.tty:
            self.stream.write("\r" + bar + ("\n" if done == self.total else ""))
        else:
            quarter = 4 * done // self.total
            if quarter == self.last_quarter:
                return
            self.last_quarter = quarter
            self.stream.write(bar + "\n")
        self.stream.flush()


def export(
    logdir: str | os.PathLike,
    out: str | os.PathLike,
    run: str | None = None,
    tag: str | None = None,
    step: int | str | None = "latest",
    plot_kind: str = "heatmap",
    stat: str = "variance",
    fmt: str = "png",
    scale: str | None = None,
    cmap: str | None = None,
    bins: int = 30,
    quantities: Sequence[str] | None = None,
    ema: float | None = None,
    yscale: str = "linear",
    smoothing: float | None = plot.DEFAULT_SMOOTHING,
    dpi: int = 300,
    progress: TextIO | None = None,
    overwrite: bool = False,
    over: str = "variable",
    column: str = ex.MODEL,
    threshold: float = ex.DEFAULT_OUTLIER_RATIO,
    clip_norm: float | None = None,
) -> list[str]:
    """Writes one file per plot.

    Each file is written whole or not at all (a temporary file in ``out``, renamed into
    place); a symbolic link in ``out`` is replaced, never followed. A plot the data cannot
    give is skipped with an `ExportWarning` naming its run, tag and step.

    Args:
      logdir: the TensorBoard logdir.
      out: the output directory (created if needed).
      run: a regular expression for run names (case-insensitive search); default all.
      tag: a regular expression for tag names; default all.
      step: an integer, ``"latest"`` (each tag's last complete step) or ``"all"``.
      plot_kind: one of `plot.PLOTS`.
      stat: one of `reductions.STATS` (heatmap, histogram).
      fmt: one of `FORMATS`.
      scale: ``"linear"`` or ``"log"``: colour scale of heatmaps, bins of histograms; None:
        as the tab (`views.default_scale` for heatmaps, linear histograms).
      cmap: one of `plot.COLORMAPS`; default per statistic (`plot.heatmap`).
      bins: the number of histogram bins, 1 to `reductions.MAX_BINS`.
      quantities: the derived quantities of curves (`stats.DERIVED` names).
      ema: EMA decay for the noise scale in curves, in ``[0, 1)``.
      smoothing: EMA decay in ``[0, 1)`` of every statistic in curves (numerators and
        denominators smoothed separately, `stats.smoothed`; the tab's default 0.9); ``None``
        or 0: per-step values only.
      yscale: y scale of curves (``linear``, ``log``, ``symlog``).
      dpi: resolution of PNG files, 1 to `MAX_DPI`.
      progress: a stream for a progress bar when there are many files, and for the progress of
        a long read of the log directory (e.g. ``sys.stderr``).
      overwrite: replace files that exist in ``out``; without it an export that would replace
        any file writes nothing and raises.
      over: ``"layer"``: curves of the layers of the matching variables (one file per layer,
        ``layer-<name>-curves``; `plot.curves_data` ``over="layer"``), every variable of a
        layer read whatever ``tag`` matches; ``"variable"`` (default): of the tags.
      column: the per-example plots' norm: ``"model"``, a layer or a variable.
      threshold: ``--plot outliers``: norm / step median above which an example is an outlier.
      clip_norm: ``--plot clipped``: the clipping norm C (required there).

    Returns:
      The paths written, in order.

    Raises:
      FileNotFoundError: if the logdir does not exist.
      ValueError: (`ExportError` or from `data.load`) with a one-line message for no data, no
        match, a step that was not logged, an option value out of range, files that exist
        (without ``overwrite``), or when every plot was skipped.
      ImportError: for image formats without matplotlib (says how to install it).
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; expected one of: {', '.join(FORMATS)}")
    if cmap is not None and cmap not in plot.COLORMAPS:
        raise ExportError(
            f"unknown colour map {cmap!r}; expected one of: {', '.join(plot.COLORMAPS)}"
        )
    if scale is not None and scale not in reductions.SCALES:
        raise ExportError(f"unknown scale {scale!r}; expected 'linear' or 'log'")
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= reductions.MAX_BINS:
        raise ExportError(f"--bins must be an integer from 1 to {reductions.MAX_BINS}, got {bins}")
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 1 <= dpi <= MAX_DPI:
        raise ExportError(f"--dpi must be an integer from 1 to {MAX_DPI}, got {dpi}")
    if ema is not None and not (isinstance(ema, (int, float)) and 0 <= ema < 1):
        raise ExportError(f"--ema must be a number in [0, 1), got {ema}")
    if smoothing is not None and not (
        isinstance(smoothing, (int, float))
        and not isinstance(smoothing, bool)
        and 0 <= smoothing < 1
    ):
        raise ExportError(f"--smoothing must be a number in [0, 1), got {smoothing}")
    if quantities:
        bad = [q for q in quantities if q not in stats.DERIVED and q != "noise_scale_ema"]
        if bad:
            raise ExportError(
                f"unknown quantities {bad}; expected names from: {', '.join(stats.DERIVED)}"
            )
    if over not in ("variable", "layer"):
        raise ExportError(f"--over must be 'variable' or 'layer', got {over!r}")
    if over == "layer" and plot_kind != "curves":
        raise ExportError(f"--over layer draws curves; got --plot {plot_kind}")
    if fmt in IMAGE_FORMATS:
        plot._mpl()  # fail before any work when matplotlib is missing
    if plot_kind in plot.EXAMPLE_PLOTS:
        return _export_examples(
            logdir, out, run, tag, plot_kind, fmt, column, threshold, clip_norm, dpi, overwrite
        )
    if plot_kind not in plot.PLOTS:
        raise ExportError(
            f"unknown plot {plot_kind!r}; expected one of: "
            f"{', '.join((*plot.PLOTS, *plot.EXAMPLE_PLOTS))}"
        )
    # A layer's curves need all its variables, whatever --tag matches.
    runs = _load(
        logdir, run, None if over == "layer" else tag, plot_kind, _parse_step(step), progress
    )
    jobs = plan(runs, plot_kind=plot_kind, run=run, tag=tag, step=step, stat=stat)
    if over == "layer":
        jobs = _layer_jobs(runs, jobs)
    opts = {
        "stat": stat,
        "scale": scale,
        "cmap": cmap,
        "bins": bins,
        "quantities": tuple(quantities) if quantities else None,
        "ema": ema,
        "yscale": yscale,
        "smoothing": smoothing or None,
    }
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    names = _names(jobs, opts, fmt, _name_max(out))
    paths = [os.path.join(out, name) for name in names]
    if not overwrite:
        there = [name for name in names if os.path.lexists(os.path.join(out, name))]
        if there:
            shown = ", ".join(there[:3]) + (", ..." if len(there) > 3 else "")
            raise ExportError(
                f"--out {out!r} already has {len(there)} of the {len(names)} files to write "
                f"({shown}); nothing was written; pass --overwrite to replace them"
            )
    bar = _Progress(len(jobs), progress)
    written: list[str] = []
    for i, (job, path) in enumerate(zip(jobs, paths, strict=True), 1):
        try:
            write = _render(job, runs, opts, fmt, dpi)
        except ValueError as e:
            warnings.warn(
                f"{_job_where(job)} skipped: {str(e).splitlines()[0] if str(e) else e!r}",
                ExportWarning,
                stacklevel=2,
            )
        else:
            _write_atomic(out, path, overwrite, write)
            written.append(path)
        bar.update(i)
    if not written:
        raise ExportError(f"every one of the {len(jobs)} plots was skipped (see the warnings)")
    return written


def _layer_jobs(runs, jobs: list[Job]) -> list[Job]:
    """One curves job per layer of the variables of ``jobs`` (a layer: its name in its group,
    `stats.layer_members`); the first matching variable of each stands for it. Whole-model
    tags and variables without a layer name are left out."""
    out: dict[tuple[str, ...], Job] = {}
    for job in jobs:
        tag = _tag(job)
        first = runs[job.runs[0]]
        names = {
            t: recs[0].content.layer
            for t, recs in first.items()
            if recs and isinstance(recs[0].content, metadata.MomentsContent)
        }
        if not names.get(tag):
            continue
        groups = [
            t[: -len(metadata.MODEL_TAG)].rstrip("/") for t in first if metadata.is_model_tag(t)
        ]
        key = tuple(stats.layer_members(names, tag, groups))
        out.setdefault(key, Job("curves", None, tag, None, job.runs, layer=names[tag]))
    if not out:
        raise ExportError("no matching variable has a layer name to draw its layer's curves")
    return list(out.values())


def _load(logdir, run: str | None, tag: str | None, plot_kind: str, step, progress: TextIO | None):
    """`data.load` of the runs, tags and steps ``--run``, ``--tag`` and ``--step`` select,
    nothing else (a summary reads every tag of its runs: its table has them all; curves read
    every step)."""
    run_re, tag_re = _compile(run, "run"), _compile(tag, "tag")
    names = list(data.list_runs(logdir))
    if run_re is not None and names and not any(run_re.search(r) for r in names):
        raise ExportError(f"no run matches --run {run!r}; runs: {', '.join(names)}")
    runs = None if run_re is None else (lambda r: bool(run_re.search(r)))
    tags = None if tag_re is None or plot_kind == "summary" else (lambda t: bool(tag_re.search(t)))
    steps = None if plot_kind == "curves" or step == "all" else step
    try:
        return data.load(logdir, runs=runs, tags=tags, steps=steps, progress=progress)
    except data.SelectionError as e:
        if e.what == "steps":
            shown = ", ".join(map(str, e.available[:10])) + (
                ", ..." if len(e.available) > 10 else ""
            )
            raise ExportError(
                f"step {step} was not logged for any matching tag; steps: {shown}"
            ) from None
        shown = ", ".join(
            t if len(t) <= data.SHORT_NAME_CHARS else data.short_name(t) for t in e.available
        )
        raise ExportError(f"no tag matches --tag {tag!r}; tags: {shown}") from None


def _render(job: Job, runs, opts: dict, fmt: str, dpi: int):
    """The file's content as a function of a binary file (computed here, written later)."""
    if fmt in IMAGE_FORMATS:
        fig = _figure(job, runs, opts)
        return lambda f: plot.save(fig, f, dpi=dpi, fmt=fmt)
    payload, header, rows = _numbers(job, runs, opts)
    if fmt == "csv":
        text = encode.csv_table(header, rows, digits=None)
    else:
        text = encode.to_json(payload, digits=None, nested=True) + "\n"
    blob = text.encode("utf-8")
    return lambda f: f.write(blob)


def _export_examples(
    logdir, out, run, tag, plot_kind, fmt, column, threshold, clip_norm, dpi, overwrite
) -> list[str]:
    """The per-example plots: one file per matching run and per-example tag."""
    if plot_kind == "clipped" and clip_norm is None:
        raise ExportError("--plot clipped needs --clip-norm C (the clipping norm, > 0)")
    if plot_kind == "outliers":
        ex._check_positive("--threshold", threshold)
    if clip_norm is not None:
        ex._check_positive("--clip-norm", clip_norm)
    run_re, tag_re = _compile(run, "run"), _compile(tag, "tag")
    if not os.path.isdir(os.fspath(logdir)):
        raise FileNotFoundError(f"--logdir {os.fspath(logdir)!r} does not exist")
    runs = data.load_examples(
        logdir, runs=None if run_re is None else (lambda r: bool(run_re.search(r)))
    )
    jobs = [
        (r, t) for r in sorted(runs) for t in sorted(runs[r]) if tag_re is None or tag_re.search(t)
    ]
    if not jobs:
        raise ExportError(
            "no per-example norms match"
            + (f" --run {run!r}" if run else "")
            + (f" --tag {tag!r}" if tag else "")
            + "; they are logged with summary.moments(..., log_examples=True)"
        )
    what = {
        "norms": "norm_quantiles",
        "outliers": "outliers",
        "clipped": f"clipped_C{clip_norm:g}" if clip_norm is not None else "clipped",
    }[plot_kind]
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    max_bytes = _name_max(out)
    names = []
    for r, t in jobs:
        name = encode.file_name([r, t, column, what], fmt, max_bytes)
        k = 2
        while name in names:
            name = encode.file_name([r, t, column, what, k], fmt, max_bytes)
            k += 1
        names.append(name)
    if not overwrite:
        there = [n for n in names if os.path.lexists(os.path.join(out, n))]
        if there:
            raise ExportError(
                f"--out {out!r} already has {len(there)} of the {len(names)} files to write "
                f"({', '.join(there[:3])}); nothing was written; pass --overwrite to replace them"
            )
    written = []
    for (r, t), name in zip(jobs, names, strict=True):
        try:
            write = _render_examples(runs, r, t, plot_kind, fmt, column, threshold, clip_norm, dpi)
        except ValueError as e:
            warnings.warn(
                f"{plot_kind} run {r!r} tag {t!r} skipped: {e}", ExportWarning, stacklevel=3
            )
            continue
        path = os.path.join(out, name)
        _write_atomic(out, path, overwrite, write)
        written.append(path)
    if not written:
        raise ExportError(f"every one of the {len(jobs)} plots was skipped (see the warnings)")
    return written


def _render_examples(runs, run, tag, plot_kind, fmt, column, threshold, clip_norm, dpi):
    if fmt in IMAGE_FORMATS:
        if plot_kind == "norms":
            fig = plot.norms(runs, run, tag, column)
        elif plot_kind == "outliers":
            fig = plot.outliers(runs, run, tag, column, threshold=threshold)
        else:
            fig = plot.clipped(runs, clip_norm, run, tag, column)
        return lambda f: plot.save(fig, f, dpi=dpi, fmt=fmt)
    if plot_kind == "norms":
        d = plot.norms_data(runs, run, tag, column)
        csv_text = ex.quantiles_csv(d)
    elif plot_kind == "outliers":
        d = plot.outliers_data(runs, run, tag, column, threshold)
        csv_text = ex.outliers_csv(d)
    else:
        d = plot.clipped_data(runs, clip_norm, run, tag, column)
        csv_text = ex.clipped_csv(d)
    text = csv_text if fmt == "csv" else encode.to_json(d, digits=None, nested=True) + "\n"
    blob = text.encode("utf-8")
    return lambda f: f.write(blob)


# ----------------------------------------------------------------------------- command line


def add_arguments(parser) -> None:
    """Adds the options of ``tb-gradmom export`` to an argparse parser."""
    parser.add_argument("--logdir", required=True, help="the TensorBoard logdir")
    parser.add_argument(
        "--out",
        required=True,
        help="output directory (created if needed; existing files are kept unless --overwrite)",
    )
    parser.add_argument("--run", help="regular expression for run names (default: all)")
    parser.add_argument("--tag", help="regular expression for tag names (default: all)")
    parser.add_argument("--step", default="latest", help="N, 'latest' (default, per tag) or 'all'")
    parser.add_argument(
        "--plot",
        default="heatmap",
        choices=(*plot.PLOTS, *plot.EXAMPLE_PLOTS),
        help="default: heatmap; norms, outliers and clipped are of the per-example norms",
    )
    parser.add_argument(
        "--stat",
        default="variance",
        choices=reductions.STATS,
        help="element-wise statistic for heatmap and histogram (default: unbiased variance)",
    )
    parser.add_argument("--format", default="png", choices=FORMATS, help="default: png")
    parser.add_argument(
        "--scale",
        default=None,
        choices=reductions.SCALES,
        help="a heatmap's colour scale or a histogram's x axis; default as in the tab: log "
        "colours for the non-negative statistics, linear for the signed ones and for histograms",
    )
    parser.add_argument(
        "--cmap",
        default=None,
        choices=plot.COLORMAPS,
        help="default: RdBu_r, symmetric around 0, for signed statistics "
        f"({', '.join(plot.SIGNED_STATS)}), else viridis",
    )
    parser.add_argument(
        "--bins",
        type=int,
        default=30,
        help=f"histogram bins, 1 to {reductions.MAX_BINS} (default: 30)",
    )
    parser.add_argument(
        "--quantities",
        help="comma-separated derived quantities for curves "
        f"(default: {','.join(plot.CURVE_DEFAULTS)}; any of {','.join(stats.DERIVED)})",
    )
    parser.add_argument("--ema", type=float, help="EMA decay for the noise scale in curves")
    parser.add_argument(
        "--smoothing",
        type=float,
        default=plot.DEFAULT_SMOOTHING,
        help="EMA decay of every statistic in curves, numerator and denominator smoothed "
        f"separately (default: {plot.DEFAULT_SMOOTHING}, as the tab; 0: per step only)",
    )
    parser.add_argument("--yscale", default="linear", choices=("linear", "log", "symlog"))
    parser.add_argument(
        "--over",
        default="variable",
        choices=("variable", "layer"),
        help="curves of the matching variables (default) or of their layers: each layer's "
        "variables' sums added, as the tab's layer curve (one file per layer)",
    )
    parser.add_argument(
        "--dpi", type=int, default=300, help=f"PNG resolution, 1 to {MAX_DPI} (default: 300)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files that exist in --out (default: refuse, and write nothing)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary line")
    parser.add_argument(
        "--column",
        default=ex.MODEL,
        help="per-example plots: the norm of 'model' (default), a layer or a variable",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=ex.DEFAULT_OUTLIER_RATIO,
        help="--plot outliers: an example is an outlier at a step when its norm exceeds this "
        f"many times the step's median norm (default: {ex.DEFAULT_OUTLIER_RATIO:g})",
    )
    parser.add_argument(
        "--clip-norm",
        type=float,
        default=None,
        help="--plot clipped: the clipping norm C; the fraction of examples with norm > C per step",
    )


def _print_warnings(caught, stderr: TextIO) -> None:
    for w in caught:
        if issubclass(w.category, (data.DataWarning, ExportWarning)):
            print(f"tb-gradmom export: warning: {w.message}", file=stderr)


def run_from_args(args, stderr: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Runs ``tb-gradmom export`` from parsed arguments.

    Errors print one line ``tb-gradmom export: error: ...`` on stderr and return 1, without a
    traceback; data warnings (a truncated record, a skipped tag or step, a skipped plot)
    print one line each.

    Returns:
      The exit code: 0 on success, 1 on bad input.
    """
    stderr = stderr or sys.stderr
    stdout = stdout or sys.stdout
    quantities = (
        [q.strip() for q in args.quantities.split(",") if q.strip()] if args.quantities else None
    )
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", data.DataWarning)
            warnings.simplefilter("always", ExportWarning)
            paths = export(
                args.logdir,
                args.out,
                run=args.run,
                tag=args.tag,
                step=args.step,
                plot_kind=args.plot,
                stat=args.stat,
                fmt=args.format,
                scale=args.scale,
                cmap=args.cmap,
                bins=args.bins,
                quantities=quantities,
                ema=args.ema,
                yscale=args.yscale,
                smoothing=getattr(args, "smoothing", plot.DEFAULT_SMOOTHING),
                dpi=args.dpi,
                progress=None if args.quiet else stderr,
                overwrite=getattr(args, "overwrite", False),
                over=getattr(args, "over", "variable"),
                column=getattr(args, "column", ex.MODEL),
                threshold=getattr(args, "threshold", ex.DEFAULT_OUTLIER_RATIO),
                clip_norm=getattr(args, "clip_norm", None),
            )
    except (FileNotFoundError, ValueError, ImportError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        _print_warnings(caught, stderr)
        print(f"tb-gradmom export: error: {msg}", file=stderr)
        return 1
    _print_warnings(caught, stderr)
    if not args.quiet:
        print(f"wrote {len(paths)} file{'s' * (len(paths) != 1)} to {args.out}", file=stdout)
    return 0
