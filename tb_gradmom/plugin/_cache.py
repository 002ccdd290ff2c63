"""The plugin's memory: a byte-budgeted LRU cache, and a gate for transient working memory.

TensorBoard serves requests from many threads. Decoded moment arrays, stats series and
computed responses are cached in one `ByteLRU` whose size is what its values really hold
(`nbytes` counts every array, each buffer once), so the budget (``--gradmom_cache_mb``) holds.
A series that gets new data (a live run) is cached under a new *version*; putting it evicts
the versions before it (``group``), so a growing run does not pile up copies. Concurrent
requests for the same missing key wait for one load and share its result (single flight)
instead of each decoding the same tensors or computing the same response.

What is not cached but alive while a request runs (tensors being read, arrays being computed,
a response being encoded) goes through a `MemoryGate`: each request reserves its estimated
bytes before it starts, and waits while the gate's budget is taken, so the plugin's working
set stays within the cache budget plus the gates' budgets however many clients ask at once.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

__all__ = ["ByteLRU", "MemoryGate", "SingleFlight", "nbytes"]

_ARRAY_HEADER = 112  # bytes of an ndarray object without its data
# After a reservation at least this big ends, free memory is handed back to the system.
TRIM_MIN_BYTES = 128 * 1024 * 1024


def _malloc_trim():
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim() if sys.platform.startswith("linux") else None


def release_free_memory() -> None:
    """Hands the memory the process has freed back to the system (glibc's ``malloc_trim``).

    glibc keeps freed memory in its arenas for reuse, so after a big read or computation the
    process's resident memory stays at its peak until the same thread allocates again (measured
    with RustBoard: 450 MB above what was held, after 60 clients). Trimming returns the free
    pages (the memory is still reusable); it changes no allocation behaviour. No-op without
    glibc.
    """
    if _TRIM is not None:
        _TRIM(0)


def nbytes(value, _seen: set[int] | None = None) -> int:
    """The memory a value holds: arrays (each buffer once, views count their base), bytes,
    strings, numbers, containers and dataclasses, recursively."""
    seen = set() if _seen is None else _seen
    if id(value) in seen:
        return 0
    if isinstance(value, np.ndarray):
        base = value
        while isinstance(base.base, np.ndarray):
            base = base.base
        if id(base) in seen:
            return _ARRAY_HEADER
        seen.add(id(base))
        buffer = base.base
        if isinstance(buffer, (bytes, bytearray)):  # np.frombuffer: the buffer is the data
            return len(buffer) + _ARRAY_HEADER
        return int(base.nbytes) + _ARRAY_HEADER
    seen.add(id(value))
    if isinstance(value, (bytes, bytearray, str, int, float, complex, bool)) or value is None:
        return sys.getsizeof(value)
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(
            nbytes(k, seen) + nbytes(v, seen) for k, v in value.items()
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        return sys.getsizeof(value) + sum(nbytes(v, seen) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sys.getsizeof(value) + sum(
            nbytes(getattr(value, f.name), seen) for f in dataclasses.fields(value)
        )
    return sys.getsizeof(value)


class ByteLRU:
    """Least-recently-used cache holding at most ``budget_bytes`` (measured with `nbytes`).

    A value bigger than the whole budget is returned to its caller but not kept. A value put
    with a ``group`` replaces the group's previous key (an older version of the same data).

    ``parts``: named parts of the budget, ``{name: share}`` (a share of ``budget_bytes`` each),
    each an LRU of its own; the rest of the budget is the default part (``part=None``). A value
    put in a part evicts only values of that part, so many big, cheap values (heatmaps of one
    step each) cannot evict a few small, costly ones (histograms over every step).
    """

    def __init__(self, budget_bytes: int, parts: dict[str, float] | None = None):
        self.budget_bytes = int(budget_bytes)
        budgets: dict[str | None, int] = {
            name: int(self.budget_bytes * share) for name, share in (parts or {}).items()
        }
        budgets[None] = self.budget_bytes - sum(budgets.values())
        if budgets[None] < 0:
            raise ValueError(f"ByteLRU parts {parts} take more than the whole budget")
        self.part_budgets = budgets
        self._parts: dict[str | None, OrderedDict[Hashable, tuple[object, int]]] = {
            name: OrderedDict() for name in budgets
        }
        self._part_size: dict[str | None, int] = dict.fromkeys(budgets, 0)
        self._where: dict[Hashable, str | None] = {}
        self._groups: dict[Hashable, Hashable] = {}
        self._size = 0
        self._lock = threading.Lock()
        self._loading: dict[Hashable, _Flight] = {}
        self.hits = 0
        self.misses = 0
        self.loads = 0  # values loaded by `get_or_load` (one per key however many waited)

    @property
    def size_bytes(self) -> int:
        return self._size

    def part_size(self, part: str | None = None) -> int:
        """The bytes held by one part."""
        return self._part_size[part]

    def __len__(self) -> int:
        return len(self._where)

    def keys(self) -> list:
        with self._lock:
            return list(self._where)

    def items(self) -> list[tuple[Hashable, object, int]]:
        """``(key, value, size)`` of every cached value, of every part."""
        with self._lock:
            return [(k, v, n) for data in self._parts.values() for k, (v, n) in data.items()]

    def _item(self, key):
        part = self._where.get(key, _MISSING)
        if part is _MISSING:
            return None
        data = self._parts[part]
        data.move_to_end(key)
        return data[key]

    def get(self, key: Hashable, default=None):
        with self._lock:
            item = self._item(key)
            if item is None:
                self.misses += 1
                return default
            self.hits += 1
            return item[0]

    def clear(self) -> None:
        """Drops every cached value (the benchmark's cold requests; a loading key still
        finishes its load and caches the result)."""
        with self._lock:
            for data in self._parts.values():
                data.clear()
            self._part_size = dict.fromkeys(self._parts, 0)
            self._where.clear()
            self._groups.clear()
            self._size = 0

    def _pop(self, key) -> None:
        part = self._where.pop(key, _MISSING)
        if part is _MISSING:
            return
        _, size = self._parts[part].pop(key)  # type: ignore[index]
        self._size -= size
        self._part_size[part] -= size  # type: ignore[index]

    def put(
        self,
        key: Hashable,
        value,
        size: int | None = None,
        group: Hashable | None = None,
        part: str | None = None,
    ) -> None:
        """Caches ``value`` (``size`` bytes, default `nbytes`) in ``part``, evicting the least
        recent values of that part.

        ``group``: the value is the current version of this group; the key cached for the
        group before (an older version) is dropped.
        """
        size = nbytes(value) if size is None else int(size)
        budget = self.part_budgets[part]
        with self._lock:
            self._pop(key)
            if group is not None:
                previous = self._groups.get(group)
                if previous is not None and previous != key:
                    self._pop(previous)
                self._groups[group] = key
            if size > budget:
                return
            data = self._parts[part]
            data[key] = (value, size)
            self._where[key] = part
            self._size += size
            self._part_size[part] += size
            while self._part_size[part] > budget and data:
                old, (_, s) = data.popitem(last=False)
                del self._where[old]
                self._size -= s
                self._part_size[part] -= s
            if len(self._groups) > 4 * len(self._where) + 64:  # forget groups long evicted
                self._groups = {g: k for g, k in self._groups.items() if k in self._where}

    def get_or_load(
        self,
        key: Hashable,
        load: Callable[[], object],
        size: Callable[[object], int] | None = None,
        group: Hashable | None = None,
        max_size: int | None = None,
        part: str | None = None,
    ):
        """The cached value, or ``load()`` run once even if many threads ask at the same time.

        Single flight: while one caller loads a key, the others asking for it wait and get
        its result (also when the value is not kept: bigger than ``max_size`` or the whole
        budget). ``size(value)`` gives the bytes to count (default `nbytes`); ``group`` as in
        `put`; ``part`` the part of the budget it is kept in. An exception from ``load``
        propagates to its caller; nothing is cached and each waiting caller then tries the load
        itself, one at a time.
        """
        while True:
            value = self.get(key, _MISSING)
            if value is not _MISSING:
                return value
            with self._lock:
                found = self._loading.get(key)
                leader = found is None
                flight = _Flight() if found is None else found
                if leader:
                    self._loading[key] = flight
            if not leader:
                ok, value = flight.wait()
                if ok:
                    return value
                continue  # the load failed: try it ourselves
            try:
                with self._lock:  # a load that finished between our miss and our flight
                    item = self._item(key)
                if item is not None:
                    flight.finish(True, item[0])
                    return item[0]
                try:
                    value = load()
                except BaseException:
                    flight.finish(False, None)
                    raise
                n = nbytes(value) if size is None else int(size(value))
                if max_size is None or n <= max_size:
                    self.put(key, value, n, group, part)
                flight.finish(True, value)
                self.loads += 1
                return value
            finally:
                with self._lock:
                    if self._loading.get(key) is flight:
                        del self._loading[key]


class SingleFlight:
    """Calls shared by the callers that overlap: while ``run(key, fn)`` runs ``fn`` for a key,
    other callers of the same key wait and get its result instead of calling ``fn`` again.
    Nothing is kept once it returns (no staleness beyond the call's own duration). If ``fn``
    raises, its caller gets the exception and each waiting caller calls ``fn`` itself.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight] = {}
        self.calls = 0  # times ``fn`` ran

    def run(self, key: Hashable, fn: Callable[[], object]):
        while True:
            with self._lock:
                found = self._flights.get(key)
                leader = found is None
                flight = _Flight() if found is None else found
                if leader:
                    self._flights[key] = flight
            if not leader:
                ok, value = flight.wait()
                if ok:
                    return value
                continue
            try:
                self.calls += 1
                value = fn()
            except BaseException:
                flight.finish(False, None)
                raise
            else:
                flight.finish(True, value)
                return value
            finally:
                with self._lock:
                    if self._flights.get(key) is flight:
                        del self._flights[key]


class _Flight:
    """One load in progress: the callers waiting for it get its result."""

    def __init__(self):
        self._done = threading.Event()
        self._ok = False
        self._value: object = None

    def finish(self, ok: bool, value) -> None:
        self._ok, self._value = ok, value
        self._done.set()

    def wait(self) -> tuple[bool, object]:
        self._done.wait()
        return self._ok, self._value


_MISSING = object()


class MemoryGate:
    """A semaphore counted in bytes: at most ``budget_bytes`` reserved at once.

    ``with gate.reserve(n):`` waits until ``n`` bytes fit (a reservation bigger than the whole
    budget waits until nothing else is reserved, then runs alone). Reservations must not be
    nested in one gate; a thread holding one gate's reservation may wait on another gate only
    if the holders of that one never wait on the first (the plugin reserves working memory
    first, then read memory, never the other way round).
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self._used = 0
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self.peak_bytes = 0
        self.waits = 0

    def _fits(self, size: int) -> bool:
        return self._used == 0 or self._used + size <= self.budget_bytes

    @property
    def used_bytes(self) -> int:
        return self._used

    @contextlib.contextmanager
    def reserve(self, size: int):
        """Holds ``size`` bytes of the budget for the ``with`` block (first come, first served)."""
        size = max(0, int(size))
        with self._cond:
            ticket = object()
            self._queue.append(ticket)
            if self._queue[0] is not ticket or not self._fits(size):
                self.waits += 1
                while self._queue[0] is not ticket or not self._fits(size):
                    self._cond.wait()
            self._queue.popleft()
            self._used += size
            self.peak_bytes = max(self.peak_bytes, self._used)
            self._cond.notify_all()  # the next in line may fit too
        try:
            yield
        finally:
            with self._cond:
                self._used -= size
                self._cond.notify_all()
            if size >= TRIM_MIN_BYTES:
                release_free_memory()
