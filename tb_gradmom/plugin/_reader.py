"""Reads Grad Moments tags through TensorBoard, with caching, checks and bounded memory.

The same code serves the Python loader and RustBoard (``--load_fast=true``); nothing here
imports TensorFlow.

**What is read.** Tags are listed with ``list_tensors`` (plugin ``gradmom``). Tensors are
taken as undecoded protos where TensorBoard allows it (`_tb_compat`): from the Python loader's
event multiplexer, and from RustBoard's data server stub; each step is decoded only when it
is needed. Any other data provider is read with ``read_tensors``.

**Nothing read is trusted.** A content message is parsed and bounded by
`metadata.parse_plugin_content`; a tag whose content fails is left out (logged once, naming
run, tag and last step). Each step's tensor is checked against its content
(`metadata.check_tensor_proto` before decoding where the proto is at hand,
`metadata.check_tensor` after): a bad step is skipped (logged, naming run, tag and step) or,
when asked for, answered 404 with the reason. A failing read of several tags is retried tag by
tag, so one bad tag never takes the others down.

**One step.** With the Python loader a step is its one event in the multiplexer's memory,
found by step (`Reader._step_index`) and decoded alone (`Reader._read_one`); with RustBoard
and a local ``--logdir`` it is its one record in the run's event file
(`_eventfiles.StepFiles`, `Reader._read_file`). Both run on the request's own thread
(`Reader.quick_moments`). Of a step stored more than once (two writers on one run), the
record its stats record was logged with is taken (format 3's ``moments_sum``,
`metadata.same_moments`); a step whose moments come from another writer than its statistics
is refused (`BadRecord`, 404), never served. Otherwise:

**Read strategy** (what the data provider API allows):

* ``read_tensors`` has no step filter, only ``downsample``: ``downsample=1`` returns the last
  step (cheap with RustBoard, which downsamples before sending). Decoded arrays are kept in a
  byte-budgeted LRU, so scrubbing through steps after one full read is served from memory.
* Over gRPC (RustBoard) every byte read costs (about 1 s for a 250 MB series, mostly the
  client's copies and page faults), so any other step of a big series
  (`TARGETED_READ_MIN_BYTES`) is read with a *targeted sample*. ``downsample=k`` returns a
  fixed pseudo-random sample that depends only on the number of points and ``k`` (always
  with the last point; RustBoard's are prefixes of one permutation), and the small
  ``<tag>/_stats`` tag has the same steps as its moments tag. A few reads of the stats tag
  (bisection on ``k``) find a small ``k`` whose sample holds the step; the moments tag is read
  with that ``k`` and the result is checked (a sample without the step falls back to the whole
  series). All steps read near the one asked are cached.
* Concurrent requests for different steps of one series share one read: each registers its
  step, the first reads, and every registered step found is handed to its request.
* An all-steps histogram reads at most `HISTOGRAM_READ_BYTES` of a series: a bigger series is
  binned on a sample of its steps (``downsample``), and the payload lists them. Its steps are
  one record each (the latest); a step whose record is not the one its stats record was
  logged with is read again from the step's other records (`Reader.paired`), else left out.
* RustBoard replies over gRPC, whose messages TensorBoard caps at 256 MiB: a series bigger
  than `GRPC_READ_BUDGET` is read downsampled, and a step the sample misses answers 404 with
  the reason.

**Memory.** Every read reserves its bytes on a `_cache.MemoryGate` of `READ_BUDGET_BYTES` for
as long as it holds them (a reply's tensor bytes, and the steps decoded from it); what
outlives the read is in the cache, counted by what it really holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import Callable

import numpy as np
from tensorboard import errors
from tensorboard.data import provider
from tensorboard.util import tensor_util

from tb_gradmom import metadata
from tb_gradmom.analysis import data
from tb_gradmom.plugin import _eventfiles, _tb_compat
from tb_gradmom.plugin._cache import ByteLRU, MemoryGate, nbytes

logger = logging.getLogger(__name__)

PLUGIN = metadata.PLUGIN_NAME
# The most bytes of tensor values one read asks a gRPC data provider (RustBoard) for:
# TensorBoard's gRPC channel accepts replies up to 256 MiB; the rest is headroom for framing.
GRPC_READ_BUDGET = 240 * 1024 * 1024
# `downsample` meaning "every stored step": above any --samples_per_plugin anyone would use.
ALL_STEPS = 1_000_000
# The most bytes of moments one all-steps histogram reads (on both loaders); a bigger series
# is binned on a sample of its steps. 64 MiB is 134 steps of a variable pooled to 62,500 cells
# with orders (1, 2): over RustBoard about 0.1 s of transfer instead of ~1 s for 500 steps.
HISTOGRAM_READ_BYTES = 64 * 1024 * 1024
# Over gRPC, a step of a series at least this big is read with a targeted sample, not with
# the whole series (see `Reader._plan_targeted`).
TARGETED_READ_MIN_BYTES = 32 * 1024 * 1024
# The bisection for a targeted sample stops when its bracket is 1/32 of the steps.
_TARGET_TOLERANCE = 32
# With this many steps of one series wanted at once, the whole series is read for them all
# (each targeted sample is half the series on average; a sample holding them all, nearly all).
_MAX_TARGETS = 4
# Decoded tensors held by reads in flight, all requests together (a single read bigger than
# this runs alone): part of the plugin's memory bound, see docs/http_api.md.
READ_BUDGET_BYTES = 256 * 1024 * 1024
# Peak memory of a read over gRPC per byte of tensors it returns (measured with RustBoard:
# 2.7-2.9 for the protos, the reply's bytes and its parse; 2.5 for `read_tensors`, which also
# decodes every tensor).
GRPC_READ_FACTOR = 3
# Steps assumed for a series whose length is not known yet (TensorBoard's default sample for
# this plugin, `plugin_loader.DEFAULT_SAMPLES`).
_ASSUMED_STEPS = 500
# Logged problems remembered (to log each once); forgotten past this many.
_MAX_WARNED = 10_000


class BadRecord(errors.NotFoundError):
    """A stored step whose tensor does not match its tag's metadata (answered 404)."""


@dataclasses.dataclass(frozen=True)
class TagEntry:
    """One Grad Moments time series as listed by the data provider."""

    run: str
    tag: str
    content: metadata.MomentsContent | metadata.StatsContent
    max_step: int
    max_wall_time: float
    description: str = ""

    @property
    def signature(self) -> tuple:
        """Changes when the series gets new data."""
        return (self.max_step, self.max_wall_time)

    @property
    def moments(self) -> metadata.MomentsContent:
        """The content of a moments tag (`TypeError` for a stats tag: a caller's bug)."""
        if not isinstance(self.content, metadata.MomentsContent):
            raise TypeError(f"run {self.run!r} tag {self.tag!r} is not a moments tag")
        return self.content

    @property
    def stats(self) -> metadata.StatsContent:
        """The content of a stats tag (`TypeError` for a moments tag: a caller's bug)."""
        if not isinstance(self.content, metadata.StatsContent):
            raise TypeError(f"run {self.run!r} tag {self.tag!r} is not a stats tag")
        return self.content


@dataclasses.dataclass
class RunIndex:
    """The Grad Moments tags of one run: moments tags, stats tags by name, and the tags left
    out with the reason (a content message that fails its checks, a tag TensorBoard's data
    provider cannot list)."""

    moments: dict[str, TagEntry] = dataclasses.field(default_factory=dict)
    stats: dict[str, TagEntry] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)

    def stats_for(self, tag: str) -> TagEntry | None:
        """The stats tag belonging to moments tag ``tag`` (or ``_model``), if logged."""
        return self.stats.get(metadata.stats_tag(tag))


@dataclasses.dataclass(frozen=True)
class StatsSeries:
    """The stats tensors of one tag over its readable steps.

    Attributes:
      steps: int64 ``[T]``, ascending.
      wall_times: float64 ``[T]``.
      sums: field -> float64 ``[T]`` for each field of the tag's content message (views of
        one table, which also holds `hist_counts`).
      hist_counts: float64 ``[T, buckets]``, the variance histogram counts.
    """

    steps: np.ndarray
    wall_times: np.ndarray
    sums: dict[str, np.ndarray]
    hist_counts: np.ndarray
    # Every record the data provider holds of the tag, in its order (a step stored twice
    # included): ``(step, writer source token or None)``, for `data.writers_of`.
    held: tuple[tuple[int, int | None], ...] = ()

    def index_of(self, step: int) -> int | None:
        i = int(np.searchsorted(self.steps, step))
        if i < self.steps.size and self.steps[i] == step:
            return i
        return None


@dataclasses.dataclass(frozen=True)
class MomentsAt:
    """The moments of one tag at one step: ``arrays[order]`` of the stored shape."""

    step: int
    wall_time: float
    arrays: dict[int, np.ndarray]
    # `metadata.moments_sum` of the tensor as stored: pairs it with its stats record (format 3).
    moments_sum: float = math.nan


@dataclasses.dataclass(frozen=True)
class Point:
    """One stored step of a series; `get` gives its moments (decoded on demand)."""

    step: int
    wall_time: float
    _get: Callable[[], MomentsAt] = dataclasses.field(repr=False)

    def get(self) -> MomentsAt:
        return self._get()


@dataclasses.dataclass(frozen=True)
class _Raw:
    """One stored step as fetched: a tensor proto (not decoded yet) or an array."""

    step: int
    wall_time: float
    proto: object = None
    array: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class _StepRequest:
    """A request for a step that is not the latest: the series, the step, and the tag's stats
    series and stats tag if it has one (their steps locate the step in a targeted sample)."""

    ctx: object
    experiment_id: str
    entry: TagEntry
    want: int
    stats: StatsSeries | None
    stats_entry: TagEntry | None


class _Pending:
    """Requests waiting on one read of a series: their steps, and what the read found."""

    def __init__(self):
        self.lock = threading.Lock()
        self.wanted: dict[int, int] = {}  # step -> number of requests waiting for it
        self.results: dict[int, MomentsAt] = {}
        self.absent: dict[int, str] = {}


class Reader:
    """Grad Moments data for one TensorBoard instance.

    Args:
      data_provider: TensorBoard's data provider.
      cache: the plugin's cache.
      multiplexer: the Python loader's event multiplexer (`_tb_compat.multiplexer_of`), or
        None to read through the data provider only.
      read_gate: the gate reads reserve their bytes on (default: `READ_BUDGET_BYTES`).
      logdir: TensorBoard's ``--logdir``: with RustBoard's data server, one step is read from the
        run's event files when they are local (`_eventfiles.StepFiles`), not from a sample of
        its series; None to read through the data provider only.
    """

    def __init__(
        self, data_provider, cache: ByteLRU, multiplexer=None, read_gate=None, logdir=None
    ):
        self._provider = data_provider
        self._cache = cache
        self._mux = multiplexer
        self._stub = _tb_compat.grpc_stub_of(data_provider)
        self._grpc = not _tb_compat.is_python_loader(data_provider)
        self.read_gate = read_gate if read_gate is not None else MemoryGate(READ_BUDGET_BYTES)
        self._warned: set = set()
        self._warn_lock = threading.Lock()
        self._pending: dict[tuple, _Pending] = {}
        self._pending_lock = threading.Lock()
        self.files = _eventfiles.StepFiles(logdir) if self._stub is not None and logdir else None

    # ------------------------------------------------------------------------ logging

    def _warn(self, run: str, tag: str, step, message: str) -> None:
        """Logs a skipped tag or step once: ``run 'r' tag 't' step s: message`` (a name longer
        than a log line can show is shortened, `data.short_name`)."""
        key = (run, tag, step)
        with self._warn_lock:
            if key in self._warned:
                return
            if len(self._warned) >= _MAX_WARNED:
                self._warned.clear()
            self._warned.add(key)
        logger.warning(
            "Grad Moments: run %s tag %s step %s: %s",
            data.short_name(run),
            data.short_name(tag),
            step,
            message,
        )

    # ----------------------------------------------------------------------- listing

    def index(self, ctx, experiment_id: str, run: str | None = None, tags=None):
        """``{run: RunIndex}`` of every readable Grad Moments tag (optionally of one run/tags).

        Tags whose content message cannot be parsed (a newer format, a corrupt or crafted
        header) are left out, logged once each and listed in `RunIndex.skipped`; so is a tag
        TensorBoard's data provider cannot list (`_listing`).
        """
        listing, unlisted = self._listing(ctx, experiment_id, run, tags)
        result: dict[str, RunIndex] = {}
        for run_name, reasons in unlisted.items():
            result.setdefault(run_name, RunIndex()).skipped.update(reasons)
        for run_name, tags in listing.items():
            ri = result.setdefault(run_name, RunIndex())
            for tag_name, ts in tags.items():
                max_step = int(ts.max_step) if ts.max_step is not None else -1
                content = self._parse(run_name, tag_name, max_step, ts.plugin_content)
                if isinstance(content, str):
                    ri.skipped[tag_name] = content
                    continue
                entry = TagEntry(
                    run=run_name,
                    tag=tag_name,
                    content=content,
                    max_step=max_step,
                    max_wall_time=float(ts.max_wall_time or 0.0),
                    description=ts.description or "",
                )
                if isinstance(content, metadata.StatsContent):
                    ri.stats[tag_name] = entry
                else:
                    ri.moments[tag_name] = entry
        return result

    def _list_tensors(self, ctx, experiment_id: str, runs, tags) -> dict:
        rtf = None
        if runs is not None or tags is not None:
            rtf = provider.RunTagFilter(runs=runs, tags=None if tags is None else list(tags))
        return self._provider.list_tensors(
            ctx, experiment_id=experiment_id, plugin_name=PLUGIN, run_tag_filter=rtf
        )

    def _listing(self, ctx, experiment_id: str, run: str | None, tags) -> tuple[dict, dict]:
        """``list_tensors`` of the plugin's tags (of one run and some tags if given), and the
        tags it could not list: ``({run: {tag: TensorTimeSeries}}, {run: {tag: reason}})``.

        The data provider lists every run at once, and fails as a whole when one series cannot
        be listed: TensorBoard's Python loader raises ``KeyError`` for a tag whose first event
        has metadata but no tensor (a crafted or foreign event). Then the runs are listed one by
        one, and a run that fails tag by tag (its tags from the Python loader's multiplexer,
        `_tb_compat.plugin_tags`; a run whose tags cannot be named is skipped whole); each tag
        or run left out is logged once, naming the run, the tag and the error.

        Raises:
          Whatever the data provider raises when it cannot even list the runs (an unknown
          experiment).
        """
        runs = None if run is None else [run]
        try:
            return self._list_tensors(ctx, experiment_id, runs, tags), {}
        except Exception as e:  # noqa: BLE001 - whatever a data provider raises: list by parts
            failure = e
        if run is None:
            try:
                names = [
                    r.run_name for r in self._provider.list_runs(ctx, experiment_id=experiment_id)
                ]
            except Exception:  # noqa: BLE001 - the listing itself fails: report the first error
                raise failure from None
        else:
            names = [run]
        listing: dict[str, dict] = {}
        unlisted: dict[str, dict[str, str]] = {}
        for name in names:
            if run is None:
                try:
                    got = self._list_tensors(ctx, experiment_id, [name], tags)
                except Exception as e:  # noqa: BLE001 - this run fails: tag by tag
                    failure = e
                else:
                    for r, series in got.items():
                        listing.setdefault(r, {}).update(series)
                    continue
            tag_names = list(tags) if tags is not None else None
            if tag_names is None and self._mux is not None:
                tag_names = _tb_compat.plugin_tags(self._mux, PLUGIN, name)
            if tag_names is None:
                reason = (
                    f"TensorBoard's data provider cannot list this run "
                    f"({type(failure).__name__}: {failure}); the run is skipped"
                )
                self._warn(name, "*", "(all)", reason)
                unlisted.setdefault(name, {})["*"] = reason
                continue
            for tag in tag_names:
                try:
                    got = self._list_tensors(ctx, experiment_id, [name], [tag])
                except Exception as e:  # noqa: BLE001 - this tag fails: it alone is left out
                    reason = (
                        f"TensorBoard's data provider cannot list this tag "
                        f"({type(e).__name__}: {e}; TensorBoard's Python loader fails so on a "
                        "summary with metadata and no tensor); the tag is skipped"
                    )
                    self._warn(name, tag, "(all)", reason)
                    unlisted.setdefault(name, {})[tag] = reason
                    continue
                for r, series in got.items():
                    listing.setdefault(r, {}).update(series)
        return listing, unlisted

    def run_index(self, ctx, experiment_id: str, run: str) -> RunIndex:
        """The tags of one run; `errors.NotFoundError` if it has no Grad Moments data."""
        ri = self.index(ctx, experiment_id, run=run).get(run)
        if ri is None or not (ri.moments or ri.stats):
            raise errors.NotFoundError(f"run {run!r} has no Grad Moments data")
        return ri

    def moments_entry(
        self, ctx, experiment_id: str, run: str, tag: str
    ) -> tuple[TagEntry, RunIndex]:
        """The entry of moments tag ``tag`` in ``run`` (and a `RunIndex` with its stats tag).

        Lists only the two tags: the data provider then scans only their events.

        Raises:
          errors.NotFoundError: unknown run, unknown tag, or a stats tag.
        """
        ri = self.index(ctx, experiment_id, run=run, tags=[tag, metadata.stats_tag(tag)]).get(run)
        entry = ri.moments.get(tag) if ri is not None else None
        if entry is None:
            if ri is not None and tag in ri.stats:
                raise errors.NotFoundError(
                    f"tag {tag!r} in run {run!r} is a stats tag, not a moments tag; "
                    f"ask for {tag[: -len(metadata.STATS_SUFFIX)]!r} instead"
                )
            self.run_index(ctx, experiment_id, run)  # raises for an unknown run
            raise errors.NotFoundError(f"run {run!r} has no moments tag {tag!r}")
        return entry, ri

    def _parse(self, run: str, tag: str, max_step: int, content: bytes):
        """The parsed content message of a tag, or why it is skipped (a string, logged)."""
        raw = bytes(content)
        key = ("content", raw)
        parsed = self._cache.get(key)
        if parsed is not None:
            return parsed
        try:
            parsed = metadata.parse_plugin_content(raw)
        except metadata.FormatError as e:
            reason = f"{e}; the tag is skipped"
            self._warn(run, tag, f"(last {max_step})", reason)
            return reason
        self._cache.put(key, parsed, size=nbytes(raw) + nbytes(parsed))
        return parsed

    # ------------------------------------------------------------------ raw reading

    def _fetch(
        self,
        ctx,
        experiment_id: str,
        run: str,
        tags: list[str],
        downsample: int,
        every_record: bool = False,
    ) -> dict[str, list[_Raw]]:
        """The stored steps of some tags of one run, undecoded where TensorBoard allows it
        (`_tb_compat`): ``{tag: [_Raw]}``, one record per step (`_latest_per_step`), in the data
        provider's order and sample (the Python loader's: by step). ``every_record``: every
        record the Python loader holds, in its order (a step stored twice too; the other
        loaders hold one per step)."""
        if self._mux is not None:
            out = {}
            for tag in tags:
                events = _tb_compat.tensor_events(self._mux, run, tag)
                if events is None:
                    continue
                raws = [_Raw(int(e.step), float(e.wall_time), e.tensor_proto) for e in events]
                if every_record:
                    out[tag] = raws
                    continue
                raws = self._latest_per_step(run, tag, raws)
                chosen = _tb_compat.downsample_indices(len(raws), downsample)
                out[tag] = [raws[i] for i in chosen]
            return out
        if self._stub is not None:
            got = _tb_compat.grpc_read_tensors(
                self._stub, experiment_id, PLUGIN, run, tags, downsample
            )
            return {
                tag: self._latest_per_step(
                    run, tag, [_Raw(int(s), float(w), proto) for s, w, proto in series]
                )
                for tag, series in got.items()
            }
        read = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=PLUGIN,
            downsample=downsample,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=list(tags)),
        ).get(run, {})
        return {
            tag: self._latest_per_step(
                run, tag, [_Raw(int(d.step), float(d.wall_time), None, d.numpy) for d in series]
            )
            for tag, series in read.items()
        }

    def _latest_per_step(self, run: str, tag: str, raws: list[_Raw]) -> list[_Raw]:
        """One record per step, the latest stored (the provider's last), ordered by step.

        Two training processes writing one run (or two writers on one directory, or a run
        restarted from a checkpoint, which TensorFlow 2's writers do not mark) store a step
        twice. TensorBoard's Python loader keeps both records, RustBoard and `data.load` the
        later one; so does the plugin, and it logs how many steps repeat, once per tag.
        """
        latest: dict[int, int] = {}
        for i, r in enumerate(raws):
            latest[r.step] = i
        if len(latest) == len(raws):
            if all(raws[i].step < raws[i + 1].step for i in range(len(raws) - 1)):
                return raws
            return sorted(raws, key=lambda r: r.step)
        repeated = sorted({r.step for i, r in enumerate(raws) if latest[r.step] != i})
        shown = ", ".join(map(str, repeated[:5])) + (", ..." if len(repeated) > 5 else "")
        self._warn(
            run,
            tag,
            "(all)",
            f"{len(repeated)} steps are stored more than once ({shown}): two training processes "
            "or writers on one run, or a run restarted from a checkpoint; the latest record of "
            "each step is shown (as RustBoard and tb_gradmom.data.load do)",
        )
        return [raws[i] for i in sorted(latest.values(), key=lambda i: raws[i].step)]

    def _read_bytes(self, entry: TagEntry, points: int) -> int:
        """Bytes a fetch of ``points`` steps of ``entry`` holds before any is decoded."""
        if self._mux is not None:
            return 0  # the protos are the loader's; nothing is copied
        return GRPC_READ_FACTOR * points * self._tensor_bytes(entry)

    def _tensor_bytes(self, entry: TagEntry) -> int:
        """Bytes of one stored step's tensor (a float16 tag's half of its decoded arrays)."""
        c = entry.content
        if not isinstance(c, metadata.MomentsContent):
            return 4 * metadata.stats_length(c)
        if c.encoding == metadata.ENCODING_FLOAT16:
            return 2 * math.prod(metadata.tensor_shape(c))
        return self.bytes_per_step(entry)

    def _array(self, entry: TagEntry, raw: _Raw) -> np.ndarray:
        """The checked array of one fetched step (`BadRecord`, logged, if it does not fit)."""
        try:
            if raw.proto is not None:
                metadata.check_tensor_proto(entry.content, raw.proto)
                try:
                    array = tensor_util.make_ndarray(raw.proto)
                except Exception as e:  # noqa: BLE001 - whatever a corrupt proto raises
                    raise metadata.FormatError(f"unreadable tensor ({type(e).__name__})") from None
            else:
                array = np.asarray(raw.array)
            metadata.check_tensor(entry.content, array)
        except metadata.FormatError as e:
            raise self._bad(entry, raw.step, e) from None
        return array

    def _fits(self, entry: TagEntry, raw: _Raw) -> bool:
        """A cheap check of a fetched step before it is decoded (logged if it fails)."""
        try:
            if raw.proto is not None:
                metadata.check_tensor_proto(entry.content, raw.proto)
            else:
                metadata.check_tensor(entry.content, np.asarray(raw.array))
        except metadata.FormatError as e:
            self._bad(entry, raw.step, e)
            return False
        return True

    def _bad(self, entry: TagEntry, step: int, e: Exception) -> BadRecord:
        self._warn(entry.run, entry.tag, step, f"{e}; the step is skipped")
        return BadRecord(f"run {entry.run!r} tag {entry.tag!r} step {step}: {e}")

    # ------------------------------------------------------------------------- stats

    def _stats_key(self, experiment_id: str, e: TagEntry):
        return ("stats", experiment_id, e.run, e.tag, e.signature)

    def stats_series(
        self, ctx, experiment_id: str, entries: list[TagEntry]
    ) -> dict[str, StatsSeries]:
        """``{tag: StatsSeries}`` for stats tags of one run (one read for all cache misses).

        Steps whose tensor does not fit the tag's content message are left out (logged); a
        tag that cannot be read at all is left out (logged) and never affects the others.
        """
        out: dict[str, StatsSeries] = {}
        missing: list[TagEntry] = []
        for e in entries:
            s = self._cache.get(self._stats_key(experiment_id, e))
            if s is None:
                missing.append(e)
            else:
                out[e.tag] = s
        if not missing:
            return out
        for e, s in self._read_stats(ctx, experiment_id, missing).items():
            self._cache.put(
                self._stats_key(experiment_id, e), s, group=("stats", experiment_id, e.run, e.tag)
            )
            out[e.tag] = s
        return out

    def _read_stats(self, ctx, experiment_id, entries: list[TagEntry]) -> dict:
        run = entries[0].run
        estimate = sum(
            (
                self._read_bytes(e, _ASSUMED_STEPS)
                + 16 * _ASSUMED_STEPS * metadata.stats_length(e.stats)
                for e in entries
            ),
            0,
        )
        try:
            with self.read_gate.reserve(estimate):
                fetched = self._fetch(
                    ctx, experiment_id, run, [e.tag for e in entries], ALL_STEPS, every_record=True
                )
                out = {}
                for e in entries:
                    every = fetched.get(e.tag) or []
                    latest = self._latest_per_step(run, e.tag, every)
                    rows, decoded = [], {}
                    for raw in latest:
                        try:
                            decoded[id(raw)] = array = self._array(e, raw)
                        except BadRecord:
                            continue
                        rows.append((raw.step, raw.wall_time, array))
                    out[e] = _stats_series(rows, e.stats, self._held(e, every, decoded))
                return out
        except Exception as err:  # noqa: BLE001 - one bad tag must not take the others down
            if len(entries) == 1:
                self._warn(run, entries[0].tag, "(all)", f"unreadable: {type(err).__name__}")
                return {}
        out = {}
        for e in entries:  # one by one: only the failing tag is left out
            out.update(self._read_stats(ctx, experiment_id, [e]))
        return out

    def _held(self, e: TagEntry, every: list[_Raw], decoded: dict) -> tuple:
        """`StatsSeries.held` of a stats tag: the source token of each record held (the
        records `_latest_per_step` left out decoded for it alone; unreadable ones skipped)."""
        fields = e.stats.fields
        if "source_hi" not in fields or "source_lo" not in fields:
            return tuple((raw.step, None) for raw in every)
        hi, lo = fields.index("source_hi"), fields.index("source_lo")

        def token(array) -> int | None:
            return metadata.source_of(
                {"source_hi": float(array[hi]), "source_lo": float(array[lo])}
            )

        held = []
        for raw in every:
            array = decoded.get(id(raw))
            if array is None:
                try:
                    array = self._array(e, raw)
                except BadRecord:
                    continue
            held.append((raw.step, token(array)))
        return tuple(held)

    def writers(
        self, run: str, series: dict[str, StatsSeries], moments_tags: list[str]
    ) -> data.Writers | None:
        """Who wrote a run, from its stats series and the steps of its moments tags
        (`data.writers_of`). The Python loader holds every record (the moments' are counted
        from its events, none decoded); RustBoard one per step, so with a local log directory
        the run's event files say which steps have more (`_eventfiles.StepFiles.record_counts`,
        once the run is indexed: from a later reload on)."""
        held: list[tuple[str, int, int | None]] = [
            (tag, step, tok) for tag, s in series.items() for step, tok in s.held
        ]
        if self._mux is not None:
            for tag in moments_tags:
                events = _tb_compat.tensor_events(self._mux, run, tag) or []
                held.extend((tag, int(e.step), None) for e in events)
        elif self.files is not None and self.files.indexed(run):
            for tag in [*series, *moments_tags]:
                kept = 1 if tag in series else 0  # the stats record RustBoard kept is held
                for step, count in self.files.record_counts(run, tag).items():
                    held.extend([(tag, step, None)] * (count - kept))
        return data.writers_of(held)

    def stats_for(self, ctx, experiment_id: str, entry: TagEntry | None) -> StatsSeries | None:
        if entry is None:
            return None
        return self.stats_series(ctx, experiment_id, [entry]).get(entry.tag)

    # ----------------------------------------------------------------------- moments

    def bytes_per_step(self, entry: TagEntry) -> int:
        """Bytes of one step's decoded moments (float32 arrays, whatever the encoding)."""
        c = entry.moments
        return 4 * len(c.orders) * max(1, math.prod(c.stored_shape))

    def _moments_key(self, experiment_id, entry, step):
        return ("moments", experiment_id, entry.run, entry.tag, int(step))

    def _moments(self, entry: TagEntry, raw: _Raw) -> MomentsAt:
        """One fetched step decoded and checked (`BadRecord` if it does not fit)."""
        array = self._array(entry, raw)
        try:
            arrays = metadata.decode_moments(entry.moments, array)
        except metadata.FormatError as e:
            raise self._bad(entry, raw.step, e) from None
        return MomentsAt(raw.step, raw.wall_time, arrays, metadata.moments_sum(array))

    def _point(self, entry: TagEntry, raw: _Raw) -> Point:
        return Point(raw.step, raw.wall_time, lambda: self._moments(entry, raw))

    def moments_at(
        self,
        ctx,
        experiment_id: str,
        entry: TagEntry,
        step: int | None,
        stats: StatsSeries | None = None,
        stats_entry: TagEntry | None = None,
    ) -> MomentsAt:
        """The moments of ``entry`` at ``step`` (None: the last step listed, ``entry.max_step``).

        ``stats`` / ``stats_entry``: the tag's stats series and stats tag, if it has one (their
        steps locate ``step`` in a targeted sample; see the module docstring). The step returned
        is always the one asked for: when the series has grown since ``entry`` was listed (a
        live run), its newest record is not taken for the step listed.

        Raises:
          errors.NotFoundError: the step is not stored (the message gives the stored range).
          BadRecord: its tensor does not fit the tag's metadata.
        """
        want = entry.max_step if step is None else int(step)
        key = self._moments_key(experiment_id, entry, want)
        request = _StepRequest(ctx, experiment_id, entry, want, stats, stats_entry)
        if self._mux is not None:  # every step is one event in memory (the latest too)
            read = self._read_one
        elif step is None or want == entry.max_step:
            read = self._read_last
        else:
            read = self._read_step
        latest = step is None or want == entry.max_step
        if self.files is not None and (self.files.indexed(entry.run) or not latest):
            # the files first (the latest step too once they are indexed: one gRPC call less);
            # the data provider if they cannot say
            m = self._cache.get_or_load(key, lambda: self._read_file(request) or read(request))
        else:
            m = self._cache.get_or_load(key, lambda: read(request))
        if not _same_source(stats, m):
            raise BadRecord(_mixed_message(entry, m.step, stats))
        return m

    def quick_moments(
        self, experiment_id: str, entry: TagEntry, step: int | None, stats: StatsSeries | None
    ) -> MomentsAt | None:
        """`moments_at` when it costs one event or one record at most: from the cache, the
        Python loader's memory or a local event file (RustBoard); None when only a read
        through the data provider can say (then call `moments_at`).

        Raises:
          BadRecord: as `moments_at`.
        """
        want = entry.max_step if step is None else int(step)
        key = self._moments_key(experiment_id, entry, want)
        m = self._cache.get(key)
        files = self.files is not None and self.files.indexed(entry.run)
        if m is None and (self._mux is not None or files):
            request = _StepRequest(None, experiment_id, entry, want, stats, None)
            try:
                if self._mux is not None:
                    m = self._read_one(request)
                else:
                    m = self._read_file(request)
            except BadRecord:
                raise
            except errors.NotFoundError:
                return None  # not there: `moments_at` says so with the data provider's reasons
            if m is not None:
                self._cache.put(key, m)
        if m is not None and not _same_source(stats, m):
            raise BadRecord(_mixed_message(entry, m.step, stats))
        return m

    def _read_file(self, request: _StepRequest) -> MomentsAt | None:
        """Step ``want`` read from the run's event files (`_eventfiles`), or None if they do
        not have it readable (then the data provider is asked)."""
        entry, want = request.entry, request.want
        files = self.files
        assert files is not None
        with self.read_gate.reserve(self._tensor_bytes(entry) + self.bytes_per_step(entry)):
            try:
                found = files.read(entry.run, entry.tag, want)
            except Exception as e:  # noqa: BLE001 - never worse than the provider's read
                self._warn(entry.run, entry.tag, want, f"not read from its files ({e!r})")
                return None
            if not found:
                return None
            return self._matching(
                request, (_Raw(f.step, f.wall_time, f.proto) for f in reversed(found))
            )

    def _read_last(self, request: _StepRequest) -> MomentsAt:
        """The step listed last (``entry.max_step``), read as the series' latest record.

        A live run writes on while a request runs: the series' latest record may be a step
        listed after ``entry`` (whose stats record may not be written yet). Then the step asked
        for is read like any other (`_read_step`).
        """
        ctx, experiment_id, entry = request.ctx, request.experiment_id, request.entry
        with self.read_gate.reserve(self._read_bytes(entry, 1) + self.bytes_per_step(entry)):
            series = self._fetch(ctx, experiment_id, entry.run, [entry.tag], 1).get(entry.tag)
            if not series:
                raise errors.NotFoundError(f"run {entry.run!r} tag {entry.tag!r} has no data")
            if series[-1].step == request.want:
                return self._moments(entry, series[-1])
        return self._read_step(request)

    def last_readable(
        self, ctx, experiment_id: str, entry: TagEntry, stats: StatsSeries | None
    ) -> MomentsAt:
        """The latest step whose record is readable (and has stats, if the tag has a stats
        tag): the fallback when the latest record is bad."""
        num = int(stats.steps.size) if stats is not None else None
        with self.open_series(ctx, experiment_id, entry, num) as (points, _):
            for p in reversed(points):
                if stats is not None and stats.index_of(p.step) is None:
                    continue
                try:
                    m = p.get()
                except BadRecord:
                    continue
                if not _same_source(stats, m):
                    continue  # another writer's record of this step
                self._cache.put(self._moments_key(experiment_id, entry, m.step), m)
                return m
        raise errors.NotFoundError(f"run {entry.run!r} tag {entry.tag!r} has no readable step")

    def paired(
        self, experiment_id: str, entry: TagEntry, m: MomentsAt, stats: StatsSeries | None
    ) -> MomentsAt | None:
        """``m`` if its step's stats record was logged with it (`_same_source`), else the
        record of that step that was (another record of a step stored twice, from the Python
        loader's memory or the run's event files), else None: the step's records come from two
        writers and are never shown together (a whole-series read, which takes one record per
        step, the latest, checks each step so)."""
        if _same_source(stats, m):
            return m
        request = _StepRequest(None, experiment_id, entry, m.step, stats, None)
        reads: list[Callable[[_StepRequest], MomentsAt | None]] = []
        if self._mux is not None:
            reads.append(self._read_one)
        if self.files is not None:
            reads.append(self._read_file)
        for read in reads:
            try:
                got = read(request)
            except errors.NotFoundError:  # BadRecord too: no other readable record
                continue
            if got is not None and _same_source(stats, got):
                return got
        return None

    # ------------------------------------------------------------- one step of a series

    def _join(self, key, want: int) -> _Pending:
        with self._pending_lock:
            pend = self._pending.get(key)
            if pend is None:
                pend = self._pending[key] = _Pending()
            pend.wanted[want] = pend.wanted.get(want, 0) + 1
            return pend

    def _leave(self, key, pend: _Pending, want: int) -> None:
        with self._pending_lock:
            left = pend.wanted.get(want, 1) - 1
            if left > 0:
                pend.wanted[want] = left
            else:
                pend.wanted.pop(want, None)
                pend.results.pop(want, None)
                pend.absent.pop(want, None)
            if not pend.wanted and self._pending.get(key) is pend:
                del self._pending[key]

    def _read_step(self, request: _StepRequest) -> MomentsAt:
        """Step ``want`` (not the latest) through the data provider.

        Requests for steps of the same series wait for one read at a time; each read hands
        every registered step it holds to its request and caches the steps near ``want``, so
        concurrent requests for many steps cost one read, not one each.
        """
        if self._mux is not None:
            return self._read_one(request)
        ctx, experiment_id, entry, want = (
            request.ctx,
            request.experiment_id,
            request.entry,
            request.want,
        )
        group = ("series", experiment_id, entry.run, entry.tag, entry.signature)
        pend = self._join(group, want)
        try:
            with pend.lock:
                with self._pending_lock:
                    found = pend.results.pop(want, None)
                    absent = pend.absent.get(want)
                if found is None:
                    found = self._cache.get(self._moments_key(experiment_id, entry, want))
                if found is not None:
                    return found
                if absent is not None:
                    raise errors.NotFoundError(absent)
                found = self._read_targeted(request, pend)
                if found is not None:
                    return found
                stats = request.stats
                num_steps = int(stats.steps.size) if stats is not None else None
                with self.open_series(ctx, experiment_id, entry, num_steps) as (points, sampled):
                    found = self._hand_out(experiment_id, entry, points, want, pend, sampled)
                    steps = [p.step for p in points]
                if found is None:
                    raise errors.NotFoundError(_missing_step_message(entry, want, steps, sampled))
                return found
        finally:
            self._leave(group, pend, want)

    def _read_one(self, request: _StepRequest) -> MomentsAt:
        """Step ``want`` read straight from the Python loader's events: its record is found by
        step (`_step_index`) and only it is checked and decoded.

        Nothing is queued: the events are in the loader's memory, so concurrent requests for
        different steps of one series decode one event each, in parallel (requests for the
        same step share one load, `ByteLRU.get_or_load`).

        Raises:
          errors.NotFoundError: the step is not stored (the message gives the stored range).
          BadRecord: its tensor does not fit the tag's metadata.
        """
        entry, want = request.entry, request.want
        events = _tb_compat.tensor_events(self._mux, entry.run, entry.tag)
        if not events:
            raise errors.NotFoundError(f"run {entry.run!r} tag {entry.tag!r} has no data")
        index = self._step_index(entry, events)
        found = index.get(want)
        if found is None:
            raise errors.NotFoundError(_missing_step_message(entry, want, sorted(index), False))
        candidates = [events[i] for i in reversed(found)]  # latest first
        return self._matching(
            request,
            (_Raw(int(e.step), float(e.wall_time), e.tensor_proto) for e in candidates),
        )

    def _matching(self, request: _StepRequest, raws) -> MomentsAt:
        """The first of a step's records ``raws`` (latest first) that its stats record was
        logged with (`_same_source`; any, for formats 1 and 2), else the first."""
        first = None
        for raw in raws:
            m = self._moments(request.entry, raw)
            if _same_source(request.stats, m):
                return m
            first = first or m
        if first is None:
            raise errors.NotFoundError(
                f"run {request.entry.run!r} tag {request.entry.tag!r} has no step {request.want}"
            )
        return first  # refused by `moments_at` with the reason

    def _step_index(self, entry: TagEntry, events: list) -> dict[int, list[int]]:
        """``{step: indices in events}`` of the records of each step, latest last (a step
        stored more than once is warned about through `_latest_per_step`), kept while the
        series is unchanged."""
        last = events[-1]
        key = ("step-index", entry.run, entry.tag, len(events), int(last.step), last.wall_time)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        index: dict[int, list[int]] = {}
        for i, e in enumerate(events):
            index.setdefault(int(e.step), []).append(i)
        if len(index) != len(events):  # a step stored twice: warn once, as a full read does
            raws = [_Raw(int(e.step), float(e.wall_time)) for e in events]
            self._latest_per_step(entry.run, entry.tag, raws)
        self._cache.put(key, index, group=("step-index", entry.run, entry.tag))
        return index

    def _hand_out(self, experiment_id, entry, points, want, pend, whole: bool | None = None):
        """Gives each waiting request its step from ``points``; caches the steps near ``want``.

        Returns the step ``want`` (None if ``points`` lacks it). ``whole``: ``points`` is all
        the provider gives (True if that is a sample, False if every step): then a waiting
        step not in ``points`` is recorded as absent, and its request answers 404 without
        another read.
        """
        by_step = {p.step: p for p in points}
        with self._pending_lock:
            waiting = [s for s in pend.wanted if s != want and s not in pend.results]
        for s in waiting:
            p = by_step.get(s)
            try:
                m = p.get() if p is not None else None
            except BadRecord:
                m = None
            with self._pending_lock:
                if s not in pend.wanted:
                    continue
                if m is not None:
                    pend.results[s] = m
                elif whole is not None:
                    pend.absent[s] = _missing_step_message(entry, s, sorted(by_step), whole)
        p = by_step.get(want)
        if p is None:
            return None
        found = p.get()
        self._keep_near(experiment_id, entry, points, want)
        return found

    def _read_targeted(self, request: _StepRequest, pend: _Pending) -> MomentsAt | None:
        """Step ``want`` read with a sample of the series that holds it, or None.

        None (read the whole series instead) with the Python loader (its steps are taken
        undecoded from memory: the whole series costs nothing), for a series smaller than
        `TARGETED_READ_MIN_BYTES`, without stats at ``want``, when the smallest sample found
        is the whole series, or when the sample read does not hold ``want`` after all (the
        moments tag's steps differ from its stats tag's, e.g. a run cut off between its two
        records); the series is then not targeted again until it changes. Every step read is
        handed to its waiting request or cached (up to a quarter of the budget, nearest
        ``want`` first), so scrubbing on finds most neighbours in memory; a step missed later
        has a higher rank in the sampling order, so its sample includes all that was read
        before.
        """
        ctx, experiment_id, entry, want = (
            request.ctx,
            request.experiment_id,
            request.entry,
            request.want,
        )
        stats, stats_entry = request.stats, request.stats_entry
        if not self._grpc or stats is None or stats_entry is None:
            return None
        if stats.index_of(want) is None:
            return None
        n = int(stats.steps.size)
        per_step = self.bytes_per_step(entry)
        if per_step * n < TARGETED_READ_MIN_BYTES:
            return None
        failed = ("untargeted", experiment_id, entry.run, entry.tag, entry.signature)
        if self._cache.get(failed) is not None:
            return None
        with self._pending_lock:
            others = [s for s in pend.wanted if s != want and s not in pend.results]
        if len(others) >= _MAX_TARGETS:
            return None  # many steps wanted at once: one whole read serves them all
        # Samples are nested in k: the largest of the steps' smallest samples holds them all.
        k = max(
            self._sample_size(ctx, experiment_id, stats_entry, n, s)
            for s in [want, *others]
            if s == want or stats.index_of(s) is not None
        )
        if k >= n or k * per_step > GRPC_READ_BUDGET:
            return None
        with self.read_gate.reserve(self._read_bytes(entry, k) + self._hold_bytes(entry)):
            series = self._fetch(ctx, experiment_id, entry.run, [entry.tag], k).get(entry.tag)
            points = [self._point(entry, r) for r in series or [] if self._fits(entry, r)]
            found = self._hand_out(experiment_id, entry, points, want, pend)
        if found is None:
            self._cache.put(failed, True, group=("untargeted", experiment_id, entry.run, entry.tag))
            logger.info(
                "Grad Moments: run %r tag %r: its sample of %d steps has no step %d (its steps "
                "differ from its stats tag's); reading the whole series",
                entry.run,
                entry.tag,
                k,
                want,
            )
        return found

    def _hold_bytes(self, entry: TagEntry) -> int:
        """Decoded steps a read holds at once beyond its reply: a few handed out or cached
        (those are counted by their requests and the cache); one being decoded."""
        return 2 * self.bytes_per_step(entry)

    def _sample_size(self, ctx, experiment_id: str, stats_entry: TagEntry, n: int, want: int):
        """A small ``downsample`` whose sample of the stats tag (``n`` steps) holds ``want``.

        Bisection on ``k``, one read of the small stats tag per probe (cached: later steps
        reuse the probes near the top of the bisection). A sample of ``n`` points is the whole
        series, so the result always holds ``want`` (at worst it is ``n``). Both loaders'
        samples are nearly nested in ``k`` (RustBoard's are prefixes of one fixed permutation),
        so this lands within about ``n / _TARGET_TOLERANCE`` of the smallest such ``k``.
        """
        lo, hi = 0, n
        while hi - lo > max(1, n // _TARGET_TOLERANCE):
            mid = (lo + hi) // 2
            if want in self._sample_steps(ctx, experiment_id, stats_entry, mid):
                hi = mid
            else:
                lo = mid
        return hi

    def _sample_steps(self, ctx, experiment_id: str, stats_entry: TagEntry, k: int) -> frozenset:
        """The steps of the stats tag's sample with ``downsample=k``."""
        key = ("sample", experiment_id, stats_entry.run, stats_entry.tag, stats_entry.signature, k)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        with self.read_gate.reserve(self._read_bytes(stats_entry, k)):
            got = self._fetch(ctx, experiment_id, stats_entry.run, [stats_entry.tag], k)
            steps = frozenset(r.step for r in got.get(stats_entry.tag) or [])
        self._cache.put(
            key, steps, group=("sample", experiment_id, stats_entry.run, stats_entry.tag, k)
        )
        return steps

    # ------------------------------------------------------------------ whole series

    @contextlib.contextmanager
    def open_series(
        self,
        ctx,
        experiment_id: str,
        entry: TagEntry,
        num_steps: int | None,
        max_bytes: int | None = None,
    ):
        """``with reader.open_series(...) as (points, downsampled):`` the stored steps of a
        moments tag, ascending, and whether they are a sample.

        At most ``max_bytes`` of moments are read (None: no limit but the provider's); a gRPC
        data provider (RustBoard) is asked for at most `GRPC_READ_BUDGET` bytes. A bigger
        series (``num_steps`` stored steps, None if unknown) is read as TensorBoard's sample of
        it (``downsample``, always with the last step). Steps whose tensor does not fit the
        tag's metadata are left out (logged). Each point is decoded by `Point.get` (then not
        kept: use it and let it go). The read's memory is reserved on the read gate until the
        block ends.

        Raises:
          errors.NotFoundError: the series has no data.
        """
        downsample = ALL_STEPS
        cap = GRPC_READ_BUDGET if self._grpc else None
        if max_bytes is not None:
            cap = max_bytes if cap is None else min(cap, max_bytes)
        per_step = self.bytes_per_step(entry)
        if cap is not None and per_step * (num_steps if num_steps else ALL_STEPS) > cap:
            downsample = max(1, cap // per_step)
        expected = min(downsample, num_steps if num_steps else _ASSUMED_STEPS)
        reserve = self._read_bytes(entry, expected) + self._hold_bytes(entry)
        with self.read_gate.reserve(reserve):
            series = self._fetch(ctx, experiment_id, entry.run, [entry.tag], downsample).get(
                entry.tag
            )
            if not series:
                raise errors.NotFoundError(f"run {entry.run!r} tag {entry.tag!r} has no data")
            points = [self._point(entry, r) for r in series if self._fits(entry, r)]
            points.sort(key=lambda p: p.step)
            # Fewer points than asked for: that was the whole series.
            yield points, len(series) >= downsample

    def _keep_near(self, experiment_id, entry, points: list[Point], want: int) -> None:
        """Caches the steps nearest ``want`` (up to a quarter of the budget; not with the
        Python loader, from whose memory one step is read as cheaply)."""
        if self._mux is not None:
            return
        budget = self._cache.budget_bytes // 4
        size = self.bytes_per_step(entry) + 512
        used = 0
        for p in sorted(points, key=lambda p: abs(p.step - want)):
            if used + size > budget:
                break
            used += size
            try:
                m = p.get()
            except BadRecord:
                continue
            self._cache.put(self._moments_key(experiment_id, entry, m.step), m)

    def cache_series(self, experiment_id: str, entry: TagEntry, points: list[Point]) -> None:
        """Caches the latest steps of a full read, up to a quarter of the budget."""
        if points:
            self._keep_near(experiment_id, entry, points, points[-1].step)


def _stats_series(rows, content: metadata.StatsContent, held: tuple = ()) -> StatsSeries:
    """A `StatsSeries` of checked ``(step, wall_time, 1-D array)`` rows (any order), with the
    records held (`StatsSeries.held`)."""
    fields = tuple(content.fields)
    width = metadata.stats_length(content)
    count = len(rows)
    steps = np.fromiter((r[0] for r in rows), dtype=np.int64, count=count)
    walls = np.fromiter((r[1] for r in rows), dtype=np.float64, count=count)
    order = np.argsort(steps, kind="stable")
    # One table, columns contiguous: column i is field i of the content message (see
    # `stats.split_stats_tensor`, which does the same for one step), then the counts.
    if count:
        columns = np.ascontiguousarray(
            np.stack([rows[i][2] for i in order]).astype(np.float64, copy=False).T
        )
    else:
        columns = np.empty((width, 0), dtype=np.float64)
    return StatsSeries(
        steps=steps[order],
        wall_times=walls[order],
        sums={f: columns[i] for i, f in enumerate(fields)},
        hist_counts=columns[len(fields) :].T,
        held=held,
    )


def _same_source(stats: StatsSeries | None, m: MomentsAt) -> bool:
    """Whether moments ``m`` are those its step's stats record was logged with (format 3's
    ``moments_sum``; always for older formats, or without stats)."""
    if stats is None or "moments_sum" not in stats.sums:
        return True
    i = stats.index_of(m.step)
    if i is None:
        return True
    return metadata.same_moments(float(stats.sums["moments_sum"][i]), m.moments_sum)


def _mixed_message(entry: TagEntry, step: int, stats: StatsSeries | None) -> str:
    source = ""
    if stats is not None:
        i = stats.index_of(step)
        if i is not None:
            token = metadata.source_of({f: float(v[i]) for f, v in stats.sums.items()})
            source = "" if token is None else f" (writer source {token:012x})"
    return (
        f"run {entry.run!r} tag {entry.tag!r} step {step}: its statistics{source} were logged "
        "with other moments than the record read: two writers or processes wrote this run and "
        "their records of this step are mixed; the step is not shown (give each writer its "
        "own log directory, or log from one process)"
    )


def _missing_step_message(entry: TagEntry, want: int, steps: list[int], downsampled: bool) -> str:
    if not steps:
        return f"run {entry.run!r} tag {entry.tag!r} has no readable step"
    msg = (
        f"run {entry.run!r} tag {entry.tag!r} has no step {want}; it has {len(steps)} "
        f"readable steps from {steps[0]} to {steps[-1]}"
    )
    if downsampled:
        msg += (
            f" in a sample: all its steps together exceed the {GRPC_READ_BUDGET >> 20} MiB one "
            "read from the data server may carry; lower --samples_per_plugin=gradmom=N or use "
            "--load_fast=false"
        )
    return msg
