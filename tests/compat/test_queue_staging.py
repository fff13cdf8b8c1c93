"""A queue that adopted a publication drops its staging: the producer need not call
``release_publications`` for data it handed to a queue, even when the coordinator stopped
before it collected (straw-queue consumes that staging with the submission)."""

from __future__ import annotations

from pathlib import Path

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec


def test_a_recovered_queue_drops_the_staging_of_what_its_journal_names(tmp_path):
    store = SharedFilesystemStore(tmp_path, "run", segment_target_bytes=0)
    ref = store.publish([Record("prompt", b"p" * 64)], submission_id="prompt")
    q = Coordinator(store, queue_id="gen", exclusive_owner="the test")
    q.submit_tasks("r1", [TaskSpec("t1", ref)])
    store.seal()
    q.close()  # stopped before any collection
    q = Coordinator(store, queue_id="gen", exclusive_owner="the test", recover=True)
    assert q.collect_garbage()["reclaimed_files"] == 0  # the pending task needs it
    assert next(store.read(ref)).payload == b"p" * 64
    q.cancel_task("t1", request_id="cancel")
    result = q.collect_garbage()
    assert result["reclaimed_files"] == 1
    assert not (Path(tmp_path) / ref.path).exists()
    q.close()
    store.close()


def test_a_recovered_queue_keeps_the_staging_of_what_it_never_journaled(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", segment_target_bytes=0) as store:
        journaled = store.publish([Record("a", b"a")], submission_id="a")
        fresh = store.publish([Record("b", b"b")], submission_id="b")  # never submitted
        q = Coordinator(store, queue_id="gen", exclusive_owner="the test")
        q.submit_tasks("r1", [TaskSpec("t1", journaled)])
        store.seal()
        q.close()
        q = Coordinator(store, queue_id="gen", exclusive_owner="the test", recover=True)
        q.cancel_task("t1", request_id="cancel")
        assert q.collect_garbage()["reclaimed_files"] == 1
        # the producer's own staging of what it never handed over stays: its decision
        assert next(store.read(fresh)).payload == b"b"
        q.close()


def test_collection_counts_only_owners_that_hold_something(tmp_path):
    """``owners`` counts what keeps data alive: a queue's owner holds its tasks' inputs,
    and once every task is cancelled it holds nothing and is not counted (straw-queue's
    queue owners are per input, so it reports 0 there too)."""
    with SharedFilesystemStore(tmp_path, "run") as store, \
            Coordinator(store, exclusive_owner="test") as queue:
        refs = []
        for i in range(3):
            ref = store.publish([Record(str(i), b"data")], submission_id=str(i))
            queue.submit_tasks(str(i), [TaskSpec(str(i), input_ref=ref)])
            refs.append(ref)
        store.seal()
        got = queue.collect_garbage()
        assert (got["owners"], got["reclaimed_files"]) == (1, 0)
        for i in range(3):
            queue.cancel_task(str(i), request_id=f"cancel-{i}")
        store.retain("keep", [refs[0]])
        assert queue.collect_garbage()["owners"] == 1
        assert store.collect_garbage()["owner_names"] == ["keep"]
        assert next(store.read(refs[0])).payload == b"data"
        store.release("keep")
        got = store.collect_garbage()
        assert (got["owners"], got["owner_names"], got["reclaimed_files"]) == (0, [], 1)
        assert list(tmp_path.rglob("*.pack")) == []


def test_each_publication_still_staged_in_a_sealed_pack_counts_as_an_owner(tmp_path):
    """straw-queue keeps one staging owner per publication until it is released (or a
    queue adopts it); ``owners`` counts them."""
    with SharedFilesystemStore(tmp_path, "run") as store:
        refs = [store.publish([Record(str(i), b"x")], submission_id=str(i)) for i in range(3)]
        store.seal()
        assert store.collect_garbage()["owners"] == 3
        store.release_publications(refs[:2])
        store.retain("app", refs[:1])
        got = store.collect_garbage()
        assert (got["owners"], got["owner_names"], got["reclaimed_files"]) == (2, ["app"], 0)
        store.release_publications(refs[2:])
        store.release("app")
        got = store.collect_garbage()
        assert (got["owners"], got["reclaimed_files"]) == (0, 1)
