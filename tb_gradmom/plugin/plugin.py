"""The Grad Moments TensorBoard plugin: routes under ``/data/plugin/gradmom/``.

Routes are thin: each parses all of its parameters (`_params`), calls an ``*_impl`` method
that takes them parsed, reads through the data provider (`_reader`) and builds the payload with
plain numpy functions (`_payloads`, `tb_gradmom.analysis`). An ``*_impl`` returns the payload
as a dict, except the /heatmap and /histogram ones, which return its JSON text: their bodies
are cached encoded (a large grid's text is what is sent and what the cache's budget counts).
/export's returns ``(body, MIME type, file name)``. Both raise `tensorboard.errors` types that
TensorBoard's error middleware turns into 400 (bad parameter) or 404 (unknown run, tag or step;
unreadable data). The routes and their payloads are documented in docs/http_api.md.

This module imports no TensorFlow (only `tensorboard`'s TensorFlow-free modules and numpy).
"""

from __future__ import annotations

import concurrent.futures
import functools
import gzip
import logging
import math
import threading
import time

import numpy as np
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_gradmom import metadata
from tb_gradmom.analysis import encode, reductions, stats, views
from tb_gradmom.plugin import _examples, _params, _payloads, _reader, _static, _tb_compat, loader
from tb_gradmom.plugin._cache import ByteLRU, MemoryGate, SingleFlight
from tb_gradmom.plugin._reader import Reader

logger = logging.getLogger(__name__)

__all__ = ["GradMomentsPlugin", "DEFAULT_CACHE_MB", "WORK_BUDGET_BYTES"]

# Budget of the in-memory cache of decoded arrays and computed responses.
DEFAULT_CACHE_MB = loader.DEFAULT_CACHE_MB
# Arrays being computed and responses being encoded, all requests together (a single request
# that needs more runs alone): with `_reader.READ_BUDGET_BYTES`, the plugin's memory bound
# beyond its cache (docs/http_api.md, "Speed and memory").
WORK_BUDGET_BYTES = 192 * 1024 * 1024
# Threads that compute the big arrays of all requests (statistics, pooling, histograms, the
# text of responses): as many as cores. Memory a thread frees stays in its malloc arena for
# the next allocation there; with every request thread computing, each of glibc's 8-per-core
# arenas kept its own peak (measured: +300 MB of resident memory beyond what was held, with
# 200 clients on 2 cores). The few compute threads keep a few arenas.
COMPUTE_THREADS = 2
# Threads that read one step's moments through the data provider (for RustBoard a gRPC read
# that can take seconds): apart from the compute threads, so that a slow read never holds up
# the computations of other requests; few, for the same reason as those.
READ_THREADS = 2
_worker = threading.local()
ROUTE_PREFIX = "/data/plugin/" + metadata.PLUGIN_NAME + "/"
MAX_GRID = 4096  # the largest max_rows / max_cols a heatmap may ask for
# The most cells a /heatmap answers unless `max_cells` says otherwise: 256 x 256, about what a
# heatmap card shows at once (the tab asks for `api.js` HEATMAP_MAX_CELLS, see docs/http_api.md).
DEFAULT_MAX_CELLS = 256 * 256
MAX_BINS = reductions.MAX_BINS
# `format` of /heatmap and /histogram: JSON text, or the binary form (`_payloads.to_binary`).
ARRAY_FORMATS = ("json", "binary")
# The share of --gradmom_cache_mb kept for computed results that are small and cost most to
# remake (/tags, /series, /summary, histograms, exports); the rest holds decoded moments,
# stats series and heatmaps.
RESULTS_SHARE = 0.25
RESULTS = "results"  # the name of that part of the cache
# An export's body is kept only up to this share of the results' budget.
EXPORT_CACHE_SHARE = 8
EXPORT_WHAT = ("heatmap", "histogram", "series", "moments")
EXPORT_FORMATS = ("csv", "json", "npy")


def _route(fn):
    """A werkzeug route that never answers 500.

    `tensorboard.errors` pass through to TensorBoard's error middleware (400/404). Anything
    else (unreadable data that slipped past the checks, a data-provider failure) is logged
    with its traceback and answered 404 with the reason.
    """

    @functools.wraps(fn)
    def wrapper(*args):  # (self, request) for a method, (request) for a bound one
        request = args[-1]
        try:
            return fn(*args)
        except errors.PublicError:
            raise
        except Exception as e:  # noqa: BLE001 - the never-500 safety net
            logger.exception("Grad Moments: %s failed", request.path)
            raise errors.NotFoundError(
                f"Grad Moments could not serve this request: {type(e).__name__}: {e}"
            ) from None

    return wrappers.Request.application(wrapper)


# Export MIME types kept gzipped in the cache.
_TEXT_EXPORTS = frozenset({"text/csv", "application/json"})


@functools.cache
def _meta_json() -> str:
    """`views.meta` as JSON, encoded once: it is the same for every request of a process."""
    return encode.to_json(views.meta())


def _gzip(text: str | bytes) -> bytes:
    """A response body compressed once, as TensorBoard's `http_util.Respond` would per request."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return gzip.compress(data, compresslevel=3, mtime=0)


def _mark_worker() -> None:
    _worker.active = True


def _mark_reader() -> None:
    _worker.reading = True


def _bad(e: ValueError) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(str(e))


def _groups_of(ri) -> list[str]:
    """The groups of a run: the prefix of each whole-model stats tag (``""`` for ``_model``).

    One `summary.moments` call writes one group (docs/format.md, "Groups").
    """
    suffix = metadata.STATS_SUFFIX
    names = []
    for st in ri.stats:
        tag = st[: -len(suffix)] if st.endswith(suffix) else None
        if tag is not None and metadata.is_model_tag(tag):
            names.append(tag[: -len(metadata.MODEL_TAG)].rstrip("/"))
    return sorted(names)


def _stats_only_layer(tag: str) -> str:
    """The layer of a variable logged with stats only (no maps): its tag without the last part."""
    return tag.rsplit("/", 1)[0] if "/" in tag else ""


def _stats_only(ri) -> dict:
    """``{variable tag: stats entry}`` of the variables logged without maps: the stats tags of
    a norms- or replicas-mode run (`metadata.SOURCES`) whose base is no moments tag and no
    whole-model tag."""
    suffix = metadata.STATS_SUFFIX
    out = {}
    for st, entry in ri.stats.items():
        if not st.endswith(suffix):
            continue
        tag = st[: -len(suffix)]
        if tag in ri.moments or metadata.is_model_tag(tag):
            continue
        # A moments-mode stats tag whose moments tag was skipped (bad content) is not a
        # variable without maps: it stays out, as its moments tag does.
        if getattr(entry.content, "source", metadata.SOURCE_MOMENTS) == metadata.SOURCE_MOMENTS:
            continue
        out[tag] = entry
    return out


def maps_note(source: str) -> str:
    """What the tab shows in place of a variable's heatmap and histograms when its run was
    logged without maps (``mode="norms"`` or ``"replicas"``)."""
    how = {
        "norms": "from the batch gradient and the per-example squared gradient norms",
        "replicas": "from each tf.distribute replica's gradient (McCandlish et al. 2018)",
    }.get(source, "from sums alone")
    return (
        f"Maps are off in {source} mode: this run logged the noise statistics {how}, without "
        "the element-wise moments, so there is no heatmap or histogram (and no GSNR or EB "
        'criterion). The noise curves and the table show its statistics; log with mode="moments" for maps.'
    )


def _group_of(tag: str, names) -> str:
    """The group a variable tag belongs to: the longest group name that prefixes it, or ``""``."""
    best = ""
    for name in names:
        if name and tag.startswith(name + "/") and len(name) > len(best):
            best = name
    return best


class _SharedListings(Reader):
    """The plugin's `Reader`, whose tag listings are shared by the requests that overlap and,
    with the Python loader, kept while its data does not change.

    Every route lists its tags through the data provider first (`Reader.index`): with the
    Python loader a listing of every run scans the multiplexer (30 ms for 3 runs x 40 tags x
    500 steps, measured; under 200 clients its scans were 17 % of TensorBoard's CPU time), over
    RustBoard it is a gRPC call. Concurrent requests for the same listing (experiment, run,
    tags) wait for one and share it (`SingleFlight`). With the Python loader, a listing is also
    kept for later requests while the multiplexer's version (`_tb_compat.listing_version`: its
    runs, events taken and purges) is unchanged, and at most `LISTING_MAX_AGE` seconds; over
    other providers nothing is kept after a listing returns.
    """

    LISTING_MAX_AGE = 2.0
    _MAX_KEPT = 256

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.listings = SingleFlight()
        self._kept: dict = {}  # key -> (version, time.monotonic() at the listing, listing)
        self._kept_lock = threading.Lock()

    def index(self, ctx, experiment_id: str, run: str | None = None, tags=None):
        key = (experiment_id, run, None if tags is None else tuple(tags))
        version = None if self._mux is None else _tb_compat.listing_version(self._mux)
        if version is not None:
            with self._kept_lock:
                kept = self._kept.get(key)
            if (
                kept is not None
                and kept[0] == version
                and time.monotonic() - kept[1] < self.LISTING_MAX_AGE
            ):
                return kept[2]
        started = time.monotonic()
        listing = self.listings.run(
            key, lambda: super(_SharedListings, self).index(ctx, experiment_id, run, tags)
        )
        if version is not None:  # the version read before listing: a change meanwhile misses
            with self._kept_lock:
                if len(self._kept) >= self._MAX_KEPT:
                    self._kept.clear()
                self._kept[key] = (version, started, listing)
        return listing


class GradMomentsPlugin(base_plugin.TBPlugin):
    """Serves the Grad Moments tab: its frontend files and its data routes."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data_provider = context.data_provider
        cache_mb = getattr(context.flags, "gradmom_cache_mb", None) if context.flags else None
        # Checked again: flags set without TensorBoard's parser (`configure(**kwargs)`) are not.
        cache_mb = DEFAULT_CACHE_MB if cache_mb is None else loader.cache_mb(cache_mb)
        # Two parts of one budget: the results that cost most to remake stay apart from the
        # arrays and one-step views, so that scrubbing through many steps cannot evict them.
        self._cache = ByteLRU(int(cache_mb * 1024 * 1024), parts={RESULTS: RESULTS_SHARE})
        mux = _tb_compat.multiplexer_of(context, self._data_provider)
        self._reader = _SharedListings(
            self._data_provider, self._cache, multiplexer=mux, logdir=context.logdir
        )
        self._work = MemoryGate(WORK_BUDGET_BYTES)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            COMPUTE_THREADS, thread_name_prefix="gradmom", initializer=_mark_worker
        )
        self._read_pool = concurrent.futures.ThreadPoolExecutor(
            READ_THREADS, thread_name_prefix="gradmom-read", initializer=_mark_reader
        )
        self._static_root = _static.frontend_dir()
        self._examples = _examples.ExamplesRoutes(self)

    # ------------------------------------------------------------------ TBPlugin API

    def get_plugin_apps(self):
        return {
            "/tags": self._tags_route,
            "/heatmap": self._heatmap_route,
            "/histogram": self._histogram_route,
            "/series": self._series_route,
            "/summary": self._summary_route,
            "/export": self._export_route,
            "/meta": self._meta_route,
            **self._examples.apps(),
            "/*": self._static_route,
        }

    def data_plugin_names(self):
        # The per-example norms have their own plugin name; a log with only those shows the tab.
        return (metadata.PLUGIN_NAME, metadata.EXAMPLES_PLUGIN_NAME)

    def is_active(self):
        # TensorBoard's `list_plugins` (`data_plugin_names`) already says whether any
        # `gradmom` summaries exist; there is nothing else to check.
        return False

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Grad Moments")

    # ------------------------------------------------------------------------ helpers

    def _ctx(self, request):
        if self._data_provider is None:
            raise errors.NotFoundError("Grad Moments needs TensorBoard's data provider")
        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    def _compute(self, fn):
        """``fn()`` run on the plugin's compute threads (inline if already on one).

        Locks: the work gate (`self._work`) is reserved by request threads only, which then
        may wait for the compute and read threads; compute threads may wait for the read
        threads and the read gate; read threads wait for nothing of the plugin's. So no wait
        closes a cycle.
        """
        if getattr(_worker, "active", False):
            return fn()
        return self._pool.submit(fn).result()

    def _read(self, fn):
        """``fn()`` (a read of moments) run on the plugin's read threads (inline if already on
        one). Never called by them with a computation inside: reads never wait for the
        compute threads, so a compute thread may wait for a read."""
        if getattr(_worker, "reading", False):
            return fn()
        return self._read_pool.submit(fn).result()

    def _json(self, request, body) -> wrappers.Response:
        text = body if isinstance(body, str) else encode.to_json(body)
        return http_util.Respond(request, text, "application/json")

    def _body(self, request, body: str | bytes) -> wrappers.Response:
        """A /heatmap or /histogram body: JSON text, or the binary form (bytes)."""
        if isinstance(body, bytes):
            return http_util.Respond(request, body, _payloads.BINARY_MIME)
        return self._json(request, body)

    def _cached_json(self, request, key, build, group=None) -> wrappers.Response:
        """A JSON response computed once per ``key`` (single flight) and cached compressed:
        TensorBoard would gzip the text again for every request (it decompresses it for a
        client that does not accept gzip)."""
        gz = self._cache.get_or_load(
            key, lambda: _gzip(encode.to_json(self._compute(build))), group=group, part=RESULTS
        )
        return http_util.Respond(request, gz, "application/json", content_encoding="gzip")

    # -------------------------------------------------------------------------- /tags

    @_route
    def _tags_route(self, request):
        ctx, experiment = self._ctx(request)
        index = self._reader.index(ctx, experiment)
        # The same listing (every series at the same version) gives the same payload.
        version = tuple(
            (run, tag, e.signature)
            for run, ri in sorted(index.items())
            for tag, e in sorted({**ri.moments, **ri.stats}.items())
        ) + tuple((run, tuple(sorted(ri.skipped.items()))) for run, ri in sorted(index.items()))
        files = self._reader.files
        if files is not None:  # RustBoard: `writers` counts the files' records once indexed
            version += tuple((run, files.indexed(run)) for run in sorted(index))
        key = ("tags", experiment, version)
        return self._cached_json(
            request,
            key,
            lambda: self.tags_impl(ctx, experiment, index),
            group=("tags", experiment),
        )

    def tags_impl(self, ctx, experiment: str, index=None) -> dict:
        """``{"runs": {run: {tag: info}}, "model": {run: {"steps": [...]}}, "groups": ...,
        "skipped": {run: {tag: reason}}, "writers": {run: {...}}}``: ``writers`` names the
        runs whose records come from more than one summary writer (`data.writers_of`).

        ``index``: the `_reader.Reader.index` of the experiment, if the caller has it.
        """
        runs: dict = {}
        model: dict = {}
        groups: dict = {}
        skipped: dict = {}
        writers: dict = {}
        if index is None:
            index = self._reader.index(ctx, experiment)
        for run, ri in sorted(index.items()):
            series = (
                self._reader.stats_series(ctx, experiment, list(ri.stats.values()))
                if ri.stats
                else {}
            )
            tags = {}
            names = _groups_of(ri)
            for tag, entry in sorted(ri.moments.items()):
                st = ri.stats_for(tag)
                s = series.get(st.tag) if st is not None else None
                if s is not None:  # complete steps: stats beyond the moments' last are torn
                    steps = s.steps[s.steps <= entry.max_step]
                else:
                    steps = self._moment_steps(ctx, experiment, entry)
                c = entry.content
                tags[tag] = {
                    "shape": list(c.shape),
                    "stored_shape": list(c.stored_shape),
                    "grid_shape": list(metadata.to_2d_shape(c.shape)),
                    "pooled": bool(c.pooled),
                    "block": list(c.block) if c.pooled else [1, 1],
                    "orders": list(c.orders),
                    "op": c.op,
                    "layer": c.layer,
                    "variable": c.variable,
                    "dtype": c.dtype,
                    "steps": steps,
                    "has_stats": s is not None,
                    "group": _group_of(tag, names),
                }
            for tag, st in sorted(_stats_only(ri).items()):
                s = series.get(st.tag)
                source = getattr(st.content, "source", metadata.SOURCE_MOMENTS)
                tags[tag] = {
                    "shape": [],
                    "stored_shape": [],
                    "grid_shape": [1, 1],
                    "pooled": False,
                    "block": [1, 1],
                    "orders": [],
                    "op": "",
                    "layer": _stats_only_layer(tag),
                    "variable": tag,
                    "dtype": "",
                    "steps": s.steps if s is not None else [],
                    "has_stats": s is not None,
                    "group": _group_of(tag, names),
                    "maps": False,
                    "source": source,
                    "maps_note": maps_note(source),
                }
            runs[run] = dict(sorted(tags.items()))
            ms = series.get(metadata.stats_tag(metadata.MODEL_TAG))
            if ms is not None:
                model[run] = {"steps": ms.steps}
            run_groups = {}
            for name in names:
                gs = series.get(metadata.stats_tag(metadata.model_tag(name)))
                if gs is not None:
                    run_groups[name] = {"tag": metadata.model_tag(name), "steps": gs.steps}
            if run_groups:
                groups[run] = run_groups
            if ri.skipped:
                skipped[run] = dict(sorted(ri.skipped.items()))
            who = self._reader.writers(run, series, list(ri.moments))
            if who is not None:
                writers[run] = {
                    "count": who.count,
                    "sources": [f"{t:012x}" for t in who.sources],
                    "steps": list(who.steps),
                    "message": who.describe(run),
                }
        return {
            "runs": runs,
            "model": model,
            "groups": groups,
            "skipped": skipped,
            "writers": writers,
        }

    def _moment_steps(self, ctx, experiment, entry) -> list[int]:
        # Only for a moments tag logged without its stats tag (not what the writer does).
        key = ("steps", experiment, entry.run, entry.tag, entry.signature)

        def load():
            with self._reader.open_series(ctx, experiment, entry, None) as (points, _):
                self._reader.cache_series(experiment, entry, points)
                return [p.step for p in points]

        try:
            return self._cache.get_or_load(
                key, load, group=("steps", experiment, entry.run, entry.tag)
            )
        except errors.NotFoundError:
            return []

    # ----------------------------------------------------------------------- /heatmap

    @_route
    def _heatmap_route(self, request):
        ctx, experiment = self._ctx(request)
        args = self._heatmap_args(request)
        fmt = _params.choice(request, "format", ARRAY_FORMATS, default="json")
        return self._body(request, self.heatmap_impl(ctx, experiment, **args, fmt=fmt))

    def _heatmap_args(
        self,
        request,
        max_default: int = 256,
        max_limit: int = MAX_GRID,
        cells_default: int | None = DEFAULT_MAX_CELLS,
        cells_limit: int = MAX_GRID * MAX_GRID,
    ):
        return {
            "run": _params.string(request, "run", required=True),
            "tag": _params.string(request, "tag", required=True),
            "step": _params.step(request),
            "stat": _params.choice(request, "stat", reductions.STATS, default="variance"),
            "max_rows": _params.integer(
                request, "max_rows", default=max_default, lo=1, hi=max_limit
            ),
            "max_cols": _params.integer(
                request, "max_cols", default=max_default, lo=1, hi=max_limit
            ),
            "max_cells": _params.integer(
                request, "max_cells", default=cells_default, lo=1, hi=cells_limit
            ),
        }

    def _resolve_step(self, entry, s, step):
        """The step to read: ``step``, or for None the latest step that has moments and stats.

        With a stats tag, the steps listed by /tags are its steps; "latest" is the last of them
        that the moments tag also reaches (a run cut off between the two records of a step
        then still shows a complete step). None means "the moments tag's last step".
        """
        if s is None:
            return step
        if step is not None:
            if s.index_of(step) is None:
                n = int(s.steps.size)
                where = f"from {int(s.steps[0])} to {int(s.steps[-1])}" if n else "at all"
                raise errors.NotFoundError(
                    f"run {entry.run!r} tag {entry.tag!r} has no step {step}; it has {n} "
                    f"complete steps {where} (a step whose stats record is missing, as the "
                    "last one of a run cut off or still being written, is left out)"
                )
            return step
        have = s.steps[s.steps <= entry.max_step]
        if not have.size:
            raise errors.NotFoundError(
                f"run {entry.run!r} tag {entry.tag!r} has no complete step (no step has both "
                "its moments and its stats record)"
            )
        if int(have[-1]) == entry.max_step:
            return None
        return int(have[-1])

    def _lookup(self, ctx, experiment, run, tag):
        """``(entry, stats tag entry or None, StatsSeries or None)`` of a moments tag."""
        entry, ri = self._reader.moments_entry(ctx, experiment, run, tag)
        st = ri.stats_for(tag)
        return entry, st, self._reader.stats_for(ctx, experiment, st)

    def _moments(self, ctx, experiment, run, tag, step, looked_up=None):
        """``(entry, MomentsAt, batch size or None)`` of a moments tag at ``step``.

        ``looked_up``: the `_lookup` of the tag if the caller already has it (each lookup lists
        the tag through the data provider, a round trip to RustBoard).
        """
        entry, st, s = looked_up or self._lookup(ctx, experiment, run, tag)
        resolved = self._resolve_step(entry, s, step)
        try:
            # One event in memory or one record of a local file: read here, not queued on the
            # read threads behind reads of whole series.
            m = self._reader.quick_moments(experiment, entry, resolved, s)
            if m is None:
                m = self._read(
                    lambda: self._reader.moments_at(ctx, experiment, entry, resolved, s, st)
                )
        except _reader.BadRecord as bad:
            if step is not None:
                raise
            # The latest record is unreadable: show the latest step that is.
            try:
                m = self._read(lambda: self._reader.last_readable(ctx, experiment, entry, s))
            except errors.NotFoundError:
                raise bad from None
        n = None
        if s is not None:
            i = s.index_of(m.step)
            if i is not None:
                n = float(s.sums["batch_size"][i])
        return entry, m, n

    def heatmap_impl(
        self,
        ctx,
        experiment,
        *,
        run,
        tag,
        step,
        stat,
        max_rows,
        max_cols,
        max_cells=DEFAULT_MAX_CELLS,
        fmt="json",
    ) -> str | bytes:
        """The /heatmap body: JSON text, or for ``fmt="binary"`` the binary form (bytes).

        Computed once however many requests ask for it at the same time (single flight) and
        cached per run, tag, step, parameters and format.
        """
        looked_up = self._lookup(ctx, experiment, run, tag)
        entry, _, s = looked_up
        resolved = self._resolve_step(entry, s, step)
        # "latest" is keyed apart: when its record is unreadable it shows an earlier step.
        which = ("latest", entry.max_step) if resolved is None else resolved
        key = ("heatmap", experiment, run, tag, which, stat, max_rows, max_cols, max_cells, fmt)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        encoder = _payloads.to_binary if fmt == "binary" else encode.to_json
        work = self._heatmap_work(entry, max_rows, max_cols, max_cells, fmt)

        def build():
            with self._work.reserve(work):
                body = self._heatmap_body(
                    ctx, experiment, run, tag, step, stat, max_rows, max_cols, looked_up, max_cells
                )
                return self._compute(lambda: encoder(body))

        # A live run's older "latest" responses are dropped when a newer one is cached.
        group = key[:4] + key[5:] if resolved is None else None
        return self._cache.get_or_load(key, build, group=group)

    @staticmethod
    def _heatmap_work(entry, max_rows, max_cols, max_cells=None, fmt="json") -> int:
        rows, cols = metadata.to_2d_shape(entry.content.stored_shape)
        r, c = _payloads.screen_limits(rows, cols, max_rows, max_cols, max_cells)
        return _payloads.work_bytes(entry.content, r * c, binary=fmt == "binary")

    def _heatmap_body(
        self,
        ctx,
        experiment,
        run,
        tag,
        step,
        stat,
        max_rows,
        max_cols,
        looked_up=None,
        max_cells=None,
    ) -> dict:
        """The /heatmap payload: the step read on the read threads, computed on the compute
        threads."""
        entry, m, n = self._moments(ctx, experiment, run, tag, step, looked_up)
        where = f"run {run!r} tag {tag!r} step {m.step}"
        try:
            body = self._compute(
                lambda: _payloads.heatmap(
                    entry.content, m.arrays, n, stat, max_rows, max_cols, where, max_cells
                )
            )
        except ValueError as e:
            raise _bad(e) from None
        return {"run": run, "tag": tag, "step": m.step, "wall_time": m.wall_time, **body}

    # --------------------------------------------------------------------- /histogram

    @_route
    def _histogram_route(self, request):
        ctx, experiment = self._ctx(request)
        args = self._histogram_args(request)
        fmt = _params.choice(request, "format", ARRAY_FORMATS, default="json")
        return self._body(request, self.histogram_impl(ctx, experiment, **args, fmt=fmt))

    def _histogram_args(self, request):
        return {
            "run": _params.string(request, "run", required=True),
            "tag": _params.string(request, "tag", required=True),
            "step": _params.step(request, allow_all=True),
            "stat": _params.choice(request, "stat", reductions.STATS, default="variance"),
            "bins": _params.integer(request, "bins", default=30, lo=1, hi=MAX_BINS),
            "scale": _params.choice(request, "scale", reductions.SCALES, default="linear"),
        }

    def histogram_impl(
        self, ctx, experiment, *, run, tag, step, stat, bins, scale, fmt="json"
    ) -> str | bytes:
        """The /histogram body: JSON text, or for ``fmt="binary"`` the binary form (bytes).

        Encoded once per body and format (single flight, cached with the body's version).
        """
        key, body = self._histogram(
            ctx, experiment, run=run, tag=tag, step=step, stat=stat, bins=bins, scale=scale
        )

        def encoder(payload: dict) -> str | bytes:
            if fmt == "binary":
                return _payloads.to_binary(payload, float64=("edges",))
            return encode.to_json(payload)

        # A newer version of the same view (a live run) replaces the older one's encoding.
        group = ("encoded", fmt, *key[:7])
        return self._cache.get_or_load(
            ("encoded", fmt, key), lambda: encoder(body), group=group, part=RESULTS
        )

    def histogram_body(
        self, ctx, experiment, *, run, tag, step, stat, bins, scale, every_step=False
    ) -> dict:
        """The /histogram payload.

        With ``step="all"`` at most `_reader.HISTOGRAM_READ_BYTES` of moments are read (a
        bigger series is binned on a sample of its steps) unless ``every_step`` (exports),
        which reads every step the data provider can send in one read.
        """
        return self._histogram(
            ctx,
            experiment,
            run=run,
            tag=tag,
            step=step,
            stat=stat,
            bins=bins,
            scale=scale,
            every_step=every_step,
        )[1]

    def _histogram(
        self, ctx, experiment, *, run, tag, step, stat, bins, scale, every_step=False
    ) -> tuple[tuple, dict]:
        """``(cache key, payload)`` of `histogram_body`: computed once per key (single flight)."""
        head = {
            "run": run,
            "tag": tag,
            "stat": stat,
            "label": reductions.stat_label(stat),
            "scale": scale,
            "bins": bins,
        }
        looked_up = self._lookup(ctx, experiment, run, tag)
        entry, _, s = looked_up
        if step != "all":

            def binned_step(m, n):
                try:
                    where = f"run {run!r} tag {tag!r} step {m.step}"
                    grid = _payloads.stat_grid(m.arrays, n, stat, where)
                    edges, counts = reductions.histogram(grid, bins=bins, scale=scale)
                except ValueError as e:
                    raise _bad(e) from None
                return edges, counts, int(grid.size - np.count_nonzero(np.isfinite(grid)))

            def payload():
                with self._work.reserve(_payloads.work_bytes(entry.content, bins)):
                    _, m, n = self._moments(ctx, experiment, run, tag, step, looked_up)
                    edges, counts, nonfinite = self._compute(lambda: binned_step(m, n))
                return {
                    **head,
                    "edges": edges,
                    "downsampled": False,
                    "stored_steps": int(s.steps.size) if s is not None else None,
                    "series": [
                        {
                            "step": m.step,
                            "wall_time": m.wall_time,
                            "counts": counts,
                            "nonfinite": nonfinite,
                        }
                    ],
                    "unpaired_steps": [],
                }

            resolved = self._resolve_step(entry, s, step)
            # As /heatmap: "latest" keyed apart, a live run's older latest dropped (group).
            which = ("latest", entry.max_step) if resolved is None else resolved
            kind = "histogram-latest" if resolved is None else "histogram-step"
            key1 = (kind, experiment, run, tag, stat, bins, scale, which)
            group1 = key1[:-1] if resolved is None else None
            return key1, self._cache.get_or_load(key1, payload, group=group1, part=RESULTS)
        max_bytes = None if every_step else _reader.HISTOGRAM_READ_BYTES
        key = (
            "histogram",
            experiment,
            run,
            tag,
            stat,
            bins,
            scale,
            entry.signature,
            s.steps.size if s is not None else -1,
            max_bytes,
        )

        num_steps = int(s.steps.size) if s is not None else None
        work = _payloads.work_bytes(entry.content, bins) + _payloads._STREAM_KEEP_BYTES

        def build():
            with self._reader.open_series(ctx, experiment, entry, num_steps, max_bytes) as (
                points,
                downsampled,
            ):
                return binned(points, downsampled)

        def load():
            # The work gate is reserved by request threads only, never by a compute or read
            # thread: a request holding it waits for those threads (no cycle).
            with self._work.reserve(work):
                return self._compute(build)

        def binned(points, downsampled):
            self._reader.cache_series(experiment, entry, points)
            if s is not None:  # complete steps only (as /tags lists them), not a torn one
                points = [p for p in points if s.index_of(p.step) is not None]
            ns = []
            for p in points:
                i = s.index_of(p.step) if s is not None else None
                ns.append(float(s.sums["batch_size"][i]) if i is not None else None)
            valid = [n for n in ns if n is not None and math.isfinite(n) and n >= 1]
            try:
                where = f"run {run!r} tag {tag!r} (every step)"
                reductions.check_stat(
                    stat, entry.content.orders, valid[-1] if valid else None, where
                )
            except ValueError as e:
                raise _bad(e) from None

            unpaired: set[int] = set()  # steps whose moments come from another writer

            def compute(j):
                try:
                    m = self._reader.paired(experiment, entry, points[j].get(), s)
                    if m is None:
                        unpaired.add(j)
                        return np.full(entry.content.stored_shape, np.nan)
                    return _payloads.stat_grid(m.arrays, ns[j], stat)
                except (ValueError, _reader.BadRecord):  # no batch size, or unreadable
                    return np.full(entry.content.stored_shape, np.nan)

            edges, counts, nonfinite = _payloads.histograms_streaming(
                compute, len(points), bins, scale
            )
            kept = [j for j in range(len(points)) if j not in unpaired]
            if s is not None:
                stored = int(s.steps.size)
            else:
                stored = None if downsampled else len(points)
            return {
                **head,
                "edges": edges,
                "downsampled": downsampled,
                "stored_steps": stored,
                "series": [
                    {
                        "step": points[j].step,
                        "wall_time": points[j].wall_time,
                        "counts": counts[j],
                        "nonfinite": nonfinite[j],
                    }
                    for j in kept
                ],
                "unpaired_steps": [points[j].step for j in sorted(unpaired)],
            }

        group = ("histogram", experiment, run, tag, stat, bins, scale, max_bytes)
        return key, self._cache.get_or_load(key, load, group=group, part=RESULTS)

    # ------------------------------------------------------------------------ /series

    @_route
    def _series_route(self, request):
        ctx, experiment = self._ctx(request)
        run = _params.string(request, "run", required=True)
        tag = _params.string(request, "tag", default=metadata.MODEL_TAG) or metadata.MODEL_TAG
        ema = _params.number(request, "ema", default=None, lo=0.0, hi=1.0, hi_open=True)
        smoothing = _params.number(request, "smoothing", default=None, lo=0.0, hi=1.0, hi_open=True)
        over = _params.choice(request, "over", ("variable", "layer"), default="variable")
        ri = self._reader.run_index(ctx, experiment, run)
        if over == "layer":
            # The layer's statistics change with any of its variables' stats: key on them all.
            version = tuple((t, e.signature) for t, e in sorted(ri.stats.items()))
        else:
            st = ri.stats_for(tag)
            version = st and st.signature
        # The same stats series (at the same version) gives the same payload.
        key = ("series", experiment, run, tag, ema, smoothing, over, version)
        return self._cached_json(
            request,
            key,
            lambda: self.series_impl(
                ctx, experiment, run=run, tag=tag, ema=ema, smoothing=smoothing, over=over
            ),
            group=key[:-1],
        )

    def _layer_series(self, ctx, experiment, ri, run: str, tag: str):
        """The summed stats of the layer of variable ``tag`` (its group's variables with the
        same layer name, `stats.layer_sums`): ``(steps, wall_times, sums, layer, tags)``."""
        entry = ri.moments.get(tag)
        # Variables logged without maps (mode="norms") have only a stats tag: their layer is
        # the tag's prefix, as /tags lists it.
        stats_only = {t: _stats_only_layer(t) for t in _stats_only(ri)}
        if entry is None and tag not in stats_only:
            raise errors.NotFoundError(
                f"run {run!r} has no variable tag {tag!r}: over=layer takes a variable's tag "
                "and sums the stats of the variables of its layer"
            )
        if entry is not None:
            content = entry.content
            assert isinstance(content, metadata.MomentsContent)
            layer = content.layer
        else:
            layer = stats_only[tag]
        if not layer:
            raise errors.NotFoundError(
                f"tag {tag!r} in run {run!r} was logged without a layer name; over=layer "
                "needs the variables' layers (logged by tb_gradmom's writers)"
            )
        layers = {
            t: e.content.layer
            for t, e in ri.moments.items()
            if isinstance(e.content, metadata.MomentsContent)
        }
        layers.update(stats_only)
        members = [t for t in stats.layer_members(layers, tag, _groups_of(ri)) if ri.stats_for(t)]
        entries = [ri.stats_for(t) for t in members]
        series = self._reader.stats_series(ctx, experiment, [e for e in entries if e])
        by_tag = {t: series[e.tag] for t, e in zip(members, entries) if e and e.tag in series}
        if tag not in by_tag:
            raise errors.NotFoundError(
                f"tag {tag!r} in run {run!r} has no readable stats tag {metadata.stats_tag(tag)!r}"
            )
        try:
            steps, sums = stats.layer_sums({t: (s.steps, s.sums) for t, s in by_tag.items()})
        except ValueError as e:
            raise errors.InvalidArgumentError(f"layer {layer!r} of run {run!r}: {e}") from None
        first = by_tag[tag]
        wall = first.wall_times[np.searchsorted(first.steps, steps)]
        return steps, wall, sums, layer, list(by_tag)

    def series_impl(
        self, ctx, experiment, *, run, tag, ema=None, smoothing=None, over="variable"
    ) -> dict:
        """Derived statistics per step of one tag, or of the whole model (``_model``).

        With ``smoothing`` (a decay in ``[0, 1)``), ``smoothed`` holds every statistic from
        separately smoothed numerators and denominators (`stats.smoothed`) and the smoothed
        loss, ``smoothed_se`` their standard errors (`stats.smoothed_se`). ``statistics`` explains each statistic (`stats.STATISTICS`).
        With ``over="layer"`` the statistics are those of the layer of variable ``tag``: the
        stats sums of the variables of its group with its layer name added step by step
        (`stats.layer_sums`, at the steps they all have); the payload names the ``layer`` and
        its ``variables``.
        """
        ri = self._reader.run_index(ctx, experiment, run)
        if over == "layer":
            steps, wall, sums, layer, members = self._layer_series(ctx, experiment, ri, run, tag)
            out = {
                "run": run,
                "tag": tag,
                "over": "layer",
                "layer": layer,
                "variables": members,
                "steps": steps,
                "wall_times": wall.tolist(),
                "values": _payloads.series(sums, ema=ema),
                "descriptions": dict(stats.DERIVED),
                "statistics": {k: v.as_dict() for k, v in stats.STATISTICS.items()},
            }
            if smoothing is not None:
                out["smoothing"] = smoothing
                out["smoothed"] = _payloads.smoothed_series(sums, smoothing)
                out["smoothed_se"] = _payloads.smoothed_series_se(sums, smoothing)
            return out
        st = ri.stats_for(tag)
        if st is None:
            if tag == metadata.MODEL_TAG:
                raise errors.NotFoundError(
                    f"run {run!r} has no whole-model stats tag "
                    f"{metadata.stats_tag(metadata.MODEL_TAG)!r}"
                )
            if tag in ri.moments:
                raise errors.NotFoundError(
                    f"tag {tag!r} in run {run!r} has no stats tag {metadata.stats_tag(tag)!r}"
                )
            raise errors.NotFoundError(f"run {run!r} has no moments tag {tag!r}")
        s = self._reader.stats_for(ctx, experiment, st)
        if s is None:
            raise errors.NotFoundError(f"the stats of run {run!r} tag {tag!r} are unreadable")
        values = _payloads.series(s.sums, ema=ema)
        out = {
            "run": run,
            "tag": tag,
            "steps": s.steps,
            "wall_times": s.wall_times.tolist(),
            "values": values,
            "descriptions": dict(stats.DERIVED),
            "statistics": {k: v.as_dict() for k, v in stats.STATISTICS.items()},
        }
        if smoothing is not None:
            out["smoothing"] = smoothing
            out["smoothed"] = _payloads.smoothed_series(s.sums, smoothing)
            out["smoothed_se"] = _payloads.smoothed_series_se(s.sums, smoothing)
        return out

    # ----------------------------------------------------------------------- /summary

    @_route
    def _summary_route(self, request):
        ctx, experiment = self._ctx(request)
        run = _params.string(request, "run", required=True)
        step = _params.step(request)
        group = _params.string(request, "group", default=None)
        smoothing = _params.number(request, "smoothing", default=None, lo=0.0, hi=1.0, hi_open=True)
        ri = self._reader.run_index(ctx, experiment, run)
        version = tuple((tag, e.signature) for tag, e in sorted({**ri.moments, **ri.stats}.items()))
        key = ("summary", experiment, run, step, group, smoothing, version)
        return self._cached_json(
            request,
            key,
            lambda: self.summary_impl(
                ctx, experiment, run=run, step=step, group=group, smoothing=smoothing
            ),
            group=key[:-1],
        )

    def summary_impl(self, ctx, experiment, *, run, step, group=None, smoothing=None) -> dict:
        """One row per moments tag (and the model) at ``step`` (None: each tag's latest).

        ``group`` (None: every variable and the ``_model`` row): only the variables of that
        group of tags (``""`` the unprefixed one) and its whole-model row
        (`metadata.model_tag`). With ``smoothing``, each row also holds the statistics smoothed
        up to its step and their standard errors (`views.summary_row`), as /series smooths.
        """
        ri = self._reader.run_index(ctx, experiment, run)
        names = _groups_of(ri)
        if group is not None and group not in names:
            shown = ", ".join(repr(g) for g in sorted(names)) or "none"
            raise errors.NotFoundError(
                f"run {run!r} has no group {group!r} (no whole-model tag "
                f"{metadata.stats_tag(metadata.model_tag(group))!r}); its groups: {shown}"
            )
        series = self._reader.stats_series(ctx, experiment, list(ri.stats.values()))

        def row(tag, s, info):
            i = None
            if s is not None and s.steps.size:
                i = s.steps.size - 1 if step is None else s.index_of(step)
            if i is None:
                r = views.summary_row(tag, None, None, **info)
                if smoothing is not None:
                    r.update(views.smoothed_columns(None, smoothing))
                return r, False
            sums = {f: float(v[i]) for f, v in s.sums.items()}
            row = views.summary_row(tag, int(s.steps[i]), sums, **info)
            if smoothing is not None:
                history = {f: v[: i + 1] for f, v in s.sums.items()}
                row.update(views.smoothed_columns(history, smoothing))
            return row, True

        rows = []
        found = False
        for tag, entry in sorted(ri.moments.items()):
            if group is not None and _group_of(tag, names) != group:
                continue
            st = ri.stats_for(tag)
            c = entry.content
            assert isinstance(c, metadata.MomentsContent)  # `moments` holds moments tags only
            r, ok = row(
                tag,
                series.get(st.tag) if st else None,
                {
                    "layer": c.layer,
                    "op": c.op,
                    "shape": list(c.shape),
                    "size": int(math.prod(c.shape)),
                },
            )
            rows.append(r)
            found = found or ok
        for tag, st in sorted(_stats_only(ri).items()):  # variables logged without maps
            if group is not None and _group_of(tag, names) != group:
                continue
            s = series.get(st.tag)
            last = float(s.sums["num_elements"][-1]) if s is not None and s.steps.size else math.nan
            size = int(last) if math.isfinite(last) and 0 <= last < 2**63 else None
            layer = tag.rsplit("/", 1)[0] if "/" in tag else ""
            r, ok = row(tag, s, {"layer": layer, "op": "", "shape": None, "size": size})
            rows.append(r)
            found = found or ok
        rows.sort(key=lambda r: r["tag"])
        model = None
        model_tag = metadata.model_tag(group)
        ms = series.get(metadata.stats_tag(model_tag))
        if ms is not None:
            last = float(ms.sums["num_elements"][-1]) if ms.steps.size else math.nan
            size = int(last) if math.isfinite(last) and 0 <= last < 2**63 else None
            model, ok = row(model_tag, ms, {"layer": "", "op": "", "shape": None, "size": size})
            found = found or ok
        if step is not None and not found:
            raise errors.NotFoundError(f"run {run!r} has no Grad Moments stats at step {step}")
        out = {
            "run": run,
            "step": step,
            "rows": rows,
            "model": model,
            # What the statistic columns are, in display order (the table's header tooltips).
            "statistics": {k: stats.STATISTICS[k].as_dict() for k in views.SUMMARY_STATISTICS},
        }
        if group is not None:
            out["group"] = group
        if smoothing is not None:
            out["smoothing"] = smoothing
        return out

    # ------------------------------------------------------------------------ /export

    @_route
    def _export_route(self, request):
        ctx, experiment = self._ctx(request)
        what = _params.choice(request, "what", EXPORT_WHAT, default=None)
        fmt = _params.choice(request, "format", EXPORT_FORMATS, default="csv")
        if fmt == "npy" and what not in ("heatmap", "moments"):
            raise errors.InvalidArgumentError(
                f"parameter `format`: npy is for arrays (what=heatmap or what=moments), "
                f"not what={what}; use format=csv or format=json"
            )
        run = _params.string(request, "run", required=True)
        args: dict
        if what == "series":
            tag = _params.string(request, "tag", default=metadata.MODEL_TAG) or metadata.MODEL_TAG
            args = {"tag": tag}
        elif what == "heatmap":
            args = self._heatmap_args(
                request,
                max_default=1 << 20,
                max_limit=1 << 20,
                cells_default=None,
                cells_limit=1 << 40,
            )
        elif what == "histogram":
            args = self._histogram_args(request)
        else:  # the raw stored moments at one step
            args = {
                "tag": _params.string(request, "tag", required=True),
                "step": _params.step(request),
            }
        version = self._export_version(ctx, experiment, what, run, args["tag"])
        key = ("export", experiment, what, fmt, run, tuple(sorted(args.items())), version)

        def build():
            # Text is kept gzipped, as TensorBoard would send it (compressing it per request).
            body, mime, name = self.export_impl(
                ctx, experiment, what=what, fmt=fmt, run=run, args=args
            )
            if mime in _TEXT_EXPORTS:
                return _gzip(body), mime, name, "gzip"
            return body, mime, name, None

        body, mime, name, encoding = self._cache.get_or_load(
            key,
            build,
            group=key[:-1],
            max_size=self._cache.part_budgets[RESULTS] // EXPORT_CACHE_SHARE,
            part=RESULTS,
        )
        headers = [("Content-Disposition", f'attachment; filename="{name}"')]
        return http_util.Respond(request, body, mime, content_encoding=encoding, headers=headers)

    def _export_version(self, ctx, experiment, what, run, tag) -> tuple:
        """What an export's body depends on in the data: the signatures of its tags."""
        if what == "series":
            st = self._reader.run_index(ctx, experiment, run).stats_for(tag)
            return (st.signature,) if st is not None else ()
        entry, ri = self._reader.moments_entry(ctx, experiment, run, tag)
        st = ri.stats_for(tag)
        return (entry.signature, st.signature if st is not None else None)

    def export_impl(self, ctx, experiment, *, what, fmt, run, args: dict):
        """``(body, MIME type, file name)`` of one export; ``args``: the parsed parameters of
        ``what`` (those of /heatmap or /histogram, or ``tag`` (and ``step``))."""
        if what == "series":
            tag = args["tag"]
            d = self.series_impl(ctx, experiment, run=run, tag=tag)
            parts = ["gradmom", run, tag, "series"]
            if fmt == "json":
                return encode.to_json(d), "application/json", encode.file_name(parts, "json")
            keys = list(d["values"])
            rows = (
                [int(st), float(w), *[float(d["values"][k][i]) for k in keys]]
                for i, (st, w) in enumerate(zip(d["steps"], d["wall_times"]))
            )
            header = ["step", "wall_time", *keys]
            return encode.csv_table(header, rows), "text/csv", encode.file_name(parts, "csv")
        tag = args["tag"]
        base = ["gradmom", run, tag]
        if what == "heatmap":
            a = args
            entry, _ = self._reader.moments_entry(ctx, experiment, run, tag)
            work = self._heatmap_work(entry, a["max_rows"], a["max_cols"], a["max_cells"])

            with self._work.reserve(work):
                return self._export_heatmap(ctx, experiment, a, fmt, base)
        if what == "histogram":
            a = args
            body = self.histogram_body(ctx, experiment, **a, every_step=True)
            which = "all" if a["step"] == "all" else f"step{body['series'][0]['step']}"
            parts = [*base, a["stat"], "histogram", which]
            if fmt == "json":
                return encode.to_json(body), "application/json", encode.file_name(parts, "json")
            edges = np.asarray(body["edges"], dtype=np.float64)
            rows = (
                [s["step"], s["wall_time"], float(edges[j]), float(edges[j + 1]), int(c)]
                for s in body["series"]
                for j, c in enumerate(np.asarray(s["counts"]))
            )
            header = ["step", "wall_time", "bin_lo", "bin_hi", "count"]
            return encode.csv_table(header, rows), "text/csv", encode.file_name(parts, "csv")
        # what == "moments": the raw stored moments at one step.
        step = args["step"]
        entry, _ = self._reader.moments_entry(ctx, experiment, run, tag)
        cells = math.prod(entry.moments.stored_shape) * len(entry.moments.orders)

        with self._work.reserve(_payloads.work_bytes(entry.moments, cells)):
            return self._export_moments(ctx, experiment, run, tag, step, fmt, base)

    def _export_heatmap(self, ctx, experiment, a, fmt, base):
        body = self._heatmap_body(
            ctx,
            experiment,
            a["run"],
            a["tag"],
            a["step"],
            a["stat"],
            a["max_rows"],
            a["max_cols"],
            max_cells=a["max_cells"],
        )
        parts = [*base, a["stat"], f"step{body['step']}"]
        if fmt == "json":
            text = self._compute(lambda: encode.to_json(body))
            return text, "application/json", encode.file_name(parts, "json")
        grid = np.asarray(body["values"], dtype=np.float64).reshape(body["rows"], body["cols"])
        if fmt == "npy":
            return (
                encode.npy_bytes(grid),
                "application/octet-stream",
                encode.file_name(parts, "npy"),
            )
        text = self._compute(lambda: _payloads.grid_csv(grid))
        return text, "text/csv", encode.file_name(parts, "csv")

    def _export_moments(self, ctx, experiment, run, tag, step, fmt, base):
        entry, m, n = self._moments(ctx, experiment, run, tag, step)
        return self._compute(lambda: self._moments_file(entry, m, n, run, tag, fmt, base))

    def _moments_file(self, entry, m, n, run, tag, fmt, base):
        """``(body, MIME type, file name)`` of the raw moments of one step (`MomentsAt` m)."""
        c = entry.content
        parts = [*base, "moments", f"step{m.step}"]
        if fmt == "npy":
            stacked = np.stack([m.arrays[p] for p in c.orders]).astype(np.float32, copy=False)
            name = encode.file_name(parts, "npy")
            return encode.npy_bytes(stacked), "application/octet-stream", name
        if fmt == "json":
            return (
                encode.to_json(
                    {
                        "run": run,
                        "tag": tag,
                        "step": m.step,
                        "wall_time": m.wall_time,
                        "batch_size": n,
                        "orders": list(c.orders),
                        "shape": list(c.shape),
                        "stored_shape": list(c.stored_shape),
                        "pooled": bool(c.pooled),
                        "block": list(c.block) if c.pooled else [1, 1],
                        "moments": {str(p): m.arrays[p] for p in c.orders},
                    }
                ),
                "application/json",
                encode.file_name(parts, "json"),
            )
        header, table = _payloads.moments_table(m.arrays)
        rows = ([int(r[0]), *r[1:]] for r in table.tolist())
        return encode.csv_table(header, rows), "text/csv", encode.file_name(parts, "csv")

    # -------------------------------------------------------------------------- /meta

    @_route
    def _meta_route(self, request):
        """The tab's labels, orders, palettes and defaults (`views.meta`); no experiment data."""
        return self._json(request, _meta_json())

    # ------------------------------------------------------------------------- static

    @_route
    def _static_route(self, request):
        path = request.path
        i = path.find(ROUTE_PREFIX)
        rel = path[i + len(ROUTE_PREFIX) :] if i >= 0 else ""
        found = _static.resolve(self._static_root, rel)
        if found is None:
            raise errors.NotFoundError(f"no Grad Moments frontend file {rel[:100]!r}")
        file_path, mime = found
        with open(file_path, "rb") as f:
            content = f.read()
        return http_util.Respond(request, content, mime)
