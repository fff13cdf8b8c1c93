"""Which checkpoint a starting job loads, into which directory, in which mode (issue 15,
item 2).  Reading only: resolution writes nothing (``restore.open_job`` does, under the
save directory's lock, after checking ``current.json`` did not change meanwhile).

``resolve_checkpoint(save, load=None, step=None)``:

* ``load`` is an exact commit file ``<D>/rollout/committed_<k>.json``: step k of ``D``
  (``step``, if given, must be k).  The only way to reach an *abandoned future* (a step
  of a branch beyond the point another branch left it).
* ``load`` omitted and ``<save>/rollout/current.json`` exists: ``load = save``, the
  **automatic resume** of the active branch.
* ``load`` a directory: a logical root (with ``current.json``: its active branch) or a
  physical branch directory.  The step: ``step`` if given; else the logical tracker if it
  was **edited** (it differs from ``current.json``'s ``tracker``) to a step no newer than
  the branch's newest commit (a tracker naming a newer step is the framework's own write
  of a save interrupted before its commit: never followed, with a warning); else the
  newest commit of the branch; a branch without commits of its own starts from its
  parent's step.
* **Ancestry**: step s is looked up in the branch; if absent it is followed into the
  parent only when ``s <= parent.step`` (the branch point): steps the parent took after
  the branch left it are that branch's abandoned future, never reached by ancestry.
* A step with a model (``iter_<k:07d>``) but no commit marker and no queue snapshot:
  mode ``empty`` (an empty queue; the dataset cursor of ``rollout/dataset_cursor_<k>.json``
  if that file exists, else offset 0 with a warning).  A queue snapshot without its marker
  is ``UncommittedSnapshot``; no model is ``MissingModel``.

**The mode rule** (``Resolution.mode``):

* ``new``: nothing to load (no ``load``, no active branch);
* ``recover``: the automatic resume of a branch that has no commit of its own yet (a
  crash before its first checkpoint): its own queue is reopened (journal recovery);
* ``salvage``: the automatic resume selected the NEWEST commit of the active branch (a
  crash after it): everything ``exact`` restores plus every group accepted after it and
  not trained at or before it, from the dead run's queue;
* ``exact``: any other selection (an explicit step, an edited tracker, an exact commit
  file, another branch, a rollback): the checkpoint's saved state, nothing after it.

The destination: the save directory itself when it holds no run yet, else a new branch
``<save>/branches/<id>`` (``id`` the new run's nonce, also its queue id).  Every
commit marker is validated here (version, every component's size and sha256,
optimizer/RNG state); its run and pool are checked against the store at ``open_job``."""

from __future__ import annotations

import hashlib
import os
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from straw.fs import Filesystem, PosixFS

from .checkpoint_errors import (
    ComponentChanged,
    MissingModel,
    NoCheckpoint,
    StateOmitted,
    UncommittedSnapshot,
    UnsupportedCheckpoint,
)
from .checkpoint_files import (
    BRANCH,
    BRANCHES,
    CURRENT,
    ROLLOUT,
    SEEDED,
    TRACKER,
    check_fields,
    check_version,
    committed_steps,
    model_dir,
    read_json,
    read_tracker,
    rollout_file,
    step_of_marker,
)
from .data_source import Cursor

NEW, RECOVER, SALVAGE, EXACT, EMPTY = "new", "recover", "salvage", "exact", "empty"
_MAX_ANCESTRY = 1000  # a cycle of branch.json parents is refused, not followed forever
_NONE = type(None)


@dataclass(frozen=True)
class Resolution:
    """What ``open_job`` starts: ``mode`` (module docstring), ``root`` (the logical save
    root), ``directory`` (where this run writes: ``root`` or a new branch), ``branch_id``
    (the run's nonce: its queue id), ``source`` (the physical directory of the loaded
    checkpoint), ``step`` (loaded step, None for new), ``marker`` (the validated commit
    marker), ``parent`` (``{"directory", "step"}`` for branch.json), ``current`` (the text
    of ``current.json`` seen, checked unchanged at start), ``dataset_cursor`` (empty mode),
    ``queue`` (recover mode: the branch's own queue), ``state_files`` (the bytes of the
    checkpoint's queue and builder state files, by path, as ``load_marker`` hashed them:
    the restore parses exactly what was checked, read once, with no window for the file
    to change in between)."""

    mode: str
    root: str
    directory: str
    branch_id: str
    source: str | None = None
    step: int | None = None
    marker: dict[str, Any] | None = None
    parent: dict[str, Any] | None = None
    current: bytes | None = None
    dataset_cursor: dict[str, Any] | None = None
    queue: dict[str, str] | None = None
    warnings: tuple[str, ...] = field(default=())
    state_files: Mapping[str, bytes] = field(default_factory=dict, repr=False,
                                             compare=False)

    @property
    def next_rollout_id(self) -> int:
        """The first rollout id this run trains: the loaded step + 1 (0 for a new run)."""
        return 0 if self.step is None else self.step + 1


def resolve_checkpoint(save: str, load: str | None = None, step: int | None = None, *,
                       fs: Filesystem | None = None, allow_partial_state: bool = False
                       ) -> Resolution:
    """Resolve (module docstring).  ``allow_partial_state``: accept a checkpoint saved
    without optimizer or RNG state (a fine-tune start, not an exact resume)."""
    fs = fs or PosixFS()
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"step must be None or an int >= 0, got {step!r}")
    if not isinstance(save, (str, os.PathLike)):
        raise TypeError(f"save must be a directory path, got {type(save).__name__}")
    root = os.path.abspath(save)
    current_path = os.path.join(root, ROLLOUT, CURRENT)
    current_text = fs.read_file(current_path) if fs.exists(current_path) else None
    current = _current(fs, current_path) if current_text is not None else None
    # resuming the active branch: no load, or load = save (the same thing said twice)
    auto = current is not None and (load is None or os.path.abspath(load) == root)
    if load is None and current is None:
        return _new_run(fs, root, current_path)
    load_path = root if load is None else os.path.abspath(load)

    marker_step = step_of_marker(load_path)
    if marker_step is not None:  # an exact commit file
        return _exact_marker(fs, root, load_path, marker_step, step, allow_partial_state,
                             current_text)

    if not fs.exists(load_path):
        raise NoCheckpoint(f"load directory {load_path} does not exist")
    load_current = current if load_path == root else (
        _current(fs, os.path.join(load_path, ROLLOUT, CURRENT))
        if fs.exists(os.path.join(load_path, ROLLOUT, CURRENT)) else None)
    branch = load_current["directory"] if load_current is not None else load_path
    chosen = step
    explicit = step is not None
    unseeded_mode = None
    notes: tuple[str, ...] = ()
    if chosen is None and load_current is not None:
        chosen, notes = _tracker_choice(fs, load_path, branch, load_current, auto)
        explicit = chosen is not None
    if chosen is None:
        own = committed_steps(fs, branch)
        if own:
            chosen = own[-1]
        else:
            uncommitted = _uncommitted(fs, root, branch, auto, current_text, notes)
            if isinstance(uncommitted, Resolution):
                return uncommitted
            chosen, unseeded_mode = uncommitted
    return _chosen(fs, root, branch, chosen, auto=auto, explicit=explicit,
                   unseeded_mode=unseeded_mode, allow_partial_state=allow_partial_state,
                   current_text=current_text, notes=notes)


def _new_run(fs: Filesystem, root: str, current_path: str) -> Resolution:
    """A start without ``load`` in a directory without a current branch: a new run,
    unless the directory holds a run's checkpoints (RL10)."""
    if _holds_commits(fs, root):
        # RL10: a run committed here never starts over (that drops its resume)
        raise ComponentChanged(
            f"{current_path} is missing, but {root} holds a run's checkpoints: the "
            "automatic start would begin a new run from dataset offset 0. Restore "
            f"{CURRENT} (from a backup), or resume explicitly with load={root!r} (the "
            "newest commit of this directory) or an exact rollout/committed_<k>.json")
    return Resolution(NEW, root, *_place(fs, root))


def _exact_marker(fs: Filesystem, root: str, load_path: str, marker_step: int,
                  step: int | None, allow_partial_state: bool, current_text: bytes | None
                  ) -> Resolution:
    """``load`` names an exact commit marker: that commit, restored exactly."""
    if step is not None and step != marker_step:
        raise ValueError(f"step {step} differs from the explicit commit marker {load_path} "
                         f"(step {marker_step}): give one of them")
    source = os.path.dirname(os.path.dirname(load_path))
    if not fs.exists(load_path):
        raise NoCheckpoint(f"{load_path} does not exist")
    files: dict[str, bytes] = {}
    marker = load_marker(fs, source, marker_step, allow_partial_state, keep=files)
    return Resolution(EXACT, root, *_place(fs, root), source, marker_step,
                      marker, {"directory": source, "step": marker_step}, current_text,
                      state_files=files)


def _uncommitted(fs: Filesystem, root: str, branch: str, auto: bool,
                 current_text: bytes | None, notes: tuple[str, ...]
                 ) -> Resolution | tuple[int, Any]:
    """A branch without a commit of its own: the resolution itself (its queue
    reopened, or a new run again), else the step to load (its model tracker's, or its
    branch point) and the mode of the start that crashed before its seed (or None)."""
    unseeded_mode = None
    info = _branch(fs, branch)
    queue, parent = info.get("queue"), info.get("parent")
    if auto and queue is not None and fs.exists(os.path.join(branch, ROLLOUT, SEEDED)):
        # a crash before this branch's first checkpoint: reopen its own queue; the
        # model restarts from the branch point, so do the rollout ids (the batches
        # the branch planned since are replayed from its queue, identical)
        return Resolution(RECOVER, root, branch, str(queue["queue_id"]), branch,
                          None if parent is None else int(parent["step"]), None,
                          parent, current_text, queue=dict(queue), warnings=notes)
    if auto and queue is not None and parent is None:
        # a new run that crashed before its queue was seeded: a new run again
        return Resolution(NEW, root, *_place(fs, root), current=current_text)
    if auto and queue is not None:
        unseeded_mode = info.get("mode")  # the start crashed before its seed: redo
    if parent is None:
        tracker = read_tracker(fs, branch)
        if tracker is None:
            raise NoCheckpoint(f"{branch} holds no committed checkpoint and no "
                               f"model tracker: nothing to load (start without "
                               "load, or name a step)")
        return tracker, unseeded_mode
    return int(parent["step"]), unseeded_mode


def _chosen(fs: Filesystem, root: str, branch: str, chosen: int, *, auto: bool,
            explicit: bool, unseeded_mode: Any, allow_partial_state: bool,
            current_text: bytes | None, notes: tuple[str, ...]) -> Resolution:
    """The resolution of step ``chosen`` of ``branch``: an empty checkpoint, an exact
    restore, or a salvage (the automatic resume of the branch's newest commit)."""
    found, kind = _find(fs, branch, chosen)
    if kind == EMPTY:
        cursor, notes = _empty(fs, found, chosen)
        return Resolution(EMPTY, root, *_place(fs, root), found, chosen, None,
                          {"directory": found, "step": chosen}, current_text,
                          dataset_cursor=cursor, warnings=notes)
    files: dict[str, bytes] = {}
    marker = load_marker(fs, found, chosen, allow_partial_state, keep=files)
    latest = committed_steps(fs, branch)
    mode = SALVAGE if (auto and not explicit and found == branch and latest
                       and latest[-1] == chosen) else EXACT
    if unseeded_mode == SALVAGE:
        mode = SALVAGE  # the interrupted start was a salvage of this same checkpoint
    return Resolution(mode, root, *_place(fs, root), found, chosen, marker,
                      {"directory": found, "step": chosen}, current_text, state_files=files,
                      warnings=notes)


def load_marker(fs: Filesystem, directory: str, step: int,
                allow_partial_state: bool = False,
                keep: dict[str, bytes] | None = None) -> dict[str, Any]:
    """The commit marker of ``step`` in ``directory``, with every component checked:
    present, same size, same sha256 (``ComponentChanged``), optimizer and RNG state
    included (``StateOmitted``), a version we read (``UnsupportedCheckpoint``).
    ``keep``: filled with the bytes of the step's queue and builder state files as they
    were hashed (``Resolution.state_files``)."""
    path = rollout_file(directory, "committed", step)
    marker = check_version(read_json(fs, path, "commit marker"), path, "commit marker")
    if marker.get("step") != step:
        raise ComponentChanged(f"{path} is the marker of step {marker.get('step')!r}, not "
                               f"{step}: it was moved or edited")
    if not allow_partial_state and not (marker.get("optimizer") and marker.get("rng")):
        raise StateOmitted(f"{path}: the checkpoint omitted optimizer or RNG state "
                           f"(optimizer {marker.get('optimizer')}, rng {marker.get('rng')}); "
                           "it cannot resume training exactly (pass allow_partial_state=True "
                           "to start from it anyway)")
    files = marker.get("files", {})
    if not isinstance(files, Mapping) or not all(
            isinstance(rel, str) and isinstance(info, Mapping) for rel, info in files.items()):
        raise ComponentChanged(f"{path}: its 'files' must map each component's path to its "
                               f"size and sha256, got {type(files).__name__}: the marker was "
                               "edited or damaged (restore it, or select another checkpoint)")
    for rel, info in sorted(files.items()):
        full = os.path.normpath(os.path.join(directory, rel))
        if not full.startswith(os.path.join(directory, "")):
            raise ComponentChanged(f"{path} lists {rel!r}, outside {directory}: refused")
        if not fs.exists(full):
            raise ComponentChanged(f"checkpoint component {full} of step {step} is missing "
                                   "(restore it, or select another checkpoint)")
        size = fs.stat(full).size
        if size != info.get("size"):
            raise ComponentChanged(f"checkpoint component {full} of step {step} changed: "
                                   f"{size} bytes, the marker says {info.get('size')}")
        kept = keep is not None and full in (rollout_file(directory, "queue_state", step),
                                              rollout_file(directory, "builder_state", step))
        if "sha256" in info or kept:
            data = fs.read_file(full)  # hashed, and for the state files parsed, as read
            if "sha256" in info and hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise ComponentChanged(f"checkpoint component {full} of step {step} "
                                       "changed: its sha256 differs from the marker's")
            if kept and len(data) != info.get("size"):
                raise ComponentChanged(f"checkpoint component {full} of step {step} changed "
                                       f"while it was read: {len(data)} bytes, the marker "
                                       f"says {info.get('size')}")
            if kept:
                assert keep is not None
                keep[full] = data
    return marker


def _current(fs: Filesystem, path: str) -> dict[str, Any]:
    value = check_version(read_json(fs, path, "current branch file"), path,
                          "current branch file")
    if not isinstance(value.get("directory"), str):
        raise ValueError(f"{path} names no directory: {value!r}")
    return value


def _branch(fs: Filesystem, directory: str) -> dict[str, Any]:
    """``directory``'s branch file ({} without one), the fields resolution follows
    checked (``UnsupportedCheckpoint`` naming it): a ``parent`` ``{directory, step}``, a
    ``queue`` ``{namespace, queue_id}`` and a ``mode``, each possibly None."""
    path = os.path.join(directory, ROLLOUT, BRANCH)
    if not fs.exists(path):
        return {}
    info = check_version(read_json(fs, path, "branch file"), path, "branch file")
    check_fields(info, path, "branch file",
                 {"parent": (dict, _NONE), "queue": (dict, _NONE), "mode": (str, _NONE)})
    if info.get("parent") is not None:
        check_fields(info["parent"], path, "branch file", {"directory": str, "step": int},
                     "['parent']")
    if info.get("queue") is not None:
        check_fields(info["queue"], path, "branch file", {"namespace": str, "queue_id": str},
                     "['queue']")
    return info


def _tracker_choice(fs: Filesystem, load_path: str, branch: str,
                    load_current: dict[str, Any], auto: bool
                    ) -> tuple[int | None, tuple[str, ...]]:
    """The step the model tracker selects (None: resolution goes on without it), and the
    notes of a tracker passed over.  A tracker that changed since ``current.json`` names
    the framework's newest model save.  RL10: selection never follows a save that died
    before its joint commit (seed 000): a tracker newer than the branch's newest commit,
    or, resuming automatically, any tracker of a branch with no commit yet, is passed over
    (resumed instead: the newest commit, or the run's own start).  Otherwise an edited
    tracker selects its step."""
    tracker = read_tracker(fs, load_path)
    if tracker is None or str(tracker) == str(load_current.get("tracker")):
        return None, ()
    own = committed_steps(fs, branch)
    if own and tracker > own[-1]:
        resumed = f"the newest commit ({own[-1]}) of {branch}"
    elif not own and auto:
        resumed = f"{branch}, which has no commit yet"
    else:
        return tracker, ()
    note = (f"{os.path.join(load_path, TRACKER)} names step {tracker}, newer than "
            f"{resumed}: that save was interrupted before its commit; resuming from "
            f"{'step ' + str(own[-1]) if own else 'the start of the run'} "
            f"(pass step={tracker} to start from its model instead)")
    warnings.warn(note, stacklevel=3)
    return None, (note,)


def _holds_commits(fs: Filesystem, root: str) -> bool:
    """Whether the save directory ``root`` or one of its branches holds a commit (a run
    that started but committed nothing may start again as new)."""
    if committed_steps(fs, root):
        return True
    branches = os.path.join(root, BRANCHES)
    names = fs.listdir(branches) if fs.exists(branches) else []
    return any(committed_steps(fs, os.path.join(branches, n)) for n in names)


def _find(fs: Filesystem, branch: str, step: int) -> tuple[str, str]:
    """Step ``step`` in ``branch``'s history: (directory, "exact" or "empty")."""
    directory, seen = branch, list[str]()
    while len(seen) < _MAX_ANCESTRY and directory not in seen:
        seen.append(directory)
        if fs.exists(rollout_file(directory, "committed", step)):
            return directory, EXACT
        for kind in ("queue_state", "builder_state"):
            if fs.exists(rollout_file(directory, kind, step)):
                raise UncommittedSnapshot(
                    f"{rollout_file(directory, kind, step)} exists without its commit marker "
                    f"(the save of step {step} was interrupted): it is never loaded and it "
                    "refuses an empty-queue start; select another step")
        model = model_dir(directory, step)
        if fs.exists(model):
            if not fs.listdir(model):
                raise MissingModel(f"the model checkpoint {model} of step {step} is empty")
            return directory, EMPTY
        parent = _branch(fs, directory).get("parent")
        if parent is None or step > int(parent["step"]):
            break  # beyond the branch point: another branch's abandoned future
        directory = str(parent["directory"])
    raise NoCheckpoint(f"no committed model/rollout checkpoint for step {step} in {branch}'s "
                       "branch history (ancestry is followed only up to each branch point: "
                       "load an abandoned future by its exact rollout/committed_<k>.json)")


def _empty(fs: Filesystem, directory: str, step: int) -> tuple[dict[str, Any] | None,
                                                              tuple[str, ...]]:
    path = rollout_file(directory, "dataset_cursor", step)
    if fs.exists(path):
        value = check_version(read_json(fs, path, "dataset cursor"), path, "dataset cursor")
        try:  # what the empty start's producer state is made of (restore.open_job)
            Cursor.from_dict(value.get("cursor"))
        except (TypeError, ValueError) as e:
            raise UnsupportedCheckpoint(f"dataset cursor {path}: {e}; restore it from a "
                                        "backup or select another checkpoint") from None
        return dict(value["cursor"]), ()
    note = (f"step {step} of {directory} has a model but no queue snapshot and no "
            f"{os.path.basename(path)}: the queue starts empty at dataset offset 0 (not an "
            "exact data replay)")
    warnings.warn(note, stacklevel=3)
    return None, (note,)


def _place(fs: Filesystem, root: str) -> tuple[str, str]:
    """(destination, nonce): the save root itself when it holds no run, else a new
    branch directory named by the new run's nonce."""
    occupied = fs.exists(os.path.join(root, ROLLOUT, CURRENT)) or fs.exists(
        os.path.join(root, ROLLOUT, BRANCH)) or (
        fs.exists(root) and any(n.startswith("iter_") for n in fs.listdir(root)))
    nonce = uuid.uuid4().hex[:12]
    return (os.path.join(root, BRANCHES, nonce) if occupied else root), nonce


__all__ = ["Resolution", "resolve_checkpoint", "load_marker", "NEW", "RECOVER", "SALVAGE",
           "EXACT", "EMPTY"]
