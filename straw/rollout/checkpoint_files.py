"""The checkpoint directory's names and the one way its files are written and read.

Layout of a *physical* save directory ``D`` (the job's ``--save``, or a branch of it,
``<save>/branches/<id>``)::

    D/iter_<k:07d>/...                  the model's own files for step k (the user's save)
    D/latest_checkpointed_iteration.txt the tracker: the newest committed step (an int)
    D/rollout/queue_state_<k>.json      live tasks, the dataset cursor (checkpoint.py)
    D/rollout/builder_state_<k>.json    the batch builder's backlog (as columns, version 2)
                                        and planned batches
    D/rollout/committed_<k>.json        the commit marker, written LAST (RL9)
    D/rollout/branch.json               this branch: its parent {directory, step}, queue
    D/rollout/seeded.json               this branch's queue is seeded and its builder's
                                        restored state durable (a restart recovers it)
    D/rollout/dataset_cursor_<k>.json   optional: a cursor for a model without snapshot

and of the *logical* save root ``L`` (the ``--save`` the user gives; ``D`` is ``L`` or
one of its branches)::

    L/rollout/current.json              {version, directory: the active D, tracker}
    L/rollout/LOCK                      one controller per save directory (savelock.py)
    L/latest_checkpointed_iteration.txt the logical tracker (edit it to select a step)

Every write is a crash-safe step through ``straw.fs.Filesystem`` (write a temporary
file, fsync it, rename it into place, fsync the directory: ``write_file_durable``), so a
crash campaign on SimFS sees each file either absent or whole.  Files written together
into one directory (``write_files``) share that directory's fsync: each is whole
once renamed, and all of them are durable after the one fsync of their directory, which
comes before anything that names them (the commit marker, RL9)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from straw.checks import short_repr
from straw.errors import storage_error
from straw.fs import Filesystem

from .checkpoint_errors import UnsupportedCheckpoint

VERSION = 1
# the builder state file's own version: 2 holds the backlog as columns (the builder's
# stored form, ``builder.backlog_columns``) instead of one object per group, which a
# restore of 10,000 groups spent a fifth of its time parsing; version 1 files (written
# before) are still read (``checkpoint.saved_backlog``)
BUILDER_STATE_VERSION = 2
BUILDER_STATE_VERSIONS = (1, BUILDER_STATE_VERSION)
ROLLOUT = "rollout"
TRACKER = "latest_checkpointed_iteration.txt"
CURRENT = "current.json"
BRANCH = "branch.json"
BRANCHES = "branches"
SEEDED = "seeded.json"  # written once a branch's queue holds its restored state
# files at most this large get a sha256 in the commit marker; larger ones (model weights)
# their size (hashing gigabytes at every save would cost what the model save costs)
SMALL_FILE = 1 << 20
_COMMITTED = re.compile(r"committed_(\d+)\.json$")


def model_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"iter_{step:07d}")


def rollout_file(directory: str, kind: str, step: int) -> str:
    """``D/rollout/<kind>_<step>.json`` (kind: queue_state, builder_state, committed,
    dataset_cursor)."""
    return os.path.join(directory, ROLLOUT, f"{kind}_{step}.json")


def committed_steps(fs: Filesystem, directory: str) -> list[int]:
    """The steps with a commit marker in ``directory``, ascending."""
    where = os.path.join(directory, ROLLOUT)
    if not fs.exists(where):
        return []
    steps = []
    for name in fs.listdir(where):
        m = _COMMITTED.fullmatch(name)
        if m:
            steps.append(int(m.group(1)))
    return sorted(steps)


def step_of_marker(path: str) -> int | None:
    """The step of a commit marker path ``.../rollout/committed_<k>.json``, else None."""
    m = _COMMITTED.fullmatch(os.path.basename(path))
    if m is None or os.path.basename(os.path.dirname(path)) != ROLLOUT:
        return None
    return int(m.group(1))


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def write_json(fs: Filesystem, path: str, value: Any) -> bytes:
    """Write ``value`` as canonical JSON, durably (temp, fsync, rename, fsync dir);
    returns the bytes written (the caller hashes them: no second read)."""
    data = canonical(value)
    try:
        fs.makedirs_durable(os.path.dirname(path))
        fs.write_file_durable(path, data)  # its temporary removed if it fails
    except OSError as e:
        raise storage_error(e, f"cannot write {path}") from e
    return data


def write_files(fs: Filesystem, directory: str, files: Mapping[str, bytes]) -> None:
    """Write each ``name -> data`` of ``files`` (canonical JSON, ``canonical``) into
    ``directory``: each a temporary file, fsynced, renamed into place; then ONE fsync of
    the directory makes every new name durable (D1) -- a crash before it leaves each
    file absent or whole, never torn."""
    for name in files:
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"write_files writes files directly in {directory}, got the "
                             f"name {name!r}")
    installed: list[str] = []
    where = directory
    try:
        fs.makedirs_durable(directory)
        for name, data in files.items():
            where = os.path.join(directory, name)
            fs.rename(stage_file(fs, where, data), where)
            installed.append(where)
        where = directory
        fs.fsync_dir(directory)  # the names, all at once
    except BaseException as e:
        discard_staged(fs, installed)  # none or all: a failed call leaves none behind
        if isinstance(e, OSError):
            raise storage_error(e, f"cannot write {where}") from e
        raise


def stage_file(fs: Filesystem, path: str, data: bytes) -> str:
    """Write ``data`` to a new temporary file next to ``path`` and fsync it; returns the
    temporary's path.  Nothing reads a temporary (every reader opens exact names), so a
    staged file changes nothing until ``install_staged`` renames it into place: a save
    stages its trackers before its marker and installs them after it (only the renames
    and the directories' fsyncs are left after the marker)."""
    try:
        return fs.stage_file(path, data)  # its temporary removed if it fails
    except OSError as e:
        raise storage_error(e, f"cannot write {path}") from e


def install_staged(fs: Filesystem, tmp: str, path: str) -> None:
    """Rename the staged ``tmp`` (``stage_file``) to ``path`` and make the name durable."""
    fs.rename(tmp, path)
    fs.fsync_dir(os.path.dirname(path))


def discard_staged(fs: Filesystem, tmps: list[str]) -> None:
    """Remove staged files that will not be installed (best effort: a temporary left by
    a crash is never read)."""
    for tmp in tmps:
        try:
            fs.unlink(tmp)
        except OSError:
            pass


def read_json(fs: Filesystem, path: str, what: str) -> Any:
    """A JSON file's value; a file that is not JSON is ``UnsupportedCheckpoint`` naming
    it (a half-written file never exists: writes rename whole files into place)."""
    return parse_json(fs.read_file(path), path, what)


def parse_json(data: bytes, path: str, what: str) -> Any:
    """The value of ``data``, the content of the file ``path`` (``read_json``'s rule)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # RecursionError: nested past the parser
        raise UnsupportedCheckpoint(f"{what} {path} is not JSON ({e}): it was not written "
                                    "by straw; restore it from a backup or select another "
                                    "checkpoint") from None


def check_version(value: Any, path: str, what: str,
                  versions: tuple[int, ...] = (VERSION,)) -> dict[str, Any]:
    """``value`` if it is a dict of one of ``versions``, else ``UnsupportedCheckpoint``
    naming the file, its version and the versions this straw reads."""
    got = value.get("version") if isinstance(value, dict) else type(value).__name__
    if not isinstance(value, dict) or isinstance(got, bool) or got not in versions:
        readable = " or ".join(map(str, versions))
        raise UnsupportedCheckpoint(f"{what} {path} has version {got!r}; this straw reads "
                                    f"version {readable}: upgrade straw or select a "
                                    "checkpoint it wrote")
    return value


_NOT_OURS = ("it was not written by straw (or was edited): restore it from a backup or select "
             "another checkpoint")


def check_fields(value: Any, path: str, what: str, fields: Mapping[str, Any],
                 at: str = "") -> dict[str, Any]:
    """``value``, the object at ``at`` (a key path, e.g. ``['parent']``; the file's top
    level by default) of the file ``path``, if it is a dict whose every field of ``fields``
    is of its type or tuple of types (a missing field counts as None, a bool as no int);
    else ``UnsupportedCheckpoint`` naming the file and the field.  What a start reads is
    checked so before it writes anything: a file straw did not write (or one edited) is
    refused whole, never half-way through a restore with a bare KeyError."""
    if not isinstance(value, dict):
        raise UnsupportedCheckpoint(f"{what} {path}: {at or 'its value'} is a "
                                    f"{type(value).__name__}, not an object; {_NOT_OURS}")
    for name, kind in fields.items():
        kinds = kind if isinstance(kind, tuple) else (kind,)
        got = value.get(name)
        if not isinstance(got, kinds) or (isinstance(got, bool) and bool not in kinds):
            names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            shown = short_repr(got) if name in value else "missing"
            raise UnsupportedCheckpoint(f"{what} {path}: {at}[{name!r}] is {shown}, not of "
                                        f"type {names}; {_NOT_OURS}")
    return value


def write_tracker(fs: Filesystem, directory: str, step: int) -> None:
    fs.makedirs_durable(directory)
    fs.write_file_durable(os.path.join(directory, TRACKER), tracker_bytes(step))


def tracker_bytes(step: int) -> bytes:
    """A tracker's content: the step, as text."""
    return str(step).encode()


def read_tracker(fs: Filesystem, directory: str) -> int | None:
    """The tracker's step, None if there is none; a tracker that is not an int is a
    ``ValueError`` naming it."""
    path = os.path.join(directory, TRACKER)
    if not fs.exists(path):
        return None
    text = fs.read_file(path).decode(errors="replace").strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{path} holds {text!r}, not a step number: write the step to "
                         "load (an int) or remove the file") from None


__all__ = ["VERSION", "BUILDER_STATE_VERSION", "BUILDER_STATE_VERSIONS",
           "ROLLOUT", "TRACKER", "CURRENT", "BRANCH", "BRANCHES", "SEEDED",
           "SMALL_FILE",
           "model_dir", "rollout_file", "committed_steps", "step_of_marker", "canonical",
           "write_json", "write_files", "read_json", "parse_json", "check_version",
           "check_fields",
           "write_tracker", "read_tracker", "tracker_bytes", "stage_file", "install_staged",
           "discard_staged"]
