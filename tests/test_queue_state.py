"""QueueState snapshots (D9): a state recovered from a snapshot behaves exactly as the state
that wrote it, although terminal tasks and commit rows are loaded only when read."""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import msgpack
import pytest

from straw.errors import CorruptData
from straw.queue.commits import CommitRecord
from straw.queue.state import QueueState
from straw.queue.tasks import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LEASED,
    PENDING,
    Task,
    TaskTable,
    bulk_objects,
)


def _ref(i: int) -> list[Any]:
    return [f"runs/r/pack-{i % 3}.pack", 100 * i, 50, f"c{i}", f"d{i}", 1]


def _fields(t: Task) -> tuple[Any, ...]:
    return (t.task_id, t.input, t.metadata, t.priority, t.key, t.max_attempts, t.control,
            t.fifo, t.status, t.attempt, t.failures, t.lease, t.position, t.last_error,
            t.allow_empty, t.estimates)


def _busy_state() -> QueueState:
    """Every status, two lanes, requeued and yielded tasks, readers, a consumer, a batch
    and a checkpoint."""
    st = QueueState()
    st.apply({"t": "submit", "req": "r1", "digest": "x", "producer": ["p", {"n": [1, 2]}],
              "tasks": [[f"t{i:02d}", _ref(i) if i % 2 else None, {"i": i, "l": [i]},
                         i % 3, i % 4, 2, "ctl" if i % 5 == 0 else None]
                        for i in range(30)]})
    st.apply({"t": "lease", "epoch": 1, "worker": "w",
              "grants": [[f"t{i:02d}", 1] for i in range(30) if i % 5]})
    for i in range(1, 30, 5):  # completed
        st.apply({"t": "complete", "task": f"t{i:02d}", "attempt": 1, "sub": f"s{i}",
                  "result": _ref(100 + i), "digest": f"d{100 + i}", "epoch": 1,
                  "meta": {"m": i} if i % 2 else None})
    st.apply({"t": "fail", "task": "t02", "attempt": 1, "error": "boom", "final": True})
    st.apply({"t": "fail", "task": "t03", "attempt": 1, "error": "again", "final": False})
    st.apply({"t": "expire", "task": "t04", "attempt": 1})
    st.apply({"t": "cancel", "task": "t07"})
    st.apply({"t": "yield", "req": "y", "digest": "z",
              "updates": [["t08", 1, _ref(8), 5, 0, {"y": 1}]]})
    st.apply({"t": "release", "leases": [["t09", 1]]})
    # the current row and transaction shapes: allow_empty and estimates, request ids on
    # control calls, progress kept under a lease, a retired worker's leases revoked
    st.apply({"t": "submit", "req": "r3", "digest": "x3", "producer": None,
              "tasks": [[f"n{i}", _ref(i), {}, 0, 0, 2, i == 3, i == 1, 0 if i == 3 else 2,
                         0, 5] for i in range(4)]})
    st.apply({"t": "lease", "epoch": 1, "worker": "v", "grants": [[f"n{i}", 1] for i in range(4)]})
    st.apply({"t": "progress", "req": "p", "digest": "pd", "updates": [["n0", 1, _ref(40)]],
              "result": ["saved"]})
    st.apply({"t": "fail", "task": "n1", "attempt": 1, "error": {"category": "x"},
              "final": False, "req": "f", "digest": "fd", "result": ["pending"]})
    st.apply({"t": "cancel", "task": "n3", "req": "c", "digest": "cd", "result": ["cancelled"]})
    st.apply({"t": "retire", "worker": "v", "revoke": True})
    st.apply({"t": "cons_open", "consumer": "training", "token": 1})
    st.apply({"t": "batch_plan", "batch": "b", "positions": [0, 1]})
    st.apply({"t": "cons_save", "consumer": "training", "token": 1, "fetch": 3,
              "processed": 2, "state": _ref(7), "finished": []})
    st.apply({"t": "ckpt", "id": "k", "ref": _ref(9), "cursor": 1})
    return st


def _recovered(st: QueueState) -> QueueState:
    data = msgpack.packb(st.to_snapshot(), use_bin_type=True)
    return QueueState.from_snapshot(msgpack.unpackb(data, raw=False))


def _observable(st: QueueState) -> dict[str, Any]:
    return {
        "tasks": {tid: _fields(t) for tid, t in st.tasks.items()},
        "commits": list(st.commits), "submissions": dict(st.submissions),
        "pending": st.pending_in_order(), "requests": st.requests, "reads": st.reads,
        "counts": (st.pending_count, st.leased_count, st.fifo, st.epoch, st.sealed),
        "live_refs": st.live_refs("training"), "retired": st.retirement_cursor("training"),
    }


def test_recovered_state_is_the_state_that_wrote_the_snapshot() -> None:
    st = _busy_state()
    statuses = {t.status for t in st.tasks.values()}
    assert statuses == {PENDING, LEASED, COMPLETED, FAILED, CANCELLED}
    rec = _recovered(st)
    # written back before anything was read: the very same snapshot
    assert msgpack.packb(rec.to_snapshot()) == msgpack.packb(st.to_snapshot())
    assert _observable(rec) == _observable(st)
    assert msgpack.packb(rec.to_snapshot()) == msgpack.packb(st.to_snapshot())
    assert rec.tasks == st.tasks and rec.commits == st.commits  # heaps differ: stale entries
    # and both go on identically
    for s in (st, rec):
        s.apply({"t": "epoch", "epoch": 2})
        s.apply({"t": "submit", "req": "r2", "digest": "x", "producer": None,
                 "tasks": [["n1", None, {}, 9, 0, 1, None]]})
        s.apply({"t": "lease", "epoch": 2, "worker": "v", "grants": [["n1", 1]]})
        s.apply({"t": "complete", "task": "n1", "attempt": 1, "sub": "sn", "result": _ref(1),
                 "digest": "d1", "epoch": 2, "meta": None})
    assert _observable(rec) == _observable(st)


def test_terminal_tasks_load_once_and_stay_loaded() -> None:
    rec = _recovered(_busy_state())
    table = rec.tasks
    loaded = {t.task_id for t in table.loaded()}
    assert all(table[tid].status not in (COMPLETED, FAILED, CANCELLED) for tid in loaded)
    assert "t01" not in loaded and "t01" in table and "nope" not in table
    t = table["t01"]
    assert t.status == COMPLETED and t.metadata == {"i": 1, "l": [1]}
    assert table.get("t01") is t and table["t01"] is t  # the same object from now on
    assert table.get("nope") is None and table.get("nope", 0) == 0
    with pytest.raises(KeyError):
        table["nope"]
    ids = [f"t{i:02d}" for i in range(30)] + [f"n{i}" for i in range(4)]
    assert len(table) == 34 and list(table) == ids
    t.last_error = "changed"  # a change to a loaded task is kept
    assert table["t01"].last_error == "changed"
    assert len(list(table.values())) == 34 and len(list(table.loaded())) == 34


def test_commit_log_reads_as_records() -> None:
    st = _busy_state()
    rec = _recovered(st)
    assert len(rec.commits) == len(st.commits) == 6
    assert rec.commits[2] == st.commits[2] and isinstance(rec.commits[2], CommitRecord)
    assert rec.commits[-1].task_id == st.commits[-1].task_id
    assert rec.commits[1:4] == st.commits[1:4]
    assert all(isinstance(c, CommitRecord) for c in rec.commits[:])
    assert rec.submissions == {f"s{i}": n for n, i in enumerate(range(1, 30, 5))}


def test_malformed_snapshot_rows_are_corrupt_data() -> None:
    snap = _busy_state().to_snapshot()
    bad = dict(snap, task_meta=snap["task_meta"][:-1])
    with pytest.raises(CorruptData, match="metadata"):
        QueueState.from_snapshot(msgpack.unpackb(msgpack.packb(bad), raw=False))
    rows = msgpack.unpackb(snap["commits"])
    bad = dict(snap, commits=msgpack.packb([r[:-1] for r in rows]))
    with pytest.raises(CorruptData, match="commit rows"):
        QueueState.from_snapshot(msgpack.unpackb(msgpack.packb(bad), raw=False))
    rows = msgpack.unpackb(snap["tasks"])
    bad = dict(snap, tasks=msgpack.packb(rows + rows[:1]),
               task_meta=snap["task_meta"] + [None])
    with pytest.raises(CorruptData, match="twice"):
        QueueState.from_snapshot(msgpack.unpackb(msgpack.packb(bad), raw=False))


def test_empty_table() -> None:
    table = TaskTable()
    assert len(table) == 0 and table.get("x") is None and list(table.values()) == []
    assert table.to_snapshot_rows() == ([], [])


def test_bulk_objects_restores_the_collector() -> None:
    assert gc.isenabled()
    with bulk_objects(promote=True):
        assert not gc.isenabled()
        with bulk_objects(promote=True):
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    # an application's frozen objects stay frozen
    keep = [[] for _ in range(10)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with bulk_objects(promote=True):
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with bulk_objects():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()
    del keep


def test_best_pending_takes_k_distinct_tasks_in_order_and_keeps_the_heap():
    """Q4 in bulk: acquire(max_tasks=k) surfaces k entries (O(k log n)), never the same
    task twice (a requeued task has a duplicate entry), and choosing changes nothing."""
    st = QueueState()
    st.apply({"t": "submit", "req": "r", "digest": "x", "producer": None,
              "tasks": [[f"t{i}", None, {}, i % 3, -i, 3, None] for i in range(50)]})
    want = st.pending_in_order()
    st.apply({"t": "lease", "epoch": 1, "worker": "w", "grants": [[want[0], 1]]})
    st.apply({"t": "release", "leases": [[want[0], 1]]})  # requeued: same position
    assert st.pending_in_order() == want
    for prefix in (None, "t1"):
        expect = [t for t in want if prefix is None or t.startswith(prefix)]
        for k in (1, 7, 50, 80):
            got = [t.task_id for t in st.best_pending(False, k, prefix)]
            assert got == expect[:k]
    assert st.best_pending(True, 5) == []  # the control lane is empty
    assert st.pending_in_order() == want  # nothing was taken


def test_status_counts_do_not_load_history():
    st = _busy_state()
    want = Counter(t.status for t in st.tasks.values())
    back = QueueState.from_snapshot(msgpack.unpackb(msgpack.packb(st.to_snapshot())))
    before = len(list(back.tasks.loaded()))
    assert back.tasks.status_counts() == want
    assert len(list(back.tasks.loaded())) == before < len(back.tasks)


class _Node:
    other: object = None


def test_promotion_does_not_carry_young_garbage_to_the_oldest_generation():
    """Garbage moved by freeze/unfreeze would wait for a full collection (uncounted):
    recovering thousands of small queues in the crash campaign ran out of memory."""
    import weakref

    a = _Node()
    a.other = a  # a cycle: only the collector frees it
    dead = weakref.ref(a)
    del a
    with bulk_objects(promote=True):
        pass
    assert dead() is None


def test_producer_state_references_are_live_and_survive_a_snapshot() -> None:
    from straw.refs import record_set_ref, ref_to_tuple

    good = record_set_ref("r", "runs/r/writers/w/i000001/pack-000001.pack", 64, 200,
                          "a" * 32, "b" * 32, 1, 1, 10, 0)
    # a dict of a reference's five keys that is no reference (journaled by a straw that did
    # not check producer states): not a root, and no reason to stop a recovery
    bogus = {"manifest": {}, "digest": "x", "records": 1, "payload_bytes": 0, "tokens": 0}
    st = QueueState()
    st.apply({"t": "submit", "req": "r1", "digest": "d1", "tasks": [],
              "producer": ["data", {"cursor": [good.to_dict()], "old": bogus}]})
    assert ref_to_tuple(good) in st.live_refs("training")
    again = QueueState.from_snapshot(msgpack.unpackb(
        msgpack.packb(st.to_snapshot(), use_bin_type=True), raw=False))
    assert again.producer_refs == st.producer_refs == {"data": frozenset({ref_to_tuple(good)})}
    st.apply({"t": "submit", "req": "r2", "digest": "d2", "tasks": [],
              "producer": ["data", {"cursor": []}]})
    assert ref_to_tuple(good) not in st.live_refs("training")
