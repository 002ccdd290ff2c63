"""One stored step read straight from a run's event files, for the plugin under RustBoard.

RustBoard's data server (``--load_fast=true``) has no way to send one step of a tensor time
series: ``ReadTensors`` takes a ``downsample`` only, so one old step of a big series costs a
gRPC read of a sample of it (hundreds of MB for the benchmark's 64K-cell kernel; seconds under
load). When the log directory is local, the plugin finds the step in the run's event files
instead and reads that one record: `StepFiles` keeps, per run directory, where each record of
each tag is (file, byte offset, length; compact columns), learnt by reading only the records'
first bytes (`data._peek_event`: the step and the tag come first in a serialized ``Event``), and
reads one record, checksum verified, when asked.

It serves only what the data provider already lists (the reader asks for steps it resolved
from the provider's stats), and answers None whenever it cannot be sure (a remote log
directory, a run directory it cannot find, a step not in the files, a record that fails its
checksum or does not parse): the reader then reads through the data provider as before. Of a
step stored in several records (two writers or processes on one run) all are returned, in
file order; the reader takes the one its stats record was logged with (format 3).
"""

from __future__ import annotations

import array
import dataclasses
import os
import stat as stat_module
import struct
import threading

import numpy as np
from tensorboard.compat.proto import event_pb2

from tb_gradmom.analysis import data

__all__ = ["StepFiles", "Found"]

# Records indexed per run at most (40 bytes each: 160 MB; a ResNet50 logged 200 times with its
# scalars is 390,000): beyond it the run is not served from its files (the reader reads
# through the data provider).
MAX_RECORDS_PER_RUN = 4_000_000
# A record longer than this is not read from the files (a corrupt length).
MAX_RECORD_BYTES = 1 << 31
# Bytes read at once when indexing a file.
WINDOW_BYTES = 256 * 1024
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


@dataclasses.dataclass(frozen=True)
class Found:
    """One stored step of one tag: its tensor proto (not decoded), step and wall time."""

    step: int
    wall_time: float
    proto: object
    path: str


@dataclasses.dataclass
class _File:
    path: str
    scanned: int = 0  # bytes indexed (whole records)
    inode: tuple = ()


@dataclasses.dataclass
class _Run:
    """What the event files of one run directory hold: every record of every tag, as columns
    (about 32 bytes a record), and a ``{step: [spot]}`` dict built for each tag asked for."""

    directory: str
    files: dict[str, _File] = dataclasses.field(default_factory=dict)
    names: list[str] = dataclasses.field(default_factory=list)  # file index -> name
    tag_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    # One entry per (record, tag): tag id, step, file index, offset of the header, data length.
    cols: tuple = dataclasses.field(
        default_factory=lambda: tuple(array.array("q") for _ in range(5))
    )
    # tag -> step -> [(file name, offset, data length)], file order; for the tags asked for.
    where: dict[str, dict[int, list[tuple[str, int, int]]]] = dataclasses.field(
        default_factory=dict
    )
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    disabled: str = ""

    @property
    def records(self) -> int:
        return len(self.cols[0])

    def spots(self, tag: str) -> dict[int, list[tuple[str, int, int]]]:
        """The ``{step: [spot]}`` of one tag, from the columns (kept for later)."""
        found = self.where.get(tag)
        if found is None:
            found = self.where[tag] = {}
            tid = self.tag_ids.get(tag)
            if tid is not None:
                tags, steps, files, offsets, lengths = (
                    np.frombuffer(c, np.int64) for c in self.cols
                )
                for i in np.flatnonzero(tags == tid).tolist():
                    spot = (self.names[int(files[i])], int(offsets[i]), int(lengths[i]))
                    found.setdefault(int(steps[i]), []).append(spot)
        return found


class StepFiles:
    """Finds and reads single records of the runs under one local log directory.

    Args:
      logdir: TensorBoard's ``--logdir`` (None or a remote path: nothing is served).
    """

    def __init__(self, logdir: str | None):
        local = bool(logdir) and "://" not in str(logdir)
        self.root = os.path.realpath(os.path.expanduser(str(logdir))) if local else None
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._indexing: set[str] = set()
        self.reads = 0  # records read (for tests)

    def _run(self, run: str) -> _Run | None:
        if self.root is None:
            return None
        with self._lock:
            found = self._runs.get(run)
            if found is not None:
                return found
            directory = self.root if run == "." else os.path.join(self.root, run)
            if not os.path.isdir(directory):
                return None
            found = self._runs[run] = _Run(directory)
            return found

    def indexed(self, run: str) -> bool:
        """Whether the run's files have been indexed; if not, indexing starts in the
        background (a run of 390,000 records takes about 3 s), and the caller may read the
        step another way meanwhile."""
        r = self._run(run)
        if r is None or r.files:
            return r is not None
        with self._lock:
            if run in self._indexing:
                return False
            self._indexing.add(run)

        def index():
            try:
                with r.lock:
                    if not r.files:
                        self._scan(r)
            finally:
                with self._lock:
                    self._indexing.discard(run)

        threading.Thread(target=index, name="gradmom-index", daemon=True).start()
        return False

    def read(self, run: str, tag: str, step: int) -> list[Found]:
        """The readable records of step ``step`` of ``tag`` in ``run``, in file order (files in
        name order; the last is the one RustBoard keeps); empty if the files cannot give it."""
        r = self._run(run)
        if r is None:
            return []
        with r.lock:
            if not r.files:
                self._scan(r)
            spots = r.spots(tag).get(step)
            if spots is None:
                self._scan(r)  # the files may have grown since they were indexed
                spots = r.spots(tag).get(step)
            if spots is None or r.disabled:
                return []
            spots = list(spots)
        found = []
        for name, offset, length in spots:
            f = self._read_record(os.path.join(r.directory, name), offset, length, tag, step)
            if f is not None:
                found.append(f)
        return found

    def record_counts(self, run: str, tag: str) -> dict[int, int]:
        """``{step: records}`` of ``tag`` in ``run``'s files, from the index alone (no record
        is read): a step stored more than once (two writers or processes on one run) has
        several, though RustBoard keeps one. Empty until the run is indexed (`indexed`)."""
        r = self._run(run)
        if r is None or not r.files:
            return {}
        with r.lock:
            self._scan(r)  # what was written since
            if r.disabled:
                return {}
            return {step: len(spots) for step, spots in r.spots(tag).items()}

    def _read_record(self, path: str, offset: int, length: int, tag: str, step: int):
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                body = f.read(12 + length + 4)
        except OSError:
            return None
        if len(body) != 12 + length + 4:
            return None
        (stored,) = struct.unpack("<Q", body[:8])
        if stored != length:
            return None
        payload = body[12 : 12 + length]
        if data.masked_crc32c(payload) != struct.unpack("<I", body[12 + length :])[0]:
            return None
        try:
            event = event_pb2.Event.FromString(payload)
        except Exception:  # noqa: BLE001 - whatever a corrupt record raises: not served
            return None
        if int(event.step) != step:
            return None
        for value in event.summary.value:
            if value.tag == tag and value.HasField("tensor"):
                self.reads += 1
                return Found(int(event.step), float(event.wall_time), value.tensor, path)
        return None

    def _scan(self, r: _Run) -> None:
        """Indexes what the run's event files hold beyond what was indexed (``r.lock`` held)."""
        if r.disabled:
            return
        try:
            names = sorted(
                e.name
                for e in os.scandir(r.directory)
                if data._is_event_file(e.name) and e.is_file()  # noqa: SLF001
            )
        except OSError:
            return
        for name in names:
            path = os.path.join(r.directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not stat_module.S_ISREG(st.st_mode):
                continue
            f = r.files.get(name)
            inode = (st.st_dev, st.st_ino)
            if f is not None and (f.inode != inode or st.st_size < f.scanned):
                # replaced or cut: forget everything and index again
                fresh = _Run(r.directory)
                r.files, r.names, r.tag_ids = fresh.files, fresh.names, fresh.tag_ids
                r.cols, r.where = fresh.cols, fresh.where
                self._scan(r)
                return
            if f is None:
                f = r.files[name] = _File(path, 0, inode)
                r.names.append(name)
            if st.st_size > f.scanned:
                self._scan_file(r, r.names.index(name), f)
            if r.records > MAX_RECORDS_PER_RUN:
                r.disabled = f"more than {MAX_RECORDS_PER_RUN} records"
                r.where.clear()
                r.cols = tuple(array.array("q") for _ in range(5))
                return

    def _scan_file(self, r: _Run, index: int, f: _File) -> None:
        try:
            fh = open(f.path, "rb", buffering=0)
        except OSError:
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            window = _Window(fh)
            tags_col, steps_col, files_col, offsets_col, lengths_col = r.cols
            name = r.names[index]
            offset = f.scanned
            peek_first, peek_most = data._PEEK_FIRST, data._PEEK_BYTES  # noqa: SLF001
            while offset + 12 <= size:
                header = window.get(offset, 12)
                (length,) = _U64.unpack_from(header)
                (crc,) = _U32.unpack_from(header, 8)
                if data.masked_crc32c(header[:8]) != crc:
                    break  # a corrupt length: nothing after it is indexed
                if length > MAX_RECORD_BYTES or offset + 12 + length + 4 > size:
                    break  # being written (or cut): indexed on a later scan
                start = offset + 12
                head = window.get(start, min(length, peek_first))
                peek = data._peek_event(head, len(head) == length)  # noqa: SLF001
                if peek is None and len(head) < length:  # a long tag: up to _PEEK_BYTES
                    head = window.get(start, min(length, peek_most))
                    peek = data._peek_event(head, len(head) == length)  # noqa: SLF001
                if peek is not None:
                    step, tags = peek
                    for tag in tags:
                        tid = r.tag_ids.setdefault(tag, len(r.tag_ids))
                        tags_col.append(tid)
                        steps_col.append(step)
                        files_col.append(index)
                        offsets_col.append(offset)
                        lengths_col.append(length)
                        known = r.where.get(tag)
                        if known is not None:
                            known.setdefault(step, []).append((name, offset, length))
                offset += 12 + length + 4
            f.scanned = offset


class _Window:
    """Reads a file's bytes through a window of `WINDOW_BYTES` (small records are many per
    read; a big record's body is jumped over, never read whole)."""

    def __init__(self, fh):
        self._fh = fh
        self._base = 0
        self._buf = b""

    def get(self, offset: int, n: int) -> bytes:
        end = offset + n
        if not (self._base <= offset and end <= self._base + len(self._buf)):
            self._fh.seek(offset)
            self._buf = self._fh.read(max(n, WINDOW_BYTES))
            self._base = offset
        return self._buf[offset - self._base : end - self._base]
