"""Editing references in tests (hostile-reference and input-error tests forge them).

References now nest (``RecordSetRef.manifest.segment``), so ``dataclasses.replace`` of a
location field no longer works on the outer object: ``edited`` takes the flat field names
(``path``, ``offset``, ``size``, ``checksum``, ``run_id`` of the extent, and the
publication's own ``digest``, ``records``, ``payload_bytes``, ``tokens``, ``ordinal``) and
rebuilds the reference.  The segment id follows an edited path or offset (pass
``segment_id=`` to forge it too), so the edit is caught by the field it changes."""

from __future__ import annotations

import dataclasses
from typing import Any

from straw.refs import RecordRef, RecordSetRef, SegmentRef, segment_id_of

_SEGMENT = ("run_id", "path", "offset", "size", "checksum", "segment_id", "version",
            "checksum_algorithm")


def edited_segment(seg: SegmentRef, **changes: Any) -> SegmentRef:
    path, offset = changes.get("path", seg.path), changes.get("offset", seg.offset)
    if ("path" in changes or "offset" in changes) and "segment_id" not in changes \
            and isinstance(path, str) and path.count("/") >= 3 and path.endswith(".pack") \
            and type(offset) is int:
        changes["segment_id"] = segment_id_of(path, offset)
    # (anything else keeps the original id: the edited field is refused first anyway)
    return dataclasses.replace(seg, **changes)


def edited(ref: Any, **changes: Any) -> Any:
    seg_changes = {k: changes.pop(k) for k in list(changes) if k in _SEGMENT}
    if isinstance(ref, SegmentRef):
        return edited_segment(ref, **seg_changes)
    if isinstance(ref, RecordRef):
        seg = edited_segment(ref.segment, **seg_changes) if seg_changes else ref.segment
        return dataclasses.replace(ref, segment=seg, **changes)
    assert isinstance(ref, RecordSetRef), ref
    manifest = ref.manifest
    if seg_changes:
        manifest = dataclasses.replace(manifest, segment=edited_segment(manifest.segment,
                                                                        **seg_changes))
    if "ordinal" in changes:
        manifest = dataclasses.replace(manifest, ordinal=changes.pop("ordinal"))
    return dataclasses.replace(ref, manifest=manifest, **changes)


def payload_at(store: Any, rref: RecordRef) -> tuple[str, int, int]:
    """(pack path, absolute payload offset, length) of a record, from its checked
    manifest (what the old RecordRef carried itself)."""
    info, path, offset = store._session.payload_location(rref)
    return path, offset, info.length
