"""straw-queue's reference shapes, as a straw-queue user handles them: dataclass fields in
its order with its defaults, ``dataclasses.asdict`` / ``from_dict`` round trips (through
JSON too), and the checks ``from_dict`` adds (unknown versions, odd or edited fields)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from straw import Record, RecordRef, RecordSetRef, SegmentRef, SharedFilesystemStore
from straw.errors import InvalidReference, UnsupportedSchema
from straw.refs import ref_from_tuple, ref_identity, ref_to_tuple


@pytest.fixture
def published(tmp_path):  # type: ignore[no-untyped-def]
    with SharedFilesystemStore(tmp_path, "run") as store:
        base = store.publish([Record("a", b"hello", tokens=2)], submission_id="base")
        top = store.publish([Record("b", b"world!", metadata={"k": 1}, tokens=3)],
                            submission_id="top", dependencies=[base])
        yield store, base, top


def test_field_names_order_and_defaults_are_straw_queues():
    assert [f.name for f in dataclasses.fields(SegmentRef)] == [
        "run_id", "path", "segment_id", "size", "checksum", "version", "checksum_algorithm",
        "offset"]
    defaults = {f.name: f.default for f in dataclasses.fields(SegmentRef)
                if f.default is not dataclasses.MISSING}
    assert defaults == {"version": 2, "checksum_algorithm": "xxh3-128", "offset": 0}
    assert [f.name for f in dataclasses.fields(RecordRef)] == ["segment", "ordinal"]
    assert [f.name for f in dataclasses.fields(RecordSetRef)] == [
        "manifest", "digest", "records", "payload_bytes", "tokens"]
    r = Record("id", b"x")
    assert (r.codec, r.metadata, r.tokens) == ("bytes.v1", {}, 0)


def test_asdict_and_from_dict_round_trip_through_json(published):
    store, base, top = published
    for ref in (base, top):
        d = json.loads(json.dumps(dataclasses.asdict(ref)))
        assert RecordSetRef.from_dict(d) == ref
        assert d == ref.to_dict()
        assert hash(RecordSetRef.from_dict(d)) == hash(ref)
    member = store.validate(top)[0]
    assert RecordRef.from_dict(json.loads(json.dumps(dataclasses.asdict(member)))) == member
    seg = top.manifest.segment
    assert SegmentRef.from_dict(dataclasses.asdict(seg)) == seg
    assert SegmentRef(**dataclasses.asdict(seg)) == seg  # how straw-queue rebuilds one


def test_publication_reference_carries_usage_including_dependencies(published):
    _, base, top = published
    assert (base.records, base.payload_bytes, base.tokens) == (1, 5, 2)
    assert (top.records, top.payload_bytes, top.tokens) == (1, 5 + 6, 2 + 3)
    # the manifest is the ordinal after the extent's own records
    assert top.manifest.ordinal == top.records
    assert (top.path, top.offset, top.size, top.checksum) == (
        top.segment.path, top.segment.offset, top.segment.size, top.segment.checksum)


def test_from_dict_refuses_versions_and_algorithms_it_cannot_read(published):
    _, base, _ = published
    d = dataclasses.asdict(base)
    for field, value in (("version", 1), ("checksum_algorithm", "sha256")):
        bad = json.loads(json.dumps(d))
        bad["manifest"]["segment"][field] = value
        with pytest.raises(UnsupportedSchema, match=field.replace("_", " ")):
            RecordSetRef.from_dict(bad)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["manifest"]["segment"].update(segment_id="x/i000001/pack-000001@0"),
     "segment_id"),
    (lambda d: d["manifest"]["segment"].update(path="/etc/passwd"), "not a pack path"),
    (lambda d: d["manifest"]["segment"].update(offset=-1), "offset must be an int"),
    (lambda d: d["manifest"].update(ordinal="1"), "ordinal must be an int"),
    (lambda d: d.update(digest="00"), "digest must be 32"),
    (lambda d: d.update(extra=1), "unknown extra"),
    (lambda d: d.pop("tokens"), "missing tokens"),
])
def test_from_dict_refuses_odd_or_edited_references(published, edit, match):
    _, base, _ = published
    d = json.loads(json.dumps(dataclasses.asdict(base)))
    edit(d)
    with pytest.raises(InvalidReference, match=match):
        RecordSetRef.from_dict(d)


def test_stored_tuple_form_round_trips_and_reads_the_previous_form(published):
    store, base, top = published
    for ref in (base, top):
        assert ref_from_tuple("run", ref_to_tuple(ref)) == ref
        assert ref_from_tuple("run", list(ref_to_tuple(ref))) == ref  # msgpack gives lists
    # the previous straw stored six fields and recorded no usage: same extent, 0 / 0
    old = ref_from_tuple("run", ref_to_tuple(base)[:6])
    assert old.segment == base.segment and old.manifest.ordinal == base.records
    assert (old.payload_bytes, old.tokens) == (0, 0)
    # idempotency keys compare what identifies the reference, the same in both forms
    assert ref_identity(ref_to_tuple(old)) == ref_identity(ref_to_tuple(base))
    assert ref_identity(ref_to_tuple(base)) != ref_identity(ref_to_tuple(top))


def test_the_previous_straws_flat_dict_still_decodes(published):
    _, base, _ = published
    flat = {"run_id": "run", "path": base.path, "offset": base.offset, "size": base.size,
            "checksum": base.checksum, "digest": base.digest, "records": base.records}
    old = RecordSetRef.from_dict(flat)
    assert old.segment == base.segment and old.digest == base.digest
    with pytest.raises(InvalidReference):
        RecordSetRef.from_dict({**flat, "path": "../outside.pack"})
