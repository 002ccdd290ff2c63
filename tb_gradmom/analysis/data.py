"""Reads Grad Moments data from TensorBoard event files, without TensorFlow.

    from tb_gradmom.analysis import data
    runs = data.load("runs/demo")          # {run: {tag: [Record, ...]}}
    rec = runs["."]["dense/kernel"][-1]    # the latest step of one variable
    rec.moments[2]                         # M_2, float32 [*stored_shape]

Event files are TFRecord files: each record is ``uint64 length``, ``uint32 masked
crc32c(length)``, ``length`` bytes of a serialized ``Event`` proto and ``uint32 masked
crc32c(data)`` (little endian). Both checksums are verified (crc32c in numpy + Python, see
`crc32c`). A truncated last record (a writer still writing, or a crash) is skipped with a
`DataWarning`; a record whose data checksum fails is skipped with a warning; a corrupt length
stops reading that file with a warning.

A *run* is a directory holding ``*tfevents*`` files; its name is the path relative to the
logdir, the logdir itself being ``"."`` (as in TensorBoard). Only tags whose metadata (on the
first event of the tag) names the plugin ``gradmom`` are read.

Nothing read is trusted: a content message is parsed and bounded by
`metadata.parse_plugin_content` (a bad one skips its tag), a tensor's declared shape is checked
before it is decoded and its array against the content (`metadata.check_tensor`; a bad one
skips its step), and a step whose moments have no stats record (a run cut off, or still being
written, between the two records of a step) is skipped like the TensorBoard tab does. Each
skip is a `DataWarning` naming the run, the tag and the step; it never affects another tag or
run.
"""

from __future__ import annotations

import functools
import math
import os
import stat as stat_module
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from tb_gradmom import metadata
from tb_gradmom.analysis import stats

__all__ = [
    "Record",
    "DataWarning",
    "load",
    "list_runs",
    "read_records",
    "crc32c",
    "masked_crc32c",
    "short_name",
]

# A run or tag name longer than this is shortened in messages (`short_name`).
SHORT_NAME_CHARS = 160


class DataWarning(UserWarning):
    """A record or tag was skipped (truncated, corrupt or unreadable); the rest was read."""


@dataclass
class Record:
    """One logged step of one tag.

    Attributes:
      step: the global step.
      wall_time: seconds since the epoch when the event was written.
      batch_size: ``n`` from the stats tag at this step, or None without stats.
      moments: order -> float32 array ``[*stored_shape]`` of ``M_order`` (empty for stats-only
        tags such as ``_model``).
      pooled: whether the arrays are block means over the 2-D view of the variable.
      shape: the variable's shape (``()`` for stats-only tags).
      stats: field -> value of `metadata.STATS_FIELDS` at this step, or None.
      hist: the counts of the per-element unbiased variance over `metadata.HIST_EDGES`, or
        None.
      content: the tag's parsed content message (`metadata.MomentsContent`, or
        `metadata.StatsContent` for stats-only tags).
    """

    step: int
    wall_time: float
    batch_size: int | None
    moments: dict[int, np.ndarray]
    pooled: bool
    shape: tuple[int, ...]
    stats: dict[str, float] | None = None
    hist: np.ndarray | None = None
    content: metadata.MomentsContent | metadata.StatsContent | None = field(
        default=None, repr=False
    )


# ----------------------------------------------------------------------------- crc32c

_POLY = 0x82F63B78  # Castagnoli, reflected


def _make_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        table[i] = c
    return table


_TABLE = _make_table()
_TABLE_LIST = [int(x) for x in _TABLE]


def _update_python(reg: int, data: bytes) -> int:
    table = _TABLE_LIST
    for b in data:
        reg = table[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


@functools.lru_cache(maxsize=16)
def _zero_shift_tables(length: int) -> np.ndarray:
    # The register after feeding `length` zero bytes is a linear map of the register; tabulate
    # it per input byte: shift(x) = T[0][x & 255] ^ T[1][(x >> 8) & 255] ^ ...
    x = (
        np.arange(256, dtype=np.uint32)[None, :] << (8 * np.arange(4, dtype=np.uint32))[:, None]
    ).astype(np.uint32)
    x = x.ravel()
    for _ in range(length):
        x = _TABLE[x & 0xFF] ^ (x >> 8)
    return x.reshape(4, 256)


def _update_numpy(reg: int, data: bytes) -> int:
    # Chunks of `chunk` bytes are run in parallel from a zero register (the CRC register is
    # linear), then combined in order: reg = shift_chunk(reg) ^ reg0(chunk_k).
    n = len(data)
    chunk = 1 << max(8, (int(math.isqrt(n)).bit_length()))
    k = n // chunk
    buf = np.frombuffer(data, dtype=np.uint8, count=k * chunk)
    cols = np.ascontiguousarray(buf.reshape(k, chunk).T).astype(np.uint32)
    regs = np.zeros(k, dtype=np.uint32)
    table = _TABLE
    for i in range(chunk):
        regs = table[(regs ^ cols[i]) & 0xFF] ^ (regs >> 8)
    shift = [[int(v) for v in row] for row in _zero_shift_tables(chunk)]
    s0, s1, s2, s3 = shift
    for r in regs.tolist():
        reg = s0[reg & 0xFF] ^ s1[(reg >> 8) & 0xFF] ^ s2[(reg >> 16) & 0xFF] ^ s3[reg >> 24] ^ r
    return _update_python(reg, data[k * chunk :])


def crc32c(data: bytes) -> int:
    """The CRC-32C (Castagnoli) checksum of ``data``, as used by TFRecord.

    Pure Python for short data; longer data runs chunks in parallel with numpy and combines
    them, so multi-megabyte tensors take milliseconds.

    Args:
      data: the bytes.

    Returns:
      The checksum, an int in ``[0, 2**32)``; ``crc32c(b"123456789") == 0xE3069283``.
    """
    data = bytes(data)
    if len(data) < 4096:
        reg = _update_python(0xFFFFFFFF, data)
    else:
        reg = _update_numpy(0xFFFFFFFF, data)
    return reg ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C of TFRecord: ``((crc >> 15) | (crc << 17)) + 0xA282EAD8`` mod 2**32."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ----------------------------------------------------------------------------- records


def read_records(path: str | os.PathLike) -> Iterator[bytes]:
    """The data of every TFRecord in one file, checksums verified.

    Args:
      path: an event file.

    Yields:
      The bytes of each record, in file order. Truncated, corrupt or mismatching records are
      skipped with a `DataWarning` naming the file and the byte offset; a record that claims
      more bytes than the file has left is a truncated one (nothing bigger than the file is
      ever allocated). A file that cannot be opened or is not a regular file is skipped with a
      warning.
    """
    path = os.fspath(path)
    try:
        # Not opened unless it is a regular file: opening a FIFO would wait for a writer.
        if not stat_module.S_ISREG(os.stat(path).st_mode):
            warnings.warn(f"{path}: not a regular file; skipped", DataWarning, stacklevel=2)
            return
        f = open(path, "rb")
    except OSError as e:
        warnings.warn(f"{path}: cannot be read ({e}); skipped", DataWarning, stacklevel=2)
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                warnings.warn(
                    f"{path}: truncated record header at byte {offset} skipped "
                    "(the writer may still be writing)",
                    DataWarning,
                    stacklevel=2,
                )
                return
            (length,) = struct.unpack("<Q", header[:8])
            (length_crc,) = struct.unpack("<I", header[8:12])
            if masked_crc32c(header[:8]) != length_crc:
                warnings.warn(
                    f"{path}: corrupt record length at byte {offset}; the rest of the file "
                    "is skipped",
                    DataWarning,
                    stacklevel=2,
                )
                return
            if length + 4 > size - offset - 12:
                size = os.fstat(f.fileno()).st_size  # a writer may have appended since
            # Never read (allocate) more than the file holds, whatever the length claims.
            body = f.read(min(length + 4, max(0, size - offset - 12)))
            if len(body) < length + 4:
                warnings.warn(
                    f"{path}: truncated last record at byte {offset} skipped "
                    f"({len(body)} of {length + 4} bytes; the writer may still be writing)",
                    DataWarning,
                    stacklevel=2,
                )
                return
            data = body[:length]
            (data_crc,) = struct.unpack("<I", body[length:])
            offset += 12 + length + 4
            if masked_crc32c(data) != data_crc:
                warnings.warn(
                    f"{path}: record at byte {offset - length - 16} fails its checksum; skipped",
                    DataWarning,
                    stacklevel=2,
                )
                continue
            yield data


def _is_event_file(name: str) -> bool:
    return "tfevents" in name


def list_runs(logdir: str | os.PathLike) -> dict[str, list[str]]:
    """The runs under a logdir and their event files.

    Args:
      logdir: a directory.

    Returns:
      run name -> sorted event file paths; ``"."`` is the logdir itself; runs sorted by name.

    Raises:
      FileNotFoundError: if ``logdir`` does not exist or is not a directory.
    """
    logdir = os.fspath(logdir)
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"logdir {logdir!r} does not exist or is not a directory")
    runs = {}
    for dirpath, dirnames, filenames in os.walk(logdir):
        dirnames.sort()
        files = sorted(f for f in filenames if _is_event_file(f))
        if files:
            run = os.path.relpath(dirpath, logdir).replace(os.sep, "/")
            runs[run] = [os.path.join(dirpath, f) for f in files]
    return dict(sorted(runs.items()))


# ----------------------------------------------------------------------------- events


@dataclass
class _Tag:
    content: metadata.MomentsContent | metadata.StatsContent | None
    # step -> (wall_time, ndarray); a later event at the same step replaces an earlier one.
    events: dict[int, tuple[float, np.ndarray]] = field(default_factory=dict)
    # The steps stored more than once (the later record kept).
    repeated: set[int] = field(default_factory=set)


def short_name(name: str, limit: int = SHORT_NAME_CHARS) -> str:
    """``repr(name)`` for messages; a name longer than ``limit`` characters shows its start and
    its end around how long it is, so that a warning about it stays readable and still says
    which tag it is: ``'xxxxxxxx'...(5,009 characters)...'x/d/kernel'``.
    """
    if len(name) <= limit:
        return repr(name)
    head, tail = name[: 2 * limit // 3], name[-(limit // 3) :]
    return f"{head!r}...({len(name):,} characters)...{tail!r}"


def _warn(run: str, tag: str, step: int, message: str) -> None:
    warnings.warn(
        f"run {short_name(run)} tag {short_name(tag)} step {step}: {message}",
        DataWarning,
        stacklevel=4,
    )


def _decode(content: metadata.MomentsContent | metadata.StatsContent, value: Any) -> np.ndarray:
    """The checked array of one summary value (`metadata.FormatError` if it does not fit)."""
    metadata.check_tensor_proto(content, value.tensor)
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception as e:  # noqa: BLE001 - whatever a corrupt proto raises
        raise metadata.FormatError(f"unreadable tensor ({type(e).__name__}: {e})") from None
    metadata.check_tensor(content, array)
    return array


def _read_run(run: str, files: list[str], errors: list[str]) -> dict[str, _Tag]:
    tags: dict[str, _Tag] = {}
    for path in files:
        for data in read_records(path):
            try:
                event = event_pb2.Event.FromString(data)
            except Exception as e:  # noqa: BLE001 - a record that is not an Event proto
                warnings.warn(f"{path}: a record is not an Event: {e}", DataWarning, stacklevel=2)
                continue
            if not event.HasField("summary"):
                continue
            step = int(event.step)
            for value in event.summary.value:
                tag = tags.get(value.tag)
                if tag is None:
                    # TensorBoard keeps the metadata of a tag's first event only.
                    content = None
                    plugin = value.metadata.plugin_data
                    if plugin.plugin_name == metadata.PLUGIN_NAME:
                        try:
                            content = metadata.parse_plugin_content(plugin.content)
                        except metadata.FormatError as e:
                            errors.append(f"run {short_name(run)} tag {short_name(value.tag)}: {e}")
                            _warn(run, value.tag, step, f"{e}; the tag is skipped ({path})")
                    tag = tags[value.tag] = _Tag(content)
                if tag.content is None or not value.HasField("tensor"):
                    continue
                try:
                    array = _decode(tag.content, value)
                except metadata.FormatError as e:
                    _warn(run, value.tag, step, f"{e}; the step is skipped")
                    continue
                if step in tag.events:
                    tag.repeated.add(step)
                tag.events[step] = (float(event.wall_time), array)
    for name, t in tags.items():
        if t.repeated:
            steps = sorted(t.repeated)
            shown = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
            _warn(
                run,
                name,
                steps[0],
                f"{len(steps)} steps are stored more than once ({shown}): two training processes "
                "or writers on one run, or a run restarted from a checkpoint; the latest record "
                "of each step is kept (as the TensorBoard tab and RustBoard do)",
            )
    return {name: t for name, t in tags.items() if t.content is not None}


def _batch_size(sums: dict[str, float] | None) -> int | None:
    if sums is None:
        return None
    n = sums.get("batch_size", float("nan"))
    return int(round(n)) if math.isfinite(n) and n >= 1 else None


def _records_of_run(tags: dict[str, _Tag], run: str) -> dict[str, list[Record]]:
    # name -> (tag, its content), by kind
    moments_tags: dict[str, tuple[_Tag, metadata.MomentsContent]] = {}
    stats_by_base: dict[str, tuple[_Tag, metadata.StatsContent]] = {}
    for name, t in tags.items():
        if isinstance(t.content, metadata.MomentsContent):
            moments_tags[name] = (t, t.content)
        elif isinstance(t.content, metadata.StatsContent):
            base = (
                name[: -len(metadata.STATS_SUFFIX)]
                if name.endswith(metadata.STATS_SUFFIX)
                else name
            )
            stats_by_base[base] = (t, t.content)
    out: dict[str, list[Record]] = {}
    for name, (t, content) in sorted(moments_tags.items(), key=lambda item: item[0]):
        stats_entry = stats_by_base.get(name)
        records = []
        for step in sorted(t.events):
            wall_time, array = t.events[step]
            sums = counts = None
            if stats_entry is not None:
                st, st_content = stats_entry
                if step not in st.events:
                    # A torn step: the run was cut (or is still being written) between the two
                    # records of this step. Like the plugin, show complete steps only.
                    _warn(
                        run,
                        name,
                        step,
                        f"has its moments but no {metadata.STATS_SUFFIX!r} record (a run cut "
                        "off or still being written); the step is skipped",
                    )
                    continue
                sums, counts = stats.split_stats_tensor(st.events[step][1], st_content.fields)
            records.append(
                Record(
                    step=step,
                    wall_time=wall_time,
                    batch_size=_batch_size(sums),
                    moments={int(p): array[i] for i, p in enumerate(content.orders)},
                    pooled=content.pooled,
                    shape=tuple(content.shape),
                    stats=sums,
                    hist=counts,
                    content=content,
                )
            )
        out[name] = records
    for base, (st, st_content) in sorted(stats_by_base.items(), key=lambda item: item[0]):
        if base in moments_tags:
            continue
        records = []
        for step in sorted(st.events):
            wall_time, array = st.events[step]
            sums, counts = stats.split_stats_tensor(array, st_content.fields)
            records.append(
                Record(
                    step=step,
                    wall_time=wall_time,
                    batch_size=_batch_size(sums),
                    moments={},
                    pooled=False,
                    shape=(),
                    stats=sums,
                    hist=counts,
                    content=st_content,
                )
            )
        out[base] = records
    return {name: out[name] for name in sorted(out) if out[name]}


def load(logdir: str | os.PathLike, run: str | None = None) -> dict[str, dict[str, list[Record]]]:
    """Loads every Grad Moments tag under a logdir.

    Each variable tag's records carry the stats of the same step from its ``<tag>/_stats``
    tag (``batch_size``, ``stats``, ``hist``). Stats tags without a moments tag (``_model``
    for the whole model, or variables logged without moments) appear under their base name
    (``"_model"``) with empty ``moments``. Records are sorted by step; when a step was written
    twice (a restarted run), the later event wins.

    Args:
      logdir: the directory given to TensorBoard's ``--logdir``.
      run: read only this run (a name as returned by `list_runs`, e.g. ``"."`` or
        ``"train"``); default all runs.

    Returns:
      ``{run: {tag: [Record, ...]}}``, runs and tags sorted by name; runs without Grad
      Moments data are left out.

    Raises:
      FileNotFoundError: if ``logdir`` does not exist.
      ValueError: if there is no event file, no such run, or no Grad Moments data (the
        message says which and how to log some).
    """
    runs = list_runs(logdir)
    if not runs:
        raise ValueError(
            f"no TensorBoard event files (*tfevents*) under logdir {os.fspath(logdir)!r}"
        )
    if run is not None:
        if run not in runs:
            raise ValueError(
                f"no run {run!r} under logdir {os.fspath(logdir)!r}; runs: "
                + ", ".join(repr(r) for r in runs)
            )
        runs = {run: runs[run]}
    errors: list[str] = []
    out = {}
    for name, files in runs.items():
        records = _records_of_run(_read_run(name, files, errors), name)
        if records:
            out[name] = records
    if not out:
        detail = f" ({errors[0]})" if errors else ""
        where = f"run {run!r} of logdir" if run is not None else "logdir"
        raise ValueError(
            f"no Grad Moments data in {where} {os.fspath(logdir)!r}{detail}; log some with "
            "tb_gradmom.writers.summary or the Keras callback"
        )
    return out
