"""The store and read-session surface of straw-queue 0.1.6, written as a straw-queue user
writes it, served by straw's engine; and the bugs found while trying it."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from straw import (
    Coordinator,
    Publication,
    Record,
    RecordRef,
    RecordSetRef,
    SharedFilesystemStore,
    TaskSpec,
)
from straw.errors import (
    CorruptData,
    InvalidReference,
    UnknownCodec,
    UnsupportedSchema,
    WriterBusy,
    WriterFenced,
)
from straw.tensor import publish_tensors


def _sha_chunks(payload: bytes, chunk: int) -> list[str]:
    return [hashlib.sha256(payload[i:i + chunk]).hexdigest()
            for i in range(0, len(payload), chunk)]


def test_readme_idiom_read_is_an_iterator_of_bytes_records(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", online_gc=True) as store:
        ref = store.publish([Record("greeting", b"hello")], submission_id="hello-1")
        it = store.read(ref)
        assert iter(it) is it  # an iterator, not a list
        record = next(it)
        assert record.payload.decode() == "hello" and type(record.payload) is bytes
        assert (record.record_id, record.codec, record.metadata, record.tokens) == (
            "greeting", "bytes.v1", {}, 0)
        assert list(it) == []
        with store.read_session() as reader:
            assert [r.payload for r in reader.read(ref)] == [b"hello"]
            (member,) = reader.validate(ref)
            assert reader.envelope(member)["record_id"] == "greeting"
            assert reader.manifest(ref)["digest"] == ref.digest


def test_large_payloads_read_back_as_bytes_without_damage(tmp_path):
    rng = np.random.default_rng(1)
    big = rng.bytes(3 << 20)  # spans several read chunks
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = store.publish([Record("small", b"s"), Record("big", big), Record("e", b"")],
                            submission_id="big")
        small, large, empty = store.read(ref)
        assert small.payload == b"s" and large.payload == big and empty.payload == b""
        assert type(large.payload) is bytes and hash(large.payload) == hash(big)


def test_a_bad_reference_fails_at_the_call_not_at_the_first_next(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
        bad = dataclasses.replace(ref, digest="0" * 32)
        with pytest.raises(InvalidReference, match="digest"):
            store.read(bad)
        with pytest.raises(InvalidReference, match="payload_bytes"):
            store.validate(dataclasses.replace(ref, payload_bytes=99))


def test_write_records_then_record_set_then_gc_retention(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        refs = store.write_records([Record("a", b"alpha", tokens=1),
                                    Record("b", b"beta", metadata={"m": 2}, tokens=2)],
                                   submission_id="records")
        assert isinstance(refs, tuple) and [r.ordinal for r in refs] == [0, 1]
        assert refs[0].segment == refs[1].segment
        assert store.read_record(refs[1]).payload == b"beta"
        rs = store.record_set(refs, submission_id="set")
        assert (rs.records, rs.payload_bytes, rs.tokens) == (2, 9, 3)
        assert rs.manifest.ordinal == 0  # a record set stores no records of its own
        assert [r.payload for r in store.read(rs)] == [b"alpha", b"beta"]
        assert store.validate(rs) == refs
        m = store.manifest(rs)
        assert m["digest"] == rs.digest and m["dependencies"] == []
        assert [RecordRef.from_dict(r) for r in m["records"]] == list(refs)
        # the same records published as one publication have the same logical digest
        same = store.publish([Record("a", b"alpha", tokens=1),
                              Record("b", b"beta", metadata={"m": 2}, tokens=2)],
                             submission_id="same")
        assert same.digest == rs.digest
        store.release_publications([same])
        # retained through the record set: the records survive collection
        store.retain("keep", [rs])
        assert store.release_publications([rs]) == 1
        # the records' own staging went with the record set's (transitive, as straw-queue)
        assert store.release_publications(list(refs)) == 0
        store.seal()
        got = store.collect_garbage()
        assert got["reclaimed_files"] == 0 and got["owners"] == 1
        assert [r.payload for r in store.read(rs)] == [b"alpha", b"beta"]
        store.release("keep")
        got = store.collect_garbage()
        assert got["reclaimed_files"] == 1 and got["owners"] == 0
        with pytest.raises(InvalidReference, match="reclaimed"):
            store.read_record(refs[0])


def test_record_set_with_dependencies_counts_them(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        dep = store.publish([Record("d", b"1234", tokens=4)], submission_id="dep")
        (r,) = store.write_records([Record("r", b"xy", tokens=1)], submission_id="r")
        rs = store.record_set([r], submission_id="rs", dependencies=[dep])
        assert (rs.payload_bytes, rs.tokens) == (6, 5)
        assert store.checked_manifest(rs).dependencies == (dep,)
        with pytest.raises(InvalidReference):  # the manifest ordinal is not a record
            store.record_set([dep.manifest], submission_id="bad")


def test_manifest_ordinal_reads_back_as_the_manifest_record(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
        rec = store.read_record(ref.manifest)
        assert rec.codec == "record-set.v2" and rec.record_id == f"manifest:{ref.digest}"
        assert json.loads(rec.payload) == store.manifest(ref)
        with pytest.raises(InvalidReference, match="no ordinal 2"):
            store.read_record(RecordRef(ref.segment, 2))


def test_a_callers_record_may_use_straw_queues_manifest_codecs(tmp_path):
    """straw-queue accepts record-set.v1/v2 as codecs in every store; they label a
    caller's record and change nothing about how it is stored or read."""
    payload = json.dumps({"records": [], "dependencies": []}).encode()
    with SharedFilesystemStore(tmp_path, "run") as store:
        refs = [store.publish([Record(f"node-{v}", payload, f"record-set.{v}")],
                              submission_id=v) for v in ("v1", "v2")]
        for v, ref in zip(("v1", "v2"), refs, strict=True):
            (rec,) = store.read(ref)
            assert (rec.record_id, rec.codec, rec.payload) == (f"node-{v}", f"record-set.{v}",
                                                               payload)
        with pytest.raises(UnknownCodec, match="record-set.v3"):
            store.publish([Record("x", payload, "record-set.v3")], submission_id="v3")


def test_inspect_segment_describes_the_extent_and_verifies_payloads(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = store.publish([Record("a", b"A" * 100, tokens=7)], submission_id="s")
        info = store.inspect_segment(ref.manifest.segment)
        assert set(info) == {"version", "run_id", "segment_id", "records"}
        assert info["segment_id"] == ref.segment.segment_id
        first, manifest = info["records"]
        assert first["envelope"]["record_id"] == "a" and first["envelope"]["tokens"] == 7
        assert first["envelope"]["length"] == 100
        assert manifest["envelope"]["codec"] == "record-set.v2"
        assert store.inspect_segment(ref.segment, verify_payload=True) == info
        pack = tmp_path / ref.path
        data = bytearray(pack.read_bytes())
        data[ref.offset + first["offset"] + 50] ^= 0xFF
        pack.write_bytes(data)
    with SharedFilesystemStore(tmp_path, "run") as store:
        assert store.inspect_segment(ref.segment)["records"][0]["envelope"]["length"] == 100
        with pytest.raises(CorruptData):
            store.inspect_segment(ref.segment, verify_payload=True)


def test_read_range_checks_every_touched_chunk(tmp_path):
    payload = bytes(range(251)) * 40
    chunk = 1024
    with SharedFilesystemStore(tmp_path, "run") as store:
        (ref,) = store.write_records([Record("r", payload)], submission_id="r")
        sums = _sha_chunks(payload, chunk)
        for start, stop in ((0, 0), (0, 13), (chunk - 3, chunk + 4), (100, len(payload))):
            got = store.read_range(ref, start, stop, chunk_bytes=chunk, checksums=sums)
            assert got == payload[start:stop] and isinstance(got, bytearray)
        with pytest.raises(CorruptData, match="chunk checksum"):
            store.read_range(ref, 0, 13, chunk_bytes=chunk,
                             checksums=[sums[1]] + sums[1:])
        with pytest.raises(ValueError, match="checksums given"):
            store.read_range(ref, 0, 13, chunk_bytes=chunk, checksums=sums[:-1])


def test_read_tensor_range_binds_the_expected_shape(tmp_path):
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    with SharedFilesystemStore(tmp_path, "run") as store:
        (t,) = publish_tensors(store, {"x": value}, submission_id="t", chunk_bytes=64)
        env, data = store.read_tensor_range(t.record, 32, 96,
                                            expected={"dtype": "float32", "shape": [8, 8]})
        assert env["codec"] == "tensor.v1" and data == value.tobytes()[32:96]
        with pytest.raises(CorruptData, match="shape"):
            store.read_tensor_range(t.record, 0, 4, expected={"shape": [4, 16]})


def test_publication_receipt_after_a_lost_reply(tmp_path):
    writer = SharedFilesystemStore(tmp_path, "run")
    writer_id = writer.writer_id  # recorded with the request before publishing
    ref = writer.publish([Record("a", b"x")], submission_id="pub-1")
    (rec,) = writer.write_records([Record("r", b"y")], submission_id="rec-1")
    # ...the reply is lost; a peer asks for the receipt
    with SharedFilesystemStore(tmp_path, "run") as peer:
        # the writer is live: what it acknowledged is read without its lock...
        assert peer.publication_receipt(writer_id, api="publish",
                                        submission_id="pub-1") == [ref]
        assert peer.publication_receipt(writer_id, api="records",
                                        submission_id="rec-1") == [rec]
        # ...but its absence proves nothing while the writer may still publish it
        with pytest.raises(WriterBusy, match="may still be in flight"):
            peer.publication_receipt(writer_id, api="publish", submission_id="never")
        with pytest.raises(WriterBusy):
            peer.publication_receipt(writer_id, api="record_set", submission_id="pub-1")
        assert writer.publication_receipt(writer_id, api="publish",
                                          submission_id="pub-1") == [ref]
        writer.close()
        assert peer.publication_receipt(writer_id, api="publish",
                                        submission_id="pub-1") == [ref]
        assert peer.publication_receipt(writer_id, api="records",
                                        submission_id="rec-1") == [rec]
        assert peer.publication_receipt(writer_id, api="record_set",
                                        submission_id="pub-1") is None
        assert peer.publication_receipt(writer_id, api="publish",
                                        submission_id="never") is None
        with pytest.raises(ValueError, match="api must be"):
            peer.publication_receipt(writer_id, api="other", submission_id="pub-1")


def test_retire_writer_fences_it_for_good(tmp_path):
    live = SharedFilesystemStore(tmp_path, "run", writer_id="worker-7")
    ref = live.publish([Record("a", b"x")], submission_id="s")
    with SharedFilesystemStore(tmp_path, "run") as peer:
        with pytest.raises(WriterBusy):
            peer.retire_writer("worker-7")
        live.close()  # its process is gone
        assert peer.retire_writer("worker-7") == [ref]  # still staged: yours to handle
        assert peer.publication_receipt("worker-7", api="publish", submission_id="s") == [ref]
        with pytest.raises(ValueError, match="no writer"):
            peer.retire_writer("nobody")
    with SharedFilesystemStore(tmp_path, "run", writer_id="worker-7") as again:
        with pytest.raises(WriterFenced, match="retired"):
            again.publish([Record("b", b"y")], submission_id="t")
        assert next(again.read(ref)).payload == b"x"  # reading is unaffected


def test_retire_writer_fences_a_store_that_has_not_published_yet(tmp_path):
    idle = SharedFilesystemStore(tmp_path, "run", writer_id="idle")
    with SharedFilesystemStore(tmp_path, "run", writer_id="idle") as first:
        first.publish([Record("a", b"x")], submission_id="s")
    with SharedFilesystemStore(tmp_path, "run") as peer:
        assert peer.retire_writer("idle", policy="abandon") == []
    with pytest.raises(WriterFenced):
        idle.publish([Record("b", b"y")], submission_id="t")
    idle.close()


def test_store_constructor_takes_straw_queues_arguments(tmp_path):
    store = SharedFilesystemStore(tmp_path, "run", backend=None,
                                  codecs=("bytes.v1", "json.v1", "custom.v1"),
                                  max_record_bytes=8, max_buffer_bytes=1 << 20,
                                  segment_target_bytes=0, online_gc=False)
    with store:
        store.publish([Record("a", b"12345678", codec="custom.v1")], submission_id="a")
        second = store.publish([Record("b", b"x")], submission_id="b")
        assert second.path.endswith("pack-000002.pack")  # 0: every write its own pack
        m = store.metrics
        assert (m["records"], m["payload_bytes"], m["segments"], m["buffer_bytes"]) == (
            2, 9, 2, 0)
        assert len(m["publish_seconds"]) == 2
        with store.pin([second], owner="reader-1"):
            assert "reader-1" in store.owners()
        assert "reader-1" not in store.owners()
        got = store.collect_garbage()
        for key in ("reclaimed_files", "reclaimed_bytes", "tombstones", "retained_packs",
                    "open_packs", "owners"):
            assert isinstance(got[key], int), key


def test_validate_binds_task_and_attempt(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = store.publish([Record("r", b"x", metadata={"task_id": "t", "attempt_id": "a"})],
                            submission_id="s")
        members = store.validate(ref)
        assert store.validate(ref, task_id="t", attempt_id="a") == members
        with pytest.raises(InvalidReference, match="task/attempt"):
            store.validate(ref, task_id="other")
        with pytest.raises(InvalidReference, match="task/attempt"):
            store.validate(ref, attempt_id="b")


# --- bugs found while trying straw as a straw-queue user ----------------------------------

def test_dependent_digest_does_not_depend_on_where_the_dependency_lives(tmp_path):
    """A dependency named by index inside one publish_many call and the same dependency
    passed as a reference give the dependent publication the same digest."""
    with SharedFilesystemStore(tmp_path / "a", "run") as one, \
            SharedFilesystemStore(tmp_path / "b", "run") as two:
        _, local = one.publish_many([Publication([Record("base", b"b")]),
                                     Publication([Record("top", b"t")], dependencies=[0])],
                                    submission_id="batch")
        two.publish([Record("pad", b"shifts the offsets")], submission_id="pad")
        base = two.publish([Record("base", b"b")], submission_id="base")
        by_ref = two.publish([Record("top", b"t")], submission_id="top", dependencies=[base])
        assert (local.path, local.offset) != (by_ref.path, by_ref.offset)
        assert local.digest == by_ref.digest


def test_two_default_stores_in_one_process_do_not_collide(tmp_path):
    first = SharedFilesystemStore(tmp_path, "run")
    second = SharedFilesystemStore(tmp_path, "run")
    try:
        assert first.writer_id != second.writer_id
        a = first.publish([Record("a", b"1")], submission_id="s")
        b = second.publish([Record("b", b"2")], submission_id="s")  # no UnsafeRecovery
        assert next(first.read(b)).payload == b"2" and next(second.read(a)).payload == b"1"
    finally:
        first.close()
        second.close()
    # a named writer is the one that restarts: its submissions survive
    with SharedFilesystemStore(tmp_path, "run", writer_id="named") as named:
        ref = named.publish([Record("n", b"3")], submission_id="n")
    with SharedFilesystemStore(tmp_path, "run", writer_id="named") as named:
        assert named.publish([Record("n", b"3")], submission_id="n") == ref


def test_refs_are_plain_data_a_reader_can_rebuild(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
        wire = json.dumps(dataclasses.asdict(ref))
    with SharedFilesystemStore(tmp_path, "run") as reader:
        assert next(reader.read(RecordSetRef.from_dict(json.loads(wire)))).payload == b"x"


def test_zero_segment_target_makes_each_released_publication_reclaimable(tmp_path):
    # straw-queue writes each publication of a segment_target_bytes=0 store to its own
    # sealed file; ours seals a full open pack when collecting, so the last one is too
    with SharedFilesystemStore(tmp_path, "target0", segment_target_bytes=0) as store:
        refs = [store.publish([Record(f"r{i}", b"x" * 100)], submission_id=f"s{i}")
                for i in range(3)]
        assert len({r.manifest.segment.path for r in refs}) == 3
        store.retain("keep", refs[1:2])
        assert store.release_publications(refs) == 3
        result = store.collect_garbage()
        assert result["reclaimed_files"] == 2 and result["open_packs"] == 0
        assert sorted(result["tombstoned"]) == sorted(
            [refs[0].manifest.segment.path, refs[2].manifest.segment.path])
        assert next(store.read(refs[1])).payload == b"x" * 100
        # the store publishes on into a new pack
        later = store.publish([Record("later", b"y")], submission_id="later")
        assert later.manifest.segment.path not in result["tombstoned"]
        assert next(store.read(later)).payload == b"y"


def test_collection_leaves_a_pack_below_its_target_open(tmp_path):
    with SharedFilesystemStore(tmp_path, "target", segment_target_bytes=1 << 20) as store:
        a = store.publish([Record("a", b"x" * 100)], submission_id="a")
        store.release_publications([a])
        result = store.collect_garbage()
        assert result["reclaimed_files"] == 0 and result["open_packs"] == 1
        b = store.publish([Record("b", b"y")], submission_id="b")
        assert b.manifest.segment.path == a.manifest.segment.path  # same pack, appended


def test_a_live_writers_receipt_is_read_while_it_keeps_publishing(tmp_path):
    """Reading a live writer's packs without its lock while it appends to its open pack:
    each acknowledged publication is found."""
    with SharedFilesystemStore(tmp_path, "run", segment_target_bytes=1 << 20) as writer, \
            SharedFilesystemStore(tmp_path, "run") as peer:
        refs = []
        for i in range(40):
            refs.append(writer.publish([Record("a", bytes([i]) * (i * 997))],
                                       submission_id=f"pub-{i}"))
            asked = i // 2
            assert peer.publication_receipt(writer.writer_id, api="publish",
                                            submission_id=f"pub-{asked}") == [refs[asked]]
        assert len({r.path for r in refs}) == 1  # all in the writer's open pack


# --- straw-queue's error classes, each also the builtin straw raised before ------------

def test_writing_nothing_is_a_value_error_and_writes_nothing(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        with pytest.raises(ValueError, match=r"write_records\(\[\].*at least one Record"):
            store.write_records([], submission_id="none")
        with pytest.raises(ValueError, match=r"publish_many\(\[\].*at least one"):
            store.publish_many([], submission_id="none")
        assert store.lookup_submission("none") is None
        # an empty publication is still one (straw-queue publishes it too)
        assert store.publish([], submission_id="empty").records == 0


@pytest.mark.parametrize("record_id", ["", "x" * 1025])
def test_an_empty_or_long_record_id_is_unsupported_schema_and_value_error(tmp_path,
                                                                          record_id):
    with SharedFilesystemStore(tmp_path, "run") as store:
        for call in (lambda: store.publish([Record(record_id, b"x")], submission_id="p"),
                     lambda: store.write_records([Record(record_id, b"x")],
                                                 submission_id="w")):
            with pytest.raises(UnsupportedSchema, match="record_id") as err:
                call()
            assert isinstance(err.value, ValueError)
        assert store.lookup_submission("p") is None


@pytest.mark.parametrize("tokens", [1.5, True, "3"])
def test_tokens_of_another_type_are_a_value_error_and_a_type_error(tmp_path, tokens):
    with SharedFilesystemStore(tmp_path, "run") as store:
        with pytest.raises(ValueError, match="tokens must be an int") as err:
            store.publish([Record("a", b"x", tokens=tokens)], submission_id="p")
        assert isinstance(err.value, TypeError)
        with Coordinator(store, exclusive_owner="me") as queue:
            with pytest.raises(ValueError, match="estimated_tokens") as err:
                queue.submit_tasks("r", [TaskSpec("t", estimated_tokens=tokens)])
            assert isinstance(err.value, TypeError)


def test_read_range_outside_the_record_is_invalid_reference_and_value_error(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        (ref,) = store.write_records([Record("a", b"hello")], submission_id="w")
        sums = _sha_chunks(b"hello", 5)
        for start, stop, chunk, given in ((0, 10, 5, sums), (4, 3, 5, sums),
                                          (0, 5, 2, sums)):
            with pytest.raises(InvalidReference) as err:
                store.read_range(ref, start, stop, chunk_bytes=chunk, checksums=given)
            assert isinstance(err.value, ValueError)
        assert store.read_range(ref, 1, 4, chunk_bytes=5, checksums=sums) == b"ell"


def test_a_tensor_read_of_a_bytes_record_is_unsupported_schema(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        (ref,) = store.write_records([Record("a", b"hello")], submission_id="w")
        with store.read_session() as session:
            for reader in (store, session):
                with pytest.raises(UnsupportedSchema, match="not tensor.v1") as err:
                    reader.read_tensor_range(ref, 0, 1)
                assert isinstance(err.value, InvalidReference)  # (straw's class before)


def test_a_reference_of_the_other_kind_is_invalid_reference_and_unsupported_schema(
        tmp_path):
    # straw-queue: read/validate of a RecordRef are InvalidReference, manifest of it and
    # read_record of a RecordSetRef UnsupportedSchema; straw raised TypeError
    with SharedFilesystemStore(tmp_path, "run") as store:
        (record,) = store.write_records([Record("a", b"hello")], submission_id="w")
        publication = store.publish([Record("b", b"x")], submission_id="p")
        with store.read_session() as session:
            for reader in (store, session):
                for call, ref in ((reader.read, record),
                                  (reader.validate, record), (reader.manifest, record),
                                  (reader.read_record, publication)):
                    with pytest.raises(InvalidReference, match="expected a Record") as err:
                        call(ref)
                    assert isinstance(err.value, UnsupportedSchema)
                    assert isinstance(err.value, TypeError)
        assert [r.payload for r in store.read(publication)] == [b"x"]


def test_publication_receipt_of_an_unknown_writer_is_a_value_error(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", writer_id="w1") as writer:
        writer.publish([Record("a", b"x")], submission_id="p")
    with SharedFilesystemStore(tmp_path, "run") as peer:
        with pytest.raises(ValueError, match="no writer 'nobody'"):
            peer.publication_receipt("nobody", api="publish", submission_id="p")
        # a known writer: a submission it never made is None, as in straw-queue
        assert peer.publication_receipt("w1", api="publish", submission_id="other") is None
        # this store's own writer, which published nothing yet: nothing, not an error
        assert peer.publication_receipt(peer.writer_id, api="publish",
                                        submission_id="p") is None
