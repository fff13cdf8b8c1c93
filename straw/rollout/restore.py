"""Start a rollout job from a ``Resolution`` (issue 15, item 3): the two restore modes,
and the others a start needs.

**The rule that picks the mode** (``resolve``): resuming automatically the NEWEST
checkpoint of the active branch after a crash is a **salvage**; every other selection
(an explicit step, an edited tracker, an exact commit file, another branch: a rollback)
is **exact**.  Besides: ``new`` (nothing to load), ``recover`` (a crash before the
branch's first checkpoint: its own queue is reopened), ``empty`` (a model without queue
snapshot: an empty queue with the dataset cursor if saved, else offset 0).

``open_job(resolution, store, dataset, mix, dp_size=...)`` takes the save directory's lock
(``SaveLock``: one controller per save directory), checks ``current.json`` did not change
since resolution, writes the new branch's ``rollout/branch.json``, the tracker and
``current.json`` (before any queue write), then:

* **exact**: an isolated queue (``isolated.seed_isolated_queue``; its own queue id, the
  run's nonce, in the same pool and run) seeded in ONE transaction with the checkpoint's
  pending and partial tasks and its dataset cursor, and a builder whose backlog holds,
  by reference, the groups of the batches collected but unfinished at the checkpoint
  (first, in their order, so they are planned again as they were) and then its backlog
  of accepted untrained groups.  Nothing is written into the source queue (RL6); the
  payloads are shared, retained by the checkpoint's owner and the branch's (RL7).
  Later samples of the source run are excluded: only the files of the checkpoint are read.
* **salvage**: everything exact restores, plus, read from the dead run's queue (reopened
  with ``recover=True``, which revokes its leases and writes no task, commit or batch):
  every group accepted after the checkpoint's boundary S (its commit position >= S: not
  trained at or before the checkpoint, RL8), restored not regenerated; the batches
  collected after S, replayed in their order with the same groups (identical training
  data); and the dead run's live tasks and dataset cursor (so no prompt whose group is
  restored is admitted again, and no prompt is skipped).  Results from S on are readable
  whatever the dead run acknowledged since: the checkpoint's registration on that queue
  (cursor S) kept them from its collections.  While the restored backlog covers the
  demand, ``builder.next_batch`` fills every batch from it: the generation loop calls
  nothing (``admits_fresh`` is False).  New ids never collide with the dead run's: the
  new queue's id is the run's nonce (batch ids are derived from it), and the dataset
  cursor continues past every group the dead run admitted; batch numbering continues
  from the resumed step (``next_rollout_id = step + 1``).

Last, once the builder's restored state is durable (its consumer state on the new
queue), ``rollout/seeded.json``: from then on a restart recovers the branch's own queue
(``recover``); a crash before it makes the restart start the restore again, whole, into
a new branch (``fault_injection.checkpoint_campaign`` crashes every syscall of both).

Driving it on SimFS (a crash campaign): pass the SimFS-backed store and ``fs=`` (the same
Filesystem) to ``resolve_checkpoint``, ``open_job`` and hence the ``Checkpointer``; every
file write is one write-temp/fsync/rename/fsync-dir step, so a crash at any syscall
leaves the old or the new checkpoint selected.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from straw import Coordinator
from straw.fs import Filesystem
from straw.protocol import TaskSpec

from .batches import Accepted, BatchBuilder
from .batches.groups import read_accepted
from .batches.records import COLLECTION_PREFIX
from .checkpoint import (
    Checkpointer,
    check_builder_state,
    commits_between,
    json_record,
    saved_backlog,
)
from .checkpoint_errors import BranchChanged, ForeignPool, ForeignRun
from .checkpoint_files import (
    BRANCH,
    CURRENT,
    ROLLOUT,
    SEEDED,
    VERSION,
    check_fields,
    check_version,
    parse_json,
    read_json,
    rollout_file,
    write_json,
    write_tracker,
)
from .config import RolloutConfig
from .controller import RolloutController
from .data_source import PRODUCER_ID, PROMPT_PREFIX, producer_state
from .data_source import Cursor as DatasetCursor
from .environments import EnvironmentMix, MixState
from .isolated import restored_backlog, seed_isolated_queue
from .resolve import EMPTY, EXACT, NEW, RECOVER, SALVAGE, Resolution
from .savelock import SaveLock

BRANCH_NAMESPACE = "branches"


@dataclass
class RolloutJob:
    """A started job: its ``controller`` and ``builder``, the ``checkpointer`` saving
    into its directory, the save directory's ``lock``, and what resolution decided.
    ``restored`` counts the groups restored into the builder's backlog."""

    resolution: Resolution
    controller: RolloutController
    builder: BatchBuilder
    checkpointer: Checkpointer
    lock: SaveLock
    restored: int = 0

    @property
    def next_rollout_id(self) -> int:
        return self.resolution.next_rollout_id

    def save(self, step: int, save_model: Any) -> dict[str, Any]:
        return self.checkpointer.save(step, save_model)

    def close(self) -> None:
        try:
            self.builder.close()
        finally:
            try:
                self.controller.close()
            finally:
                self.lock.close()

    def __enter__(self) -> RolloutJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (reference counting frees everything as
    always; only the search for unreachable cycles waits).  A restore builds ~10 objects
    per restored group (the parsed state, references, backlog entries, their JSON form)
    and keeps nearly all of them: each collector pass over them found nothing and cost
    ~15% of the CPU of a 10,000-group restore.  Left as found: a caller that paused the
    collector itself keeps it paused."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@_cyclic_gc_paused()
def open_job(resolution: Resolution, store: Any, dataset: Any, mix: EnvironmentMix, *,
             dp_size: int, config: RolloutConfig | None = None, fs: Filesystem | None = None,
             clock: Any = None, **builder_options: Any) -> RolloutJob:
    """Start the job ``resolution`` describes (module docstring).  ``dataset``: what
    ``RolloutController`` takes; ``builder_options``: the rest of ``BatchBuilder``'s
    keywords (hooks, conversion, parallel layout)."""
    if not isinstance(resolution, Resolution):
        raise TypeError(f"resolution must be a Resolution (resolve_checkpoint), got "
                        f"{type(resolution).__name__}")
    fs = fs if fs is not None else store.fs
    config = config or RolloutConfig()
    if resolution.marker is not None:
        _check_compatible(resolution, store)
    lock = SaveLock(resolution.root, fs=fs)
    try:
        _check_current(fs, resolution)
        if resolution.mode == RECOVER:
            assert resolution.queue is not None
            ns, qid = resolution.queue["namespace"], resolution.queue["queue_id"]
            controller = _recovered(store, dataset, config, ns, qid, clock)
            state, restored = None, 0
        else:
            ns, qid = BRANCH_NAMESPACE, resolution.branch_id
            saved = _read_states(fs, resolution)  # checked before anything is written
            _publish_branch(fs, resolution, store, ns, qid)
            tasks, producer, accepted, mix_state = _seed(resolution, store, mix, saved, clock)
            seeded = seed_isolated_queue(store, namespace=ns, queue_id=qid, tasks=tasks,
                                         producer_state=producer, accepted=accepted,
                                         mix=mix_state, clock=clock,
                                         lease_seconds=config.lease_seconds)
            # the controller owns the seeded queue from here on: handed over open, not
            # closed and reopened (a second epoch, ~30 ms of a 10,000-group restore)
            try:
                controller = RolloutController(store, dataset, config=config, queue_id=qid,
                                               namespace=ns, clock=clock,
                                               coordinator=seeded.coordinator)
            except BaseException:
                seeded.coordinator.close()
                raise
            state = seeded.builder_state  # its backlog: the entries parsed above, as they are
            restored = len(accepted)
        try:
            builder = BatchBuilder(controller.coordinator, store, mix, dp_size=dp_size,
                                   config=config, state=state, **builder_options)
        except BaseException:
            controller.close()
            raise
        if resolution.mode != RECOVER:
            _mark_seeded(fs, resolution, ns, qid, controller, builder)
        checkpointer = Checkpointer(resolution.directory, controller=controller,
                                    builder=builder, logical_root=resolution.root, fs=fs)
    except BaseException:
        lock.close()
        raise
    return RolloutJob(resolution, controller, builder, checkpointer, lock, restored)


def _recovered(store: Any, dataset: Any, config: RolloutConfig, ns: str, qid: str,
               clock: Any) -> RolloutController:
    """The controller of the branch's own queue, recovered; the dead incarnation's reads
    end with it (the whole job stopped)."""
    controller = RolloutController(store, dataset, config=config, queue_id=qid,
                                   namespace=ns, recover=True, clock=clock)
    leases = controller.coordinator.outstanding_reads()
    if leases:
        controller.coordinator.release_task_reads(list(leases))
    return controller


def _mark_seeded(fs: Filesystem, resolution: Resolution, ns: str, qid: str,
                 controller: RolloutController, builder: BatchBuilder) -> None:
    """Mark the branch's queue seeded: from here on a restart recovers it (resolve:
    recover).  Only once the builder made its restored state durable (its consumer
    state): written before it, a crash in between recovered a builder without the
    restored groups, lost (the crash campaign's seeded_before_builder control).  A crash
    before this mark starts the restore again, into a new branch."""
    try:
        write_json(fs, os.path.join(resolution.directory, ROLLOUT, SEEDED),
                   {"version": VERSION, "queue": {"namespace": ns, "queue_id": qid}})
    except BaseException:
        try:
            builder.close()
        finally:
            controller.close()
        raise


def _check_compatible(resolution: Resolution, store: Any) -> None:
    marker = resolution.marker or {}
    where = rollout_file(resolution.source or "", "committed", resolution.step or 0)
    if marker.get("run_id") != store.run_id:
        raise ForeignRun(f"{where} belongs to straw run {marker.get('run_id')!r}, the store "
                         f"to {store.run_id!r}: open the store with that run id")
    if marker.get("pool") != store.pool_id:
        raise ForeignPool(f"{where} references payloads of pool {marker.get('pool')!r}; the "
                          f"store's pool {store.root} is {store.pool_id!r}: restoring requires "
                          "the original shared pool")


def _check_current(fs: Filesystem, resolution: Resolution) -> None:
    path = os.path.join(resolution.root, ROLLOUT, CURRENT)
    now = fs.read_file(path) if fs.exists(path) else None
    if now != resolution.current:
        raise BranchChanged(f"{path} changed since the checkpoint was resolved (another job "
                            "started a branch meanwhile): resolve again")


def _publish_branch(fs: Filesystem, resolution: Resolution, store: Any, ns: str,
                    qid: str) -> None:
    """branch.json, the tracker and current.json of the new run, before its queue."""
    directory = resolution.directory
    write_json(fs, os.path.join(directory, ROLLOUT, BRANCH), {
        "version": VERSION, "branch_id": resolution.branch_id, "parent": resolution.parent,
        "mode": resolution.mode, "queue": {"namespace": ns, "queue_id": qid},
        "pool": store.pool_id, "run_id": store.run_id})
    if resolution.step is not None:
        write_tracker(fs, resolution.root, resolution.step)
    tracker = "" if resolution.step is None else str(resolution.step)
    write_json(fs, os.path.join(resolution.root, ROLLOUT, CURRENT),
               {"version": VERSION, "directory": directory, "tracker": tracker})


def _seed(resolution: Resolution, store: Any, mix: EnvironmentMix,
          saved: tuple[dict[str, Any], dict[str, Any]] | None, clock: Any
          ) -> tuple[list[TaskSpec], Mapping[str, Any] | None, list[Accepted], MixState | None]:
    """(tasks, producer state, accepted groups in selection order, mix state) to seed;
    ``saved``: the checkpoint's queue and builder state (``_read_states``)."""
    if resolution.mode == NEW:
        return [], None, [], None
    if resolution.mode == EMPTY:
        cursor = resolution.dataset_cursor
        return [], None if cursor is None else producer_state(DatasetCursor.from_dict(cursor)), \
            [], None
    assert resolution.mode in (EXACT, SALVAGE) and resolution.source is not None
    assert saved is not None
    step = resolution.step if resolution.step is not None else 0
    q, b = saved
    tasks = [TaskSpec.from_dict(t) for t in q["tasks"]]
    producer = q["producer_state"]
    planned: list[dict[str, Any]] = list(b["planned"])
    if resolution.mode == SALVAGE:
        later, planned_later, tasks, producer = _after(store, mix, q["queue"], b["scan_cursor"],
                                                       clock)
        planned += planned_later
    # the groups of the planned batches first, in their order (planned again as they were)
    first = restored_backlog([Accepted.from_dict(g) for p in planned for g in p["groups"]])
    in_batches = {e.commit_id for e in first}
    path = rollout_file(resolution.source, "builder_state", step)
    if resolution.mode == SALVAGE:  # the backlog and the groups accepted later, merged
        rest = sorted((e for e in [*saved_backlog(b, path=path), *later]
                       if e.commit_id not in in_batches), key=Accepted.order)
    else:  # in selection order, built at once as the restored entries they become
        rest = saved_backlog(b, path=path, restored_from=len(first), leave_out=in_batches)
    mix_state = MixState.from_dict(planned[0]["mix_before"] if planned else b["mix"])
    return tasks, producer, first + rest, mix_state


def _read_states(fs: Filesystem, resolution: Resolution
                 ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The checkpoint's queue and builder state (None for a start that reads none), read
    and checked before the start writes anything: a state file that is no straw's fails
    the start with the branch, tracker and ``current.json`` as they were."""
    if resolution.mode not in (EXACT, SALVAGE):
        return None
    step = resolution.step if resolution.step is not None else 0
    return (_read_state(fs, resolution, "queue_state", step),
            _read_state(fs, resolution, "builder_state", step))


def _read_state(fs: Filesystem, resolution: Resolution, kind: str, step: int
                ) -> dict[str, Any]:
    """A state file of the checkpoint: the bytes resolution hashed when it kept them (one
    read, and what is parsed is what was checked), else read now (a ``Resolution`` built
    by hand); the fields a restore reads checked (``UnsupportedCheckpoint`` naming the
    file and the field)."""
    assert resolution.source is not None
    path = rollout_file(resolution.source, kind, step)
    what = kind.replace("_", " ")
    data = resolution.state_files.get(path)
    value = read_json(fs, path, what) if data is None else parse_json(data, path, what)
    if kind == "builder_state":  # its own version (the backlog's form)
        check_fields(check_builder_state(value, path), path, what,
                     {"scan_cursor": int, "mix": dict, "planned": list, "backlog": (dict, list)})
        for i, p in enumerate(value["planned"]):
            check_fields(p, path, what, {"groups": list, "mix_before": dict}, f"['planned'][{i}]")
            for j, g in enumerate(p["groups"]):
                check_fields(g, path, what, {}, f"['planned'][{i}]['groups'][{j}]")
        return value
    check_fields(check_version(value, path, kind), path, what,
                 {"tasks": list, "producer_state": (dict, type(None)), "queue": dict})
    check_fields(value["queue"], path, what, {"namespace": str, "queue_id": str}, "['queue']")
    for i, t in enumerate(value["tasks"]):
        check_fields(t, path, what, {}, f"['tasks'][{i}]")
    return value


def _after(store: Any, mix: EnvironmentMix, queue: Mapping[str, str], scan: int, clock: Any
           ) -> tuple[list[Accepted], list[dict[str, Any]], list[TaskSpec], Any]:
    """What the dead run's queue holds after the checkpoint's boundary ``scan``: groups
    accepted from there on, the batches collected from there on, its live prompt tasks
    and its dataset producer state."""
    # a salvage reads the dead run's live prompts: its revoked leases must not fail them
    coord = Coordinator(store, queue_id=queue["queue_id"], namespace=queue["namespace"],
                        recover=True, clock=clock, recovery_spends_budget=False)
    try:
        accepted: list[Accepted] = []
        planned: list[dict[str, Any]] = []
        for receipt in commits_between(coord, scan, None):
            if receipt.task_id.startswith(PROMPT_PREFIX):
                accepted.append(read_accepted(store, mix, receipt))  # RL8: position >= S
            elif receipt.task_id.startswith(COLLECTION_PREFIX):
                body = json_record(store, receipt.result_ref, receipt.task_id)
                planned.append({"rollout_id": body["rollout_id"],
                                "commit_id": receipt.commit_id, "position": receipt.position,
                                "groups": body["groups"], "mix_before": body["mix_before"],
                                "mix_after": body["mix_after"]})
        tasks = list(coord.pending_tasks(task_prefix=PROMPT_PREFIX))
        producer = coord.producer_state(PRODUCER_ID)
    finally:
        coord.close()
    return accepted, planned, tasks, producer


def restored_groups(job: RolloutJob) -> Sequence[Accepted]:
    """The restored entries still in the builder's backlog (for reporting)."""
    return [Accepted.from_dict(e) for e in job.builder.state()["backlog"]
            if e.get("restored")]


__all__ = ["RolloutJob", "open_job", "restored_groups", "BRANCH_NAMESPACE"]
