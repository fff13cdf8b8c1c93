"""The two actors of a distributed rollout, as plain classes (``job`` makes them Ray
actors with their placement): the job's controller and a node's generation worker.

``ControllerWorker`` owns the job's ``RolloutController`` (coordinator and data source)
and, when the job builds batches, its ``BatchBuilder``; it answers the calls of every
node's ``GenerationClient`` (through ``RayController``) and the driver's.  It runs on the
driver's node, threaded (calls from many clients at once; the coordinator serialises).

``GenerationWorker`` is one node's generation process: its own pool client (the node's
mount of the pool), a ``GenerationClient`` over ``RayController`` and a ``Producer`` of
``slots`` slots running the job's generate function.  It runs as an async actor: the
producer's slots live on the actor's event loop; its blocking calls run on threads.

Only control messages cross Ray: leases, task specs (their input references), receipts,
outcomes, counts; every payload (prompts, continuations, groups, shards) is written and
read in the pool by the process that produces or consumes it.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
import ray.exceptions

from straw import SharedFilesystemStore, StrawError
from straw.protocol import AcquireResult, CommitReceipt, Lease
from straw.refs import Record, RecordSetRef

from ..batches import BatchBuilder
from ..config import RolloutConfig
from ..controller import RolloutController, check_take
from ..environments import EnvironmentMix
from ..generate import GenerateFn
from ..generation import GenerationClient
from ..producer import Producer
from ..restore import RolloutJob, open_job
from ..shards import RankBatchRef
from .client import ControllerLost as ControllerLost
from .client import RayController as RayController
from .client import controller_lost as controller_lost
from .client import controller_state as controller_state

CONTROLLER_WRITER = "ray-controller"
logger = logging.getLogger(__name__)
PROBE_PREFIX = "storage-probe"
# The controller actor's cyclic GC: a young-generation collection every this many net
# allocations instead of CPython's 700.  The controller allocates and drops many short-lived
# objects per group (leases, receipts, decoded samples, frames); with Ray's and the queue's
# long-lived objects in the older generations, collections at the default rate were about a
# seventh of its CPU per group (bench.pipeline_bench, in-process harness: 0.22 of 1.6 ms per
# group; 0.05 at this threshold).  Only the controller's own process is tuned: generation
# actors host the user's engine, whose settings are its own.
CONTROLLER_GC_THRESHOLD = 10_000


class StorageProbeFailed(RuntimeError):
    """A node does not see the job's pool (start-up storage probe)."""


def node_id() -> str:
    return str(ray.get_runtime_context().get_node_id())


def _check_ahead(max_ahead_groups: object, batch_groups: int | None) -> int | None:
    """``max_ahead_groups`` checked: None, or an int >= ``batch_groups`` (a smaller bound
    would stop generation before a batch can fill)."""
    if max_ahead_groups is None:
        return None
    if batch_groups is None:
        raise ValueError("max_ahead_groups bounds the accepted groups waiting for a batch: "
                         "give batch_groups too (or max_ahead_groups=None)")
    if isinstance(max_ahead_groups, bool) or not isinstance(max_ahead_groups, int) \
            or max_ahead_groups < batch_groups:
        raise ValueError(f"max_ahead_groups must be None or an int >= batch_groups "
                         f"({batch_groups}): fewer accepted groups could never fill a "
                         f"batch; got {max_ahead_groups!r}")
    return max_ahead_groups


def _marker_record(token: str, who: str) -> Record:
    return Record(f"{PROBE_PREFIX}:{who}", token.encode(), metadata={"who": who})


def write_marker(store: SharedFilesystemStore, who: str) -> tuple[RecordSetRef, str]:
    """Publish a random marker through ``store``; its reference and the token."""
    token = secrets.token_hex(16)
    ref = store.publish([_marker_record(token, who)],
                        submission_id=f"{PROBE_PREFIX}:{who}:{token}")
    return ref, token


def read_marker(store: SharedFilesystemStore, ref: RecordSetRef) -> str:
    """The token of a marker, read back through ``store`` (the reader's view of the pool)."""
    with store.read_session() as reader:
        (record,) = list(reader.read(ref))
    return bytes(record.payload).decode()


class ControllerWorker:
    """The job's controller (module docstring).  ``dataset`` is the prompts, a
    ``DataSource``, or a callable returning either (called here, so a large dataset is
    loaded on the controller's node, not shipped through Ray).

    ``checkpoint``: a ``Resolution`` (``straw.rollout.resolve.resolve_checkpoint``, resolved
    by the driver): the job is started by ``restore.open_job`` (new, salvage, exact, ...)
    under the save directory's lock, which this process holds (released when it dies),
    and ``save_checkpoint`` saves into its directory; it needs ``batch_groups``, and
    ``controller_options`` do not apply (the queue is the resolution's).
    ``builder_options`` go to the ``BatchBuilder`` (reward and conversion hooks),
    ``store_options`` to this actor's ``SharedFilesystemStore`` (e.g. ``reserve_bytes``).

    ``next_batch(rollout_id, timeout=s)`` waits here, up to ``s`` seconds, for the batch to
    fill (woken by each call that accepts groups), so a driver needs no polling loop of
    calls; the builder's calls (``next_batch``, ``finish_batch``, ``backlog``, checkpoint
    saves) run one at a time.

    A scan-ahead thread reads and decodes the groups as they are accepted
    (``BatchBuilder.decode_ahead``: reads only, nothing durable), also while a driver call
    builds (whose durable writes leave the GIL free most of the build's time), and
    between the driver's calls scans them into the backlog (``BatchBuilder.backlog``), so
    that ``next_batch`` finds them decoded and its batch costs the driver the build
    alone: the driver waits for every build (measured in ``bench.pipeline_bench``: the
    build was the whole batch period, its scan about 45% of the build's CPU; when the
    thread scanned only between driver calls, which come back to back, the builds still
    decoded most groups themselves: a third of their CPU).

    ``max_ahead_groups`` (needs ``batch_groups``; None: unbounded) bounds how far
    generation runs ahead of training: while at least that many accepted groups wait for
    a batch, ``take`` leases nothing (status ``backpressured``; the producers retry).
    The count is the builder's backlog as of its last ``next_batch`` plus the groups
    accepted since, so it is a soft bound (groups in flight still land) that never
    stops a batch from filling: it must be at least ``batch_groups``."""

    def __init__(self, root: str, run_id: str, dataset: Any, *, config: RolloutConfig,
                 batch_groups: int | None = None, dp_size: int = 1,
                 controller_options: Mapping[str, Any] | None = None,
                 checkpoint: Any = None,
                 builder_options: Mapping[str, Any] | None = None,
                 store_options: Mapping[str, Any] | None = None,
                 max_ahead_groups: int | None = None) -> None:
        self.max_ahead_groups = _check_ahead(max_ahead_groups, batch_groups)
        self._ahead_lock = threading.Lock()
        self._waiting = 0  # accepted groups not in a batch yet (soft count: see above)
        # notified when groups are accepted: a next_batch waiting for its batch to fill
        self._accepted = threading.Condition()
        self._accepted_count = 0
        self._batches = threading.Lock()  # the builder: one driver call at a time
        self._closing = False
        self._scanner: threading.Thread | None = None
        self.scans_ahead = 0  # scans the scan-ahead thread made (its tests wait on them)
        self._scanned = threading.Condition()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(CONTROLLER_GC_THRESHOLD, older, oldest)  # see the constant
        self.config = config
        self.store = SharedFilesystemStore(root, run_id, writer_id=CONTROLLER_WRITER,
                                           **{**config.store_options(),
                                              **dict(store_options or {})})
        if callable(dataset):
            dataset = dataset()
        self.job: RolloutJob | None = None
        self.builder: BatchBuilder | None = None
        if checkpoint is not None:
            if batch_groups is None or controller_options:
                self.store.close()
                raise ValueError("a job started from a checkpoint resolution builds batches "
                                 "(give batch_groups) in the resolution's queue (give no "
                                 "controller_options)")
            try:
                self.job = open_job(checkpoint, self.store, dataset,
                                    EnvironmentMix.single(batch_groups), dp_size=dp_size,
                                    config=config, **dict(builder_options or {}))
            except BaseException:
                self.store.close()
                raise
            self.controller, self.builder = self.job.controller, self.job.builder
            try:
                self._recount(scan=True)
            except BaseException:
                self.close()
                raise
            self._start_scanner()
            return
        self.controller = RolloutController(self.store, dataset, config=config,
                                            **dict(controller_options or {}))
        try:
            if batch_groups is not None:
                self.builder = BatchBuilder(self.controller.coordinator, self.store,
                                            EnvironmentMix.single(batch_groups),
                                            dp_size=dp_size, config=config,
                                            **dict(builder_options or {}))
            self._recount(scan=True)
        except BaseException:
            if self.builder is not None:
                self.builder.close()
            self.controller.close()
            raise
        self._start_scanner()

    def _start_scanner(self) -> None:
        if self.builder is not None:
            self._scanner = threading.Thread(target=self._scan_ahead, daemon=True,
                                             name="straw-scan-ahead")
            self._scanner.start()

    def _scan_ahead(self) -> None:
        """Each time groups are accepted: decode them ahead, then scan them into the
        backlog if no driver call holds the builder (class docstring).  A failing decode
        or scan is left to the driver's next call, which meets the same error and
        reports it; this thread just waits for the next acceptance."""
        builder = self.builder
        assert builder is not None
        with self._accepted:
            seen = self._accepted_count
        while True:
            with self._accepted:
                while self._accepted_count == seen and not self._closing:
                    self._accepted.wait()
                if self._closing:
                    return
                seen = self._accepted_count
            try:
                # decoded while a driver call may hold the builder: a build waits on its
                # durable writes most of its time, and this fills those waits
                builder.decode_ahead()
            except Exception as e:  # noqa: BLE001 (the driver's next call reports it)
                logger.debug("decode ahead failed (the next driver call reports it): %s", e)
            if self._batches.acquire(blocking=False):  # else a driver call scans now
                try:
                    if self._closing:
                        return
                    builder.backlog()  # the decoded groups into the backlog: its count
                    self._recount()
                except Exception as e:  # noqa: BLE001 (as above)
                    logger.debug("scan ahead failed (the next driver call reports it): %s",
                                 e)
                finally:
                    self._batches.release()
            with self._scanned:
                self.scans_ahead += 1
                self._scanned.notify_all()

    def _recount(self, *, scan: bool = False) -> None:
        """The accepted groups waiting for a batch: the builder's backlog as of its last
        scan (``scan``: scan the log first, for a recovered or restored queue's)."""
        if self.builder is not None and self.max_ahead_groups is not None:
            waiting = sum(self.builder.backlog().values()) if scan \
                else self.builder.metrics()["backlog"]
            with self._ahead_lock:
                self._waiting = waiting

    def where(self) -> dict[str, Any]:
        return {"node_id": node_id(), "pid": os.getpid(), "host": socket.gethostname(),
                "root": self.store.root}

    # --- what generation clients call -------------------------------------------------
    def take(self, worker_id: str, count: int, *, request_id: str | None = None
             ) -> AcquireResult:
        if self._ahead():  # training is behind: lease nothing until a batch takes groups
            return AcquireResult("backpressured")
        return self.controller.take(worker_id, count, request_id=request_id)

    def _ahead(self) -> bool:
        """At least ``max_ahead_groups`` accepted groups wait for a batch."""
        if self.max_ahead_groups is None:
            return False
        with self._ahead_lock:
            return self._waiting >= self.max_ahead_groups

    def heartbeat(self, leases: Sequence[Lease]) -> list[str]:
        return self.controller.heartbeat(leases)

    def complete_many(self, items: Sequence[Mapping[str, Any]]
                      ) -> list[CommitReceipt | StrawError]:
        outcomes = self.controller.complete_many(items)
        self._count_accepted(outcomes)
        return outcomes

    def _count_accepted(self, outcomes: Sequence[object]) -> None:
        """Groups accepted: counted as waiting for a batch; a waiting next_batch woken."""
        accepted = sum(isinstance(o, CommitReceipt) for o in outcomes)
        if accepted:
            if self.max_ahead_groups is not None:
                with self._ahead_lock:
                    self._waiting += accepted
            with self._accepted:
                self._accepted_count += accepted
                self._accepted.notify_all()

    def complete_and_take(self, items: Sequence[Mapping[str, Any]], worker_id: str,
                          count: int, *, request_id: str
                          ) -> tuple[list[CommitReceipt | StrawError], AcquireResult]:
        """``RolloutController.complete_and_take`` (the two halves at once), with this
        actor's accounting: the backpressure check of ``take`` (before the call: the
        groups it completes count from the next take on, as the bound is soft) and the
        accepted groups of ``complete_many``."""
        check_take(worker_id, count, request_id, required=True)
        if self._ahead():
            return self.complete_many(items), AcquireResult("backpressured")
        outcomes, got = self.controller.complete_and_take(items, worker_id, count,
                                                          request_id=request_id)
        self._count_accepted(outcomes)
        return outcomes, got

    def yield_groups(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        return self.controller.yield_groups(updates, request_id=request_id)

    def save_progress(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        return self.controller.save_progress(updates, request_id=request_id)

    def reject(self, lease: Lease, *, category: str, reason: str) -> str:
        return self.controller.reject(lease, category=category, reason=reason)

    def release(self, leases: Sequence[Lease], *, request_id: str) -> list[str]:
        return self.controller.release(leases, request_id=request_id)

    def task_status(self, task_id: str) -> dict[str, Any] | None:
        return self.controller.task_status(task_id)

    def current_version(self) -> int | str:
        return self.controller.serving_version

    # --- what the driver calls --------------------------------------------------------
    def set_serving_version(self, version: int | str) -> None:
        self.controller.set_serving_version(version)

    def staleness_metrics(self) -> dict[str, float]:
        return self.controller.staleness_metrics()

    def retire_worker(self, worker_id: str) -> int:
        """A generation worker is confirmed dead: its leases are revoked now (its tasks
        pending again from their durable inputs) instead of when they expire; how many
        of its accepted results the builder has not trained yet (they stay in the log)."""
        return len(self.controller.coordinator.retire_worker(worker_id))

    def tasks(self, prefix: str = "prompt:") -> dict[str, dict[str, Any]]:
        """Every task of the queue under ``prefix``: its status (for checks and reports)."""
        return {t: s for t, s in sorted(self.controller.coordinator.tasks.items())
                if t.startswith(prefix)}

    def accepted(self, cursor: int = 0, limit: int = 1000) -> list[CommitReceipt]:
        """Receipts of the accepted prompt groups from commit ``cursor`` on (each names
        its result's reference: read the group from the pool, not through Ray)."""
        page = self.controller.coordinator.read_commits(cursor, limit)
        return [r for r in page.commits if r.task_id.startswith("prompt:")]

    def _builder(self) -> BatchBuilder:
        if self.builder is None:
            raise RuntimeError("this job builds no batches: give batch_groups to RayRollout")
        return self.builder

    def next_batch(self, rollout_id: int | str, timeout: float = 0.0,
                   finish: str | None = None) -> list[RankBatchRef] | None:
        """The builder's batch of ``rollout_id``, waiting up to ``timeout`` seconds for
        it to fill (tried again each time groups are accepted); None if it did not.

        ``finish``: the id of the batch the driver trained last, finished first
        (``finish_batch``: acknowledged durably before anything of this batch is
        written; if it raises, nothing is built) in the same call: one round trip of the
        driver per batch, not two.  It stays finished whatever this call answers after
        (a retry finishes it again: idempotent)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not math.isfinite(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got "
                             f"{timeout!r}")
        if finish is not None and not isinstance(finish, str):
            raise TypeError(f"finish must be None or a batch id (str, RankBatchRef."
                            f"batch_id), got {type(finish).__name__}")
        builder = self._builder()
        if finish is not None:
            self.finish_batch(finish)
        deadline = time.monotonic() + timeout
        while True:
            with self._accepted:
                seen = self._accepted_count
            with self._batches:
                try:
                    refs = builder.next_batch(rollout_id)
                finally:
                    # the backlog the builder scanned (groups accepted after its scan and
                    # before this line are counted by neither: the bound is soft,
                    # corrected next time)
                    self._recount()
            left = deadline - time.monotonic()
            if refs is not None or left <= 0:
                return refs
            with self._accepted:  # until more groups are accepted (or the time is up)
                if self._accepted_count == seen:
                    self._accepted.wait(left)

    def finish_batch(self, batch_id: str) -> None:
        with self._batches:
            self._builder().finish_batch(batch_id)

    def backlog(self) -> dict[str, int]:
        with self._batches:
            return self._builder().backlog()

    def producer_state(self, producer_id: str) -> Any:
        """The queue's state of ``producer_id`` (``Coordinator.producer_state``)."""
        return self.controller.coordinator.producer_state(producer_id)

    def record_state(self, request_id: str, producer_id: str, state: Mapping[str, Any]
                     ) -> None:
        """Save ``state`` as ``producer_id``'s in one queue transaction (no tasks): how a
        trainer records, say, its weights' reference where generation reads it."""
        self.controller.coordinator.submit_tasks(request_id, [], producer_id=producer_id,
                                                 producer_state=dict(state))

    def _job(self) -> RolloutJob:
        if self.job is None:
            raise RuntimeError("this job was not started from a checkpoint resolution: give "
                               "checkpoint=resolve_checkpoint(save_dir) to RayRollout")
        return self.job

    def resolution(self) -> dict[str, Any]:
        """How the job started: its mode, loaded step, first rollout id, directories,
        queue and the groups restored into the builder's backlog."""
        job = self._job()
        r = job.resolution
        coord = self.controller.coordinator
        return {"mode": r.mode, "step": r.step, "next_rollout_id": job.next_rollout_id,
                "directory": r.directory, "source": r.source, "branch_id": r.branch_id,
                "restored": job.restored,
                "queue": {"namespace": coord.namespace, "queue_id": coord.queue_id}}

    def save_checkpoint(self, step: int, save_model: Any) -> dict[str, Any]:
        """The joint checkpoint of ``step`` (``Checkpointer.save``, here where the queue
        and the builder live); ``save_model(model_dir)`` runs here too."""
        with self._batches:
            return self._job().save(step, save_model)

    def write_marker(self) -> tuple[RecordSetRef, str]:
        return write_marker(self.store, "controller")

    def read_marker(self, ref: RecordSetRef) -> str:
        return read_marker(self.store, ref)

    def close(self) -> None:
        with self._accepted:
            self._closing = True
            self._accepted.notify_all()
        if self._scanner is not None:
            self._scanner.join()  # (it holds the builder at most for one scan)
        try:
            if self.job is not None:
                self.job.close()  # builder, controller, the save directory's lock
            elif self.builder is not None:
                self.builder.close()
        finally:
            if self.job is None:
                self.controller.close()
            self.store.close()


class GenerationWorker:
    """One node's generation process (module docstring)."""

    def __init__(self, controller: Any, controller_name: str, root: str, run_id: str, *,
                 worker_id: str, config: RolloutConfig, generate: GenerateFn, slots: int,
                 weight_version: int = 0,
                 store_options: Mapping[str, Any] | None = None,
                 prefetch: int | None = None) -> None:
        self.worker_id = worker_id
        self.store = SharedFilesystemStore(root, run_id, writer_id=worker_id,
                                           **{**config.store_options(),
                                              **dict(store_options or {})})
        self.client = GenerationClient(RayController(controller, controller_name), self.store,
                                       worker_id=worker_id, config=config)
        self.producer = Producer(self.client, generate, slots=slots,
                                 weight_version=weight_version, prefetch=prefetch)

    def where(self) -> dict[str, Any]:
        return {"node_id": node_id(), "pid": os.getpid(), "host": socket.gethostname(),
                "root": self.store.root, "worker_id": self.worker_id}

    def probe(self, ref: RecordSetRef, token: str) -> dict[str, Any]:
        """The start-up storage probe on this node: read the controller's marker back
        through this node's pool client, then write this node's own (the controller reads
        it back).  ``{"ok", "seen", "ref", "token", "error"}`` plus ``where()``."""
        out = {**self.where(), "ok": False, "ref": None, "token": None, "error": ""}
        try:
            seen = read_marker(self.store, ref)
        except (StrawError, OSError, ValueError) as e:
            out["error"] = f"the controller's marker is not readable: {type(e).__name__}: {e}"
            return out
        if seen != token:
            out["error"] = "the controller's marker reads back other content"
            return out
        out["ref"], out["token"] = write_marker(self.store, self.worker_id)
        out["ok"] = True
        return out

    async def start(self) -> None:
        await self.producer.start()

    async def pause(self) -> dict[str, Any]:
        return await self.producer.pause()

    async def resume(self, weight_version: int) -> None:
        self.producer.resume(weight_version)

    async def stats(self) -> dict[str, Any]:
        return {**self.producer.stats(), "worker_id": self.worker_id}

    async def held(self) -> list[str]:
        """The task ids this worker holds leases on now."""
        return sorted(self.client.leases)

    async def stop(self) -> dict[str, Any]:
        try:
            await self.producer.stop()
        finally:
            self.store.close()
        return {"counts": dict(self.producer.counts)}


def remote_class(cls: type, **options: Any) -> Callable[..., Any]:
    """``cls`` as a Ray actor class with ``options``."""
    return ray.remote(cls).options(**options)  # type: ignore[no-any-return]


__all__ = ["ControllerWorker", "GenerationWorker", "RayController", "ControllerLost",
           "StorageProbeFailed", "controller_lost", "controller_state", "write_marker",
           "read_marker", "CONTROLLER_WRITER"]
