"""straw.rollout.generation: take groups under leases, return them by stage (ready ->
complete with a receipt, partial/fresh -> yield with priority and key), reject filtered
groups, release groups whose captures do not cover their tokens, the staleness bound,
heartbeats, retries after lost replies, bad input, and two client processes on one pool."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from straw import IdempotencyConflict, SharedFilesystemStore, StaleAttempt
from straw.checks import INT64_MAX
from straw.clock import ManualClock
from straw.rollout import RolloutConfig, Sample, SampleGroup, StalenessBound, Status
from straw.rollout import remote as remote_mod
from straw.rollout.codec import group_from_records
from straw.rollout.controller import RolloutController
from straw.rollout.generation import GenerationClient
from straw.rollout.samples import VersionSpan

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = [(i, i + 1) for i in range(40)]


@pytest.fixture
def job(tmp_path):
    """(controller, make_client(worker, **kw), clock) on a temp-dir pool."""
    clock = ManualClock()
    made = []
    stores = []

    def controller_of(config):
        store = SharedFilesystemStore(str(tmp_path), "job", writer_id="controller")
        stores.append(store)
        return RolloutController(store, PROMPTS, config=config, clock=clock)

    state = {}

    def make(worker, config=None, **kw):
        config = config or state["config"]
        store = SharedFilesystemStore(str(tmp_path), "job")
        stores.append(store)
        c = GenerationClient(state["controller"], store, worker_id=worker, config=config,
                             clock=clock, **kw)
        made.append(c)
        return c

    def start(config=None):
        state["config"] = config or RolloutConfig(n_samples_per_prompt=2, lease_seconds=30)
        state["controller"] = controller_of(state["config"])
        return state["controller"]

    yield start, make, clock
    for c in made:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - a test may leave a client broken on purpose
            pass
    if "controller" in state:
        state["controller"].close()
    for s in stores:
        s.close()


def generated(group, n_tokens, version, *, status=Status.COMPLETED, reward=1.0, routes=None):
    """``group`` with ``n_tokens`` more response tokens generated under ``version``."""
    samples = []
    for s in group:
        base = s.tokens or tuple(s.prompt)
        tokens = base + tuple(range(100, 100 + n_tokens))
        spans = s.versions + (VersionSpan(s.response_length, s.response_length + n_tokens,
                                          version),)
        samples.append(dataclasses.replace(
            s, tokens=tokens, response_length=s.response_length + n_tokens, versions=spans,
            status=status, reward=reward if status in (Status.COMPLETED, Status.TRUNCATED)
            else None, routes=routes(len(tokens)) if routes else None))
    return dataclasses.replace(group, samples=tuple(samples))


def partial(group, n_tokens, version):
    return generated(group, n_tokens, version, status=Status.ABORTED)


def status(controller, tid):
    return controller.coordinator.task_status(tid)


def test_a_ready_group_completes_with_a_receipt_retries_return_it(job):
    start, make, _ = job
    controller = start()
    controller.set_serving_version(3)
    client = make("g0")
    (g,) = client.take(1)
    assert len(g) == 2 and classifiable(g)
    done = generated(g, 4, 1)
    (r,) = client.return_groups([done])
    assert r.action == "completed" and r.receipt is not None
    tid = r.task_id
    assert status(controller, tid)["state"] == "completed"
    # the result is the group, its record 0 naming the lease
    rec = list(client.store.read(r.receipt.result_ref))
    assert rec[0].metadata["task_id"] == tid and rec[0].metadata["attempt_id"]
    assert group_from_records(rec) == done
    # a retry (a lost reply) returns the same receipt; other content is a conflict
    assert client.return_groups([done])[0].receipt == r.receipt
    assert client.complete([done]) == [r.receipt]
    with pytest.raises(IdempotencyConflict):
        client.return_groups([generated(g, 5, 1)])
    assert len(controller.coordinator.commits) == 1
    # staleness of what was accepted: serving 3, generated under 1
    assert controller.staleness_metrics() == {"staleness/mean": 2.0, "staleness/max": 2.0,
                                              "staleness/unknown_count": 0.0}


def classifiable(group):
    return all(s.response_length == 0 and s.status is Status.PENDING for s in group)


def test_partial_and_fresh_groups_are_returned_with_priority_and_key(job):
    start, make, _ = job
    controller = start()
    client = make("g0")
    groups = client.take(3)
    p1, p2, fresh = groups
    out = client.return_groups([partial(p1, 3, 7), partial(p2, 2, "12"), fresh])
    assert [r.action for r in out] == ["returned"] * 3
    specs = {t.task_id: t for t in controller.coordinator.pending_tasks(task_prefix="prompt:")}
    assert (specs[out[0].task_id].priority, specs[out[0].task_id].scheduling_key) == (1, 7)
    assert (specs[out[1].task_id].priority, specs[out[1].task_id].scheduling_key) == (1, 12)
    assert (specs[out[2].task_id].priority, specs[out[2].task_id].scheduling_key) == \
        (0, INT64_MAX)
    meta = specs[out[0].task_id].metadata
    assert meta["stage"] == "partial" and meta["returned"] is True
    assert meta["group_index"] == p1.group_index and "dataset_index" in meta
    # partial work first, the oldest version first; it resumes from its continuation
    again = client.take(2)
    assert [g.group_index for g in again] == [p1.group_index, p2.group_index]
    assert again[0] == partial(p1, 3, 7)
    assert all(status(controller, r.task_id)["failures"] == 0 for r in out)


def test_a_filtered_group_is_rejected_without_retry_with_its_reason(job):
    start, make, _ = job
    controller = start()
    client = make("g0")
    (g,) = client.take(1)
    r = client.reject(generated(g, 2, 1), "all rewards equal")
    assert r.action == "rejected" and r.reason == "all rewards equal"
    st = status(controller, r.task_id)
    assert st["state"] == "failed"
    assert st["failure"] == {"category": "Filtered", "reason": "all rewards equal"}
    with pytest.raises(ValueError, match="reason"):
        client.reject(g, "")


def test_a_group_whose_captures_do_not_cover_its_tokens_is_released(job):
    start, make, _ = job
    controller = start()
    client = make("g0")
    (g,) = client.take(1)
    kept = partial(g, 3, 1)
    client.return_groups([kept])  # a durable continuation
    (g,) = client.take(1)
    assert g == kept
    short = generated(g, 2, 2, routes=lambda n: np.zeros((n - 2, 2, 2), np.int32))
    (r,) = client.return_groups([short])
    assert r.action == "released"
    st = status(controller, r.task_id)
    assert st["state"] == "pending" and st["failures"] == 0
    (again,) = client.take(1)
    assert again == kept  # resumed from its previous durable input
    good = generated(again, 2, 2, routes=lambda n: np.ones((n - 1, 2, 2), np.int32))
    (r,) = client.return_groups([good])
    assert r.action == "completed"
    stored = group_from_records(list(client.store.read(r.receipt.result_ref)))
    assert np.array_equal(stored.samples[0].routes, good.samples[0].routes)


@pytest.mark.parametrize("policy", ["reject", "requeue"])
def test_the_staleness_bound_applies_its_policy(job, policy):
    start, make, _ = job
    config = RolloutConfig(n_samples_per_prompt=2, lease_seconds=30,
                           staleness_bound=StalenessBound(1, policy))
    controller = start(config)
    controller.set_serving_version(5)
    client = make("g0")
    stale, fine = client.take(2)
    out = client.return_groups([generated(stale, 2, 2), generated(fine, 2, 4)])
    assert out[1].action == "completed"
    assert "staleness 3 exceeds the bound of 1" in out[0].reason
    st = status(controller, out[0].task_id)
    if policy == "reject":
        assert out[0].action == "rejected" and st["state"] == "failed"
        assert st["failure"]["category"] == "Stale"
    else:
        assert out[0].action == "requeued" and st["state"] == "pending"
        (spec,) = [t for t in controller.coordinator.pending_tasks()
                   if t.task_id == out[0].task_id]
        assert (spec.priority, spec.scheduling_key) == (0, INT64_MAX)  # fresh, after prompts
        g = group_from_records(list(client.store.read(spec.input_ref)))
        assert g.group_index == stale.group_index and classifiable(g)  # its prompt alone


def test_without_a_bound_a_return_measures_staleness_once(job, monkeypatch):
    # no staleness bound: every group is kept, so the client does not run the bound's
    # decision (it measured each sample's staleness a second time); a ready group's
    # per-sample staleness still reaches the controller, a partial one is returned
    from straw.rollout import generation as generation_module

    def no_decision(*args, **kw):
        raise AssertionError("decide() ran without a staleness bound")

    monkeypatch.setattr(generation_module, "decide", no_decision)
    start, make, _ = job
    controller = start()
    controller.set_serving_version(4)
    client = make("g0")
    ready, part = client.take(2)
    out = client.return_groups([generated(ready, 2, 1), partial(part, 2, 3)])
    assert [r.action for r in out] == ["completed", "returned"]
    assert controller.staleness_metrics() == {"staleness/mean": 3.0, "staleness/max": 3.0,
                                              "staleness/unknown_count": 0.0}


def test_bad_input_is_refused_and_nothing_is_lost(job):
    start, make, clock = job
    controller = start()
    a = make("a", heartbeat=False)
    (g,) = a.take(1)
    tid = f"prompt:{g.group_index}"
    with pytest.raises(ValueError, match="must be finite"):
        dataclasses.replace(g.samples[0], reward=math.nan)
    with pytest.raises(ValueError, match="one prompt"):
        SampleGroup((g.samples[0], dataclasses.replace(g.samples[1], prompt=[9, 9])))
    other = SampleGroup(tuple(dataclasses.replace(s, prompt=[9, 9]) for s in g))
    with pytest.raises(ValueError, match="another prompt"):
        a.return_groups([other])
    never = SampleGroup((Sample([5], group_index=999, index=0),))
    with pytest.raises(ValueError, match="no lease"):
        a.return_groups([never])
    with pytest.raises(ValueError, match="no lease"):
        a.return_groups([SampleGroup((Sample([5]),))])
    with pytest.raises(TypeError, match="SampleGroup"):
        a.return_groups(["not a group"])
    with pytest.raises(ValueError, match="second time"):
        a.return_groups([g, g])
    with pytest.raises(ValueError, match="not ready"):
        a.complete([partial(g, 1, 1)])
    assert status(controller, tid)["state"] == "leased"  # nothing happened to the task
    # a stale lease: it expired and another client has the task now
    clock.advance(31)
    b = make("b")
    (g2,) = b.take(1)
    assert g2.group_index == g.group_index
    with pytest.raises(StaleAttempt):
        a.return_groups([generated(g, 2, 1)])
    assert tid not in a.leases
    (r,) = b.return_groups([generated(g2, 2, 1)])
    assert r.action == "completed"


def test_close_releases_the_leases_without_spending_a_failure(job):
    start, make, _ = job
    controller = start()
    client = make("g0")
    groups = client.take(3)
    client.close()
    for g in groups:
        st = status(controller, f"prompt:{g.group_index}")
        assert st["state"] == "pending" and st["failures"] == 0
    with pytest.raises(RuntimeError, match="closed"):
        client.take(1)


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def test_the_heartbeat_renews_leases_on_the_injected_clock(job):
    start, make, clock = job
    controller = start()
    client = make("g0")  # heartbeat every 10 s of the manual clock
    (g,) = client.take(1)
    tid = f"prompt:{g.group_index}"
    first = status(controller, tid)["deadline"]
    for _ in range(4):  # 40 s: past the 30 s lease, renewed all along
        before = client.renewals
        clock.advance(10)
        wait_for(lambda b=before: client.renewals > b)
    assert status(controller, tid)["deadline"] == pytest.approx(first + 40)
    other = make("g1", heartbeat=False)
    assert all(x.group_index != g.group_index for x in other.take(8))
    assert client.return_groups([generated(g, 1, 1)])[0].action == "completed"


def test_a_client_whose_heartbeat_stops_loses_its_leases_and_another_resumes(job):
    """RL5: partial work is resumed from its durable input, not restarted."""
    start, make, clock = job
    start()
    a = make("a", heartbeat=False)
    (g,) = a.take(1)
    cont = partial(g, 5, 1)
    a.return_groups([cont])
    (g,) = a.take(1)
    a.save_progress([partial(g, 8, 2)])  # further progress, durable, lease kept
    clock.advance(31)  # a's heartbeat stopped: its lease expires
    b = make("b")
    (resumed,) = b.take(1)
    outcomes = []
    real = a.controller.heartbeat
    a.controller.heartbeat = lambda leases: outcomes.extend(real(leases)) or outcomes
    assert a.heartbeat_now() == 0 and a.leases == {}  # StaleAttempt: dropped locally
    a.controller.heartbeat = real
    assert outcomes == ["StaleAttempt"]
    assert resumed.group_index == g.group_index
    assert resumed == partial(g, 8, 2)  # its durable input, not its prompt
    assert resumed.samples[0].response_length == 13
    with pytest.raises(StaleAttempt):  # a's late return reaches the queue, which refuses it
        a.return_groups([partial(g, 9, 2)])
    assert b.return_groups([generated(resumed, 1, 3)])[0].action == "completed"


def test_every_return_is_safe_to_retry_after_a_lost_reply(job):
    """RL2: a completion retried after a lost reply is accepted once (one commit)."""
    start, make, _ = job
    controller = start()
    client = make("g0")
    groups = client.take(3)
    real_yield, real_complete = controller.yield_groups, controller.complete_many
    lost = {"yield": 0, "complete": 0}

    def yield_lost(updates, *, request_id):
        out = real_yield(updates, request_id=request_id)
        if not lost["yield"]:
            lost["yield"] += 1
            raise ConnectionError("injected: the reply was lost")
        return out

    def complete_lost(items):
        out = real_complete(items)
        if not lost["complete"]:
            lost["complete"] += 1
            raise ConnectionError("injected: the reply was lost")
        return out

    controller.yield_groups, controller.complete_many = yield_lost, complete_lost
    returned = [partial(groups[0], 2, 1), generated(groups[1], 2, 1), groups[2]]
    with pytest.raises(ConnectionError):
        client.return_groups(returned)
    with pytest.raises(ConnectionError):  # the completion went through; its reply lost
        client.return_groups(returned)
    out = client.return_groups(returned)
    assert [r.action for r in out] == ["returned", "completed", "returned"]
    assert len(controller.coordinator.commits) == 1
    assert client.return_groups(returned)[1].receipt == out[1].receipt
    pending = [t.task_id for t in controller.coordinator.pending_tasks(task_prefix="prompt:")]
    assert pending.count(out[0].task_id) == 1 and pending.count(out[2].task_id) == 1


def test_a_take_whose_reply_was_lost_is_retried_with_the_same_leases(job):
    start, make, _ = job
    controller = start()
    client = make("g0")
    real = controller.take
    calls = []

    def lost_once(worker_id, count, *, request_id=None):
        calls.append(request_id)
        out = real(worker_id, count, request_id=request_id)
        if len(calls) == 1:
            raise ConnectionError("injected: the reply was lost")
        return out

    controller.take = lost_once
    with pytest.raises(ConnectionError):
        client.take(2)
    groups = client.take(2)
    assert calls[0] == calls[1] is not None  # the same request, answered again
    leased = [t for t, v in controller.coordinator.tasks.items() if v["state"] == "leased"]
    assert sorted(leased) == sorted(f"prompt:{g.group_index}" for g in groups)
    more = client.take(2)  # a new take is a new request: new leases
    assert calls[2] != calls[1] and not {g.group_index for g in more} & {
        g.group_index for g in groups}


WORKER = r"""
import json, sys, dataclasses
from straw import SharedFilesystemStore
from straw.rollout import RolloutConfig, Status
from straw.rollout.generation import GenerationClient
from straw.rollout.remote import RemoteController
root, url, token, worker, rounds = sys.argv[1:6]
store = SharedFilesystemStore(root, "job")
client = GenerationClient(RemoteController(url, token=token), store, worker_id=worker,
                          config=RolloutConfig(n_samples_per_prompt=2, lease_seconds=30))
done = []
for _ in range(int(rounds)):
    groups = client.take(4)
    ready = [dataclasses.replace(g, samples=tuple(dataclasses.replace(
        s, tokens=tuple(s.prompt) + (7, 8), response_length=2, status=Status.COMPLETED,
        reward=1.0) for s in g.samples)) for g in groups]
    done += [[r.task_id, r.receipt.position] for r in client.return_groups(ready)]
client.close()
store.close()
print(json.dumps(done))
"""


def test_two_generation_processes_share_one_pool(tmp_path):
    store = SharedFilesystemStore(str(tmp_path), "job", writer_id="controller")
    controller = RolloutController(store, PROMPTS,
                                   config=RolloutConfig(n_samples_per_prompt=2))
    server = remote_mod.start(controller, ("127.0.0.1", 0), token="t0ken")
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), server.url,
                                   "t0ken", f"gen-{i}", "5"], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            outs.append(json.loads(out))
        assert all(len(o) == 20 for o in outs)
        tasks = [t for o in outs for t, _ in o]
        positions = [pos for o in outs for _, pos in o]
        assert len(set(tasks)) == 40 and sorted(positions) == list(range(40))
        assert len(controller.coordinator.commits) == 40
        states = {t["state"] for t in controller.coordinator.tasks.values()}
        assert states == {"completed"} or states == {"completed", "pending"}
    finally:
        server.close()
        controller.close()
        store.close()


def test_a_remote_controller_carries_leases_receipts_and_errors(tmp_path):
    clock = ManualClock()
    store = SharedFilesystemStore(str(tmp_path), "job", writer_id="controller")
    config = RolloutConfig(n_samples_per_prompt=2, lease_seconds=30)
    controller = RolloutController(store, PROMPTS, config=config, clock=clock)
    controller.set_serving_version("7")
    server = remote_mod.start(controller, ("127.0.0.1", 0), token="t0ken")
    stores = [SharedFilesystemStore(str(tmp_path), "job") for _ in range(2)]
    try:
        remote = remote_mod.RemoteController(server.url, token="t0ken")
        assert remote.serving_version == "7"
        a = GenerationClient(remote, stores[0], worker_id="a", config=config,
                             heartbeat=False)
        g1, g2 = a.take(2)
        clock.advance(31)  # g1's and g2's leases expire; b takes them over
        b = GenerationClient(remote, stores[1], worker_id="b", config=config)
        taken = {g.group_index for g in b.take(2)}
        assert taken == {g1.group_index, g2.group_index}
        with pytest.raises(StaleAttempt):  # a per-item error of complete_many, over RPC
            a.return_groups([generated(g1, 2, 7)])
        with pytest.raises(StaleAttempt):  # a whole-call error (yield_tasks), over RPC
            a.return_groups([partial(g2, 2, 7)])
        with pytest.raises(ValueError, match="count"):
            remote.take("a", 0)  # the controller's ValueError, raised again here
        (r,) = b.return_groups([generated(g1, 2, 7)])
        assert r.action == "completed" and r.receipt.task_id == f"prompt:{g1.group_index}"
        assert controller.staleness_metrics()["staleness/max"] == 0.0
        b.close()
        assert status(controller, f"prompt:{g2.group_index}")["state"] == "pending"
    finally:
        server.close()
        controller.close()
        for s in (store, *stores):
            s.close()


def test_without_a_bound_the_controller_measures_staleness_at_acceptance(job, monkeypatch):
    # no bound: the client sends each sample's version span and does not ask the serving
    # version (a round trip per return on Ray); the controller measures the span against
    # the version it serves when it accepts the group
    from straw.rollout.controller import RolloutController

    start, make, _ = job
    controller = start()
    controller.set_serving_version(6)
    client = make("g0")
    (g,) = client.take(1)
    asked = []
    monkeypatch.setattr(RolloutController, "serving_version",
                        property(lambda self: asked.append(1) or self._serving))
    out = client.return_groups([generated(g, 2, 4)])
    assert [r.action for r in out] == ["completed"] and asked == []
    assert controller.staleness_metrics() == {"staleness/mean": 2.0, "staleness/max": 2.0,
                                              "staleness/unknown_count": 0.0}


def leased(controller):
    return sorted(t for t, v in controller.coordinator.tasks.items() if v["state"] == "leased")


def test_a_return_takes_the_next_groups_in_the_same_call(job):
    """return_and_take: ready groups completed and the next ones leased in one controller
    call (complete_and_take); a lost reply is retried with the same receipts and the same
    leases; without a ready group the take is a call of its own."""
    start, make, _ = job
    controller = start()
    client = make("g0")
    first = client.take(2)
    real = controller.complete_and_take
    calls = []

    def lost_once(items, worker_id, count, *, request_id):
        calls.append(request_id)
        out = real(items, worker_id, count, request_id=request_id)
        if len(calls) == 1:
            raise ConnectionError("injected: the reply was lost")
        return out

    controller.complete_and_take = lost_once
    done = [generated(g, 2, 0) for g in first]
    with pytest.raises(ConnectionError):
        client.return_and_take(done, 3)
    returned, nxt = client.return_and_take(done, 3)
    assert calls[0] == calls[1]  # the same take request, answered again
    assert [r.action for r in returned] == ["completed", "completed"]
    assert len(controller.coordinator.commits) == 2 and len(nxt) == 3
    # exactly the three answered are leased: none leaked by the lost reply
    assert leased(controller) == sorted(f"prompt:{g.group_index}" for g in nxt)
    assert sorted(client.leases) == leased(controller)
    # partial groups only: nothing to ride on, the take is its own call
    returned, more = client.return_and_take([partial(nxt[0], 1, 0)], 1)
    assert [r.action for r in returned] == ["returned"] and len(more) == 1
    assert len(calls) == 2
    with pytest.raises(ValueError, match="count must be an int >= 1"):
        client.return_and_take([], -1)


def test_a_return_refused_gives_the_groups_it_took_back(job):
    """A stale lease in a return_and_take: the others are returned, the groups the call
    leased are released unspent (nothing held that the caller never got), and the
    error is raised."""
    start, make, clock = job
    controller = start()
    a = make("a", heartbeat=False)
    (g1,) = a.take(1)
    (g2,) = a.take(1)
    clock.advance(31)  # both leases expire
    b = make("b", heartbeat=False)
    b.take(2)  # b holds both tasks now
    (g3,) = a.take(1)
    with pytest.raises(StaleAttempt):
        a.return_and_take([generated(g1, 2, 0), generated(g3, 2, 0)], 2)
    assert status(controller, f"prompt:{g3.group_index}")["state"] == "completed"
    # the two groups the call leased for a are pending again; every lease is b's
    assert sorted(a.leases) == [f"prompt:{g2.group_index}"]  # expired: a never learnt it
    assert leased(controller) == sorted(b.leases)
    assert len(controller.coordinator.pending_tasks(task_prefix="prompt:")) >= 2


def test_complete_and_take_over_rpc_and_its_checks(tmp_path):
    """The controller's complete_and_take: the same call over straw.rpc (per-item errors
    included), its arguments checked before anything changes."""
    store = SharedFilesystemStore(str(tmp_path), "job", writer_id="controller")
    config = RolloutConfig(n_samples_per_prompt=2, lease_seconds=30)
    controller = RolloutController(store, PROMPTS, config=config)
    server = remote_mod.start(controller, ("127.0.0.1", 0), token="t0ken")
    gen_store = SharedFilesystemStore(str(tmp_path), "job")
    try:
        remote = remote_mod.RemoteController(server.url, token="t0ken")
        client = GenerationClient(remote, gen_store, worker_id="a", config=config,
                                  heartbeat=False)
        groups = client.take(2)
        returned, nxt = client.return_and_take([generated(g, 2, 0) for g in groups], 2)
        assert [r.action for r in returned] == ["completed"] * 2 and len(nxt) == 2
        before = len(controller.coordinator.commits)
        for bad, match in [({"count": 0}, "count"), ({"request_id": ""}, "request_id"),
                           ({"worker_id": ""}, "worker_id")]:
            kwargs = {"worker_id": "a", "count": 1, "request_id": "r1", **bad}
            with pytest.raises(ValueError, match=match):
                remote.complete_and_take([], kwargs["worker_id"], kwargs["count"],
                                         request_id=kwargs["request_id"])
        assert len(controller.coordinator.commits) == before
        assert sorted(client.leases) == leased(controller)
        # a stale lease in the batch is its item's error, carried over RPC
        lease = client.leases[f"prompt:{nxt[0].group_index}"]
        stale = dataclasses.replace(lease, attempt_id="0" * 32)
        outcomes, got = remote.complete_and_take(
            [{"lease": stale, "result_ref": returned[0].receipt.result_ref,
              "staleness": []}], "a", 1, request_id="r2")
        assert isinstance(outcomes[0], StaleAttempt) and got.status == "acquired"
        client.close()
    finally:
        server.close()
        controller.close()
        gen_store.close()
        store.close()
