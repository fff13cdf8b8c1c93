"""Snapshots of a queue journal (``Journal.snapshot``): recovery then costs the live state.

Snapshots.  ``snapshot(state)`` requires that ``state`` reflect exactly the transactions
enqueued so far and that nobody enqueues until it returns (the coordinator calls it under
the lock it enqueues under).  It makes everything enqueued durable (leading a group if
needed), then: writes the snapshot durably (temp file, fsync, rename to its unique final
name, ``fsync_dir``); rotates to a new segment (durable, as above); calls ``fence()``
-- if fenced it stops and deletes nothing (a fenced coordinator must not delete what the
new epoch still needs); finally deletes every segment entirely before the snapshot
position (all older epochs' and its own up to the snapshot's segment), older snapshots
and stale temp files (``ENOENT`` is success; each beneath the queue directory, never
through a symbolic link), then ``fsync_dir``.  Old segments are thus
removed only after the snapshot is durable.  A failed deletion is counted in
``metrics()['cleanup_errors']`` and retried by the next snapshot; it does not fail the
snapshot.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from ..clock import Clock
from ..errors import storage_error
from ..fs import Buffer, Filesystem
from . import framing
from .files import write_new_file
from .segments import JOURNAL_VERSION, SEG_RE, SNAP_RE, TMP_MARK, U32, Position, snapshot_name


class _Writer(Protocol):
    """What a snapshot needs of the ``straw.durable.journal.Journal`` writing it."""

    fs: Filesystem
    dir: str
    clock: Clock
    fence: Callable[[], None] | None
    last_cleanup_error: str | None
    _m: dict[str, Any]
    _mu: threading.Lock

    def _rotate(self, batch: list[Any]) -> None: ...

    def _confirm(self) -> None: ...

    def _mark_broken(self, failure: BaseException) -> None: ...


def write_snapshot(j: _Writer, state: Buffer, pos: Position, seq: int) -> None:
    """As the only writer (``_busy``), outside the mutex."""
    final = os.path.join(j.dir, snapshot_name(*pos))
    tmp = f"{final}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    meta = msgpack.packb({"v": JOURNAL_VERSION, "epoch": pos[0], "seg": pos[1],
                          "offset": pos[2], "seq": seq, "t": j.clock.now()},
                         use_bin_type=True)
    body: list[Buffer] = [U32.pack(len(meta)), meta, state]
    head = framing.encode_header(framing.KIND_SNAPSHOT, body, group_start=0)
    size = len(head) + sum(memoryview(b).nbytes for b in body)
    try:
        write_new_file(j.fs, j.dir, final, tmp, [head, *body], exclusive=True)
    except OSError as e:
        # nothing of the journal changed: it stays usable
        raise storage_error(e, f"journal {j.dir}: snapshot {final} not written") from e
    j._m["fsyncs"] += 1
    j._m["dir_fsyncs"] += 1
    j._m["snapshots"] += 1
    j._m["snapshot_bytes"] = size
    # a new segment: the snapshot's segment receives nothing more
    try:
        j._rotate([])
    except BaseException as e:
        with j._mu:
            j._mark_broken(e)
        if isinstance(e, OSError):
            raise storage_error(e, f"journal {j.dir}: rotation after a snapshot "
                                "failed") from e
        raise
    try:
        if j.fence is not None:
            j.fence()
        j._confirm()
    except BaseException as e:
        with j._mu:
            j._mark_broken(e)
        if isinstance(e, OSError):
            raise storage_error(e, f"journal {j.dir}: confirm after a snapshot "
                                "failed") from e
        raise  # fenced: delete nothing
    _delete_before(j, pos)


def _delete_before(j: _Writer, pos: Position) -> None:
    """Delete what the durable snapshot at ``pos`` makes unnecessary."""
    try:
        names = j.fs.listdir(j.dir)
    except OSError as e:
        _cleanup_error(j, f"listdir: {e}")
        return
    doomed = []
    for name in names:
        m = SEG_RE.match(name)
        if m and (int(m[1]), int(m[2])) <= pos[:2]:
            doomed.append(name)
            continue
        m = SNAP_RE.match(name)
        if m and (int(m[1]), int(m[2]), int(m[3])) < pos:
            doomed.append(name)
            continue
        if TMP_MARK in name:
            doomed.append(name)  # an interrupted (or fenced) snapshot's temp file
    deleted = 0
    queue_dir, journal = os.path.split(os.path.abspath(j.dir))
    for name in doomed:
        path = os.path.join(j.dir, name)
        try:  # never through a symbolic link in place of the journal directory
            j.fs.unlink_beneath(queue_dir, f"{journal}/{name}")
            deleted += 1
        except FileNotFoundError:
            pass  # somebody (a previous attempt) deleted it already: success
        except OSError as e:
            _cleanup_error(j, f"unlink {path}: {e}")
    if deleted:
        try:
            j.fs.fsync_dir(j.dir)
            j._m["dir_fsyncs"] += 1
        except OSError as e:
            _cleanup_error(j, f"fsync_dir: {e}")
    j._m["deleted_files"] += deleted


def _cleanup_error(j: _Writer, what: str) -> None:
    j._m["cleanup_errors"] += 1
    j.last_cleanup_error = what
