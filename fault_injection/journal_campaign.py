"""The journal crash campaign (``python -m fault_injection.journal_campaign``).

Role: verification layer 6 for ``straw.journal``.  Fixed, deterministic journal workloads
run on a fresh ``SimFS`` per crash state; the driver keeps an acknowledgement log:

* ``attempts``: the transactions in the order the journal must hold them (every
  transaction handed to ``commit``/``enqueue``, except those of a fenced old
  coordinator after a takeover);
* ``acked``: how many of them were acknowledged (a call returned, or a recovery
  returned them: ``recover`` makes what it hands out durable);
* ``forbidden``: transactions a fenced old coordinator tried to commit after the
  takeover (they must never be recovered);
* ``started``: the newest epoch whose ``Journal`` returned (its start record durable),
  passed to ``recover`` as ``started_epoch`` -- what the coordinator's epoch files say.

Workloads:

* ``basic``: single commits of several sizes (0 B to over a sector), a group of three
  enqueued transactions with one sync, an atomic ``commit_many``, a snapshot, rotations
  (small segment target), a clean close, then a second epoch that commits and snapshots;
* ``fenced``: epoch 1 commits and snapshots; epoch 2 recovers and takes over while epoch
  1 is alive; epoch 1 keeps committing (its fence raises: ``IndeterminateCommit``), rotates
  and writes a snapshot beyond its cutoff; epoch 2 commits and snapshots.

For every op of a probe run, crash *before* and *after* it (plus the completed run), then
apply each *mode* (the same vocabulary as ``fault_injection.campaigns``):
``power/<variant>/<k>`` (power loss), ``kill`` (SIGKILL: the page cache survives),
``kill+power/<variant>/<k>`` (kill, recovery + check, power loss, check again),
``power+recrash/<variant>/<k>`` (power loss, a crash at a seeded op of the recovery and
its check, power loss, check again), and the damage modes ``kill+damage/<kind>`` (kill,
then ``damage_journal``: a flipped byte in the newest transaction frame, the newest
segment deleted, every segment of the newest epoch deleted; recovery must raise
``CorruptData`` or return everything acknowledged -- never silently less, D6).

The check (``recover_and_check``): ``recover`` must not raise; snapshot state +
transactions after it must be a prefix of ``attempts`` at least ``acked`` long (nothing
acknowledged lost, nothing unattempted or out of order, atomic batches whole), contain
nothing ``forbidden``, and match ``Recovered.seq``; then a new epoch starts on it and
commits a fresh transaction, and a second recovery must return exactly that history plus
the fresh transaction (cutoffs and the durability of what recovery handed out).  Each state
runs on a SimFS seeded from its key, so ``--replay KEY`` reproduces a violation.

Hooking into ``fault_injection.campaigns``: call ``run_journal_campaign(modes,
max_points=..., log=...)`` next to ``run_store_campaign`` (it returns reports with
``name, crash_points, states, violations, seconds``) and add its violations to the total.
"""

from __future__ import annotations

import contextlib
import functools
import posixpath
import random
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import msgpack

from fault_injection.simfs import SimFS
from fault_injection.sweep import (
    WorkloadReport,
    campaign_main,
    catch_controls,
    crash_points,
    run_all,
    run_crash_state,
    state_seed,
    sweep,
)
from straw import framing
from straw import journal as journal_mod
from straw.clock import ManualClock
from straw.durable import recovery as recovery_mod
from straw.errors import CorruptData, Fenced, IndeterminateCommit
from straw.fs import Filesystem
from straw.journal import Journal, recover

DIR = "/q/journal"
RECRASH_WINDOW = 40

FULL_MODES: tuple[str, ...] = (
    "power/clear-cache/0",
    "power/torn-seq/0", "power/torn-seq/1", "power/torn-seq/2",
    "power/torn-op/0", "power/torn-op/1", "power/torn-op/2", "power/torn-op/3",
    "kill",
    "kill+power/clear-cache/0", "kill+power/torn-op/0",
    "power+recrash/clear-cache/0", "power+recrash/torn-op/0", "power+recrash/torn-seq/0",
    "kill+damage/flip-last-txn", "kill+damage/drop-newest-segment",
    "kill+damage/drop-newest-epoch",
)  # fmt: skip

DAMAGE_MODES: tuple[str, ...] = (
    "kill+damage/flip-last-txn", "kill+damage/drop-newest-segment",
    "kill+damage/drop-newest-epoch",
)  # fmt: skip

QUICK_MODES: tuple[str, ...] = (
    "power/clear-cache/0", "power/torn-seq/0", "power/torn-op/0", "kill",
    "kill+power/torn-op/0", "power+recrash/torn-op/0", *DAMAGE_MODES,
)  # fmt: skip


class Violation(Exception):
    """The journal broke a durability, ordering or fencing obligation."""


@dataclass
class JournalLog:
    attempts: list[bytes] = field(default_factory=list)
    acked: int = 0
    forbidden: set[bytes] = field(default_factory=set)
    started: int = 0

    def copy(self) -> JournalLog:
        return JournalLog(list(self.attempts), self.acked, set(self.forbidden), self.started)


def txn(tag: str, size: int) -> bytes:
    """A recognisable transaction: the tag, then ``size`` seeded random bytes."""
    return tag.encode() + b":" + random.Random(tag).randbytes(size)


def encode_state(txns: Sequence[bytes]) -> bytes:
    return msgpack.packb(list(txns), use_bin_type=True)


def decode_state(state: bytes) -> list[bytes]:
    return list(msgpack.unpackb(state, raw=False))


class Driver:
    """Runs a workload and keeps its acknowledgement log."""

    def __init__(self, sim: SimFS) -> None:
        self.sim = sim
        self.log = JournalLog()
        self.clock = ManualClock()

    def journal(self, fs: Filesystem, epoch: int | None = None, *, target: int = 700,
                fence: Callable[[], None] | None = None) -> Journal:
        r = recover(fs, DIR, started_epoch=self.log.started)
        state = decode_state(r.snapshot) if r.snapshot is not None else []
        if state + r.transactions != self.log.attempts[:r.seq]:
            raise Violation("recovery inside the workload returned another history")
        self.log.acked = max(self.log.acked, r.seq)
        j = Journal(fs, DIR, epoch=epoch if epoch is not None else r.last_epoch + 1,
                    recovered=r, clock=self.clock, segment_target_bytes=target,
                    reserve_bytes=1024, fence=fence)
        self.log.started = max(self.log.started, j.epoch)
        return j

    def commit(self, j: Journal, t: bytes) -> None:
        self.log.attempts.append(t)
        j.commit(t)
        self.log.acked = len(self.log.attempts)

    def commit_many(self, j: Journal, ts: list[bytes]) -> None:
        self.log.attempts.extend(ts)
        j.commit_many(ts)
        self.log.acked = len(self.log.attempts)

    def group(self, j: Journal, ts: list[bytes]) -> None:
        """Several enqueued transactions written as one group (one sync)."""
        seq = 0
        for t in ts:
            self.log.attempts.append(t)
            seq = j.enqueue(t)
        j.wait(seq)
        self.log.acked = len(self.log.attempts)

    def snapshot(self, j: Journal) -> None:
        j.snapshot(encode_state(self.log.attempts))


def wl_basic(d: Driver) -> None:
    j = d.journal(d.sim)
    for i, size in enumerate((10, 0, 600, 100)):
        d.commit(j, txn(f"b{i}", size))
    d.group(j, [txn("g0", 50), txn("g1", 520), txn("g2", 5)])
    d.commit_many(j, [txn("m0", 30), txn("m1", 0), txn("m2", 200)])
    d.snapshot(j)
    d.commit(j, txn("b5", 300))
    d.commit(j, txn("b6", 450))  # rotates
    j.close()
    j = d.journal(d.sim)
    d.commit(j, txn("e2a", 40))
    d.snapshot(j)
    d.commit(j, txn("e2b", 40))
    j.close()


def wl_fenced(d: Driver) -> None:
    old_fs = d.sim.client("old")
    taken = [False]

    def fence() -> None:
        if taken[0]:
            raise Fenced("a newer epoch exists")

    j1 = d.journal(old_fs, fence=fence)
    d.commit(j1, txn("o0", 100))
    d.snapshot(j1)
    d.commit(j1, txn("o1", 300))
    # takeover: the new epoch is claimed (fence() now raises) before recovery reads
    taken[0] = True
    j2 = d.journal(d.sim)
    late = [txn("late0", 400), txn("late1", 400)]
    for t in late:  # the paused old coordinator resumes: rotates, never acknowledged
        d.log.forbidden.add(t)
        try:
            j1.commit(t)
            raise Violation("a fenced coordinator's commit was acknowledged")
        except (IndeterminateCommit, Fenced):
            pass
    d.commit(j2, txn("n0", 60))
    d.snapshot(j2)
    d.commit(j2, txn("n1", 60))
    j2.close()
    j1.close()


def wl_fenced_snapshot(d: Driver) -> None:
    """Epoch 1's fence notices the takeover late (a stale check): it commits after the
    takeover's recovery read it, then writes a snapshot beyond its cutoff; its fence then
    raises, so the snapshot deletes nothing; recovery must ignore the snapshot and the
    late commit."""
    old_fs = d.sim.client("old")
    noticed = [False]

    def fence() -> None:
        if noticed[0]:
            raise Fenced("a newer epoch exists")

    j1 = d.journal(old_fs, fence=fence, target=100_000)
    d.commit(j1, txn("o0", 100))
    d.commit(j1, txn("o1", 100))
    j2 = d.journal(d.sim)  # takeover; epoch 1 has not noticed yet
    d.commit(j2, txn("n0", 60))
    late = txn("late", 80)
    d.log.forbidden.add(late)
    j1.commit(late)  # a stale acknowledgement (the coordinator's fence failed)
    noticed[0] = True
    try:
        j1.snapshot(encode_state([*d.log.attempts[:2], late]))
    except Fenced:
        pass  # expected; what matters is what recovery makes of it
    d.commit(j2, txn("n1", 60))
    j2.close()
    j1.close()


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[Driver], None]


WORKLOADS = (Workload("basic", wl_basic), Workload("fenced", wl_fenced),
             Workload("fenced_snapshot", wl_fenced_snapshot))


# --- the check ------------------------------------------------------------------------------

def recover_and_check(fs: Filesystem, log: JournalLog, fresh_tag: str = "fresh",
                      out: JournalLog | None = None) -> JournalLog:
    """See the module docstring.  Returns the log as it stands after the check (what
    recovery handed out and the fresh transaction count as acknowledged).  ``out`` is
    updated as the check goes, for a crash in the middle of it."""
    if out is None:
        out = log.copy()
    r = recover(fs, DIR, started_epoch=log.started)
    history = (decode_state(r.snapshot) if r.snapshot is not None else []) + r.transactions
    bad = [t[:12] for t in history if t in log.forbidden]
    if bad:
        raise Violation(f"recovered transactions of a fenced coordinator: {bad}")
    if len(history) != r.seq:
        raise Violation(f"Recovered.seq {r.seq} but {len(history)} transactions")
    if history != log.attempts[:len(history)]:
        diff = [i for i, (a, b) in enumerate(zip(history, log.attempts, strict=False))
                if a != b]
        at = diff[0] if diff else len(log.attempts)
        raise Violation(f"recovered history ({len(history)} transactions) is not a prefix of "
                        f"what was attempted ({len(log.attempts)}): first difference at {at}")
    if len(history) < log.acked:
        raise Violation(f"{log.acked} transactions acknowledged, only {len(history)} "
                        f"recovered: lost {log.attempts[len(history)][:12]!r}...")
    out.attempts = list(history)
    out.acked = len(history)  # recover made it durable
    fresh = txn(fresh_tag, 64)
    out.attempts.append(fresh)
    j = Journal(fs, DIR, epoch=r.last_epoch + 1, recovered=r, clock=ManualClock(),
                segment_target_bytes=700, reserve_bytes=1024)
    out.started = j.epoch
    j.commit(fresh)
    out.acked = len(out.attempts)
    j.close()
    r2 = recover(fs, DIR, started_epoch=out.started)
    again = (decode_state(r2.snapshot) if r2.snapshot is not None else []) + r2.transactions
    if again != out.attempts:
        raise Violation(f"after a new epoch and a fresh commit, recovery returned "
                        f"{len(again)} transactions, expected {len(out.attempts)}")
    return out


# --- the campaign ---------------------------------------------------------------------------

JournalReport = WorkloadReport


def _ops_of(wl: Workload) -> int:
    probe = SimFS(0, record_trace=False)
    wl.run(Driver(probe))
    return probe.op_count


# --- damage (the kill+damage modes) -------------------------------------------------------

_SEGMENT_PATH = re.compile(r"/j-(\d{6,})-(\d{6,})\.log$")


def _segments(sim: SimFS) -> list[tuple[tuple[int, int], str, bytes]]:
    """Every journal segment on ``sim`` (any directory): ((epoch, seg), path, bytes),
    oldest first."""
    return sorted(((int(m[1]), int(m[2])), p, data) for p, data in sim.files().items()
                  if (m := _SEGMENT_PATH.search(p)))


def _last_transaction_frame(data: bytes) -> framing.ScannedFrame | None:
    try:
        scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    except CorruptData:
        return None
    txns = [f for f in scan.frames
            if f.body[:1] in (bytes([journal_mod.REC_TXN]), bytes([journal_mod.REC_BATCH]))]
    return txns[-1] if txns else None


def damage_journal(sim: SimFS, kind: str) -> str:
    """Damage synced journal data on ``sim`` (after a kill: what is written stays), as a
    bad disk or an operator might; returns what was done.  ``flip-last-txn``: one byte in
    the body of the newest transaction frame (often the last acknowledged one);
    ``drop-newest-segment``: the newest segment file; ``drop-newest-epoch``: every
    segment of the newest epoch."""
    segs = _segments(sim)
    if not segs:
        return "no journal segment"
    if kind == "flip-last-txn":
        for _, path, data in reversed(segs):
            f = _last_transaction_frame(data)
            if f is None:
                continue
            at = f.offset + framing.HEADER_SIZE + f.header.body_length // 2
            fd = sim.open(path, write=True)
            sim.writev(fd, [bytes([data[at] ^ 0x20])], at)
            sim.fsync(fd)
            sim.close(fd)
            return f"byte {at} of {path} flipped (its newest transaction frame)"
        return "no transaction frame"
    if kind == "drop-newest-segment":
        doomed = [segs[-1][1]]
    elif kind == "drop-newest-epoch":
        doomed = [p for (e, _), p, _ in segs if e == segs[-1][0][0]]
    else:
        raise ValueError(f"unknown damage {kind!r}")
    for path in doomed:
        sim.unlink(path)
    sim.fsync_dir(posixpath.dirname(doomed[0]))
    return f"deleted {', '.join(posixpath.basename(p) for p in doomed)}"


def run_state(wl: Workload, nth: int | None, when: str, mode: str, key: str) -> str | None:
    """One crash state; returns a violation message or None."""
    sim = SimFS(state_seed(key), record_trace=False)
    if nth is not None:
        sim.crash_at(nth, when=when)
    d = Driver(sim)
    return run_crash_state(sim, key, mode, lambda: wl.run(d), d.log,
                           functools.partial(recover_and_check, sim), kill=("main", "old"),
                           recrash_window=RECRASH_WINDOW, violation=Violation,
                           module="fault_injection.journal_campaign",
                           damage=functools.partial(damage_journal, sim),
                           fail_closed=(CorruptData,))


def run_workload(wl: Workload, modes: Sequence[str], *, stop_at_first: bool = False,
                 max_points: int | None = None) -> JournalReport:
    return sweep(f"journal-{wl.name}", wl.name, crash_points(_ops_of(wl), max_points), modes,
                 lambda nth, when, mode, key: run_state(wl, nth, when, mode, key),
                 stop_at_first=stop_at_first)


def run_journal_campaign(modes: Sequence[str] = FULL_MODES, *,
                         only: Sequence[str] | None = None, stop_at_first: bool = False,
                         max_points: int | None = None,
                         log: Callable[[str], None] = print) -> list[JournalReport]:
    by_name = {wl.name: wl for wl in WORKLOADS}
    return run_all(list(by_name), lambda name: run_workload(
        by_name[name], modes, stop_at_first=stop_at_first, max_points=max_points),
        only=only, stop_at_first=stop_at_first, log=log)


def replay(key: str) -> str | None:
    name, nth, when, mode = key.split(":", 3)
    wl = next(w for w in WORKLOADS if w.name == name)
    return run_state(wl, None if nth == "end" else int(nth), when, mode, key)


# --- negative controls -------------------------------------------------------------------

class _Proxy:
    """A ``Filesystem`` stand-in that drops some calls of the journal (a broken engine)."""

    def __init__(self, inner: Filesystem, drop: str) -> None:
        self._inner = inner
        self._drop = drop

    def __getattr__(self, name: str) -> object:
        if name == self._drop:
            return lambda *a, **k: None
        return getattr(self._inner, name)


@contextlib.contextmanager
def _journal_fs_dropping(op: str) -> Iterator[None]:
    orig = journal_mod.Journal.__init__

    def init(self: Journal, fs: Filesystem, *a: object, **k: object) -> None:
        orig(self, _Proxy(fs, op), *a, **k)  # type: ignore[arg-type]

    journal_mod.Journal.__init__ = init  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        journal_mod.Journal.__init__ = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_recovery_fsync() -> Iterator[None]:
    orig = recovery_mod._Reader.read

    def read(self: object, name: str, limit: int | None = None, *,
             sync: bool = False) -> bytes | None:
        return orig(self, name, limit, sync=False)  # type: ignore[arg-type]

    recovery_mod._Reader.read = read  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        recovery_mod._Reader.read = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_fence_before_delete() -> Iterator[None]:
    orig = journal_mod.Journal._snapshot

    def snap(self: Journal, *a: object) -> None:
        fence, self.fence = self.fence, None
        try:
            orig(self, *a)  # type: ignore[arg-type]
        finally:
            self.fence = fence

    journal_mod.Journal._snapshot = snap  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        journal_mod.Journal._snapshot = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _snapshot_ignores_cutoffs() -> Iterator[None]:
    """Recovery takes the newest snapshot even beyond its epoch's cutoff."""
    orig = recovery_mod.decode_segment_header

    def dec(body: bytes, where: str) -> dict[str, object]:
        meta = orig(body, where)
        meta["cutoffs"] = {e: (s + 10**6, o) for e, (s, o) in meta["cutoffs"].items()}
        return meta

    recovery_mod.decode_segment_header = dec  # type: ignore[assignment]
    try:
        yield
    finally:
        recovery_mod.decode_segment_header = orig


@contextlib.contextmanager
def _patched(obj: object, name: str, value: object) -> Iterator[None]:
    orig = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, orig)


def _no_confirm() -> contextlib.AbstractContextManager[None]:
    """The journal before confirm records: every group starts its own write group, so a
    flipped byte in the last acknowledged group looks like a torn tail and is cut."""

    def confirm(self: Journal) -> None:
        self._group = self._end  # the next group starts a write group of its own

    return _patched(journal_mod.Journal, "_confirm", confirm)


def _no_rotated_record() -> contextlib.AbstractContextManager[None]:
    """Rotation leaves the old segment without a rotated record: a deleted newest
    segment goes unnoticed."""

    def end_segment(self: Journal, fd: int, end: int, group: int) -> None:
        self.fs.fdatasync(fd)
        self._close_fd(fd, end)

    return _patched(journal_mod.Journal, "_end_segment", end_segment)


def _ignores_started_epoch() -> contextlib.AbstractContextManager[None]:
    """Recovery ignores the started epoch it is told: a journal that lost every segment
    of its newest epoch recovers the older state."""
    orig = recovery_mod._recover

    def rec(fs: Filesystem, directory: str, started_epoch: int) -> journal_mod.Recovered:
        return orig(fs, directory, 0)

    return _patched(recovery_mod, "_recover", rec)


JOURNAL_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "journal-no-fdatasync": lambda: _journal_fs_dropping("fdatasync"),
    "journal-no-fsync-dir": lambda: _journal_fs_dropping("fsync_dir"),
    "journal-no-recovery-fsync": _no_recovery_fsync,
    "journal-no-fence-before-delete": _no_fence_before_delete,
    "journal-ignores-cutoffs": _snapshot_ignores_cutoffs,
    "journal-no-confirm": _no_confirm,
    "journal-no-rotated-record": _no_rotated_record,
    "journal-ignores-started-epoch": _ignores_started_epoch,
}
"""Deliberately broken journals: each must make the campaign report a violation."""


def run_journal_controls(modes: Sequence[str] = QUICK_MODES, *,
                         max_points: int | None = None,
                         log: Callable[[str], None] = print) -> dict[str, str | None]:
    """Each control against the campaign; returns name -> first violation (None: MISSED)."""
    return catch_controls(JOURNAL_CONTROLS, [
        functools.partial(run_journal_campaign, modes, stop_at_first=True,
                          max_points=max_points, log=lambda _m: None)], log)


def main(argv: Sequence[str] | None = None) -> int:
    return campaign_main(argv, prog="fault_injection.journal_campaign", doc=__doc__,
                         title="journal", full_modes=FULL_MODES, quick_modes=QUICK_MODES,
                         run_campaign=run_journal_campaign, run_controls=run_journal_controls,
                         replay=replay)


if __name__ == "__main__":
    sys.exit(main())
