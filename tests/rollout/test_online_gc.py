"""Online GC in the rollout layer: collection in the background after acknowledgements,
a failure latched and raised with its cause by every later call and at shutdown, stored
data readable after it, and a full disk (ENOSPC from the fault-injection filesystem)
that never resets the queue."""

from __future__ import annotations

import errno
import threading

import pytest

from fault_injection.faultyfs import FaultyFS
from straw import SharedFilesystemStore, StorageUnavailable
from straw.rollout import BatchBuilder, EnvironmentMix, OnlineGC, OnlineGCFailed, RolloutConfig

from .pool import Pool, make_group

ON = RolloutConfig(online_gc=True)


def accept_two_batches(pool: Pool) -> None:
    """Batch 0's groups in a sealed pack of their own, batch 1's in the next."""
    pool.accept([make_group(i, routes=(3, 2)) for i in range(2)])
    pool.gen.seal()
    pool.accept([make_group(i, routes=(3, 2)) for i in range(2, 4)])


def test_online_gc_reclaims_a_finished_batch_in_the_background(tmp_path):
    pool = Pool(str(tmp_path / "pool"))
    try:
        accept_two_batches(pool)
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                          config=ON) as b:
            refs = b.next_batch(0)
            assert b.online_gc is not None and b.online_gc.runs == 0  # none before RL4
            b.finish_batch(refs[0].batch_id)
            result = b.wait_for_gc()
            assert result["reclaimed_files"] == 1 and b.online_gc.runs == 1
            assert result["tombstoned"][0].startswith("runs/job/writers/gen-0/")
            nxt = b.next_batch(1)  # the rest of the queue is untouched
            assert {s["group_index"] for r in nxt for s in r.load(pool.store).samples} \
                == {2, 3}
    finally:
        pool.close()


def test_online_gc_is_off_by_default(tmp_path):
    pool = Pool(str(tmp_path / "pool"))
    try:
        accept_two_batches(pool)
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2) as b:
            b.finish_batch(b.next_batch(0)[0].batch_id)
            assert b.online_gc is None
            with pytest.raises(RuntimeError, match="online GC is off"):
                b.wait_for_gc()
        assert pool.coord.collect_garbage()["reclaimed_files"] == 1  # left to the caller
    finally:
        pool.close()


def test_a_gc_failure_is_latched_and_raised_with_its_cause_by_every_later_call():
    calls = []
    cause = StorageUnavailable("pool unreachable")

    def collect():
        calls.append(1)
        if len(calls) == 2:
            raise cause
        return {"reclaimed_files": 0}

    gc = OnlineGC(collect)
    gc.request()
    assert gc.wait() == {"reclaimed_files": 0}
    gc.request()
    for call in (gc.wait, gc.check, gc.request, gc.check, gc.close):
        with pytest.raises(OnlineGCFailed, match="pool unreachable") as e:
            call()
        assert e.value.__cause__ is cause
    assert len(calls) == 2  # nothing collected after the failure


def test_paused_holds_collections_back_and_they_run_after():
    inside = threading.Event()
    runs_inside = []
    gc = OnlineGC(lambda: runs_inside.append(inside.is_set()))
    with gc.paused():
        inside.set()
        for _ in range(3):
            gc.request()
        inside.clear()
    gc.wait()
    assert runs_inside == [False]  # one run (requests coalesce), after the block
    gc.close()


def test_a_full_disk_during_online_gc_is_raised_and_never_resets_the_queue(tmp_path):
    root = str(tmp_path / "pool")
    fs = FaultyFS()
    pool = Pool(root, fs=fs)
    accept_two_batches(pool)
    b = BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                     config=ON)
    refs = b.next_batch(0)
    batch_id = refs[0].batch_id
    assert b.online_gc is not None
    with b.online_gc.paused():
        b.finish_batch(batch_id)  # durable; its collection waits for the full disk
        saved = pool.coord.load_consumer_state("training")
        commits = len(pool.coord.commits)
        fs.plan.fail(["writev", "fsync", "fdatasync"], errno.ENOSPC, path=r"CATALOG",
                     count=None)
    with pytest.raises(OnlineGCFailed) as e:
        b.wait_for_gc()
    cause = e.value.__cause__
    assert isinstance(cause, StorageUnavailable), repr(cause)
    for call in (lambda: b.next_batch(1), lambda: b.finish_batch(batch_id), b.state):
        with pytest.raises(OnlineGCFailed) as later:
            call()
        assert later.value.__cause__ is cause
    # stored data stays readable: a rank loads its shard and its routes
    with SharedFilesystemStore(root, "job") as rank_store:
        shard = refs[1].load(rank_store, rank=1)
        assert shard.samples[0]["routes"].load().shape == (7, 3, 2)
    with pytest.raises(OnlineGCFailed) as at_close:
        b.close()
    assert at_close.value.__cause__ is cause
    # space freed: the queue goes on where it was (nothing reset, nothing lost) and the
    # next collection reclaims batch 0's pack
    fs.plan.errno_rules.clear()
    assert pool.coord.load_consumer_state("training") == saved
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      config=ON) as b:
        assert b.state()["recent_finished"] == [batch_id]
        assert b.online_gc is not None
        b.online_gc.request()
        assert b.wait_for_gc()["reclaimed_files"] == 1
        assert b.next_batch(0) == refs  # ready: returned again
    pool.close()
    # and a restarted job recovers the same queue, not an empty one
    pool = Pool(root, recover=True)
    try:
        assert pool.coord.load_consumer_state("training") == saved
        assert len(pool.coord.commits) == commits
        assert pool.coord.get_batch(batch_id)["finished"]
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                          config=ON) as b:
            assert b.backlog() == {"": 2}
            nxt = b.next_batch(1)
            assert {s["group_index"] for r in nxt for s in r.load(pool.store).samples} \
                == {2, 3}
    finally:
        pool.close()
