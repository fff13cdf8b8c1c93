"""Atomic, durable JSON reports (straw-queue 0.1.6's ``straw.reporting.write_report``).

A report is canonical JSON (sorted keys, no spaces, UTF-8, no NaN: the bytes
``canonical_json`` returns), written whole or not at all: a temporary file in the same
directory, fsync, rename over the name, fsync of the directory (D1: a new name is durable
only after its directory is).  A reader sees the previous report or the new one, never a
prefix.  Everything goes through ``straw.fs.Filesystem``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .fs import Filesystem, PosixFS


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON bytes: the same bytes straw-queue's ``encode`` gives
    (sorted keys, compact separators, non-ASCII kept as UTF-8).  ``ValueError`` for NaN or
    infinity, ``TypeError`` for a value JSON cannot hold (both before anything is
    written)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def write_report(path: str | os.PathLike[str], value: Any, *,
                 fs: Filesystem | None = None) -> None:
    """Replace the file at ``path`` with ``value`` as canonical JSON, atomically and
    durably; missing parent directories are created (durably)."""
    data = canonical_json(value)  # a value that cannot be encoded writes nothing
    fs = fs or PosixFS()
    target = os.path.abspath(os.fspath(path))
    fs.makedirs_durable(os.path.dirname(target))
    fs.write_file_durable(target, data)


__all__ = ["canonical_json", "write_report"]
