"""Reading the catalog's log without its lock: replay of its frames into a
``CatalogState`` (a base frame's snapshot first), the read up to the clean end that
bounds memory by the data, and ``read_state``, the durable state as operator views see it
(``straw inspect``, ``straw gc --dry-run``).  The log's format is documented with its
writer, ``straw.catalog``; nothing here writes, truncates or locks."""

from __future__ import annotations

import os
from typing import Any

import msgpack
import xxhash

from ...durable import framing
from ...errors import CorruptData, UnsupportedSchema
from ...fs import Filesystem
from .snapshot import HEAD_NAME, decode_state, snapshot_gen
from .state import CATALOG_VERSION, CatalogState

CATALOG_NAME = "CATALOG"
_CLEAN_RUN = 8 << 10  # this many zero bytes after the frames: the clean end of the catalog
_READ_CHUNK = 16 << 10  # the first read of a refresh (doubled up to _MAX_READ while data)
_MAX_READ = 1 << 20


def read_to_clean_end(fs: Filesystem, fd: int, start: int) -> bytes:
    """The catalog from ``start`` up to its clean end: read in growing chunks until a
    short read (end of file; a size cached by another client may be stale, so the size is
    never trusted) or until the data read ends in ``_CLEAN_RUN`` zeros (the reserved
    tail, or a file extended with zeros by anyone: memory is bounded by the data, never
    by the file's size)."""
    out = bytearray()
    step = _READ_CHUNK
    while True:
        chunk = bytearray(step)
        n = fs.readinto(fd, chunk, start + len(out))
        out += memoryview(chunk)[:n]
        if n < step or out[-_CLEAN_RUN:] == bytes(_CLEAN_RUN):
            return bytes(out)
        step = min(step * 2, _MAX_READ)


def read_state(fs: Filesystem, root: str) -> CatalogState:
    """The catalog as it is durable now, read without its lock and without writing
    anything (operator views: ``straw inspect``, ``straw gc --dry-run``).  A torn final
    transaction is ignored here, not cut off (only a writer under the lock cuts, D6).  A
    compaction may run meanwhile (it deletes the snapshot this read was about to open):
    the read is retried a few times."""
    path = os.path.join(root, CATALOG_NAME)
    for attempt in range(_READ_ATTEMPTS):
        try:
            fd = fs.open(path)
        except FileNotFoundError:
            return CatalogState()
        try:
            data = read_to_clean_end(fs, fd, 0)
        finally:
            fs.close(fd)
        try:
            state = _replay(fs, root, data, path)
        except _SnapshotGone:
            if attempt == _READ_ATTEMPTS - 1:
                raise
            continue
        if state is not None:
            return state
        head = _read_head_file(fs, root)  # truncated by a compaction that died: roll on
        if head is None:
            return CatalogState()
        try:
            state = _replay(fs, root, head, os.path.join(root, HEAD_NAME))
        except _SnapshotGone:
            continue
        return state or CatalogState()
    raise CorruptData(f"catalog {path}: it kept changing while being read")


_READ_ATTEMPTS = 5


class _SnapshotGone(CorruptData):
    """The snapshot a base frame names does not exist (deleted by a newer compaction
    between reading the catalog and opening it, or lost)."""


def _read_head_file(fs: Filesystem, root: str) -> bytes | None:
    try:
        return fs.read_file(os.path.join(root, HEAD_NAME))
    except FileNotFoundError:
        return None


def load_snapshot(fs: Filesystem, root: str, op: dict[str, Any]
                   ) -> tuple[CatalogState, int, int]:
    """The state of the snapshot a ``base`` operation names, its generation, its size."""
    try:
        name, gen, want = op["snap"], op["gen"], op["digest"]
        if not isinstance(name, str) or snapshot_gen(name) != gen or "/" in name:
            raise TypeError(name)
    except (KeyError, TypeError):
        raise CorruptData(f"catalog {root}: malformed base operation {op!r}") from None
    path = os.path.join(root, name)  # a plain name in the pool root, never a path
    try:
        data = fs.read_file(path)
    except FileNotFoundError:
        raise _SnapshotGone(f"catalog {root}: the snapshot {name} its base frame names is "
                            "missing; restore the pool from a backup") from None
    return decode_state(data, path, gen=gen, want_digest=want), gen, len(data)


def _replay(fs: Filesystem, root: str, data: bytes, where: str) -> CatalogState | None:
    """The state held by catalog bytes ``data`` (a base frame loads its snapshot); None if
    they hold no frame at all."""
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    if not scan.frames:
        return None
    state = CatalogState()
    for f in scan.frames:
        if f.header.kind != framing.KIND_CATALOG:
            raise CorruptData(f"{where} offset {f.offset}: not a catalog frame")
        ops = decode_ops(f.body, f"{where} offset {f.offset}")
        if f.offset == 0 and ops and ops[0].get("op") == "base":
            state = load_snapshot(fs, root, ops[0])[0]
            ops = ops[1:]
        for op in ops:
            state.apply(op)
    return state


def state_upto(fs: Filesystem, root: str, head: bytes, end: int) -> CatalogState | None:
    """The state of the catalog's first ``end`` bytes, read without any lock (they are
    durable and only a compaction or a repair, under the lock, changes them); None if its
    first frame is no longer ``head`` (another client compacted meanwhile)."""
    path = os.path.join(root, CATALOG_NAME)
    fd = fs.open(path)
    try:
        data = fs.read_to_end(fd, 0, end)
    finally:
        fs.close(fd)
    if len(data) < end or data[:len(head)] != head:
        return None
    try:
        return _replay(fs, root, data, path) or CatalogState()
    except _SnapshotGone:
        return None  # a newer compaction deleted it meanwhile


def frame_tag(frame: bytes) -> int:
    """A frame's identity in a base frame's follow list (CS2)."""
    return xxhash.xxh3_64_intdigest(frame)


def decode_ops(body: Any, where: str) -> list[dict[str, Any]]:
    try:
        txn = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types
        raise CorruptData(f"{where}: transaction does not decode: {e}") from None
    if not isinstance(txn, dict) or not isinstance(txn.get("v"), int):
        raise CorruptData(f"{where}: not a catalog transaction")
    if txn["v"] > CATALOG_VERSION:
        raise UnsupportedSchema(f"{where}: catalog format version {txn['v']}; upgrade straw")
    ops = txn.get("ops")
    if not isinstance(ops, list):
        raise CorruptData(f"{where}: transaction without operations")
    return ops
