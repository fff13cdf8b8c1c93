"""The catalog's log: one file shared by every client of the pool, under its ``flock``.

One append-only log per pool, ``<root>/CATALOG``.  Its inode never changes (it is never
replaced or renamed), because an ``flock`` on it is also the pool's cross-client lock:
every catalog change and every collection happens under that lock.  Each transaction is
one frame (``straw.framing``, kind CATALOG) holding a msgpack list of operations, appended
and synced (``fdatasync``) before the lock is released; a client replays only what was
appended since it last looked (it re-reads the last frame it replayed first: if those bytes
changed, a repair rewrote the catalog and it replays from the start).

Torn tail versus damaged acknowledged tail (D6): confirm frames (``straw.durable.confirm``,
the protocol shared with the queue journal).  The catalog's confirm is a catalog frame
without operations (``ops: []`` plus a random nonce, so replay needs no format change),
written after a transaction's fsync, before the append returns (the lock is still held);
the next transaction, whoever appends it, joins its write group.  A torn tail is cut off
under the lock; a process killed after the fsync but before the confirm left an intact
frame, and the next client that replays it fsyncs it and writes the missing confirm.

Blind spots, besides the double fault of every confirm: damage that zeroes ``_CLEAN_RUN``
(8 KiB) or more of synced frames reads as the reserved tail, the clean end (a flipped byte
never does).  A damaged final confirm is cut like any torn tail; it carries no operation.
Whenever a cut would remove a complete frame (all its bytes present, whether its checksum
holds or not) the bytes cut are first copied to a durable side file
``CATALOG.torn-<offset>-<n>``.

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

A ``Catalog`` handle belongs to the process that opened it (``straw.process``): its lock
descriptor shares the parent's open file description after a fork (the child would pass
the parent's pool lock, and its unlock would release it) and its replayed state is the
parent's.  In a forked child every operation raises ``ForkedProcess`` before taking any
lock; ``close()`` only closes the child's copy of the descriptor.

Repair: ``straw.pool.catalog.repair``; compaction: ``straw.pool.catalog.compaction``; the
operations and their state: ``straw.pool.catalog.catalog``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from typing import Any

import msgpack

from ...durable import framing
from ...durable.confirm import write_confirm
from ...errors import (
    CorruptData,
    QuotaExceeded,
    UnsupportedSchema,
    storage_error,
)
from ...fs import Filesystem
from ...process import ProcessBound, close_quietly
from .read import (
    CATALOG_NAME,
    decode_ops,
    frame_tag,
    load_snapshot,
    read_to_clean_end,
)
from .snapshot import (
    HEAD_NAME,
    snapshot_gen,
)
from .state import (
    CATALOG_VERSION,
    CatalogState,
    freeing_bytes,
)

RESERVE_STEP = 256 << 10  # the reservation grows in these steps
RESERVE_FLOOR = 64 << 10  # reserved bytes past the data that only freeing appends may use
_NONCE = 8  # random bytes in a confirm frame: no two confirms have the same bytes


class CatalogLog(ProcessBound):
    """A client's view of the pool's catalog file: the pool lock, replay into ``state``,
    durable appends with their confirm, torn tails cut, the reserved headroom.
    Thread-safe (``_mutex``)."""

    _process_state = "its pool lock descriptor and catalog position"

    def __init__(self, fs: Filesystem, root: str, run_id: str | None = None) -> None:
        self._bind_process()
        self.fs = fs
        self.root = root
        self.run_id = run_id
        self.path = os.path.join(root, CATALOG_NAME)
        self.state = CatalogState()
        self._gen = 0  # generation of the snapshot the catalog's base frame names (0: none)
        self._head = b""  # the catalog's first frame as replayed (a compaction replaces it)
        self._base_end = 0  # where the suffix starts: the end of the first frame
        self._snap_bytes = 0  # size of the snapshot the base frame names
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

    def _process_subject(self) -> str:
        return f"catalog handle of pool {self.root}"

    def _drop_inherited(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        close_quietly(self.fs, fd)

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
            self._settle(fd, scan, data, base, bool(last_ops))
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

    def _settle(self, fd: int, scan: framing.ScanResult, data: bytes, base: int,
                unconfirmed: bool) -> None:
        """After a refresh's replay of ``data`` (read from ``base``), under the lock: cut a
        torn tail, confirm an unconfirmed last transaction, and give an empty catalog its
        first frame."""
        if scan.torn:
            # a client died mid-append (or a power loss tore the unsynced group): cut
            # its torn transaction off, under the lock
            self._cut(fd, scan.end, data[scan.end - base:])
        if unconfirmed:
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
        # the timestamps fsync would add are not needed, and this runs once per completion
        self.fs.fdatasync(fd)
        self._tail_start, self._tail = self._offset, frame
        self._offset += len(frame)
        self._group_start = self._offset
        self._size = max(self._size, self._offset)
        self._confirm(fd)
        return frame

    def _confirm(self, fd: int) -> None:
        """Write a confirm frame after the durable last transaction (``straw.durable.
        confirm``).  Best effort: the transaction is durable either way; without its
        confirm, damage to it would look torn until the next transaction follows it."""
        body = msgpack.packb({"v": CATALOG_VERSION, "ops": [], "n": os.urandom(_NONCE)},
                             use_bin_type=True)
        try:
            frame = write_confirm(self.fs, fd, self._offset, framing.KIND_CATALOG, body)
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
        self._appended()

    def _appended(self) -> None:
        """After every append, under the lock: a subclass may start work (compaction)."""

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


_CONFIRM_LENGTH = len(framing.encode_frame(
    framing.KIND_CATALOG, msgpack.packb({"v": CATALOG_VERSION, "ops": [], "n": bytes(_NONCE)},
                                        use_bin_type=True), group_start=0))


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
