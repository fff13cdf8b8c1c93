"""Queue ids as straw-queue's callers write them (vime: ``run:<hex>``, ``fork:<sha256>``,
``debug:<uuid>`` with ``namespace=True``) open, serve and recover; ids that could leave
the queue's directory are refused before anything is created (``straw.queue_names``)."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec
from straw.coordinator import queue_dir
from straw.queue_names import MAX_QUEUE_ID_CHARS, check_queue_id, queue_dir_name

OWNER = "this test process owns the only coordinator"

CALLER_IDS = [
    "run:" + uuid.uuid4().hex,
    "fork:" + hashlib.sha256(b"/save/branch").hexdigest(),
    f"debug:{uuid.uuid4()}",
    "with space",
    "ünïcödé-queue",
    "back\\slash",
    ".hidden",
    "_leading-underscore",
    "run%3Aalready-encoded",
    "q" * MAX_QUEUE_ID_CHARS,
    "語" * 300,  # 900 bytes of UTF-8: stored under a hashed name
]


def _queues_root(tmp_path: os.PathLike[str], run: str, namespace: str) -> str:
    return os.path.join(os.fspath(tmp_path), "runs", run, "queues", namespace)


@pytest.mark.parametrize("queue_id", CALLER_IDS, ids=range(len(CALLER_IDS)))
def test_caller_ids_serve_and_recover_under_one_safe_directory(tmp_path, queue_id):
    store = SharedFilesystemStore(tmp_path, "ids")
    inp = store.publish([Record("in", b"in")], submission_id="in")
    q = Coordinator(store, queue_id=queue_id, namespace=True, exclusive_owner=OWNER)
    q.submit_tasks("seed", [TaskSpec("t0", input_ref=inp), TaskSpec("t1", input_ref=inp)])
    (lease,) = (a.lease for a in q.acquire("w").assignments)
    assert lease.queue_id == queue_id
    q.close()
    # the queue lives in exactly one new directory, directly under the namespace
    names = os.listdir(_queues_root(tmp_path, "ids", "namespaced"))
    assert names == [queue_dir_name(queue_id)]
    assert len(names[0].encode()) <= 255 and "/" not in names[0]
    assert q.dir == queue_dir(store.root, "ids", "namespaced", queue_id)
    again = Coordinator(store, queue_id=queue_id, namespace=True, recover=True,
                        exclusive_owner=OWNER)
    assert sorted(t.task_id for t in again.pending_tasks()) == ["t0", "t1"]  # revoked lease
    again.close()


def test_ids_straw_accepted_before_keep_their_directory(tmp_path):
    store = SharedFilesystemStore(tmp_path, "ids")
    Coordinator(store, queue_id="rollout-7.b_2", exclusive_owner=OWNER).close()
    assert os.listdir(_queues_root(tmp_path, "ids", "default")) == ["rollout-7.b_2"]


def test_an_id_that_reads_like_an_encoding_is_a_queue_of_its_own(tmp_path):
    store = SharedFilesystemStore(tmp_path, "ids")
    inp = store.publish([Record("in", b"in")], submission_id="in")
    for qid in ("run:ab", "run%3Aab", "run%253Aab"):
        q = Coordinator(store, queue_id=qid, namespace=True, exclusive_owner=OWNER)
        q.submit_tasks("seed", [TaskSpec(qid, input_ref=inp)])
        q.close()
    for qid in ("run:ab", "run%3Aab", "run%253Aab"):
        q = Coordinator(store, queue_id=qid, namespace=True, recover=True,
                        exclusive_owner=OWNER)
        assert [t.task_id for t in q.pending_tasks()] == [qid]
        q.close()


REFUSED = ["", "a/b", "/abs", "..", ".", "a\x00b", "a\nb", "tab\there", "del\x7f",
           "c1\x85", "x" * (MAX_QUEUE_ID_CHARS + 1), "lone\ud800surrogate"]


@pytest.mark.parametrize("queue_id", REFUSED, ids=range(len(REFUSED)))
@pytest.mark.parametrize("namespace", [True, False])
def test_ids_that_could_leave_the_directory_are_refused_before_anything_exists(
        tmp_path, queue_id, namespace):
    store = SharedFilesystemStore(tmp_path, "ids")
    with pytest.raises(ValueError, match="queue_id .*choose another id"):
        Coordinator(store, queue_id=queue_id, namespace=namespace, exclusive_owner=OWNER)
    assert not os.path.exists(os.path.join(os.fspath(tmp_path), "runs", "ids", "queues"))
    assert not os.path.exists(os.path.join(os.fspath(tmp_path), "queues"))


def test_a_non_str_id_is_a_type_error(tmp_path):
    store = SharedFilesystemStore(tmp_path, "ids")
    with pytest.raises(TypeError, match="queue_id must be a str"):
        Coordinator(store, queue_id=b"bytes", exclusive_owner=OWNER)  # type: ignore[arg-type]


accepted_ids = st.text(min_size=1, max_size=40).filter(
    lambda s: _accepted(s))


def _accepted(value: str) -> bool:
    try:
        check_queue_id(value)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(accepted_ids, accepted_ids)
def test_dir_names_are_single_safe_components_and_never_shared(a, b):
    for qid in (a, b):
        name = queue_dir_name(qid)
        assert name not in (".", "..") and "/" not in name and "\x00" not in name
        assert 0 < len(name.encode()) <= 255
    assert (queue_dir_name(a) == queue_dir_name(b)) == (a == b)
