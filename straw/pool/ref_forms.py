"""Other spellings of a reference: a pack named through an alias inside the pool, and
the stored tuple form journals and snapshots keep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..checks import short_repr
from ..errors import CorruptData
from .refs import RecordRef, RecordSetRef, SegmentRef, pack_path_run, record_set_ref

# --- aliases: another spelling of a pack's path -------------------------------------------
#
# A reference may name its pack through a symbolic link inside the pool (an operator's
# ``alias.pack`` -> ``runs/.../pack-000001.pack``, a linked directory, a chain of links),
# as straw-queue allows.  Such a reference is rewritten to the pack's one canonical path
# before anything else looks at it, so that reading, retaining, pinning and collecting
# all see one identity (a pack retained through an alias is the pack GC keeps).  The
# resolver (``ReadSession.resolve_alias``) refuses a link that leads outside the pool
# root; nothing is ever opened through the link (reads open the canonical path beneath
# the root with ``open_beneath``).  A canonical path costs nothing: no I/O.

AnyRef = Any  # SegmentRef | RecordRef | RecordSetRef, or anything (returned unchanged)


def canonical_ref(ref: AnyRef, resolve: Callable[[str], str]) -> AnyRef:
    """``ref`` with its pack path replaced by ``resolve(path)`` when that path is not
    canonical; ``ref`` itself otherwise (and for anything that is not a reference: the
    caller's checks refuse it)."""
    if isinstance(ref, SegmentRef):
        seg = ref
    elif isinstance(ref, RecordRef):
        seg = ref.segment
    elif isinstance(ref, RecordSetRef) and isinstance(ref.manifest, RecordRef):
        seg = ref.manifest.segment
    else:
        return ref
    if not isinstance(seg, SegmentRef) or not isinstance(seg.path, str) \
            or pack_path_run(seg.path) is not None:
        return ref
    path = resolve(seg.path)
    if path == seg.path:
        return ref
    moved = SegmentRef(seg.run_id, path, seg.segment_id, seg.size, seg.checksum,
                       seg.version, seg.checksum_algorithm, seg.offset)
    if isinstance(ref, SegmentRef):
        return moved
    if isinstance(ref, RecordRef):
        return RecordRef(moved, ref.ordinal)
    return RecordSetRef(ref.manifest, ref.digest, ref.records, ref.payload_bytes, ref.tokens,
                        segment=moved)


def alias_parts(path: str) -> list[str] | None:
    """The components of a relative alias path worth resolving, or None (absolute, empty
    components, ``.``/``..``, NUL: the reference's own check refuses it as it is)."""
    if not path or path.startswith("/") or "\0" in path:
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return parts


# The stored tuple form of a RecordSetRef (journal, snapshots, manifests' dependencies):
# (path, offset, size, checksum, digest, records, ordinal, payload_bytes, tokens).  The
# previous straw stored the first six only; its extents hold all their records themselves
# (ordinal = records) and did not record payload bytes or tokens: such a tuple decodes with
# ``payload_bytes = tokens = 0`` ("not recorded"), and reads do not check those two fields
# against an extent of that format (it has nothing to check them against).
RefTuple = tuple[Any, ...]


def ref_to_tuple(ref: RecordSetRef) -> RefTuple:
    return (ref.path, ref.offset, ref.size, ref.checksum, ref.digest, ref.records,
            ref.manifest.ordinal, ref.payload_bytes, ref.tokens)


def ref_identity(t: Sequence[Any]) -> tuple[Any, ...]:
    """What identifies a stored reference: its first six fields (the extent and the
    publication's digest and record count; the other three follow from the extent).
    Idempotency keys and request digests use this, so that they are the same for a
    reference the previous straw journaled and for the same reference now."""
    return tuple(t[:6])


def ref_from_tuple(run_id: str, t: Sequence[Any]) -> RecordSetRef:
    if len(t) == 6:
        path, offset, size, checksum, digest, records = t
        return record_set_ref(run_id, path, offset, size, checksum, digest, records,
                              records, 0, 0)
    if len(t) != 9:
        raise CorruptData(f"stored reference {short_repr(t)} has {len(t)} fields, not 6 or 9")
    return record_set_ref(run_id, *t)
