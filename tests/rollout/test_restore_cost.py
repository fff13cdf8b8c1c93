"""The exact restore's per-group work (issue 15: an exact restore of 10,000 ready groups
in < 1 s; ``bench.checkpoint_bench`` measures it): each restored reference is
structurally checked once (parsed, then retained, then handed to the builder), the seeded
builder state hands its backlog over as the ``Accepted`` entries parsed (no round trip
through 10,000 dicts), and Python's cyclic collector is paused for the restore only and
left as it was found."""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import os

import pytest

from straw import Coordinator, SharedFilesystemStore
from straw.errors import CorruptData, InvalidReference
from straw.fs import PosixFS
from straw.refs import Record, RecordSetRef, SegmentRef
from straw.rollout import BatchBuilder, EnvironmentMix, RolloutController
from straw.rollout import restore as restore_module
from straw.rollout.builder import (
    STORED_VERSION,
    Accepted,
    backlog_columns,
    read_stored_state,
)
from straw.rollout.checkpoint import saved_backlog
from straw.rollout.checkpoint_errors import BranchChanged, UnsupportedCheckpoint
from straw.rollout.isolated import seed_isolated_queue
from straw.rollout.resolve import EXACT, resolve_checkpoint
from straw.rollout.restore import BRANCH_NAMESPACE, open_job, restored_groups

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
        return saved_backlog(json.load(f))


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


def test_the_seeded_queue_is_opened_once(dirs, monkeypatch):
    """The restore hands the coordinator it seeded the queue with to the controller: one
    open (one epoch) of the branch's queue, not a close and a reopen."""
    pool, save = dirs
    opened: collections.Counter[tuple[str, str]] = collections.Counter()
    real = Coordinator.__init__

    def counting(self: Coordinator, store: object, *a: object, **kw: object) -> None:
        real(self, store, *a, **kw)  # type: ignore[arg-type]
        opened[(self.namespace, self.queue_id)] += 1

    monkeypatch.setattr(Coordinator, "__init__", counting)
    b = Job(pool, save, step=0, mode_expected=EXACT)
    try:
        queue = (BRANCH_NAMESPACE, b.resolution.branch_id)
        assert opened == {queue: 1}
        assert b.job.controller.coordinator.namespace == BRANCH_NAMESPACE
        assert b.job.controller.coordinator.queue_id == b.resolution.branch_id
        assert len(restored_groups(b.job)) == len(_saved_backlog(save))
    finally:
        b.close()


def test_the_restore_parses_the_state_bytes_resolution_hashed(dirs, monkeypatch):
    """Each checkpoint state file is read once (resolution hashes it; the restore parses
    those bytes): a file replaced after resolution is not what the restore reads."""
    pool, save = dirs
    reads: collections.Counter[str] = collections.Counter()
    real = PosixFS.read_file

    def counting(self: PosixFS, path: str, *a: object, **kw: object) -> bytes:
        reads[os.path.basename(path)] += 1
        return real(self, path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(PosixFS, "read_file", counting)
    resolution = resolve_checkpoint(save, step=0)
    path = os.path.join(save, "rollout", "builder_state_0.json")
    with open(path, "rb") as f:
        size = len(f.read())
    with open(path, "wb") as f:  # the same size, not JSON: read again, it would fail
        f.write(b"x" * size)
    with SharedFilesystemStore(pool, "job") as store:
        job = open_job(resolution, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                       config=CONFIG)
        try:
            assert job.restored > 0
        finally:
            job.close()
    assert reads["builder_state_0.json"] == 1 and reads["queue_state_0.json"] == 1


def test_a_hand_built_resolution_reads_the_state_files(dirs):
    """A Resolution without the hashed bytes (built by hand) reads the files; a file that
    is not JSON is refused naming it."""
    pool, save = dirs
    resolution = dataclasses.replace(resolve_checkpoint(save, step=0), state_files={})
    path = os.path.join(save, "rollout", "builder_state_0.json")
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(b"x" * len(good))
    with SharedFilesystemStore(pool, "job") as store:
        with pytest.raises(UnsupportedCheckpoint, match="builder_state_0.json"):
            open_job(resolution, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                     config=CONFIG)


def test_a_controller_takes_only_the_open_coordinator_of_its_queue(tmp_path):
    with SharedFilesystemStore(str(tmp_path / "pool"), "job") as store:
        coord = Coordinator(store, queue_id="q", namespace="ns",
                            lease_seconds=CONFIG.lease_seconds)
        try:
            with pytest.raises(ValueError, match="ns/other"):
                RolloutController(store, PROMPTS, config=CONFIG, queue_id="other",
                                  namespace="ns", coordinator=coord)
            with pytest.raises(ValueError, match="lease_seconds"):
                RolloutController(store, PROMPTS,
                                  config=dataclasses.replace(CONFIG, lease_seconds=5.0),
                                  queue_id="q", namespace="ns", coordinator=coord)
            with pytest.raises(TypeError, match="Coordinator"):
                RolloutController(store, PROMPTS, config=CONFIG, queue_id="q",
                                  namespace="ns", coordinator=object())  # type: ignore[arg-type]
            controller = RolloutController(store, PROMPTS, config=CONFIG, queue_id="q",
                                           namespace="ns", coordinator=coord)
            assert controller.coordinator is coord
            controller.close()
            with pytest.raises(ValueError, match="closed True"):
                RolloutController(store, PROMPTS, config=CONFIG, queue_id="q",
                                  namespace="ns", coordinator=coord)
        finally:
            coord.close()


def _stored(store: SharedFilesystemStore, coord: Coordinator) -> dict:
    view = coord.load_consumer_state(coord.consumer_id)
    (record,) = store.read(RecordSetRef.from_dict(view["state_ref"]))
    return json.loads(bytes(record.payload))


def _seeded_builder_state(store, queue_id, accepted):
    """An isolated queue seeded with ``accepted`` and a builder's state over it (the
    builder closed: its consumer state saved); the caller closes the coordinator."""
    seeded = seed_isolated_queue(store, namespace="branches", queue_id=queue_id,
                                 tasks=[], producer_state=None, accepted=accepted)
    try:
        builder = BatchBuilder(seeded.coordinator, store, EnvironmentMix.single(BATCH),
                               dp_size=1, config=CONFIG, state=seeded.builder_state)
        state = builder.state()
        builder.close()
    except BaseException:
        seeded.coordinator.close()
        raise
    return seeded.coordinator, state


def test_the_consumer_state_record_holds_the_backlog_as_columns(dirs):
    """The builder's saved consumer state is the stored form (version 3): its backlog one
    array per field, not one JSON object per group (the restore's first save encoded
    4.9 MB of key names for 10,000 groups); a new builder reads it back to the same
    state, and ``read_stored_state`` gives readers of the record ``state()``'s form."""
    pool, save = dirs
    accepted = _saved_backlog(save)
    with SharedFilesystemStore(pool, "job") as store:
        coord, state = _seeded_builder_state(store, "columns", accepted)
        try:
            raw = _stored(store, coord)
            assert raw["version"] == STORED_VERSION
            assert isinstance(raw["backlog"], dict)
            assert raw["backlog"]["commit_id"] == [a.commit_id for a in accepted]
            assert raw["backlog"]["restored"] == [True] * len(accepted)
            assert read_stored_state(raw) == state
            again = BatchBuilder(coord, store, EnvironmentMix.single(BATCH), dp_size=1,
                                 config=CONFIG)
            assert again.state() == state
            again.close()
        finally:
            coord.close()


def test_a_consumer_state_record_of_the_old_form_is_read(dirs):
    """A record written before the stored form (version 2: ``state()`` as it is) loads;
    a damaged column table is ``CorruptData``, an edited reference refused as such."""
    pool, save = dirs
    accepted = _saved_backlog(save)
    with SharedFilesystemStore(pool, "job") as store:
        coord, state = _seeded_builder_state(store, "old", accepted)
        try:

            def save_raw(value: object, request: str) -> None:
                token = coord.open_consumer(coord.consumer_id, exclusive_owner="test")
                ref = store.publish([Record("builder-state", json.dumps(value).encode(),
                                            "json.v1", {})], submission_id=request)
                coord.save_consumer_state(coord.consumer_id, token=token, request_id=request,
                                          state_ref=ref, fetch_cursor=0, processed_cursor=0)
                coord.close_consumer(coord.consumer_id, token)

            save_raw(state, "old-form")  # version 2, as written before
            old = BatchBuilder(coord, store, EnvironmentMix.single(BATCH), dp_size=1,
                               config=CONFIG)
            assert old.state() == state
            old.close()
            raw = {**state, "version": STORED_VERSION, "backlog": {"commit_id": []}}
            save_raw(raw, "damaged")
            with pytest.raises(CorruptData, match="columns"):
                BatchBuilder(coord, store, EnvironmentMix.single(BATCH), dp_size=1,
                             config=CONFIG)
            with pytest.raises(CorruptData, match="columns"):
                read_stored_state(raw)
            stored = {**state, "version": STORED_VERSION,
                      "backlog": backlog_columns(accepted)}
            stored["backlog"]["path"] = ["../outside.pack"] * len(accepted)
            save_raw(stored, "edited")
            with pytest.raises(InvalidReference):
                BatchBuilder(coord, store, EnvironmentMix.single(BATCH), dp_size=1,
                             config=CONFIG)
        finally:
            coord.close()
