"""The joint checkpoint of a rollout job at step k (issue 15, item 1): the model's files,
the queue's live state, the builder's, then LAST a commit marker; then the trackers.

``Checkpointer(directory, controller=..., builder=...).save(k, save_model)``:

1. ``rollout/committed_<k>.json`` exists: ``CheckpointExists`` before anything is written.
2. **The model**: ``save_model(model_dir)`` is the user's framework-neutral save, called
   with ``<directory>/iter_<k:07d>`` (created); it writes its files there with its own
   I/O and returns ``{"files": [paths relative to model_dir], "optimizer": bool,
   "rng": bool}`` (a job whose files are written already passes a callable returning
   their names).  Each file is sized, fsynced (and each directory holding a new name
   once, deepest first) through our ``Filesystem``, and hashed (sha256) when at most
   ``SMALL_FILE`` bytes.  A save that raises leaves no marker.
3. **The rollout state**, whose cost follows the live state, never the history:
   ``queue_state_<k>.json`` (the prompt tasks pending or leased, leased ones to come back
   pending, with their current inputs; the dataset producer's cursor) and
   ``builder_state_<k>.json`` (the builder's backlog of accepted untrained groups, each
   collected but unfinished batch with its groups and mix states, the mix state, and the
   boundary ``scan_cursor`` S: the source commit log position the checkpoint covers;
   version ``BUILDER_STATE_VERSION`` = 2 holds the backlog as one list per field, the
   builder's stored form, read back by ``saved_backlog``, which reads version 1 too).
   Payloads are referenced, not copied: the groups and inputs named are retained under
   the checkpoint's owner ``checkpoint:<queue>:<k>`` (``store.retain``) before the marker
   names them, until ``release(k)``; and the
   checkpoint is registered on the source queue with cursor S
   (``Coordinator.register_checkpoint``): every result from S on stays readable (a
   salvage needs the groups accepted after the checkpoint even once a later batch
   acknowledged them) until the next checkpoint supersedes this registration (RL7).
4. **The marker** ``committed_<k>.json``, written last (RL9: every component is durable
   before it): each component's size and sha256 (small files), the optimizer and RNG
   flags, weight version k+1, the pool id, the run id, the source queue and the owner.
5. **Then** the trackers: ``latest_checkpointed_iteration.txt`` in the branch directory
   and in the logical root, then ``rollout/current.json`` (a crash between them still
   selects the committed step: resolution reads markers, not trackers alone).  Their
   contents are written and fsynced before the marker under temporary names nothing
   reads (``stage_file``); after it each is renamed into place and its directory fsynced,
   in that order, so none can name step k before its marker is durable.

Consistency with generation running meanwhile: the dataset cursor is read first, then the
tasks (tasks admitted after that cursor are left out: the restored run admits them again
from the cursor), then the builder scans the log to S and tasks whose groups were
accepted before S are left out (they are in the backlog): each prompt is in exactly one
of the tasks, the backlog, a planned batch, or after the cursor.

**Cost.**  Steps 2 (after the user's save returns) and 3 are independent until the marker:
none reads what another writes, and RL9 only needs all of them durable before it.  So the
model's fsyncs, the two state files (written together: one fsync each, ONE fsync of
``rollout/``) and the registration run on threads while this thread reads the rollout
state and retains its payloads; the marker waits for all of them.  The trackers'
contents are staged then too, so after the marker a save waits for one directory fsync
per tracker and ``current.json``, not two syncs each.  A save's syncs: the model's files
and directories, 3 for the state files, 2 for the marker, 2 per tracker and 2 for
``current.json``, and the queue's (retention, registration, release).  Nothing
it reads or writes grows with the history: the tasks are the live ones, the builder's
state is live by construction, the commits read are those from the builder's processed
cursor on (its unfinished batches), and each payload is retained once.

Every write is write-temp, fsync, rename, fsync-dir through ``fs`` (default the store's),
so a crash campaign on SimFS can crash any syscall of a save (``checkpoint_files``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from straw import TaskSpec
from straw.errors import CorruptData, IdempotencyConflict
from straw.fs import Filesystem
from straw.refs import Record, RecordSetRef

from .batches.entries import Accepted, backlog_columns, backlog_of_columns
from .batches.records import COLLECTION_PREFIX
from .checkpoint_errors import BranchChanged, CheckpointExists, ComponentChanged
from .checkpoint_files import (
    BUILDER_STATE_VERSION,
    BUILDER_STATE_VERSIONS,
    CURRENT,
    ROLLOUT,
    SMALL_FILE,
    TRACKER,
    VERSION,
    canonical,
    check_version,
    discard_staged,
    install_staged,
    model_dir,
    read_json,
    rollout_file,
    stage_file,
    tracker_bytes,
    write_files,
    write_json,
)
from .data_source import PRODUCER_ID, PROMPT_PREFIX, cursor_from_producer_state
from .isolated import restored_backlog

SaveModel = Callable[[str], Mapping[str, Any]]
OWNER_PREFIX = "checkpoint:"
_PAGE = 1024


def checkpoint_owner(namespace: str, queue_id: str, step: int) -> str:
    """The store owner retaining step ``step``'s payloads (never ``queue:``/``publication:``)."""
    return f"{OWNER_PREFIX}{namespace}/{queue_id}:{step}"


def registration_id(namespace: str, queue_id: str, step: int) -> str:
    """The id under which a checkpoint is registered on its source queue."""
    return f"rollout-checkpoint:{namespace}/{queue_id}:{step}"


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step is an int >= 0, got {step!r}")
    return step


class Checkpointer:
    """Saves the joint checkpoints of one running job into ``directory`` (the physical
    save directory: the job's ``--save`` or its branch) (module docstring).

    ``logical_root``: the save root holding ``rollout/current.json`` (default
    ``directory``); ``fs``: the ``Filesystem`` (default the builder's store's)."""

    def __init__(self, directory: str, *, controller: Any, builder: Any,
                 logical_root: str | None = None, fs: Filesystem | None = None) -> None:
        self.directory = os.path.abspath(directory)
        self.root = os.path.abspath(logical_root or directory)
        self.controller = controller
        self.builder = builder
        self.store = builder.store
        self.fs: Filesystem = fs if fs is not None else self.store.fs
        coord = controller.coordinator
        self.namespace, self.queue_id = coord.namespace, coord.queue_id
        self._registered: list[str] = []  # registrations on the source queue, oldest first

    # --- save -----------------------------------------------------------------------------
    def save(self, step: int, save_model: SaveModel) -> dict[str, Any]:
        """Save step ``step`` jointly (module docstring); returns the commit marker."""
        step = check_step(step)
        if not callable(save_model):
            raise TypeError(f"save_model must be callable(model_dir) -> {{'files', "
                            f"'optimizer', 'rng'}}, got {type(save_model).__name__}")
        marker_path = rollout_file(self.directory, "committed", step)
        if self.fs.exists(marker_path):  # before anything is written
            raise CheckpointExists(f"{marker_path} exists: step {step} is committed already "
                                   "and a committed checkpoint is never overwritten (save "
                                   "another step, or restore into a new branch)")
        self._check_current()
        paths, dirs, optimizer, rng = self._save_model(step, save_model)
        owner = checkpoint_owner(self.namespace, self.queue_id, step)
        reg = registration_id(self.namespace, self.queue_id, step)
        # Until the marker, five parts are independent, each durable on its own: the
        # model's files, the staged trackers, the two state files, the retention under
        # the owner and the registration on the queue.  Their syncs overlap on threads (a
        # save costs its sync latencies) while this thread reads the rollout state and
        # retains.
        futures: list[Any] = []  # in the order of _MODEL, _TRACKERS, _STATES, _REGISTRATION
        staged: list[RecordSetRef] = []  # the registration's publications, once known
        trackers: list[tuple[str, str]] = []  # the staged trackers (temporary, final)
        try:
            with concurrent.futures.ThreadPoolExecutor(
                    4, thread_name_prefix="straw.rollout checkpoint") as pool:
                try:
                    futures.append(pool.submit(self._model_durable, paths, dirs))
                    # the trackers' content, fsynced under temporary names nothing reads:
                    # after the marker only their renames and directory fsyncs are left
                    futures.append(pool.submit(self._stage_trackers, step))
                    queue_state, builder_state, refs = self._rollout_state(step)
                    body = canonical(builder_state)  # encoded once: file and registration
                    futures.append(pool.submit(self._write_states, step, {
                        "queue_state": canonical(queue_state), "builder_state": body}))
                    futures.append(pool.submit(self._register, reg, body,
                                               builder_state["scan_cursor"]))
                    self.store.retain(owner, refs)  # RL7: before the marker names them
                except BaseException:
                    values = _results(futures)[0]
                    staged, trackers = _part(values, _REGISTRATION), _part(values, _TRACKERS)
                    raise
                values, error = _results(futures)
                staged, trackers = _part(values, _REGISTRATION), _part(values, _TRACKERS)
                if error is not None:
                    raise error
                model, _, states, _ = values
            files = {**model, **states}
            marker = {"version": VERSION, "step": step, "weight_version": step + 1,
                      "files": files, "optimizer": optimizer, "rng": rng,
                      "pool": self.store.pool_id, "run_id": self.store.run_id,
                      "queue": {"namespace": self.namespace, "queue_id": self.queue_id},
                      "owner": owner, "registration": reg}
            # RL9: the marker last, after every component above is durable
            write_json(self.fs, marker_path, marker)
        except BaseException:
            self._undo(step, marker_path, owner, reg, trackers, staged)
            raise
        self._supersede(reg, trackers, staged)
        return marker

    def _undo(self, step: int, marker_path: str, owner: str, reg: str,
              trackers: Sequence[tuple[str, str]], staged: Sequence[RecordSetRef]) -> None:
        """What a failed save wrote, taken back: its staged trackers, its state files
        (unless its marker is durable), its owner and registration, its staging."""
        try:
            discard_staged(self.fs, [tmp for tmp, _ in trackers])
            if not self.fs.exists(marker_path):
                # this step's state files without their marker would refuse the step
                # later (UncommittedSnapshot): a failed save leaves none behind
                discard_staged(self.fs, [rollout_file(self.directory, kind, step)
                                         for kind in ("queue_state", "builder_state")])
            self._forget(owner, reg)
        finally:
            if staged:  # not kept by a registration any more: reclaimable
                self.store.release_publications(staged)

    def _supersede(self, reg: str, trackers: list[tuple[str, str]],
                   staged: Sequence[RecordSetRef]) -> None:
        """After the marker: the trackers are installed (only now: they may lag, never
        lead), while the earlier registrations are released (this one supersedes them;
        their owners stay) and the registration's publications unstaged (the queue keeps
        them)."""
        with concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="straw.rollout checkpoint") as pool:
            installed = pool.submit(self._install_trackers, trackers)
            try:
                for old in self._registered:
                    self.controller.coordinator.release_checkpoint(old)
                self._registered = [reg]
                self.store.release_publications(staged)
            finally:
                installed.result()

    def _write_states(self, step: int, states: Mapping[str, bytes]) -> dict[str, Any]:
        """The state files (``kind -> canonical JSON``), then one fsync of their directory
        (RL9 needs them durable before the marker, not each before the other)."""
        names = {os.path.basename(rollout_file(self.directory, kind, step)): data
                 for kind, data in states.items()}
        write_files(self.fs, os.path.join(self.directory, ROLLOUT), names)
        return {os.path.join(ROLLOUT, name): {"size": len(data),
                                              "sha256": hashlib.sha256(data).hexdigest()}
                for name, data in names.items()}

    def _stage_trackers(self, step: int) -> list[tuple[str, str]]:
        """The trackers of step ``step`` (the branch's, the logical root's, then
        ``current.json``: the order they are installed in), each written and fsynced under
        a temporary name (``stage_file``): ``[(temporary, final path)]``."""
        files = [(os.path.join(self.directory, TRACKER), tracker_bytes(step))]
        if self.root != self.directory:
            files.append((os.path.join(self.root, TRACKER), tracker_bytes(step)))
        files.append((os.path.join(self.root, ROLLOUT, CURRENT), canonical(
            {"version": VERSION, "directory": self.directory, "tracker": str(step)})))
        out: list[tuple[str, str]] = []
        try:
            for path, data in files:
                self.fs.makedirs_durable(os.path.dirname(path))
                out.append((stage_file(self.fs, path, data), path))
        except BaseException:
            discard_staged(self.fs, [tmp for tmp, _ in out])
            raise
        return out

    def _install_trackers(self, trackers: list[tuple[str, str]]) -> None:
        """After the marker, in order: each tracker renamed into place and its name made
        durable before the next (a crash between them still selects the committed step:
        resolution reads markers, not trackers alone)."""
        for tmp, path in trackers:
            install_staged(self.fs, tmp, path)

    def _check_current(self) -> None:
        path = os.path.join(self.root, ROLLOUT, CURRENT)
        if not self.fs.exists(path):
            return
        current = read_json(self.fs, path, "current branch file")
        if isinstance(current, dict) and current.get("directory") not in (None, self.directory):
            raise BranchChanged(f"{path} names the active branch {current.get('directory')!r}, "
                                f"not this job's {self.directory!r}: another job moved it; "
                                "stop one of them")

    def _forget(self, owner: str, reg: str) -> None:
        """Undo the retention of a save that failed (no marker names it)."""
        try:
            self.controller.coordinator.release_checkpoint(reg)
        finally:
            self.store.release(owner)

    def _save_model(self, step: int, save_model: SaveModel
                    ) -> tuple[list[str], set[str], bool, bool]:
        """The user's save, called here (its thread is the trainer's) and its result
        checked: (the model's file paths, the directories holding their new names,
        optimizer, rng).  ``_model_durable`` then makes them durable."""
        where = model_dir(self.directory, step)
        # the new directories' names become durable with the files' (one fsync per
        # directory, each before the marker), not one by one now
        created = self.fs.makedirs(where)
        result = save_model(where)
        if not isinstance(result, Mapping) or not isinstance(result.get("files"), (list, tuple)) \
                or not result["files"]:
            raise ValueError(f"save_model must return {{'files': [paths relative to {where}], "
                             f"'optimizer': bool, 'rng': bool}} naming at least one file, got "
                             f"{result!r}")
        for flag in ("optimizer", "rng"):
            if not isinstance(result.get(flag), bool):
                raise ValueError(f"save_model's result must say whether {flag} state is "
                                 f"included ({flag!r}: True or False), got {result.get(flag)!r}")
        # every directory holding a new name: the parents of the directories created,
        # the model directory's parent (it may have been created by the user), and each
        # directory of a model file up to the model directory
        dirs: set[str] = {os.path.dirname(d) for d in created} | {self.directory}
        paths = []
        for rel in result["files"]:
            if not isinstance(rel, str) or not rel or os.path.isabs(rel) \
                    or ".." in rel.split("/"):
                raise ValueError(f"save_model named {rel!r}: a model file is a path relative "
                                 f"to {where}, inside it")
            path = os.path.join(where, rel)
            if not self.fs.exists(path):
                raise ComponentChanged(f"save_model named {path}, which does not exist: "
                                       "return the files it wrote")
            paths.append(path)
            d = os.path.dirname(path)
            while len(d) >= len(where):
                dirs.add(d)
                d = os.path.dirname(d)
        return paths, dirs, result["optimizer"], result["rng"]

    def _model_durable(self, paths: list[str], dirs: set[str]) -> dict[str, Any]:
        """RL9: the user's own writes durable before the marker (each file fsynced, then
        each directory holding a new name, deepest first); each file sized, and hashed
        when small.  Returns the marker's entries."""
        files: dict[str, Any] = {}
        for path in paths:
            size = self.fs.stat(path).size
            fd = self.fs.open(path)
            try:
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
            entry: dict[str, Any] = {"size": size}
            if size <= SMALL_FILE:
                entry["sha256"] = hashlib.sha256(self.fs.read_file(path)).hexdigest()
            files[os.path.relpath(path, self.directory)] = entry
        for d in sorted(dirs, key=len, reverse=True):  # deepest first
            self.fs.fsync_dir(d)
        return files

    # --- the rollout state (live, never history) -------------------------------------------
    def _rollout_state(self, step: int) -> tuple[dict[str, Any], dict[str, Any],
                                                 list[RecordSetRef]]:
        coord = self.controller.coordinator
        builder = self.builder
        # the cursor first: tasks admitted after it are admitted again from it on restore
        producer = coord.producer_state(PRODUCER_ID)
        cursor = cursor_from_producer_state(producer)
        limit = cursor.sample_group_index if cursor is not None else 0
        builder.backlog()  # scan the log to its end
        s1 = builder.state_entries()[0]["scan_cursor"]
        tasks: dict[str, TaskSpec] = {}
        for spec in coord.pending_tasks(task_prefix=PROMPT_PREFIX):
            tasks[spec.task_id] = spec
        for lease in coord.outstanding_reads():  # leased tasks come back pending
            if lease.task_id.startswith(PROMPT_PREFIX) and lease.task_id not in tasks:
                status = coord.task_status(lease.task_id)
                if status is not None and status["state"] == "leased":
                    tasks[lease.task_id] = TaskSpec.from_dict(status["spec"])
        builder.backlog()
        # the backlog as its entries: written as columns, their references retained as
        # they are (no dict per group built, then parsed back)
        state, backlog = builder.state_entries()
        scan = state["scan_cursor"]
        for receipt in commits_between(coord, s1, scan):  # accepted meanwhile: in the backlog
            tasks.pop(receipt.task_id, None)
        kept = [t for t in tasks.values()
                if int(t.metadata.get("group_index", -1)) < limit]
        planned = self._planned(state, backlog, scan)
        # each payload once (tasks of one prompt share its input); only live ones: the
        # kept tasks' inputs, the backlog's groups, the planned batches' groups
        refs = dict.fromkeys(t.input_ref for t in kept if t.input_ref is not None)
        refs.update(dict.fromkeys(e.ref for e in backlog))
        refs.update(dict.fromkeys(RecordSetRef.from_dict(g["ref"])
                                  for b in planned for g in b["groups"]))
        queue_state = {"version": VERSION, "step": step, "run_id": self.store.run_id,
                       "pool": self.store.pool_id,
                       "queue": {"namespace": self.namespace, "queue_id": self.queue_id},
                       "producer_state": producer,
                       "tasks": [_task_dict(t) for t in kept]}
        builder_state = {"version": BUILDER_STATE_VERSION, "step": step,
                         "run_id": self.store.run_id, "consumer_id": builder.consumer_id,
                         "scan_cursor": scan, "mix": state["mix"],
                         "backlog": backlog_columns(backlog), "planned": planned}
        return queue_state, builder_state, list(refs)

    def _planned(self, state: Mapping[str, Any], backlog: Sequence[Accepted], scan: int
                 ) -> list[dict[str, Any]]:
        """The collections of the builder's consumer not finished yet, in commit order:
        each with its groups and mix states (read from the collection records at
        positions from the processed cursor to S: unfinished work only)."""
        coord = self.controller.coordinator
        done = set(state["processed_positions"])
        # positions known not to be collections are not read: the processed ones, the
        # backlog's own groups (a restored group's position is a rank, not a commit of
        # this queue: it excludes nothing) and the quarantined groups; what is left is
        # the collections and the groups of their batches (unfinished work), so the
        # commits read do not grow with the backlog
        known = done | {e.position for e in backlog if not e.restored}
        known |= {q["position"] for q in state["quarantined"]}
        out = []
        receipts = [r for lo, hi in gaps(state["processed_cursor"], scan, known)
                    for r in commits_between(coord, lo, hi)]
        for receipt in receipts:
            if not receipt.task_id.startswith(COLLECTION_PREFIX) or receipt.position in done:
                continue
            view = coord.get_batch("batch:" + receipt.commit_id)
            if view is not None and view["finished"]:
                continue
            body = json_record(self.store, receipt.result_ref, receipt.task_id)
            out.append({"rollout_id": body["rollout_id"], "commit_id": receipt.commit_id,
                        "position": receipt.position, "groups": body["groups"],
                        "mix_before": body["mix_before"], "mix_after": body["mix_after"]})
        return out

    def _register(self, reg: str, body: bytes, scan: int) -> list[RecordSetRef]:
        """Register the checkpoint on the source queue with cursor S: results from S on
        stay readable (for a salvage) until a later checkpoint supersedes it.  Returns
        the registration's publications, still staged (the caller unstages them: the
        queue keeps them from the registration on).  ``body``: the builder state's
        canonical JSON, ``scan``: its cursor S."""
        state_ref = self.store.publish(
            [Record("builder-checkpoint", body, "json.v1")],
            submission_id=f"{reg}:state:{hashlib.sha256(body).hexdigest()[:32]}")
        record = {"version": 1, "checkpoint_id": reg, "consumer_state": state_ref.to_dict(),
                  "batch_ids": [], "training_dependencies": []}
        data = canonical(record)
        ref = self.store.publish([Record("checkpoint", data, "json.v1")],
                                 submission_id=f"{reg}:{hashlib.sha256(data).hexdigest()[:32]}",
                                 dependencies=[state_ref])
        coordinator = self.controller.coordinator
        try:
            coordinator.register_checkpoint(reg, ref, cursor=scan)
        except IdempotencyConflict:
            # A save of this step that was killed after its registration and before its
            # marker (``save`` found no marker) left that registration on the queue: no
            # marker names it, so nothing can restore it (RL9).  The resumed job saves the
            # step again with the state it has now: the orphan goes, this one registers.
            coordinator.release_checkpoint(reg)
            coordinator.register_checkpoint(reg, ref, cursor=scan)
        return [ref, state_ref]

    # --- release ----------------------------------------------------------------------------
    def release(self, step: int) -> None:
        """Stop keeping step ``step``'s payloads: its owner is released (and its queue
        registration if still held); the marker stays, but the checkpoint can no longer be
        restored once a collection reclaims what only it kept."""
        step = check_step(step)
        reg = registration_id(self.namespace, self.queue_id, step)
        if reg in self._registered:
            self.controller.coordinator.release_checkpoint(reg)
            self._registered.remove(reg)
        self.store.release(checkpoint_owner(self.namespace, self.queue_id, step))


def _results(futures: list[Any]) -> tuple[list[Any], BaseException | None]:
    """Every future's result (None for one that raised) once all are done, and the
    first error."""
    values, error = [], None
    for f in futures:
        try:
            values.append(f.result())
        except BaseException as e:  # noqa: BLE001 - returned: the caller raises it
            values.append(None)
            error = error or e
    return values, error


# the parts of a save before its marker, in the order they are submitted
_MODEL, _TRACKERS, _STATES, _REGISTRATION = range(4)


def _part(values: list[Any], index: int) -> Any:
    """What part ``index`` of a save returned (an empty list if it did not run, or
    raised): the registration's publications, the staged trackers."""
    return (values[index] if len(values) > index else None) or []


_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(TaskSpec))


def _task_dict(task: TaskSpec) -> dict[str, Any]:
    # shallow (dataclasses.asdict deep-copies every reference: 0.4 ms a task)
    d = {name: getattr(task, name) for name in _TASK_FIELDS}
    d["input_ref"] = None if task.input_ref is None else task.input_ref.to_dict()
    d["metadata"] = dict(task.metadata)
    return d


def task_from_dict(value: Mapping[str, Any]) -> TaskSpec:
    return TaskSpec.from_dict(value)


def check_builder_state(value: Any, path: str) -> dict[str, Any]:
    """A builder state file's value, of a version this straw reads
    (``BUILDER_STATE_VERSIONS``: 2, the backlog as columns, or 1, one object per group),
    else ``UnsupportedCheckpoint`` naming the file, its version and the fix."""
    return check_version(value, path, "builder state", BUILDER_STATE_VERSIONS)


def saved_backlog(state: Mapping[str, Any], *, path: str = "the builder state file",
                  restored_from: int | None = None,
                  leave_out: Collection[str] = ()) -> list[Accepted]:
    """The backlog entries of a builder state file's value (``check_builder_state``d;
    ``path`` names it in errors), in their saved order; with ``restored_from``: those whose
    commit id is not in ``leave_out``, in selection order, as restored entries ranked from
    ``restored_from`` on (``builder.backlog_of_columns``).  A malformed backlog is
    ``CorruptData``, a reference not of ours ``InvalidReference``/``UnsupportedSchema``."""
    value = state["backlog"]
    try:
        if state["version"] == BUILDER_STATE_VERSION:
            return backlog_of_columns(value, restored_from=restored_from,
                                      leave_out=leave_out)
        # version 1: one object per group
        if not isinstance(value, list):
            raise CorruptData(f"the backlog is not a list of groups: got "
                              f"{type(value).__name__}")
        try:
            entries = [Accepted.from_dict(e) for e in value]
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptData(f"the backlog holds a malformed entry: {type(e).__name__}: "
                              f"{e}") from None
    except CorruptData as e:
        raise CorruptData(f"{path}: {e}; the checkpoint cannot be restored as it is: select "
                          "another checkpoint") from None
    if restored_from is None:
        return entries
    rest = sorted((e for e in entries if e.commit_id not in leave_out), key=Accepted.order)
    return restored_backlog(rest, start=restored_from)


def commits_between(coord: Any, start: int, stop: int | None) -> list[Any]:
    """The commit receipts at positions ``start..stop-1`` (None: to the durable end)."""
    out: list[Any] = []
    cursor = start
    while stop is None or cursor < stop:
        page = coord.read_commits(cursor, _PAGE if stop is None else min(_PAGE, stop - cursor))
        out += [r for r in page.commits if stop is None or r.position < stop]
        if page.cursor == cursor:
            break
        cursor = page.cursor
    return out


def gaps(start: int, stop: int, known: set[int]) -> list[tuple[int, int]]:
    """The maximal ranges ``[lo, hi)`` of ``start..stop-1`` holding no position of
    ``known``, in order."""
    out, lo = [], start
    for p in sorted(p for p in known if start <= p < stop):
        if p > lo:
            out.append((lo, p))
        lo = p + 1
    if lo < stop:
        out.append((lo, stop))
    return out


def json_record(store: Any, ref: RecordSetRef, what: str) -> Any:
    records = list(store.read(ref))
    if len(records) != 1 or records[0].codec != "json.v1":
        raise ComponentChanged(f"the record of {what} {ref!r} is not one json.v1 record")
    return json.loads(bytes(records[0].payload))


__all__ = ["Checkpointer", "SaveModel", "checkpoint_owner", "registration_id", "check_step",
           "task_from_dict", "commits_between", "gaps", "json_record", "OWNER_PREFIX",
           "check_builder_state", "saved_backlog"]
