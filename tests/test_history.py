"""Queue history segments (issue 13): a recovered coordinator reads live state plus the
history manifest, and completed history stays answerable from the segments (D9, H1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from straw import CorruptData, IdempotencyConflict, Record, SharedFilesystemStore
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.protocol import Limits, TaskSpec
from straw.queue.history import BLOCK_ENTRIES, MISSING, Delta, History
from straw.queue.tasks import COMPLETED, Task


@pytest.fixture
def store(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run", clock=ManualClock(), reserve_bytes=0,
                               visibility_retries=1) as s:
        yield s


def _coord(store, **kw) -> Coordinator:
    kw.setdefault("queue_id", "work")
    kw.setdefault("lease_seconds", 10)
    kw.setdefault("limits", Limits(max_leases_per_worker=10**6))
    return Coordinator(store, **kw)


def _complete_all(store, q, worker="w0"):  # type: ignore[no-untyped-def]
    receipts = []
    for a in q.acquire(worker, max_tasks=10**6).assignments:
        ref = store.publish([Record("out", a.lease.task_id.encode(), metadata={
            "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})],
            submission_id=f"out-{a.lease.task_id}")
        receipts.append((a.lease, ref, q.complete_task(
            a.lease, submission_id=f"done-{a.lease.task_id}", result_ref=ref)))
    return receipts


def _history_files(q: Coordinator) -> list[str]:
    return sorted(n for n in os.listdir(q.history_dir) if n.endswith(".hist"))


# --- segments on their own -------------------------------------------------------------

def test_segment_lookups_misses_and_commit_rows(tmp_path):
    fs = PosixFS()
    n = 3 * BLOCK_ENTRIES + 5
    delta = Delta(subs=[(f"s{i:05d}", i) for i in reversed(range(n))],
                  reqs=[("req-a", ["d", ["x", "y"]])],
                  commits=[(f"t{i}", 1, f"s{i:05d}", ("p", i, 9, "c", "d", 1, 1, 10, 2),
                            "dg", 1, None) for i in range(n)], lo=0)
    h = History(fs, str(tmp_path / "h")).extended(delta, 1, 7)
    assert h.commit_count == n and h.counts["s"] == n
    for i in (0, BLOCK_ENTRIES - 1, BLOCK_ENTRIES, n - 1):
        assert h.get("s", f"s{i:05d}") == i
        assert h.commit(i)[0] == f"t{i}" and h.commit(i)[3][:2] == ("p", i)
    assert h.get("s", "s99999") is MISSING and h.get("s", "") is MISSING
    assert h.get("t", "s00001") is MISSING  # another table
    assert h.get("r", "req-a") == ["d", ["x", "y"]]
    assert [k for k, _ in h.items("s")] == sorted(f"s{i:05d}" for i in range(n))
    with pytest.raises(IndexError):
        h.commit(n)
    assert h.commit_usage(0) == [10 * n, n, 2 * n]
    assert h.commit_usage(BLOCK_ENTRIES + 3) == [10 * (n - BLOCK_ENTRIES - 3),
                                                 n - BLOCK_ENTRIES - 3,
                                                 2 * (n - BLOCK_ENTRIES - 3)]


def test_segments_fold_like_a_binary_counter(tmp_path):
    fs = PosixFS()
    h = History(fs, str(tmp_path / "h"))
    lo = 0
    for step in range(16):
        h = h.extended(Delta(subs=[(f"k{step}-{i}", lo + i) for i in range(10)],
                             commits=[(f"t{lo + i}", 1, "s", ("p", 0, 1, "c", "d", 1), "d", 1, None)
                                      for i in range(10)], lo=lo), 1, step)
        lo += 10
        h.cleanup(1)
        assert len(h.segments) <= 5  # O(log n): 16 deltas fold into one
        assert sorted(os.listdir(tmp_path / "h")) == sorted(h.names())
    assert len(h.segments) == 1 and h.commit_count == 160
    assert all(h.get("s", f"k{s}-{i}") == s * 10 + i for s in range(16) for i in range(10))


# --- the coordinator: open reads live state only ----------------------------------------

def test_recovery_reads_live_state_and_history_stays_answerable(store):
    q = _coord(store, snapshot_every=25)
    q.submit_tasks("sub-1", [TaskSpec(f"t{i:03d}", metadata={"n": [i]}) for i in range(120)])
    done = _complete_all(store, q)
    q.submit_tasks("sub-2", [TaskSpec("live-1"), TaskSpec("live-2")])
    page = q.read_commits(0, 1000)
    status_before = q.task_status("t007")
    q.close()
    assert _history_files(q)

    q2 = _coord(store, recover=True)
    st = q2.state
    # what recovery decoded: the live tasks and the commits after the last snapshot only
    assert len(st.commits.rows()) < 25 and st.commits.base > 95
    assert sum(1 for _ in st.tasks.loaded()) < 30
    assert not any(isinstance(v, int) for v in st.tasks._map.values())
    assert len(st.submissions.live) < 25
    # ...and history answers every question about the past
    assert q2.metrics()["completed"] == 120 and len(st.tasks) == 122
    assert q2.task_status("t007") == status_before
    assert q2.task_status("t007")["state"] == COMPLETED
    assert q2.task_status("nope") is None
    assert q2.read_commits(0, 1000) == page
    with pytest.raises(IdempotencyConflict, match="t003"):  # an old task id again
        q2.submit_tasks("sub-3", [TaskSpec("t003")])
    # the request id of an old submit replays its answer; other content conflicts
    assert q2.submit_tasks("sub-1", [TaskSpec(f"t{i:03d}", metadata={"n": [i]})
                                     for i in range(120)]) == [f"t{i:03d}" for i in range(120)]
    with pytest.raises(IdempotencyConflict):
        q2.submit_tasks("sub-1", [TaskSpec("other")])
    lease, ref, receipt = done[3]
    assert q2.lookup_submission(f"done-{lease.task_id}") == receipt
    assert q2.complete_task(lease, submission_id=f"done-{lease.task_id}",
                            result_ref=ref) == receipt  # a retry after the lease ended
    assert q2.tasks["t005"]["spec"]["metadata"] == {"n": [5]}
    assert len(q2.commits) == 120 and len(q2.submissions) == 120
    # the queue keeps serving: live tasks complete after the history
    more = _complete_all(store, q2)
    assert [r.position for _, _, r in more] == [120, 121]
    q2.close()


def test_history_survives_several_recoveries_and_folds(store):
    q = _coord(store, snapshot_every=10)
    for r in range(6):
        q.submit_tasks(f"r{r}", [TaskSpec(f"t{r}-{i}") for i in range(15)])
        _complete_all(store, q)
        q.close()
        q = _coord(store, recover=True, snapshot_every=10)
    assert q.metrics()["completed"] == 90
    assert [c.task_id for c in q.read_commits(0, 100).commits] == [
        f"t{r}-{i}" for r in range(6) for i in range(15)]
    assert len(_history_files(q)) <= 6
    q.close()


def test_missing_history_segment_fails_closed(store):
    q = _coord(store, snapshot_every=10)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(30)])
    _complete_all(store, q)
    q.close()
    victim = _history_files(q)[0]
    os.unlink(os.path.join(q.history_dir, victim))
    with pytest.raises(CorruptData, match=victim):
        _coord(store, recover=True)


def test_damaged_history_block_is_corrupt_data_not_a_miss(store):
    q = _coord(store, snapshot_every=10)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(30)])
    _complete_all(store, q)
    q.close()
    q2 = _coord(store, recover=True)
    for name in _history_files(q2):
        path = Path(q2.history_dir) / name
        data = bytearray(path.read_bytes())
        data[100] ^= 0x40  # inside the first block
        path.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="history segment"):
        for i in range(30):
            q2.task_status(f"t{i}")
    q2.close()


def test_orphan_segment_of_an_interrupted_snapshot_is_ignored_then_deleted(store):
    q = _coord(store, snapshot_every=10)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(12)])
    _complete_all(store, q)
    named = set(q.state.history.names())
    # a snapshot that died after writing its segment, before the journal snapshot
    orphan = History(store.fs, q.history_dir).extended(
        Delta(tasks=[("ghost", [["ghost"], None])], lo=0), q.epoch_number, 999)
    q.close()
    q2 = _coord(store, recover=True, snapshot_every=5)
    assert "ghost" not in q2.state.tasks and q2.task_status("ghost") is None
    q2.submit_tasks("r2", [TaskSpec(f"u{i}") for i in range(6)])
    _complete_all(store, q2)  # snapshots, then deletes what it does not name
    left = set(_history_files(q2))
    assert not (orphan.names() - named) & left
    q2.close()


def test_history_task_roundtrip_keeps_tuples_and_json_lists():
    from straw.queue.tasks import history_value, task_from_history
    t = Task("a", ("p", 1, 2, "c", "d", 1, 0, 3, 4), {"x": [1, 2]}, 1, 2, 3, False, 5,
             status=COMPLETED, attempt=1, lease=(1, "w", 2), position=0,
             last_error={"e": [1]}, estimates=(1, 2, 3))
    import msgpack
    back = task_from_history(msgpack.unpackb(msgpack.packb(history_value(t)), raw=False))
    assert back == t


def test_snapshot_size_follows_live_state_not_history(store):
    """D9: the journal snapshot carries the live state and the history manifest; before
    history segments it grew with every completed task."""
    q = _coord(store, snapshot_every=10**6)
    sizes = []
    for r in range(3):
        q.submit_tasks(f"r{r}", [TaskSpec(f"t{r}-{i}") for i in range(100)])
        _complete_all(store, q)
        q.submit_tasks(f"live{r}", [TaskSpec(f"live{r}-{i}") for i in range(5)])
        q.snapshot()
        snaps = [p for p in Path(q.journal_dir).iterdir() if p.name.endswith(".snap")]
        sizes.append(max(p.stat().st_size for p in snaps))
    q.close()
    # three times the history, and the live state grew by 10 tasks: the snapshot barely
    assert sizes[2] < sizes[0] * 1.5, sizes


def test_usage_of_unprocessed_commits_from_block_sums(store):
    """metrics()' usage of accepted, unprocessed results: history answers from per-block
    sums, and the figures are those of the rows themselves."""
    from straw.queue.history import row_usage
    q = _coord(store, snapshot_every=40)
    q.submit_tasks("r", [TaskSpec(f"t{i:03d}") for i in range(300)])
    _complete_all(store, q)
    log = q.state.commits
    assert log.base > 200  # most of it in history segments
    for start, skip in ((0, ()), (5, (7, 8, 299)), (130, (131,)), (log.base, ()), (299, ())):
        want = [0, 0, 0]
        for p in range(start, len(log)):
            if p not in skip:
                for k, v in enumerate(row_usage(log._row(p))):
                    want[k] += v
        got = log.usage(start, skip)
        assert [got["bytes"], got["records"], got["tokens"]] == want
        assert want[1] == len(log) - start - len([p for p in skip if p >= start])
    assert q.metrics()["usage_with_reservations"]["accepted_unprocessed"]["records"] == 300
    q.close()
