"""The machine's own limits, measured in a directory of the filesystem under test.

* ``seq_write``: a new file written sequentially in pieces (default 64 MiB in 1 MiB
  pieces) then ``fsync``; MiB/s over the whole write+fsync.
* ``append_fsync``: median latency of appending a small piece (1 KiB) to a file and
  ``fsync``-ing it.
* ``memcpy``: NumPy copy of a buffer (16 MiB) into a preallocated one; MiB/s of the
  median repetition (the best is reported too).

Plain ``os`` calls on purpose: these are the baselines the store is compared with.
Imports nothing of straw, so ``bench/store_worker.py`` may use it under any interpreter.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

MiB = 1024 * 1024


def _write_all(fd: int, buf: bytes | memoryview) -> None:
    view = memoryview(buf)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _new_file(directory: str, stem: str) -> tuple[str, int]:
    path = os.path.join(directory, f"{stem}-{os.getpid()}-{time.monotonic_ns()}")
    return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)


def seq_write(directory: str, *, total: int = 64 * MiB, piece: int = MiB) -> dict[str, Any]:
    """Write a new ``total``-byte file in ``piece``-byte writes, fsync it; MiB/s."""
    buf = os.urandom(piece)
    path, fd = _new_file(directory, "raw-seq")
    try:
        t0 = time.perf_counter()
        for _ in range(total // piece):
            _write_all(fd, buf)
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return {"mib_s": total / MiB / seconds, "seconds": seconds, "bytes": total}


def append_fsync(directory: str, *, size: int = 1024, count: int = 200,
                 warmup: int = 10) -> dict[str, Any]:
    """Median latency (ms) of appending ``size`` bytes to a file and fsync-ing it."""
    buf = os.urandom(size)
    path, fd = _new_file(directory, "raw-append")
    times = []
    try:
        for i in range(warmup + count):
            t0 = time.perf_counter()
            _write_all(fd, buf)
            os.fsync(fd)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"ms": statistics.median(times) * 1e3, "p90_ms": _quantile(times, 0.9) * 1e3,
            "count": count}


def memcpy(*, size: int = 16 * MiB, reps: int = 15) -> dict[str, Any]:
    """NumPy copy of a ``size``-byte buffer into a preallocated one; MiB/s."""
    src = np.frombuffer(os.urandom(size), dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the destination pages in
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return {"mib_s": size / MiB / statistics.median(times),
            "best_mib_s": size / MiB / min(times), "bytes": size}


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]
