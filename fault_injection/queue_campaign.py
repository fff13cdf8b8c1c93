"""The coordinator crash campaign (part of ``just crash``; ``python -m
fault_injection.queue_campaign``).

Role: verification layer 6 for ``straw.coordinator`` (journal, snapshots, epochs and the
queue owner's retention, end to end).  Fixed, deterministic queue workloads run on a
fresh ``SimFS`` per crash state; the driver keeps an acknowledgement log:

* ``submits``: request id -> task ids, recorded when ``submit_tasks`` returned;
* ``attempts``: submission id -> (task, attempt, result ref) of every ``complete_task``
  handed to a coordinator that was still serving (recorded before the call);
* ``receipts``: submission id -> (task, attempt, position, result ref), recorded when
  ``complete_task`` returned;
* ``forbidden``: submission ids a fenced old coordinator tried to complete after a
  takeover (they must never be accepted: the old one must raise, and no recovery may
  find them).

Workloads:

* ``basic``: submit (with inputs), acquire, publish results, complete, fail (retry),
  yield with a continuation input, release, a clean restart (``recover=True``), more
  submissions and completions across several snapshots (``snapshot_every=4``), garbage
  collection of the pool, a lost reply retried with the same submission id, close;
* ``lifecycle``: lease expiry through the clock, heartbeats, a final failure, a
  cancellation, sealed input, a consumer's saved state, a restart, then draining to
  ``end_of_input``;
* ``history``: enough completions for several snapshots, so terminal tasks, commits,
  submissions and request answers move to history segments (``straw.history``) and the
  segments fold; a clean restart, then answers that only history holds (the status of an
  old task, the replay of an old submit request, the receipt of a retried old
  completion), more completions and snapshots;
* ``takeover``: an old coordinator (its own SimFS client and store writer) serves and is
  paused; a new one takes over (``recover=True, takeover=True``) while the old still holds
  the lock; the resumed old one must never acknowledge (``IndeterminateCommit``/``Fenced``);
  the new one completes the work.

For every op of a probe run, crash before and after it (plus the completed run) and apply
each mode of ``fault_injection.campaigns`` (power loss per persistence variant, kill,
kill+power, power+recrash), plus the journal damage modes (``kill+damage/<kind>``, see
``fault_injection.journal_campaign.damage_journal``: the recovering coordinator must
raise ``CorruptData`` or pass the check -- a damaged acknowledged tail, a deleted newest
segment or a deleted newest epoch is never silently recovered as less), and the history
damage modes (``kill+damage/drop-history``, ``kill+damage/flip-history``: every history
segment deleted, or one byte flipped in each: a lookup must raise ``CorruptData``, never
answer "unknown").

The check (``recover_and_check``): a coordinator recovers
(``recover=True``) without raising; every acknowledged receipt is found by
``lookup_submission`` with the same task, attempt, position and result, and the result
reads back intact; each task id appears at most once in ``read_commits``; every commit is
an attempted, non-forbidden completion with the attempted result; every acknowledged
submission's tasks exist; an acknowledged final failure or cancellation stays so.  The
check then drains the queue (acquire + complete, its
receipts acknowledged too) and closes; a later recovery checks again.  Each state runs on a
SimFS seeded from its key, so ``--replay KEY`` reproduces a violation.
"""

from __future__ import annotations

import functools
import posixpath
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fault_injection.journal_campaign import DAMAGE_MODES, damage_journal
from fault_injection.queue_controls import QUEUE_CONTROLS as QUEUE_CONTROLS
from fault_injection.rules import SimulatedCrash
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
from straw import Record, RecordSetRef, SharedFilesystemStore
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.errors import CorruptData, Fenced, IndeterminateCommit
from straw.fs import Filesystem
from straw.protocol import Lease, TaskSpec

ROOT = "/pool"
RUN = "run"
QUEUE = "q"
RECRASH_WINDOW = 80  # a coordinator recovery + its check makes some 60-200 ops

HISTORY_DAMAGE: tuple[str, ...] = ("kill+damage/drop-history", "kill+damage/flip-history")

FULL_MODES: tuple[str, ...] = (
    "power/clear-cache/0",
    "power/torn-seq/0", "power/torn-seq/1",
    "power/torn-op/0", "power/torn-op/1", "power/torn-op/2",
    "kill",
    "kill+power/clear-cache/0", "kill+power/torn-op/0",
    "power+recrash/clear-cache/0", "power+recrash/torn-op/0", *DAMAGE_MODES,
    *HISTORY_DAMAGE,
)  # fmt: skip

QUICK_MODES: tuple[str, ...] = (
    "power/clear-cache/0", "power/torn-op/0", "kill", "kill+power/torn-op/0",
    "power+recrash/torn-op/0",
)  # fmt: skip

CONTROL_DAMAGE: tuple[str, ...] = ("kill+damage/flip-last-txn", "kill+damage/drop-newest-epoch")
"""Damage modes every negative-control run adds (``queue-no-started-mark`` and
``queue-journal-no-confirm`` are caught only by damage)."""


class Violation(Exception):
    """The coordinator broke a durability, exactly-once or fencing obligation."""


def crash_in(exc: BaseException) -> SimulatedCrash | None:
    """The ``SimulatedCrash`` behind ``exc`` (the coordinator reports a crash in a journal
    sync as ``IndeterminateCommit`` from it), or None."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, SimulatedCrash):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _fenced_reply(exc: BaseException) -> None:
    """An old coordinator's expected refusal; re-raise it if it is really a crash."""
    crash = crash_in(exc)
    if crash is not None:
        raise crash


Ack = tuple[str, int, int, RecordSetRef]  # task, attempt, position, result


@dataclass
class QueueLog:
    submits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    attempts: dict[str, tuple[str, int, RecordSetRef]] = field(default_factory=dict)
    receipts: dict[str, Ack] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)  # of each attempted completion
    forbidden: set[str] = field(default_factory=set)
    terminal: dict[str, str] = field(default_factory=dict)  # acknowledged final failure
    # or cancellation: task -> status

    def copy(self) -> QueueLog:
        return QueueLog(dict(self.submits), dict(self.attempts), dict(self.receipts),
                        dict(self.leases), set(self.forbidden), dict(self.terminal))


def payload(submission_id: str) -> bytes:
    return f"result of {submission_id}:".encode() + random.Random(submission_id).randbytes(
        random.Random(submission_id + "/n").choice((0, 17, 300, 5000)))


def open_store(fs: Filesystem, clock: ManualClock, writer: str = "w0") -> SharedFilesystemStore:
    return SharedFilesystemStore(ROOT, RUN, writer_id=writer, fs=fs, clock=clock,
                                 reserve_bytes=16 * 1024, segment_target_bytes=1 << 20,
                                 visibility_retries=2, visibility_backoff=0.0)


def open_coordinator(store: SharedFilesystemStore, clock: ManualClock, *, recover: bool,
                     takeover: bool = False) -> Coordinator:
    return Coordinator(store, queue_id=QUEUE, recover=recover, takeover=takeover,
                       lease_seconds=1000.0, clock=clock, snapshot_every=4)


class Driver:
    """Runs a workload and keeps its acknowledgement log."""

    def __init__(self, sim: SimFS) -> None:
        self.sim = sim
        self.log = QueueLog()
        self.clock = ManualClock()

    def submit(self, q: Coordinator, req: str, specs: Sequence[TaskSpec]) -> None:
        self.log.submits[req] = tuple(q.submit_tasks(req, list(specs)))

    def result(self, store: SharedFilesystemStore, lease: Lease, sid: str) -> RecordSetRef:
        return store.publish([Record("out", payload(sid), metadata={
            "task_id": lease.task_id, "attempt_id": lease.attempt_id})],
            submission_id=f"pub-{sid}")

    def complete(self, q: Coordinator, store: SharedFilesystemStore, lease: Lease,
                 sid: str, *, forbidden: bool = False) -> None:
        ref = self.result(store, lease, sid)
        if forbidden:
            self.log.forbidden.add(sid)
        else:
            self.log.attempts[sid] = (lease.task_id, lease.generation, ref)
            self.log.leases[sid] = lease
        r = q.complete_task(lease, submission_id=sid, result_ref=ref)
        if forbidden:
            raise Violation(f"a fenced coordinator acknowledged {sid!r}: {r}")
        got = (r.task_id, lease.generation, r.position, r.result_ref)
        if (r.task_id, r.result_ref) != (lease.task_id, ref):
            raise Violation(f"receipt {got} of {sid!r} names another task/attempt/result")
        self.log.receipts[sid] = got

    def inputs(self, store: SharedFilesystemStore, names: Sequence[str]) -> list[TaskSpec]:
        return [TaskSpec(n, input_ref=store.publish([Record("prompt", n.encode() * 3)],
                                                    submission_id=f"in-{n}"),
                         metadata={"n": n}, priority=i % 2)
                for i, n in enumerate(names)]


def wl_basic(d: Driver) -> None:
    store = open_store(d.sim, d.clock)
    q = open_coordinator(store, d.clock, recover=False)
    d.submit(q, "r1", d.inputs(store, ["t0", "t1", "t2", "t3"]))
    a, b = q.acquire("w0", 2).assignments
    d.complete(q, store, a.lease, "s-a")
    q.fail_task(b.lease, failure="boom")  # retried later
    (c,) = q.acquire("w1").assignments
    cont = store.publish([Record("cont", b"continuation")], submission_id="cont-1")
    q.yield_tasks([{"lease": c.lease, "input_ref": cont, "priority": 5}], request_id="y1")
    (e,) = q.acquire("w1").assignments
    q.release_tasks([e.lease])
    q.close()
    store.close()
    # a clean restart
    store = open_store(d.sim, d.clock)
    q = open_coordinator(store, d.clock, recover=True)
    d.submit(q, "r2", [TaskSpec("t4"), TaskSpec("t5", priority=3)])
    n = 0
    while True:
        got = q.acquire("w2", 2).assignments
        if not got:
            break
        for x in got:
            d.complete(q, store, x.lease, f"s-{n}")
            n += 1
        if n == 2:
            q.collect_garbage()
    # a lost reply, retried with the same submission id and result
    sid = "s-0"
    task, attempt, ref = d.log.attempts[sid]
    r = q.complete_task(d.log.leases[sid], submission_id=sid, result_ref=ref)
    if (r.task_id, attempt, r.position, r.result_ref) != d.log.receipts[sid]:
        raise Violation(f"retry of {sid!r} returned another receipt {r}")
    q.close()
    store.close()


def wl_history(d: Driver) -> None:
    """History segments written (and folded) by snapshots, then read after a restart."""
    store = open_store(d.sim, d.clock)
    q = open_coordinator(store, d.clock, recover=False)
    specs = [TaskSpec(f"h{i}", metadata={"i": [i]}) for i in range(6)]
    d.submit(q, "r-old", specs)
    n = 0
    for _ in range(3):
        for x in q.acquire("w0", 2).assignments:
            d.complete(q, store, x.lease, f"s-{n}")
            n += 1
    q.close()
    store.close()
    store = open_store(d.sim, d.clock)
    q = open_coordinator(store, d.clock, recover=True)
    if q.submit_tasks("r-old", specs) != list(d.log.submits["r-old"]):
        raise Violation("the replay of an old submit request gave another answer")
    if q.task_status("h0")["state"] != "completed":
        raise Violation("an old completed task is not completed after a restart")
    sid = "s-1"
    _task, attempt, ref = d.log.attempts[sid]
    r = q.complete_task(d.log.leases[sid], submission_id=sid, result_ref=ref)
    if (r.task_id, attempt, r.position, r.result_ref) != d.log.receipts[sid]:
        raise Violation(f"retry of old completion {sid!r} returned another receipt {r}")
    d.submit(q, "r-new", [TaskSpec(f"k{i}") for i in range(4)])
    while got := q.acquire("w1", 2).assignments:
        for x in got:
            d.complete(q, store, x.lease, f"s-{n}")
            n += 1
    q.close()
    store.close()


def wl_takeover(d: Driver) -> None:
    old_fs = d.sim.client("old")
    old_store = open_store(old_fs, d.clock, writer="old")
    old = open_coordinator(old_store, d.clock, recover=False)
    d.submit(old, "r1", [TaskSpec("t0"), TaskSpec("t1"), TaskSpec("t2")])
    a, b = old.acquire("w0", 2).assignments
    d.complete(old, old_store, a.lease, "s-a")
    # the old coordinator is paused; a new one takes over while it holds the lock
    store = open_store(d.sim, d.clock)
    new = open_coordinator(store, d.clock, recover=True, takeover=True)
    try:
        d.complete(old, old_store, b.lease, "late-b", forbidden=True)
    except (IndeterminateCommit, Fenced) as e:
        _fenced_reply(e)
    try:
        d.submit(old, "r-late", [TaskSpec("late")])
        raise Violation("a fenced coordinator acknowledged a submission")
    except (IndeterminateCommit, Fenced) as e:
        _fenced_reply(e)
    n = 0
    while got := new.acquire("w1").assignments:
        d.complete(new, store, got[0].lease, f"s-{n}")
        n += 1
    old.close()
    old_store.close()
    new.close()
    store.close()


def wl_lifecycle(d: Driver) -> None:
    """Lease expiry through the clock, heartbeats, final failures, cancellation, sealed
    input, a consumer, then a restart: every transaction type replays after a crash."""
    store = open_store(d.sim, d.clock)
    q = open_coordinator(store, d.clock, recover=False)
    d.submit(q, "r1", [TaskSpec(f"t{i}", max_attempts=2) for i in range(5)])
    a, b = q.acquire("w0", 2).assignments
    q.heartbeat([a.lease, b.lease])
    d.clock.advance(2000.0)  # both leases expire
    got = q.acquire("w1", 2).assignments  # journals the expiries, leases again
    d.complete(q, store, got[0].lease, "s-0")
    q.fail_task(got[1].lease, failure="final", retryable=False)
    d.log.terminal[got[1].lease.task_id] = "failed"
    q.cancel_task("t4")
    d.log.terminal["t4"] = "cancelled"
    q.seal_input()
    token = q.open_consumer("training", exclusive_owner="the campaign's one trainer")
    state = store.publish([Record("state", b"trainer state")], submission_id="state")
    q.save_consumer_state("training", token=token, request_id="save", state_ref=state,
                          fetch_cursor=1, processed_cursor=0)
    q.close()
    store.close()
    store = open_store(d.sim, d.clock)
    q = open_coordinator(store, d.clock, recover=True)
    n = 1
    while got := q.acquire("w2").assignments:
        d.complete(q, store, got[0].lease, f"s-{n}")
        n += 1
    if q.acquire("w2").status != "end_of_input":
        raise Violation("a sealed, drained queue does not answer end_of_input")
    q.close()
    store.close()


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[Driver], None]


WORKLOADS = (Workload("basic", wl_basic), Workload("history", wl_history),
             Workload("takeover", wl_takeover), Workload("lifecycle", wl_lifecycle))


# --- the check ------------------------------------------------------------------------------

def _all_commits(q: Coordinator) -> list[Any]:
    out: list[Any] = []
    cursor = 0
    while True:
        page = q.read_commits(cursor, 100)
        out += page.commits
        if not page.commits:
            return out
        cursor = page.cursor


def check_coordinator(q: Coordinator, store: SharedFilesystemStore, log: QueueLog) -> None:
    """The recovered coordinator ``q`` against ``log``; raises ``Violation``."""
    for sid, want in log.receipts.items():
        r = q.lookup_submission(sid)
        got = None if r is None else (r.task_id, r.position, r.result_ref)
        if got != (want[0], want[2], want[3]):
            raise Violation(f"acknowledged receipt {sid!r} {want[:3]} lost: lookup returned "
                            f"{got}")
        recs = list(store.read(want[3]))
        if len(recs) != 1 or bytes(recs[0].payload) != payload(sid):
            raise Violation(f"the result of acknowledged {sid!r} does not read back intact")
    seen: dict[str, int] = {}
    for c in _all_commits(q):
        if c.task_id in seen:
            raise Violation(f"task {c.task_id!r} accepted twice (positions {seen[c.task_id]} "
                            f"and {c.position})")
        seen[c.task_id] = c.position
        if c.submission_id in log.forbidden:
            raise Violation(f"{c.submission_id!r} of a fenced coordinator was accepted")
        att = log.attempts.get(c.submission_id)
        if att is None:
            raise Violation(f"commit {c.position} {c.submission_id!r} was never attempted")
        if (c.task_id, c.result_ref) != (att[0], att[2]):
            raise Violation(f"commit {c.position} {c.submission_id!r} is task "
                            f"{c.task_id!r} with another result than attempted")
    for tid, status in log.terminal.items():
        now = q.task_status(tid)["state"]
        if now != status or tid in seen:
            raise Violation(f"task {tid!r} was acknowledged {status}; after recovery it is "
                            f"{now}{' and accepted' if tid in seen else ''}")
    for req, tids in log.submits.items():
        for t in tids:
            if q.task_status(t) is None:
                raise Violation(f"task {t!r} of acknowledged submission {req!r} is "
                                "missing")


def recover_and_check(fs: Filesystem, log: QueueLog, fresh_tag: str = "fresh",
                      out: QueueLog | None = None) -> QueueLog:
    """Recover a coordinator on ``fs``, check it, then drain the queue (fresh completions
    count as acknowledged) and close.  ``out`` is updated as the check goes."""
    if out is None:
        out = log.copy()
    clock = ManualClock()
    store = open_store(fs, clock)
    try:
        q = open_coordinator(store, clock, recover=True)
        try:
            check_coordinator(q, store, log)
            n = 0
            d = Driver.__new__(Driver)
            d.log = out
            while got := q.acquire(f"{fresh_tag}-w").assignments:
                d.complete(q, store, got[0].lease, f"{fresh_tag}-{n}")
                n += 1
        finally:
            q.close()
    finally:
        store.close()
    return out


def damage_queue(sim: SimFS, kind: str) -> str:
    """``damage_journal``'s kinds, plus the history segments': ``drop-history`` deletes
    every one, ``flip-history`` flips a byte in the middle of each (synced data damaged by
    a bad disk or an operator)."""
    if kind not in ("drop-history", "flip-history"):
        return damage_journal(sim, kind)
    paths = sorted(p for p in sim.files() if p.endswith(".hist"))
    if not paths:
        return "no history segment"
    for path in paths:
        if kind == "drop-history":
            sim.unlink(path)
        else:
            size = sim.stat(path).size
            fd = sim.open(path, write=True)
            buf = bytearray(1)
            sim.readinto(fd, buf, size // 2)
            sim.writev(fd, [bytes([buf[0] ^ 0x20])], size // 2)
            sim.fsync(fd)
            sim.close(fd)
    sim.fsync_dir(posixpath.dirname(paths[0]))
    return f"{kind}: {', '.join(posixpath.basename(p) for p in paths)}"


# --- the campaign ---------------------------------------------------------------------------

QueueReport = WorkloadReport


def _ops_of(wl: Workload) -> int:
    probe = SimFS(0, record_trace=False)
    try:
        wl.run(Driver(probe))
    except Exception:  # noqa: BLE001 - a broken engine (a control): its states report it
        pass
    return probe.op_count


def run_state(wl: Workload, nth: int | None, when: str, mode: str, key: str) -> str | None:
    """One crash state; returns a violation message or None.  A crash inside a journal
    sync reaches the driver as the coordinator's ``IndeterminateCommit``: ``crash_in``."""
    sim = SimFS(state_seed(key), record_trace=False)
    if nth is not None:
        sim.crash_at(nth, when=when)
    d = Driver(sim)
    return run_crash_state(sim, key, mode, lambda: wl.run(d), d.log,
                           functools.partial(recover_and_check, sim), kill=("main", "old"),
                           recrash_window=RECRASH_WINDOW, violation=Violation,
                           module="fault_injection.queue_campaign",
                           is_crash=lambda e: crash_in(e) is not None,
                           damage=functools.partial(damage_queue, sim),
                           fail_closed=(CorruptData,))


def run_workload(wl: Workload, modes: Sequence[str], *, stop_at_first: bool = False,
                 max_points: int | None = None) -> QueueReport:
    return sweep(f"queue-{wl.name}", wl.name, crash_points(_ops_of(wl), max_points), modes,
                 lambda nth, when, mode, key: run_state(wl, nth, when, mode, key),
                 stop_at_first=stop_at_first)


def run_queue_campaign(modes: Sequence[str] = FULL_MODES, *,
                       only: Sequence[str] | None = None, stop_at_first: bool = False,
                       max_points: int | None = None,
                       log: Callable[[str], None] = print) -> list[QueueReport]:
    by_name = {wl.name: wl for wl in WORKLOADS}
    return run_all(list(by_name), lambda name: run_workload(
        by_name[name], modes, stop_at_first=stop_at_first, max_points=max_points),
        only=only, stop_at_first=stop_at_first, log=log)


def replay(key: str) -> str | None:
    name, nth, when, mode = key.split(":", 3)
    wl = next(w for w in WORKLOADS if w.name == name)
    return run_state(wl, None if nth == "end" else int(nth), when, mode, key)


# --- negative controls -------------------------------------------------------------------

def run_queue_controls(modes: Sequence[str] = QUICK_MODES, *,
                       max_points: int | None = None,
                       log: Callable[[str], None] = print) -> dict[str, str | None]:
    """Each control against the campaign (``modes`` plus ``CONTROL_DAMAGE``); returns
    name -> first violation (None: MISSED).  The takeover workload catches most at once,
    so it runs first."""
    modes = (*modes, *(m for m in CONTROL_DAMAGE if m not in modes))
    return catch_controls(QUEUE_CONTROLS, [
        functools.partial(run_queue_campaign, modes, only=[wl], stop_at_first=True,
                          max_points=max_points, log=lambda _m: None)
        for wl in ("takeover", "basic", "lifecycle", "history")], log)


def main(argv: Sequence[str] | None = None) -> int:
    return campaign_main(argv, prog="fault_injection.queue_campaign", doc=__doc__,
                         title="coordinator", full_modes=FULL_MODES, quick_modes=QUICK_MODES,
                         run_campaign=run_queue_campaign, run_controls=run_queue_controls,
                         replay=replay)


if __name__ == "__main__":
    sys.exit(main())
