"""Errors a straw-queue caller matches: the class it catches and the key phrase it looks
for, while our message still names the object and the fix."""

from __future__ import annotations

import dataclasses
import os

import pytest

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec
from straw.errors import CorruptData, InvalidReference


def _pack(root, ref) -> str:  # type: ignore[no-untyped-def]
    return os.path.join(root, ref.manifest.segment.path)


def test_damaged_extent_header_says_invalid_segment_header(tmp_path):
    store = SharedFilesystemStore(tmp_path, "phrases")
    ref = store.publish([Record("r", b"payload")], submission_id="r")
    seg = ref.manifest.segment
    with open(_pack(tmp_path, ref), "r+b") as f:  # a non-zero, wrong first header byte
        f.seek(seg.offset)
        f.write(b"\xff")
    with pytest.raises(CorruptData, match="Invalid segment header") as e:
        store.validate(ref)
    assert seg.path in str(e.value) and f"offset {seg.offset}" in str(e.value)


@pytest.mark.parametrize("field", ["payload_bytes", "tokens"])
@pytest.mark.parametrize("value", [-1, 2**64, 0.5, "0", None, True])
def test_bad_usage_fields_say_invalid_result_usage(tmp_path, field, value):
    store = SharedFilesystemStore(tmp_path, "phrases")
    ref = store.publish([Record("r", b"")], submission_id="r")
    edited = dataclasses.replace(ref, **{field: value})
    with pytest.raises(InvalidReference, match="Invalid result usage") as e:
        store.validate(edited)
    assert field in str(e.value)
    with pytest.raises(InvalidReference, match="Invalid result usage"):
        type(ref).from_dict({**ref.to_dict(), field: value})


@pytest.mark.parametrize("size", [0, 1, 10, 55, 56, 57])
def test_a_size_no_extent_has_is_both_corrupt_data_and_invalid_reference(tmp_path, size):
    # straw-queue reports an edited size as CorruptData; ours says the reference is wrong
    # (the data is intact): the error is both, and never an internal parsing error
    store = SharedFilesystemStore(tmp_path, "phrases")
    (rec,) = store.write_records([Record("r", b"value")], submission_id="s")
    edited = dataclasses.replace(rec, segment=dataclasses.replace(rec.segment, size=size))
    for call in (store.read_record, lambda r: store.check_published(r.segment)):
        with pytest.raises(CorruptData) as e:
            call(edited)
        assert isinstance(e.value, InvalidReference)
        assert "the reference is edited" in str(e.value)
    assert store.read_record(rec).payload == b"value"


@pytest.mark.parametrize("field,value", [("priority", True), ("priority", 1.0),
                                         ("scheduling_key", 1.5), ("scheduling_key", False)])
def test_non_integer_priority_or_key_is_a_value_error_and_a_type_error(tmp_path, field, value):
    store = SharedFilesystemStore(tmp_path, "phrases")
    queue = Coordinator(store, exclusive_owner="phrases-test")
    try:
        for cls in (ValueError, TypeError):
            with pytest.raises(cls, match="signed 64-bit integer") as e:
                queue.submit_tasks(f"bad-{cls.__name__}", [TaskSpec("t", **{field: value})])
            assert field in str(e.value)
        assert queue.pending_tasks() == []
        with pytest.raises(ValueError, match="signed 64-bit integer"):
            queue.submit_tasks("big", [TaskSpec("t", **{field: 2**63})])
    finally:
        queue.close()
        store.close()


def test_closed_objects_raise_runtime_error_and_value_error(tmp_path):
    store = SharedFilesystemStore(tmp_path, "phrases")
    ref = store.publish([Record("r", b"x")], submission_id="r")
    queue = Coordinator(store, exclusive_owner="phrases-test")
    queue.close()
    session = store.read_session()
    session.close()
    calls = [lambda: queue.submit_tasks("t", [TaskSpec("t")]), lambda: session.read(ref)]
    for call in calls:
        for cls in (RuntimeError, ValueError):  # straw-queue's class, and ours before
            with pytest.raises(cls, match="closed"):
                call()
    store.close()
    for cls in (RuntimeError, ValueError):
        with pytest.raises(cls, match="closed"):
            store.publish([Record("s", b"y")], submission_id="s")


@pytest.mark.parametrize("operation", ["release", "retain"])
def test_a_queue_owner_is_reserved_to_the_public_owner_calls(tmp_path, operation):
    """A queue's owner name cannot be released or replaced through the store: the
    ValueError says "reserved", and the data stays protected."""
    from straw.protocol import digest

    store = SharedFilesystemStore(tmp_path, "phrases", online_gc=True)
    ref = store.publish([Record("r", b"data")], submission_id="source")
    queue = Coordinator(store, exclusive_owner="phrases-test")
    queue.submit_tasks("task", [TaskSpec("t", input_ref=ref)])
    store.release_publications([ref])
    owner = f"queue:{digest('phrases-test')}:{digest(dataclasses.asdict(ref))}"
    with pytest.raises(ValueError, match="reserved"):
        if operation == "release":
            store.release(owner)
        else:
            store.retain(owner, [])
    assert queue.collect_garbage()["reclaimed_files"] == 0
    assert next(store.read(ref)).payload == b"data"
    queue.close()
    store.close()


def test_forked_child_is_told_the_object_cannot_be_reused_after_fork(tmp_path):
    store = SharedFilesystemStore(tmp_path, "phrases")
    ref = store.publish([Record("r", b"x")], submission_id="r")
    session = store.read_session()
    assert next(session.read(ref)).payload == b"x"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what each call raised, then leave at once
        out = []
        for call in (lambda: store.read(ref), lambda: session.read(ref),
                     lambda: session.manifest(ref)):
            try:
                call()
                out.append("no error")
            except RuntimeError as e:
                out.append("cannot be reused after fork" in str(e) and "SharedFilesystemStore"
                           in str(e) and "ok" or str(e))
        os.write(write, "|".join(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read().decode()
    os.waitpid(pid, 0)
    assert answer == "ok|ok|ok"
    session.close()
    store.close()


def test_read_session_reads_tensor_and_checked_ranges_like_the_store(tmp_path):
    np = pytest.importorskip("numpy")
    from straw.tensor import publish_tensors

    with SharedFilesystemStore(tmp_path, "phrases") as store:
        (a,) = publish_tensors(store, {"a": np.arange(12, dtype=np.int32).reshape(3, 4)},
                               submission_id="t")
        with store.read_session() as session:
            env, data = session.read_tensor_range(a.record_ref, 16, 32,
                                                  expected={"dtype": "int32", "shape": [3, 4]})
            assert (env, data) == store.read_tensor_range(a.record_ref, 16, 32)
            assert bytes(data) == np.arange(4, 8, dtype=np.int32).tobytes()
            with pytest.raises(CorruptData):
                session.read_tensor_range(a.record_ref, 0, 4, expected={"shape": [12]})
            whole = np.arange(12, dtype=np.int32).tobytes()
            import hashlib
            sums = [hashlib.sha256(whole[i:i + 16]).hexdigest() for i in range(0, 48, 16)]
            assert bytes(session.read_range(a.record_ref, 5, 40, chunk_bytes=16,
                                            checksums=sums)) == whole[5:40]
            with pytest.raises(CorruptData, match="chunk checksum"):
                session.read_range(a.record_ref, 0, 4, chunk_bytes=16,
                                   checksums=["0" * 64] + sums[1:])
