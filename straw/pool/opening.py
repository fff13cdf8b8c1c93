"""Opening a pool: the declared deployment checked against the mount, the pool's format
marker created once and checked, and the pool's identity learned.

The marker ``<root>/POOL`` names the format (``UnsupportedSchema`` if newer) and the pool's
id, a random id written once by its creator that tells this pool from any other (two pools
may hold the same run id).  ``<root>/ONLINE_GC`` is present once a store opened the pool
with ``online_gc=True``.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from ..backend import FilesystemBackend
from ..clock import Clock
from ..errors import StorageUnavailable, UnsupportedSchema
from ..fs import Filesystem
from .pack import storage_error

POOL_FORMAT = 1

# created in the pool root by a store opened with online_gc=True (``mark_online_gc``)
ONLINE_GC_MARKER = "ONLINE_GC"


def _marker_body(info: Mapping[str, Any]) -> bytes:
    """The pool marker: ``info`` (an older marker's fields, kept) with the format, version
    and a new pool id."""
    body = {**info, "format": "straw-pool", "version": POOL_FORMAT,
            "pool_id": uuid.uuid4().hex}
    return json.dumps(body).encode()


def _parse_marker(data: bytes) -> dict[str, Any] | None:
    """The marker's fields, or None when it is empty, zeroed or torn."""
    try:
        info = json.loads(data)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _check_marker(marker: str, root: str, info: Mapping[str, Any]) -> None:
    if info.get("format") != "straw-pool" or not isinstance(info.get("version"), int):
        raise UnsupportedSchema(f"{marker} is not a straw pool marker: {dict(info)!r}")
    if info["version"] > POOL_FORMAT:
        raise UnsupportedSchema(
            f"pool {root} has format version {info['version']}; this straw reads "
            f"up to {POOL_FORMAT}. Upgrade straw"
        )
    pool_id = info.get("pool_id")
    if pool_id is not None and (not isinstance(pool_id, str) or not pool_id):
        raise UnsupportedSchema(f"{marker}: pool_id {pool_id!r} is not a pool id")


def mark_online_gc(fs: Filesystem, root: str) -> None:
    """A pool a store opened with ``online_gc=True`` is managed by online GC, as
    straw-queue's is once its shared catalog exists: the offline tools of
    ``straw.inspect`` refuse it from then on (its stores collect their garbage
    themselves).  The marker is written once, durably, and never removed."""
    path = os.path.join(root, ONLINE_GC_MARKER)
    try:
        if not fs.probe(path):
            fs.write_file_durable(path, b"opened with online_gc=True: straw.inspect's "
                                       b"offline inspection and cleanup refuse this pool\n")
    except OSError as e:
        raise storage_error(e, f"cannot mark pool {root} as managed by online GC "
                            f"({path})") from e


def check_backend(fs: Filesystem, root: str, backend: object) -> FilesystemBackend:
    """The declared deployment, checked against the live mount before the pool is
    touched (``DeploymentMismatch``: nothing written)."""
    if backend is None:
        return FilesystemBackend(root)
    if not isinstance(backend, FilesystemBackend):
        raise TypeError(f"backend must be a straw.backend.FilesystemBackend, got "
                        f"{type(backend).__name__}")
    if not backend.serves(root):
        raise ValueError(f"backend root {backend.root} differs from the store root "
                         f"{root}; build the backend for the pool's root")
    backend.verify(fs)
    return backend


def open_pool(fs: Filesystem, root: str, clock: Clock, visibility: tuple[int, float]
              ) -> str | None:
    """Create the pool marker once, check its format; the pool's id (None only for an
    older pool on a read-only mount).

    The marker is created exclusively (never renamed over a name other clients may
    have cached) and its creator writes the pool's id into it: a random id, written
    once, that tells this pool from any other (two pools may hold the same run id; a
    ``TensorRef`` compares ids before reading, see ``straw.tensor``).  A marker
    without an id (a pool of an older straw) or one a crash left empty or torn is
    completed by ``complete_marker`` under the marker's lock, so that concurrent
    clients agree on one id."""
    marker = os.path.join(root, "POOL")
    retries, delay = visibility
    try:
        for _ in range(retries + 3):
            try:
                data = fs.read_file(marker)
            except FileNotFoundError:
                fs.makedirs_durable(root)
                try:
                    fd = fs.open(marker, write=True, create=True, exclusive=True)
                except FileExistsError:
                    # another client created it; its name may not be visible to our
                    # lookups yet (a shared filesystem's entry cache): wait, reread
                    clock.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                try:
                    fs.writev(fd, [_marker_body({})], 0)
                    fs.fsync(fd)
                finally:
                    fs.close(fd)
                fs.fsync_dir(root)
                continue
            info = _parse_marker(data)
            if info is None or "pool_id" not in info:
                info = complete_marker(fs, marker)
            break
        else:
            raise StorageUnavailable(f"pool marker {marker} did not become readable")
    except OSError as e:
        raise storage_error(e, f"cannot open pool {root}") from e
    _check_marker(marker, root, info)
    return info.get("pool_id")


def complete_marker(fs: Filesystem, marker: str) -> dict[str, Any]:
    """The marker's content once it names the pool's id, under its lock: the first
    client to hold the lock writes the id, every later one reads it.  An empty,
    zeroed or torn marker (our own creation cut short by a crash) is rewritten whole.
    A marker of another format or a newer version is returned untouched (the caller
    refuses it).  On a read-only mount an older pool's marker cannot take an id: the
    pool opens without one (``pool_id`` None; references then cannot be told from
    another pool's of the same run, as before)."""
    try:
        fd = fs.open(marker, write=True)
    except PermissionError:
        return _parse_marker(fs.read_file(marker)) or {}
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        return _parse_marker(fs.read_file(marker)) or {}
    try:
        fs.lock(fd)
        try:
            info = _parse_marker(fs.read_to_end(fd))
            if info is not None and ("pool_id" in info or info.get("format") !=
                                     "straw-pool" or not isinstance(info.get("version"),
                                                                    int)
                                     or info["version"] > POOL_FORMAT):
                return info
            body = _marker_body(info or {})
            fs.truncate(fd, 0)
            fs.writev(fd, [body], 0)
            fs.fsync(fd)
            return json.loads(body)  # type: ignore[no-any-return]
        finally:
            fs.unlock(fd)
    finally:
        fs.close(fd)
