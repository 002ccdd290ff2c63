"""One stored step read straight from a run's event files, for the plugin under RustBoard.

RustBoard's data server (``--load_fast=true``) has no way to send one step of a tensor time
series: ``ReadTensors`` takes a ``downsample`` only, so one old step of a big series costs a
gRPC read of a sample of it (hundreds of MB for the benchmark's 64K-cell kernel; seconds under
load). When the log directory is local, the plugin finds the step in the run's event files
instead and reads that one record: `StepFiles` keeps, per run directory, where each record of
each tag asked for is (file, byte offset, length), learnt by reading only the records' first
bytes (`data._peek_event`: the step and the tag come first in a serialized ``Event``), and
reads one record, checksum verified, when asked.

It serves only what the data provider already lists (the reader asks for steps it resolved
from the provider's stats), and answers None whenever it cannot be sure (a remote log
directory, a run directory it cannot find, a step not in the files, a record that fails its
checksum or does not parse): the reader then reads through the data provider as before. Of a
step stored in several records (two writers or processes on one run) all are returned, in
file order; the reader takes the one its stats record was logged with (format 3).
"""

from __future__ import annotations

import dataclasses
import os
import stat as stat_module
import struct
import threading

from tensorboard.compat.proto import event_pb2

from tb_gradmom.analysis import data

__all__ = ["StepFiles", "Found"]

# Records indexed per run at most (about 150 bytes each; only the tags asked for are indexed:
# 20 tags x 500 steps is 10,000): beyond it the run is not served from its files (the reader
# reads through the data provider).
MAX_RECORDS_PER_RUN = 200_000
# A record longer than this is not read from the files (a corrupt length).
MAX_RECORD_BYTES = 1 << 31


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
    directory: str
    files: dict[str, _File] = dataclasses.field(default_factory=dict)
    # tag -> step -> [(file name, offset of the record's header, data length)]: every record of
    # the step, in file order (files in name order).
    where: dict[str, dict[int, list[tuple[str, int, int]]]] = dataclasses.field(
        default_factory=dict
    )
    records: int = 0
    # The tags indexed: those asked for so far (a run may hold thousands of scalar tags).
    wanted: set[str] = dataclasses.field(default_factory=set)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    disabled: str = ""


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

    def read(self, run: str, tag: str, step: int) -> list[Found]:
        """The readable records of step ``step`` of ``tag`` in ``run``, in file order (files in
        name order; the last is the one RustBoard keeps); empty if the files cannot give it."""
        r = self._run(run)
        if r is None:
            return []
        with r.lock:
            if tag not in r.wanted:  # a new tag: index the files again, for it too
                r.wanted.add(tag)
                r.files.clear()
                r.where.clear()
                r.records = 0
            spots = r.where.get(tag, {}).get(step)
            if spots is None:
                self._scan(r)  # the files may have grown since they were indexed
                spots = r.where.get(tag, {}).get(step)
            if spots is None or r.disabled:
                return []
            spots = list(spots)
        found = []
        for name, offset, length in spots:
            f = self._read_record(os.path.join(r.directory, name), offset, length, tag, step)
            if f is not None:
                found.append(f)
        return found

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
            if f is None or f.inode != inode or st.st_size < f.scanned:
                if f is not None:  # replaced or cut: forget what was indexed of it
                    for steps in r.where.values():
                        for s, spots in list(steps.items()):
                            spots[:] = [spot for spot in spots if spot[0] != name]
                            if not spots:
                                del steps[s]
                f = r.files[name] = _File(path, 0, inode)
            if st.st_size > f.scanned:
                self._scan_file(r, name, f)
            if r.records > MAX_RECORDS_PER_RUN:
                r.disabled = f"more than {MAX_RECORDS_PER_RUN} records"
                r.where.clear()
                return

    def _scan_file(self, r: _Run, name: str, f: _File) -> None:
        try:
            fh = open(f.path, "rb")
        except OSError:
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            offset = f.scanned
            fh.seek(offset)
            while offset + 12 <= size:
                header = fh.read(12)
                if len(header) < 12:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                if data.masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
                    break  # a corrupt length: nothing after it is indexed
                if length > MAX_RECORD_BYTES or offset + 12 + length + 4 > size:
                    break  # being written (or cut): indexed on a later scan
                head = fh.read(min(length, data._PEEK_FIRST))  # noqa: SLF001
                peek = data._peek_event(head, len(head) == length)  # noqa: SLF001
                if peek is None and len(head) < length:  # a long tag: up to _PEEK_BYTES
                    head += fh.read(min(length, data._PEEK_BYTES) - len(head))  # noqa: SLF001
                    peek = data._peek_event(head, len(head) == length)  # noqa: SLF001
                if peek is not None:
                    step, tags = peek
                    for tag in tags:
                        if tag not in r.wanted:
                            continue
                        r.where.setdefault(tag, {}).setdefault(step, []).append(
                            (name, offset, length)
                        )
                        r.records += 1
                fh.seek(offset + 12 + length + 4)
                offset += 12 + length + 4
            f.scanned = offset
