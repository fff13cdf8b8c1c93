"""The ownership catalog: which packs exist, who needs which extents, what may be reclaimed.

One append-only log per pool, ``<root>/CATALOG``.  Its inode never changes (it is never
replaced or renamed), because an ``flock`` on it is also the pool's cross-client lock:
every catalog change and every collection happens under that lock.  Each transaction is
one frame (``straw.framing``, kind CATALOG) holding a msgpack list of operations, appended
and synced (``fdatasync``) before the lock is released; a client replays only what was
appended since it last looked (it re-reads the last frame it replayed first: if those bytes
changed, a repair rewrote the catalog and it replays from the start).

Torn tail versus damaged acknowledged tail (D6): confirm frames.  After a transaction's
fsync returned, and before the append returns (nothing is acknowledged yet, the lock is
still held), the appender writes a *confirm*: a catalog frame without operations
(``ops: []`` plus a random nonce, so replay needs no format change), NOT synced, that
starts its own write group.  The next transaction, whoever appends it, joins that group
(its group start is the confirm's offset), so (confirm + next transaction) are one write
group covered by one fsync.  Through the write-group rule of ``framing.scan_frames``:

* a flipped byte in the last acknowledged transaction is followed by its valid confirm,
  a frame of a later group: ``CorruptData``, never cut;
* a power loss that tears the unsynced (confirm + next transaction) group is a torn tail
  (everything in it is one group), cut off under the lock;
* a process killed after the fsync but before the confirm left an intact frame (process
  death does not damage written bytes); the next client that replays it fsyncs it and
  writes the missing confirm.

Blind spots: (1) a double fault -- the confirm is not synced on its own, so damage to the
last transaction together with a power loss that also lost its confirm looks like a torn
tail; (2) damage that zeroes ``_CLEAN_RUN`` (8 KiB) or more of synced frames reads as the
reserved tail, the clean end (a flipped byte never does).  A damaged final confirm is cut
like any torn tail; it carries no operation.  Whenever a cut would remove a complete frame
(all its bytes present, whether its checksum holds or not) the bytes cut are first copied
to a durable side file ``CATALOG.torn-<offset>-<n>``.

Fail closed and repair.  A damaged frame followed by a later group makes every catalog
operation (retain, release, collect, ...) raise ``CorruptData`` naming the offset and
``SharedFilesystemStore.repair_catalog()``.  ``Catalog.repair`` (under the pool lock) copies
the damaged bytes to ``CATALOG.damaged-<offset>-<n>`` (durable), then overwrites them IN
PLACE with one valid frame of exactly their length that holds a ``repaired`` operation
(and, if the damaged region is too short for it, the operations of the frames after it
that it had to absorb).  Every other frame keeps its offset and bytes, the inode never
changes (its flock is the pool lock), and a crash during the repair leaves the catalog
damaged (the repair is simply run again), never silently short.  Only the damaged
transaction is lost.  Then ``repaired`` is appended once more at the end, so that clients
that had replayed past the damage learn it too.  From then on ``collect`` refuses
(``UnsafeRecovery``) until an operator, having re-retained what must live, appends
``repair_confirmed`` (``SharedFilesystemStore.confirm_catalog_repair()``).

Headroom (a full pool can free itself).  The catalog keeps space reserved at its tail
(``Filesystem.reserve``; reserved space reads as zeros, the clean end for the scanner): the
*floor*, ``RESERVE_FLOOR`` bytes plus what releasing every owner, unstaging every
publication staged in a sealed pack and collecting every pack it knows would append
(``freeing_bytes``), beyond the end of the data, extended by
``RESERVE_STEP``.
Appends that free space (release, unstage, sealed, tombstone, unlinked, the repair ops,
adopt/retain that add no root, confirms) may consume the floor and never need new
blocks; appends that add retention (open, edges, retain, adopt adding roots, init) need
the floor intact and raise ``QuotaExceeded`` when extending the reservation fails with
ENOSPC/EDQUOT.  So a full pool can always release all it retains, one owner at a time,
release all its sealed staged publications, even in one call, and collect (a fixed floor
would hold only so many freeing transactions, and a pool of more owners could not free
itself); a collection frees disk space, from which the next
append restores the floor.  Without ``reserve`` support (the
filesystem says so) the catalog simply appends and there is no floor.  Replay reads in
chunks and stops at the clean end (a run of ``_CLEAN_RUN`` zero bytes, or a short read: a
size cached by another client may be stale), so the reserved tail costs one small read
per lock, not a read to EOF.

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

Operations (the state they build is ``CatalogState``)::

    init     {v}                          first frame: the catalog format version
    open     {path}                       a writer created a pack (before creating it)
    edges    {src: [path, off], deps: [[path, off], ...]}
                                          dependencies of an extent, recorded before its
                                          bytes are written (D1/D4: deps retained first)
    sealed   {path, offsets, unstage}     the pack is complete: these extents exist; the
                                          listed ones are not staged (recovery of a crash)
    retain   {run, owner, packs}          replaces the owner's root extents, grouped by
                                          pack: [[path, [off, ...]], ...] (version 4;
                                          earlier: roots: [[path, off], ...], still read)
    release  {run, owner}
    adopt    {run, owner, epoch, add, replace, unstage}
                                          a queue coordinator's update of its owner: add
                                          roots (before journaling, D2), or replace them
                                          all, and drop staging it took over.  Fenced:
                                          applied only if ``epoch`` is at least the highest
                                          epoch seen for that owner (D8), so a paused old
                                          coordinator can never remove what a newer one
                                          needs
    unstage  {packs}                      release_publications: staging dropped (the named
                                          publications and their staged dependencies),
                                          grouped by pack: [[path, [off, ...]], ...]
                                          (version 5; earlier: extents: [[path, off], ...],
                                          still read)
    tombstone {paths}                     durable mark before unlink (D3)
    unlinked {paths}                      the files are gone
    repaired {at, lost, side}             an operator's repair: the damaged frame at ``at``
                                          (``lost`` bytes, kept in side file ``side``) was
                                          replaced; collection stops until confirmed
    repair_confirmed {sides}              the operator confirmed those repairs
    base     {gen, snap, digest}          only as the first operation of the catalog: the
                                          state starts from that snapshot (above)
    (none: ``ops: []``)                   a confirm frame (above)

Owners belong to a run.  An owner is keyed by ``(run, name)`` (``OwnerKey``): the ``run``
field of retain/release/adopt names the run of the store that wrote it, so runs sharing a
root may use the same owner names (``checkpoint-7``, the ``queue:<ns>/<id>`` of a
coordinator, pins) without touching each other's roots or epochs.  A ``Catalog`` client
acts for one run (``run_id``); an observer opened without one only reads.

Format versions.  Version 5 (this straw) groups an unstage's extents by pack; version 4
did a retain's; version 3 added base frames and snapshots; version 2 added
the ``run`` field.  A version-1 catalog's
owner operations have none; they stay readable without losing retention: such an
operation belongs to the run that its roots' pack paths name (``runs/<run>/...``; a v1
store could only retain references of its own run), and one that names no roots (a
release, a queue's first claim, a retain of nothing) to the run the v1 owner name already
had.  A v1 owner whose roots name no run, or several, is kept under the run ``""``
(``LEGACY_RUN``, which no run id can be): it protects its roots, and no run lists or
releases it.

Staging: every extent of an open pack, and every extent of a sealed pack that was not
unstaged, protects itself and (through its edges) its dependencies — a fresh publication
costs no catalog write unless it has external dependencies.

Reachability (D4) is pool-wide: live extents are the closure, through edges, of every
run's owner roots (pins are owners too) and staged extents.  A pack is live if it is open,
or holds a live extent; one live extent keeps its whole pack.  So no run can reclaim what
another run retains.  A store's collection (``collect``) is moreover scoped to its own run:
it tombstones and unlinks only packs under ``runs/<its run>/``, so one run's collection
never deletes another run's files, even unreferenced ones; ``collect_pool`` is the
operator's pool-wide collection.  Collection tombstones sealed packs that are not live,
makes the tombstones durable, then unlinks (ENOENT is success: another client may have
finished it); a collection interrupted between tombstone and unlink is finished by the next
one.  A tombstoned path is never retained, reopened or reused (D3).

A ``Catalog`` handle belongs to the process that opened it (``straw.process``): its lock
descriptor shares the parent's open file description after a fork (the child would pass
the parent's pool lock, and its unlock would release it) and its replayed state is the
parent's.  In a forked child every operation raises ``ForkedProcess`` before taking any
lock; ``close()`` only closes the child's copy of the descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from .catalog_read import (
    CATALOG_NAME,
    decode_ops,
    frame_tag,
    load_snapshot,
    read_state,
    read_to_clean_end,
    state_upto,
)
from .catalog_snapshot import (
    HEAD_NAME,
    SNAP_PREFIX,
    digest,
    encode_state,
    snapshot_gen,
    snapshot_name,
)
from .catalog_state import (
    CATALOG_VERSION,
    CatalogState,
    Extent,
    OwnerKey,
    PackInfo,
    by_pack,
    freeing_bytes,
    run_prefix,
)
from .durable import framing
from .errors import (
    CorruptData,
    InvalidReference,
    OwnerMismatch,
    QuotaExceeded,
    UnsafeRecovery,
    UnsupportedSchema,
)
from .fs import Filesystem
from .pack import storage_error
from .process import ProcessBound, close_quietly
from .refs import pack_path_run
from .siblings import Siblings

# compaction (CS1): a snapshot is written once the suffix (the bytes after the base frame)
# exceeds both this and the last snapshot's size / COMPACT_RATIO, so that an open replays at
# most about that much on top of decoding the snapshot
COMPACT_AFTER = 1 << 20
COMPACT_RATIO = 16
# a base frame lists at most this many views a client may follow it from (CS2: one per
# frame appended while the snapshot was written, ~20 B each); past it clients reload
_MAX_FOLLOW_VIEWS = 4096
RESERVE_STEP = 256 << 10  # the reservation grows in these steps
RESERVE_FLOOR = 64 << 10  # reserved bytes past the data that only freeing appends may use
_NONCE = 8  # random bytes in a confirm frame: no two confirms have the same bytes
class Catalog(ProcessBound):
    """A client of the pool's catalog acting for run ``run_id`` (its owners, its packs'
    collection).  Thread-safe; one per store.  Without ``run_id`` it only observes (and
    ``collect_pool`` collects pool-wide, for an operator)."""

    _process_state = "its pool lock descriptor and catalog position"

    def __init__(self, fs: Filesystem, root: str, run_id: str | None = None, *,
                 compact_after: int | None = COMPACT_AFTER) -> None:
        self._bind_process()
        self.fs = fs
        self.root = root
        self.run_id = run_id
        self.path = os.path.join(root, CATALOG_NAME)
        self.state = CatalogState()
        # automatic compaction (in a background thread) once the suffix passes this many
        # bytes (and the last snapshot's size / COMPACT_RATIO); None: only ``compact()``
        self.compact_after = compact_after
        self._gen = 0  # generation of the snapshot the catalog's base frame names (0: none)
        self._head = b""  # the catalog's first frame as replayed (a compaction replaces it)
        self._base_end = 0  # where the suffix starts: the end of the first frame
        self._snap_bytes = 0  # size of the snapshot the base frame names
        self._compact_lock = threading.Lock()  # one compaction of this handle at a time
        self._compactor: threading.Thread | None = None
        self._closing = False
        self.compactions: dict[str, Any] = {"done": 0, "skipped": 0, "errors": 0,
                                            "last_error": None, "longest_lock_s": 0.0}
        self.follows = 0  # compactions by others followed without the snapshot (CS2)
        self._offset = 0  # how far this client has replayed: where the next frame goes
        self._group_start = 0  # group start of the next frame (a trailing confirm's offset)
        self._tail_start = 0  # the last frame this client replayed or wrote, and its bytes:
        self._tail = b""  # re-read first on refresh to notice a rewritten catalog
        self._size = 0  # the file's size (data + reserved tail) as last seen under the lock
        self._reserving = True  # False once the filesystem said it cannot reserve
        self._lock_fd: int | None = None
        self._locked_fd: int | None = None  # the catalog opened by the refresh under the lock
        self._mutex = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: list[_AdoptRequest] = []
        # callers that announced an adopt (``adopting_soon``) and have not queued it yet:
        # the thread writing the pending adopts waits for them (``straw.siblings``)
        self.siblings = Siblings(self._pending_lock)

    def _process_subject(self) -> str:
        return f"catalog handle of pool {self.root}"

    def _drop_inherited(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        close_quietly(self.fs, fd)

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

    # --- the lock and replay ------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[CatalogState]:
        """Hold the pool lock with an up-to-date state.  The data is read through a handle
        opened *after* the lock was taken (close-to-open visibility across clients)."""
        self._check_process()  # before the mutex: another thread may have held it at fork
        with self._mutex, self._flocked() as st:
            yield st

    @contextlib.contextmanager
    def _flocked(self) -> Iterator[CatalogState]:
        """The cross-client lock and a refreshed state (``_mutex`` already held)."""
        self._check_process()  # every catalog read and change passes here
        with self._pool_lock():
            self._refresh()
            yield self.state

    @contextlib.contextmanager
    def _pool_lock(self) -> Iterator[None]:
        """The cross-client lock alone (``_mutex`` already held)."""
        try:
            if self._lock_fd is None:
                self._lock_fd = self._open_lock_file()
            self.fs.lock(self._lock_fd)
        except OSError as e:
            raise storage_error(e, f"cannot lock catalog {self.path}") from e
        try:
            yield
        finally:
            self._drop_locked_fd()
            try:
                self.fs.unlock(self._lock_fd)
            except OSError:
                pass

    def _drop_locked_fd(self) -> None:
        """Close the handle the last refresh under this lock kept for appends."""
        fd, self._locked_fd = self._locked_fd, None
        if fd is not None:
            close_quietly(self.fs, fd)

    def _open_lock_file(self) -> int:
        try:
            return self.fs.open(self.path, write=True)
        except FileNotFoundError:
            fd = self.fs.open(self.path, write=True, create=True)
            self.fs.fsync_dir(self.root)  # D1: the catalog's name is durable
            return fd

    def _reset(self) -> None:
        """Forget what was replayed: the next refresh replays from the start."""
        self.state = CatalogState()
        self._offset = self._group_start = self._tail_start = 0
        self._tail = self._head = b""
        self._gen = self._base_end = self._snap_bytes = 0

    def _read_from(self, fd: int, start: int) -> bytes:
        return read_to_clean_end(self.fs, fd, start)

    def _refresh(self) -> None:
        self._drop_locked_fd()  # a repair refreshes again under the same lock
        fd = self.fs.open(self.path, write=True)
        kept = False
        try:
            self._size = self.fs.fstat(fd).size
            if self._tail_start and self._head_changed(fd) and not self._follow(fd):
                self._reset()  # another client compacted: replay its base and snapshot
            base = self._tail_start
            data = self._read_from(fd, base)
            if data[:len(self._tail)] != self._tail:
                # the frame we replayed last is not there any more: a repair rewrote the
                # catalog (or a damaged final confirm was cut): replay from the start
                self._reset()
                base = 0
                data = self._read_from(fd, 0)
            scan = framing.scan_frames(lambda o, n: data[o - base:o - base + n],
                                       base + len(data), start=base)
            new = [f for f in scan.frames if f.offset >= self._offset]
            if new:
                # Another client may have died after writing but before its fsync: what we
                # are about to act on (a tombstone, a release) must be durable first.
                self.fs.fsync(fd)
            last_ops: list[dict[str, Any]] | None = None
            for f in new:
                if f.header.kind != framing.KIND_CATALOG:
                    raise CorruptData(f"{self.path} offset {f.offset}: not a catalog frame")
                last_ops = ops = decode_ops(f.body, f"{self.path} offset {f.offset}")
                if f.offset == 0:
                    ops = self._read_base(data[:f.header.frame_length], ops)
                for op in ops:
                    self.state.apply(op)
            if new:
                f = new[-1]
                self._tail_start = f.offset
                self._tail = data[f.offset - base:f.offset - base + f.header.frame_length]
                self._offset = scan.end
                # the next transaction joins the group of a trailing confirm
                self._group_start = f.offset if not last_ops else scan.end
            if scan.torn:
                # a client died mid-append (or a power loss tore the unsynced group): cut
                # its torn transaction off, under the lock
                self._cut(fd, scan.end, data[scan.end - base:])
            if last_ops:
                # the last transaction's writer died before its confirm: confirm it now
                # (D6; best effort, like every confirm)
                self._confirm(fd)
            if self._offset == 0:
                head = self._head_copy()
                if head is not None:
                    # a compaction truncated the catalog and died before its base frame
                    # was durable: finish it (CS1), its snapshot and head copy are durable
                    self._install_head(fd, head, load=True)
                else:
                    self._check_really_new()
                    # the first frame: this client's head as if it had replayed it (a
                    # compaction by this client names it to its followers, CS2)
                    self._head = self._write_txn(fd, [{"op": "init", "v": CATALOG_VERSION}])
                    self._base_end = len(self._head)
            # opened after the lock was taken (close-to-open visibility): the appends made
            # under this lock reuse it, one open and close per locked section, not two
            # (an open is a round trip to the metadata server on JuiceFS)
            self._locked_fd, kept = fd, True
        except framing.DamagedFrame as e:
            raise _CatalogDamaged(self.path, e) from None
        except CorruptData as e:
            raise CorruptData(f"catalog {self.path}: {e}") from None
        except OSError as e:
            raise storage_error(e, f"cannot read catalog {self.path}") from e
        finally:
            if not kept:
                self.fs.close(fd)

    def _head_changed(self, fd: int) -> bool:
        """Is the catalog's first frame another one than the one this client replayed?
        (A compaction by another client truncated the catalog and wrote a new base frame,
        whose operation names a new snapshot: its bytes never repeat an older head.)"""
        buf = bytearray(len(self._head))
        n = self.fs.readinto(fd, buf, 0)
        return bytes(buf[:n]) != self._head

    def _follow(self, fd: int) -> bool:
        """CS2: another client compacted the catalog this client replayed; if the new base
        frame lists this client's view (its old head, and a frame end it replayed up to,
        with that frame's digest), the state it holds plus the suffix operations after that
        view is the base's state: apply them instead of decoding the snapshot (which costs
        the whole live state, ~40 ms at 1M tasks, under the pool lock, once per client
        per compaction).  False (nothing changed): replay from the start."""
        data = self._read_from(fd, 0)
        scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
        if len(scan.frames) < 2 or scan.frames[0].header.kind != framing.KIND_CATALOG:
            return False  # no frame after the base (its confirm): the full path confirms
        first = scan.frames[0]
        frame = data[:first.header.frame_length]
        ops = decode_ops(first.body, f"{self.path} offset 0")
        base = ops[0] if ops and isinstance(ops[0], dict) else {}
        follow = base.get("follow")
        if base.get("op") != "base" or not isinstance(follow, dict) \
                or follow.get("head") != frame_tag(self._head) \
                or not isinstance(base.get("bytes"), int) or not isinstance(base.get("gen"), int):
            return False
        mine = [self._offset, frame_tag(self._tail)]
        skip = next((v[1] for v in follow.get("views", ())
                     if isinstance(v, list) and len(v) == 3 and [v[0], v[2]] == mine), None)
        if not isinstance(skip, int) or not 0 <= skip <= len(ops) - 1:
            return False
        for op in ops[1 + skip:]:
            self.state.apply(op)
        self._head, self._base_end = frame, len(frame)
        self._gen, self._snap_bytes = base["gen"], base["bytes"]
        self._tail_start, self._tail = 0, frame
        self._offset = self._group_start = len(frame)
        self.follows += 1
        return True

    def _read_base(self, frame: bytes, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The catalog's first frame (replayed from the start: ``self.state`` is empty):
        remember it, and if it is a base frame load the snapshot it names.  Returns the
        operations to apply on top (the suffix the base frame carries)."""
        self._head, self._base_end = frame, len(frame)
        if not ops or ops[0].get("op") != "base":
            return ops
        self.state, self._gen, self._snap_bytes = load_snapshot(self.fs, self.root, ops[0])
        return ops[1:]

    def _check_really_new(self) -> None:
        """An empty catalog without a head copy is a new pool -- unless snapshots exist:
        then catalog files were lost (only a compaction writes snapshots, and it writes
        the head copy before it empties the catalog).  Fail closed (D6), never start over."""
        snaps = sorted(n for n in self.fs.listdir(self.root)
                       if snapshot_gen(n) is not None)
        if snaps:
            raise CorruptData(
                f"catalog {self.path} is empty and {HEAD_NAME} is missing, but catalog "
                f"snapshots exist ({', '.join(snaps[:3])}): catalog files were lost. Restore "
                "the pool from a backup")

    def _head_copy(self) -> bytes | None:
        """The durable copy of the base frame written before a compaction truncated the
        catalog (None if there is none: a catalog never compacted)."""
        try:
            return self.fs.read_file(os.path.join(self.root, HEAD_NAME))
        except FileNotFoundError:
            return None

    def _install_head(self, fd: int, head: bytes, *, load: bool) -> None:
        """Make ``head`` (a base frame) the catalog's whole content, durably, then confirm
        it (D6) and reserve the headroom again.  The catalog is empty or truncated to
        empty here.  ``load``: rebuild the state from it (a roll-forward); otherwise the
        caller's state already is what it holds (the compactor)."""
        try:
            header, body = framing.decode_frame(head)
            if header.kind != framing.KIND_CATALOG or header.frame_length != len(head):
                raise CorruptData("not one catalog frame")
        except (framing.TornFrame, CorruptData) as e:
            raise CorruptData(f"{os.path.join(self.root, HEAD_NAME)}: damaged copy of the "
                              f"catalog's base frame ({e}); restore the pool from a backup"
                              ) from None
        ops = decode_ops(bytes(body), HEAD_NAME)
        if not ops or ops[0].get("op") != "base":
            raise CorruptData(f"{HEAD_NAME}: not a catalog base frame")
        if load:
            self._reset()
            for op in self._read_base(head, ops):
                self.state.apply(op)
        self.fs.truncate(fd, 0)
        self.fs.writev(fd, [head], 0)
        self.fs.fsync(fd)
        self._head, self._base_end = head, len(head)
        self._gen = ops[0]["gen"]
        self._tail_start, self._tail = 0, head
        self._offset = self._group_start = len(head)
        self._size = len(head)
        self._confirm(fd)
        if self._reserving:
            try:
                if self.fs.reserve(fd, self._offset, RESERVE_STEP):
                    self._size = self._offset + RESERVE_STEP
                else:
                    self._reserving = False
            except OSError:
                pass  # a full disk: the floor comes back with the next append that can

    def _cut(self, fd: int, end: int, rest: bytes) -> None:
        """Truncate a torn tail at ``end``.  If the bytes cut off hold a complete frame (all
        its bytes present, checksums right or wrong) they are copied aside first; the
        reserved space is restored after."""
        if _holds_complete_frame(rest):
            self._keep_aside("torn", end, rest.rstrip(b"\0"))
        self.fs.truncate(fd, end)
        if self._reserving and self._size > end:
            try:
                self.fs.reserve(fd, end, self._size - end)
            except OSError:
                self._size = end  # a full disk: the floor is gone until space is freed
        self.fs.fsync(fd)

    def _keep_aside(self, kind: str, offset: int, data: bytes) -> str:
        """Write ``data`` durably to a new side file ``CATALOG.<kind>-<offset>-<n>``."""
        n = 0
        while self.fs.probe(os.path.join(self.root, f"{CATALOG_NAME}.{kind}-{offset}-{n}")):
            n += 1
        name = f"{CATALOG_NAME}.{kind}-{offset}-{n}"
        self.fs.write_file_durable(os.path.join(self.root, name), data)
        return name

    def _make_room(self, fd: int, length: int, *, frees: bool, owed: int = 0) -> None:
        """Reserve space for ``length`` more bytes (a frame and its confirm), keeping the
        floor: ``RESERVE_FLOOR`` plus ``owed``, what freeing everything retained would
        append (``freeing_bytes``).  A full disk fails only appends that add retention
        (finding 6), and those before the floor could not release and collect all there
        is (hundreds of owners released one by one would use up a fixed floor)."""
        end = self._offset + length
        floor = RESERVE_FLOOR + owed
        if not self._reserving or end + (0 if frees else floor) <= self._size:
            return
        start = max(self._size, self._offset)
        stepped = -(-(end + floor) // RESERVE_STEP) * RESERVE_STEP
        for target in (stepped, end + floor):  # a whole step, else what keeps the floor
            try:
                ok = self.fs.reserve(fd, start, target - start)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                continue
            if ok:
                self._size = target
            else:
                self._reserving = False  # not supported here: plain appends from now on
            return
        if frees:
            return  # inside the floor (or a plain append past it, which may still fail)
        raise QuotaExceeded(
            f"catalog {self.path}: the pool's filesystem is full (the catalog keeps its last "
            f"{floor} reserved bytes for releases and collection only): release owners "
            "or publications and collect_garbage to free space, then retry"
        )

    def _write_txn(self, fd: int, ops: list[dict[str, Any]]) -> bytes:
        """Write one transaction durably at the end, then its confirm (D6); returns the
        transaction's frame."""
        body = msgpack.packb({"v": CATALOG_VERSION, "ops": ops}, use_bin_type=True)
        frame = framing.encode_frame(framing.KIND_CATALOG, body, group_start=self._group_start)
        frees = not any(self.state.adds_retention(op) for op in ops)
        self._make_room(fd, len(frame) + _CONFIRM_LENGTH, frees=frees,
                        owed=0 if frees else freeing_bytes(self.state, len(ops)))
        self.fs.writev(fd, [frame], self._offset)
        # fdatasync, as the journal's and the packs' appends: the data and what reading it
        # back needs (the size, if the append went past the reserved tail) are durable;
        # the timestamps fsync adds cost a fifth more per catalog append on this ext4, one
        # append per completion (issue 13)
        self.fs.fdatasync(fd)
        self._tail_start, self._tail = self._offset, frame
        self._offset += len(frame)
        self._group_start = self._offset
        self._size = max(self._size, self._offset)
        self._confirm(fd)
        return frame

    def _confirm(self, fd: int) -> None:
        """Write a confirm frame after the durable last transaction: not synced; it starts
        the write group the next transaction joins.  Best effort: the transaction is
        durable either way; without its confirm, damage to it would look torn until the
        next transaction follows it."""
        body = msgpack.packb({"v": CATALOG_VERSION, "ops": [], "n": os.urandom(_NONCE)},
                             use_bin_type=True)
        frame = framing.encode_frame(framing.KIND_CATALOG, body, group_start=self._offset)
        try:
            self.fs.writev(fd, [frame], self._offset)
        except OSError:
            return
        self._tail_start, self._tail = self._offset, frame
        self._group_start = self._offset
        self._offset += len(frame)
        self._size = max(self._size, self._offset)

    def append(self, ops: list[dict[str, Any]]) -> None:
        """Durably append one transaction (call inside ``locked``), then apply it exactly
        as every other client will when it replays it (we hold the lock: nothing else
        was appended since our refresh)."""
        self._check_process()
        own = self._locked_fd is None  # the refresh under this lock kept its handle
        fd = self.fs.open(self.path, write=True) if own else self._locked_fd
        assert fd is not None
        try:
            self._write_txn(fd, ops)
        except OSError as e:
            # the tail may now be torn: the next locker (maybe us) repairs it
            raise storage_error(e, f"catalog append to {self.path} failed") from e
        finally:
            if own:
                self.fs.close(fd)
        for op in ops:
            self.state.apply(op)
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
            self._unlink_quietly(snap_path)
            return None
        except BaseException:
            # the catalog keeps its old base (or, once truncated, rolls forward to this
            # snapshot, which the head copy names): remove the snapshot only if unused
            if self._gen != job.gen and not self._head_copy_names(job.name):
                self._unlink_quietly(snap_path)
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
        """A new file, atomically and durably (temp, fsync, rename, directory fsync); on a
        failure nothing is left behind (a full disk: ``QuotaExceeded``, nothing changed)."""
        tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            fd = self.fs.open(tmp, write=True, create=True)
            try:
                self.fs.writev(fd, [data], 0)
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
            self.fs.rename(tmp, path)
            self.fs.fsync_dir(self.root)
        except OSError as e:
            self._unlink_quietly(tmp)
            raise storage_error(e, f"cannot write {what} {path}") from e

    def _head_copy_names(self, name: str) -> bool:
        try:
            return name.encode() in (self._head_copy() or b"")
        except OSError:
            return True  # unknown: keep the snapshot

    def _unlink_quietly(self, path: str) -> None:
        try:
            self.fs.unlink(path)
        except OSError:
            pass

    def _delete_head_temps(self) -> None:
        """Temp files of head copies whose writer died (only written under the lock)."""
        try:
            names = self.fs.listdir(self.root)
        except OSError:
            return
        for n in names:
            if n.startswith(f"{HEAD_NAME}.tmp."):
                self._unlink_quietly(os.path.join(self.root, n))

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
                self._unlink_quietly(os.path.join(self.root, n))

    def footprint(self) -> dict[str, int]:
        """Bytes the catalog occupies as data: its frames (base frame, suffix, confirms;
        not the reserved tail), the snapshot its base frame names, and the generation
        (call after ``locked``)."""
        self._check_process()
        return {"catalog_bytes": self._offset, "snapshot_bytes": self._snap_bytes,
                "suffix_bytes": self._offset - self._base_end, "generation": self._gen}

    @property
    def data_bytes(self) -> int:
        """Bytes of transactions (and confirm frames) this client has replayed: the
        catalog's size without its reserved tail (call after ``locked``)."""
        self._check_process()
        return self._offset

    # --- operator repair (D6: fail closed, keep the bytes, GC waits for the operator) ----
    def repair(self) -> list[dict[str, Any]]:
        """Make a damaged catalog readable again; returns one report per damaged frame
        (offset, bytes lost, side file) — empty if the catalog was not damaged.

        Under the pool lock, for each damaged frame: its bytes are copied to a durable
        side file, then overwritten in place by a valid frame of the same length holding a
        ``repaired`` operation (see the module docstring); finally ``repaired`` is
        appended at the end for clients that replayed past the damage.  Collection then
        refuses until ``confirm_repairs``."""
        self._check_process()  # before the mutex (ProcessBound)
        done: list[dict[str, Any]] = []
        with self._mutex, self._pool_lock():
            self._reset()  # replay everything: this client may have replayed past it
            for _ in range(_MAX_REPAIRS):
                try:
                    self._refresh()
                    break
                except _CatalogDamaged as e:
                    done.append(self._fill(e.offset, e.later))
                    self._reset()
            else:
                raise CorruptData(f"catalog {self.path}: more than {_MAX_REPAIRS} damaged "
                                  "frames; restore the pool from a backup")
            ops = [{"op": "repaired", "at": r["offset"], "lost": r["lost_bytes"],
                    "side": r["side_file"]} for r in done if not r.get("restored_from")]
            if ops:
                self.append(ops)
        return done

    def _fill(self, at: int, later: list[framing.ScannedFrame]) -> dict[str, Any]:
        """Replace the damaged bytes at ``at`` (up to the next valid frame) by one valid
        frame of the same length; absorb following frames (their operations go into it)
        only if the damaged region is too short to hold the ``repaired`` operation."""
        lost = later[0].offset - at
        n = 0
        while self.fs.probe(os.path.join(self.root, f"{CATALOG_NAME}.damaged-{at}-{n}")):
            n += 1
        side = f"{CATALOG_NAME}.damaged-{at}-{n}"
        repaired = {"op": "repaired", "at": at, "lost": lost, "side": side}
        absorbed: list[dict[str, Any]] = []
        end = later[0].offset
        head = self._head_copy() if at == 0 else None
        if head is not None and len(head) == end:
            # the base frame itself is damaged: its durable copy restores it exactly,
            # nothing is lost (the copy is checked like the frame it replaces)
            self._restore_head(side, head)
            return {"offset": 0, "lost_bytes": 0, "side_file": side,
                    "restored_from": HEAD_NAME}
        filler = _filler(at, end - at, [*absorbed, repaired])
        for f in later:
            if filler is not None or f.offset != end:
                break
            if f.header.kind != framing.KIND_CATALOG:
                raise CorruptData(f"{self.path} offset {f.offset}: not a catalog frame")
            absorbed += decode_ops(f.body, f"{self.path} offset {f.offset}")
            end = f.offset + f.header.frame_length
            filler = _filler(at, end - at, [*absorbed, repaired])
        if filler is None:
            raise CorruptData(f"catalog {self.path}: cannot repair the damaged frame at "
                              f"offset {at}; restore the pool from a backup")
        fd = self.fs.open(self.path, write=True)
        try:
            read_at = framing.read_at_fn(self.fs, fd)
            self.fs.write_file_durable(os.path.join(self.root, side), read_at(at, end - at))
            self.fs.writev(fd, [filler], at)  # in place: a crash leaves it damaged, not short
            self.fs.fsync(fd)
        except OSError as e:
            raise storage_error(e, f"cannot repair catalog {self.path}") from e
        finally:
            self.fs.close(fd)
        return {"offset": at, "lost_bytes": lost, "side_file": side}

    def _restore_head(self, side: str, head: bytes) -> None:
        try:
            framing.decode_frame(head)
        except (framing.TornFrame, CorruptData) as e:
            raise CorruptData(f"catalog {self.path}: its base frame and the copy "
                              f"{HEAD_NAME} are both damaged ({e}); restore the pool from a "
                              "backup") from None
        fd = self.fs.open(self.path, write=True)
        try:
            read_at = framing.read_at_fn(self.fs, fd)
            self.fs.write_file_durable(os.path.join(self.root, side), read_at(0, len(head)))
            self.fs.writev(fd, [head], 0)
            self.fs.fsync(fd)
        except OSError as e:
            raise storage_error(e, f"cannot repair catalog {self.path}") from e
        finally:
            self.fs.close(fd)

    def confirm_repairs(self) -> list[str]:
        """The operator's say after a repair: collection may act again.  Returns the side
        files of the repairs confirmed."""
        with self.locked() as st:
            sides = sorted(st.unconfirmed_repairs)
            if sides:
                self.append([{"op": "repair_confirmed", "sides": sides}])
            return sides

    # --- operations ---------------------------------------------------------------------
    def pack_open(self, path: str) -> None:
        with self.locked() as st:
            if path in st.packs:
                raise UnsafeRecovery(f"pack path {path} is already known to the catalog; "
                                     "pack paths are never reused (D3)")
            self.append([{"op": "open", "path": path}])

    def pack_sealed(self, path: str, offsets: Iterable[int], unstage: Iterable[int] = ()
                    ) -> None:
        with self.locked():
            self.append([{"op": "sealed", "path": path, "offsets": sorted(offsets),
                          "unstage": sorted(unstage)}])

    def seal_if_open(self, packs: dict[str, tuple[list[int], list[int]]],
                     prefix: str | None = None) -> None:
        """Recovery: mark a dead incarnation's packs sealed (path -> offsets, unstage).
        Packs under ``prefix`` the catalog calls open but that do not exist on disk (a
        crash right after ``open`` was recorded) are sealed empty, so they do not stay
        "open" forever.  The caller holds the writer lock of that prefix."""
        with self.locked() as st:
            packs = dict(packs)
            if prefix is not None:
                for p, info in st.packs.items():
                    if p.startswith(prefix) and info.state == "open" and p not in packs:
                        packs[p] = ([], [])
            ops = [{"op": "sealed", "path": p, "offsets": sorted(offs), "unstage": sorted(un)}
                   for p, (offs, un) in sorted(packs.items())
                   if st.packs.get(p, PackInfo()).state == "open"
                   and not st.is_tombstoned(p)]
            if ops:
                self.append(ops)

    def record_edges(self, edges: list[tuple[Extent, list[Extent]]]) -> None:
        """Retain dependencies before the dependent bytes are written (D1, D4)."""
        with self.locked() as st:
            for _, deps in edges:
                dead = st.tombstoned_dependency(deps)
                if dead is not None:
                    raise InvalidReference(
                        f"dependency in pack {dead[0]} at offset {dead[1]} (or one it depends "
                        "on) was reclaimed (tombstoned); it cannot be depended on"
                    )
            self.append([{"op": "edges", "src": list(src), "deps": [list(d) for d in deps]}
                         for src, deps in edges])

    def _run(self) -> str:
        """The run whose owners this client changes (owners belong to a run)."""
        if self.run_id is None:
            raise ValueError(f"catalog {self.path} was opened without a run: it can only "
                             "observe; open it with run_id to change owners")
        return self.run_id

    def retain(self, owner: str, roots: Iterable[Extent]) -> None:
        self._check_process()
        run = self._run()
        roots = sorted(set(roots))
        with self.locked() as st:
            dead = st.tombstoned_dependency(roots)
            if dead is not None:
                raise InvalidReference(
                    f"cannot retain for owner {owner!r}: the extent at {dead[0]} offset "
                    f"{dead[1]} (a root or one of its dependencies) was reclaimed (tombstoned)"
                )
            self.append([{"op": "retain", "run": run, "owner": owner,
                          "packs": by_pack(roots)}])

    def release(self, owner: str, *, only_if: Iterable[Extent] | None = None) -> bool:
        """Drop this run's owner ``owner``; False if this run has none of that name.
        ``only_if``: drop it only if its roots are exactly these extents, checked under
        the catalog's lock (``OwnerMismatch`` otherwise, nothing changed)."""
        run = self._run()
        with self.locked() as st:
            roots = st.owners.get((run, owner))
            if roots is None:
                return False
            if only_if is not None and set(roots) != set(only_if):
                raise OwnerMismatch(
                    f"owner {owner!r} of run {run!r} retains {len(roots)} root(s) other than "
                    "the reference(s) it was to be released with: not released (a record "
                    "naming this owner was edited, or names someone else's owner)")
            self.append([{"op": "release", "run": run, "owner": owner}])
            return True

    def adopt(self, owner: str, epoch: int, *, add: Iterable[Extent] = (),
              replace: Iterable[Extent] | None = None, unstage: Iterable[Extent] = (),
              announced: Announcement | None = None) -> bool:
        """A queue coordinator's fenced update of its owner (see ``adopt`` above).  Returns
        False if a newer epoch already owns it (this coordinator is fenced).

        Plain additions from concurrent threads are combined: whichever thread gets the
        catalog first writes every pending addition in ONE transaction (one lock, one
        fsync) and the others find their request done — group commit for the catalog."""
        self._check_process()  # before the pending lock and the mutex
        run = self._run()
        add = sorted(set(add))
        if replace is None and not unstage:
            return self._adopt_combined(owner, epoch, add, announced)
        if announced is not None:
            with self._pending_lock:
                self._arrived(announced)
        with self.locked() as st:
            if epoch < st.owner_epochs.get((run, owner), 0):
                return False
            dead = st.tombstoned_dependency(
                add + (sorted(set(replace)) if replace is not None else []))
            if dead is not None:
                raise InvalidReference(
                    f"cannot adopt for {owner!r}: the extent at {dead[0]} offset {dead[1]} (or "
                    "a dependency of what was given) was reclaimed (tombstoned)"
                )
            op: dict[str, Any] = {"op": "adopt", "run": run, "owner": owner, "epoch": epoch,
                                  "add": [list(e) for e in add],
                                  "unstage": [list(e) for e in sorted(set(unstage))]}
            if replace is not None:
                op["replace"] = [list(e) for e in sorted(set(replace))]
            self.append([op])
            return True

    @contextlib.contextmanager
    def adopting_soon(self) -> Iterator[Announcement]:
        """Announce a plain ``adopt`` this thread is about to make (pass the yielded
        announcement to it): a thread writing pending adopts meanwhile waits for it."""
        self._check_process()
        a = Announcement(self)
        with self._pending_lock:
            self.siblings.announce()
        try:
            yield a
        finally:
            with self._pending_lock:
                self._arrived(a)

    def _arrived(self, a: Announcement | None) -> None:
        """With ``_pending_lock`` held: the announced caller queued (or gave up)."""
        if a is not None and not a.arrived:
            if a.catalog is not self:
                raise ValueError("an Announcement must go to the Catalog that made it")
            a.arrived = True
            self.siblings.arrive()

    def _adopt_combined(self, owner: str, epoch: int, add: list[Extent],
                        announced: Announcement | None) -> bool:
        req = _AdoptRequest(self._run(), owner, epoch, add)
        with self._pending_lock:
            self._pending.append(req)
            self._arrived(announced)
        with self._mutex:
            if req.done:  # an earlier holder wrote it for us
                return req.finish()
            return self._write_pending(req)

    def _write_pending(self, req: _AdoptRequest) -> bool:
        with self._pending_lock:
            self.siblings.gather()
        with self._flocked() as st:
            with self._pending_lock:
                batch, self._pending = self._pending, []
            ops = []
            for r in batch:
                r.done = True
                if r.epoch < st.owner_epochs.get((r.run, r.owner), 0):
                    r.result = False
                    continue
                dead = st.tombstoned_dependency(r.add)
                if dead is not None:
                    r.error = InvalidReference(
                        f"cannot adopt for {r.owner!r}: the extent at {dead[0]} offset "
                        f"{dead[1]} (given, or a dependency) was reclaimed (tombstoned)")
                    continue
                ops.append({"op": "adopt", "run": r.run, "owner": r.owner, "epoch": r.epoch,
                            "add": [list(e) for e in r.add], "unstage": []})
            if ops:
                try:
                    self.append(ops)
                except BaseException as e:
                    for r in batch:
                        if r.error is None and r.result:
                            r.error = e
                    raise
            return req.finish()

    def unstage(self, extents: Iterable[Extent], dependencies: Iterable[Extent] = ()) -> int:
        """release_publications: drop the staging of ``extents`` and ``dependencies`` (their
        staged closure, ``SharedFilesystemStore.staged_dependencies``) in one transaction.
        Returns how many of ``extents`` were still staged."""
        with self.locked() as st:
            named = [e for e in sorted(set(extents)) if st.may_be_staged(e)]
            deps = [e for e in sorted(set(dependencies) - set(extents)) if st.may_be_staged(e)]
            if named or deps:
                self.append([{"op": "unstage", "packs": by_pack(named + deps)}])
            return len(named)

    def collect(self) -> dict[str, Any]:
        """One collection of this run's packs: tombstone what nothing (of any run) reaches,
        make it durable, unlink (D3/D4).  Other runs' files are never touched.  Refused
        after an operator repair until it is confirmed (D6: transactions may have been
        lost with the damaged frame)."""
        return self._collect(self._run())

    def collect_pool(self) -> dict[str, Any]:
        """The operator's pool-wide collection: every run's unreachable packs."""
        return self._collect(None)

    def _collect(self, run: str | None) -> dict[str, Any]:
        prefix = "" if run is None else run_prefix(run)
        with self.locked() as st:
            if st.unconfirmed_repairs:
                raise UnsafeRecovery(
                    f"catalog {self.path} was repaired (damaged bytes kept in "
                    f"{', '.join(sorted(st.unconfirmed_repairs))}): transactions may be lost, "
                    "so garbage collection is stopped. Re-retain what must live, then confirm "
                    "with SharedFilesystemStore.confirm_catalog_repair()"
                )
            unfinished = st.tombstoned_not_unlinked(prefix)
            victims = st.collectable(prefix)
            _check_deletable(self.path, victims + unfinished)
            sizes: dict[str, int] = {}
            for p in victims + unfinished:
                try:
                    sizes[p] = self.fs.stat(os.path.join(self.root, p)).size
                except FileNotFoundError:
                    sizes[p] = 0
            if victims:
                self.append([{"op": "tombstone", "paths": victims}])  # durable before unlink
            gone = []
            dirs = set()
            for p in victims + unfinished:
                full = os.path.join(self.root, p)
                try:
                    self.fs.unlink_beneath(self.root, p)  # never through a symlink
                except FileNotFoundError:
                    pass  # another client finished this unlink already: success
                except OSError as e:
                    raise storage_error(e, f"cannot unlink reclaimed pack {full}") from e
                gone.append(p)
                dirs.add(os.path.dirname(full))
            for d in sorted(dirs):
                try:
                    self.fs.fsync_dir(d)
                except FileNotFoundError:
                    pass
            if gone:
                self.append([{"op": "unlinked", "paths": gone}])
            live = st.live_packs()
            retained = sorted(p for p in live if p.startswith(prefix) and
                              not st.packs.get(p, PackInfo()).tombstoned)
            # owners keeping something alive (straw-queue's count): a queue's owner
            # stays in the catalog, empty, once its tasks hold no input any more
            named = st.run_owners(run).items() if run is not None else (
                (f"{r}/{name}", roots) for (r, name), roots in st.owners.items())
            owners = sorted(name for name, roots in named if len(roots))
            # ... and the publications still staged in sealed packs, each its own root
            # as in straw-queue (whose catalog keeps one staging owner per publication).
            # Counted per pack (extents less those no longer staged: an extent leaves
            # staging at most once), not extent by extent: online GC runs this often.
            staged = sum(max(0, len(i.offsets) - len(i.unstaged))
                         for p, i in st.packs.items()
                         if p.startswith(prefix) and i.state == "sealed" and not i.tombstoned)
            return {
                # straw-queue's counts
                "reclaimed_files": len(gone),
                "reclaimed_bytes": sum(sizes.get(p, 0) for p in gone),
                "tombstones": len(victims),
                "retained_packs": len(retained),
                "open_packs": sum(1 for p, i in st.packs.items() if p.startswith(prefix)
                                  and i.state == "open" and not i.tombstoned),
                "owners": len(owners) + staged,
                # and what they count
                "tombstoned": victims,
                "finished_interrupted": unfinished,
                "retained_pack_paths": retained,
                "owner_names": owners,
            }


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


class Announcement:
    """An adopt announced by ``Catalog.adopting_soon`` (``arrived`` once it is queued)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.arrived = False


@dataclass
class _AdoptRequest:
    run: str
    owner: str
    epoch: int
    add: list[Extent]
    done: bool = False
    result: bool = True
    error: BaseException | None = None

    def finish(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.result


class _CatalogDamaged(CorruptData):
    """The catalog is damaged where it may have been acknowledged: fail closed (D6)."""

    def __init__(self, path: str, e: framing.DamagedFrame) -> None:
        super().__init__(
            f"catalog {path}: the frame at offset {e.offset} is damaged and later "
            "transactions follow it, so it may have been acknowledged: it is never cut off "
            "(D6). Nothing in this pool can be retained, released or collected until an "
            "operator repairs it with SharedFilesystemStore.repair_catalog() (the damaged "
            "bytes are kept aside; garbage collection then waits for "
            f"confirm_catalog_repair()). Detail: {e}"
        )
        self.offset = e.offset
        self.later = e.later


_MAX_REPAIRS = 64
_CONFIRM_LENGTH = len(framing.encode_frame(
    framing.KIND_CATALOG, msgpack.packb({"v": CATALOG_VERSION, "ops": [], "n": bytes(_NONCE)},
                                        use_bin_type=True), group_start=0))


def _check_deletable(catalog: str, paths: Iterable[str]) -> None:
    """A collection deletes only canonical pack paths (``runs/<run>/writers/<w>/i<n>/
    pack-<n>.pack``: relative, no ``..``), which every pack straw creates has: a catalog
    naming anything else was edited or damaged, and nothing of it is deleted."""
    for p in paths:
        if not isinstance(p, str) or pack_path_run(p) is None:
            raise CorruptData(
                f"catalog {catalog} names {p!r} as a pack to reclaim, which is not a pack "
                "path of this pool (edited or damaged): garbage collection deletes nothing "
                "until the catalog is restored from a backup")


def _holds_complete_frame(buf: bytes) -> bool:
    """Does ``buf`` hold a whole frame anywhere (a valid header, all its bytes present)?"""
    i = buf.find(framing.MAGIC)
    while i >= 0:
        try:
            header = framing.decode_header(buf[i:i + framing.HEADER_SIZE])
        except (framing.TornFrame, CorruptData, UnsupportedSchema):
            header = None
        if header is not None and len(buf) - i >= header.frame_length:
            return True
        i = buf.find(framing.MAGIC, i + 1)
    return False


def _filler(at: int, length: int, ops: list[dict[str, Any]]) -> bytes | None:
    """A valid catalog frame at ``at`` of exactly ``length`` bytes holding ``ops`` (padded
    with a ``pad`` field, which replay ignores), or None if ``ops`` do not fit."""
    for extra in ({}, {"q": 0}):  # "q" bridges the lengths a bin header size change skips
        txn: dict[str, Any] = {"v": CATALOG_VERSION, "ops": ops, **extra, "pad": b""}
        want = length - framing.HEADER_SIZE - len(msgpack.packb(txn, use_bin_type=True))
        for k in range(max(0, want - 4), want + 1):
            txn["pad"] = b"\xa5" * k  # not zeros: a zero run would read as the clean end
            body = msgpack.packb(txn, use_bin_type=True)
            if framing.HEADER_SIZE + len(body) == length:
                return framing.encode_frame(framing.KIND_CATALOG, body, group_start=at)
    return None


__all__ = ["Catalog", "CatalogState", "OwnerKey", "PackInfo", "read_state"]
