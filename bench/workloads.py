"""The store workloads, written once for both implementations.

``bench.bench`` runs them in process against straw; ``bench/store_worker.py`` runs them in
a subprocess against either straw or straw-queue (whose import name is also ``straw``,
so each lives in its own interpreter).  This module imports neither at module level and
uses no relative imports, so the worker can load it as a plain module next to it.

Each workload opens a fresh store in a fresh directory, publishes one untimed warm-up
publication (it creates the writer and the first pack), times the steady state, and
returns plain JSON-able numbers.  Payloads are ``bytes`` for both implementations.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024
RUN_ID = "bench"


@dataclass(frozen=True)
class Impl:
    """How to drive one implementation: open a store, make a record, read a reference."""

    name: str
    version: str
    module_file: str | None
    make_store: Callable[..., Any]  # (root, fs=None) -> store
    record: Callable[[str, bytes], Any]
    read: Callable[[Any, Any], list[Any]]


def ours() -> Impl:
    """straw (this repository), through ``SharedFilesystemStore`` with its defaults."""
    import straw

    if hasattr(straw, "_native") or not hasattr(straw, "ReadSession"):
        raise RuntimeError(f"'straw' here ({straw.__file__}) is not this repository's straw")

    def make_store(root: str, fs: Any = None) -> Any:
        return straw.SharedFilesystemStore(root, RUN_ID, fs=fs)

    return Impl("straw", straw.__version__, straw.__file__, make_store, straw.Record,
                lambda store, ref: store.read(ref))


def peer() -> Impl:
    """straw-queue (the Rust-core peer), through its ``SharedFilesystemStore`` defaults."""
    import importlib
    import importlib.metadata

    straw = importlib.import_module("straw")
    if not hasattr(straw, "store") or not hasattr(straw.store, "NativeStore"):
        raise RuntimeError(f"'straw' here ({straw.__file__}) is not straw-queue")

    def make_store(root: str, fs: Any = None) -> Any:
        if fs is not None:
            raise ValueError("straw-queue takes no Filesystem")
        return straw.SharedFilesystemStore(root, RUN_ID)

    return Impl("straw-queue", importlib.metadata.version("straw-queue"), straw.__file__,
                make_store, straw.Record, lambda store, ref: list(store.read(ref)))


_PAYLOADS: dict[tuple[int, int], list[bytes]] = {}


def payloads(size: int, count: int) -> list[bytes]:
    """``count`` distinct random payloads of ``size`` bytes (made once per process)."""
    key = (size, count)
    if key not in _PAYLOADS:
        _PAYLOADS[key] = [os.urandom(size) for _ in range(count)]
    return _PAYLOADS[key]


class _Window:
    """Calls of a counting filesystem (``bench.counting.CountingFS``) inside a window."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self.before = counter.snapshot() if counter is not None else None

    def calls(self) -> dict[str, int] | None:
        return None if self.counter is None else self.counter.delta(self.before)


def _syncs(calls: dict[str, int] | None, n: int) -> float | None:
    if calls is None:
        return None
    return sum(calls.get(m, 0) for m in ("fsync", "fdatasync", "fsync_dir")) / n


def publish_large(impl: Impl, root: str, *, size: int = 16 * MiB, count: int = 4,
                  counter: Any = None) -> dict[str, Any]:
    """``count`` publications of one ``size``-byte record each; payload MiB/s."""
    data = payloads(size, count)
    store = impl.make_store(root, fs=counter)
    try:
        store.publish([impl.record("warm", data[0])], submission_id="warm")
        win = _Window(counter)
        times = []
        for i in range(count):
            rec = impl.record(f"r{i}", data[i])
            t0 = time.perf_counter()
            store.publish([rec], submission_id=f"large-{i}")
            times.append(time.perf_counter() - t0)
        calls = win.calls()
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"mib_s": size * count / MiB / sum(times), "seconds": sum(times),
            "per_publication_s": times, "calls": calls, "syncs_per_publication":
            _syncs(calls, count)}


def publish_small(impl: Impl, root: str, *, size: int = 1024, count: int = 200,
                  warmup: int = 20, counter: Any = None) -> dict[str, Any]:
    """``count`` publications of one ``size``-byte record each; median latency (ms)."""
    data = payloads(size, 16)
    store = impl.make_store(root, fs=counter)
    try:
        for i in range(warmup):
            store.publish([impl.record("warm", data[i % 16])], submission_id=f"warm-{i}")
        records = [impl.record(f"r{i}", data[i % 16]) for i in range(count)]
        win = _Window(counter)
        times = []
        for i, rec in enumerate(records):
            t0 = time.perf_counter()
            store.publish([rec], submission_id=f"small-{i}")
            times.append(time.perf_counter() - t0)
        calls = win.calls()
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    times.sort()
    return {"ms": statistics.median(times) * 1e3,
            "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3,
            "count": count, "calls": calls, "syncs_per_publication": _syncs(calls, count)}


def read_large(impl: Impl, root: str, *, size: int = 16 * MiB, count: int = 4,
               passes: int = 2) -> dict[str, Any]:
    """Checked reads of ``count`` publications of one ``size``-byte record, page cache
    warm (each is read once untimed first); payload MiB/s over ``passes`` timed passes."""
    data = payloads(size, count)
    store = impl.make_store(root)
    try:
        refs = [store.publish([impl.record(f"r{i}", data[i])], submission_id=f"read-{i}")
                for i in range(count)]
        for i, ref in enumerate(refs):  # check the content once
            got = list(impl.read(store, ref))
            if len(got) != 1 or bytes(got[0].payload) != data[i]:
                raise AssertionError(f"{impl.name}: read back differs from what was published")
            del got
        for ref in refs:  # warm pass: page cache and the allocator in their steady state
            got = list(impl.read(store, ref))
            del got
        times = []
        for _ in range(passes):
            for ref in refs:
                t0 = time.perf_counter()
                got = list(impl.read(store, ref))
                times.append(time.perf_counter() - t0)
                del got
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"mib_s": size * len(times) / MiB / sum(times), "seconds": sum(times),
            "per_read_s": times}
