"""The rollout layer's owners, judged for ``straw.orphans``: who names a checkpoint's or an
archive's retention.

    checkpoint:<ns>/<queue>:<k>   a commit marker ``D/rollout/committed_<k>.json`` whose
                                  ``owner``, ``pool`` and ``run_id`` are its
    archive:<key>:<uuid>          an index ``*.straw.json`` whose ``storage_owner``,
                                  ``pool_id`` and ``run_id`` are its

Both files live outside the pool (a job's save directory; wherever an archive was saved),
so ``namers`` searches the directories an operator gives (by default the pool's parent,
where an archive's adjacent pool and a job's save directory usually sit): a walk bounded
in depth and entries that never follows a symbolic link and never enters the pool.

A retention the search found no file for is an *orphan* only when the search was complete
and nothing may still be about to name it:

* a checkpoint's owner is retained before its marker is written (RL7 before RL9), so
  while a controller of a save directory found is alive (its ``rollout/LOCK`` names a live
  process of this host, or one of another host) checkpoint owners nothing names are
  ``unknown``, not orphans;
* an archive's owner is retained only after its index is durable (its save keeps the data
  under a hold until then), so an archive owner without an index is an orphan: its index
  was deleted, or moved out of the directories searched (search there too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from straw.fs import Filesystem, PosixFS
from straw.orphans import NAMED, ORPHAN, UNKNOWN, Namer, process_alive, read_json
from straw.pool_view import check_pool

from .archive import OWNER_PREFIX as ARCHIVE_PREFIX
from .checkpoint import OWNER_PREFIX as CHECKPOINT_PREFIX
from .checkpoint_files import ROLLOUT
from .savelock import LOCK

INDEX_SUFFIX = ".straw.json"
_MARKER = re.compile(r"committed_\d+\.json$")
MAX_DEPTH = 6  # save directories and archives sit a few levels below the search roots
MAX_ENTRIES = 200_000  # directory entries looked at, all roots together
MAX_JSON_BYTES = 64 << 20  # an archive index of a very large rollout; markers are small


@dataclass
class Found:
    """What a search saw: owner name -> (run, pool id, file naming it), the save
    directories' live controllers, and whether it looked everywhere it was asked to."""

    names: dict[str, list[tuple[str, str | None, str]]] = field(default_factory=dict)
    live_controllers: list[str] = field(default_factory=list)
    complete: bool = True
    entries: int = 0


def search(directories: Sequence[str], pool_root: str, *, fs: Filesystem,
           max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Found:
    """Walk ``directories`` for archive indexes, commit markers and save-directory locks
    (module docstring).  ``complete`` is False when a bound stopped the walk or a
    directory could not be listed."""
    found = Found()
    pool_root = os.path.realpath(pool_root)

    def visit(path: str, depth: int) -> None:
        if not found.complete:
            return
        try:
            names = fs.listdir(path)
        except OSError:
            found.complete = False
            return
        for n in names:
            found.entries += 1
            if found.entries > max_entries:
                found.complete = False
                return
            child = os.path.join(path, n)
            try:
                st = fs.stat(child)  # never follows a symbolic link
            except OSError:
                continue
            if st.is_dir:
                if os.path.realpath(child) == pool_root:
                    continue
                if depth < max_depth:
                    visit(child, depth + 1)
                else:
                    found.complete = False  # what lies deeper was not looked at
            elif not st.is_symlink:
                _look_at(child, n, os.path.basename(path), found, fs)

    for d in directories:
        visit(os.path.abspath(d), 0)
    return found


def _look_at(path: str, name: str, parent: str, found: Found, fs: Filesystem) -> None:
    if name.endswith(INDEX_SUFFIX):
        index = read_json(fs, path, MAX_JSON_BYTES)
        if isinstance(index, dict) and isinstance(index.get("storage_owner"), str):
            _note(found, index["storage_owner"], index.get("run_id"), index.get("pool_id"),
                  path)
    elif parent == ROLLOUT and _MARKER.match(name):
        marker = read_json(fs, path, MAX_JSON_BYTES)
        if isinstance(marker, dict) and isinstance(marker.get("owner"), str):
            _note(found, marker["owner"], marker.get("run_id"), marker.get("pool"), path)
    elif parent == ROLLOUT and name == LOCK:
        holder = read_json(fs, path, 4096)
        if isinstance(holder, dict) and isinstance(holder.get("host"), str) and \
                isinstance(holder.get("pid"), int):
            if process_alive(holder["host"], holder["pid"]) is not False:
                found.live_controllers.append(os.path.dirname(os.path.dirname(path)))


def _note(found: Found, owner: str, run: object, pool: object, path: str) -> None:
    if isinstance(run, str):
        found.names.setdefault(owner, []).append(
            (run, pool if isinstance(pool, str) else None, path))


def namers(pool_root: str | os.PathLike[str], directories: Sequence[str] | None = None, *,
           fs: Filesystem | None = None, max_depth: int = MAX_DEPTH,
           max_entries: int = MAX_ENTRIES) -> dict[str, Namer]:
    """The judges of ``checkpoint:`` and ``archive:`` owners for ``straw.orphans.survey``,
    from one search of ``directories`` (the pool's parent by default)."""
    fs = fs or PosixFS()
    root = os.path.abspath(pool_root)
    pool_id = check_pool(fs, root).get("pool_id")
    dirs = list(directories) if directories else [os.path.dirname(root)]
    found = search(dirs, root, fs=fs, max_depth=max_depth, max_entries=max_entries)
    where = ", ".join(dirs)

    def named_by(run: str, name: str) -> str | None:
        for r, p, path in found.names.get(name, ()):
            if r == run and (p is None or pool_id is None or p == pool_id):
                return path
        return None

    def judge(run: str, name: str, file: str, live_saver: bool, why: str
              ) -> tuple[str, str]:
        path = named_by(run, name)
        if path is not None:
            return NAMED, f"{file} {path}"
        if not found.complete:
            return UNKNOWN, (f"the search of {where} stopped short ({found.entries} "
                             "entries; a bound or an unreadable directory): search a "
                             "narrower directory")
        if live_saver and found.live_controllers:
            return UNKNOWN, (f"no {file} under {where} names it, but the controller of "
                             f"{found.live_controllers[0]} may be saving it now")
        return ORPHAN, f"no {file} under {where} names it ({why})"

    def checkpoint(run: str, name: str) -> tuple[str, str]:
        return judge(run, name, "commit marker", True,
                     "a save killed before its marker, or a deleted checkpoint")

    def archive(run: str, name: str) -> tuple[str, str]:
        return judge(run, name, "archive index", False,
                     "deleted, or moved elsewhere: search there too")

    return {CHECKPOINT_PREFIX: checkpoint, ARCHIVE_PREFIX: archive}


__all__ = ["Found", "INDEX_SUFFIX", "namers", "search"]
