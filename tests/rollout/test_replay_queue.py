"""Train-only replay of debug archives into an isolated queue (issue 16, ``replay_archives``
in ``straw.rollout.replay``; the selection alone: test_replay.py).  The source is a real
rollout queue whose accepted groups are archived; each test names what it pins."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bench.counting import CountingFS
from straw import Coordinator, SharedFilesystemStore
from straw.codec import sample_records
from straw.coordinator import queue_dir
from straw.errors import CorruptData, InvalidReference, UnsupportedSchema
from straw.fs import PosixFS
from straw.refs import Publication, Record
from straw.rollout import BatchBuilder, EnvironmentMix, RolloutArchive, Sample, SampleGroup, Status
from straw.rollout.archive import CHUNK_SCHEMA, CHUNK_VERSION, chunk_sample, read_chunk
from straw.rollout.builder import lazy_group
from straw.rollout.checkpoint_errors import BranchStarted
from straw.rollout.codec import _sample_value, group_records
from straw.rollout.replay import REPLAY_NAMESPACE, plan_replay, replay_archives
from straw.rollout.replay_group import REPLAY_GROUP_SCHEMA

from .pool import Pool, make_group


def _archived(pool: Pool, n_groups: int, *, n: int = 2, start: int = 0,
              routes: tuple[int, int] = (2, 2)) -> list[Sample]:
    """``n_groups`` groups accepted by the source queue, as a trainer holds their samples
    (captures lazy refs into the pool, the queue task id as provenance)."""
    groups = [make_group(start + i, n=n, routes=routes, version=1) for i in range(n_groups)]
    pool.accept(groups)
    out = []
    for receipt in pool.coord.read_commits(0, 10_000).commits:
        if not receipt.task_id.startswith("prompt:"):
            continue
        for s in lazy_group(pool.store, receipt.result_ref).samples:
            if s.group_index >= start:
                out.append(Sample(s.prompt, tokens=s.tokens, response_length=s.response_length,
                                  status=s.status, reward=s.reward, versions=s.versions,
                                  group_index=s.group_index, index=s.index,
                                  metadata={"task_id": receipt.task_id}, routes=s.routes))
    return out


def _files(path: str) -> dict[str, bytes]:
    found = {}
    for d, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(d, name), "rb") as f:
                found[os.path.relpath(os.path.join(d, name), path)] = f.read()
    return found


def _trained(store, refs) -> list[tuple[int, tuple[int, ...], float, list[int]]]:
    """(index, tokens, raw reward, routes flattened) of every sample of a batch."""
    out = []
    for ref in refs:
        for s in ref.load(store, rank=ref.rank).samples:
            routes = s["routes"].load(framework="numpy")
            out.append((s["index"], tuple(int(t) for t in s["tokens"]), s["raw_reward"],
                        routes.ravel().tolist()))
    return sorted(out)


def _expected(samples: list[Sample]) -> list[tuple[int, tuple[int, ...], float, list[int]]]:
    return sorted((s.index, s.tokens, s.reward, s.routes.load(framework="numpy").ravel()
                   .tolist()) for s in samples)


@pytest.fixture
def pool(tmp_path):
    p = Pool(str(tmp_path / "pool"))
    yield p
    p.close()


def test_a_full_replay_trains_the_archived_groups_with_no_generation_source_untouched(
        tmp_path, pool):
    samples = _archived(pool, 6)
    path = RolloutArchive.save(tmp_path / "rollout_7.straw.json", samples, rollout_id=7,
                               store=pool.store)
    source = queue_dir(pool.store.root, "job", "default", "rollout")
    journal = _files(source)
    commits = pool.coord.read_commits(0, 10_000).commits
    assert journal and len(commits) == 6
    with RolloutArchive(path) as archive:
        replay = replay_archives(pool.store, [archive], queue_id="debug-7")
    assert replay.plan.full and len(replay.plan.groups) == 6
    with replay, replay.builder(pool.store, EnvironmentMix.single(3), dp_size=2) as builder:
        first = builder.next_batch(0)
        builder.finish_batch(first[0].batch_id)
        second = builder.next_batch(1)
        builder.finish_batch(second[0].batch_id)
        assert builder.next_batch(2) is None  # every archived group trained, nothing else
        # the batches are the archived groups, in replay order, their tensors shared
        assert _trained(pool.store, first) == _expected(samples[:6])
        assert _trained(pool.store, second) == _expected(samples[6:])
        # zero generation: the replay queue never held a prompt task
        assert not [t for t in replay.coordinator.tasks if not t.startswith("collection:")]
    # RL6: the source queue's journal and commits are byte for byte what they were
    assert _files(source) == journal
    assert pool.coord.read_commits(0, 10_000).commits == commits
    assert replay.owner == f"branch:{REPLAY_NAMESPACE}/debug-7"


class WriteCountingFS(CountingFS):
    """Sums the bytes of every write (packs, catalog, queue journal, small files)."""

    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.written = 0

    def writev(self, fd, buffers, offset):
        n = super().writev(fd, buffers, offset)
        self.written += n
        return n


def test_a_replay_of_1024_archived_samples_writes_no_sample_or_tensor_byte(tmp_path):
    fs = WriteCountingFS()
    pool = Pool(str(tmp_path / "pool"), fs=fs)
    try:
        samples = []
        for k in range(8):  # 128 groups of 8 samples with R3 routes, already in the pool
            samples += _archived(pool, 16, n=8, start=16 * k, routes=(16, 8))
        assert len(samples) == 1024
        path = RolloutArchive.save(tmp_path / "big.straw.json", samples, rollout_id=1,
                                   store=pool.store)
        archived = sum(s.routes.nbytes + 4 * len(s.tokens) for s in samples)
        payload, written = pool.store.metrics["payload_bytes"], fs.written
        with RolloutArchive(path) as archive:
            replay = replay_archives(pool.store, [archive], queue_id="big")
        payload, written = pool.store.metrics["payload_bytes"] - payload, fs.written - written
        # one tiny reference per group (under 100 bytes for 8 samples), no token id or tensor byte:
        # everything written (references, manifests, catalog, the new queue's journal) is
        # a small fraction of the samples' own bytes
        assert len(replay.groups) == 128 and payload < 128 * 128, payload
        assert written < 256 * 1024 and written < archived / 10, (written, archived)
        with replay, replay.builder(pool.store, EnvironmentMix.single(128),
                                    dp_size=4) as builder:
            assert _trained(pool.store, builder.next_batch(0)) == _expected(samples)
    finally:
        pool.close()
    print(f"replay of 1024 samples: payload {payload} B, written {written} B, "
          f"the samples' bytes {archived} B")


def test_a_subsample_replays_exactly_the_groups_plan_replay_selects(tmp_path, pool):
    samples = _archived(pool, 10)
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=3,
                               store=pool.store)
    with RolloutArchive(path) as archive:
        plan = plan_replay([archive], ratio=0.4, seed=5)
        replay = replay_archives(pool.store, [archive], queue_id="sub", ratio=0.4, seed=5)
    assert replay.plan == plan and len(plan.groups) == 4
    chosen = {k for g in plan.groups for k in g.sample_keys}
    with replay, replay.builder(pool.store, EnvironmentMix.single(4), dp_size=1) as builder:
        trained = _trained(pool.store, builder.next_batch(0))
        assert builder.next_batch(1) is None
    assert trained == _expected([s for s in samples if f"sample:{s.index}" in chosen])


def _archive_only(tmp_path, store) -> tuple[str, list[Sample]]:
    """An archive whose samples (and their routes) nothing else holds, in sealed packs."""
    samples = []
    refs = []
    for i in range(4):
        records, deps = group_records(make_group(i, routes=(2, 2)))
        ref = store.publish(records, submission_id=f"g{i}", dependencies=deps)
        refs.append(ref)
        samples += [Sample(s.prompt, tokens=s.tokens, response_length=s.response_length,
                           status=s.status, reward=s.reward, group_index=s.group_index,
                           index=s.index, metadata={"task_id": f"prompt:{i}"},
                           routes=s.routes) for s in lazy_group(store, ref).samples]
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=0, store=store)
    store.release_publications(refs)
    store.seal()  # collection reclaims sealed packs only
    return path, samples


def test_without_a_replay_releasing_the_archive_lets_its_data_be_collected(tmp_path):
    # (what makes the next test meaningful: there, only the replay holds the data)
    with SharedFilesystemStore(tmp_path / "pool", "job") as store:
        path, samples = _archive_only(tmp_path, store)
        with RolloutArchive(path, store=store) as archive:
            chunk = archive.entries()[0].chunk_ref
            assert archive.release()
        assert store.collect_garbage()["tombstoned"]
        with pytest.raises(InvalidReference):
            store.checked_manifest(chunk)


def test_release_and_collection_of_the_archive_never_break_a_running_replay(tmp_path):
    with SharedFilesystemStore(tmp_path / "pool", "job") as store:
        path, samples = _archive_only(tmp_path, store)
        with RolloutArchive(path, store=store) as archive:
            replay = replay_archives(store, [archive], queue_id="q")
            assert archive.release()  # the archive's retention goes
        store.seal()
        store.collect_garbage()
        with replay, replay.builder(store, EnvironmentMix.single(2), dp_size=1) as builder:
            a = builder.next_batch(0)
            builder.finish_batch(a[0].batch_id)
            store.seal()
            store.collect_garbage()
            b = builder.next_batch(1)
            # RL7: the replay's owner kept the chunks and the tensors they share
            assert sorted(_trained(store, a) + _trained(store, b)) == _expected(samples)
        assert replay.owner in store.owners()
        assert replay.release() and not replay.release()
        assert replay.owner not in store.owners()


def test_round_trip_save_replay_export_release_collect_read_the_pt(tmp_path, pool):
    torch = pytest.importorskip("torch")
    samples = _archived(pool, 4)
    path = RolloutArchive.save(tmp_path / "rollout_2.straw.json", samples, rollout_id=2,
                               store=pool.store)
    with RolloutArchive(path) as archive:
        replay = replay_archives(pool.store, [archive], queue_id="rt")
        with replay, replay.builder(pool.store, EnvironmentMix.single(4),
                                    dp_size=2) as builder:
            refs = builder.next_batch(0)
            trained = _trained(pool.store, refs)
            builder.finish_batch(refs[0].batch_id)
        assert trained == _expected(samples)
        archive.export_pt(tmp_path / "rollout_2.pt")
        assert archive.release()
    assert replay.release()
    pool.store.collect_garbage()
    dump = torch.load(tmp_path / "rollout_2.pt", weights_only=True)
    assert len(dump["samples"]) == len(samples)
    got = sorted((d["index"], d["routes"].numpy().ravel().tolist()) for d in dump["samples"])
    assert got == [(i, r) for i, _, _, r in _expected(samples)]


def test_refusals_write_nothing(tmp_path, pool):
    samples = _archived(pool, 2)
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=1,
                               store=pool.store)
    other = SharedFilesystemStore(tmp_path / "other", "job")
    other_run = SharedFilesystemStore(pool.store.root, "another-run")
    unready = [Sample(("p", 0), tokens=(1, 2), response_length=1, status=Status.ABORTED,
                      group_index=0, index=0, metadata={"task_id": "prompt:x"})]
    bad = RolloutArchive.save(tmp_path / "u.straw.json", unready, rollout_id=2,
                              store=pool.store)
    try:
        owners, written = pool.store.owners(), pool.store.metrics["payload_bytes"]
        with RolloutArchive(path) as archive, RolloutArchive(bad) as unready_archive:
            with pytest.raises(InvalidReference, match="archives' pool and run"):
                replay_archives(other, [archive], queue_id="q")
            with pytest.raises(InvalidReference, match="archives' pool and run"):
                replay_archives(other_run, [archive], queue_id="q")
            with pytest.raises(ValueError, match=r"group 'prompt:x' cannot be replayed: its "
                                                 r"sample sample:0 is aborted"):
                replay_archives(pool.store, [unready_archive], queue_id="q")
            with pytest.raises(ValueError, match="selects no group"):
                replay_archives(pool.store, [archive], queue_id="q", ratio=0.1)
            with pytest.raises(TypeError):
                replay_archives(pool.store, [archive], queue_id="q", environment=None)
        assert pool.store.owners() == owners
        assert pool.store.metrics["payload_bytes"] == written
        assert not os.path.exists(queue_dir(pool.store.root, "job", REPLAY_NAMESPACE, "q"))
    finally:
        other.close()
        other_run.close()


def test_a_replay_starts_once_and_a_second_start_leaves_the_first_its_data(tmp_path, pool):
    samples = _archived(pool, 4)
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=1,
                               store=pool.store)
    with RolloutArchive(path) as archive:
        replay = replay_archives(pool.store, [archive], queue_id="once")
        for ratio in (None, 0.5):  # the same selection, or another one
            with pytest.raises(BranchStarted, match="replay queue replay/once exists: a "
                                                    "replay starts once.*new queue_id"):
                replay_archives(pool.store, [archive], queue_id="once", ratio=ratio)
        archive.release()
    assert replay.owner in pool.store.owners()  # the refused start left it alone
    pool.store.seal()  # (collection reclaims sealed packs only)
    pool.store.collect_garbage()
    with replay, replay.builder(pool.store, EnvironmentMix.single(4), dp_size=1) as builder:
        assert _trained(pool.store, builder.next_batch(0)) == _expected(samples)


def test_the_builder_checks_the_replayed_environment(tmp_path, pool):
    samples = _archived(pool, 2)
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=1,
                               store=pool.store)
    with RolloutArchive(path) as archive:
        replay = replay_archives(pool.store, [archive], queue_id="env", environment="math")
    with replay:
        with pytest.raises(ValueError, match="environment 'math'"):
            replay.builder(pool.store, EnvironmentMix.single(2), dp_size=1)
        mix = EnvironmentMix({"math": 1.0, "code": 1.0}, 2)
        with BatchBuilder(replay.coordinator, pool.store, mix, dp_size=1,
                          state=replay.builder_state) as builder:
            assert builder.backlog() == {"math": 2, "code": 0}


def test_a_damaged_replayed_group_is_a_clear_error(tmp_path, pool):
    samples = _archived(pool, 1)
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=1,
                               store=pool.store)
    with RolloutArchive(path) as archive:
        chunk = archive.entries()[0].chunk_ref

    def group(body: bytes, version: int = 1):
        record = Record("replay-group", body, "json.v1",
                        {"schema": REPLAY_GROUP_SCHEMA, "version": version})
        (ref,) = pool.store.publish_many([Publication([record], (chunk,))],
                                         submission_id=f"bad:{body!r}:{version}")
        return ref

    with pytest.raises(UnsupportedSchema, match="version 2"):
        lazy_group(pool.store, group(b'{"environment":"","samples":[[0,0]]}', 2))
    for body in (b"{", b'{"environment":"","samples":[]}', b'{"samples":[[0,0]]}',
                 b'{"environment":"","samples":[[1,0]]}'):
        with pytest.raises(CorruptData):
            lazy_group(pool.store, group(body))
    with pytest.raises(CorruptData, match="holds 2 samples, not sample 5"):
        lazy_group(pool.store, group(b'{"environment":"","samples":[[0,5]]}'))
    got = lazy_group(pool.store, group(b'{"environment":"","samples":[[0,1],[0,0]]}'))
    assert isinstance(got, SampleGroup) and [s.index for s in got.samples] == [1, 0]


def test_a_restarted_replay_job_continues_from_its_queue(tmp_path, pool):
    samples = _archived(pool, 4)
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=1,
                               store=pool.store)
    with RolloutArchive(path) as archive:
        replay = replay_archives(pool.store, [archive], queue_id="again", namespace="debug")
    # the queue is one of the archives' pool and run
    assert os.path.isdir(queue_dir(pool.store.root, "job", "debug", "again"))
    with replay, replay.builder(pool.store, EnvironmentMix.single(2), dp_size=1) as builder:
        first = builder.next_batch(0)
        builder.finish_batch(first[0].batch_id)
    # a restarted train-only job reopens its replay queue: the builder resumes from the
    # state it saved there (no state given) and trains the groups not trained yet
    coord = Coordinator(pool.store, queue_id="again", namespace="debug", recover=True)
    try:
        with BatchBuilder(coord, pool.store, EnvironmentMix.single(2), dp_size=1) as builder:
            second = builder.next_batch(1)
            assert builder.next_batch(2) is None
    finally:
        coord.close()
    assert _trained(pool.store, first) == _expected(samples[:4])
    assert _trained(pool.store, second) == _expected(samples[4:])


def test_archives_of_one_pool_replay_together_in_order_groups_across_chunks_too(tmp_path,
                                                                                pool):
    big = _archived(pool, 30, n=3)  # 90 samples: group 21 is samples 63-65, two chunks
    small = _archived(pool, 2, n=3, start=30)
    a = RolloutArchive.save(tmp_path / "a.straw.json", big, rollout_id=1, store=pool.store)
    b = RolloutArchive.save(tmp_path / "b.straw.json", small, rollout_id=2, store=pool.store)
    with RolloutArchive(a) as first, RolloutArchive(b) as second:
        replay = replay_archives(pool.store, [second, first], queue_id="both")
        assert [g.rollout for g in replay.plan.groups] == ["2"] * 2 + ["1"] * 30
        spanning = replay.plan.groups[2 + 21]
        assert len({m.chunk_ref for m in spanning.members}) == 2
        assert len(pool.store.checked_manifest(replay.groups[2 + 21]).dependencies) == 2
    with replay, replay.builder(pool.store, EnvironmentMix.single(8), dp_size=2) as builder:
        batches = [builder.next_batch(r) for r in range(4)]
        assert builder.next_batch(4) is None
    # replay order: the archives in the order given, each in archive order
    assert _trained(pool.store, batches[0]) == _expected(small + big[:18])
    assert [t for b in batches for t in _trained(pool.store, b)] == \
        [t for k in range(4) for t in _expected((small + big)[24 * k:24 * k + 24])]


def test_archives_of_different_runs_are_refused_before_anything_is_written(tmp_path, pool):
    samples = _archived(pool, 1)
    a = RolloutArchive.save(tmp_path / "a.straw.json", samples, rollout_id=1,
                            store=pool.store)
    b = RolloutArchive.save(tmp_path / "b.straw.json", samples, rollout_id=1)  # adjacent
    owners, written = pool.store.owners(), pool.store.metrics["payload_bytes"]
    with RolloutArchive(a) as first, RolloutArchive(b) as second:
        with pytest.raises(ValueError, match="one pool and run"):
            replay_archives(pool.store, [first, second], queue_id="mixed")
    assert pool.store.owners() == owners
    assert pool.store.metrics["payload_bytes"] == written
    assert not os.path.exists(queue_dir(pool.store.root, "job", REPLAY_NAMESPACE, "mixed"))


def test_a_shared_capture_pointing_at_no_tensor_is_corrupt_data(tmp_path, pool):
    samples = _archived(pool, 1)
    source = pool.coord.read_commits(0, 10).commits[0].result_ref  # record 0: no tensor
    value = {"schema": CHUNK_SCHEMA, "version": CHUNK_VERSION,
             "samples": [_sample_value(samples[0]) | {"routes": None}],
             "shared": [[0, "routes", 0, 0]]}
    records, _ = sample_records(value)
    chunk_ref = pool.store.publish(records, submission_id="crafted", dependencies=[source])
    chunk = read_chunk(pool.store, chunk_ref, "crafted chunk")
    with pytest.raises(CorruptData, match="record 0 of .* not a tensor record"):
        chunk_sample(pool.store, chunk, 0, "crafted chunk")
    value["shared"] = [[0, "routes", 0, 1]]  # the routes of the source's first sample
    records, _ = sample_records(value)
    chunk_ref = pool.store.publish(records, submission_id="fixed", dependencies=[source])
    got = chunk_sample(pool.store, read_chunk(pool.store, chunk_ref, "fixed"), 0, "fixed")
    assert np.array_equal(got.routes.load(framework="numpy"),
                          samples[0].routes.load(framework="numpy"))
