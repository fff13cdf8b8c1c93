"""The queue journal's writer: an append-only, framed log of opaque transactions with
group commit, snapshots and epochs.  The coordinator (the single writer of one queue)
builds on it.

Role.  The coordinator hands the journal opaque ``bytes`` transactions; ``commit`` returns
only once the transaction is durable.  ``straw.durable.recovery.recover`` rebuilds what
the next coordinator needs; the files and records are ``straw.durable.segments``.  The
journal knows nothing about tasks or leases.

Group commit.  ``commit`` (or ``enqueue`` + ``wait``) is called from many threads.
``enqueue`` appends the request to a pending list under the mutex and assigns its sequence
number (so a caller that enqueues under its own lock gets journal order = its apply order).
``wait(seq)``: if ``seq`` is not durable yet and no sync is in flight, the caller becomes
the leader: it takes everything pending, writes it with ONE ``writev`` (all frames share a
write group: same group start) and ONE ``fdatasync``, calls ``fence()``, and wakes
everybody.  A lone caller never waits for anything (no timers, no sleeps; the bounded
wait for announced siblings below needs someone else in flight).  Requests that
arrive during a sync are taken by the next leader.  A caller about to enqueue can
announce itself (``incoming()``): a leader waits for announced callers, at most
``group_wait`` seconds, so their transactions join its group (``straw.siblings``).
If the write, the sync or ``fence()``
fails, every waiter of that batch gets ``IndeterminateCommit`` (cause chained) and the
journal is unusable: later calls raise ``Fenced`` (when ``fence`` raised ``Fenced``) or
``StorageUnavailable``, and so do waiters of requests that were still pending (those were
never written).  A sync is never retried.  A new write group starts only after the
previous group's sync returned (the writer side of D6).  Space is reserved ahead
(``Filesystem.reserve``) so that a commit usually does not change the file size; reserved
zeros are the clean end for the scanner and are trimmed when the segment rotates or the
journal closes.

Segments rotate when a group would take a segment past ``segment_target_bytes``: the old
segment's last confirm is synced; the new segment is created exclusively, its header and
the group are written as one group, synced, and its name made durable with ``fsync_dir``;
then a rotated record naming the new segment ends the old one, synced, before the commit
returns (three syncs per rotation instead of one: rotations are rare).  So a segment that
ends with a rotated record had a durable successor, and a missing newest segment is
detected; a crash before the rotated record is durable leaves at most a torn rotated
record after the old segment's last confirm.

Snapshots (``snapshot``): ``straw.durable.journal_snapshot``.

What the coordinator must guarantee (see also ``Journal``):

* one writer per epoch, epochs increasing: ``Journal(epoch=E)`` needs E >
  ``recovered.last_epoch``, and segment names are created exclusively, so two
  incarnations can never write the same epoch;
* the fence: a takeover makes its new epoch durable where ``fence()`` looks (the queue's
  lock/epoch file) BEFORE calling ``recover``; then a fenced coordinator's snapshot either
  is seen and used by the takeover's recovery or is ignored, and its deletions never
  remove segments the new epoch needs.

Fork safety (``straw.process``): a ``Journal`` belongs to the process that opened it.  In
a forked child every method raises ``ForkedProcess`` before taking the mutex (another
thread may have held it at the fork), and ``close()`` only closes the child's copy of the
segment descriptor: it never leads a group, writes or trims the parent's segment.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..clock import Clock, SystemClock
from ..errors import Fenced, IndeterminateCommit, StorageUnavailable, StrawError, storage_error
from ..fs import Buffer, Filesystem
from ..process import OPEN_QUEUE_IN_CHILD, ProcessBound, close_quietly
from ..siblings import DEFAULT_GROUP_WAIT, Siblings
from . import framing
from .confirm import write_confirm
from .journal_snapshot import write_snapshot
from .segments import (
    CONFIRM_LEN,
    DEFAULT_RESERVE,
    DEFAULT_SEGMENT_TARGET,
    ROTATED_LEN,
    TAG_CONFIRM,
    TAG_TXN,
    TAIL_LEN,
    Position,
    Recovered,
    batch_body,
    rotated_body,
    segment_header_body,
    segment_name,
)

# --- the writer ---------------------------------------------------------------------------

class _Request:
    __slots__ = ("body", "ntx")

    def __init__(self, body: list[Buffer], ntx: int) -> None:
        self.body = body
        self.ntx = ntx


class Journal(ProcessBound):
    """The writer of one epoch of a queue journal.  Thread-safe.

    ``Journal(fs, directory, epoch=E, recovered=recover(fs, directory), clock=...,
    segment_target_bytes=..., reserve_bytes=..., fence=..., group_wait=...)`` starts
    epoch E (> ``recovered.last_epoch``): it creates the epoch's first segment exclusively and
    durably writes the epoch-start record (cutoffs ``recovered.cutoffs``) before returning
    (D9: the new epoch is durable before service), then calls ``fence()``.

    Two ways to commit: ``commit(txn)`` (enqueue and wait), or ``enqueue(txn)`` under the
    caller's own lock (so that journal order is the caller's apply order) followed by
    ``wait(seq)`` outside it.  Sequence numbers are assigned at enqueue, in journal order.

    ``fence`` (optional) is called after every durable group and before a snapshot deletes
    anything; it must raise ``Fenced`` when this coordinator's epoch is no longer current.
    It runs outside the journal's mutex, in the leading thread.
    """

    _process_state = "its open segment and pending group commits"
    _process_remedy = OPEN_QUEUE_IN_CHILD

    def __init__(self, fs: Filesystem, directory: str, *, epoch: int, recovered: Recovered,
                 clock: Clock | None = None, segment_target_bytes: int = DEFAULT_SEGMENT_TARGET,
                 reserve_bytes: int = DEFAULT_RESERVE,
                 fence: Callable[[], None] | None = None,
                 group_wait: float = DEFAULT_GROUP_WAIT) -> None:
        self._bind_process()
        if epoch <= recovered.last_epoch:
            raise Fenced(f"journal {directory}: cannot start epoch {epoch}, epoch "
                         f"{recovered.last_epoch} already exists there; a newer coordinator "
                         "took over, or the epoch was not bumped. Recover again")
        if segment_target_bytes <= 0:
            raise ValueError(f"segment_target_bytes must be positive, not "
                             f"{segment_target_bytes}")
        self.fs = fs
        self.dir = directory
        self.epoch = epoch
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.segment_target_bytes = segment_target_bytes
        self.reserve_bytes = max(0, reserve_bytes)
        self.fence = fence
        self.cutoffs = dict(recovered.cutoffs)
        self._next_seq = recovered.seq  # last sequence number handed out by enqueue
        self._durable = recovered.seq  # last sequence number known durable (and unfenced)
        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)
        self._siblings = Siblings(self._mu, group_wait)  # announced, not enqueued yet
        self._pending: list[_Request] = []
        self._busy = False  # a leader (or a snapshot) is doing I/O outside the mutex
        self._broken: tuple[type[StrawError], str] | None = None
        self._failed: tuple[int, int, BaseException] | None = None  # the batch that failed
        self._closed = False
        self._fd: int | None = None
        self._seg = 0
        self._end = 0  # end of the valid data in the current segment (its confirm included)
        self._data_start = 0  # end of the current segment's header and its confirm
        self._group = 0  # group start for the next frames: the offset of the last confirm
        self._reserved = 0
        self._m = {"commits": 0, "frames": 0, "groups": 0, "fsyncs": 0, "dir_fsyncs": 0,
                   "bytes": 0, "max_group": 0, "rotations": 0, "snapshots": 0,
                   "snapshot_bytes": 0, "deleted_files": 0, "cleanup_errors": 0}
        self.last_cleanup_error: str | None = None
        try:
            fs.makedirs_durable(directory)
            self._new_segment(1, [], self._durable)
        except FileExistsError:
            raise Fenced(f"journal {directory}: epoch {epoch} was already started by "
                         "another coordinator") from None
        except OSError as e:
            raise storage_error(e, f"cannot start journal epoch {epoch} in {directory}") from e
        try:
            if fence is not None:
                fence()
            self._confirm()  # the epoch-start record is durable: confirm it
        except BaseException as e:
            self._abandon_fd()
            if isinstance(e, OSError):
                raise storage_error(e, f"cannot start journal epoch {epoch} in "
                                    f"{directory}") from e
            raise

    # --- public ------------------------------------------------------------------------
    @property
    def position(self) -> Position:
        """(epoch, segment, offset) just after the last record written: the last durable
        group's confirm record (which the next sync, or ``close``, makes durable)."""
        self._check_process()
        with self._mu:
            return (self.epoch, self._seg, self._end)

    @property
    def path(self) -> pathlib.Path:
        """The segment this journal appends to now (straw-queue's ``journal.path`` names
        its one journal file; ours is a directory of segments, and this is the newest)."""
        self._check_process()
        with self._mu:
            return pathlib.Path(self.dir, segment_name(self.epoch, self._seg))

    @property
    def seq(self) -> int:
        """Sequence number of the last durable (acknowledgeable) transaction."""
        self._check_process()
        with self._mu:
            return self._durable

    @property
    def sequence(self) -> int:
        """straw-queue's name for ``seq``: callers compare it around a request to see that
        it journaled one transaction (or, when retried, none)."""
        self._check_process()
        return self.seq

    def metrics(self) -> dict[str, Any]:
        self._check_process()
        with self._mu:
            out: dict[str, Any] = dict(self._m)
            out["sibling_waits"] = self._siblings.waits
            out["position"] = (self.epoch, self._seg, self._end)
            out["seq"] = self._durable
            out["pending"] = len(self._pending)
            return out

    def commit(self, txn: Buffer) -> int:
        """Append one transaction; returns its sequence number once it is durable (and
        ``fence()`` passed).  ``IndeterminateCommit`` if its group's write, sync or fence
        failed (it may or may not be durable; the journal is then unusable);
        ``Fenced``/``StorageUnavailable`` if it was never written (the journal was or
        became unusable first)."""
        self._check_process()
        return self.wait(self.enqueue(txn))

    def commit_many(self, txns: Sequence[Buffer]) -> int:
        """Append several transactions atomically (one frame: after a crash, all or none
        of them are recovered); returns the sequence number of the last one."""
        self._check_process()
        return self.wait(self.enqueue_many(txns))

    def enqueue(self, txn: Buffer) -> int:
        """Queue one transaction for the next group and return its sequence number at
        once (nothing is durable yet: ``wait`` for it before acknowledging)."""
        self._check_process()
        return self._enqueue(_Request([TAG_TXN, txn], 1))

    def enqueue_many(self, txns: Sequence[Buffer]) -> int:
        """``enqueue`` for an atomic batch (one frame); returns the last sequence number."""
        self._check_process()
        if not txns:
            raise ValueError("enqueue_many needs at least one transaction")
        return self._enqueue(_Request(batch_body(txns), len(txns)))

    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Announce a transaction about to be enqueued inside this block: a leader
        syncing meanwhile waits (at most ``group_wait``) for it to join its group."""
        self._check_process()
        with self._mu:
            self._siblings.announce()
        try:
            yield
        finally:
            with self._mu:
                self._siblings.arrive()

    def wait(self, seq: int) -> int:
        """Return ``seq`` once every transaction up to it is durable.  If no sync is in
        flight, the caller leads the next group (writes everything pending); otherwise it
        waits for the group in flight and then, if still needed, leads.  Raises as
        ``commit``."""
        self._check_process()
        with self._cond:
            self._drive(seq)
        return seq

    def snapshot(self, state: Buffer) -> None:
        """Write a snapshot of ``state`` (see the module docstring).  ``state`` must
        reflect exactly the transactions enqueued before this call, and no other thread
        may enqueue until it returns (call it under the lock you enqueue under).  It first
        makes every enqueued transaction durable.  ``StorageUnavailable`` if the snapshot
        could not be written (the journal stays usable) or the rotation failed (the
        journal is unusable); ``Fenced`` if ``fence()`` raised (nothing deleted, the
        journal unusable); errors of the flush as ``wait``."""
        self._check_process()
        with self._cond:
            self._check_usable()
            while True:
                self._drive(self._next_seq, gather=False)  # nobody may enqueue now
                if not self._busy:
                    break
                self._cond.wait()  # another snapshot in flight
            self._busy = True
            pos = (self.epoch, self._seg, self._end)
            seq = self._durable
        try:
            self._snapshot(state, pos, seq)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def close(self) -> None:
        """Make what was enqueued durable (best effort: waiters see any error), trim the
        reserved tail and close.  Later calls raise ``StorageUnavailable``.  Idempotent.
        In a forked child: only closes the child's copy of the segment descriptor, taking
        no lock (the pending transactions and the segment are the parent's)."""
        if self._in_forked_child():
            self._drop_inherited()
            self._closed = True
            return
        with self._cond:
            while self._busy:
                self._cond.wait()
            if self._closed:
                return
            if self._pending and self._broken is None:
                self._lead(gather=False)
            self._closed = True
            self._cond.notify_all()
        self._abandon_fd(trim=True)

    def __enter__(self) -> Journal:
        self._check_process()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _process_subject(self) -> str:
        return f"journal {self.dir} (epoch {self.epoch})"

    def _drop_inherited(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        close_quietly(self.fs, fd)

    # --- group commit --------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._broken is not None:
            cls, msg = self._broken
            raise cls(msg)
        if self._closed:
            raise StorageUnavailable(f"journal {self.dir} epoch {self.epoch} is closed")

    def _enqueue(self, req: _Request) -> int:
        with self._mu:
            self._check_usable()
            self._pending.append(req)
            self._next_seq += req.ntx
            return self._next_seq

    def _drive(self, seq: int, gather: bool = True) -> None:
        """With the mutex held: return once ``seq`` is durable, leading groups as needed
        (``gather``: see ``_lead``)."""
        while True:
            if seq <= self._durable:
                return
            if self._failed is not None and self._failed[0] <= seq <= self._failed[1]:
                lo, hi, cause = self._failed
                raise IndeterminateCommit(
                    f"journal {self.dir} epoch {self.epoch}: transactions {lo}..{hi} may or "
                    f"may not be durable ({type(cause).__name__}: {cause}); the journal is "
                    "unusable: recover, then look the request up before retrying"
                ) from cause
            self._check_usable()  # broken or closed: this one was never written
            if seq > self._next_seq:
                raise ValueError(f"sequence number {seq} was never enqueued in journal "
                                 f"{self.dir} (last: {self._next_seq})")
            if self._busy:
                self._cond.wait()
                continue
            self._lead(gather)

    def _lead(self, gather: bool = True) -> None:
        """With the mutex held, not busy, something pending: write it as one group.
        ``gather``: first wait for announced siblings (not when the caller holds a lock
        they need — a snapshot, a close — where waiting could only waste the bound)."""
        self._busy = True
        if gather:
            try:
                self._siblings.gather()
            except BaseException:  # e.g. KeyboardInterrupt: never leave _busy stuck
                self._busy = False
                self._cond.notify_all()
                raise
        batch = self._pending
        self._pending = []
        lo = self._durable + 1
        hi = self._durable + sum(r.ntx for r in batch)
        self._cond.release()
        failure: BaseException | None = None
        try:
            self._write_group(batch)
        except BaseException as e:  # noqa: B036 - a SimulatedCrash too: never strand waiters
            failure = e
        finally:
            self._cond.acquire()
        if failure is None:
            self._durable = hi
            self._m["commits"] += hi - lo + 1
            self._m["frames"] += len(batch)
            self._m["groups"] += 1
            self._m["max_group"] = max(self._m["max_group"], len(batch))
        else:
            self._failed = (lo, hi, failure)
            self._mark_broken(failure)
        self._busy = False
        self._cond.notify_all()
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # the process is dying (SimulatedCrash, KeyboardInterrupt)

    def _mark_broken(self, failure: BaseException) -> None:
        if self._broken is not None:
            return
        if isinstance(failure, Fenced):
            self._broken = (Fenced, f"journal {self.dir} epoch {self.epoch} was fenced "
                            f"({failure}); this coordinator must stop")
        else:
            self._broken = (StorageUnavailable,
                            f"journal {self.dir} epoch {self.epoch} is unusable after "
                            f"{type(failure).__name__}: {failure}; recover the queue (a new "
                            "epoch) to continue")

    def _write_group(self, batch: list[_Request]) -> None:
        """Outside the mutex, as the only writer: one writev + one fdatasync, then fence,
        then the group's confirm record (before any waiter is told)."""
        lengths = [sum(memoryview(b).nbytes for b in r.body) for r in batch]
        total = sum(framing.HEADER_SIZE + n for n in lengths)
        try:
            if self._end > self._data_start and self._end + total > self.segment_target_bytes:
                self._rotate(batch)
            else:
                start = self._end
                buffers: list[Buffer] = []
                for r in batch:
                    # one write group with the confirm before it (D6): same group start
                    buffers.append(framing.encode_header(framing.KIND_JOURNAL, r.body,
                                                         group_start=self._group))
                    buffers.extend(r.body)
                assert self._fd is not None
                self._reserve(start + total + TAIL_LEN)
                self.fs.writev(self._fd, buffers, start)
                # the commit is acknowledged only after this sync; never retried
                self.fs.fdatasync(self._fd)
                self._m["fsyncs"] += 1
                self._end = start + total
            self._m["bytes"] += total
        except OSError as e:
            raise storage_error(e, f"journal {self.dir} write failed") from e
        if self.fence is not None:
            self.fence()
        try:
            self._confirm()
        except OSError as e:
            raise storage_error(e, f"journal {self.dir}: confirm record not written") from e

    def _confirm(self) -> None:
        """D6: after a group's sync and fence returned, and before any waiter is told, a
        confirm record right after it (``straw.durable.confirm``)."""
        assert self._fd is not None
        at = self._end
        write_confirm(self.fs, self._fd, at, framing.KIND_JOURNAL, TAG_CONFIRM)
        self._group = at
        self._end = at + CONFIRM_LEN

    def _rotate(self, batch: list[_Request]) -> None:
        """The group goes into a new segment, after its header, as one write group.  The
        old segment is finished so that a missing newest segment is detected: (1) its
        last confirm is synced (a segment that is not the last must be intact); (2) the
        new segment is made durable; (3) a *rotated* record naming it ends the old
        segment, synced.  A rotated segment whose successor is missing has lost it
        (``CorruptData`` at recovery); a crash before (3) is durable leaves the old
        segment intact, its rotated record absent or torn (recovery tells: see
        ``_lost_rotated_record``).  Raises OSError."""
        old, old_end, old_group = self._fd, self._end, self._group
        assert old is not None
        self.fs.fdatasync(old)
        self._m["fsyncs"] += 1
        try:
            self._new_segment(self._seg + 1, batch, self._durable)
        except BaseException:
            self._fd = old  # closed when the broken journal is closed
            raise
        self._end_segment(old, old_end, old_group)
        self._m["rotations"] += 1

    def _end_segment(self, fd: int, end: int, group: int) -> None:
        """Write the rotated record (naming the current segment, its durable successor)
        at ``end`` of the segment open as ``fd`` (it continues that segment's last write
        group), sync it, trim and close.  Raises OSError (``fd`` closed anyway)."""
        try:
            self.fs.writev(fd, [framing.encode_frame(
                framing.KIND_JOURNAL, rotated_body(self._seg), group_start=group)], end)
            self.fs.fdatasync(fd)
        except BaseException:
            try:
                self.fs.close(fd)
            except OSError:
                pass
            raise
        self._m["fsyncs"] += 1
        self._close_fd(fd, end + ROTATED_LEN)

    def _new_segment(self, seg: int, batch: list[_Request], seq: int) -> None:
        """Create segment ``seg`` exclusively: header + ``batch`` as one group at offset 0,
        one fdatasync, name durable (fsync_dir).  Its confirm is the caller's (after the
        fence).  Raises OSError."""
        path = os.path.join(self.dir, segment_name(self.epoch, seg))
        head = framing.encode_frame(
            framing.KIND_JOURNAL,
            segment_header_body(self.epoch, seg, seq, self.cutoffs, self.clock.now()),
            group_start=0)
        buffers: list[Buffer] = [head]
        for r in batch:
            buffers.append(framing.encode_header(framing.KIND_JOURNAL, r.body, group_start=0))
            buffers.extend(r.body)
        total = sum(memoryview(b).nbytes for b in buffers)
        fd = self.fs.open(path, write=True, create=True, exclusive=True)
        try:
            self._fd, self._seg, self._reserved = fd, seg, 0
            self._end = self._data_start = self._group = 0
            self._reserve(total + TAIL_LEN)
            self.fs.writev(fd, buffers, 0)
            self.fs.fdatasync(fd)
            self._m["fsyncs"] += 1
            self.fs.fsync_dir(self.dir)  # D1: the new name is durable before any ack
            self._m["dir_fsyncs"] += 1
        except BaseException:
            self._fd = None
            try:
                self.fs.close(fd)
            except OSError:
                pass
            raise
        self._end = total
        # the segment holds transactions once it is past its header and that confirm
        self._data_start = len(head) + CONFIRM_LEN

    def _reserve(self, needed_end: int) -> None:
        if needed_end <= self._reserved or self.reserve_bytes <= 0 or self._fd is None:
            return
        step = self.reserve_bytes
        new_end = -(-max(needed_end, self._reserved + step) // step) * step
        if self.fs.reserve(self._fd, self._reserved, new_end - self._reserved):
            self._reserved = new_end
        else:
            self.reserve_bytes = 0  # not supported here: plain appends from now on

    def _close_fd(self, fd: int, end: int, sync: bool = False) -> None:
        """Close a segment we no longer write, trimming its reserved zeros (best effort:
        zeros that survive a crash are a clean end anyway); ``sync``: then make its last
        confirm durable too (a cleanly closed journal has no unconfirmed tail)."""
        try:
            if self.fs.fstat(fd).size > end:
                self.fs.truncate(fd, end)
            if sync:
                self.fs.fdatasync(fd)
                self._m["fsyncs"] += 1
        except OSError:
            pass
        try:
            self.fs.close(fd)
        except OSError:
            pass

    def _abandon_fd(self, trim: bool = False) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if trim and self._broken is None:
                self._close_fd(fd, self._end, sync=True)
            else:
                try:
                    self.fs.close(fd)
                except OSError:
                    pass

    def _snapshot(self, state: Buffer, pos: Position, seq: int) -> None:
        """As the only writer (``_busy``), outside the mutex (``journal_snapshot``)."""
        write_snapshot(self, state, pos, seq)
