"""The checkpoint's builder state file (issue 15: an exact restore of 10,000 ready groups
in < 1 s): version 2 holds the backlog as columns (the builder's stored form) and the
restore builds each restored entry once, straight from them; version 1 files (one object
per group, written before) still restore, to the same backlog; any other version is
refused naming the file, its version and the fix."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from straw import SharedFilesystemStore
from straw.errors import CorruptData
from straw.rollout import EnvironmentMix
from straw.rollout.builder import Accepted, backlog_columns
from straw.rollout.checkpoint import saved_backlog
from straw.rollout.checkpoint_errors import UnsupportedCheckpoint
from straw.rollout.checkpoint_files import BUILDER_STATE_VERSION, canonical
from straw.rollout.resolve import EXACT, resolve_checkpoint
from straw.rollout.restore import open_job, restored_groups

from .ckpt_job import BATCH, CONFIG, PROMPTS, Job


@pytest.fixture
def dirs(tmp_path):
    """A pool and a save directory holding checkpoint 0 with a backlog of accepted
    untrained groups (and the builder's backlog at the save)."""
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    src = Job(pool, save)
    src.train()
    src.generate(4)
    src.save(0)
    backlog = src.job.builder.state_entries()[1]
    src.close()
    return pool, save, backlog


def _path(save: str) -> str:
    return os.path.join(save, "rollout", "builder_state_0.json")


def _rewrite(save: str, value: dict) -> None:
    """Replace the builder state file of step 0 and its marker's size and sha256 (what a
    straw that wrote it would have recorded)."""
    data = canonical(value)
    with open(_path(save), "wb") as f:
        f.write(data)
    marker_path = os.path.join(save, "rollout", "committed_0.json")
    with open(marker_path) as f:
        marker = json.load(f)
    marker["files"][os.path.join("rollout", "builder_state_0.json")] = {
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(marker_path, "wb") as f:
        f.write(canonical(marker))


def _restored(pool: str, save: str) -> list[tuple]:
    """An exact restore of step 0 (a new branch each time): its restored groups."""
    job = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        return [(e.position, e.commit_id, e.ref, e.environment, e.key, e.tokens)
                for e in restored_groups(job.job)]
    finally:
        job.close()


def test_the_builder_state_file_holds_the_backlog_as_columns(dirs):
    pool, save, backlog = dirs
    with open(_path(save)) as f:
        value = json.load(f)
    assert value["version"] == BUILDER_STATE_VERSION == 2
    assert backlog and value["backlog"] == backlog_columns(backlog)  # one list per field
    assert saved_backlog(value) == list(backlog)


def test_a_version_1_builder_state_file_restores_the_same_backlog(dirs):
    pool, save, backlog = dirs
    columnar = _restored(pool, save)
    with open(_path(save)) as f:
        value = json.load(f)
    old = {**value, "version": 1, "backlog": [e.to_dict() for e in backlog]}
    _rewrite(save, old)
    assert saved_backlog(old) == list(backlog)
    assert _restored(pool, save) == columnar and len(columnar) == len(backlog)


def test_a_builder_state_file_of_another_version_is_refused(dirs):
    pool, save, _ = dirs
    with open(_path(save)) as f:
        value = json.load(f)
    _rewrite(save, {**value, "version": 3})
    resolution = resolve_checkpoint(save, step=0)
    with SharedFilesystemStore(pool, "job") as store:
        with pytest.raises(UnsupportedCheckpoint,
                           match=r"builder_state_0.json has version 3; this straw reads "
                                 r"version 1 or 2: upgrade straw"):
            open_job(resolution, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)


def test_an_exact_restore_builds_each_restored_entry_once(dirs, monkeypatch):
    """Parsed from the columns straight into the restored entries they become (ranked,
    in selection order): not parsed, then built again for their ranks."""
    pool, save, backlog = dirs
    built = []
    real = Accepted.__init__

    def counting(self, *a, **kw):  # type: ignore[no-untyped-def]
        built.append(a[1] if len(a) > 1 else kw.get("commit_id"))
        real(self, *a, **kw)

    monkeypatch.setattr(Accepted, "__init__", counting)
    job = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        during = list(built)
        restored = restored_groups(job.job)
    finally:
        job.close()
    assert [e.commit_id for e in restored] == [e.commit_id for e in backlog]
    assert [e.position for e in restored] == list(range(len(backlog)))
    assert sorted(during) == sorted(e.commit_id for e in backlog)  # once each


def test_a_save_writes_the_backlog_without_a_dict_per_group(tmp_path, monkeypatch):
    """The save takes the builder's entries as they are (columns, their references
    retained as parsed): no backlog entry is turned into a dict and parsed back."""
    job = Job(str(tmp_path / "pool"), str(tmp_path / "save"))
    try:
        job.train()
        job.generate(4)

        def refused(self: Accepted) -> dict:
            raise AssertionError("a save turned a backlog entry into a dict")

        monkeypatch.setattr(Accepted, "to_dict", refused)
        job.save(0)
        monkeypatch.undo()
        with open(_path(str(tmp_path / "save"))) as f:
            value = json.load(f)
        assert saved_backlog(value) == list(job.job.builder.state_entries()[1])
        assert saved_backlog(value)  # the accepted untrained groups
    finally:
        job.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_damaged_backlog_is_refused_naming_the_file(dirs, version):
    pool, save, _ = dirs
    with open(_path(save)) as f:
        value = json.load(f)
    damaged = {"commit_id": []} if version == 2 else {"not": "a list"}
    _rewrite(save, {**value, "version": version, "backlog": damaged})
    resolution = resolve_checkpoint(save, step=0)
    with SharedFilesystemStore(pool, "job") as store:
        with pytest.raises(CorruptData, match=r"builder_state_0.json: .*select another"):
            open_job(resolution, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)
