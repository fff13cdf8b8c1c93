"""The exact restore's per-group work (issue 15: an exact restore of 10,000 ready groups
in < 1 s; ``bench.checkpoint_bench`` measures it): each restored reference is
structurally checked once (parsed, then retained, then handed to the builder), the seeded
builder state hands its backlog over as the ``Accepted`` entries parsed (no round trip
through 10,000 dicts), and Python's cyclic collector is paused for the restore only and
left as it was found."""

from __future__ import annotations

import collections
import gc
import json
import os

import pytest

from straw import SharedFilesystemStore
from straw.refs import SegmentRef
from straw.rollout import BatchBuilder, EnvironmentMix
from straw.rollout import restore as restore_module
from straw.rollout.builder import Accepted
from straw.rollout.checkpoint_errors import BranchChanged
from straw.rollout.isolated import seed_isolated_queue
from straw.rollout.resolve import EXACT, resolve_checkpoint
from straw.rollout.restore import open_job, restored_groups

from .ckpt_job import BATCH, CONFIG, PROMPTS, Job


@pytest.fixture
def dirs(tmp_path):
    """A pool and a save directory holding checkpoint 0 with a backlog of accepted
    untrained groups."""
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    src = Job(pool, save)
    src.train()
    src.generate(4)
    src.save(0)
    src.close()
    return pool, save


def _saved_backlog(save: str) -> list[Accepted]:
    with open(os.path.join(save, "rollout", "builder_state_0.json")) as f:
        return [Accepted.from_dict(e) for e in json.load(f)["backlog"]]


def test_each_restored_reference_is_checked_once(dirs, monkeypatch):
    pool, save = dirs
    checks: collections.Counter[tuple[str, int]] = collections.Counter()
    real = SegmentRef.check

    def counting(self: SegmentRef) -> None:
        checks[(self.path, self.offset)] += 1
        real(self)

    monkeypatch.setattr(SegmentRef, "check", counting)
    b = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        during = dict(checks)
        restored = [(e.ref.path, e.ref.offset) for e in restored_groups(b.job)]
        assert restored and len(restored) == len(_saved_backlog(save))
        assert {e: during.get(e, 0) for e in restored} == {e: 1 for e in restored}
    finally:
        b.close()


def test_the_seeded_state_hands_its_backlog_over_as_accepted_entries(dirs):
    pool, save = dirs
    accepted = _saved_backlog(save)
    with SharedFilesystemStore(pool, "job") as store:
        seeded = seed_isolated_queue(store, namespace="branches", queue_id="handover",
                                     tasks=[], producer_state=None, accepted=accepted)
        backlog = seeded.builder_state["backlog"]
        assert all(isinstance(e, Accepted) for e in backlog)
        assert [(e.position, e.commit_id, e.restored) for e in backlog] == \
            [(i, a.commit_id, True) for i, a in enumerate(accepted)]
        builder = BatchBuilder(seeded.coordinator, store, EnvironmentMix.single(BATCH),
                               dp_size=1, config=CONFIG, state=seeded.builder_state)
        try:
            assert builder.state()["backlog"] == [e.to_dict() for e in backlog]
            assert accepted and builder.backlog() == {"": len(accepted)}
        finally:
            builder.close()
            seeded.coordinator.close()


def test_the_collector_is_paused_for_the_restore_only(dirs, monkeypatch):
    pool, save = dirs
    seen: list[bool] = []
    real = restore_module.seed_isolated_queue

    def seeding(*a, **kw):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return real(*a, **kw)

    monkeypatch.setattr(restore_module, "seed_isolated_queue", seeding)
    assert gc.isenabled()
    b = Job(pool, save, step=0, mode_expected=EXACT)
    b.close()
    assert seen == [False] and gc.isenabled()
    # a caller that paused it itself keeps it paused
    gc.disable()
    try:
        b = Job(pool, save, step=0, mode_expected=EXACT)
        b.close()
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()
    # and a restore that fails leaves it running
    r = resolve_checkpoint(save, step=0)
    b = Job(pool, save, step=0)  # moves current.json: r is stale
    b.close()
    with SharedFilesystemStore(pool, "job") as store:
        with pytest.raises(BranchChanged):
            open_job(r, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)
    assert gc.isenabled()
