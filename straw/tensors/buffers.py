"""Recycled load buffers (``_BufferCache``) and the flat byte views reads land in."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np

from ..checks import check_count


def _byte_view(a: Any) -> memoryview:
    """A flat byte memoryview of a contiguous buffer (NumPy arrays included)."""
    return memoryview(a).cast("B")


class _BufferCache:
    """Recycled load buffers, so that a steady stream of loads does not page-fault.

    A fresh large allocation is an ``mmap`` whose every page faults, is zeroed by the
    kernel and, on a VM, may first have to be handed back by the host; that costs more
    than reading and verifying the tensor.  ``load()`` therefore takes its buffer from
    here: large slabs (at least ``MIN_BYTES``) that this cache owns.  Every array or
    tensor made from a slab keeps a reference to it (NumPy views reference their base,
    ``torch.from_numpy`` references the array), so a slab whose only reference is this
    cache's is unused and can be handed out again.  Tracked slabs total at most
    ``max_bytes`` (unused ones are dropped oldest first); ``set_load_buffer_cache(0)``
    turns the cache off.  Like any caching allocator it keeps up to ``max_bytes`` of
    unused memory around."""

    MIN_BYTES = 1 << 20

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.slabs: list[np.ndarray] = []
        self.lock = threading.Lock()

    @staticmethod
    def _refs(slab: np.ndarray) -> int:
        return sys.getrefcount(slab)

    def _free(self, i: int) -> bool:
        """Whether slab ``i`` is referenced by nothing but this cache (compared with the
        count of a slab that only the cache holds, measured once at start)."""
        return self._refs(self.slabs[i]) <= _UNUSED_REFS

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < self.MIN_BYTES or self.max_bytes <= 0:
            return np.empty(nbytes, dtype=np.uint8)
        with self.lock:
            for i in range(len(self.slabs)):
                if nbytes <= self.slabs[i].nbytes <= nbytes + (nbytes >> 2) \
                        and self._free(i):
                    slab = self.slabs.pop(i)
                    self.slabs.append(slab)  # most recently used last
                    return slab[:nbytes]
            size = -(-nbytes // self.MIN_BYTES) * self.MIN_BYTES
            total = sum(s.nbytes for s in self.slabs)
            i = 0
            while total + size > self.max_bytes and i < len(self.slabs):
                if self._free(i):
                    total -= self.slabs.pop(i).nbytes
                else:
                    i += 1
            if total + size > self.max_bytes:
                return np.empty(nbytes, dtype=np.uint8)
            slab = np.empty(size, dtype=np.uint8)
            self.slabs.append(slab)
            return slab[:nbytes]


def _unused_refs() -> int:
    probe = _BufferCache(0)
    probe.slabs.append(np.empty(1, dtype=np.uint8))
    return probe._refs(probe.slabs[0])


_UNUSED_REFS = _unused_refs()
_buffers = _BufferCache(512 << 20)


def set_load_buffer_cache(max_bytes: int) -> None:
    """Bound (in bytes) the memory of recycled ``load()`` buffers; 0 disables the cache."""
    check_count("max_bytes", max_bytes)
    with _buffers.lock:
        _buffers.max_bytes = max_bytes
        if max_bytes == 0:
            _buffers.slabs.clear()


def _reset_after_fork() -> None:
    """In a forked child: a lock another thread held at the fork stays held."""
    _buffers.lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
