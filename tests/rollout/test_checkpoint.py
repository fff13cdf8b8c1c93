"""straw.rollout.checkpoint: the joint checkpoint of step k (issue 15, item 1): the
components, then the commit marker last (RL9), then the trackers; a commit that exists
refuses before anything is written; a failed save leaves no marker and no owner;
payloads referenced and retained, never copied; the state files follow the live state."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from straw.fs import PosixFS
from straw.fs_delegating import DelegatingFilesystem
from straw.refs import Record
from straw.rollout.checkpoint import (
    Checkpointer,
    checkpoint_owner,
    gaps,
    registration_id,
    saved_backlog,
)
from straw.rollout.checkpoint_errors import CheckpointExists, ComponentChanged

from .ckpt_job import Job, model_saver


@pytest.fixture
def dirs(tmp_path):
    return str(tmp_path / "pool"), str(tmp_path / "save")


class RecordingFS(DelegatingFilesystem):
    """Logs (operation, path) of opens, fsyncs, renames and directory fsyncs."""

    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.log: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}

    def open(self, path, *, write=False, create=False, exclusive=False):  # noqa: ANN001
        fd = super().open(path, write=write, create=create, exclusive=exclusive)
        self._paths[fd] = path
        return fd

    def fsync(self, fd):  # noqa: ANN001
        self.log.append(("fsync", self._paths.get(fd, "?")))
        super().fsync(fd)

    def rename(self, src, dst):  # noqa: ANN001
        self.log.append(("rename", dst))
        super().rename(src, dst)

    def fsync_dir(self, path):  # noqa: ANN001
        self.log.append(("fsync_dir", path))
        super().fsync_dir(path)


def test_a_save_writes_the_components_then_the_marker_then_the_trackers(dirs):
    pool, save = dirs
    job = Job(pool, save)
    try:
        for _ in range(3):
            job.train()
        fs = RecordingFS()
        ck = Checkpointer(job.resolution.directory, controller=job.job.controller,
                          builder=job.job.builder, logical_root=job.resolution.root, fs=fs)
        marker = ck.save(2, model_saver())
    finally:
        job.close()
    d = job.resolution.directory
    assert marker["weight_version"] == 3 and marker["step"] == 2
    assert marker["optimizer"] is True and marker["rng"] is True
    assert marker["pool"] == job.store.pool_id and marker["run_id"] == "job"
    assert set(marker["files"]) == {"iter_0000002/weights.bin", "iter_0000002/meta.json",
                                    "rollout/queue_state_2.json",
                                    "rollout/builder_state_2.json"}
    for rel, info in marker["files"].items():
        data = open(os.path.join(d, rel), "rb").read()
        assert info["size"] == len(data)
        assert info["sha256"] == hashlib.sha256(data).hexdigest()  # all small here
    assert json.load(open(os.path.join(d, "rollout", "committed_2.json"))) == marker
    # RL9: every component is durable before the marker's rename; trackers after it
    ops = fs.log
    at = ops.index(("rename", os.path.join(d, "rollout", "committed_2.json")))
    for rel in marker["files"]:
        path = os.path.join(d, rel)
        synced = [i for i, op in enumerate(ops) if op[1] == path or (
            op[0] == "rename" and op[1] == path)]
        assert synced and max(synced) < at, rel
    tracker = os.path.join(d, "latest_checkpointed_iteration.txt")
    assert ops.index(("rename", tracker)) > at
    assert open(tracker).read() == "2"
    current = json.load(open(os.path.join(save, "rollout", "current.json")))
    assert current == {"version": 1, "directory": d, "tracker": "2"}


def test_an_existing_commit_refuses_before_anything_is_written(dirs):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.save(0)
        d = job.resolution.directory
        before = {p: open(p, "rb").read() for p in _files(d)}
        called = []
        with pytest.raises(CheckpointExists, match="committed_0.json exists"):
            job.job.save(0, lambda model_dir: called.append(model_dir))
        assert called == []  # the model save never ran
        assert {p: open(p, "rb").read() for p in _files(d)} == before
    finally:
        job.close()


def test_a_failed_model_save_leaves_no_marker_and_no_owner(dirs):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        with pytest.raises(OSError, match="injected"):
            job.save(0, fail=True)
        d = job.resolution.directory
        assert not os.path.exists(os.path.join(d, "rollout", "committed_0.json"))
        assert not os.path.exists(os.path.join(d, "rollout", "queue_state_0.json"))
        with pytest.raises(ValueError, match="naming at least one file"):
            job.job.save(0, lambda model_dir: {"files": [], "optimizer": True, "rng": True})
        with pytest.raises(ComponentChanged, match="does not exist"):
            job.job.save(0, lambda model_dir: {"files": ["nope.bin"], "optimizer": True,
                                               "rng": True})
        with pytest.raises(ValueError, match="inside it"):
            job.job.save(0, lambda model_dir: {"files": ["../x"], "optimizer": True,
                                               "rng": True})
        with pytest.raises(ValueError, match="optimizer"):
            job.job.save(0, lambda model_dir: {"files": ["x"], "rng": True})
        job.save(0)  # the same step saves once the model save works
        assert os.path.exists(os.path.join(d, "rollout", "committed_0.json"))
    finally:
        job.close()


def _break_registration(ck, monkeypatch):
    """Make the checkpointer's registration on the source queue fail after it ran (a
    failed rollout save); returns the real one."""
    real = ck._register

    def broken(*args):
        real(*args)
        raise OSError("queue registration failed (injected)")

    monkeypatch.setattr(ck, "_register", broken)
    return real


def test_a_failed_rollout_save_leaves_no_marker_and_releases_its_owner(dirs, monkeypatch):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.generate()  # a backlog for the checkpoint to retain
        ck = job.job.checkpointer
        real = _break_registration(ck, monkeypatch)
        with pytest.raises(OSError, match="injected"):
            job.save(0)
        d = job.resolution.directory
        assert not os.path.exists(os.path.join(d, "rollout", "committed_0.json"))
        owner = checkpoint_owner(ck.namespace, ck.queue_id, 0)
        assert owner not in job.store.owners()
        assert job.job.controller.coordinator.checkpoints == {}
        monkeypatch.setattr(ck, "_register", real)
        job.save(0)
        assert owner in job.store.owners()
    finally:
        job.close()


def test_a_registration_left_by_a_save_killed_before_its_marker_is_replaced(dirs):
    """A save killed between its queue registration and its marker leaves the
    registration; the resumed job's save of that step (other state by then) replaces it
    instead of failing with IdempotencyConflict (found by the job fuzz)."""
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        ck = job.job.checkpointer
        coordinator = job.job.controller.coordinator
        reg = registration_id(ck.namespace, ck.queue_id, 0)
        # what the killed save registered: another builder state, no marker
        state = job.store.publish([Record("builder-checkpoint", b"{}", "json.v1")],
                                  submission_id="stale-state")
        stale = job.store.publish([Record("checkpoint", json.dumps(
            {"version": 1, "checkpoint_id": reg, "consumer_state": state.to_dict(),
             "batch_ids": [], "training_dependencies": []}).encode(), "json.v1")],
            submission_id="stale", dependencies=[state])
        coordinator.register_checkpoint(reg, stale, cursor=0)
        job.generate()
        job.save(0)
        d = job.resolution.directory
        assert os.path.exists(os.path.join(d, "rollout", "committed_0.json"))
        assert list(coordinator.checkpoints) == [reg]
        assert coordinator.checkpoints[reg]["checkpoint_ref"] != stale.to_dict()
    finally:
        job.close()


def test_payloads_are_referenced_and_retained_until_released(dirs):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.generate()  # two accepted, untrained groups
        usage = job.store.disk_usage()
        job.save(0)
        ck = job.job.checkpointer
        owner = checkpoint_owner(ck.namespace, ck.queue_id, 0)
        assert owner in job.store.owners() and not owner.startswith(("queue:", "publication:"))
        state = json.load(open(os.path.join(job.resolution.directory, "rollout",
                                            "builder_state_0.json")))
        assert len(saved_backlog(state)) == 2  # by reference: the groups' references
        assert set(state["backlog"]) >= {"path", "offset", "digest"}  # columns of them
        grown = job.store.disk_usage()
        # only the small checkpoint records were written to the pool, no payload copy
        assert sum(grown.values()) - sum(usage.values()) < 64 * 1024
        ck.release(0)
        assert owner not in job.store.owners()
    finally:
        job.close()


def test_the_state_files_hold_the_live_state_not_the_history(dirs):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.save(0)
        for _ in range(12):
            job.train()
        job.save(12)
        d = job.resolution.directory
        sizes = [os.path.getsize(os.path.join(d, "rollout", f"{kind}_{k}.json"))
                 for k in (0, 12) for kind in ("queue_state", "builder_state")]
        # 12 more trained batches of history: the files did not grow with it
        assert abs(sizes[2] - sizes[0]) < 200 and abs(sizes[3] - sizes[1]) < 200, sizes
        q = json.load(open(os.path.join(d, "rollout", "queue_state_12.json")))
        pending = job.job.controller.coordinator.pending_tasks(task_prefix="prompt:")
        assert sorted(t["task_id"] for t in q["tasks"]) == sorted(t.task_id for t in pending)
        b = json.load(open(os.path.join(d, "rollout", "builder_state_12.json")))
        assert "finished_batches" not in b and b["planned"] == []
    finally:
        job.close()


def test_a_leased_task_is_saved_and_an_unfinished_batch_is_saved_planned(dirs):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.train(finish=False)  # planned, ready, not trained yet
        leased = job.client.take(1)  # leased, not returned
        job.save(1)
        d = job.resolution.directory
        q = json.load(open(os.path.join(d, "rollout", "queue_state_1.json")))
        tid = f"prompt:{leased[0].group_index}"
        assert tid in {t["task_id"] for t in q["tasks"]}
        b = json.load(open(os.path.join(d, "rollout", "builder_state_1.json")))
        assert [p["rollout_id"] for p in b["planned"]] == ["1"]
        assert len(b["planned"][0]["groups"]) == 2
    finally:
        job.close()


def _files(directory: str) -> list[str]:
    return sorted(os.path.join(a, f) for a, _, fs in os.walk(directory) for f in fs
                  if f != "LOCK")


def _recorded_save(pool, save, *, generate):
    """A job that trained (and generated a backlog if ``generate``) saves step 1 through a
    ``RecordingFS``: the job (closed) and the filesystem's log."""
    job = Job(pool, save)
    try:
        job.train()
        if generate:
            job.generate()
        fs = RecordingFS()
        ck = Checkpointer(job.resolution.directory, controller=job.job.controller,
                          builder=job.job.builder, logical_root=job.resolution.root, fs=fs)
        ck.save(1, model_saver())
    finally:
        job.close()
    return job, fs


def test_a_save_fsyncs_each_directory_once_before_its_marker(dirs):
    # the two state files share one fsync of rollout/, the model directory's parent is
    # synced once (not by makedirs and again after the files): a save's syncs are what
    # RL9 needs, no more
    job, fs = _recorded_save(*dirs, generate=True)
    d = job.resolution.directory
    ops = fs.log
    at = ops.index(("rename", os.path.join(d, "rollout", "committed_1.json")))
    dirs_synced = [op[1] for op in ops[:at] if op[0] == "fsync_dir"]
    assert sorted(dirs_synced) == sorted({d, os.path.join(d, "iter_0000001"),
                                          os.path.join(d, "rollout")}), dirs_synced
    states = [os.path.join(d, "rollout", f"{k}_1.json") for k in ("queue_state",
                                                                  "builder_state")]
    one = ops.index(("fsync_dir", os.path.join(d, "rollout")))
    assert all(ops.index(("rename", p)) < one for p in states)  # both named, then synced
    # model: 2 files; states: 2; marker, tracker, current.json: 1 each
    assert sum(op[0] == "fsync" for op in ops) == 7
    assert len([op for op in ops if op[0] == "fsync_dir"]) == 3 + 3


def test_a_save_reads_no_commit_of_its_backlog(dirs):
    # the unfinished batches are found without reading the backlog's commits: the
    # commits a save reads follow the unfinished work, not the accepted groups waiting
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.train(finish=False)  # one planned batch to find
        for _ in range(5):
            job.generate(4)  # a backlog of accepted untrained groups
        coord = job.job.controller.coordinator
        job.job.builder.backlog()  # scanned
        backlog = {e["position"] for e in job.job.builder.state()["backlog"]}
        assert len(backlog) >= 6
        read: list[int] = []
        real = coord.read_commits

        def counting(cursor=0, limit=100):  # noqa: ANN001
            page = real(cursor, limit)
            read.extend(r.position for r in page.commits)
            return page

        coord.read_commits = counting
        try:
            job.save(1)
        finally:
            del coord.read_commits
        assert not backlog & set(read), sorted(backlog & set(read))
        b = json.load(open(os.path.join(job.resolution.directory, "rollout",
                                        "builder_state_1.json")))
        assert [p["rollout_id"] for p in b["planned"]] == ["1"]
        assert {e.position for e in saved_backlog(b)} == backlog
    finally:
        job.close()


def test_gaps_are_the_ranges_between_known_positions():
    assert gaps(0, 10, set()) == [(0, 10)]
    assert gaps(0, 10, {0, 1, 5, 9, 12}) == [(2, 5), (6, 9)]
    assert gaps(3, 3, {1}) == []
    assert gaps(2, 6, {2, 3, 4, 5}) == []


def test_after_the_marker_a_save_only_renames_its_staged_trackers_in_order(dirs):
    # the trackers' contents are fsynced before the marker under temporary names; after
    # the marker is durable only their renames and directory fsyncs are left, tracker
    # first, then current.json, each name durable before the next
    job, fs = _recorded_save(*dirs, generate=False)
    d, root = job.resolution.directory, job.resolution.root
    rollout = os.path.join(d, "rollout")
    ops = fs.log
    marker_synced = ops.index(("rename", os.path.join(rollout, "committed_1.json"))) + 1
    assert ops[marker_synced] == ("fsync_dir", rollout)
    tracker = os.path.join(d, "latest_checkpointed_iteration.txt")
    current = os.path.join(root, "rollout", "current.json")
    assert ops[marker_synced + 1:] == [("rename", tracker), ("fsync_dir", d),
                                       ("rename", current),
                                       ("fsync_dir", os.path.dirname(current))]
    # their contents were durable before the marker (under the temporary names)
    staged = [p for op, p in ops[:marker_synced] if op == "fsync" and ".tmp." in p]
    assert {p.split(".tmp.")[0] for p in staged} >= {tracker, current}
    assert open(tracker).read() == "1"
    assert json.load(open(current)) == {"version": 1, "directory": d, "tracker": "1"}
    assert not [n for n in os.listdir(d) + os.listdir(rollout) if ".tmp." in n]


def test_a_failed_save_discards_its_staged_trackers(dirs, monkeypatch):
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        job.save(0)
        d, root = job.resolution.directory, job.resolution.root
        ck = job.job.checkpointer
        _break_registration(ck, monkeypatch)
        with pytest.raises(OSError, match="injected"):
            job.save(1)
        tracker = os.path.join(d, "latest_checkpointed_iteration.txt")
        assert open(tracker).read() == "0"  # the trackers still name the committed step
        current = json.load(open(os.path.join(root, "rollout", "current.json")))
        assert current["tracker"] == "0"
        rollout = os.path.join(d, "rollout")
        assert not [n for n in os.listdir(d) + os.listdir(rollout) if ".tmp." in n]
    finally:
        job.close()


@pytest.mark.parametrize("full_at", [r"queue_state_1\.json\.tmp\.", r"builder_state_1\.json\.tmp\.",
                                     r"committed_1\.json\.tmp\.", r"current\.json\.tmp\."])
def test_fd1_a_full_disk_fails_a_save_naming_the_file_and_leaves_nothing_behind(
        dirs, full_at):
    # issue 39 FD1: a save on a full disk raised a bare OSError naming no file and left
    # *.tmp.* files and an uncommitted queue_state_<k>.json behind (which then refused
    # that step for ever)
    import errno

    from fault_injection.faultyfs import FaultyFS
    from straw.errors import QuotaExceeded
    pool, save = dirs
    job = Job(pool, save)
    try:
        job.train()
        fs = FaultyFS()
        fs.plan.fail("writev", errno.ENOSPC, path=full_at)
        ck = Checkpointer(job.resolution.directory, controller=job.job.controller,
                          builder=job.job.builder, logical_root=job.resolution.root, fs=fs)
        with pytest.raises(QuotaExceeded, match=r"cannot write .*\.json: No space left"):
            ck.save(1, model_saver())
        d = job.resolution.directory
        left = [f for f in _files(d) if ".tmp." in f or f.endswith(("_state_1.json",
                                                                     "committed_1.json"))]
        assert left == []
        # space is back: the same step saves
        ck = Checkpointer(job.resolution.directory, controller=job.job.controller,
                          builder=job.job.builder, logical_root=job.resolution.root)
        assert ck.save(1, model_saver())["step"] == 1
    finally:
        job.close()
