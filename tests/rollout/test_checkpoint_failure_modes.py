"""The failure modes Megatron-LM's rollout bank review found
(``../shared/reference/megatron-rollout-bank.md``, section 3), one test each for those
that apply to straw's checkpoints, named after the mode, showing straw cannot fall into
it; plus the issue's "the dead run's future markers hide restored groups".

Do not apply (and why):

* #6 (a marker fsync per consumed group): straw writes no consumption marker per group;
  the trainer's ``finish_batch`` acknowledges a whole batch in one queue transaction
  (the builder's RL4), whatever the group count.
* #8 (the over-cap warning never re-armed, bytes never rebased): checkpoints have no byte
  cap; what they keep is an owner's roots in the catalog, released with ``release(k)``,
  and the pool's usage is the catalog's (``disk_usage``), never a counter of ours.
* #13 (truncated review comments): nothing to test.
"""

from __future__ import annotations

import json
import os

import pytest

from straw import Coordinator
from straw.rollout import BatchBuilder, EnvironmentMix
from straw.rollout.builder import read_accepted
from straw.rollout.checkpoint_errors import UnsupportedCheckpoint
from straw.rollout.isolated import seed_isolated_queue
from straw.rollout.resolve import EXACT, SALVAGE, resolve_checkpoint

from .ckpt_job import Job, train_data
from .pool import Pool, make_group


@pytest.fixture
def dirs(tmp_path):
    return str(tmp_path / "pool"), str(tmp_path / "save")


def test_stale_batch_id_collides(dirs):
    """#1: a resumed run numbers its batches from the resumed step, and its batch ids
    are its own queue's (never one of the dead run's)."""
    pool, save = dirs
    dead = Job(pool, save)
    for _ in range(3):
        dead.train()
    dead.save(2)
    dead.train()
    dead_ids = set(dead.job.controller.coordinator.batches)
    dead.close()
    alive = Job(pool, save, mode_expected=SALVAGE)
    try:
        assert alive.rollout_id == 3
        refs = alive.job.builder.next_batch(alive.rollout_id)
        assert refs[0].batch_id not in dead_ids
        assert alive.job.controller.coordinator.lookup_submission("collection:3") is not None
    finally:
        alive.close()


def test_compaction_reopen_off_by_one(dirs):
    """#2: a save closes or reopens nothing the run uses: the same controller and builder
    go on at the next step, and the next save covers everything up to it."""
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        first = job.save(0)
        job.train()  # rollout 1, right after the save, on the same queue
        second = job.save(1)
        d = job.resolution.directory
        b0, b1 = (json.load(open(os.path.join(d, "rollout", f"builder_state_{k}.json")))
                  for k in (0, 1))
        assert b1["scan_cursor"] > b0["scan_cursor"]
        assert (first["weight_version"], second["weight_version"]) == (1, 2)
    finally:
        job.close()


def _two_env_queue(tmp_path):
    """A source queue with 4 accepted groups of environment a and 1 of b."""
    pool = Pool(str(tmp_path / "pool"))
    groups = [make_group(i, env="a") for i in range(4)] + [make_group(4, env="b")]
    pool.accept(groups)
    mix = EnvironmentMix({"a": 1.0, "b": 1.0}, batch_size=2)
    accepted = [read_accepted(pool.store, mix, r)
                for r in pool.coord.read_commits(0, 10).commits]
    return pool, mix, accepted


def test_env_imbalance_backlog_never_drains(tmp_path):
    """#3: a restored backlog drains at its environment's share; that environment
    admits no fresh prompt until it is empty, the others admit theirs."""
    pool, mix, accepted = _two_env_queue(tmp_path)
    seeded = seed_isolated_queue(pool.store, namespace="branches", queue_id="b1", tasks=[],
                                 producer_state=None, accepted=accepted)
    builder = BatchBuilder(seeded.coordinator, pool.store, mix, dp_size=1,
                           state=seeded.builder_state)
    try:
        assert builder.backlog() == {"a": 4, "b": 1}
        assert not builder.admits_fresh("a") and not builder.admits_fresh("b")
        assert builder.next_batch(0) is not None
        assert builder.backlog() == {"a": 3, "b": 0}
        assert builder.admits_fresh("b") and not builder.admits_fresh("a")
    finally:
        builder.close()
        seeded.coordinator.close()
        pool.close()


def test_restored_group_env_routing(tmp_path):
    """#4: a restored group keeps the environment it was accepted with, and a batch takes
    each environment's quota from that environment's groups."""
    pool, mix, accepted = _two_env_queue(tmp_path)
    seeded = seed_isolated_queue(pool.store, namespace="branches", queue_id="b2", tasks=[],
                                 producer_state=None, accepted=accepted)
    builder = BatchBuilder(seeded.coordinator, pool.store, mix, dp_size=1,
                           state=seeded.builder_state)
    try:
        refs = builder.next_batch(0)
        samples = refs[0].load(pool.store, rank=0).samples
        assert sorted({s["environment"] for s in samples}) == ["a", "b"]
        assert all(s["environment"] == ("b" if s["group_index"] == 4 else "a")
                   for s in samples)
    finally:
        builder.close()
        seeded.coordinator.close()
        pool.close()


def test_malformed_manifest_silently_resets(dirs):
    """#5: a corrupt marker or current.json fails closed, naming the file; nothing is
    reset or overwritten."""
    pool, save = dirs
    job = Job(pool, save)
    job.train()
    job.save(0)
    job.close()
    current = os.path.join(save, "rollout", "current.json")
    good = open(current).read()
    with open(current, "w") as f:
        f.write('{"version": 1, "direc')
    with pytest.raises(UnsupportedCheckpoint, match="current.json is not JSON"):
        resolve_checkpoint(save)
    assert open(current).read() == '{"version": 1, "direc'  # untouched
    with open(current, "w") as f:
        f.write(good)
    marker = os.path.join(save, "rollout", "committed_0.json")
    with open(marker, "w") as f:
        f.write("garbage")
    with pytest.raises(UnsupportedCheckpoint, match="committed_0.json is not JSON"):
        resolve_checkpoint(save, marker)
    assert open(marker).read() == "garbage"


def test_grpo_reuse_marker_plus_one(dirs):
    """#7: "trained" is the trainer's finish_batch after its last step on the batch, not
    step arithmetic: a batch planned but not finished at the checkpoint (still being
    reused) comes back planned and is replayed identically."""
    pool, save = dirs
    src = Job(pool, save)
    src.train()
    src.train(finish=False)  # rollout 1: ready, the trainer still reuses it
    src.save(0)
    want = train_data(src.trained[1])
    src.close()
    branch = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        branch.train()
        assert train_data(branch.trained[1]) == want and branch.generator_calls == 0
    finally:
        branch.close()


def test_consumed_log_grows_without_bound(dirs):
    """#9: what a checkpoint keeps follows the live state: one registration on the queue
    at a time (a later checkpoint supersedes the earlier), state files of constant size."""
    pool, save = dirs
    job = Job(pool, save)
    try:
        for k in range(6):
            job.train()
            job.save(k)
        assert len(job.job.controller.coordinator.checkpoints) == 1
        d = job.resolution.directory
        sizes = {os.path.getsize(os.path.join(d, "rollout", f"builder_state_{k}.json"))
                 for k in range(6)}
        assert max(sizes) - min(sizes) < 64
    finally:
        job.close()


def test_single_env_restore_routing_does_not_require_env_id(dirs):
    """#10: a single-environment job (environment "") restores without environment ids."""
    pool, save = dirs
    job = Job(pool, save)
    job.train()
    job.generate()
    job.save(0)
    job.close()
    again = Job(pool, save, mode_expected=SALVAGE)
    try:
        assert again.job.builder.backlog() == {"": 2}
        again.train()
        assert again.generator_calls == 0
    finally:
        again.close()


def test_compaction_new_uids_orphan_markers(dirs):
    """#11: restored groups keep their identity (the source commit and payload digest),
    fresh groups never reuse a restored one's, and a second crash salvages again without
    duplicates."""
    pool, save = dirs
    dead = Job(pool, save)
    dead.train()
    dead.save(0)
    dead.generate()
    dead.generate()
    dead.job.builder.backlog()  # scanned
    backlog = dead.job.builder.state()["backlog"]
    dead.close()
    second = Job(pool, save, mode_expected=SALVAGE)
    restored = second.job.builder.state()["backlog"]
    assert [(e["commit_id"], e["ref"]["digest"]) for e in restored] == \
        [(e["commit_id"], e["ref"]["digest"]) for e in backlog]
    second.train()
    second.save(1)
    second.generate()  # fresh groups of the new run
    fresh = second.job.builder.state()["backlog"]
    assert not {e["commit_id"] for e in fresh if not e.get("restored")} & \
        {e["commit_id"] for e in backlog}
    second.close()
    third = Job(pool, save, mode_expected=SALVAGE)
    try:
        ids = [e["commit_id"] for e in third.job.builder.state()["backlog"]]
        assert len(ids) == len(set(ids)) == 4  # 2 restored again + 2 fresh, once each
        third.train()
        third.train()
        assert third.generator_calls == 0
    finally:
        third.close()


def test_async_compaction_prunes_before_durable(dirs, monkeypatch):
    """#12: an earlier checkpoint's registration is dropped only once a later marker is
    durable: a later save that fails keeps it (and GC keeps what it protects)."""
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.save(0)
        job.train()
        coord = job.job.controller.coordinator
        before = set(coord.checkpoints)
        with pytest.raises(OSError):
            job.save(1, fail=True)
        assert set(coord.checkpoints) == before
        job.save(1)
        assert set(coord.checkpoints) != before and len(coord.checkpoints) == 1
    finally:
        job.close()


def test_rollback_future_markers_do_not_hide_restored_groups(dirs):
    """The dead run trained groups after the checkpoint; a rollback to it must train them
    again: the branch starts from the checkpoint's state, not from the dead run's
    acknowledgements (no "future marker" of the source can hide them)."""
    pool, save = dirs
    src = Job(pool, save)
    src.train()
    src.generate()
    src.save(0)  # two accepted untrained groups in the backlog
    src.train()  # the source trains them at step 1 and acknowledges them
    src.train()
    trained_later = train_data(src.trained[1])
    src.close()
    branch = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        assert branch.job.restored == 2
        branch.train()
        assert train_data(branch.trained[1]) == trained_later
        assert branch.generator_calls == 0
    finally:
        branch.close()


def test_a_branch_queue_is_a_coordinator_of_its_own(tmp_path):
    """(RL6, for the failure modes above) the isolated queue is a new queue: the source
    coordinator's queue id never appears in it."""
    pool, mix, accepted = _two_env_queue(tmp_path)
    seeded = seed_isolated_queue(pool.store, namespace="branches", queue_id="b3", tasks=[],
                                 producer_state=None, accepted=accepted)
    try:
        assert isinstance(seeded.coordinator, Coordinator)
        assert (seeded.coordinator.namespace, seeded.coordinator.queue_id) == ("branches", "b3")
        assert pool.coord.read_commits(0, 100).cursor == 5  # the source: its 5 commits
        assert seeded.owner in pool.store.owners()
    finally:
        seeded.coordinator.close()
        pool.close()


def test_a_restored_environment_missing_from_the_mix_is_named_at_open(tmp_path):
    # issue 39: it was a bare KeyError at the first next_batch
    pool, _, accepted = _two_env_queue(tmp_path)
    seeded = seed_isolated_queue(pool.store, namespace="branches", queue_id="b2", tasks=[],
                                 producer_state=None, accepted=accepted)
    only_a = EnvironmentMix({"a": 1.0}, batch_size=2)
    with pytest.raises(ValueError, match=r"environments \['b'\] that the configured mix"):
        BatchBuilder(seeded.coordinator, pool.store, only_a, dp_size=1,
                     state=seeded.builder_state)
    # nothing was left open: a builder with the full mix opens the same state
    full = EnvironmentMix({"a": 1.0, "b": 1.0}, batch_size=2)
    builder = BatchBuilder(seeded.coordinator, pool.store, full, dp_size=1,
                           state=seeded.builder_state)
    assert builder.backlog() == {"a": 4, "b": 1}
    builder.close()
