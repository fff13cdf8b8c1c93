"""The distributed rollout on a local multi-node Ray cluster (issue 17, item 6).

One cluster per module (``ray.cluster_utils.Cluster``): the head (the driver, the
controller actor) and two worker nodes, each with a custom resource naming it; the
controller and node ``n1`` use JuiceFS client A, node ``n2`` (and the node added then
removed) client B: two real clients of one volume, as two machines would.

Checked from the queue and the builder: nothing acknowledged lost (every accepted group
is in a batch or in the builder's backlog), nothing trained twice (no group in two
batches), a killed worker's leased tasks completed by another worker, and across a pause
the weight version of each token range.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import pickle
import re
import time

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from straw import SharedFilesystemStore  # noqa: E402
from straw.rollout import RolloutConfig, SampleGroup, Status  # noqa: E402
from straw.rollout.codec import group_from_records  # noqa: E402
from straw.rollout.generate import extend_sample  # noqa: E402
from straw.rollout.generation import GenerationClient  # noqa: E402
from straw.rollout.ray import (  # noqa: E402
    ControllerLost,
    NodeSpec,
    RayController,
    RayRollout,
    StorageProbeFailed,
    default_nodes,
    share_concurrency,
)
from straw.rollout.ray.job import _await_death  # noqa: E402

pytestmark = pytest.mark.juicefs

ROOT = pathlib.Path(__file__).resolve().parents[3]
LEASE = 3.0  # seconds: a killed worker's tasks return this soon
N = 2  # samples per prompt


@dataclasses.dataclass(frozen=True)
class SlowCounter:
    """A deterministic generate function: ``length`` tokens per sample, one per ``delay``
    seconds, each a function of (group, sample, position); abortable between tokens."""

    length: int = 6
    delay: float = 0.02

    async def __call__(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup:
        samples = list(group.samples)
        while not abort.is_set() and any(s.response_length < self.length for s in samples):
            await asyncio.sleep(self.delay)
            samples = [s if s.response_length >= self.length else extend_sample(
                s, [token(s)], weight_version=weight_version) for s in samples]
        samples = [dataclasses.replace(s, status=Status.COMPLETED, reward=reward(s))
                   if s.response_length >= self.length else
                   dataclasses.replace(s, status=Status.ABORTED) for s in samples]
        return dataclasses.replace(group, samples=tuple(samples))


def token(s) -> int:
    return (s.group_index * 31 + (s.index or 0) * 7 + s.response_length) % 50_000


def reward(s) -> float:
    return float((s.group_index + (s.index or 0)) % 2)


@pytest.fixture(scope="module")
def cluster():
    # the raylets (and so every actor) import this tree: straw and these tests
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"head": 1}, "include_dashboard": False})
    for name in ("n1", "n2"):
        c.add_node(num_cpus=1, resources={name: 1})
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def node_of(resource: str) -> str:
    for n in ray.nodes():
        if n["Alive"] and resource in n["Resources"]:
            return n["NodeID"]
    raise AssertionError(f"no alive node with resource {resource!r}")


def config(**kw) -> RolloutConfig:
    return RolloutConfig(n_samples_per_prompt=N, lease_seconds=LEASE, segment_mib=1, **kw)


def wait_for(cond, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def batches(job: RayRollout, store: SharedFilesystemStore, count: int, start: int = 0,
            timeout: float = 90.0) -> list[list[tuple[int, int]]]:
    """``count`` batches (finished after 'training': each but the last by the next
    ``next_batch`` call, ``finish=``): their (group, sample) indices."""
    out = []
    deadline = time.monotonic() + timeout
    rid = start
    trained: str | None = None
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {len(out)} of {count} batches built"
        refs = job.next_batch(rid, timeout=1.0, finish=trained)
        trained = None  # finished by that call, whatever it answered
        if refs is None:
            continue
        for r in refs:
            assert len(pickle.dumps(r)) < 1024  # only a reference crosses Ray
        seen = []
        for rank, r in enumerate(refs):
            shard = r.load(store, rank=rank)
            seen += [(s["group_index"], s["index"]) for s in shard.samples]
        out.append(seen)
        trained = refs[0].batch_id
        rid += 1
    job.finish_batch(trained)
    return out


def check_exactly_once(job: RayRollout, built: list[list[tuple[int, int]]]) -> None:
    """Nothing trained twice; nothing acknowledged lost (queue and builder agree)."""
    groups = [g for b in built for g, _ in b]
    pairs = [p for b in built for p in b]
    assert len(pairs) == len(set(pairs)), "a sample was trained twice"
    assert all(groups.count(g) == N for g in set(groups)), "a group was split or repeated"
    accepted = job.accepted()
    ids = [r.task_id for r in accepted]
    assert len(ids) == len(set(ids)), "a task was accepted twice"
    trained = {f"prompt:{g}" for g in groups}
    assert trained <= set(ids)
    # every accepted group not trained is in the builder's backlog, waiting
    assert len(set(ids) - trained) == sum(job.backlog().values())
    states = job.tasks()
    assert all(states[t]["state"] == "completed" for t in ids)


def test_share_concurrency():
    assert share_concurrency(10, 2, 2) == [3, 2]
    assert share_concurrency(8, 1, 3) == [3, 3, 2]
    with pytest.raises(ValueError, match="raise concurrency to at least 6"):
        share_concurrency(4, 2, 3)


@pytest.mark.parametrize("prefetch", [-1, 1.5, True, "2"])
def test_a_bad_prefetch_is_refused_before_anything_starts(prefetch):
    with pytest.raises(ValueError, match="prefetch must be None or an int >= 0"):
        RayRollout("/nonexistent", "job", [(1,)], None, concurrency=2,  # type: ignore[arg-type]
                   prefetch=prefetch)


def test_default_nodes_are_every_alive_node_with_a_cpu(cluster):
    nodes = default_nodes()
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert sorted(n.node_id for n in nodes) == sorted(n["NodeID"] for n in alive)
    assert len(nodes) >= 3 and all(n.root is None and n.num_cpus == 1 for n in nodes)
    keys = [(next(a["NodeManagerAddress"] for a in alive if a["NodeID"] == n.node_id),
             n.node_id) for n in nodes]
    assert keys == sorted(keys)


def test_storage_probe_names_the_node_that_sees_another_pool(cluster, juicefs_dirs, tmp_path):
    other = str(tmp_path / "not-the-pool")
    nodes = [NodeSpec(node_of("n1"), root=juicefs_dirs.a, resources={"n1": 0.01}),
             NodeSpec(node_of("n2"), root=other, resources={"n2": 0.01})]
    with pytest.raises(StorageProbeFailed) as exc:
        RayRollout(juicefs_dirs.a, "probe", list(range(8)), SlowCounter(), concurrency=4,
                   config=config(), nodes=nodes)
    message = str(exc.value)
    assert node_of("n2") in message and other in message, message
    assert node_of("n1") not in message


def test_killed_generation_actor_its_leases_expire_its_work_returns(cluster, juicefs_dirs):
    root_a, root_b = juicefs_dirs.a, juicefs_dirs.b
    nodes = [NodeSpec(node_of("n1"), root=root_a, resources={"n1": 0.01}),
             NodeSpec(node_of("n2"), root=root_b, resources={"n2": 0.01})]
    store = SharedFilesystemStore(root_a, "kill")
    with RayRollout(root_a, "kill", list(range(64)), SlowCounter(length=8, delay=0.05),
                    concurrency=8, config=config(), nodes=nodes, batch_groups=4,
                    retire_lost=False) as job:  # the lease expiry path
        victim = job.workers[1]
        wait_for(lambda: len(job.held().get(victim.worker_id, [])) >= 2, what="leases")
        held = job.held()[victim.worker_id]
        job.kill_worker(victim.worker_id)
        built = batches(job, store, 6)
        # the victim's tasks came back after its leases expired, and another worker
        # completed them
        wait_for(lambda: all(job.tasks()[t]["state"] == "completed" for t in held),
                 timeout=60, what="the killed worker's tasks to complete elsewhere")
        states = job.tasks()
        for t in held:
            assert states[t]["lease"]["worker_id"] != victim.worker_id
        assert [w.worker_id for w in job.check_workers()] == [victim.worker_id]
        job.pause()
        check_exactly_once(job, built)
    store.close()


def test_killed_node_its_worker_retired_at_once(cluster, juicefs_dirs):
    extra = cluster.add_node(num_cpus=1, resources={"n3": 1})
    cluster.wait_for_nodes()
    nodes = [NodeSpec(node_of("n1"), root=juicefs_dirs.a, resources={"n1": 0.01}),
             NodeSpec(node_of("n3"), root=juicefs_dirs.b, resources={"n3": 0.01})]
    store = SharedFilesystemStore(juicefs_dirs.a, "node")
    long_lease = RolloutConfig(n_samples_per_prompt=N, lease_seconds=120, segment_mib=1)
    with RayRollout(juicefs_dirs.a, "node", list(range(64)), SlowCounter(length=8, delay=0.05),
                    concurrency=8, config=long_lease, nodes=nodes, batch_groups=4) as job:
        victim = job.workers[1]
        wait_for(lambda: len(job.held().get(victim.worker_id, [])) >= 2, what="leases")
        held = job.held()[victim.worker_id]
        cluster.remove_node(extra)
        # the driver notices the death: the worker is retired, its tasks return now (their
        # 120 s leases are far from expiring)
        wait_for(lambda: victim in job.check_workers(), what="the lost worker")
        states = job.tasks()
        assert all(states[t]["state"] != "leased" or states[t]["lease"]["worker_id"] !=
                   victim.worker_id for t in held)
        built = batches(job, store, 6)
        wait_for(lambda: all(job.tasks()[t]["state"] == "completed" for t in held),
                 timeout=60, what="the lost node's tasks to complete elsewhere")
        job.pause()
        check_exactly_once(job, built)
    store.close()


def test_pause_persists_in_flight_groups_and_resume_continues_them_under_the_new_version(
        cluster, juicefs_dirs):
    nodes = [NodeSpec(node_of("n1"), root=juicefs_dirs.a, resources={"n1": 0.01}),
             NodeSpec(node_of("n2"), root=juicefs_dirs.b, resources={"n2": 0.01})]
    store = SharedFilesystemStore(juicefs_dirs.a, "pause")
    gen = SlowCounter(length=10, delay=0.1)
    with RayRollout(juicefs_dirs.a, "pause", list(range(32)), gen, concurrency=8,
                    config=config(), nodes=nodes, batch_groups=4) as job:
        wait_for(lambda: sum(len(v) for v in job.held().values()) >= 4, what="leases")
        time.sleep(0.4)  # a few tokens into each group
        paused = job.pause()
        assert sum(p["counts"].get("returned", 0) for p in paused.values()) >= 1, paused
        # durable when pause returns: nothing leased, the aborted groups are continuations
        states = job.tasks()
        assert not [t for t, s in states.items() if s["state"] == "leased"]
        partial = [t for t, s in states.items()
                   if s["state"] == "pending" and s["spec"]["metadata"].get("stage") == "partial"]
        assert partial
        with store.read_session() as reader:
            for t in partial:
                g = group_from_records(list(reader.read(
                    _ref(states[t]["spec"]["input_ref"]))))
                assert all(s.weight_versions in ((), (0,)) for s in g)
                assert any(s.response_length for s in g)
        time.sleep(0.3)
        assert job.held() == {w.worker_id: [] for w in job.workers}  # admission stays shut
        job.resume(1)  # after the "weight update"
        wait_for(lambda: all(job.tasks()[t]["state"] == "completed" for t in partial),
                 what="the continued groups to complete")
        results = {r.task_id: r for r in job.accepted()}
        with store.read_session() as reader:
            for t in partial:
                g = group_from_records(list(reader.read(results[t].result_ref)))
                for s in g:  # both versions, each on its own token range
                    assert s.weight_versions == (0, 1), s.versions
                    assert s.versions[-1].stop == gen.length
        built = batches(job, store, 3)
        job.pause()
        check_exactly_once(job, built)
    store.close()


def _ref(value):
    from straw.refs import RecordSetRef
    return value if isinstance(value, RecordSetRef) else RecordSetRef.from_dict(value)


def test_only_small_references_cross_ray_and_a_dead_controller_fails_the_job(
        cluster, juicefs_dirs):
    nodes = [NodeSpec(node_of("n1"), root=juicefs_dirs.a, resources={"n1": 0.01})]
    store = SharedFilesystemStore(juicefs_dirs.a, "refs")
    job = RayRollout(juicefs_dirs.a, "refs", list(range(16)), SlowCounter(), concurrency=2,
                     config=config(), nodes=nodes, batch_groups=2)
    try:
        job.pause()  # the driver takes a group itself, through the controller actor
        client = GenerationClient(RayController(job.controller, job.name), store,
                                  worker_id="driver-probe", config=config())
        got = job.controller.take.remote("driver-probe", 1, request_id="r1")
        for a in ray.get(got).assignments:
            assert len(pickle.dumps(a)) < 1024
        (group,) = client.take(1)
        done = asyncio.run(SlowCounter()(group, weight_version=0, abort=asyncio.Event()))
        (returned,) = client.return_groups([done])
        assert returned.action == "completed"
        assert len(pickle.dumps(returned.receipt)) < 1024
        for r in job.accepted():
            assert len(pickle.dumps(r)) < 1024
        client.close()
        ray.kill(job.controller, no_restart=True)
        _await_death(job.controller)  # ray.kill returns before the actor is gone
        with pytest.raises(ControllerLost, match=re.escape(job.name)):
            job.pause()
    finally:
        job.close(force=True)
        store.close()
