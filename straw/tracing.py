"""Optional I/O traces without payloads (straw-queue 0.1.6's ``straw.tracing.emit``).

Set ``STRAW_TRACE_DIR`` before the process starts tracing; each process then appends one
JSON line per traced operation to ``<dir>/<host>-<pid>.jsonl``.  Without the variable
``emit`` returns at once.  ``python -m straw.benchmark profile --trace DIR`` turns the
traces into a workload profile.

An event: ``op`` (``write`` for a publication, ``read``, ``read_range``), ``time`` (wall
clock, seconds), ``pid``, ``host``, ``root``, ``bytes``, ``seconds``, optionally
``checked_bytes`` (bytes a read verified) and ``records`` (per record: ``bytes``,
``codec``, ``tokens`` and the ``shape``/``dtype``/``kind`` of tensor metadata).  Never a
payload byte nor any other metadata value: traces may be shared.

Traces are observational, not part of durability: lines are appended without fsync, and
a trace that cannot be written (full disk, a read-only directory) switches tracing off
for the process with a warning instead of failing the traced operation.  Writes go
through ``straw.fs.Filesystem``.  After a fork the child opens its own file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from .fs import Filesystem, PosixFS

ENV = "STRAW_TRACE_DIR"
TENSOR_KEYS = ("shape", "dtype", "kind")

log = logging.getLogger("straw.tracing")


class _Trace:
    """This process's trace file: opened on first use, reopened after a fork or when
    ``STRAW_TRACE_DIR`` changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fs: Filesystem = PosixFS()
        self.key: tuple[int, str] | None = None  # (pid, directory) the file belongs to
        self.fd: int | None = None
        self.offset = 0
        self.failed: tuple[int, str] | None = None  # tracing switched off for this key

    def write(self, directory: str, line: bytes) -> None:
        key = (os.getpid(), directory)
        with self.lock:
            if key == self.failed:
                return
            try:
                if self.key != key:
                    self._open(key)
                assert self.fd is not None
                self.offset += self.fs.writev(self.fd, [line], self.offset)
            except OSError as e:
                self.failed = key
                log.warning("straw: tracing to %s stopped for this process: %s", directory, e)

    def _open(self, key: tuple[int, str]) -> None:
        if self.fd is not None and self.key is not None and self.key[0] == key[0]:
            self.fs.close(self.fd)  # our own file of another directory (a fork's is not ours)
        self.fd = None
        pid, directory = key
        self.fs.makedirs(os.path.abspath(directory))
        path = os.path.join(os.path.abspath(directory), f"{socket.gethostname()}-{pid}.jsonl")
        fd = self.fs.open(path, write=True, create=True)
        self.fd, self.key, self.offset = fd, key, self.fs.fstat(fd).size


_trace = _Trace()


def _record(record: Any) -> dict[str, Any]:
    payload = getattr(record, "payload", b"")
    # nbytes: memoryviews and arrays (len would count rows); len: bytes
    size = int(payload.nbytes) if hasattr(payload, "nbytes") else len(payload)
    out: dict[str, Any] = {"bytes": size, "codec": getattr(record, "codec", None),
                           "tokens": getattr(record, "tokens", None)}
    metadata = getattr(record, "metadata", None)
    if isinstance(metadata, dict):
        out.update({k: metadata[k] for k in TENSOR_KEYS if k in metadata})
    return out


def emit(operation: str, *, root: Any, size: int, seconds: float,
         records: Iterable[Any] | None = None, checked_bytes: int | None = None) -> None:
    """Append one event to this process's trace (nothing without ``STRAW_TRACE_DIR``)."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    event: dict[str, Any] = {"op": operation, "time": time.time(), "pid": os.getpid(),
                             "host": socket.gethostname(), "root": str(root), "bytes": size,
                             "seconds": seconds}
    if checked_bytes is not None:
        event["checked_bytes"] = checked_bytes
    if records is not None:
        event["records"] = [_record(r) for r in records]
    _trace.write(directory, (json.dumps(event, separators=(",", ":")) + "\n").encode())


def enabled() -> bool:
    """Is tracing on (``STRAW_TRACE_DIR`` set)?  Lets a caller skip building an event."""
    return bool(os.environ.get(ENV))


__all__ = ["ENV", "emit", "enabled"]
