"""Operator repair of a damaged catalog (D6: fail closed, keep the bytes, collection waits
for the operator).

Fail closed and repair.  A damaged frame followed by a later group makes every catalog
operation (retain, release, collect, ...) raise ``CorruptData`` naming the offset and
``SharedFilesystemStore.repair_catalog()``.  ``Catalog.repair`` (under the pool lock) copies
the damaged bytes to ``CATALOG.damaged-<offset>-<n>`` (durable), then overwrites them IN
PLACE with one valid frame of exactly their length that holds a ``repaired`` operation
(and, if the damaged region is too short for it, the operations of the frames after it
that it had to absorb).  Every other frame keeps its offset and bytes, the inode never
changes (its flock is the pool lock), and a crash during the repair leaves the catalog
damaged (the repair is simply run again), never silently short.  Only the damaged
transaction is lost.  Then ``repaired`` is appended once more at the end, so that clients
that had replayed past the damage learn it too.  From then on ``collect`` refuses
(``UnsafeRecovery``) until an operator, having re-retained what must live, appends
``repair_confirmed`` (``SharedFilesystemStore.confirm_catalog_repair()``).
"""

from __future__ import annotations

import os
from typing import Any

import msgpack

from ...durable import framing
from ...errors import (
    CorruptData,
    storage_error,
)
from .log import CatalogLog, _CatalogDamaged
from .read import (
    CATALOG_NAME,
    decode_ops,
)
from .snapshot import (
    HEAD_NAME,
)
from .state import (
    CATALOG_VERSION,
)

_MAX_REPAIRS = 64


def repair(cat: CatalogLog) -> list[dict[str, Any]]:
    """Make a damaged catalog readable again; returns one report per damaged frame
    (offset, bytes lost, side file) — empty if the catalog was not damaged.

    Under the pool lock, for each damaged frame: its bytes are copied to a durable
    side file, then overwritten in place by a valid frame of the same length holding a
    ``repaired`` operation (see the module docstring); finally ``repaired`` is
    appended at the end for clients that replayed past the damage.  Collection then
    refuses until ``confirm_repairs``."""
    cat._check_process()  # before the mutex (ProcessBound)
    done: list[dict[str, Any]] = []
    with cat._mutex, cat._pool_lock():
        cat._reset()  # replay everything: this client may have replayed past it
        for _ in range(_MAX_REPAIRS):
            try:
                cat._refresh()
                break
            except _CatalogDamaged as e:
                done.append(_fill(cat, e.offset, e.later))
                cat._reset()
        else:
            raise CorruptData(f"catalog {cat.path}: more than {_MAX_REPAIRS} damaged "
                              "frames; restore the pool from a backup")
        ops = [{"op": "repaired", "at": r["offset"], "lost": r["lost_bytes"],
                "side": r["side_file"]} for r in done if not r.get("restored_from")]
        if ops:
            cat.append(ops)
    return done


def _fill(cat: CatalogLog, at: int, later: list[framing.ScannedFrame]) -> dict[str, Any]:
    """Replace the damaged bytes at ``at`` (up to the next valid frame) by one valid
    frame of the same length; absorb following frames (their operations go into it)
    only if the damaged region is too short to hold the ``repaired`` operation."""
    lost = later[0].offset - at
    n = 0
    while cat.fs.probe(os.path.join(cat.root, f"{CATALOG_NAME}.damaged-{at}-{n}")):
        n += 1
    side = f"{CATALOG_NAME}.damaged-{at}-{n}"
    repaired = {"op": "repaired", "at": at, "lost": lost, "side": side}
    absorbed: list[dict[str, Any]] = []
    end = later[0].offset
    head = cat._head_copy() if at == 0 else None
    if head is not None and len(head) == end:
        # the base frame itself is damaged: its durable copy restores it exactly,
        # nothing is lost (the copy is checked like the frame it replaces)
        _restore_head(cat, side, head)
        return {"offset": 0, "lost_bytes": 0, "side_file": side,
                "restored_from": HEAD_NAME}
    filler = _filler(at, end - at, [*absorbed, repaired])
    for f in later:
        if filler is not None or f.offset != end:
            break
        if f.header.kind != framing.KIND_CATALOG:
            raise CorruptData(f"{cat.path} offset {f.offset}: not a catalog frame")
        absorbed += decode_ops(f.body, f"{cat.path} offset {f.offset}")
        end = f.offset + f.header.frame_length
        filler = _filler(at, end - at, [*absorbed, repaired])
    if filler is None:
        raise CorruptData(f"catalog {cat.path}: cannot repair the damaged frame at "
                          f"offset {at}; restore the pool from a backup")
    fd = cat.fs.open(cat.path, write=True)
    try:
        read_at = framing.read_at_fn(cat.fs, fd)
        cat.fs.write_file_durable(os.path.join(cat.root, side), read_at(at, end - at))
        cat.fs.writev(fd, [filler], at)  # in place: a crash leaves it damaged, not short
        cat.fs.fsync(fd)
    except OSError as e:
        raise storage_error(e, f"cannot repair catalog {cat.path}") from e
    finally:
        cat.fs.close(fd)
    return {"offset": at, "lost_bytes": lost, "side_file": side}


def _restore_head(cat: CatalogLog, side: str, head: bytes) -> None:
    try:
        framing.decode_frame(head)
    except (framing.TornFrame, CorruptData) as e:
        raise CorruptData(f"catalog {cat.path}: its base frame and the copy "
                          f"{HEAD_NAME} are both damaged ({e}); restore the pool from a "
                          "backup") from None
    fd = cat.fs.open(cat.path, write=True)
    try:
        read_at = framing.read_at_fn(cat.fs, fd)
        cat.fs.write_file_durable(os.path.join(cat.root, side), read_at(0, len(head)))
        cat.fs.writev(fd, [head], 0)
        cat.fs.fsync(fd)
    except OSError as e:
        raise storage_error(e, f"cannot repair catalog {cat.path}") from e
    finally:
        cat.fs.close(fd)


def _filler(at: int, length: int, ops: list[dict[str, Any]]) -> bytes | None:
    """A valid catalog frame at ``at`` of exactly ``length`` bytes holding ``ops`` (padded
    with a ``pad`` field, which replay ignores), or None if ``ops`` do not fit."""
    for extra in ({}, {"q": 0}):  # "q" bridges the lengths a bin header size change skips
        txn: dict[str, Any] = {"v": CATALOG_VERSION, "ops": ops, **extra, "pad": b""}
        want = length - framing.HEADER_SIZE - len(msgpack.packb(txn, use_bin_type=True))
        for k in range(max(0, want - 4), want + 1):
            txn["pad"] = b"\xa5" * k  # not zeros: a zero run would read as the clean end
            body = msgpack.packb(txn, use_bin_type=True)
            if framing.HEADER_SIZE + len(body) == length:
                return framing.encode_frame(framing.KIND_CATALOG, body, group_start=at)
    return None
