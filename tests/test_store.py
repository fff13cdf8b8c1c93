"""The packed record store: round trips, references, idempotency (D7), rotation and
writer incarnations."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from straw import (
    IdempotencyConflict,
    Publication,
    Record,
    RecordRef,
    RecordSetRef,
    SharedFilesystemStore,
    UnsafeRecovery,
)


def _store(root, **kw) -> SharedFilesystemStore:
    kw.setdefault("reserve_bytes", 1 << 20)
    kw.setdefault("writer_id", "w")  # a named writer: these tests restart it
    return SharedFilesystemStore(str(root), "run", **kw)


def test_round_trip_of_several_sizes_and_buffer_types(tmp_path):
    rng = np.random.default_rng(0)
    payloads = {
        "empty": b"",
        "small": b"hello",
        "bytearray": bytearray(b"x" * 1000),
        "memoryview": memoryview(rng.bytes(70_000)),
        "numpy-f32": rng.standard_normal((64, 33)).astype(np.float32),
        "numpy-i64": np.arange(100_000, dtype=np.int64),
        "large": rng.bytes(5 << 20),
    }
    with _store(tmp_path) as store:
        recs = [Record(k, v, metadata={"k": k, "n": [1, 2.5, None, True]}, tokens=3)
                for k, v in payloads.items()]
        ref = store.publish(recs, submission_id="s1")
        back = list(store.read(ref))
        assert [r.record_id for r in back] == list(payloads)
        for r, (k, v) in zip(back, payloads.items(), strict=True):
            assert bytes(r.payload) == bytes(memoryview(v).cast("B"))
            assert r.metadata == {"k": k, "n": [1, 2.5, None, True]}
            assert r.tokens == 3 and r.codec == "bytes.v1"
            assert type(r.payload) is bytes
        assert back == recs
        # read_record reads one record checked; validate checks all
        members = store.validate(ref)
        assert members == store.checked_manifest(ref).record_refs and len(members) == len(payloads)
        one = store.read_record(members[4])
        assert np.array_equal(np.frombuffer(one.payload, np.float32).reshape(64, 33),
                              payloads["numpy-f32"])
        m = store.checked_manifest(ref)
        assert m.submission_id == "s1" and len(m.records) == len(payloads)


def test_publish_many_one_reference_each_with_dependencies(tmp_path):
    with _store(tmp_path) as store:
        base = store.publish([Record("base", b"b")], submission_id="base")
        refs = store.publish_many(
            [
                Publication([Record("p0", b"0")]),
                Publication([Record("p1", b"1")], dependencies=[0, base]),
                Publication([Record("p2", b"2")], dependencies=[1, 0]),
            ],
            submission_id="batch",
        )
        assert len(refs) == 3 and len(set(refs)) == 3
        assert store.checked_manifest(refs[1]).dependencies == (refs[0], base)
        assert store.checked_manifest(refs[2]).dependencies == (refs[1], refs[0])
        assert [bytes(next(store.read(r)).payload) for r in refs] == [b"0", b"1", b"2"]
        # one durable write: all extents are contiguous in one pack
        assert refs[0].path == refs[2].path
        assert refs[1].offset == refs[0].offset + refs[0].size


def test_references_are_frozen_hashable_and_serialise(tmp_path):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x"), Record("b", b"y")], submission_id="s")
        rr = store.validate(ref)[1]
    assert RecordSetRef.from_dict(ref.to_dict()) == ref
    assert RecordSetRef.from_dict(dataclasses.asdict(ref)) == ref
    assert RecordRef.from_dict(rr.to_dict()) == rr
    assert RecordRef.from_dict(dataclasses.asdict(rr)) == rr
    assert len({ref, RecordSetRef.from_dict(ref.to_dict())}) == 1
    assert not os.path.isabs(ref.path) and ".." not in ref.path
    assert ref.segment.path == ref.path
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.offset = 3  # type: ignore[misc]


def test_idempotent_retry_conflict_and_restart(tmp_path):
    recs = [Record("a", b"payload", metadata={"x": 1})]
    with _store(tmp_path) as store:
        ref = store.publish(recs, submission_id="s1")
        assert store.publish([Record("a", b"payload", metadata={"x": 1})],
                             submission_id="s1") == ref
        with pytest.raises(IdempotencyConflict, match="s1"):
            store.publish([Record("a", b"other")], submission_id="s1")
        with pytest.raises(IdempotencyConflict):
            store.publish([Record("a", b"payload", metadata={"x": 2})], submission_id="s1")
        batch = store.publish_many([Publication([Record("p", b"0")]),
                                    Publication([Record("q", b"1")], dependencies=[0])],
                                   submission_id="m")
        store.seal()
        open_ref = store.publish([Record("o", b"open pack")], submission_id="s2")
    # after the writer restarts (new incarnation), lookups and retries still find them
    with _store(tmp_path) as store:
        assert store.lookup_submission("s1") == (ref,)
        assert store.lookup_submission("m") == batch
        assert store.publish(recs, submission_id="s1") == ref
        assert store.publish_many([Publication([Record("p", b"0")]),
                                   Publication([Record("q", b"1")], dependencies=[0])],
                                  submission_id="m") == batch
        assert store.publish([Record("o", b"open pack")], submission_id="s2") == open_ref
        with pytest.raises(IdempotencyConflict):
            store.publish([Record("a", b"changed")], submission_id="s1")
        assert store.lookup_submission("never") is None


def test_rotation_and_oversized_publication_stays_contiguous(tmp_path):
    with _store(tmp_path, segment_target_bytes=64 << 10) as store:
        refs = [store.publish([Record("r", bytes([i]) * 20_000)], submission_id=f"s{i}")
                for i in range(10)]
        big = store.publish([Record("big", b"B" * 300_000)], submission_id="big")
        after = store.publish([Record("after", b"a")], submission_id="after")
        paths = [r.path for r in refs]
        assert len(set(paths)) >= 3, "rotation at segment_target_bytes"
        assert big.size > 300_000 and big.path not in paths
        assert after.path != big.path
        for i, r in enumerate(refs):
            assert bytes(next(store.read(r)).payload) == bytes([i]) * 20_000
        assert bytes(next(store.read(big)).payload) == b"B" * 300_000


def test_restarted_writer_never_appends_to_predecessor_pack(tmp_path):
    with _store(tmp_path) as store:
        old = store.publish([Record("a", b"1")], submission_id="s1")
    old_file = tmp_path / old.path
    size = old_file.stat().st_size
    with _store(tmp_path) as store:
        new = store.publish([Record("b", b"2")], submission_id="s2")
    assert os.path.dirname(new.path) != os.path.dirname(old.path)
    assert old_file.stat().st_size == size


def test_second_live_writer_with_same_id_is_told_who_holds_it(tmp_path):
    with _store(tmp_path) as first:
        first.publish([Record("a", b"1")], submission_id="s1")
        second = _store(tmp_path)
        with pytest.raises(UnsafeRecovery, match=r"in use by host .* pid \d+"):
            second.publish([Record("b", b"2")], submission_id="s2")
        # a distinct writer id is fine, and readers need no writer at all
        with _store(tmp_path, writer_id="other") as other:
            ref = other.publish([Record("b", b"2")], submission_id="s2")
            assert bytes(next(second.read(ref)).payload) == b"2"
        second.close()


def test_read_session_caches_and_closes(tmp_path):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x" * 100), Record("b", b"y")], submission_id="s")
        with store.read_session() as session:
            members = session.validate(ref)
            assert bytes(session.read_record(members[1]).payload) == b"y"
            assert session.checked_manifest(ref) is session.checked_manifest(ref)
        with pytest.raises(ValueError, match="closed"):
            session.read(ref)


def test_closed_store_refuses_writes(tmp_path):
    store = _store(tmp_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        store.publish([Record("a", b"1")], submission_id="s")
