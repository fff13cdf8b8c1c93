"""Catalog snapshots: the encoding of a ``CatalogState`` and the files that hold it.

Role: the pure half of catalog compaction (``Catalog.compact`` in ``straw.catalog`` does the
I/O and the ordering, invariant **CS1**).  Recovery of the catalog follows D9: the latest
durable snapshot plus the suffix of the catalog after it, so a client's open costs the live
state, not the history of owner changes.

Files beside ``CATALOG`` (the catalog itself is never replaced: its ``flock`` is the pool
lock)::

    CATALOG.snap-<gen:08d>-<token>   ONE catalog frame: the whole state at compaction time
    CATALOG.head                     a copy of the catalog's current first frame (the base
                                     frame), written before the catalog is truncated
    *.tmp.*                          a file being written (ignored, deleted by cleanup)

The *base frame* is the catalog's first frame after a compaction: one transaction whose
first operation is ``base {gen, snap, digest}`` (the snapshot's generation, file name and the
xxh3-128 of its whole content), followed by the operations appended while the snapshot was
being written (the *suffix*, carried inline).  A catalog whose first operation is ``init``
is generation 0 (never compacted).

The snapshot encodes the state exactly (decoding gives a state equal to the one replayed
from the operations), in a compact form: extent offsets are packed little-endian u64
arrays grouped by pack path, so a million extents decode with a few C-level calls.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ...durable import framing
from ...errors import CorruptData, UnsupportedSchema
from .roots import OffsetSet, RootSet, SortedOffsets, le_u64
from .state import CatalogState, PackInfo

SNAPSHOT_VERSION = 1
SNAP_PREFIX = "CATALOG.snap-"
HEAD_NAME = "CATALOG.head"


def snapshot_name(gen: int, token: str) -> str:
    """A unique name: two clients compacting at once never write the same file."""
    return f"{SNAP_PREFIX}{gen:08d}-{token}"


def snapshot_gen(name: str) -> int | None:
    """The generation of a snapshot file name (None if it is not one: temp files too)."""
    if not name.startswith(SNAP_PREFIX) or ".tmp." in name:
        return None
    gen, _, token = name[len(SNAP_PREFIX):].partition("-")
    return int(gen) if gen.isdigit() and token else None


def _grouped(roots: RootSet) -> list[list[Any]]:
    return [[p, data] for p, data in roots.packed()]


def _offsets(data: bytes, where: str) -> SortedOffsets:
    try:
        return SortedOffsets.from_le_bytes(data)
    except (TypeError, ValueError) as e:
        raise CorruptData(f"{where}: {e}") from None


def encode_state(state: CatalogState, gen: int) -> bytes:
    """The snapshot file's content: one catalog frame holding ``state``."""
    packs = [[path, info.state == "sealed", info.tombstoned, info.unlinked,
              le_u64(info.offsets), le_u64(info.unstaged)]
             for path, info in state.packs.items()]
    edges = [[src[0], src[1], [list(d) for d in deps]] for src, deps in state.edges.items()]
    owners = [[run, name, _grouped(roots)] for (run, name), roots in state.owners.items()]
    body = msgpack.packb({
        "v": SNAPSHOT_VERSION, "snapshot": gen, "packs": packs, "edges": edges,
        "owners": owners,
        "epochs": [[run, name, e] for (run, name), e in state.owner_epochs.items()],
        "v1": [[name, key[0], key[1]] for name, key in state.v1_owners.items()],
        "repairs": sorted(state.unconfirmed_repairs),
    }, use_bin_type=True)
    return framing.encode_frame(framing.KIND_CATALOG, body, group_start=0)


def digest(data: bytes) -> bytes:
    return framing.hash_buffers([data])


def decode_state(data: bytes, where: str, *, gen: int, want_digest: bytes) -> CatalogState:
    """The state a snapshot file holds; ``CorruptData`` if it is not exactly the file the
    base frame names (digest), incomplete or damaged: a snapshot is durable before any
    catalog frame names it, so damage is corruption, never a torn tail (D6)."""
    if digest(data) != want_digest:
        raise CorruptData(f"{where}: snapshot content does not match the digest its catalog "
                          "base frame recorded (damaged or replaced); restore the pool "
                          "from a backup")
    try:
        header, body = framing.decode_frame(data)
        if header.kind != framing.KIND_CATALOG or header.frame_length != len(data):
            raise CorruptData("not one catalog frame")
        snap = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (framing.TornFrame, CorruptData, ValueError, msgpack.UnpackException) as e:
        raise CorruptData(f"{where}: not a catalog snapshot ({e})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("v"), int):
        raise CorruptData(f"{where}: not a catalog snapshot")
    if snap["v"] > SNAPSHOT_VERSION:
        raise UnsupportedSchema(f"{where}: catalog snapshot version {snap['v']}; this straw "
                                f"reads up to {SNAPSHOT_VERSION}. Upgrade straw")
    if snap.get("snapshot") != gen:
        raise CorruptData(f"{where}: snapshot of generation {snap.get('snapshot')}, the "
                          f"catalog names generation {gen}")
    st = CatalogState()
    try:
        for path, sealed, tomb, unlinked, offs, unstaged in snap["packs"]:
            st.packs[path] = PackInfo(
                state="sealed" if sealed else "open",
                offsets=_offsets(offs, where),
                unstaged=OffsetSet.from_base(_offsets(unstaged, where)), tombstoned=tomb,
                unlinked=unlinked)
        for path, off, deps in snap["edges"]:
            st.edges[(path, off)] = tuple((p, o) for p, o in deps)
            st.edge_offsets.setdefault(path, set()).add(off)
        for run, name, groups in snap["owners"]:
            st.owners[(run, name)] = RootSet.from_packs(
                {path: _offsets(offs, where) for path, offs in groups})
        for run, name, epoch in snap["epochs"]:
            st.owner_epochs[(run, name)] = epoch
        for name, run, oname in snap["v1"]:
            st.v1_owners[name] = (run, oname)
        st.unconfirmed_repairs.update(snap["repairs"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptData(f"{where}: malformed catalog snapshot ({e!r})") from None
    return st


__all__ = ["HEAD_NAME", "SNAP_PREFIX", "decode_state", "digest", "encode_state",
           "snapshot_gen", "snapshot_name"]
