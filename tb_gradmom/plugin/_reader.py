"""Reads Grad Moments tags through TensorBoard's data provider, with caching.

Everything goes through ``list_tensors`` / ``read_tensors`` (plugin ``gradmom``), so the same
code serves the Python loader and RustBoard (``--load_fast=true``). Nothing here imports
TensorFlow.

What the data provider API allows shapes the read strategy:

* ``list_tensors`` gives each tag's content message and its last step, without tensor values.
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
  series). All steps read are cached, so scrubbing on is mostly served from memory. The size
  of the sample depends on the step's place in the sampling order: half the series on
  average, the whole series for the last places.
* An all-steps histogram reads at most `HISTOGRAM_READ_BYTES` of a series: a bigger series is
  binned on a sample of its steps (``downsample``), and the payload lists them.
* RustBoard replies over gRPC, whose messages TensorBoard caps at 256 MiB: a series bigger
  than `GRPC_READ_BUDGET` is read downsampled, and a step the sample misses answers 404 with
  the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading

import numpy as np
from tensorboard import errors
from tensorboard.data import provider

from tb_gradmom import metadata
from tb_gradmom.plugin._cache import ByteLRU

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
# the whole series (see `Reader._read_targeted`).
TARGETED_READ_MIN_BYTES = 32 * 1024 * 1024
# The bisection for a targeted sample stops when its bracket is 1/32 of the steps.
_TARGET_TOLERANCE = 32


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


@dataclasses.dataclass
class RunIndex:
    """The Grad Moments tags of one run: moments tags, and stats tags by name."""

    moments: dict[str, TagEntry] = dataclasses.field(default_factory=dict)
    stats: dict[str, TagEntry] = dataclasses.field(default_factory=dict)

    def stats_for(self, tag: str) -> TagEntry | None:
        """The stats tag belonging to moments tag ``tag`` (or ``_model``), if logged."""
        return self.stats.get(metadata.stats_tag(tag))


@dataclasses.dataclass(frozen=True)
class StatsSeries:
    """The stats tensors of one tag over its steps.

    Attributes:
      steps: int64 ``[T]``, ascending.
      wall_times: float64 ``[T]``.
      sums: field -> float64 ``[T]`` for each field of `metadata.STATS_FIELDS` the tag has.
      hist_counts: float64 ``[T, buckets]``, the variance histogram counts.
    """

    steps: np.ndarray
    wall_times: np.ndarray
    sums: dict[str, np.ndarray]
    hist_counts: np.ndarray

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


class Reader:
    """Grad Moments data for one TensorBoard instance, read through its data provider."""

    def __init__(self, data_provider, cache: ByteLRU):
        self._provider = data_provider
        self._cache = cache
        self._grpc = type(data_provider).__name__ != "MultiplexerDataProvider"
        self._warned: set[tuple[str, str]] = set()
        self._warn_lock = threading.Lock()

    # ----------------------------------------------------------------------- listing

    def index(self, ctx, experiment_id: str, run: str | None = None, tags=None):
        """``{run: RunIndex}`` of every readable Grad Moments tag (optionally of one run/tags).

        Tags whose content message cannot be parsed (a newer format, a corrupt header) are
        left out and logged once each.
        """
        rtf = None
        if run is not None:
            rtf = provider.RunTagFilter(runs=[run], tags=None if tags is None else list(tags))
        listing = self._provider.list_tensors(
            ctx, experiment_id=experiment_id, plugin_name=PLUGIN, run_tag_filter=rtf
        )
        result: dict[str, RunIndex] = {}
        for run_name, tags in listing.items():
            ri = result.setdefault(run_name, RunIndex())
            for tag_name, ts in tags.items():
                content = self._parse(run_name, tag_name, ts.plugin_content)
                if content is None:
                    continue
                entry = TagEntry(
                    run=run_name,
                    tag=tag_name,
                    content=content,
                    max_step=int(ts.max_step) if ts.max_step is not None else -1,
                    max_wall_time=float(ts.max_wall_time or 0.0),
                    description=ts.description or "",
                )
                if isinstance(content, metadata.StatsContent):
                    ri.stats[tag_name] = entry
                else:
                    ri.moments[tag_name] = entry
        return result

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

    def _parse(self, run: str, tag: str, content: bytes):
        key = ("content", bytes(content))
        parsed = self._cache.get(key)
        if parsed is not None:
            return parsed
        try:
            parsed = metadata.parse_plugin_content(content)
        except metadata.FormatError as e:
            with self._warn_lock:
                if (run, tag) not in self._warned:
                    self._warned.add((run, tag))
                    logger.warning("Grad Moments: skipping run %r tag %r: %s", run, tag, e)
            return None
        self._cache.put(key, parsed, size=len(content) + 512)
        return parsed

    # ------------------------------------------------------------------------- stats

    def stats_series(
        self, ctx, experiment_id: str, entries: list[TagEntry]
    ) -> dict[str, StatsSeries]:
        """``{tag: StatsSeries}`` for stats tags of one run (one read for all cache misses).

        A stats tag whose tensors cannot be read (wrong length) is left out and logged.
        """
        out: dict[str, StatsSeries] = {}
        missing: list[TagEntry] = []
        for e in entries:
            s = self._cache.get(("stats", experiment_id, e.run, e.tag, e.signature))
            if s is None:
                missing.append(e)
            else:
                out[e.tag] = s
        if not missing:
            return out
        run = missing[0].run
        data = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=PLUGIN,
            downsample=ALL_STEPS,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[e.tag for e in missing]),
        ).get(run, {})
        for e in missing:
            series = data.get(e.tag)
            if series is None:
                continue
            try:
                s = _stats_series(series, e.content)
            except ValueError as err:
                logger.warning("Grad Moments: unreadable stats run %r tag %r: %s", run, e.tag, err)
                continue
            self._cache.put(("stats", experiment_id, e.run, e.tag, e.signature), s)
            out[e.tag] = s
        return out

    def stats_for(self, ctx, experiment_id: str, entry: TagEntry | None) -> StatsSeries | None:
        if entry is None:
            return None
        return self.stats_series(ctx, experiment_id, [entry]).get(entry.tag)

    # ----------------------------------------------------------------------- moments

    def _decode(self, entry: TagEntry, datum) -> MomentsAt:
        c = entry.content
        arr = np.asarray(datum.numpy)
        expected = (len(c.orders), *c.stored_shape)
        if arr.shape != expected or arr.dtype.kind != "f":
            raise errors.NotFoundError(
                f"run {entry.run!r} tag {entry.tag!r} step {datum.step}: the stored tensor has "
                f"shape {list(arr.shape)} and dtype {arr.dtype}, but its metadata says "
                f"float [{', '.join(map(str, expected))}]; the event file is corrupt or was "
                "written by another tool"
            )
        arrays = {int(p): arr[i] for i, p in enumerate(c.orders)}
        return MomentsAt(step=int(datum.step), wall_time=float(datum.wall_time), arrays=arrays)

    def _moments_key(self, experiment_id, entry, step):
        return ("moments", experiment_id, entry.run, entry.tag, int(step))

    def bytes_per_step(self, entry: TagEntry) -> int:
        c = entry.content
        return 4 * len(c.orders) * max(1, math.prod(c.stored_shape))

    def moments_at(
        self,
        ctx,
        experiment_id: str,
        entry: TagEntry,
        step: int | None,
        stats: StatsSeries | None = None,
        stats_entry: TagEntry | None = None,
    ) -> MomentsAt:
        """The moments of ``entry`` at ``step`` (None: the last step).

        ``stats`` / ``stats_entry``: the tag's stats series and stats tag, if it has one (their
        steps locate ``step`` in a targeted sample; see the module docstring).

        Raises:
          errors.NotFoundError: the step is not stored (the message gives the stored range).
        """
        want = entry.max_step if step is None else int(step)
        key = self._moments_key(experiment_id, entry, want)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if step is None or want == entry.max_step:
            return self._cache.get_or_load(key, lambda: self._read_last(ctx, experiment_id, entry))
        num_steps = int(stats.steps.size) if stats is not None else None

        def load():
            found = self._read_targeted(ctx, experiment_id, entry, want, stats, stats_entry)
            if found is not None:
                return found
            series, downsampled = self.read_series(ctx, experiment_id, entry, num_steps)
            steps = [d.step for d in series]
            if want not in steps:
                raise errors.NotFoundError(_missing_step_message(entry, want, steps, downsampled))
            return self._keep_near(experiment_id, entry, series, want)

        return self._cache.get_or_load(key, load)

    def _read_targeted(
        self,
        ctx,
        experiment_id: str,
        entry: TagEntry,
        want: int,
        stats: StatsSeries | None,
        stats_entry: TagEntry | None,
    ) -> MomentsAt | None:
        """Step ``want`` read with a sample of the series that holds it, or None.

        None (read the whole series instead) with the Python loader (its reads copy from
        memory: the whole series costs about as much as the probes), for a series smaller than
        `TARGETED_READ_MIN_BYTES`, without stats at ``want``, when the smallest sample found
        is the whole series, or when the sample read does not hold ``want`` after all (the
        moments tag's steps differ from its stats tag's, e.g. a run cut off between its two
        records); the series is then not targeted again until it changes. Every step read is
        cached (up to a quarter of the budget, nearest ``want`` first), so scrubbing on finds
        most neighbours in memory; a step missed later has a higher rank in the sampling
        order, so its sample includes all that was read before.
        """
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
        k = self._sample_size(ctx, experiment_id, stats_entry, n, want)
        if k >= n or k * per_step > GRPC_READ_BUDGET:
            return None
        data = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=PLUGIN,
            downsample=k,
            run_tag_filter=provider.RunTagFilter(runs=[entry.run], tags=[entry.tag]),
        )
        series = self._decode_all(entry, data.get(entry.run, {}).get(entry.tag) or [])
        if not any(m.step == want for m in series):
            self._cache.put(failed, True, size=256)
            logger.info(
                "Grad Moments: run %r tag %r: its sample of %d steps has no step %d (its steps "
                "differ from its stats tag's); reading the whole series",
                entry.run,
                entry.tag,
                k,
                want,
            )
            return None
        return self._keep_near(experiment_id, entry, series, want)

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
        data = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=PLUGIN,
            downsample=k,
            run_tag_filter=provider.RunTagFilter(runs=[stats_entry.run], tags=[stats_entry.tag]),
        )
        steps = frozenset(
            int(d.step) for d in data.get(stats_entry.run, {}).get(stats_entry.tag) or []
        )
        self._cache.put(key, steps, size=256 + 64 * len(steps))
        return steps

    def _read_last(self, ctx, experiment_id: str, entry: TagEntry) -> MomentsAt:
        data = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=PLUGIN,
            downsample=1,
            run_tag_filter=provider.RunTagFilter(runs=[entry.run], tags=[entry.tag]),
        )
        series = data.get(entry.run, {}).get(entry.tag) or []
        if not series:
            raise errors.NotFoundError(f"run {entry.run!r} tag {entry.tag!r} has no data")
        return self._decode(entry, series[-1])

    def read_series(
        self,
        ctx,
        experiment_id: str,
        entry: TagEntry,
        num_steps: int | None,
        max_bytes: int | None = None,
    ) -> tuple[list[MomentsAt], bool]:
        """Every stored step of a moments tag, ascending, and whether it had to be downsampled.

        At most ``max_bytes`` of moments are read (None: no limit but the provider's); a gRPC
        data provider (RustBoard) is asked for at most `GRPC_READ_BUDGET` bytes. A bigger
        series (``num_steps`` stored steps, None if unknown) is read as TensorBoard's sample of
        it (``downsample``, always with the last step). Steps whose tensor does not match the
        tag's metadata are skipped (and logged).
        """
        downsample = ALL_STEPS
        cap = GRPC_READ_BUDGET if self._grpc else None
        if max_bytes is not None:
            cap = max_bytes if cap is None else min(cap, max_bytes)
        if cap is not None:
            per_step = self.bytes_per_step(entry)
            expected = num_steps if num_steps else ALL_STEPS
            if per_step * expected > cap:
                downsample = max(1, cap // per_step)
        data = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=PLUGIN,
            downsample=downsample,
            run_tag_filter=provider.RunTagFilter(runs=[entry.run], tags=[entry.tag]),
        )
        series = data.get(entry.run, {}).get(entry.tag)
        if not series:
            raise errors.NotFoundError(f"run {entry.run!r} tag {entry.tag!r} has no data")
        # Fewer points than asked for: that was the whole series.
        return self._decode_all(entry, series), len(series) >= downsample

    def _decode_all(self, entry: TagEntry, series) -> list[MomentsAt]:
        """Decoded data points, ascending by step; unreadable ones are skipped and logged."""
        out = []
        for d in series:
            try:
                out.append(self._decode(entry, d))
            except errors.NotFoundError as e:
                logger.warning("Grad Moments: %s", e)
        out.sort(key=lambda m: m.step)
        return out

    def _keep_near(self, experiment_id, entry, series: list[MomentsAt], want: int) -> MomentsAt:
        """Caches the steps nearest ``want`` (up to a quarter of the budget); returns ``want``."""
        found = None
        budget = self._cache.budget_bytes // 4
        used = 0
        for m in sorted(series, key=lambda m: abs(m.step - want)):
            if m.step == want:
                found = m
                continue
            size = self.bytes_per_step(entry)
            if used + size > budget:
                break
            used += size
            self._cache.put(self._moments_key(experiment_id, entry, m.step), m, size=size + 256)
        assert found is not None
        return found

    def cache_series(self, experiment_id: str, entry: TagEntry, series: list[MomentsAt]) -> None:
        """Caches the latest steps of a full read, up to a quarter of the budget."""
        if series:
            self._keep_near(experiment_id, entry, series, series[-1].step)
            last = series[-1]
            key = self._moments_key(experiment_id, entry, last.step)
            self._cache.put(key, last, size=self.bytes_per_step(entry) + 256)


def _stats_series(series, content: metadata.StatsContent) -> StatsSeries:
    fields = tuple(content.fields)
    count = len(series)
    steps = np.fromiter((d.step for d in series), dtype=np.int64, count=count)
    walls = np.fromiter((d.wall_time for d in series), dtype=np.float64, count=count)
    rows = [np.asarray(d.numpy).ravel() for d in series]
    for d, r in zip(series, rows):
        if r.size < len(fields):
            raise ValueError(
                f"step {d.step}: a stats tensor needs at least {len(fields)} values, got {r.size}"
            )
    width = max((r.size for r in rows), default=len(fields))
    if all(r.size == width for r in rows) and count:
        table = np.stack(rows).astype(np.float64, copy=False)
    else:  # tensors of different lengths (not what the writer does): pad with NaN
        table = np.full((count, width), np.nan)
        for i, r in enumerate(rows):
            table[i, : r.size] = r
    order = np.argsort(steps, kind="stable")
    table = table[order]
    # Column i of the table is field i of the tag's content message (see
    # `stats.split_stats_tensor`, which does the same for one step).
    sums = {f: table[:, i].copy() for i, f in enumerate(fields)}
    return StatsSeries(
        steps=steps[order],
        wall_times=walls[order],
        sums=sums,
        hist_counts=table[:, len(fields) :],
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
