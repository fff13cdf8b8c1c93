"""Staging over dependencies (SPEC ``release_publications``, straw-queue's rule): releasing
a publication, or a queue adopting it, drops the staging of what it depends on too, so a
result's tensors need no release of their own and are reclaimed with it; a dependency that
something else still reaches (another staged publication, an owner, the queue) stays."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from straw import InvalidReference, Record, SharedFilesystemStore
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.protocol import TaskSpec
from straw.tensor import publish_tensors


@pytest.fixture
def store(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run", clock=ManualClock(), reserve_bytes=0,
                               visibility_retries=1) as s:
        yield s


def _readable(store: SharedFilesystemStore, ref) -> bool:  # type: ignore[no-untyped-def]
    with store.read_session() as s:  # a fresh session: a cached descriptor could still read
        try:
            next(s.read(ref))
        except InvalidReference:
            return False
    return True


def _staged(store: SharedFilesystemStore, ref) -> bool:  # type: ignore[no-untyped-def]
    with store.catalog.locked() as st:
        return st.may_be_staged((ref.path, ref.offset))


def test_release_drops_the_staging_of_the_whole_dependency_closure(store):
    leaf = store.publish([Record("leaf", b"l" * 100)], submission_id="leaf")
    store.seal()  # the leaf in a pack of its own: a catalog edge reaches it
    near = store.publish([Record("near", b"n" * 100)], submission_id="near")  # same pack
    mid = store.publish([Record("mid", b"m")], submission_id="mid", dependencies=[leaf])
    top = store.publish([Record("top", b"t")], submission_id="top",
                        dependencies=[mid, near])
    store.seal()
    assert store.release_publications([top]) == 1
    for ref in (top, mid, near, leaf):
        assert not _staged(store, ref)
    # only the named publications count: the dependencies are not "still staged" ones now
    assert store.release_publications([mid, leaf]) == 0
    got = store.collect_garbage()
    assert got["reclaimed_files"] == 2
    assert not any(_readable(store, r) for r in (top, mid, near, leaf))


def test_a_dependency_something_else_reaches_stays(store):
    shared = store.publish([Record("shared", b"s" * 64)], submission_id="shared")
    store.seal()
    kept = store.publish([Record("kept", b"k" * 64)], submission_id="kept")
    store.seal()  # one pack each: one live extent keeps its whole pack
    a = store.publish([Record("a", b"a")], submission_id="a", dependencies=[shared, kept])
    b = store.publish([Record("b", b"b")], submission_id="b", dependencies=[shared])
    store.seal()
    store.retain("app", [kept])
    store.release_publications([a])
    store.collect_garbage()
    # b is still staged and reaches shared; the owner keeps kept
    assert _readable(store, shared) and _readable(store, kept) and _readable(store, b)
    store.release_publications([b])
    store.collect_garbage()
    assert not _readable(store, shared) and not _readable(store, a)
    assert _readable(store, kept)
    store.release("app")
    assert store.collect_garbage()["reclaimed_files"] == 1
    assert not _readable(store, kept)


def test_a_record_set_releases_the_publications_of_its_records(store):
    refs = store.write_records([Record("x", b"x" * 32), Record("y", b"y" * 32)],
                               submission_id="recs")
    store.seal()
    rs = store.record_set(refs, submission_id="set")
    store.seal()
    store.release_publications([rs])
    assert not _staged(store, refs[0].segment)
    assert store.collect_garbage()["reclaimed_files"] == 2


def test_a_release_during_an_unreadable_dependency_keeps_that_branch(store, tmp_path):
    dep = store.publish([Record("dep", b"d" * 64)], submission_id="dep")
    store.seal()
    top = store.publish([Record("top", b"t")], submission_id="top", dependencies=[dep])
    store.seal()
    # the dependency's pack is damaged: the walk cannot read what it needs, so it stays
    # staged (kept longer, never reclaimed early); the named publication is released
    (tmp_path / dep.path).write_bytes(b"\0" * 16)
    assert store.release_publications([top]) == 1
    assert not _staged(store, top)
    assert _staged(store, dep)


def test_a_queue_adopting_a_result_consumes_its_tensors_staging(store):
    """The worker publishes tensors and a result naming them and completes the task; it
    releases nothing.  Once training processed the result, the queue's collection
    reclaims the result and its tensors (before, the tensors' staging kept them forever)."""
    q = Coordinator(store, queue_id="work", lease_seconds=10)
    prompt = store.publish([Record("prompt", b"p")], submission_id="prompt")
    q.submit_tasks("r", [TaskSpec("t0", input_ref=prompt)])
    (a,) = q.acquire("w0").assignments
    store.seal()
    (tensors,) = publish_tensors(store, {"routes": np.arange(4096, dtype=np.int32)},
                                 submission_id="tensors")
    store.seal()  # the tensors in a pack of their own
    result = store.publish(
        [Record("out", b"answer", metadata={"task_id": a.lease.task_id,
                                            "attempt_id": a.lease.attempt_id})],
        submission_id="result", dependencies=[tensors.blob_set])
    store.seal()
    q.complete_task(a.lease, submission_id="done", result_ref=result)
    q.collect_garbage()
    # not processed yet: the queue keeps the result, and through it the tensors
    assert _readable(store, result) and _readable(store, tensors.blob_set)
    assert not _staged(store, tensors.blob_set)
    tok = q.open_consumer("training", exclusive_owner="the test")
    state = store.publish([Record("state", json.dumps({"v": 1}).encode(), codec="json.v1")],
                          submission_id="state")
    q.save_consumer_state("training", token=tok, request_id="s1", state_ref=state,
                          fetch_cursor=1, processed_cursor=1)
    got = q.collect_garbage()
    assert not _readable(store, result) and not _readable(store, tensors.blob_set)
    assert got["reclaimed_files"] >= 2
    assert _readable(store, state)  # the consumer's state is the queue's now
    q.close()
    assert dataclasses.asdict(a.lease)["task_id"] == "t0"
