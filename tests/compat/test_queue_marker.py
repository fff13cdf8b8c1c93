"""straw-queue's queue marker ``<root>/queues/<digest(queue_id)>/run.json``: a namespaced
queue's callers (vime among them) decide ``recover=`` by whether it exists, so straw
writes it, durably before the queue's first epoch, and honours it (``straw.queue_marker``).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from fault_injection.faultyfs import FaultyFS
from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec
from straw.errors import CorruptData, StorageUnavailable, UnsafeRecovery
from straw.protocol import digest

OWNER = "this test process owns the only coordinator"


def _marker(store: SharedFilesystemStore, queue_id: str) -> Path:
    # the path a straw-queue caller computes, from the store's backend root
    return Path(store.backend.root) / "queues" / digest(queue_id) / "run.json"


class Job:
    """A controller that starts its queue as vime's does: recover exactly when the
    marker is there; it submits its prompts once, on a fresh start."""

    def __init__(self, root: Path, queue_id: str, fs: FaultyFS | None = None) -> None:
        self.store = SharedFilesystemStore(root, "job", fs=fs)
        recovering = _marker(self.store, queue_id).exists()
        self.queue = Coordinator(self.store, queue_id=queue_id, namespace=True,
                                 recover=recovering, exclusive_owner=OWNER)
        self.recovered = recovering
        if not recovering:
            inp = self.store.publish([Record("prompts", b"p")], submission_id="prompts")
            self.queue.submit_tasks("prompts", [TaskSpec(f"p{i}", input_ref=inp)
                                                for i in range(3)])

    def close(self) -> None:
        self.queue.close()
        self.store.close()


def test_a_restarted_controller_probing_the_marker_recovers_its_queue(tmp_path):
    qid = "run:" + "ab" * 16
    first = Job(tmp_path, qid)
    assert not first.recovered
    (lease,) = (a.lease for a in first.queue.acquire("gen").assignments)
    first.close()  # the job stops (a kill releases the epoch lock the same way)
    second = Job(tmp_path, qid)
    assert second.recovered
    assert sorted(t.task_id for t in second.queue.pending_tasks()) == ["p0", "p1", "p2"]
    assert lease.task_id in {"p0", "p1", "p2"}
    second.close()


def test_the_marker_names_its_queue_and_run(tmp_path):
    store = SharedFilesystemStore(tmp_path, "job")
    Coordinator(store, queue_id="fork:x", namespace=True, lease_seconds=42,
                exclusive_owner=OWNER).close()
    fields = json.loads(_marker(store, "fork:x").read_text())
    assert fields["version"] == 1 and fields["run_id"] == "job"
    assert fields["queue_id"] == "fork:x" and fields["lease_seconds"] == 42


def test_a_queue_without_namespace_writes_no_marker(tmp_path):
    store = SharedFilesystemStore(tmp_path, "job")
    Coordinator(store, queue_id="rollout", exclusive_owner=OWNER).close()
    assert not (tmp_path / "queues").exists()


def test_the_marker_is_durable_before_the_first_epoch(tmp_path):
    fs = FaultyFS()
    # the first epoch file cannot be created: the coordinator stops mid-creation
    fs.plan.fail("open", errno.EIO, path=r"epochs/e-000001$")
    store = SharedFilesystemStore(tmp_path, "job", fs=fs)
    with pytest.raises((OSError, StorageUnavailable)):
        Coordinator(store, queue_id="run:1", namespace=True, exclusive_owner=OWNER)
    store.close()
    assert _marker(store, "run:1").exists()
    # marker without a queue: a fresh open is refused, a recovery starts it empty
    store = SharedFilesystemStore(tmp_path, "job")
    with pytest.raises(UnsafeRecovery, match="was created .* recover=True"):
        Coordinator(store, queue_id="run:1", namespace=True, exclusive_owner=OWNER)
    q = Coordinator(store, queue_id="run:1", namespace=True, recover=True,
                    exclusive_owner=OWNER)
    assert q.pending_tasks() == []
    q.close()


def test_a_queue_from_before_markers_gets_one_when_recovered(tmp_path):
    store = SharedFilesystemStore(tmp_path, "job")
    Coordinator(store, queue_id="old:q", namespace=True, exclusive_owner=OWNER).close()
    marker = _marker(store, "old:q")
    marker.unlink()
    marker.parent.rmdir()
    Coordinator(store, queue_id="old:q", namespace=True, recover=True,
                exclusive_owner=OWNER).close()
    assert json.loads(marker.read_text())["queue_id"] == "old:q"


@pytest.mark.parametrize("content, error", [
    (b"", CorruptData),
    (b"{\"format\": \"straw.queue-marker\", \"vers", CorruptData),
    (b"\xff\xfe not utf-8", CorruptData),
    (b"[1, 2]", CorruptData),
    (b"{\"version\": 1, \"run_id\": \"job\", \"queue_id\": \"q:1\"}", CorruptData),
    (b"{\"format\": \"straw.queue-marker\", \"version\": 9, \"run_id\": \"job\", "
     b"\"queue_id\": \"q:1\"}", CorruptData),
    (b"{\"format\": \"straw.queue-marker\", \"version\": 1, \"run_id\": \"job\", "
     b"\"queue_id\": \"q:2\"}", UnsafeRecovery),
    (b"{\"format\": \"straw.queue-marker\", \"version\": 1, \"run_id\": \"other\", "
     b"\"queue_id\": \"q:1\"}", UnsafeRecovery),
    (b" " * (70 << 10), CorruptData),
])
@pytest.mark.parametrize("recover", [False, True])
def test_a_damaged_or_foreign_marker_is_an_error_never_a_fresh_queue(
        tmp_path, content, error, recover):
    store = SharedFilesystemStore(tmp_path, "job")
    marker = _marker(store, "q:1")
    marker.parent.mkdir(parents=True)
    marker.write_bytes(content)
    with pytest.raises(error, match="queue marker .*run.json"):
        Coordinator(store, queue_id="q:1", namespace=True, recover=recover,
                    exclusive_owner=OWNER)
    assert not any((tmp_path / "runs" / "job" / "queues").rglob("e-*"))
    assert marker.read_bytes() == content  # never rewritten


def test_two_runs_of_one_root_cannot_share_a_namespaced_queue_id(tmp_path):
    Coordinator(SharedFilesystemStore(tmp_path, "a"), queue_id="q:1", namespace=True,
                exclusive_owner=OWNER).close()
    with pytest.raises(UnsafeRecovery, match="names run_id 'a'"):
        Coordinator(SharedFilesystemStore(tmp_path, "b"), queue_id="q:1", namespace=True,
                    exclusive_owner=OWNER)


def test_a_marker_reached_through_a_link_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    pool = tmp_path / "pool"
    store = SharedFilesystemStore(pool, "job")
    (pool / "queues").mkdir()
    os.symlink(outside, pool / "queues" / digest("q:1"))
    with pytest.raises(UnsafeRecovery, match="queue marker"):
        Coordinator(store, queue_id="q:1", namespace=True, exclusive_owner=OWNER)
    assert list(outside.iterdir()) == []
