"""straw.rollout.controller: take refills from the dataset (groups published first, then
ONE submit_tasks transaction with the advanced cursor), a failed or lost refill never moves
the cursor, reopening resumes it, and RL1 (exactly-once dataset admission per epoch) holds
across a SimFS crash at every step of a run of refills."""

from __future__ import annotations

import dataclasses

import pytest

from fault_injection.queue_campaign import crash_in
from fault_injection.rules import MUTATING_OPS
from fault_injection.simfs import SimFS
from straw import IndeterminateCommit, SharedFilesystemStore, StorageUnavailable
from straw.clock import ManualClock
from straw.rollout import DataSource, RolloutConfig, Status
from straw.rollout.codec import group_from_records
from straw.rollout.controller import RolloutController

PROMPTS = [(i, i + 1, i + 2) for i in range(20)]


def open_controller(root, *, recover=False, n=2, prompts=PROMPTS, **kw):
    store = SharedFilesystemStore(str(root), "job", writer_id="controller")
    config = RolloutConfig(n_samples_per_prompt=n, lease_seconds=60)
    return store, RolloutController(store, prompts, config=config, recover=recover, **kw)


def cursor(controller):
    return controller.coordinator.producer_state("dataset")


def test_take_refills_publishes_then_submits_with_the_cursor(tmp_path):
    store, c = open_controller(tmp_path)
    try:
        got = c.take("w", 3)
        assert got.status == "acquired" and len(got.assignments) == 3
        # a refill is clamped to 8..64 groups; the cursor went in with the tasks
        assert sorted(c.coordinator.tasks) == sorted(f"prompt:{g}" for g in range(8))
        state = cursor(c)
        assert state["cursor"]["sample_group_index"] == 8
        assert state["cursor"]["sample_index"] == 16 and state["cursor"]["sample_offset"] == 8
        assert c.cursor.sample_group_index == 8
        for a in got.assignments:
            g = int(a.task.task_id.split(":")[1])
            assert a.task.metadata == {"group_index": g, "epoch_id": 0, "dataset_index": g}
            assert a.task.priority == 0 and a.task.scheduling_key == 0
            assert a.task.estimated_tokens == a.task.input_ref.tokens
            group = group_from_records(list(store.read(a.task.input_ref)))
            assert [s.index for s in group] == [2 * g, 2 * g + 1]  # n_samples_per_prompt=2
            assert group.prompt == list(PROMPTS[g]) or group.prompt == PROMPTS[g]
        # pending prompts are handed out before any new refill
        assert len(c.take("w", 64).assignments) == 5
        assert c.refills == 1
        assert len(c.take("w", 1).assignments) == 1 and c.refills == 2
        assert cursor(c)["cursor"]["sample_group_index"] == 16
    finally:
        c.close()
        store.close()


@pytest.mark.parametrize("max_attempts", [None, 1, 5])
def test_prompt_tasks_spend_the_configured_attempts(tmp_path, max_attempts):
    # each lease that expires spends an attempt: the task fails for good after
    # max_attempts of them (RolloutConfig's, the queue's 3 unless set)
    clock = ManualClock()
    store = SharedFilesystemStore(str(tmp_path), "job", writer_id="controller")
    extra = {} if max_attempts is None else {"max_attempts": max_attempts}
    config = RolloutConfig(n_samples_per_prompt=1, lease_seconds=10, min_refill=1,
                           max_refill=1, **extra)
    c = RolloutController(store, PROMPTS[:1], config=config, clock=clock)
    try:
        want = 3 if max_attempts is None else max_attempts
        for attempt in range(want):
            (a,) = c.take(f"w{attempt}", 1).assignments
            assert a.task.max_attempts == want and a.task.task_id == "prompt:0"
            clock.advance(11)  # the lease expires
        c.coordinator.acquire("nobody", 1, task_ids=["prompt:1"])  # expiries run
        status = c.task_status("prompt:0")
        assert status["state"] == "failed", status
    finally:
        c.close()
        store.close()
    with pytest.raises(ValueError, match="max_attempts"):
        RolloutConfig(max_attempts=0)


def completed_items(store, assignments, tag="g"):
    """complete_many's items for ``assignments``: each group completed and published
    (submission ids ``<tag><i>``)."""
    from straw.rollout.codec import group_records
    from straw.rollout.controller import named_records

    items = []
    for i, assignment in enumerate(assignments):
        a = assignment.lease
        group = group_from_records(list(store.read(assignment.task.input_ref)))
        done = dataclasses.replace(group, samples=tuple(dataclasses.replace(
            s, tokens=(1, 2), response_length=1, status=Status.COMPLETED, reward=1.0)
            for s in group.samples))
        records, deps = group_records(done)
        ref = store.publish(named_records(records, task_id=a.task_id, attempt_id=a.attempt_id),
                            submission_id=f"{tag}{i}", dependencies=deps)
        items.append({"lease": a, "result_ref": ref, "staleness": [0]})
    return items


def test_complete_many_answers_each_item_in_order_in_one_journal_frame(tmp_path):
    # the call is one Coordinator.complete_tasks (one journal frame, one catalog
    # adoption): the outcomes come back one per item, in order, a stale lease's error at
    # its own place, and the accepted ones cost one frame
    from straw import StaleAttempt
    from straw.protocol import CommitReceipt

    store, c = open_controller(tmp_path, n=1, prompts=[(i,) for i in range(64)])
    try:
        taken = c.take("w", 40).assignments
        n = len(taken)
        assert n > 16
        items = completed_items(store, taken)
        for i, item in enumerate(items):
            if i % 3 == 0:  # stale: another attempt's token
                lease = item["lease"]
                item["lease"] = dataclasses.replace(lease, token="0" * len(lease.token))
        frames = c.coordinator.journal._m["frames"]
        out = c.complete_many(items)
        assert c.coordinator.journal._m["frames"] - frames == 1
        assert len(out) == n
        for i, (item, o) in enumerate(zip(items, out, strict=True)):
            if i % 3 == 0:
                assert isinstance(o, StaleAttempt), (i, o)
            else:
                assert isinstance(o, CommitReceipt) and o.task_id == item["lease"].task_id
                assert o.result_ref == item["result_ref"]
        assert c.complete_many(items[1:3]) == out[1:3]  # a retry: the same receipts
    finally:
        c.close()
        store.close()


def test_complete_many_on_a_closed_coordinator_raises_instead_of_answering_per_item(tmp_path):
    # Closed is a StrawError (as straw-queue reports it): the per-item reporting of
    # complete_many must not turn "this coordinator is closed" into one error per item
    from straw.errors import Closed

    store, c = open_controller(tmp_path, n=1, prompts=[(i,) for i in range(8)])
    try:
        items = completed_items(store, c.take("w", 2).assignments)
        c.coordinator.close()
        for batch in (items[:1], items):
            with pytest.raises(Closed):
                c.complete_many(batch)
    finally:
        c.close()
        store.close()


def test_a_refill_follows_the_configured_bounds(tmp_path):
    """RolloutConfig.min_refill/max_refill bound a refill (they were ignored: every
    refill was clamped to the module defaults 8..64)."""
    store = SharedFilesystemStore(str(tmp_path), "job", writer_id="controller")
    config = RolloutConfig(lease_seconds=60, min_refill=2, max_refill=3)
    c = RolloutController(store, PROMPTS, config=config)
    try:
        assert len(c.take("w", 1).assignments) == 1
        assert cursor(c)["cursor"]["sample_group_index"] == 2  # raised to min_refill
        assert len(c.take("w", 1).assignments) == 1 and c.refills == 1
        assert len(c.take("w", 10).assignments) == 3  # cut to max_refill
        assert cursor(c)["cursor"]["sample_group_index"] == 5 and c.refills == 2
    finally:
        c.close()
        store.close()


def test_reopening_resumes_the_cursor_from_the_producer_state(tmp_path):
    store, c = open_controller(tmp_path)
    c.take("w", 8)
    c.close()
    store.close()
    store, c = open_controller(tmp_path, recover=True)
    try:
        assert c.cursor.sample_group_index == 8
        got = c.take("w", 8)  # the first refill's tasks are leased (revoked by recovery):
        ids = {a.task.task_id for a in got.assignments}  # they come back first
        assert ids == {f"prompt:{g}" for g in range(8)}
        got = c.take("w", 8)
        assert {a.task.task_id for a in got.assignments} == {f"prompt:{g}"
                                                             for g in range(8, 16)}
    finally:
        c.close()
        store.close()


def test_a_failed_refill_never_moves_the_cursor(tmp_path):
    """RL1: a failed refill moves no cursor; the next one starts at the queue's."""
    store, c = open_controller(tmp_path)
    try:
        real = c.coordinator.submit_tasks

        def fail(*a, **k):
            raise StorageUnavailable("injected: the journal disk is gone")

        c.coordinator.submit_tasks = fail
        with pytest.raises(StorageUnavailable):
            c.take("w", 8)
        assert cursor(c) is None and c.coordinator.tasks == {}
        c.source.refill(8)  # memory may run ahead: the next refill starts from the queue
        c.coordinator.submit_tasks = real
        got = c.take("w", 8)
        assert {a.task.task_id for a in got.assignments} == {f"prompt:{g}" for g in range(8)}
        assert [a.task.metadata["dataset_index"] for a in
                sorted(got.assignments, key=lambda a: a.task.metadata["group_index"])] \
            == list(range(8))
    finally:
        c.close()
        store.close()


def test_a_lost_refill_reply_is_retried_with_the_same_request_id(tmp_path):
    """RL1: the retry is the same request (a new id would admit the refill twice)."""
    store, c = open_controller(tmp_path)
    try:
        real = c.coordinator.submit_tasks
        seen = []

        def lost_once(request_id, tasks, **k):
            seen.append(request_id)
            out = real(request_id, tasks, **k)
            if len(seen) == 1:
                raise IndeterminateCommit("injected: the reply was lost after the commit")
            return out

        c.coordinator.submit_tasks = lost_once
        got = c.take("w", 8)
        assert seen == ["dataset:0", "dataset:0"]  # the same request, answered from the journal
        assert len(got.assignments) == 8 and len(c.coordinator.tasks) == 8
        assert cursor(c)["cursor"]["sample_group_index"] == 8 == c.cursor.sample_group_index
    finally:
        c.close()
        store.close()


def test_a_refill_durable_behind_lost_replies_is_not_admitted_again(tmp_path):
    """Every reply lost: take raises, memory did not move, but the queue holds the
    refill; the next take resets to the queue's cursor and goes on (RL1)."""
    store, c = open_controller(tmp_path)
    try:
        real = c.coordinator.submit_tasks

        def always_lost(request_id, tasks, **k):
            real(request_id, tasks, **k)
            raise IndeterminateCommit("injected: the reply was lost after the commit")

        c.coordinator.submit_tasks = always_lost
        with pytest.raises(IndeterminateCommit):
            c.take("w", 8)
        assert c.cursor.sample_group_index == 0  # memory did not move
        c.coordinator.submit_tasks = real
        assert len(c.take("w", 8).assignments) == 8  # the durable refill's tasks
        got = c.take("w", 8)  # the next refill starts at the queue's cursor
        assert {a.task.task_id for a in got.assignments} == {f"prompt:{g}"
                                                             for g in range(8, 16)}
        assert [a.task.metadata["dataset_index"] for a in sorted(
            got.assignments, key=lambda a: a.task.metadata["group_index"])] \
            == list(range(8, 16))
    finally:
        c.close()
        store.close()


def test_bad_input_is_refused_clearly(tmp_path):
    store = SharedFilesystemStore(str(tmp_path), "job")
    try:
        with pytest.raises(ValueError, match="dataset is empty"):
            RolloutController(store, [])
        with pytest.raises(ValueError, match="n_samples_per_prompt must be an int >= 1"):
            RolloutConfig(n_samples_per_prompt=0)
        with pytest.raises(ValueError, match="n_samples_per_prompt"):
            RolloutController(store, DataSource(PROMPTS, n_samples_per_prompt=2),
                              config=RolloutConfig(n_samples_per_prompt=4))
        c = RolloutController(store, PROMPTS)
        try:
            with pytest.raises(ValueError, match="count must be an int >= 1"):
                c.take("w", 0)
            with pytest.raises(ValueError, match="worker_id"):
                c.take("", 1)
            assert c.coordinator.tasks == {}  # nothing was refilled by refused calls
        finally:
            c.close()
    finally:
        store.close()


def test_staleness_metrics_over_what_is_accepted(tmp_path):
    store, c = open_controller(tmp_path)
    try:
        assert c.staleness_metrics() == {"staleness/mean": 0.0, "staleness/max": 0.0,
                                         "staleness/unknown_count": 0.0}
        c.set_serving_version(5)
        assert c.serving_version == 5
        with pytest.raises(TypeError):
            c.set_serving_version(1.5)
    finally:
        c.close()
        store.close()


# --- RL1 across crashes -------------------------------------------------------------------

SIM_PROMPTS = [(i,) for i in range(12)]
SIM_REFILLS = 4  # 32 groups: two epochs and a part of a third (12 prompts, shuffled)


def sim_controller(sim, clock, recover):
    store = SharedFilesystemStore("/pool", "job", writer_id="controller", fs=sim, clock=clock,
                                  reserve_bytes=16 * 1024, segment_target_bytes=1 << 20,
                                  visibility_retries=2, visibility_backoff=0.0)
    c = RolloutController(store, SIM_PROMPTS, config=RolloutConfig(lease_seconds=1000),
                          recover=recover, clock=clock, shuffle=True, seed=3)
    c.coordinator.snapshot_every = 3  # crash inside snapshots too
    return store, c


def refill_run(sim, clock, recover):
    """Take every group of SIM_REFILLS refills (each take of 8 drains the last refill)."""
    store, c = sim_controller(sim, clock, recover)
    while c.cursor.sample_group_index < SIM_REFILLS * 8:
        c.take("w", 8)
    c.close()
    store.close()


def check_rl1(sim, clock):
    """RL1 on what survived: the tasks are exactly the epochs' orders up to the queue's
    cursor, each dataset index once per epoch; then the run completes from there."""
    store, c = sim_controller(sim, clock, recover=True)
    try:
        c.close()
    finally:
        store.close()
    refill_run(sim, clock, recover=True)
    store, c = sim_controller(sim, clock, recover=True)
    try:
        meta = [t["spec"]["metadata"] for t in c.coordinator.tasks.values()]
        groups = sorted(m["group_index"] for m in meta)
        assert groups == list(range(len(groups))), "a group index is missing or repeated"
        assert len(groups) == c.cursor.sample_group_index == SIM_REFILLS * 8
        by_epoch: dict[int, list[int]] = {}
        for m in sorted(meta, key=lambda m: m["group_index"]):
            by_epoch.setdefault(m["epoch_id"], []).append(m["dataset_index"])
        for epoch, indices in by_epoch.items():
            assert indices == c.source.order(epoch)[:len(indices)], \
                f"epoch {epoch} admitted {indices}: not its order, each index once"
    finally:
        c.close()
        store.close()


@pytest.mark.parametrize("mode", ["power", "kill"])
def test_rl1_exactly_once_admission_across_a_crash_at_every_refill_step(mode):
    probe = SimFS(0)
    refill_run(probe, ManualClock(), recover=False)
    total = sum(1 for e in probe.trace if e.op in MUTATING_OPS)
    step = max(1, total // 60)  # ~60 crash points spread over every step of the refills
    crashed = 0
    for nth in range(1, total + 1, step):
        sim = SimFS(nth, record_trace=False)
        clock = ManualClock()
        sim.crash_at(nth, ops=MUTATING_OPS)
        try:
            refill_run(sim, clock, recover=False)
        except BaseException as e:  # noqa: BLE001 - only a simulated crash is expected
            if crash_in(e) is None:
                raise
            crashed += 1
        if mode == "power":
            sim.crash("clear-cache")
        else:
            sim.kill_client("main")
        check_rl1(sim, clock)  # (recover=True also opens a queue the crash left unborn)
    assert crashed > 20  # the points did land inside the refills


def test_the_module_example_runs(tmp_path, monkeypatch):
    """The runnable example in straw.rollout.controller's docstring (the README's source)."""
    import textwrap

    import straw.rollout.controller as module

    example = module.__doc__.split("is the worker side)::", 1)[1]
    monkeypatch.setattr("tempfile.mkdtemp", lambda: str(tmp_path))
    namespace: dict = {}
    exec(compile(textwrap.dedent(example.strip("\n")), "example", "exec"), namespace)
    assert [r.action for r in namespace["returned"]] == ["completed", "completed"]


def test_complete_many_measures_version_spans_against_the_serving_version(tmp_path):
    # an item may carry each sample's version span instead of its staleness: [] (no
    # response tokens: 0), [oldest, newest] (serving - oldest; unknown if newest is
    # ahead of the serving version) or None (unknown); malformed spans are refused
    store, c = open_controller(tmp_path, n=2, prompts=[(i,) for i in range(8)])
    try:
        c.set_serving_version(5)
        items = completed_items(store, c.take("w", 4).assignments, "v")
        assert len(items) == 4
        for span in ([1, "2"], [3, 2], [1, 2, 3], "ab"):
            bad = {**items[0], "versions": [span, []]}
            bad.pop("staleness")
            with pytest.raises(TypeError, match=r"items\[0\]\['versions'\]"):
                c.complete_many([bad])
        with pytest.raises(TypeError, match="give one"):
            c.complete_many([{**items[0], "versions": [[], []]}])
        spans = [[[], [2, 4]], [None, [5, 5]], [[1, 6], [0, 5]], [[3, 3], [4, 5]]]
        for item, s in zip(items, spans, strict=True):
            item.pop("staleness")
            item["versions"] = s
        outcomes = c.complete_many(items)
        assert all(not isinstance(o, BaseException) for o in outcomes)
        # staleness: 0, 3 | unknown, 0 | unknown (6 > 5), 5 | 2, 1
        assert c.staleness_metrics() == {"staleness/mean": 11 / 6, "staleness/max": 5.0,
                                         "staleness/unknown_count": 2.0}
    finally:
        c.close()
        store.close()
