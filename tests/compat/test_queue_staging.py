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
