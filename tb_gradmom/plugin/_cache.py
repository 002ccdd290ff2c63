"""A thread-safe LRU cache with a byte budget, and single-flight loading.

TensorBoard serves requests from many threads. Decoded moment arrays and computed responses
are cached here under one byte budget so memory stays bounded whatever the logdir holds;
concurrent requests for the same missing key wait for one load instead of each decoding the
same tensors (which would multiply the transient memory by the number of clients).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

__all__ = ["ByteLRU", "nbytes"]


def nbytes(value) -> int:
    """An estimate of the memory a cached value holds (arrays, bytes, str, containers)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 112
    if isinstance(value, (bytes, bytearray, str)):
        return len(value) + 64
    if isinstance(value, dict):
        return 232 + sum(nbytes(k) + nbytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 64 + 8 * len(value) + sum(nbytes(v) for v in value)
    return sys.getsizeof(value)


class ByteLRU:
    """Least-recently-used cache holding at most ``budget_bytes`` (estimated with `nbytes`).

    A value bigger than the whole budget is returned to its caller but not kept.
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self._data: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._loading: dict[Hashable, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Hashable, default=None):
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value, size: int | None = None) -> None:
        size = nbytes(value) if size is None else int(size)
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= old[1]
            if size > self.budget_bytes:
                return
            self._data[key] = (value, size)
            self._size += size
            while self._size > self.budget_bytes and self._data:
                _, (_, s) = self._data.popitem(last=False)
                self._size -= s

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._size = 0

    def get_or_load(self, key: Hashable, load: Callable[[], object]):
        """The cached value, or ``load()`` run once even if many threads ask at the same time.

        Exceptions from ``load`` propagate to every waiting caller that retries it; nothing is
        cached for them.
        """
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        with self._lock:
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:
            value = self.get(key, _MISSING)
            if value is not _MISSING:
                return value
            try:
                value = load()
                self.put(key, value)
            finally:
                with self._lock:
                    if self._loading.get(key) is gate:
                        del self._loading[key]
        return value


_MISSING = object()
