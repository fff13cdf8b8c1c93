"""straw.rollout.restore and straw.rollout.isolated: exact restore into an isolated queue
that never changes its source (RL6), salvage of everything accepted after the checkpoint
and untrained at it (RL8) with zero generator calls and identical replayed batches, the
payloads kept by the checkpoint's registration through GC (RL7), one start per branch,
and one controller per save directory (a lock released when its holder is SIGKILLed)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from straw import SharedFilesystemStore
from straw.rollout import EnvironmentMix, Status
from straw.rollout.checkpoint_errors import BranchChanged, BranchStarted, SaveDirLocked
from straw.rollout.isolated import seed_isolated_queue
from straw.rollout.resolve import EXACT, SALVAGE, resolve_checkpoint
from straw.rollout.restore import open_job
from straw.rollout.savelock import SaveLock

from .ckpt_job import BATCH, CONFIG, PROMPTS, Job, train_data


@pytest.fixture
def dirs(tmp_path):
    return str(tmp_path / "pool"), str(tmp_path / "save")


def queue_files(pool: str, directory: str) -> dict[str, str]:
    """sha256 of every file of the queue whose branch is ``directory``."""
    branch = json.load(open(os.path.join(directory, "rollout", "branch.json")))
    q = os.path.join(pool, "runs", "job", "queues", branch["queue"]["namespace"],
                     branch["queue"]["queue_id"])
    return {os.path.relpath(os.path.join(a, f), q):
            hashlib.sha256(open(os.path.join(a, f), "rb").read()).hexdigest()
            for a, _, fs in os.walk(q) for f in fs}


def partial(job: Job) -> int:
    """Take one group, give it back partial (sample 0 done, sample 1 aborted midway)."""
    (g,) = job.client.take(1)
    s0, s1 = g.samples
    g = dataclasses.replace(g, samples=(
        dataclasses.replace(s0, tokens=s0.tokens + (5, 6), response_length=2,
                            status=Status.COMPLETED, reward=1.0),
        dataclasses.replace(s1, tokens=s1.tokens + (9,), response_length=1,
                            status=Status.ABORTED)))
    (out,) = job.client.return_groups([g])
    assert out.action != "completed"
    return g.group_index


def test_exact_restore_seeds_an_isolated_queue_and_never_changes_the_source(dirs):
    pool, save = dirs
    src = Job(pool, save)
    src.train()
    src.generate()  # an accepted untrained backlog of 2
    gid = partial(src)  # and a partial group
    src.save(0)
    saved = json.load(open(os.path.join(save, "rollout", "queue_state_0.json")))
    for _ in range(3):  # the source goes on: later samples the branch must not see
        src.train()
    src.generate()
    src.close()
    before = queue_files(pool, save)
    b = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        coord = b.job.controller.coordinator
        assert coord.queue_id == b.resolution.branch_id and coord.namespace == "branches"
        assert sorted(t.task_id for t in coord.pending_tasks()) == \
            sorted(t["task_id"] for t in saved["tasks"])
        assert b.job.controller.cursor.to_dict() == saved["producer_state"]["cursor"]
        assert b.job.restored == 2 and b.job.builder.backlog() == {"": 2}
        # the partial group comes back with its partial input
        spec = next(t for t in coord.pending_tasks() if t.task_id == f"prompt:{gid}")
        want = next(t for t in saved["tasks"] if t["task_id"] == f"prompt:{gid}")
        assert spec.input_ref.digest == want["input_ref"]["digest"]
        got = b.client.take(8)
        p = next(g for g in got if g.group_index == gid)
        assert p.samples[0].status is Status.COMPLETED and p.samples[1].tokens[-1] == 9
        b.train()  # the restored backlog fills step 1's batch
        b.save(1)  # into the branch directory, not the source's
        assert os.path.exists(os.path.join(b.resolution.directory, "rollout",
                                           "committed_1.json"))
        assert not os.path.exists(os.path.join(save, "rollout", "committed_1.json"))
    finally:
        b.close()
    assert queue_files(pool, save) == before  # RL6: not one byte of the source changed


def test_a_second_start_on_the_same_branch_is_refused(dirs):
    pool, save = dirs
    src = Job(pool, save)
    src.train()
    src.save(0)
    src.close()
    r = resolve_checkpoint(save, step=0)
    job = Job(pool, save, step=0)
    try:
        store = job.store
        with pytest.raises(SaveDirLocked, match=f"pid {os.getpid()}"):
            open_job(r, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)
        ns, qid = "branches", job.resolution.branch_id
        with pytest.raises(BranchStarted, match="started already"):
            seed_isolated_queue(store, namespace=ns, queue_id=qid, tasks=[],
                                producer_state=None, accepted=[])
    finally:
        job.close()
    store = SharedFilesystemStore(pool, "job")
    try:  # r was resolved before that start moved current.json: stale
        with pytest.raises(BranchChanged, match="resolve again"):
            open_job(r, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)
    finally:
        store.close()


def test_salvage_restores_every_group_accepted_after_the_checkpoint_and_replays_batches(dirs):
    pool, save = dirs
    dead = Job(pool, save)
    for _ in range(3):
        dead.train()
    dead.save(2)
    dead.generate(version=5)
    dead.train(finish=False)  # planned after the checkpoint, its training lost
    # groups of an OLDER weight version, accepted after batch 3 was planned: a replay
    # that re-selected by version would move them into batch 3
    dead.generate(version=1)
    dead.train()  # planned, trained and acknowledged after the checkpoint: rolled back
    dead.generate()
    dead.generate()  # four groups accepted after the checkpoint, never planned
    dead_batches = {k: train_data(v) for k, v in dead.trained.items()}
    dead_ids = {k: v[0]["group_index"] for k, v in dead.trained.items()}
    max_dead_group = max(s["group_index"] for v in dead.trained.values() for s in v)
    dead_batch_ids = set(dead.job.controller.coordinator.batches)
    dead.close()  # (the crash: nothing after this ran)
    alive = Job(pool, save, mode_expected=SALVAGE)
    try:
        assert alive.rollout_id == 3  # numbering continues from the resumed step
        assert alive.job.restored == 8  # 2 batches replayed + 4 accepted, none lost
        refs = [alive.plan()]
        for rid in (3, 4):
            alive.train()
            # identical to the bytes of training data, in the dead run's order
            assert train_data(alive.trained[rid]) == dead_batches[rid], rid
        alive.train()
        alive.train()
        assert alive.generator_calls == 0  # the restored backlog covered every batch
        assert alive.job.builder.admits_fresh("") is True
        alive.train()  # now fresh generation starts, with new ids
        assert alive.generator_calls >= 1
        fresh = [s["group_index"] for s in alive.trained[7]]
        assert min(fresh) > max_dead_group  # the dataset cursor continued
        assert not set(alive.job.controller.coordinator.batches) & dead_batch_ids
        assert refs[0][0].batch_id not in dead_batch_ids
        assert dead_ids[3] == alive.trained[3][0]["group_index"]
    finally:
        alive.close()


def test_the_salvage_boundary_is_exactly_the_checkpoint(dirs):
    """RL8 at the boundary: the first group accepted after the save is restored, none
    trained at or before it is (a `<=` for `<` either way changes the count)."""
    pool, save = dirs
    dead = Job(pool, save)
    dead.train()
    dead.save(0)
    dead.generate()  # accepted at the boundary position S and S+1, never planned
    after = sorted(dead.job.builder.backlog().items())
    dead.close()
    alive = Job(pool, save, mode_expected=SALVAGE)
    try:
        assert after == [("", 2)] and alive.job.restored == 2
        alive.train()
        assert alive.generator_calls == 0
        assert min(s["group_index"] for s in alive.trained[1]) >= 2  # not step 0's groups
    finally:
        alive.close()


def test_groups_acknowledged_after_the_checkpoint_survive_gc_for_the_salvage(dirs):
    pool, save = dirs
    dead = Job(pool, save)
    dead.train()
    dead.save(0)
    for _ in range(3):  # trained and acknowledged after the checkpoint...
        dead.train()
    dead.client.close()
    dead.gen_store.close()  # its pack sealed: collectable once nothing keeps it
    got = dead.job.controller.coordinator.collect_garbage()  # ...and a collection ran
    # the generation writer's pack (the groups) is kept by the registration
    assert not any(dead.gen_store.writer_id in p for p in got["tombstoned"]), got
    want = {k: train_data(v) for k, v in dead.trained.items()}
    dead.close()
    alive = Job(pool, save, mode_expected=SALVAGE)
    try:
        for rid in (1, 2, 3):
            alive.train()
            assert train_data(alive.trained[rid]) == want[rid]
        assert alive.generator_calls == 0
    finally:
        alive.close()


def test_without_the_registration_gc_would_collect_what_salvage_needs(dirs, monkeypatch):
    """The registration is what keeps them: skipped, the same history loses groups."""
    from straw.rollout import checkpoint as checkpoint_module
    monkeypatch.setattr(checkpoint_module.Checkpointer, "_register", lambda self, *args: [])
    pool, save = dirs
    dead = Job(pool, save)
    dead.train()
    dead.save(0)
    for _ in range(3):
        dead.train()
    dead.client.close()
    dead.gen_store.close()
    got = dead.job.controller.coordinator.collect_garbage()
    assert any(dead.gen_store.writer_id in p for p in got["tombstoned"]), got
    dead.close()
    with pytest.raises(Exception):  # noqa: B017 - whichever read of a collected pack
        alive = Job(pool, save, mode_expected=SALVAGE)
        try:
            for _ in range(3):
                alive.train()
        finally:
            alive.close()


def test_a_sigkilled_controller_releases_the_save_directory(tmp_path):
    save = str(tmp_path / "save")
    code = textwrap.dedent(f"""
        import sys, time
        from straw.rollout.savelock import SaveLock
        lock = SaveLock({save!r})
        print("held", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(SaveDirLocked, match=f"pid {child.pid}"):
            SaveLock(save)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    with SaveLock(save) as lock:  # the kernel dropped the dead holder's flock
        assert lock.held
