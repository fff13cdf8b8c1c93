"""straw.rollout.builder: accepted groups -> a durable plan -> hooks -> one shard per
data-parallel rank -> ready; acknowledgement only when a batch is finished (RL3, RL4),
weighted environments, restorable state, and the issue's bad input (a hook that raises,
a NaN reward, mismatched batch identities, a batch id reused with another plan)."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from straw import IdempotencyConflict, InvalidReference
from straw.codec import sample_records
from straw.rollout import BatchBuilder, EnvironmentMix, RankBatchRef, Status
from straw.rollout import batches as batches_package
from straw.rollout import builder as builder_module
from straw.rollout.batches import groups as groups_module
from straw.rollout.codec import group_value
from straw.rollout.shards import check_batch_identities, partition_by_tokens
from straw.tensor import TensorRef

from .pool import ByteCountingFS, Pool, make_group


@pytest.fixture
def pool(tmp_path):
    p = Pool(str(tmp_path / "pool"))
    yield p
    p.close()


def shard_samples(refs, store):
    return [s for r in refs for s in r.load(store, rank=r.rank).samples]


def test_batch_takes_groups_in_scheduling_order_and_balances_ranks_by_tokens(pool):
    # keys (oldest version): 5, 3, 7, 3, 1, 9 -> a batch of 4 takes 1, 3, 3 (FIFO), 5
    versions = [5, 3, 7, 3, 1, 9]
    pool.accept([make_group(i, version=v, n=4, response=[2, 9, 30, 5])
                 for i, v in enumerate(versions)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(4), dp_size=3) as b:
        refs = b.next_batch(0)
        assert len(refs) == 3 and [r.rank for r in refs] == [0, 1, 2]
        check_batch_identities(refs)
        samples = shard_samples(refs, pool.store)
        assert sorted({s["group_index"] for s in samples}) == [0, 1, 3, 4]
        assert len(samples) == 16 and len({s["index"] for s in samples}) == 16
        loads = [sum(len(s["tokens"]) for s in r.load(pool.store).samples) for r in refs]
        counts = [len(r.load(pool.store).samples) for r in refs]
        assert max(counts) - min(counts) <= 1
        assert max(loads) - min(loads) <= 34  # the largest sample: 4 + 30 tokens
        plan = json.loads(bytes(next(iter(pool.store.read(RecordSetRef_of(
            pool.coord.get_batch(refs[0].batch_id)["plan_ref"])))).payload))
        assert [g["position"] for g in plan["groups"]] == [4, 1, 3, 0]
        # the reward of every sample is its raw reward (no hook), the captures absent
        assert {(s["reward"], s["raw_reward"]) for s in samples} == {
            (float(j), float(j)) for j in range(4)}


def RecordSetRef_of(d):
    from straw import RecordSetRef
    return RecordSetRef.from_dict(d)


def test_the_plan_is_durable_before_any_hook_runs(pool):
    """RL3: both hooks see the batch planned (its plan_ref durable) and not ready."""
    pool.accept([make_group(i) for i in range(2)])
    seen = []

    def look(name):
        (batch_id,) = pool.coord.batches
        view = pool.coord.get_batch(batch_id)
        seen.append((name, view is not None and not view["ready"]))
        list(pool.store.read(RecordSetRef_of(view["plan_ref"])))  # readable: published

    def rewards(raw):
        look("reward")
        return raw

    def convert(sample, reward):
        look("convert")
        return builder_module.default_convert(sample, reward)

    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      reward_hook=rewards, convert_hook=convert) as b:
        assert b.next_batch(0) is not None
    assert seen[0] == ("reward", True) and all(ok for _, ok in seen) and len(seen) == 5


def test_a_hook_that_raises_leaves_the_batch_unready_and_a_retry_replays_the_plan(pool):
    pool.accept([make_group(i) for i in range(4)])
    calls = {"n": 0}

    def flaky(raw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("reward model unreachable")
        return [[r * 2 for r in g] for g in raw]

    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      reward_hook=flaky) as b:
        with pytest.raises(RuntimeError, match="unreachable"):
            b.next_batch(0)
        (batch_id,) = pool.coord.batches
        planned = pool.coord.get_batch(batch_id)
        assert not planned["ready"] and not planned["finished"]
        # its two groups belong to batch 0 (RL2): another rollout takes the other two
        assert b.backlog() == {"": 2}
        refs = b.next_batch(0)
        after = pool.coord.get_batch(batch_id)
        assert after["ready"] and after["plan_ref"] == planned["plan_ref"]
        assert after["input_positions"] == planned["input_positions"]
        assert refs[0].batch_id == batch_id
        assert {s["reward"] for s in shard_samples(refs, pool.store)} == {0.0, 2.0}
        assert b.backlog() == {"": 2}


def test_a_group_collected_for_an_unready_batch_is_never_selected_again(tmp_path):
    """RL2: a group is planned in at most one batch, across a failed hook and a
    restart between the collection and the plan."""
    root = str(tmp_path / "pool")
    p = Pool(root)
    p.accept([make_group(i) for i in range(4)])
    broken = [True]

    def rewards(raw):
        if broken[0]:
            raise RuntimeError("reward model down")
        return raw

    b = BatchBuilder(p.coord, p.store, EnvironmentMix.single(2), dp_size=1,
                     reward_hook=rewards)
    with pytest.raises(RuntimeError):
        b.next_batch(0)
    broken[0] = False
    one = b.next_batch(1)  # the driver moved on: rollout 1 takes the other groups
    b.close()
    p.close()
    p = Pool(root, recover=True)
    try:
        b = BatchBuilder(p.coord, p.store, EnvironmentMix.single(2), dp_size=1,
                         reward_hook=rewards)
        zero = b.next_batch(0)
        assert b.next_batch(2) is None and b.backlog() == {"": 0}
        groups = [sorted({s["group_index"] for s in shard_samples(r, p.store)})
                  for r in (zero, one)]
        assert groups == [[0, 1], [2, 3]]
        b.close()
    finally:
        p.close()


def test_a_retry_after_a_restart_replays_the_same_plan(tmp_path):
    root = str(tmp_path / "pool")
    p = Pool(root)
    p.accept([make_group(i, version=i) for i in range(3)])
    broken = [True]

    def rewards(raw):  # one hook (its name is part of the plan), broken at first
        if broken[0]:
            raise ValueError("hook bug")
        return raw

    b = BatchBuilder(p.coord, p.store, EnvironmentMix.single(2), dp_size=1,
                     reward_hook=rewards)
    with pytest.raises(ValueError, match="hook bug"):
        b.next_batch(7)
    (batch_id,) = p.coord.batches
    planned = p.coord.get_batch(batch_id)
    b.close()
    p.close()
    p = Pool(root, recover=True)
    try:
        p.accept([make_group(10, version=0)])  # would be selected first by a new plan
        broken[0] = False
        b = BatchBuilder(p.coord, p.store, EnvironmentMix.single(2), dp_size=1,
                         reward_hook=rewards)
        refs = b.next_batch(7)
        assert refs[0].batch_id == batch_id
        assert p.coord.get_batch(batch_id)["plan_ref"] == planned["plan_ref"]
        assert {s["group_index"] for s in shard_samples(refs, p.store)} == {0, 1}
        assert b.backlog() == {"": 2}  # group 2 and the new one
        b.close()
    finally:
        p.close()


def test_a_ready_batch_is_returned_again_without_writing_anything(tmp_path):
    fs = ByteCountingFS()
    p = Pool(str(tmp_path / "pool"), fs=fs)
    try:
        p.accept([make_group(i) for i in range(2)])
        with BatchBuilder(p.coord, p.store, EnvironmentMix.single(2), dp_size=2) as b:
            refs = b.next_batch(0)
            before = fs.writes()
            assert before > 0
            assert b.next_batch(0) == refs
            assert fs.writes() == before
    finally:
        p.close()


def test_reusing_a_batch_id_with_another_plan_is_an_error(pool):
    pool.accept([make_group(i) for i in range(2)])

    def boom(raw):
        raise RuntimeError("stop after planning")

    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      conversion={"advantage": "grpo"}, reward_hook=boom) as b:
        with pytest.raises(RuntimeError):
            b.next_batch(0)
    for other in ({"conversion": {"advantage": "reinforce"}, "dp_size": 2},
                  {"conversion": {"advantage": "grpo"}, "dp_size": 1},
                  {"conversion": {"advantage": "grpo"}, "dp_size": 2,
                   "parallel": {"tp": 2}}):
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2),
                          reward_hook=boom, **other) as b:
            with pytest.raises(IdempotencyConflict, match="another plan"):
                b.next_batch(0)
    (batch_id,) = pool.coord.batches
    assert not pool.coord.get_batch(batch_id)["ready"]


def test_a_ready_batch_replays_only_under_its_own_plan(pool):
    # issue 39: a builder with another conversion configuration got the stored ready
    # batch back, old plan digest and all, and trained on data converted the old way
    pool.accept([make_group(i) for i in range(2)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      conversion={"advantage": "grpo"}) as b:
        refs = b.next_batch(0)
    for other in ({"conversion": {"advantage": "reinforce"}},
                  {"conversion": {"advantage": "grpo"}, "parallel": {"tp": 2}}):
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                          **other) as b:
            with pytest.raises(IdempotencyConflict, match="is ready, built with another"):
                b.next_batch(0)
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      conversion={"advantage": "grpo"}) as b:
        assert b.next_batch(0) == refs  # its own plan: returned again, as before


def test_a_ready_batch_cannot_be_returned_for_another_parallel_layout(pool):
    pool.accept([make_group(i) for i in range(2)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2) as b:
        b.next_batch(0)
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=4) as b:
        with pytest.raises(ValueError, match="another parallel layout"):
            b.next_batch(0)


def test_each_rank_gets_a_small_picklable_reference_and_reads_only_its_shard(tmp_path):
    gen_fs = ByteCountingFS()
    p = Pool(str(tmp_path / "pool"), gen_fs=gen_fs)
    try:
        # routes [2003, 32, 4] int32: 1 MiB per sample
        p.accept([make_group(i, n=2, response=2000, routes=(32, 4)) for i in range(4)])
        with BatchBuilder(p.coord, p.store, EnvironmentMix.single(4), dp_size=4) as b:
            refs = b.next_batch(0)
        for r in refs:
            blob = pickle.dumps(r)
            assert len(blob) < 1024, len(blob)
            assert pickle.loads(blob) == r
        # rank 2 reads through a store of its own: its shard's manifest and record 0,
        # small tensors; its routes stay lazy (no byte read) until it asks for rows
        rank_fs = ByteCountingFS()
        from straw import SharedFilesystemStore
        with SharedFilesystemStore(p.root, "job", fs=rank_fs) as rank_store:
            base = rank_fs.read_bytes
            shard = pickle.loads(pickle.dumps(refs[2])).load(rank_store, rank=2)
            loaded = rank_fs.read_bytes - base
            assert len(shard.samples) == 2
            routes = [s["routes"] for s in shard.samples]
            assert all(isinstance(x, TensorRef) for x in routes)
            route_bytes = sum(x.nbytes for x in routes)
            assert loaded < 64 * 1024  # manifests + token ids, no capture bytes
            base = rank_fs.read_bytes
            arrays = [x.load() for x in routes]
            read = rank_fs.read_bytes - base
            assert route_bytes <= read <= 1.1 * route_bytes
            g, j = divmod(shard.samples[0]["index"], 2)
            assert (arrays[0] == g * 100 + j).all()
    finally:
        p.close()


def test_r3_routes_stay_lazy_and_a_cp_tp_rank_reads_only_its_rows(tmp_path):
    manager_fs = ByteCountingFS()
    p = Pool(str(tmp_path / "pool"), fs=manager_fs)
    try:
        # routes [2047, 32, 8] int32 = 2 MiB per sample, 8 chunks of 256 KiB
        p.accept([make_group(i, n=2, prompt_len=48, response=2000, routes=(32, 8))
                  for i in range(2)])
        total = 4 * 2047 * 32 * 8 * 4
        with BatchBuilder(p.coord, p.store, EnvironmentMix.single(2), dp_size=2) as b:
            base = manager_fs.read_bytes
            refs = b.next_batch(0)
            # the builder read record 0s (token ids), manifests and its own records:
            # not one capture chunk
            assert manager_fs.read_bytes - base < total / 20
        rank_fs = ByteCountingFS()
        from straw import SharedFilesystemStore
        with SharedFilesystemStore(p.root, "job", fs=rank_fs) as rank_store:
            routes = refs[1].load(rank_store).samples[0]["routes"]
            assert isinstance(routes, TensorRef) and routes.shape == (2047, 32, 8)
            base = rank_fs.read_bytes
            rows = routes.rows(1024, 1280)  # this CP rank's 256 rows (256 KiB)
            read = rank_fs.read_bytes - base
            assert rows.shape == (256, 32, 8)
            assert read <= 2 * 256 * 1024 + 4096  # at most the two chunks it touches
            assert read < routes.nbytes / 3
    finally:
        p.close()


def test_ranks_that_received_mismatched_batch_identities_fail_loudly(pool):
    pool.accept([make_group(i) for i in range(4)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2) as b:
        first = b.next_batch(0)
        second = b.next_batch(1)
    check_batch_identities(first)
    check_batch_identities(second)
    with pytest.raises(ValueError, match="inconsistent batch identities"):
        check_batch_identities([first[0], second[1]])  # another batch
    with pytest.raises(ValueError, match="inconsistent batch identities"):
        check_batch_identities([first[1], first[0]])  # swapped ranks
    with pytest.raises(ValueError, match="inconsistent batch identities"):
        check_batch_identities(first[:1])  # a reference of a 2-rank batch alone
    with pytest.raises(ValueError, match="inconsistent batch identities"):
        first[0].load(pool.store, rank=1)
    forged = dataclasses.replace(first[0], plan_digest=second[0].plan_digest)
    with pytest.raises(ValueError, match="inconsistent batch identities"):
        forged.load(pool.store)
    swapped = RankBatchRef(first[0].batch_id, first[0].plan_digest, 0, 2, first[1].shard)
    with pytest.raises(ValueError, match="inconsistent batch identities"):
        swapped.load(pool.store, rank=0)


def test_a_nan_reward_from_the_hook_is_an_error_and_the_batch_stays_unready(pool):
    pool.accept([make_group(i) for i in range(2)])

    def nan(raw):
        return [[math.nan if j == 1 else r for j, r in enumerate(g)] for g in raw]

    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      reward_hook=nan) as b:
        with pytest.raises(ValueError, match=r"group 0 \(commit 0\) sample 1: reward nan"):
            b.next_batch(0)
    (batch_id,) = pool.coord.batches
    assert not pool.coord.get_batch(batch_id)["ready"]
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                      reward_hook=lambda raw: [[1.0] * len(g) for g in raw]) as b:
        with pytest.raises(IdempotencyConflict):  # another hook is another plan
            b.next_batch(0)
    for wrong in ([[1.0]], [[1.0, 1.0]] * 3, [["x", 1.0], [1.0, 1.0]]):
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2,
                          reward_hook=nan) as b:
            nan_wrong = wrong
            b.reward_hook = lambda raw, w=nan_wrong: w  # same identity, wrong output
            with pytest.raises(ValueError, match="reward"):
                b.next_batch(0)


def _accept_records(pool, records, deps=()):
    """Complete one prompt task with ``records`` as its result (crafted bytes)."""
    from straw import TaskSpec
    n = sum(1 for t in pool.coord.tasks if t.startswith("prompt:"))
    tid = f"prompt:{n}"
    prompt = pool.gen.publish([], submission_id=f"p{n}")
    pool.coord.submit_tasks(f"admit{n}", [TaskSpec(tid, input_ref=prompt)])
    (a,) = pool.coord.acquire("gen", 1, task_ids=[tid]).assignments
    records[0] = dataclasses.replace(records[0], metadata={
        **records[0].metadata, "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})
    ref = pool.gen.publish(records, submission_id=f"bad{n}", dependencies=list(deps))
    return pool.coord.complete_task(a.lease, submission_id=f"bad{n}", result_ref=ref).position


def test_a_stored_nan_reward_reaching_the_builder_is_quarantined_with_its_reason(pool):
    value = group_value(make_group(0))
    value["samples"][1]["reward"] = math.nan  # what no Sample allows: crafted bytes
    records, _ = sample_records(value, tokens=8)
    _accept_records(pool, records)
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1) as b:
        assert b.next_batch(0) is None  # nothing trainable yet: the scan went on
        assert pool.coord.batches == {}
        (q,) = b.quarantined()
        assert (q["position"], q["task_id"]) == (0, "prompt:0")
        assert re.search(r"task 'prompt:0' \(commit 0\).*CorruptData.*reward.*finite",
                         q["reason"]), q["reason"]


def test_bad_accepted_groups_are_quarantined_durably_and_later_groups_flow(pool):
    # corrupt (a NaN reward in the stored bytes), another schema, not ready: each skipped
    # for good with its reason; the groups after them make batches
    corrupt = group_value(make_group(0))
    corrupt["samples"][0]["reward"] = math.nan
    _accept_records(pool, sample_records(corrupt, tokens=8)[0])
    _accept_records(pool, sample_records({"schema": "someone.else", "version": 1})[0])
    not_ready = make_group(2)
    not_ready = dataclasses.replace(not_ready, samples=(dataclasses.replace(
        not_ready.samples[0], status=Status.PENDING, reward=None), *not_ready.samples[1:]))
    pool.accept([not_ready, make_group(3), make_group(4)])
    b = BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1)
    refs = b.next_batch(0)
    assert {s["group_index"] for s in shard_samples(refs, pool.store)} == {3, 4}
    reasons = {q["task_id"]: q["reason"] for q in b.quarantined()}
    assert sorted(reasons) == ["prompt:0", "prompt:1", "prompt:2"]
    assert "CorruptData" in reasons["prompt:0"]
    assert "UnsupportedSchema" in reasons["prompt:1"]
    assert "not ready: sample 0 is pending" in reasons["prompt:2"]
    assert b.metrics() == {"backlog": 0, "finished_batches": 0, "quarantined": 3}
    saved = b.state()
    assert [q["position"] for q in saved["quarantined"]] == [0, 1, 2]
    # durable: saved with the ready batch, a new builder does not meet them again
    b.close()
    b = BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1)
    assert b.state() == saved and len(b.quarantined()) == 3
    # they never train: finishing the batch acknowledges them with its inputs, so the
    # processed cursor passes them (else it would stop at position 0 for good)
    b.finish_batch(refs[0].batch_id)
    view = pool.coord.load_consumer_state("training")
    assert view["processed_cursor"] == 6 and b.state()["processed_positions"] == []
    pool.accept([make_group(5), make_group(6)])
    assert {s["group_index"] for s in shard_samples(b.next_batch(1), pool.store)} == {5, 6}
    b.close()


def test_finishing_a_batch_after_training_acknowledges_its_inputs_never_before(pool):
    """RL4: ready is not acknowledgement; finish_batch is, and only then are the packs
    of its inputs reclaimed (once nothing else holds them)."""
    pool.accept([make_group(i, routes=(2, 2)) for i in range(2)])
    pool.gen.seal()  # batch 0's groups in one sealed pack
    pool.accept([make_group(i) for i in range(2, 4)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=2) as b:
        refs = b.next_batch(0)
        (batch_id,) = pool.coord.batches
        inputs = pool.coord.get_batch(batch_id)["input_positions"]
        assert inputs == [0, 1, 4]  # its two groups and its collection
        saved = pool.coord.load_consumer_state("training")
        assert saved["processed_cursor"] == 0 and saved["fetch_cursor"] == 5
        assert b.state()["processed_positions"] == []
        assert pool.coord.collect_garbage()["reclaimed_files"] == 0
        assert refs[0].load(pool.store).samples[0]["routes"].load().shape == (7, 2, 2)
        group_ref = pool.coord.read_commits(0, 1).commits[0].result_ref
        b.finish_batch(batch_id)
        b.finish_batch(batch_id)  # idempotent
        saved = pool.coord.load_consumer_state("training")
        assert saved["processed_cursor"] == 2 and b.state()["processed_positions"] == [4]
        assert pool.coord.get_batch(batch_id)["finished"]
        gc = pool.coord.collect_garbage()
        assert gc["reclaimed_files"] == 1
        with pytest.raises(InvalidReference):  # its pack is gone
            list(pool.store.read(group_ref))
        # the rest of the queue is untouched: the next batch takes groups 2 and 3
        nxt = b.next_batch(1)
        assert {s["group_index"] for s in shard_samples(nxt, pool.store)} == {2, 3}
        with pytest.raises(ValueError, match="not a ready batch"):
            b.finish_batch("batch:unknown")


def test_weighted_environments_keep_their_proportions_in_every_batch(pool):
    mix = EnvironmentMix({"math": 3, "code": 1}, 4)
    pool.accept([make_group(i, env="math") for i in range(9)]
                + [make_group(9, env="code")])
    with BatchBuilder(pool.coord, pool.store, mix, dp_size=2) as b:
        assert b.backlog() == {"math": 9, "code": 1}
        refs = b.next_batch(0)
        envs = [s["environment"] for s in shard_samples(refs, pool.store)]
        assert envs.count("math") == 6 and envs.count("code") == 2  # 3 + 1 groups of 2
        # code's backlog is empty: it may admit fresh prompts, math (6 left) may not
        assert b.next_batch(1) is None and pool.coord.lookup_submission("collection:1") \
            is None
        assert b.admits_fresh("code") and not b.admits_fresh("math")
        pool.accept([make_group(10, env="code")])
        refs = b.next_batch(1)
        envs = [s["environment"] for s in shard_samples(refs, pool.store)]
        assert envs.count("math") == 6 and envs.count("code") == 2
        assert b.state()["mix"]["batches"] == 2
        assert b.backlog() == {"math": 3, "code": 0}


def test_a_group_of_an_unconfigured_environment_is_a_clear_error(pool):
    pool.accept([make_group(0, env="vision")])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix({"math": 1}, 1),
                      dp_size=1) as b:
        with pytest.raises(ValueError, match="'vision' is not configured"):
            b.next_batch(0)


def test_the_builder_state_is_json_and_a_new_builder_resumes_from_it(tmp_path):
    root = str(tmp_path / "pool")
    p = Pool(root)
    mix = EnvironmentMix({"a": 1, "b": 1}, 3)
    p.accept([make_group(i, env="ab"[i % 2], version=i) for i in range(8)])
    b = BatchBuilder(p.coord, p.store, mix, dp_size=2)
    first = b.next_batch(0)
    b.finish_batch(first[0].batch_id)
    second = b.next_batch(1)
    state = b.state()
    assert json.loads(json.dumps(state)) == state
    assert state["mix"]["batches"] == 2
    b.close()
    p.close()
    p = Pool(root, recover=True)
    try:
        b = BatchBuilder(p.coord, p.store, mix, dp_size=2)
        assert b.state() == state
        assert b.next_batch(1) == second  # ready: returned again
        assert b.next_batch(2) is None  # 1 a and 1 b left: not enough for a batch
        p.accept([make_group(i, env="ab"[i % 2], version=i) for i in range(8, 10)])
        third = b.next_batch(2)
        taken = [s["group_index"] for r in (first, second, third)
                 for s in shard_samples(r, p.store)]
        assert len(set(taken)) == 9 and set(taken) <= set(range(10))
        assert len(taken) == 18  # no group twice (RL2)
        assert sum(b.backlog().values()) == 1
        b.close()
        # an explicit state (a checkpoint's) is restored and saved with the queue
        b = BatchBuilder(p.coord, p.store, mix, dp_size=2, state=state)
        assert b.state() == state
        assert p.coord.load_consumer_state("training")["fetch_cursor"] == \
            state["fetch_cursor"]
        b.close()
        with pytest.raises(ValueError, match="builder state"):
            BatchBuilder(p.coord, p.store, mix, dp_size=2, state={"version": 9})
        b = BatchBuilder(p.coord, p.store, mix, dp_size=2)  # the consumer was given up
        b.close()
    finally:
        p.close()


def test_bad_arguments_are_clear_errors(pool):
    with pytest.raises(ValueError, match="dp_size"):
        BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=0)
    with pytest.raises(TypeError, match="EnvironmentMix"):
        BatchBuilder(pool.coord, pool.store, 2, dp_size=1)
    with pytest.raises(TypeError, match="reward_hook"):
        BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1,
                     reward_hook=3)
    with pytest.raises(ValueError, match="JSON"):
        BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1,
                     conversion={"f": object()})
    pool.accept([make_group(0, n=1)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=2) as b:
        with pytest.raises(ValueError, match="rollout_id"):
            b.next_batch(True)
        with pytest.raises(ValueError, match="1 samples cannot feed 2"):
            b.next_batch(0)
    with pytest.raises(ValueError, match="no rank references"):
        check_batch_identities([])
    with pytest.raises(ValueError, match="not below world"):
        RankBatchRef("b", "d", 2, 2, pool.coord.read_commits(0, 1).commits[0].result_ref)


def test_a_dict_reward_needs_a_reward_key_or_a_hook(pool):
    pool.accept([make_group(0, rewards=[{"acc": 1.0, "len": 0.5}, {"acc": 0.0,
                                                                   "len": 0.2}])])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1) as b:
        with pytest.raises(ValueError, match="reward_key"):
            b.next_batch(0)
    # another builder configuration is another plan: a new rollout id
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1,
                      reward_key="acc") as b:
        with pytest.raises(IdempotencyConflict):
            b.next_batch(0)


def test_the_module_docstring_example_runs(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.mkdtemp", lambda: str(tmp_path / "example"))
    text = batches_package.__doc__.split("Example (runnable")[1].split("::", 1)[1]
    code = "\n".join(line[4:] for line in text.splitlines())
    scope: dict = {}
    exec(compile(code, "builder example", "exec"), scope)
    assert len(scope["refs"]) == 2 and len(scope["shard"].samples) == 2


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=60), st.integers(1, 8))
def test_partition_by_tokens_covers_every_sample_once_and_balances(tokens, world):
    if len(tokens) < world:
        with pytest.raises(ValueError, match="cannot feed"):
            partition_by_tokens(tokens, world)
        return
    parts = partition_by_tokens(tokens, world)
    assert sorted(i for p in parts for i in p) == list(range(len(tokens)))
    counts = [len(p) for p in parts]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    loads = [sum(tokens[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(tokens)
    assert parts == partition_by_tokens(list(tokens), world)  # deterministic


def test_partition_by_tokens_balances_what_taking_turns_would_not():
    tokens = [100, 1] * 4  # taking turns: 400 tokens on rank 0, 4 on rank 1
    parts = partition_by_tokens(tokens, 2)
    assert [sum(tokens[i] for i in p) for p in parts] == [202, 202]
    assert parts == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_a_collection_leased_before_a_lost_reply_is_completed_with_that_lease(pool):
    """The builder acquired ``collection:0`` and the reply was lost (or it was killed
    before completing it): the next call completes the same task under that lease."""
    from straw import TaskSpec
    pool.accept([make_group(i) for i in range(2)])
    pool.coord.submit_tasks("collection:0", [TaskSpec("collection:0", control=True,
                                                      estimated_records=0)])
    got = pool.coord.acquire(builder_module.BUILDER_WORKER, 1, task_ids=["collection:0"],
                             control=True)
    assert got.status == "acquired"
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1) as b:
        refs = b.next_batch(0)
    receipt = pool.coord.lookup_submission("collection:0")
    assert refs[0].batch_id == "batch:" + receipt.commit_id
    assert pool.coord.task_status("collection:0")["generation"] == 1  # no second attempt


def test_the_builder_state_stays_flat_over_many_batches(pool):
    # the state keeps what is live, not the run's history: of the finished batches their
    # count and the newest few (the queue's progress record lists them all: the core's
    # protocol releases a batch's plan and ready data while it is listed there)
    sizes, batch_ids = {}, []
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1) as b:
        for i in range(60):
            pool.accept([make_group(i)])
            refs = b.next_batch(i)
            b.finish_batch(refs[0].batch_id)
            batch_ids.append(refs[0].batch_id)
            sizes[i] = len(json.dumps(b.state(), sort_keys=True))
        state = b.state()
        assert state["finished_count"] == 60
        assert state["recent_finished"] == batch_ids[-builder_module.FINISHED_KEPT:]
        # flat: from batch 20 to 60 only the counters' digits may grow
        assert sizes[59] - sizes[20] <= 8, (sizes[20], sizes[59])
        # a retried finish of a batch older than the kept window is still a no-op
        b.finish_batch(batch_ids[0])
        assert b.state() == state
        progress = json.loads(bytes(next(iter(pool.store.read(RecordSetRef_of(
            pool.coord.load_consumer_state("training")["progress_ref"])))).payload))
        assert progress["finished_batches"] == batch_ids
        assert all(pool.coord.get_batch(x)["finished"] for x in batch_ids)


def test_restoring_an_older_state_unfinishes_only_the_batches_after_it(tmp_path):
    # in place, past the kept window: the finished batches up to the state stay finished
    # (the saved progress's first finished_count), the later ones are replayed
    p = Pool(str(tmp_path / "pool"))
    n = builder_module.FINISHED_KEPT + 4
    ids = []
    with BatchBuilder(p.coord, p.store, EnvironmentMix.single(1), dp_size=1) as b:
        for i in range(n + 2):
            p.accept([make_group(i)])
            ids.append(b.next_batch(i)[0].batch_id)
            b.finish_batch(ids[-1])
            if i == n - 1:
                older = b.state()
    with BatchBuilder(p.coord, p.store, EnvironmentMix.single(1), dp_size=1,
                      state=older) as b:
        assert b.state() == older
        assert [p.coord.get_batch(x)["finished"] for x in ids] == [True] * n + [False] * 2
        assert b.next_batch(n)[0].batch_id == ids[n]  # ready again: replayed
    p.close()


def test_a_version_1_state_is_read(pool):
    pool.accept([make_group(i) for i in range(2)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1) as b:
        first = b.next_batch(0)[0].batch_id
        b.finish_batch(first)
        v2 = b.state()
    v1 = {k: v for k, v in v2.items()
          if k not in ("finished_count", "recent_finished", "quarantined")}
    v1.update(version=1, finished_batches=[first])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1,
                      state=v1) as b:
        assert b.state() == v2


def test_rank_shards_are_published_concurrently_bounded_by_io_concurrency(pool):
    import threading
    import time

    from straw.rollout import RolloutConfig

    pool.accept([make_group(i, n=2) for i in range(6)])
    inflight, peak, lock = [0], [0], threading.Lock()
    publish = pool.store.publish

    def counting(records, **kw):  # type: ignore[no-untyped-def]
        shard = kw["submission_id"].startswith("shard:")
        if shard:
            with lock:
                inflight[0] += 1
                peak[0] = max(peak[0], inflight[0])
            time.sleep(0.05)  # a slow filesystem: overlapping publishes show
        try:
            return publish(records, **kw)
        finally:
            if shard:
                with lock:
                    inflight[0] -= 1

    pool.store.publish = counting
    for bound, batch in ((2, 0), (1, 1)):
        peak[0] = 0
        with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(3), dp_size=6,
                          config=RolloutConfig(io_concurrency=bound)) as b:
            refs = b.next_batch(batch)
            check_batch_identities(refs)
            assert [r.rank for r in refs] == list(range(6))
            assert len(shard_samples(refs, pool.store)) == 6
        assert peak[0] == bound, (bound, peak[0])


def _counting_reads(monkeypatch):
    """Count the builder's decodes of a group's stored record 0 (``lazy_group``)."""
    reads: list[str] = []
    real = groups_module.lazy_group

    def counted(store, ref):
        reads.append(ref.digest)
        return real(store, ref)

    monkeypatch.setattr(groups_module, "lazy_group", counted)
    return reads


def test_each_accepted_group_is_decoded_once_from_scan_to_shard(pool, monkeypatch):
    """The scan's decoded (and checked) group is kept for the build: rewards and
    conversion use it, nothing of the group is read again (the pipeline's hot path)."""
    reads = _counting_reads(monkeypatch)
    pool.accept([make_group(i, n=3) for i in range(4)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(4), dp_size=2) as b:
        refs = b.next_batch(0)
        assert refs is not None
        assert len(reads) == 4 and len(set(reads)) == 4
        assert b.decoded.kept == {} and b.decoded.kept_tokens == 0  # built: nothing held any longer
        assert len(shard_samples(refs, pool.store)) == 12


def test_past_the_decoded_budget_groups_are_read_again_with_the_same_batch(
        tmp_path, monkeypatch):
    """With no token budget the builder keeps nothing decoded: each group is read at
    scan, for its rewards and for its conversion, and the shards are the same."""
    def build(root):
        p = Pool(str(root))
        try:
            p.accept([make_group(i, n=3) for i in range(4)])
            with BatchBuilder(p.coord, p.store, EnvironmentMix.single(4), dp_size=2) as b:
                refs = b.next_batch(0)
                return [[(s["index"], s["tokens"].tolist(), s["reward"])
                         for s in r.load(p.store, rank=r.rank).samples] for r in refs]
        finally:
            p.close()

    kept = build(tmp_path / "kept")
    reads = _counting_reads(monkeypatch)
    monkeypatch.setattr(groups_module, "DECODED_TOKENS_KEPT", 0)
    assert build(tmp_path / "unkept") == kept
    assert len(reads) == 12 and len(set(reads)) == 4


def test_groups_decoded_ahead_are_built_without_a_second_decode(pool, monkeypatch):
    """``decode_ahead`` (the controller's scan-ahead thread, while a build may run) reads
    and decodes the accepted groups once; the scan takes them decoded from its table and
    the batch is the one a builder decoding at its scan makes."""
    reads = _counting_reads(monkeypatch)
    pool.accept([make_group(i, n=3) for i in range(4)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(4), dp_size=2) as b:
        assert b.decode_ahead() == 4 and len(reads) == 4
        assert b.decode_ahead() == 0  # nothing new accepted: nothing read again
        assert b.metrics()["backlog"] == 0  # the builder's state did not change
        refs = b.next_batch(0)
        assert len(reads) == 4 and len(set(reads)) == 4  # each group decoded once
        assert b.decoded.ahead == {} and b.decoded.ahead_tokens == 0
        assert sorted({s["group_index"] for s in shard_samples(refs, pool.store)}) == \
            [0, 1, 2, 3]
        pool.accept([make_group(i, n=3) for i in range(4, 6)])
        assert b.decode_ahead() == 2  # from where it stopped: only the new ones


def test_decode_ahead_stops_at_its_budget_and_resumes_where_it_stopped(pool, monkeypatch):
    reads = _counting_reads(monkeypatch)
    pool.accept([make_group(i, n=3) for i in range(4)])  # 3 samples of 8 tokens a group
    monkeypatch.setattr(groups_module, "DECODED_TOKENS_KEPT", 2 * 3 * 8)
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1) as b:
        assert b.decode_ahead() == 2 and b.decode_ahead() == 0  # full: waits for the scan
        refs = b.next_batch(0)  # takes the two decoded ahead, decodes the others itself
        assert len(reads) == 4
        assert sorted({s["group_index"] for s in shard_samples(refs, pool.store)}) == [0, 1]
        b.finish_batch(refs[0].batch_id)
        assert b.decode_ahead() == 0  # the scan passed them all already
        assert sorted({s["group_index"] for s in shard_samples(b.next_batch(1),
                                                               pool.store)}) == [2, 3]
        # (the scan kept 2 and 3 past the same budget: read again for their build)
        assert len(reads) == 6


def test_a_group_decode_ahead_cannot_read_is_left_to_the_scan_to_quarantine(pool):
    corrupt = group_value(make_group(0))
    corrupt["samples"][0]["reward"] = math.nan
    _accept_records(pool, sample_records(corrupt, tokens=8)[0])
    pool.accept([make_group(1), make_group(2)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(2), dp_size=1) as b:
        assert b.decode_ahead() == 2
        refs = b.next_batch(0)
        assert {s["group_index"] for s in shard_samples(refs, pool.store)} == {1, 2}
        (q,) = b.quarantined()
        assert q["task_id"] == "prompt:0" and "CorruptData" in q["reason"]


def test_decode_ahead_on_another_thread_while_batches_are_built(pool):
    """Concurrent with next_batch and finish_batch: every group in exactly one batch,
    in scheduling order, whichever of the two decoded it; nothing left in its table."""
    import threading

    b = BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(4), dp_size=1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def ahead():
        while not stop.is_set():
            try:
                b.decode_ahead()
            except BaseException as e:  # noqa: BLE001 (the test's failure)
                errors.append(e)
                return

    t = threading.Thread(target=ahead)
    t.start()
    seen: list[int] = []
    try:
        for rid in range(6):
            pool.accept([make_group(4 * rid + i, n=2) for i in range(4)])
            refs = b.next_batch(rid)
            seen += sorted({s["group_index"] for s in shard_samples(refs, pool.store)})
            b.finish_batch(refs[0].batch_id)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert seen == list(range(24))
    b.backlog()  # (a last decode may have landed after the last scan: the next one drops it)
    assert b.decoded.ahead == {} and b.decoded.ahead_tokens == 0
    b.close()
