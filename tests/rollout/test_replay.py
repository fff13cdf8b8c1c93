"""Replay selection (issue 16): which archived groups a train-only job replays, in which
order, with which provenance; the subsample and its zero-groups decision; archives of
different pools or runs refused (``straw.rollout.replay``'s docstring holds the claims)."""

from __future__ import annotations

import math
import random

import pytest

from straw import SharedFilesystemStore
from straw.rollout import RolloutArchive, Sample, Status
from straw.rollout.replay import (
    archive_groups,
    check_one_pool_and_run,
    plan_replay,
    subsample_count,
)


def _sample(i: int, *, group: int | None = None, task: str | None = None) -> Sample:
    return Sample(("prompt", i), tokens=(1, 2, 3, 4), response_length=2,
                  status=Status.COMPLETED, reward=1.0, group_index=group, index=i,
                  metadata={"task_id": task} if task else {})


def _groups_of(n: int, per: int, start: int = 0) -> list[Sample]:
    """``n`` groups of ``per`` samples, each group one queue task."""
    return [_sample(start + g * per + k, group=start // per + g,
                    task=f"prompt:{start // per + g}")
            for g in range(n) for k in range(per)]


@pytest.fixture
def pool(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "job")
    yield store
    store.close()


def _open(tmp_path, store, samples, name, rollout_id=7):
    return RolloutArchive(RolloutArchive.save(tmp_path / name, samples, rollout_id=rollout_id,
                                              store=store))


def test_full_replay_is_every_group_in_archive_order_with_its_provenance(tmp_path, pool):
    samples = _groups_of(3, 2)
    samples.insert(2, _sample(50, group=9, task="prompt:0"))  # task prompt:0, out of place
    with _open(tmp_path, pool, samples, "r7.straw.json") as archive:
        plan = plan_replay([archive])
        entries = archive.entries()
        assert plan.full and (plan.ratio, plan.seed, plan.total_groups) == (None, None, 3)
        assert (plan.root, plan.pool_id, plan.run_id) == (pool.root, pool.pool_id, "job")
        assert plan.archives == (archive.path,)
        assert [g.key for g in plan.groups] == ["prompt:0", "prompt:1", "prompt:2"]
        assert [g.sample_keys for g in plan.groups] == [
            ("sample:0", "sample:1", "sample:50"), ("sample:2", "sample:3"),
            ("sample:4", "sample:5")]
        g = plan.groups[0]
        assert (g.archive, g.rollout, g.storage_owner, g.task_key, g.first) == \
            (archive.path, "7", archive.storage_owner, "prompt:0", 0)
        # each member names the archived record: its chunk publication and ordinal
        assert [(m.chunk_ref, m.ordinal) for m in g.members] == \
            [(entries[p].chunk_ref, entries[p].ordinal) for p in (0, 1, 2)]
        assert archive.chunks_read == 0  # selection reads the index only
        # the members are the samples: loading them through the archive gives them back
        assert archive.load_samples(task_key="prompt:0") == [samples[0], samples[1],
                                                             samples[2]]


def test_without_queue_provenance_groups_are_group_indices_then_single_samples(tmp_path,
                                                                                pool):
    samples = [_sample(0, group=4), _sample(1, group=5), _sample(2, group=4), _sample(3),
               _sample(3)]
    with _open(tmp_path, pool, samples, "r.straw.json") as archive:
        groups = archive_groups(archive)
    assert [(g.key, g.task_key, g.first, g.sample_keys) for g in groups] == [
        ("group:4", None, 0, ("sample:0", "sample:2")), ("group:5", None, 1, ("sample:1",)),
        ("sample:3", None, 3, ("sample:3",)), ("sample:3", None, 4, ("sample:3",))]


def test_groups_span_chunks_and_archives_replay_in_the_order_given(tmp_path, pool):
    big = [_sample(i, group=0, task="prompt:0") for i in range(70)]  # two chunks
    with _open(tmp_path, pool, big, "a.straw.json", 1) as a, \
            _open(tmp_path, pool, _groups_of(2, 2), "b.straw.json", 2) as b:
        plan = plan_replay([b, a])
        assert [(g.rollout, g.key) for g in plan.groups] == \
            [("2", "prompt:0"), ("2", "prompt:1"), ("1", "prompt:0")]  # not merged
        assert len({m.chunk_ref for m in plan.groups[2].members}) == 2
        assert plan.archives == (b.path, a.path)


def test_a_seeded_subsample_is_reproducible_and_keeps_replay_order(tmp_path, pool):
    with _open(tmp_path, pool, _groups_of(40, 1), "r.straw.json") as archive:
        everything = plan_replay([archive]).groups
        one = plan_replay([archive], ratio=0.25, seed=3)
        assert len(one.groups) == 10 and (one.ratio, one.seed, one.total_groups) == \
            (0.25, 3, 40) and not one.full
        assert plan_replay([archive], ratio=0.25, seed=3).groups == one.groups
        positions = [everything.index(g) for g in one.groups]
        assert positions == sorted(random.Random(3).sample(range(40), 10))  # the rule
        assert positions == sorted(positions)
        other = plan_replay([archive], ratio=0.25, seed=4)
        assert other.groups != one.groups and len(other.groups) == 10
        assert plan_replay([archive], ratio=1.0).groups == everything


def test_the_ratio_is_taken_as_written():
    assert 100 * 0.29 < 29  # binary floating point alone would select 28
    assert subsample_count(100, 0.29) == 29
    assert subsample_count(10, 0.3) == 3
    assert subsample_count(7, 0.5) == 3  # floor
    assert subsample_count(3, 1) == 3


def test_a_ratio_that_rounds_to_zero_groups_is_refused(tmp_path, pool):
    # the decision: refused, with the smallest ratio that selects one group
    with pytest.raises(ValueError, match=r"selects no group .*ratio >= 1/40 = 0\.025"):
        subsample_count(40, 0.02)
    assert subsample_count(40, 0.025) == 1
    with _open(tmp_path, pool, _groups_of(3, 2), "r.straw.json") as archive:
        owners = pool.owners()
        with pytest.raises(ValueError, match=r"floor\(3 \* 0\.3\) = 0"):
            plan_replay([archive], ratio=0.3)
        assert len(plan_replay([archive], ratio=0.34).groups) == 1
        assert pool.owners() == owners


def test_a_replay_of_no_sample_is_refused(tmp_path, pool):
    with _open(tmp_path, pool, [], "e.straw.json") as empty:
        with pytest.raises(ValueError, match="hold no sample"):
            plan_replay([empty])
        with pytest.raises(ValueError, match="selects no group"):
            plan_replay([empty], ratio=1.0)


@pytest.mark.parametrize("ratio, error", [
    (0, ValueError), (0.0, ValueError), (-0.5, ValueError), (1.5, ValueError),
    (math.nan, ValueError), (math.inf, ValueError), (True, TypeError), ("0.5", TypeError)])
def test_a_bad_ratio_is_refused(tmp_path, pool, ratio, error):
    with _open(tmp_path, pool, _groups_of(4, 1), "r.straw.json") as archive:
        with pytest.raises(error, match="ratio"):
            plan_replay([archive], ratio=ratio)


def test_a_bad_seed_is_refused(tmp_path, pool):
    with _open(tmp_path, pool, _groups_of(4, 1), "r.straw.json") as archive:
        for seed in (None, 1.5, True):
            with pytest.raises(TypeError, match="seed"):
                plan_replay([archive], ratio=0.5, seed=seed)


def test_archives_of_different_pools_are_refused_naming_both(tmp_path, pool):
    with SharedFilesystemStore(tmp_path / "other", "job") as other, \
            _open(tmp_path, pool, _groups_of(2, 1), "a.straw.json") as a, \
            _open(tmp_path, other, _groups_of(2, 1), "b.straw.json") as b:
        with pytest.raises(ValueError, match="one pool and run") as caught:
            plan_replay([a, b])
        message = str(caught.value)
        assert a.path in message and b.path in message
        assert pool.pool_id in message and other.pool_id in message


def test_archives_of_different_runs_are_refused_naming_both(tmp_path, pool):
    with SharedFilesystemStore(tmp_path / "pool", "other-run") as other_run, \
            _open(tmp_path, pool, _groups_of(2, 1), "a.straw.json") as a, \
            _open(tmp_path, other_run, _groups_of(2, 1), "b.straw.json") as b:
        with pytest.raises(ValueError, match="'job'.*'other-run'") as caught:
            plan_replay([a, b], ratio=0.5)
        assert a.path in str(caught.value) and b.path in str(caught.value)


def test_an_archive_twice_or_closed_or_none_is_refused(tmp_path, pool):
    path = RolloutArchive.save(tmp_path / "a.straw.json", _groups_of(2, 1), rollout_id=0,
                               store=pool)
    with RolloutArchive(path) as a, RolloutArchive(path) as again:
        with pytest.raises(ValueError, match="given twice"):
            plan_replay([a, again])
    with pytest.raises(ValueError, match="closed"):
        plan_replay([a])
    with pytest.raises(TypeError, match="non-empty list"):
        check_one_pool_and_run([])
    with pytest.raises(TypeError, match="non-empty list"):
        plan_replay(a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"archives\[0\]"):
        plan_replay([str(path)])  # type: ignore[list-item]
