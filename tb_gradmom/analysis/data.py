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
logdir, the logdir itself being ``"."`` (as in TensorBoard). Symbolic links to directories are
followed, as TensorBoard does (a link back to a directory above it is not, with a warning). Only
tags whose metadata (on the first event of the tag) names the plugin ``gradmom`` are read.

**Reading what is asked.** `load` reads only the runs and tags selected (``runs=``, ``tags=``,
and each selected tag's ``/_stats``): the files of other runs are not opened, and a record of
a tag not selected is skipped after its first bytes (the tag is at the start of a serialized
``Event``), without reading, checking or decoding the rest; only the first record of each tag
is read whole (to know whether it is a Grad Moments tag). ``progress=`` reports a long read
(`PROGRESS_MIN_BYTES` of event files or more) as it goes.

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
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from tb_gradmom import metadata
from tb_gradmom.analysis import stats

__all__ = [
    "Record",
    "DataWarning",
    "SelectionError",
    "load",
    "load_examples",
    "ExamplesRecord",
    "list_runs",
    "read_records",
    "crc32c",
    "masked_crc32c",
    "short_name",
    "Writers",
    "writers_of",
]

# A run or tag name longer than this is shortened in messages (`short_name`).
SHORT_NAME_CHARS = 160


class DataWarning(UserWarning):
    """A record or tag was skipped (truncated, corrupt or unreadable); the rest was read."""


class SelectionError(ValueError):
    """``load(..., tags=...)`` matched no Grad Moments tag (``what`` is ``"tags"``) or
    ``steps=`` no stored step (``"steps"``); ``available`` has the tags' names or the steps."""

    def __init__(self, message: str, what: str, available: list):
        super().__init__(message)
        self.what = what
        self.available = available


# Event files at least this big (all selected runs together) make `load` report its progress.
PROGRESS_MIN_BYTES = 64 * 1024 * 1024
# The first bytes of a record read to find its step and tags; if they do not tell, up to
# _PEEK_BYTES (a Grad Moments tag is at most 4,096 characters).
_PEEK_FIRST = 256
_PEEK_BYTES = 8192


@dataclass
class Record:
    """One logged step of one tag.

    Attributes:
      step: the global step.
      wall_time: seconds since the epoch when the event was written.
      batch_size: ``n`` from the stats tag at this step, or None without stats.
      moments: order -> float32 array ``[*stored_shape]`` of ``M_order`` (empty for stats-only
        tags such as ``_model``), decoded from the tag's encoding (`metadata.decode_moments`).
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
    yield from _read_records(path)


def _read_records(
    path: str | os.PathLike,
    keep: Callable[[bytes, bool], bool | None] | None = None,
    on_read: Callable[[int], None] | None = None,
    quiet: bool = False,
) -> Iterator[bytes]:
    """`read_records`, reading only the records ``keep(first_bytes, whole)`` wants.

    ``keep`` gets the first bytes of a record's data (``whole``: that is all of it) and says
    whether to read the rest, or None if it cannot tell yet (then it gets up to `_PEEK_BYTES`,
    and None again means yes); a record it declines is skipped unread (its checksum is not
    checked). ``on_read(n)`` is told the bytes of the file each record took, read or not.
    ``quiet``: no warnings (a first pass over the files; the read that follows warns).
    """
    path = os.fspath(path)

    def warn(message: str) -> None:
        if not quiet:
            warnings.warn(message, DataWarning, stacklevel=3)

    try:
        # Not opened unless it is a regular file: opening a FIFO would wait for a writer.
        if not stat_module.S_ISREG(os.stat(path).st_mode):
            warn(f"{path}: not a regular file; skipped")
            return
        f = open(path, "rb")
    except OSError as e:
        warn(f"{path}: cannot be read ({e}); skipped")
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                warn(
                    f"{path}: truncated record header at byte {offset} skipped "
                    "(the writer may still be writing)"
                )
                return
            (length,) = struct.unpack("<Q", header[:8])
            (length_crc,) = struct.unpack("<I", header[8:12])
            if masked_crc32c(header[:8]) != length_crc:
                warn(
                    f"{path}: corrupt record length at byte {offset}; the rest of the file "
                    "is skipped"
                )
                return
            if length + 4 > size - offset - 12:
                size = os.fstat(f.fileno()).st_size  # a writer may have appended since
            if keep is not None and length > _PEEK_FIRST and length + 4 <= size - offset - 12:
                head = f.read(_PEEK_FIRST)
                decision = keep(head, False)
                if decision is None:  # the tag runs on: up to _PEEK_BYTES
                    head += f.read(min(length, _PEEK_BYTES) - _PEEK_FIRST)
                    decision = keep(head, len(head) == length)
                if decision is False:
                    f.seek(length + 4 - len(head), os.SEEK_CUR)
                    offset += 12 + length + 4
                    if on_read is not None:
                        on_read(16 + length)
                    continue
                body = head + f.read(length + 4 - len(head))
            else:
                # Never read (allocate) more than the file holds, whatever the length claims.
                body = f.read(min(length + 4, max(0, size - offset - 12)))
            if len(body) < length + 4:
                warn(
                    f"{path}: truncated last record at byte {offset} skipped "
                    f"({len(body)} of {length + 4} bytes; the writer may still be writing)"
                )
                return
            data = body[:length]
            (data_crc,) = struct.unpack("<I", body[length:])
            offset += 12 + length + 4
            if on_read is not None:
                on_read(16 + length)
            if keep is not None and length <= _PEEK_FIRST and keep(data, True) is False:
                continue
            if masked_crc32c(data) != data_crc:
                warn(f"{path}: record at byte {offset - length - 16} fails its checksum; skipped")
                continue
            yield data


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at ``pos``: ``(value, next position)``; IndexError past the end."""
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _skip_field(buf: bytes, pos: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    if wire == 2:
        n, pos = _varint(buf, pos)
        return pos + n
    raise ValueError(f"wire type {wire}")


def _peek_event(head: bytes, whole: bool) -> tuple[int, list[str]] | None:
    """The step and the tags of the summary values of a serialized ``Event`` from its first
    bytes, or None if they are not all within ``head`` (``whole``: ``head`` is the record).

    ``Event``: field 2 is the step, field 5 the ``Summary``, whose field 1 holds each
    ``Value``, whose field 1 is its tag (fields are serialized in number order: the step and
    the tag come before the tensor).
    """
    step = 0
    try:
        pos, end = 0, len(head)
        while pos < end:
            key, pos = _varint(head, pos)
            if key == (2 << 3):  # step, a varint (int64: two's complement)
                step, pos = _varint(head, pos)
                step = step - (1 << 64) if step >= 1 << 63 else step
                continue
            if key >> 3 == 5 and key & 7 == 2:  # summary
                size, pos = _varint(head, pos)
                stop = pos + size
                tags = []
                while pos < stop:
                    vkey, pos = _varint(head, pos)
                    if vkey >> 3 != 1 or vkey & 7 != 2:
                        pos = _skip_field(head, pos, vkey & 7)
                        continue
                    vsize, pos = _varint(head, pos)
                    vstop = pos + vsize
                    tag = b""
                    while pos < vstop:  # the value's fields, up to its tag
                        fkey, pos = _varint(head, pos)
                        if fkey >> 3 == 1 and fkey & 7 == 2:
                            n, pos = _varint(head, pos)
                            if pos + n > end:
                                return None
                            tag = head[pos : pos + n]
                            break
                        pos = _skip_field(head, pos, fkey & 7)
                        if pos > end:
                            return None
                    tags.append(tag.decode("utf-8", errors="replace"))
                    pos = vstop
                    if pos >= end and pos < stop:
                        return None  # the next value starts beyond what was read
                return step, tags
            pos = _skip_field(head, pos, key & 7)
        return (step, []) if whole else None
    except (IndexError, ValueError):
        return None


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
    # Symbolic links to directories are followed, as TensorBoard follows them; a link to a
    # directory above it (a cycle) is not.
    for dirpath, dirnames, filenames in os.walk(logdir, followlinks=True):
        dirnames.sort()
        for d in list(dirnames):
            sub = os.path.join(dirpath, d)
            if os.path.islink(sub) and _links_above(sub, logdir):
                warnings.warn(
                    f"{sub}: a symbolic link to a directory above it; not followed",
                    DataWarning,
                    stacklevel=2,
                )
                dirnames.remove(d)
        files = sorted(f for f in filenames if _is_event_file(f))
        if files:
            run = os.path.relpath(dirpath, logdir).replace(os.sep, "/")
            runs[run] = [os.path.join(dirpath, f) for f in files]
    return dict(sorted(runs.items()))


def _links_above(link: str, logdir: str) -> bool:
    """Whether ``link`` leads to itself or a directory on its path down from ``logdir``."""
    target = os.path.realpath(link)
    path = os.path.dirname(link)
    top = os.path.realpath(logdir)
    while True:
        real = os.path.realpath(path)
        if real == target:
            return True
        if real == top or os.path.dirname(path) == path:
            return False
        path = os.path.dirname(path)


# ----------------------------------------------------------------------------- events


@dataclass
class _Tag:
    content: metadata.MomentsContent | metadata.StatsContent | None
    # step -> (wall_time, ndarray); a later event at the same step replaces an earlier one.
    events: dict[int, tuple[float, np.ndarray]] = field(default_factory=dict)
    # The steps stored more than once (the later record kept).
    repeated: set[int] = field(default_factory=set)
    # A moments tag's `metadata.moments_sum` of each record, latest last (format 3's pairing
    # with the stats record); for a repeated step, the earlier records too: step -> [(sum,
    # wall_time, ndarray)].
    sums: dict[int, list[tuple[float, float, np.ndarray]]] = field(default_factory=dict)
    # A stats tag's writer source tokens (format 3), of every record read.
    sources: set[int] = field(default_factory=set)
    # The records read, in order: (step, source token; None for a moments tag and formats 1
    # and 2), for `writers_of`.
    held: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Writers:
    """Who wrote a run whose records come from more than one summary writer (two writers on
    one directory, two training processes, a restarted run): `writers_of`.

    Attributes:
      sources: the writers' source tokens (format 3, `metadata.source_of`), sorted; empty for
        formats 1 and 2, which carry none.
      steps: the steps stored more than once by one tag (moments or stats), or whose
        records (of any tag) come from more than one writer, ascending.
    """

    sources: tuple[int, ...]
    steps: tuple[int, ...]

    @property
    def count(self) -> int:
        """The number of writers seen: the sources, at least 2 (a step stored twice)."""
        return max(len(self.sources), 2)

    def describe(self, run: str) -> str:
        """One line for a person: the run, how many writers, which steps, and the fix."""
        shown = ", ".join(f"{s:012x}" for s in self.sources)
        steps = ", ".join(map(str, self.steps[:8])) + (", ..." if len(self.steps) > 8 else "")
        where = (
            f"at {len(self.steps)} step{'s' * (len(self.steps) != 1)} ({steps})"
            if self.steps
            else "one record per step held"
        )
        return (
            f"run {short_name(run)} holds the records of {self.count} writers"
            + (f" (sources {shown})" if len(self.sources) == self.count else "")
            + (f" (sources seen: {shown})" if 0 < len(self.sources) < self.count else "")
            + f", {where}: two summary writers or training processes wrote one run (or it "
            "was restarted). Each step is read with its own writer's statistics and a step "
            "whose records do not pair is skipped, but the series may mix writers. Give each "
            "writer (each process, each create_file_writer) its own log directory, and each "
            "summary.moments call in one writer its own name="
        )


def writers_of(records: Iterable[tuple[str, int, int | None]]) -> Writers | None:
    """Who wrote a run, from the records a reader holds: ``(tag, step, source token)`` each
    (the token of a stats record; None for a moments record and formats 1 and 2). None when one writer wrote it (one source, no step stored twice by a tag);
    else the `Writers` (the same answer for `load`, the plugin's ``/tags`` and the export)."""
    seen: set[tuple[str, int]] = set()
    repeated: set[int] = set()
    tokens_at: dict[int, set[int]] = {}
    for tag, step, token in records:
        if (tag, step) in seen:
            repeated.add(step)
        seen.add((tag, step))
        if token is not None:
            tokens_at.setdefault(step, set()).add(token)
    sources = sorted(set().union(*tokens_at.values())) if tokens_at else []
    if len(sources) < 2 and not repeated:
        return None
    mixed = {step for step, tokens in tokens_at.items() if len(tokens) > 1}
    return Writers(tuple(sources), tuple(sorted(repeated | mixed)))


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
    return _decode_stored(content, value)[0]


def _decode_stored(content, value: Any) -> tuple[np.ndarray, np.ndarray]:
    """`_decode`, and the array as stored (before a float16 tag's decoding)."""
    metadata.check_tensor_proto(content, value.tensor)
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception as e:  # noqa: BLE001 - whatever a corrupt proto raises
        raise metadata.FormatError(f"unreadable tensor ({type(e).__name__}: {e})") from None
    metadata.check_tensor(content, array)
    if isinstance(content, metadata.MomentsContent) and content.encoding != "float32":
        # the moments of the orders, stacked as a float32 tag stores them
        decoded = metadata.decode_moments(content, array)
        return np.stack([decoded[p] for p in content.orders]), array
    return array, array


def _base_name(tag: str) -> str:
    """The name `load` returns a tag under: a stats tag's variable (or ``_model``)."""
    suffix = metadata.STATS_SUFFIX
    return tag[: -len(suffix)] if tag.endswith(suffix) and len(tag) > len(suffix) else tag


def _stored_steps(files: list[str], on_read=None) -> dict[str, set[int]]:
    """``{tag: steps}`` of every summary value in some event files, from the first bytes of
    each record (a record whose first bytes do not tell is read whole)."""
    found: dict[str, set[int]] = {}

    def note(head: bytes, whole: bool) -> bool | None:
        peek = _peek_event(head, whole)
        if peek is None:
            return None
        for tag in peek[1]:
            found.setdefault(tag, set()).add(peek[0])
        return False

    for path in files:
        for data in _read_records(path, note, on_read, quiet=True):
            try:
                event = event_pb2.Event.FromString(data)
            except Exception:  # noqa: BLE001 - warned about when the run is read
                continue
            for value in event.summary.value:
                found.setdefault(value.tag, set()).add(int(event.step))
    return found


def _latest_complete(found: dict[str, set[int]]) -> dict[str, int]:
    """Each tag's latest complete step: for a variable and its ``/_stats`` tag, the last step
    both have (none if they share none); for a tag without a partner, its last step."""
    latest = {}
    for tag, steps in found.items():
        base = _base_name(tag)
        partner = metadata.stats_tag(base) if base == tag else base
        both = steps & found[partner] if partner in found else steps
        if both:
            latest[tag] = max(both)
    return latest


def _fall_back(run: str, files: list[str], tags: dict[str, _Tag], last: dict[str, int]) -> None:
    """With ``steps="latest"``: the tags whose latest complete step could not be read (an
    unreadable record, warned about) are read again at every other step, so that they show
    their latest readable one, as a whole load does."""
    bases = set()
    for name, t in tags.items():
        if t.content is not None and name in last and last[name] not in t.events:
            bases.add(_base_name(name))
    if not bases:
        return
    again = _read_run(
        run,
        files,
        [],
        select=bases.__contains__,
        step_ok=lambda tag, step: step != last.get(tag),  # the latest was tried (and warned)
    )
    for name, t in again.items():
        old = tags.get(name)
        if old is not None and name in last and last[name] in old.events:
            t.events[last[name]] = old.events[last[name]]
        tags[name] = t


def _at_steps(last: dict[str, int]) -> Callable[[str, int], bool]:
    return lambda tag, step: last.get(tag) == step


def _in_steps(steps: frozenset[int]) -> Callable[[str, int], bool]:
    return lambda tag, step: step in steps


def _read_run(
    run: str,
    files: list[str],
    errors: list[str],
    select: Callable[[str], bool] | None = None,
    on_read: Callable[[int], None] | None = None,
    others: set[str] | None = None,
    step_ok: Callable[[str, int], bool] | None = None,
    seen_steps: set[int] | None = None,
) -> dict[str, _Tag]:
    """The Grad Moments tags of one run; with ``select`` only the tags whose base name
    (`_base_name`) it accepts (the names of the others go to ``others``), with ``step_ok`` only
    the steps it accepts of each tag (the steps of the selected tags go to ``seen_steps``)."""
    tags: dict[str, _Tag] = {}

    def wanted(tag: str) -> bool:
        return select is None or bool(select(_base_name(tag)))

    def keep(head: bytes, whole: bool) -> bool | None:
        peek = _peek_event(head, whole)
        if peek is None:
            return None  # cannot tell (yet): more bytes, else read it
        step, names = peek
        if seen_steps is not None:
            seen_steps.update(step for n in names if wanted(n))
        return any(
            n not in tags or (wanted(n) and (step_ok is None or step_ok(n, step))) for n in names
        )

    selective = select is not None or step_ok is not None
    for path in files:
        for data in _read_records(path, keep if selective else None, on_read):
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
                if tag is not None and not wanted(value.tag):
                    continue
                if tag is None and not wanted(value.tag):
                    # Its first record, read to tell a Grad Moments tag (for messages).
                    plugin = value.metadata.plugin_data
                    tags[value.tag] = _Tag(None)
                    if others is not None and plugin.plugin_name == metadata.PLUGIN_NAME:
                        others.add(_base_name(value.tag))
                    continue
                if tag is not None and step_ok is not None and not step_ok(value.tag, step):
                    continue
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
                if step_ok is not None and not step_ok(value.tag, step):
                    continue  # its first record, read for its metadata only
                try:
                    array, stored = _decode_stored(tag.content, value)
                except metadata.FormatError as e:
                    _warn(run, value.tag, step, f"{e}; the step is skipped")
                    continue
                if step in tag.events:
                    tag.repeated.add(step)
                tag.events[step] = (float(event.wall_time), array)
                if isinstance(tag.content, metadata.StatsContent) and "source_hi" in (
                    tag.content.fields
                ):
                    token = metadata.source_of(
                        stats.split_stats_tensor(array, tag.content.fields)[0]
                    )
                    if token is not None:
                        tag.sources.add(token)
                    tag.held.append((step, token))
                else:
                    tag.held.append((step, None))
                if isinstance(tag.content, metadata.MomentsContent):
                    record = (metadata.moments_sum(stored), float(event.wall_time), array)
                    if step in tag.repeated:
                        tag.sums.setdefault(step, []).append(record)
                    else:
                        tag.sums[step] = [record]
    who = writers_of((name, step, token) for name, t in tags.items() for step, token in t.held)
    if who is not None and who.sources:  # formats 1 and 2: the warnings of repeated steps
        warnings.warn(who.describe(run), DataWarning, stacklevel=3)
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


def _paired(t: _Tag, step: int, sums: dict[str, float], run: str, name: str):
    """``(wall_time, moments)`` of the record of moments tag ``t`` at ``step`` that its stats
    record ``sums`` was logged with (format 3: `metadata.same_moments`; the latest matching
    record of a step stored twice), or None, warned, if no record is (the two records of the
    step come from two writers or processes on one run: never paired)."""
    logged = sums.get("moments_sum")
    if logged is None:  # formats 1 and 2: the latest record
        return t.events[step]
    for moments_sum, wall_time, array in reversed(t.sums.get(step, [])):
        if metadata.same_moments(logged, moments_sum):
            return wall_time, array
    source = metadata.source_of(sums)
    _warn(
        run,
        name,
        step,
        f"its statistics (writer source {source:012x}) were logged with other moments than "
        "any record of this step holds: two writers or processes wrote this run, and their "
        "records of this step are mixed; the step is skipped (give each writer its own log "
        "directory, or log from one process)"
        if source is not None
        else "its moments and statistics do not match; the step is skipped",
    )
    return None


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
                paired = _paired(t, step, sums, run, name)
                if paired is None:
                    continue
                wall_time, array = paired
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


Selection = Iterable[str] | Callable[[str], bool]


def _selector(selection: Selection | None, what: str) -> Callable[[str], bool] | None:
    if selection is None:
        return None
    if callable(selection):
        return selection
    if isinstance(selection, str):
        raise TypeError(f"{what}= takes a list of names or a function of a name, not a string")
    names = frozenset(selection)
    return names.__contains__


class _Progress:
    """Reports a long read on a text stream: a line per quarter, or one updated line on a
    terminal (at most every half second)."""

    def __init__(self, stream: TextIO | None, total: int, runs: int):
        self.stream = stream if stream is not None and total >= PROGRESS_MIN_BYTES else None
        self.total, self.runs, self.done, self.run = total, runs, 0, 0
        self.tty = bool(self.stream is not None and getattr(self.stream, "isatty", bool)())
        self.start = self.last = time.monotonic()
        self.quarter = 0

    def next_run(self) -> None:
        self.run += 1

    def read(self, n: int) -> None:
        if self.stream is None:
            return
        self.done += n
        now = time.monotonic()
        quarter = 4 * self.done // max(1, self.total)
        if self.tty and now - self.last < 0.5 and self.done < self.total:
            return
        if not self.tty and quarter <= self.quarter:
            return
        self.quarter, self.last = quarter, now
        self._show(now)

    def _show(self, now: float) -> None:
        assert self.stream is not None
        line = (
            f"tb_gradmom: reading event files: {self.done / 2**20:,.0f} of "
            f"{self.total / 2**20:,.0f} MiB ({100 * self.done // max(1, self.total)}%), run "
            f"{self.run} of {self.runs}, {now - self.start:.0f} s"
        )
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def load(
    logdir: str | os.PathLike,
    run: str | None = None,
    *,
    runs: Selection | None = None,
    tags: Selection | None = None,
    steps: int | str | Iterable[int] | None = None,
    progress: TextIO | None = None,
    examples: bool = False,
) -> dict[str, dict[str, list[Record]]]:
    """Loads the Grad Moments tags under a logdir: all of them, or the runs and tags asked for.

    Each variable tag's records carry the stats of the same step from its ``<tag>/_stats``
    tag (``batch_size``, ``stats``, ``hist``). Stats tags without a moments tag (``_model``
    for the whole model, or variables logged without moments) appear under their base name
    (``"_model"``) with empty ``moments``. Records are sorted by step; when a step was written
    twice (two writers on one run, a restarted run), the later stats record wins, with the
    moments record it was logged with (format 3; the step is skipped if none is), and one
    warning per run names the writers and the steps (`writers_of`).

    Only what is selected is read: the event files of the other runs are not opened, and the
    records of other tags are skipped unread (see the module docstring), so one tag of a big
    log directory costs its own records, not the directory.

    Args:
      logdir: the directory given to TensorBoard's ``--logdir``.
      run: read only this run (a name as returned by `list_runs`, e.g. ``"."`` or
        ``"train"``); default all runs.
      runs: read only these runs: a list of names (each must exist) or a function of a run
        name that says whether to read it.
      tags: read only these tags (and their ``/_stats``): a list of the names `load` returns
        (``"dense/kernel"``, ``"_model"``, ``"generator/_model"``) or a function of such a
        name.
      steps: read only these steps: a step, a list of steps, or ``"latest"``: each tag's latest
        complete step (found first from the records' first bytes; if that step's record is
        unreadable, the tag has no record). Default: every step.
      progress: a text stream (e.g. ``sys.stderr``) told how far a long read is, from
        `PROGRESS_MIN_BYTES` of event files on.
      examples: also return the per-example norms of the runs read, as `ExamplesRecord`
        lists under their tags (``_examples``, ``<name>/_examples``; see `load_examples`):
        every step of them, whatever ``tags`` and ``steps`` select.

    Returns:
      ``{run: {tag: [Record, ...]}}``, runs and tags sorted by name; runs without Grad
      Moments data are left out.

    Raises:
      FileNotFoundError: if ``logdir`` does not exist.
      ValueError: if there is no event file, no such run, or no Grad Moments data (the
        message says which and how to log some); `SelectionError` if ``tags`` matches no
        Grad Moments tag of the runs read (the message and ``available`` list their tags).
      TypeError: ``runs`` or ``tags`` given as a single string, ``steps`` neither a step, a
        list of steps nor ``"latest"``.
    """
    where_logdir = os.fspath(logdir)
    found = list_runs(logdir)
    if not found:
        raise ValueError(f"no TensorBoard event files (*tfevents*) under logdir {where_logdir!r}")
    shown_runs = ", ".join(repr(r) for r in found)
    chosen = found
    if run is not None:
        if run not in found:
            raise ValueError(f"no run {run!r} under logdir {where_logdir!r}; runs: {shown_runs}")
        chosen = {run: found[run]}
    pick_run = _selector(runs, "runs")
    if runs is not None and not callable(runs):
        missing = [r for r in runs if r not in found]
        if missing:
            raise ValueError(
                f"no run {missing[0]!r} under logdir {where_logdir!r}; runs: {shown_runs}"
            )
    if pick_run is not None:
        chosen = {r: f for r, f in chosen.items() if pick_run(r)}
        if not chosen:
            raise ValueError(f"no run of logdir {where_logdir!r} is selected; runs: {shown_runs}")
    pick_tag = _selector(tags, "tags")
    latest = steps == "latest"
    step_set: frozenset[int] | None = None
    if steps is not None and not latest:
        if isinstance(steps, (int, np.integer)) and not isinstance(steps, bool):
            step_set = frozenset([int(steps)])
        elif isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
            raise TypeError(f"steps= takes a step, a list of steps or 'latest', got {steps!r}")
        else:
            step_set = frozenset(int(x) for x in steps)
    total = 0
    for files in chosen.values():
        for f in files:
            try:
                total += os.stat(f).st_size
            except OSError:
                pass
    bar = _Progress(progress, total, len(chosen))
    errors: list[str] = []
    others: set[str] = set()
    seen_steps: set[int] = set()
    out = {}
    for name, files in chosen.items():
        bar.next_run()
        step_ok: Callable[[str, int], bool] | None = None
        last: dict[str, int] = {}
        if latest:
            last = _latest_complete(_stored_steps(files))
            step_ok = _at_steps(last)
        elif step_set is not None:
            step_ok = _in_steps(step_set)
        tags_read = _read_run(name, files, errors, pick_tag, bar.read, others, step_ok, seen_steps)
        if latest:
            _fall_back(name, files, tags_read, last)
        records = _records_of_run(tags_read, name)
        if latest:
            records = {tag: recs[-1:] for tag, recs in records.items()}
        if examples:
            for tag, recs in load_examples(logdir, runs=[name]).get(name, {}).items():
                records[tag] = recs  # type: ignore[assignment]
        if records:
            out[name] = records
    bar.close()
    if not out:
        where = f"run {run!r} of logdir" if run is not None else "logdir"
        if pick_tag is not None and others and not seen_steps:
            available = sorted(others)
            raise SelectionError(
                f"no tag of {where} {where_logdir!r} is selected; tags: "
                + ", ".join(short_name(t) for t in available),
                "tags",
                available,
            )
        if step_set is not None and seen_steps:
            found_steps = sorted(seen_steps)
            shown = ", ".join(map(str, found_steps[:10])) + (
                ", ..." if len(found_steps) > 10 else ""
            )
            raise SelectionError(
                f"no Grad Moments record at step {', '.join(map(str, sorted(step_set)))} in "
                f"{where} {where_logdir!r}; steps: {shown}",
                "steps",
                found_steps,
            )
        detail = f" ({errors[0]})" if errors else ""
        raise ValueError(
            f"no Grad Moments data in {where} {where_logdir!r}{detail}; log some with "
            "tb_gradmom.writers.summary or the Keras callback"
        )
    return out


# ----------------------------------------------------------------------------- examples


@dataclass
class ExamplesRecord:
    """One logged step's per-example squared gradient norms (tag ``_examples``, see
    docs/format.md "Per-example norms"): one entry per kept example, in batch order.

    Attributes:
      step, wall_time: as in `Record`.
      batch_size: ``n``, the examples of the step (more than the rows when capped).
      positions: int64 ``[rows]``, each kept example's position in the batch.
      ids: ``[rows]`` the ids passed with the batch (int64, or ``str``), or None.
      losses: float64 ``[rows]``, each example's loss (its per-example part, unscaled).
      model: float64 ``[rows]``, ``||g_j||^2`` over all the variables of the call.
      layers: layer name -> float64 ``[rows]``, ``||g_j||^2`` over the layer's variables.
      variables: variable tag -> float64 ``[rows]`` (when logged per variable).
      max_examples: the cap of rows per step the writer used.
    """

    step: int
    wall_time: float
    batch_size: int
    positions: np.ndarray
    ids: np.ndarray | None
    losses: np.ndarray
    model: np.ndarray
    layers: dict[str, np.ndarray]
    variables: dict[str, np.ndarray]
    max_examples: int


def load_examples(
    logdir: str | os.PathLike, runs: Selection | None = None
) -> dict[str, dict[str, list[ExamplesRecord]]]:
    """The per-example norms under a logdir: ``{run: {tag: [ExamplesRecord, ...]}}``, tags
    ``_examples`` (``<name>/_examples``), records sorted by step (a step written twice: the
    later event). Runs without any are left out. A tag whose content or a step whose tensors
    do not fit their content is skipped with a `DataWarning`.

    Args:
      logdir: the directory given to TensorBoard's ``--logdir``.
      runs: read only these runs (names, or a function of a name).
    """
    found = list_runs(logdir)
    pick = _selector(runs, "runs")
    out: dict[str, dict[str, list[ExamplesRecord]]] = {}
    for run, files in found.items():
        if pick is not None and not pick(run):
            continue
        contents: dict[str, metadata.ExamplesContent | None] = {}
        tables: dict[str, dict[int, tuple[float, np.ndarray]]] = {}
        for path in files:
            for raw in read_records(path):
                event = event_pb2.Event.FromString(raw)
                for value in event.summary.value:
                    _read_examples_value(run, event, value, contents, tables)
        records = _examples_of_run(run, contents, tables)
        if records:
            out[run] = records
    return out


def _read_examples_value(run, event, value, contents, tables) -> None:
    tag = value.tag
    if tag not in contents:
        plugin = value.metadata.plugin_data
        if plugin.plugin_name != metadata.EXAMPLES_PLUGIN_NAME:
            return
        try:
            contents[tag] = metadata.parse_examples_content(plugin.content)
        except metadata.FormatError as e:
            _warn(run, tag, int(event.step), f"tag skipped: {e}")
            contents[tag] = None
    if contents[tag] is None:
        return
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception as e:  # noqa: BLE001 - a corrupt tensor skips its step
        _warn(run, tag, int(event.step), f"unreadable tensor ({type(e).__name__})")
        return
    tables.setdefault(tag, {})[int(event.step)] = (float(event.wall_time), array)


def _examples_of_run(run, contents, tables, warn=None) -> dict[str, list[ExamplesRecord]]:
    """The records of one run from its contents and ``{tag: {step: (wall_time, array)}}``;
    a step that does not fit is skipped through ``warn(run, tag, step, message)`` (default: a
    `DataWarning`). Also used by the plugin (its own ``warn`` logs)."""
    warn = _warn if warn is None else warn
    out: dict[str, list[ExamplesRecord]] = {}
    for tag, content in contents.items():
        if content is None or tag.endswith("/ids"):
            continue
        ids_by_step = tables.get(metadata.examples_ids_tag(tag), {})
        records = []
        for step, (wall, table) in sorted(tables.get(tag, {}).items()):
            width = len(content.columns)
            if table.ndim != 2 or table.shape[1] != width or table.dtype.kind != "f":
                warn(run, tag, step, f"tensor {table.shape} is not [rows, {width}] floats")
                continue
            if table.shape[0] > content.max_examples:
                warn(run, tag, step, f"{table.shape[0]} rows, over max_examples")
                continue
            ids = None
            if content.ids:
                got = ids_by_step.get(step)
                if got is None or got[1].shape != (table.shape[0],):
                    warn(run, tag, step, "its ids are missing or do not match its rows")
                    continue
                ids = got[1]
                if content.ids == "string":
                    ids = np.array([b.decode("utf-8", "replace") for b in ids], dtype=object)
                else:
                    ids = ids.astype(np.int64)
            fixed = len(metadata.EXAMPLE_COLUMNS)
            cols = {name: table[:, i].astype(np.float64) for i, name in enumerate(content.columns)}
            named = list(zip(content.columns[fixed:], content.norms))
            records.append(
                ExamplesRecord(
                    step=step,
                    wall_time=wall,
                    batch_size=int(table[0, 0]) if len(table) else 0,
                    positions=table[:, 1].astype(np.int64),
                    ids=ids,
                    losses=cols["loss"],
                    model=cols["model"],
                    layers={
                        c: table[:, fixed + i] for i, (c, k) in enumerate(named) if k == "layer"
                    },
                    variables={
                        c: table[:, fixed + i] for i, (c, k) in enumerate(named) if k == "variable"
                    },
                    max_examples=content.max_examples,
                )
            )
        if records:
            out[tag] = records
    return out
