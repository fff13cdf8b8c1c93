"""straw.rollout.resolve: which checkpoint a start loads (issue 15, item 2): an exact
commit file, an explicit step, an edited tracker, the automatic resume of the active
branch, ancestry only up to each branch point, an abandoned future only by its exact
commit file; the clear error of every bad case; a model without queue snapshot."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from straw import CorruptData, InvalidReference, SharedFilesystemStore, UnsupportedSchema
from straw.rollout import EnvironmentMix
from straw.rollout.checkpoint_errors import (
    ComponentChanged,
    ForeignPool,
    ForeignRun,
    MissingModel,
    NoCheckpoint,
    StateOmitted,
    UncommittedSnapshot,
    UnsupportedCheckpoint,
)
from straw.rollout.resolve import EMPTY, EXACT, NEW, RECOVER, SALVAGE, resolve_checkpoint
from straw.rollout.restore import open_job

from .ckpt_job import BATCH, CONFIG, PROMPTS, Job, train_data


@pytest.fixture
def run(tmp_path):
    """A run that committed steps 0, 1 and 2 in the save root, then stopped."""
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    job = Job(pool, save, mode_expected=NEW)
    for k in range(3):
        job.train()
        job.save(k)
    job.close()
    return pool, save


def marker(save, k, directory=None):
    return os.path.join(directory or save, "rollout", f"committed_{k}.json")


def test_a_new_run_and_the_automatic_resume_of_the_active_branch(tmp_path, run):
    pool, save = run
    assert resolve_checkpoint(str(tmp_path / "fresh")).mode == NEW
    r = resolve_checkpoint(save)  # no load: current.json says which branch
    assert (r.mode, r.step, r.source) == (SALVAGE, 2, save)
    assert r.directory.startswith(os.path.join(save, "branches"))  # save holds a run
    assert os.path.basename(r.directory) == r.branch_id and r.next_rollout_id == 3
    assert resolve_checkpoint(save, save).mode == SALVAGE  # load = save: the same


def test_an_explicit_step_an_exact_commit_file_and_an_edited_tracker_are_exact(run):
    pool, save = run
    r = resolve_checkpoint(save, step=1)
    assert (r.mode, r.step) == (EXACT, 1)
    r = resolve_checkpoint(save, marker(save, 0))
    assert (r.mode, r.step, r.source) == (EXACT, 0, save)
    with pytest.raises(ValueError, match="differs from the explicit commit marker"):
        resolve_checkpoint(save, marker(save, 0), step=1)
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("1")  # the user edits the logical tracker to select step 1
    r = resolve_checkpoint(save)
    assert (r.mode, r.step) == (EXACT, 1)
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("one")
    with pytest.raises(ValueError, match="not a step number"):
        resolve_checkpoint(save)


def test_selection_never_follows_a_save_interrupted_before_its_commit(run):
    # issue 39: the framework's save of step 3 wrote its model and the tracker, then died
    # before the joint commit; the automatic resume picked step 3 in mode empty (an empty
    # queue from dataset offset 0) instead of resuming from the newest commit, step 2
    pool, save = run
    model = os.path.join(save, "iter_0000003")
    os.makedirs(model)
    with open(os.path.join(model, "weights.bin"), "wb") as f:
        f.write(b"w" * 4000)
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("3")
    with pytest.warns(UserWarning, match="names step 3, newer than the newest commit"):
        r = resolve_checkpoint(save)
    assert (r.mode, r.step, r.source) == (SALVAGE, 2, save)
    assert any("interrupted before its commit" in w for w in r.warnings)
    r = resolve_checkpoint(save, step=3)  # asked for explicitly: its model, empty queue
    assert (r.mode, r.step) == (EMPTY, 3)


def test_a_lost_current_json_is_an_error_not_a_new_run(run):
    # issue 39: with commits present and rollout/current.json gone, the automatic start
    # began a new run from offset 0 in a new branch; the resume was lost without an error
    pool, save = run
    os.remove(os.path.join(save, "rollout", "current.json"))
    with pytest.raises(ComponentChanged, match="current.json is missing, but .* holds a run"):
        resolve_checkpoint(save)
    r = resolve_checkpoint(save, save)  # an explicit load still resumes the newest commit
    assert (r.mode, r.step) == (EXACT, 2)


def test_ancestry_is_followed_only_up_to_each_branch_point(run):
    pool, save = run
    # roll back to step 0: a branch; it trains and commits steps 1 and 2 of its own
    b = Job(pool, save, step=0, mode_expected=EXACT)
    branch = b.resolution.directory
    for k in (1, 2):
        b.train()
        b.save(k)
    b.close()
    r = resolve_checkpoint(save)  # the active branch now
    assert (r.mode, r.step, r.source) == (SALVAGE, 2, branch)
    r = resolve_checkpoint(save, step=0)  # before the branch point: the parent's
    assert (r.mode, r.source) == (EXACT, save)
    r = resolve_checkpoint(save, step=1)  # the branch's own step 1, not the parent's
    assert r.source == branch
    # the parent's step 2 lies beyond the branch point (0): an abandoned future, not
    # reachable by ancestry from a branch that has no step 2 of its own...
    os.remove(marker(save, 2, branch))
    os.remove(os.path.join(branch, "rollout", "queue_state_2.json"))
    os.remove(os.path.join(branch, "rollout", "builder_state_2.json"))
    shutil.rmtree(os.path.join(branch, "iter_0000002"))
    with pytest.raises(NoCheckpoint, match="only up to each branch point"):
        resolve_checkpoint(save, step=2)
    # ...only by its exact commit file
    r = resolve_checkpoint(save, marker(save, 2))
    assert (r.mode, r.step, r.source) == (EXACT, 2, save)


def test_a_branch_directory_loads_its_own_steps(run):
    pool, save = run
    b = Job(pool, save, step=1)
    branch = b.resolution.directory
    b.train()
    b.save(2)
    b.close()
    r = resolve_checkpoint(save, branch)
    assert (r.mode, r.step, r.source) == (EXACT, 2, branch)
    r = resolve_checkpoint(save, branch, step=1)
    assert r.source == save


def test_a_component_missing_or_changed_is_refused(run):
    pool, save = run
    weights = os.path.join(save, "iter_0000002", "weights.bin")
    data = open(weights, "rb").read()
    with open(weights, "wb") as f:
        f.write(data[:-4])
    with pytest.raises(ComponentChanged, match="changed: 3996 bytes"):
        resolve_checkpoint(save, step=2)
    with open(weights, "wb") as f:
        f.write(data[:-4] + b"\0\0\0\0")  # same size, other bytes
    with pytest.raises(ComponentChanged, match="sha256"):
        resolve_checkpoint(save, step=2)
    os.remove(weights)
    with pytest.raises(ComponentChanged, match="missing"):
        resolve_checkpoint(save, step=2)
    assert issubclass(ComponentChanged, CorruptData)
    os.remove(os.path.join(save, "rollout", "builder_state_1.json"))
    with pytest.raises(ComponentChanged, match="builder_state_1.json of step 1 is missing"):
        resolve_checkpoint(save, step=1)


def test_omitted_optimizer_or_rng_state_is_refused(tmp_path):
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    job = Job(pool, save)
    job.train()
    job.save(0, rng=False)
    job.close()
    with pytest.raises(StateOmitted, match="omitted optimizer or RNG state"):
        resolve_checkpoint(save, step=0)
    assert resolve_checkpoint(save, step=0, allow_partial_state=True).step == 0


def test_another_run_or_another_pool_is_refused(tmp_path, run):
    pool, save = run
    r = resolve_checkpoint(save, step=1)
    other_run = SharedFilesystemStore(pool, "another-run")
    other_pool = SharedFilesystemStore(str(tmp_path / "pool2"), "job")
    try:
        with pytest.raises(ForeignRun, match="belongs to straw run 'job'"):
            open_job(r, other_run, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)
        with pytest.raises(ForeignPool, match="original shared pool"):
            open_job(r, other_pool, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)
    finally:
        other_run.close()
        other_pool.close()
    assert issubclass(ForeignRun, InvalidReference) and issubclass(ForeignPool,
                                                                    InvalidReference)
    assert not os.path.exists(r.directory)  # nothing was written for a refused start


def test_a_queue_snapshot_without_its_marker_is_refused(run):
    pool, save = run
    os.remove(marker(save, 2))  # the save of step 2 was interrupted before its marker
    with pytest.raises(UncommittedSnapshot, match="without its commit marker"):
        resolve_checkpoint(save, step=2)


def test_a_missing_model_and_an_unsupported_version_are_refused(run):
    pool, save = run
    with pytest.raises(NoCheckpoint, match="no committed model/rollout checkpoint for step 9"):
        resolve_checkpoint(save, step=9)
    os.makedirs(os.path.join(save, "iter_0000007"))
    with pytest.raises(MissingModel, match="is empty"):
        resolve_checkpoint(save, step=7)
    path = marker(save, 1)
    value = json.load(open(path))
    with open(path, "w") as f:
        json.dump({**value, "version": 2}, f)
    with pytest.raises(UnsupportedCheckpoint, match="version 2"):
        resolve_checkpoint(save, step=1)
    assert issubclass(UnsupportedCheckpoint, UnsupportedSchema)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(UnsupportedCheckpoint, match="is not JSON"):
        resolve_checkpoint(save, step=1)


def test_a_model_without_queue_snapshot_starts_an_empty_queue(tmp_path, run):
    pool, save = run
    model = os.path.join(save, "iter_0000005")
    os.makedirs(model)
    open(os.path.join(model, "weights.bin"), "wb").write(b"w")
    with pytest.warns(UserWarning, match="dataset offset 0"):
        r = resolve_checkpoint(save, step=5)
    assert (r.mode, r.dataset_cursor) == (EMPTY, None)
    with pytest.warns(UserWarning, match="dataset offset 0"):
        job = Job(pool, save, step=5, mode_expected=EMPTY)
    try:
        assert job.job.controller.cursor.sample_group_index == 0
        assert job.job.controller.coordinator.pending_tasks() == []
        assert job.rollout_id == 6
    finally:
        job.close()
    cursor = {"sample_offset": 8, "epoch_id": 0, "sample_group_index": 8, "sample_index": 16,
              "metadata": {}}
    with open(os.path.join(save, "rollout", "dataset_cursor_5.json"), "w") as f:
        json.dump({"version": 1, "cursor": cursor}, f)
    job = Job(pool, save, step=5, mode_expected=EMPTY)
    try:
        assert job.job.controller.cursor.sample_group_index == 8
        job.train()  # the dataset continues from the saved cursor
        assert min(s["group_index"] for s in job.trained[6]) >= 8
    finally:
        job.close()


def test_a_crash_before_the_first_checkpoint_recovers_the_branch_queue(tmp_path):
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    job = Job(pool, save, mode_expected=NEW)
    job.train()
    job.generate()
    accepted = job.job.builder.backlog()
    job.close()
    again = Job(pool, save, mode_expected=RECOVER)
    try:
        assert again.job.builder.backlog() == accepted  # nothing lost, nothing redone
        again.rollout_id = 1
        again.train()
        assert again.generator_calls == 0
    finally:
        again.close()


def test_a_branch_that_crashed_before_its_first_checkpoint_recovers_from_its_queue(run):
    pool, save = run
    b = Job(pool, save, step=1, mode_expected=EXACT)
    b.train()  # rollout 2 of the branch, no checkpoint of its own yet
    want = train_data(b.trained[2])
    b.close()
    again = Job(pool, save, mode_expected=RECOVER)
    try:
        assert again.resolution.directory == b.resolution.directory
        assert again.rollout_id == 2  # the model restarts from the branch point, step 1
        again.train()  # the branch's batch 2 again, from its queue, identical
        assert train_data(again.trained[2]) == want and again.generator_calls == 0
    finally:
        again.close()


def test_a_start_that_crashed_before_its_queue_was_seeded_starts_again(run):
    pool, save = run
    b = Job(pool, save, mode_expected=SALVAGE)
    branch = b.resolution.directory
    b.close()
    os.remove(os.path.join(branch, "rollout", "seeded.json"))  # as if it crashed before
    r = resolve_checkpoint(save)
    assert (r.mode, r.step, r.source) == (SALVAGE, 2, save)  # the same salvage, redone
    assert r.directory != branch  # into a new branch (the old queue id stays unused)


@pytest.mark.parametrize("files", [["iter_0000002/weights.bin"], "weights.bin", 7,
                                   {"iter_0000002/weights.bin": [4000, "sha"]}])
def test_ck1_a_marker_whose_files_are_not_a_mapping_is_refused(run, files):
    # issue 39 CK1: a commit marker whose 'files' was a list raised AttributeError
    pool, save = run
    path = os.path.join(save, "rollout", "committed_2.json")
    with open(path) as f:
        marker = json.load(f)
    marker["files"] = files
    with open(path, "w") as f:
        json.dump(marker, f)
    with pytest.raises(ComponentChanged, match="committed_2.json: its 'files' must map"):
        resolve_checkpoint(save, step=2)


def test_rl10_a_save_interrupted_before_the_first_commit_is_not_followed(tmp_path):
    # RL10: a new run trained a step; the framework's save of step 0 wrote its model and
    # the tracker, then died before any joint commit.  The automatic resume recovered
    # nothing of the run (mode empty at step 0: an empty queue from dataset offset 0);
    # it recovers the run's own queue instead.
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    job = Job(pool, save, mode_expected=NEW)
    job.train()
    job.close()
    model = os.path.join(save, "iter_0000000")
    os.makedirs(model)
    with open(os.path.join(model, "weights.bin"), "wb") as f:
        f.write(b"w" * 4000)
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("0")
    with pytest.warns(UserWarning, match="which has no commit yet"):
        r = resolve_checkpoint(save)
    assert r.mode == RECOVER and r.queue is not None
    assert any("interrupted before its commit" in w for w in r.warnings)
    r = resolve_checkpoint(save, step=0)  # asked for explicitly: its model, empty queue
    assert (r.mode, r.step) == (EMPTY, 0)
