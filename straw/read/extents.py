"""What a checked extent is, and the checks that tie a reference to one (D6).

An ``ExtentInfo`` is built only from a manifest that passed its checksum; every field of
a reference (size, checksum, digest, records, usage) must match the extent it names,
else ``InvalidReference`` naming the field.  A size no extent can have is refused before
anything is read for it.  These checks are pure: the reads live in ``extent_reader`` and
``visibility``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..durable import framing
from ..errors import CorruptData, ExtentMismatch, InvalidReference, UnsupportedSchema
from ..pool.pack import EXTENT_PREFIX
from ..pool.records import Manifest, RecordInfo, parse_metadata
from ..pool.ref_forms import ref_from_tuple
from ..pool.refs import RecordRef, RecordSetRef, SegmentRef

MANIFEST_CODEC = "record-set.v2"  # the codec the manifest ordinal reads back with


@dataclass(frozen=True)
class ExtentInfo:
    """The checked content of one extent: its own records (``local``, payloads at
    ``offsets``) or, for a ``record_set`` publication, its ``members`` (records of other
    extents with a copy of their manifest entries), the publication reference it holds,
    straw's ``Manifest`` of it, and the entry of its manifest ordinal."""

    segment: SegmentRef
    version: int
    api: str
    local: tuple[RecordInfo, ...]
    offsets: tuple[int, ...]
    members: tuple[tuple[RecordRef, RecordInfo], ...]
    ref: RecordSetRef
    manifest: Manifest
    payload_start: int  # where the payloads begin in the extent body

    @property
    def manifest_info(self) -> RecordInfo:
        """The entry of the manifest ordinal (built on demand: reads rarely ask)."""
        mjson = manifest_json(self.manifest)
        return RecordInfo(f"manifest:{self.ref.digest}", MANIFEST_CODEC, {}, 0, len(mjson),
                          framing.hash_buffers([mjson]).hex())


def manifest_dict(m: Manifest) -> dict[str, Any]:
    """straw-queue's manifest shape (``store.manifest``)."""
    return {"version": 2, "digest": m.ref.digest,
            "records": [r.to_dict() for r in m.record_refs],
            "dependencies": [d.to_dict() for d in m.dependencies]}


def manifest_json(m: Manifest) -> bytes:
    """The manifest ordinal's payload: ``manifest_dict`` as canonical JSON."""
    return json.dumps(manifest_dict(m), sort_keys=True, separators=(",", ":")).encode()


def envelope_dict(info: RecordInfo) -> dict[str, Any]:
    """straw-queue's record envelope shape (``inspect_segment``, ``envelope``); the
    checksum is our xxh3-128 hex of the payload."""
    return {"record_id": info.record_id, "codec": info.codec,
            "metadata": dict(info.metadata), "tokens": info.tokens or 0,
            "length": info.length, "checksum": info.checksum, "version": 1}


def needs(seg: SegmentRef, m: Manifest) -> list[SegmentRef]:
    """The publications a manifest's extent needs (``ReadSession.needs``)."""
    out = {(d.path, d.offset): d.segment for d in m.dependencies}
    out.update(((r.segment.path, r.segment.offset), r.segment) for r in m.record_refs)
    out.pop((seg.path, seg.offset), None)
    return list(out.values())


def check_extent_size(seg: SegmentRef) -> None:
    """Refuse a size no extent can have before anything is read for it (a shorter read
    would parse as a torn frame, which is not an answer about a reference)."""
    if seg.size < framing.HEADER_SIZE + EXTENT_PREFIX.size:
        raise ExtentMismatch(
            f"{seg!r}: size {seg.size} is too small to be an extent (at least "
            f"{framing.HEADER_SIZE + EXTENT_PREFIX.size} bytes); the reference is edited: "
            "use the reference publish returned")


def check_frame(ref: SegmentRef | RecordSetRef, header: framing.FrameHeader) -> None:
    """The authenticated frame header at ``ref``'s offset must be an extent of its size
    (``ExtentMismatch``) and checksum (``InvalidReference``)."""
    where = f"{ref.path} offset {ref.offset}"
    if header.kind != framing.KIND_EXTENT or header.frame_length != ref.size:
        raise ExtentMismatch(
            f"{ref!r} does not match the frame at {where} (the frame there holds "
            f"{header.frame_length} bytes); the reference is edited or stale: use the "
            "reference publish returned")
    if header.body_hash.hex() != ref.checksum:
        raise InvalidReference(
            f"{ref!r}: checksum differs from the extent at {where} (stale or edited "
            "reference)"
        )


def match(ref: RecordSetRef, ext: ExtentInfo) -> None:
    """Every field of a publication reference must be the extent's (D6)."""
    if ref == ext.ref:
        return
    for name in ("digest", "records", "payload_bytes", "tokens"):
        if getattr(ref, name) != getattr(ext.ref, name):
            raise InvalidReference(
                f"{ref!r}: {name} is {getattr(ref, name)!r}, the publication's is "
                f"{getattr(ext.ref, name)!r} (usage or digest of another publication); "
                "the reference is edited or stale: use the reference publish returned")
    raise InvalidReference(
        f"{ref!r}: its manifest is ordinal {ext.ref.manifest.ordinal} of the extent, "
        f"not {ref.manifest.ordinal}; the reference is edited")


def extent_info(seg: SegmentRef, raw: dict[str, Any], payload_start: int,
                body_length: int) -> ExtentInfo:
    """The ``ExtentInfo`` of the extent at ``seg`` from its decoded, authenticated
    manifest ``raw`` (its payloads start ``payload_start`` bytes into a body of
    ``body_length``): ``CorruptData`` for a manifest that contradicts itself,
    ``InvalidReference`` for an extent of another run."""
    where = f"{seg.path} offset {seg.offset}"
    if raw.get("run") != seg.run_id:
        raise InvalidReference(f"{seg!r}: the extent belongs to run {raw.get('run')!r}")
    local = []
    offsets = []
    pos = seg.offset + framing.HEADER_SIZE + payload_start
    for i, (rid, codec, meta, tokens, length, h) in enumerate(raw["recs"]):
        local.append(RecordInfo(rid, codec, parse_metadata(meta, f"{where} record {i}"),
                                tokens, length, h.hex()))
        offsets.append(pos)
        pos += length
    if pos != seg.offset + framing.HEADER_SIZE + body_length:
        raise CorruptData(f"{where}: the manifest's records do not fill the extent")
    members = _members(seg, raw, where)
    deps = _dependencies(seg, raw, where)
    digest = raw["digest"].hex()
    ref = RecordSetRef(RecordRef(seg, len(local)), digest, len(members) or len(local),
                       raw.get("pb", 0), raw.get("tok", 0))
    if members:
        infos = tuple(info for _, info in members)
        rrefs = tuple(r for r, _ in members)
    else:
        infos = tuple(local)
        rrefs = tuple(RecordRef(seg, i) for i in range(len(local)))
    manifest = Manifest(ref, raw["sub"], infos, tuple(deps), rrefs)
    return ExtentInfo(seg, raw["v"], raw.get("api", "publish"), tuple(local),
                      tuple(offsets), tuple(members), ref, manifest, payload_start)


def _members(seg: SegmentRef, raw: dict[str, Any], where: str
             ) -> list[tuple[RecordRef, RecordInfo]]:
    """A ``record_set`` manifest's members: references to records of other extents,
    with the copy of their entries."""
    members = []
    for i, (p, o, s, c, ordinal, rid, codec, meta, tokens, length, h) in \
            enumerate(raw.get("mems", ())):
        try:
            mref = RecordRef(SegmentRef.at(seg.run_id, p, o, s, c.hex()), ordinal)
            mref.check()
        except (InvalidReference, UnsupportedSchema) as e:
            raise CorruptData(f"{where}: member {i} is not a valid reference: {e}") from None
        members.append((mref, RecordInfo(
            rid, codec, parse_metadata(meta, f"{where} member {i}"), tokens, length,
            h.hex())))
    return members


def _dependencies(seg: SegmentRef, raw: dict[str, Any], where: str) -> list[RecordSetRef]:
    """The publications a manifest names as its dependencies."""
    deps = []
    for d in raw["deps"]:
        try:
            dep = ref_from_tuple(seg.run_id, [d[0], d[1], d[2], d[3].hex(), d[4].hex(),
                                              *d[5:]])
            dep.check()
        except (InvalidReference, UnsupportedSchema) as e:
            raise CorruptData(f"{where}: dependency is not a valid reference: {e}") from None
        deps.append(dep)
    return deps
