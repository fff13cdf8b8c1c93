"""Compaction of the catalog: a snapshot plus the suffix after it.

Snapshots and compaction (CS1; D9's rule applied to the catalog). A client opens the pool
from the latest durable snapshot plus the catalog's suffix, so its open costs the live
state, not the history of owner changes. The catalog's first frame is then a *base frame*: a
transaction whose first operation is ``base {gen, snap, digest, bytes, follow}`` naming a
snapshot file ``CATALOG.snap-<gen>-<token>`` beside the catalog (``straw.catalog_snapshot``:
one frame holding the whole state), followed by the operations appended while that snapshot
was being written. ``Catalog.compact`` (run in a background thread once the suffix passes
``compact_after`` bytes and 1/``COMPACT_RATIO`` of the snapshot) keeps this order, each step
durable before the next:

1. under the lock, briefly: note the first frame and the end X of the catalog;
2. without any lock: rebuild the state at X from the files and write the snapshot
   (temp, fsync, rename, directory fsync) -- publishers are not blocked meanwhile;
3. under the lock: if nobody compacted meanwhile, write the new base frame (the snapshot's
   name and digest, plus the operations after X) durably to ``CATALOG.head``;
4. truncate the catalog to empty, fsync (the inode stays: its flock is the pool lock);
5. write the base frame at offset 0, fsync, confirm, reserve the headroom again;
6. delete older generations' snapshots.

A crash before 4 leaves the old catalog (the new files are ignored); after 4 the next
client to lock an empty catalog finds ``CATALOG.head`` and writes it back (roll forward):
the new state.  Clients that replayed the old catalog notice the new first frame (every
refresh compares it).  CS2: the base frame also lists the views of the old catalog a client
may follow it from (the old head's digest; the snapshot point X and every frame end after
it, each with the count of suffix operations before it and its frame's digest): a client
whose view is listed applies only the suffix operations after it (~1 ms at 1M tasks); any
other replays from the base frame and its snapshot (~40 ms at 1M tasks, under the pool
lock).  ``CATALOG.head`` stays: it is the
durable copy of the base frame, from which ``repair`` restores a damaged base frame
without loss.  A damaged snapshot is ``CorruptData`` (it is durable before anything names
it): restore from a backup.  On a full disk steps 2-3 fail with ``QuotaExceeded`` and
leave everything as it was.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from ...durable import framing
from ...durable.files import unlink_quietly, write_new_file
from ...errors import storage_error
from ...fs import Filesystem
from .log import CatalogLog
from .read import (
    decode_ops,
    frame_tag,
    state_upto,
)
from .snapshot import (
    HEAD_NAME,
    SNAP_PREFIX,
    digest,
    encode_state,
    snapshot_gen,
    snapshot_name,
)
from .state import (
    CATALOG_VERSION,
)

# compaction (CS1): a snapshot is written once the suffix (the bytes after the base frame)
# exceeds both this and the last snapshot's size / COMPACT_RATIO, so that an open replays at
# most about that much on top of decoding the snapshot
COMPACT_AFTER = 1 << 20
COMPACT_RATIO = 16
# a base frame lists at most this many views a client may follow it from (CS2: one per
# frame appended while the snapshot was written, ~20 B each); past it clients reload
_MAX_FOLLOW_VIEWS = 4096


class CompactedLog(CatalogLog):
    """The catalog's log with compaction (CS1) and its background trigger."""

    def __init__(self, fs: Filesystem, root: str, run_id: str | None = None, *,
                 compact_after: int | None = COMPACT_AFTER) -> None:
        super().__init__(fs, root, run_id)
        # automatic compaction (in a background thread) once the suffix passes this many
        # bytes (and the last snapshot's size / COMPACT_RATIO); None: only ``compact()``
        self.compact_after = compact_after
        self._compact_lock = threading.Lock()  # one compaction of this handle at a time
        self._compactor: threading.Thread | None = None
        self._closing = False
        self.compactions: dict[str, Any] = {"done": 0, "skipped": 0, "errors": 0,
                                            "last_error": None, "longest_lock_s": 0.0}

    def close(self) -> None:
        """Close the lock descriptor.  In a forked child: only the child's copy, taking no
        lock and never unlocking (``straw.process``)."""
        if self._in_forked_child():
            self._drop_inherited()
            return
        self._closing = True  # no new background compaction; wait for a running one
        compactor = self._compactor
        if compactor is not None and compactor is not threading.current_thread():
            compactor.join()
        with self._mutex:
            if self._lock_fd is not None:
                self.fs.close(self._lock_fd)
                self._lock_fd = None

    def _appended(self) -> None:
        """Start a background compaction once the suffix has grown enough."""
        if (self.compact_after is not None and not self._closing and
                self._offset - self._base_end > max(self.compact_after,
                                                    self._snap_bytes // COMPACT_RATIO)):
            self._compact_soon()

    # --- compaction (CS1: snapshot durable, then head copy durable, then truncation) -----
    def _compact_soon(self) -> None:
        """Start a background compaction unless one is running (called under the mutex:
        the thread waits for it, then does its slow part holding no lock at all)."""
        if self._compactor is not None and self._compactor.is_alive():
            return
        self._compactor = threading.Thread(target=self._compact_in_background, daemon=True,
                                           name=f"straw-catalog-compact {self.root}")
        self._compactor.start()

    def _compact_in_background(self) -> None:
        try:
            self.compact()
        except Exception as e:  # noqa: BLE001 - kept for metrics; the next trigger retries
            self.compactions["errors"] += 1
            self.compactions["last_error"] = repr(e)

    def compact(self) -> dict[str, Any] | None:
        """Write a snapshot of the catalog and make it the catalog's base (CS1), so that
        an open decodes the snapshot and replays only the suffix after it.  Returns a
        report (generation, snapshot file and bytes, suffix operations carried, seconds
        the pool lock was held), or None if another client compacted (or repaired) the
        catalog meanwhile (nothing changed by this call).

        Order (each step durable before the next; a crash between any two leaves the old
        or the new catalog state, never a mix):

        1. under the pool lock (briefly): note the catalog's first frame and its end X;
        2. holding no lock: rebuild the state at X from the files, write it to a new
           snapshot file ``CATALOG.snap-<gen>-<token>`` (temp file, fsync, rename,
           directory fsync) -- publishers and other clients go on meanwhile;
        3. under the pool lock: check that nobody compacted meanwhile; build the new base
           frame (``base {gen, snap, digest}`` and the operations appended since X) and
           write it durably to ``CATALOG.head`` (the catalog is unchanged so far: a crash
           leaves the old state, the new files are ignored);
        4. truncate the catalog to empty, fsync (a crash now: the next locker finds an
           empty catalog and ``CATALOG.head``, and writes the head: the new state);
        5. write the base frame at offset 0, fsync, confirm (the new state);
        6. delete older snapshots (their deletion is not needed for correctness).

        On a full disk step 2 or 3 fails with ``QuotaExceeded`` and the catalog is left
        as it was (the new files are removed): compaction refuses cleanly."""
        self._check_process()
        with self._compact_lock:
            return self._compact()

    def _compact(self) -> dict[str, Any] | None:
        job = self._write_snapshot()
        return None if job is None else self._make_base(job)

    def _write_snapshot(self) -> _Compaction | None:
        """Steps 1 and 2 of ``compact``: the snapshot file, durable, named by nothing yet."""
        with self.locked():
            head, x, gen, x_tail = self._head, self._offset, self._gen, self._tail
        state = state_upto(self.fs, self.root, head, x)
        if state is None:
            self.compactions["skipped"] += 1
            return None
        job = _Compaction(head, x, x_tail, gen + 1,
                          snapshot_name(gen + 1, os.urandom(6).hex()),
                          encode_state(state, gen + 1))
        del state
        self._write_durable(os.path.join(self.root, job.name), job.data, "catalog snapshot")
        return job

    def _make_base(self, job: _Compaction) -> dict[str, Any] | None:
        """Steps 3 to 6 of ``compact``."""
        snap_path = os.path.join(self.root, job.name)
        try:
            with self.locked():
                t0 = time.perf_counter()
                try:
                    if self._head != job.head or self._offset < job.x:
                        self.compactions["skipped"] += 1
                        raise _Superseded
                    report = self._install(job)
                finally:
                    held = time.perf_counter() - t0
                    self.compactions["longest_lock_s"] = max(
                        held, self.compactions["longest_lock_s"])
        except _Superseded:
            unlink_quietly(self.fs, snap_path)
            return None
        except BaseException:
            # the catalog keeps its old base (or, once truncated, rolls forward to this
            # snapshot, which the head copy names): remove the snapshot only if unused
            if self._gen != job.gen and not self._head_copy_names(job.name):
                unlink_quietly(self.fs, snap_path)
            raise
        self._delete_old_snapshots(job.gen, job.name)  # outside the lock: generations only
        report["lock_held_s"] = held
        self.compactions["done"] += 1
        return report

    def _install(self, job: _Compaction) -> dict[str, Any]:
        """Steps 3-5 of ``compact`` (pool lock held, state refreshed)."""
        x, gen, name, data = job.x, job.gen, job.name, job.data
        fd = self.fs.open(self.path, write=True)
        try:
            suffix: list[dict[str, Any]] = []
            # CS2: the views of the old catalog a client may follow this base from: each
            # frame end from x on, with the operations of the suffix before it and a
            # digest of the frame that ends there
            views = [[x, 0, frame_tag(job.x_tail)]]
            if self._offset > x:
                tail = self.fs.read_to_end(fd, x, self._offset - x)
                scan = framing.scan_frames(lambda o, n: tail[o - x:o - x + n], self._offset,
                                           start=x)
                for f in scan.frames:
                    suffix += decode_ops(f.body, f"{self.path} offset {f.offset}")
                    end = f.offset + f.header.frame_length
                    views.append([end, len(suffix), frame_tag(tail[f.offset - x:end - x])])
            base: dict[str, Any] = {"op": "base", "gen": gen, "snap": name,
                                    "digest": digest(data), "bytes": len(data)}
            if len(views) <= _MAX_FOLLOW_VIEWS:
                base["follow"] = {"head": frame_tag(job.head), "views": views}
            body = msgpack.packb({"v": CATALOG_VERSION, "ops": [base, *suffix]},
                                 use_bin_type=True)
            head = framing.encode_frame(framing.KIND_CATALOG, body, group_start=0)
            self._delete_head_temps()  # of compactions that died writing it (lock held)
            self._write_durable(os.path.join(self.root, HEAD_NAME), head, "catalog head copy")
            try:
                self.fs.truncate(fd, 0)
                self.fs.fsync(fd)
                self._install_head(fd, head, load=False)
            except OSError as e:
                # the catalog may be empty now: the next locker rolls forward from the
                # head copy (this client forgets what it replayed)
                self._reset()
                raise storage_error(e, f"catalog {self.path}: compaction interrupted after "
                                    "its snapshot was durable") from e
        finally:
            self.fs.close(fd)
        self._snap_bytes = len(data)
        return {"generation": gen, "snapshot": name, "snapshot_bytes": len(data),
                "suffix_ops": len(suffix), "catalog_bytes": self._offset}

    def _write_durable(self, path: str, data: bytes, what: str) -> None:
        """A new file, atomically and durably (``straw.durable.files``); on a failure
        nothing is left behind (a full disk: ``QuotaExceeded``, nothing changed)."""
        tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            write_new_file(self.fs, self.root, path, tmp, [data])
        except OSError as e:
            raise storage_error(e, f"cannot write {what} {path}") from e

    def _head_copy_names(self, name: str) -> bool:
        try:
            return name.encode() in (self._head_copy() or b"")
        except OSError:
            return True  # unknown: keep the snapshot

    def _delete_head_temps(self) -> None:
        """Temp files of head copies whose writer died (only written under the lock)."""
        try:
            names = self.fs.listdir(self.root)
        except OSError:
            return
        for n in names:
            if n.startswith(f"{HEAD_NAME}.tmp."):
                unlink_quietly(self.fs, os.path.join(self.root, n))

    def _delete_old_snapshots(self, gen: int, keep: str) -> None:
        """Older generations' snapshots and failed attempts' files at or below ``gen``
        (a newer generation's file may be another client's compaction in progress)."""
        try:
            names = self.fs.listdir(self.root)
        except OSError:
            return
        for n in names:
            if not n.startswith(SNAP_PREFIX) or n == keep:
                continue
            g = snapshot_gen(n.split(".tmp.")[0]) if ".tmp." in n else snapshot_gen(n)
            if g is not None and g <= gen:
                unlink_quietly(self.fs, os.path.join(self.root, n))


@dataclass
class _Compaction:
    """A snapshot written by ``Catalog._write_snapshot``, waiting to become the base."""

    head: bytes  # the catalog's first frame when the snapshot was taken
    x: int  # the catalog offset the snapshot covers (everything before it)
    x_tail: bytes  # the frame that ends at ``x`` (a follower's view ending there, CS2)
    gen: int
    name: str
    data: bytes


class _Superseded(Exception):
    """Another client compacted (or repaired) the catalog while this one wrote its
    snapshot: this compaction is dropped, nothing was changed."""
