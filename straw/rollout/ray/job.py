"""``RayRollout``: a distributed fully async rollout job on a Ray cluster, driven from the
driver (issue 17, items 1-3).

::

    job = RayRollout(root, "job", prompts, generate, concurrency=16,
                     config=RolloutConfig(n_samples_per_prompt=2), batch_groups=64)
    refs = job.next_batch(0, timeout=60)  # RankBatchRef per rank (None: not full in time)
    job.pause()                       # before the weight update: in-flight work durable
    ...update weights...
    job.resume(1)                     # generation goes on under version 1
    job.finish_batch(refs[0].batch_id)  # or: job.next_batch(1, finish=refs[0].batch_id)
    job.close()

Placement (``ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy``, hard):

* the **controller actor** (``ControllerWorker``: the ``RolloutController`` with its
  coordinator and data source, and the ``BatchBuilder``) on the driver's node,
  ``max_restarts=0``, ``num_cpus=0``, threaded (``CONTROLLER_CONCURRENCY`` calls at once).
  Its death fails the job: every later call raises ``ControllerLost`` naming the actor
  (there is no failover; a new job with ``recover=True`` resumes the queue).
* one **generation actor** (``GenerationWorker``) per node of ``nodes`` (default: every
  alive node with a CPU, ordered by address and id), with ``num_cpus``/``num_gpus``/
  ``resources`` as the ``NodeSpec`` says, ``max_restarts=0``, ``max_task_retries=0``.
  The job's ``concurrency`` (samples generated at once, as an engine's concurrency is
  given) is shared among them: ``concurrency // n_samples_per_prompt`` group slots,
  divided by quotient and remainder (the first nodes get one more).

Start-up **storage probe**: the controller publishes a random marker through its pool
client; each node reads it back through its own (``NodeSpec.root``: that node's mount of
the pool) and publishes its own marker, which the controller reads back.  A node that does
not see the same pool fails the start with ``StorageProbeFailed`` naming the node and the
path it used; every actor started is stopped.

**Admission pause** (``pause``/``resume``): see ``straw.rollout.producer``; ``pause``
returns once every node's in-flight groups are durable in the queue; ``resume(v)`` sets
the controller's serving version, then reopens every node's admission under ``v``.

A generation actor that dies (killed, its node lost) returns its work either way: its
leases expire after ``config.lease_seconds`` and its tasks return to the queue
(continuations included) for the other nodes.  When the driver notices the death first
(the next ``pause``, ``stats``, ``held``, ``check_workers`` or ``kill_worker``; the worker
is listed in ``lost``) and ``retire_lost`` is on (the default), the controller retires the
worker at once (``Coordinator.retire_worker``: its leases revoked, one unit of each task's
failure budget spent, ``WorkerLost``), so its tasks need not wait for the lease.
``add_worker(node)`` starts a replacement (a new worker id).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..config import RolloutConfig
from ..generate import GenerateFn
from ..producer import check_prefetch
from ..shards import RankBatchRef
from .actors import ControllerWorker, GenerationWorker, StorageProbeFailed, controller_lost

CONTROLLER_CONCURRENCY = 32
GENERATION_CONCURRENCY = 8  # async actor: producer control calls (the slots are tasks)
PROBE_TIMEOUT = 60.0


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """Where one generation actor runs: ``node_id`` (a Ray node id; hard affinity), the
    pool ``root`` as that node mounts it (None: the job's root), and its resources."""

    node_id: str
    root: str | None = None
    num_cpus: float = 1
    num_gpus: float = 0
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)


def share_concurrency(concurrency: int, n_samples_per_prompt: int, nodes: int) -> list[int]:
    """Group slots per node: ``concurrency // n_samples_per_prompt`` slots divided by
    quotient and remainder (the first nodes get one more)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1 (samples generated at once), got "
                         f"{concurrency!r}")
    if nodes < 1:
        raise ValueError("a distributed rollout needs at least one generation node")
    slots = concurrency // n_samples_per_prompt
    if slots < nodes:
        raise ValueError(f"concurrency {concurrency} gives {slots} prompt groups of "
                         f"{n_samples_per_prompt} samples, fewer than the {nodes} generation "
                         f"nodes: raise concurrency to at least {nodes * n_samples_per_prompt}")
    q, r = divmod(slots, nodes)
    return [q + (1 if i < r else 0) for i in range(nodes)]


def default_nodes() -> list[NodeSpec]:
    """Every alive node with a CPU, ordered by (address, node id)."""
    alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0)
             >= 1]
    alive.sort(key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]))
    return [NodeSpec(n["NodeID"]) for n in alive]


@dataclasses.dataclass
class Worker:
    """A generation actor as the driver tracks it."""

    worker_id: str
    node: NodeSpec
    slots: int
    handle: Any
    lost: str = ""  # why it is gone ("" while alive)


class RayRollout:
    """A distributed rollout job (module docstring).  ``dataset``: the prompts, a
    ``DataSource``, or a callable returning either (run on the controller's node).
    ``batch_groups``/``dp_size``: the ``BatchBuilder``'s batch size and ranks (no builder
    when None).  ``controller_options`` go to ``RolloutController`` (``queue_id``,
    ``recover``, ``seed``, ``shuffle``, ...), ``builder_options`` to the ``BatchBuilder``
    (hooks).  ``checkpoint``: a ``Resolution`` (``resolve_checkpoint``): the controller
    starts the job with ``restore.open_job`` (a new run, a salvage, an exact restore) and
    ``save_checkpoint`` saves jointly there (``ControllerWorker``).  ``store_options`` go
    to every actor's pool client (``SharedFilesystemStore``: e.g. ``reserve_bytes``).
    ``max_ahead_groups`` (with ``batch_groups``; at least that many) bounds how far
    generation runs ahead of training: while that many accepted groups wait for a
    batch, no node leases more (``ControllerWorker``); None (the default) bounds
    nothing.  ``prefetch``: groups each node leases ahead of its slots (``Producer``;
    None: what its slots finish during one return's round trip, measured; an int fixes
    it, 0: none)."""

    def __init__(self, root: str, run_id: str, dataset: Any, generate: GenerateFn, *,
                 concurrency: int, config: RolloutConfig | None = None,
                 nodes: Sequence[NodeSpec] | None = None, batch_groups: int | None = None,
                 dp_size: int = 1, controller_options: Mapping[str, Any] | None = None,
                 weight_version: int = 0, name: str | None = None,
                 probe_timeout: float = PROBE_TIMEOUT, retire_lost: bool = True,
                 checkpoint: Any = None,
                 builder_options: Mapping[str, Any] | None = None,
                 store_options: Mapping[str, Any] | None = None,
                 max_ahead_groups: int | None = None,
                 prefetch: int | None = None) -> None:
        self.prefetch = check_prefetch(prefetch)
        if not ray.is_initialized():
            raise RuntimeError("RayRollout needs a Ray cluster: call ray.init() (or "
                               "ray.init(address=...)) first")
        self.config = RolloutConfig() if config is None else config
        if not isinstance(self.config, RolloutConfig):
            raise TypeError(f"config must be a RolloutConfig, got {type(config).__name__}")
        self.root, self.run_id, self.generate = root, run_id, generate
        self.weight_version = weight_version
        self.nodes = list(nodes) if nodes is not None else default_nodes()
        for i, n in enumerate(self.nodes):
            if not isinstance(n, NodeSpec):
                raise TypeError(f"nodes[{i}] must be a NodeSpec, got {type(n).__name__}")
        self.slots = share_concurrency(concurrency, self.config.n_samples_per_prompt,
                                       len(self.nodes))
        self.store_options = dict(store_options or {})
        self.probe_timeout = probe_timeout
        self.retire_lost = retire_lost
        self.name = name or f"straw-rollout-controller:{run_id}:{uuid.uuid4().hex[:8]}"
        self.driver_node = str(ray.get_runtime_context().get_node_id())
        self.workers: list[Worker] = []
        self._incarnation = 0
        self._tag = uuid.uuid4().hex[:6]  # worker ids of this job instance: its own writers
        self.controller: Any = ray.remote(ControllerWorker).options(  # type: ignore[attr-defined]
            name=self.name, num_cpus=0, max_restarts=0, max_task_retries=0,
            max_concurrency=CONTROLLER_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.driver_node, soft=False),
        ).remote(root, run_id, dataset, config=self.config, batch_groups=batch_groups,
                 dp_size=dp_size, controller_options=controller_options,
                 checkpoint=checkpoint, builder_options=builder_options,
                 store_options=self.store_options, max_ahead_groups=max_ahead_groups)
        try:
            self._call("where")  # the controller opened its queue (or raised why not)
            for node, slots in zip(self.nodes, self.slots, strict=True):
                self.workers.append(self._spawn(node, slots))
            self._probe()
            ray.get([w.handle.start.remote() for w in self.workers])
        except BaseException:
            self.close(force=True)
            raise

    # --- the controller ---------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return ray.get(getattr(self.controller, method).remote(*args, **kwargs))
        except ray.exceptions.RayActorError as e:
            raise controller_lost(self.name, e) from e

    def next_batch(self, rollout_id: int | str, *, timeout: float = 0.0,
                   finish: str | None = None) -> list[RankBatchRef] | None:
        """The builder's next batch (``BatchBuilder.next_batch``): a ``RankBatchRef`` per
        rank, or None while too few groups are accepted.  ``timeout``: wait up to that
        many seconds for the batch to fill, in the controller (one call, woken as
        groups are accepted: no polling loop of calls).  ``finish``: the batch id
        trained last, acknowledged first in the same call (``finish_batch``, durable
        before this batch is built; one round trip per batch instead of two: in
        ``bench.pipeline_bench`` a separate ``finish_batch`` took the driver 10-15 ms per
        batch of 64 groups, the same finish inside ``next_batch`` 5-10 ms)."""
        return self._call("next_batch", rollout_id, timeout,  # type: ignore[no-any-return]
                          finish)

    def finish_batch(self, batch_id: str) -> None:
        """After training on the batch: acknowledges its inputs (RL4)."""
        self._call("finish_batch", batch_id)

    def backlog(self) -> dict[str, int]:
        return self._call("backlog")  # type: ignore[no-any-return]

    def tasks(self) -> dict[str, dict[str, Any]]:
        """Every prompt task's status (``Coordinator.task_status``), by task id."""
        return self._call("tasks")  # type: ignore[no-any-return]

    def accepted(self, cursor: int = 0, limit: int = 1000) -> list[Any]:
        """Receipts (``CommitReceipt``) of accepted prompt groups from commit ``cursor``."""
        return self._call("accepted", cursor, limit)  # type: ignore[no-any-return]

    def staleness_metrics(self) -> dict[str, float]:
        return self._call("staleness_metrics")  # type: ignore[no-any-return]

    def producer_state(self, producer_id: str) -> Any:
        """The queue's state of ``producer_id``."""
        return self._call("producer_state", producer_id)

    def record_state(self, request_id: str, producer_id: str, state: Mapping[str, Any]
                     ) -> None:
        """Save ``state`` (small JSON) as ``producer_id``'s in one queue transaction
        (e.g. the trainer's weights: generate functions read it with
        ``controller_state``)."""
        self._call("record_state", request_id, producer_id, dict(state))

    def resolution(self) -> dict[str, Any]:
        """How a job started from a checkpoint resolution started (its mode, step, first
        rollout id, directories, queue, groups restored)."""
        return self._call("resolution")  # type: ignore[no-any-return]

    def save_checkpoint(self, step: int, save_model: Any) -> dict[str, Any]:
        """The joint checkpoint of ``step``, saved by the controller actor (where the
        queue and the builder live); ``save_model(model_dir)`` is shipped there and runs
        there (the driver's node).  Returns the commit marker."""
        return self._call("save_checkpoint", step, save_model)  # type: ignore[no-any-return]

    # --- generation actors ------------------------------------------------------------
    def _spawn(self, node: NodeSpec, slots: int) -> Worker:
        self._incarnation += 1
        worker_id = f"gen-{node.node_id[:12]}-{self._tag}-{self._incarnation}"
        options: dict[str, Any] = {
            "num_cpus": node.num_cpus, "num_gpus": node.num_gpus, "max_restarts": 0,
            "max_task_retries": 0, "max_concurrency": GENERATION_CONCURRENCY,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}
        if node.resources:
            options["resources"] = dict(node.resources)
        handle = ray.remote(GenerationWorker).options(**options).remote(  # type: ignore[attr-defined]
            self.controller, self.name, node.root or self.root, self.run_id,
            worker_id=worker_id, config=self.config, generate=self.generate, slots=slots,
            weight_version=self.weight_version, store_options=self.store_options,
            prefetch=self.prefetch)
        return Worker(worker_id, node, slots, handle)

    def _probe(self) -> None:
        ref, token = self._call("write_marker")
        answers = []
        for w in self.workers:
            try:
                answers.append(ray.get(w.handle.probe.remote(ref, token),
                                       timeout=self.probe_timeout))
            except (ray.exceptions.RayError, TimeoutError) as e:
                raise StorageProbeFailed(
                    f"storage probe: node {w.node.node_id} (worker {w.worker_id}, pool "
                    f"{w.node.root or self.root}) did not answer: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}") from e
        for w, a in zip(self.workers, answers, strict=True):
            where = (f"node {a['node_id']} (host {a['host']}, worker {w.worker_id}) sees the "
                     f"pool at {a['root']}")
            if not a["ok"]:
                raise StorageProbeFailed(
                    f"storage probe: {where}, which is not the job's pool (the controller's "
                    f"is {self.root} on node {self.driver_node}): {a['error']}. Every "
                    "node must mount the same shared filesystem; give each NodeSpec the "
                    "path of that mount on its node")
            try:
                back = self._call("read_marker", a["ref"])
            except Exception as e:  # noqa: BLE001 - reported as the probe's failure
                back = f"unreadable ({type(e).__name__}: {e})"
            if back != a["token"]:
                raise StorageProbeFailed(
                    f"storage probe: {where}; the marker it wrote there is {back!r} through "
                    f"the controller's pool {self.root}: they are not the same pool")

    def _each(self, method: str, *args: Any) -> dict[str, Any]:
        """Call ``method`` on every live worker; dead ones are marked lost (their leases
        expire; their tasks return)."""
        live = [w for w in self.workers if not w.lost]
        calls = [getattr(w.handle, method).remote(*args) for w in live]
        out: dict[str, Any] = {}
        for w, call in zip(live, calls, strict=True):
            try:
                out[w.worker_id] = ray.get(call)
            except ray.exceptions.RayActorError as e:
                self._lost(w, f"{type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}")
        return out

    def _lost(self, w: Worker, why: str) -> None:
        """``w`` is confirmed dead: retire it (``retire_lost``) so its tasks return now."""
        w.lost = why
        if self.retire_lost:
            self._call("retire_worker", w.worker_id)

    def where(self, worker_id: str | None = None) -> dict[str, Any]:
        """Where a live generation actor (None: the controller actor) runs: node, pid,
        host, pool root."""
        if worker_id is None:
            return self._call("where")  # type: ignore[no-any-return]
        return ray.get(self._worker(worker_id).handle.where.remote())  # type: ignore[no-any-return]

    def check_workers(self) -> list[Worker]:
        """The workers found dead now or before."""
        self._each("held")
        return self.lost

    @property
    def lost(self) -> list[Worker]:
        return [w for w in self.workers if w.lost]

    def stats(self) -> dict[str, Any]:
        """Each live worker's producer stats, by worker id."""
        return self._each("stats")

    def held(self) -> dict[str, list[str]]:
        """Each live worker's leased task ids."""
        return self._each("held")

    def pause(self) -> dict[str, Any]:
        """Stop admission everywhere; returns once every live node's in-flight groups are
        durable in the queue (``Producer.pause``), by worker id."""
        self._call("where")  # a dead controller fails the job here, by name
        return self._each("pause")

    def resume(self, weight_version: int) -> None:
        """After the weight update: the controller serves ``weight_version``, every node
        generates under it."""
        self._call("set_serving_version", weight_version)
        self.weight_version = weight_version
        self._each("resume", weight_version)

    def kill_worker(self, worker_id: str) -> None:
        """Kill a generation actor at once (``ray.kill``: no cleanup), then retire it
        (``retire_lost``; else its leases expire)."""
        w = self._worker(worker_id)
        ray.kill(w.handle, no_restart=True)
        _await_death(w.handle)
        self._lost(w, "killed by the driver")

    def add_worker(self, node: NodeSpec, slots: int | None = None) -> Worker:
        """Start a generation actor on ``node`` (a replacement: a new worker id), after
        the storage probe of that node."""
        w = self._spawn(node, slots or min(self.slots))
        ref, token = self._call("write_marker")
        a = ray.get(w.handle.probe.remote(ref, token), timeout=self.probe_timeout)
        if not a["ok"] or self._call("read_marker", a["ref"]) != a["token"]:
            ray.kill(w.handle, no_restart=True)
            raise StorageProbeFailed(f"storage probe: node {a['node_id']} sees the pool at "
                                     f"{a['root']}, not the job's pool: {a['error']}")
        ray.get(w.handle.start.remote())
        if self.weight_version:
            ray.get(w.handle.resume.remote(self.weight_version))
        self.workers.append(w)
        return w

    def _worker(self, worker_id: str) -> Worker:
        for w in self.workers:
            if w.worker_id == worker_id:
                return w
        raise KeyError(f"no generation worker {worker_id!r} in this job (workers: "
                       f"{[w.worker_id for w in self.workers]})")

    # --- lifecycle --------------------------------------------------------------------
    def close(self, *, force: bool = False) -> None:
        """Stop every generation actor (their leases released), then the controller."""
        try:
            if not force:
                self._each("stop")
        finally:
            for w in self.workers:
                ray.kill(w.handle, no_restart=True)
            try:
                if not force:
                    self._call("close")
            finally:
                ray.kill(self.controller, no_restart=True)
                # dead before this returns: a job started next on the pool reuses the
                # controller's writer (whose lock a live process would still hold)
                for handle in [self.controller, *(w.handle for w in self.workers)]:
                    _await_death(handle)

    def __enter__(self) -> RayRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(force=exc[0] is not None)


def _await_death(handle: Any, timeout: float = 60.0) -> None:
    """Until Ray reports the (killed) actor dead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(handle.where.remote(), timeout=1)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        else:
            time.sleep(0.05)  # the kill has not reached it yet
    raise TimeoutError(f"actor {handle} still answers {timeout} s after ray.kill")


__all__ = ["RayRollout", "NodeSpec", "Worker", "share_concurrency", "default_nodes",
           "CONTROLLER_CONCURRENCY", "PROBE_TIMEOUT"]
