"""``just fuzz`` queue scenarios: a coordinator process and worker processes on a real
directory, killed, paused and taken over at random.

Role: verification layer 7 of DESIGN.md for the queue (``straw.coordinator``).

* One **coordinator process** serves the queue (``Coordinator`` in that process, one
  thread per connection, so concurrent completions share journal syncs) over an abstract Unix
  socket (``multiprocessing.connection``: each request is ``(op, args)``, each reply
  ``("ok", value, epoch)`` or ``("err", error type, message, epoch)`` where ``epoch`` is
  the serving coordinator's).  Each incarnation ``gen`` writes ``coord-<gen>.json``
  (address, pid, epoch, ``t_serving``: when it started serving) once it serves; workers
  connect to the highest generation.
* N **worker processes** loop: acquire a task (submitting a small batch of new tasks when
  the queue is empty), publish a result to their own store (records named after the lease's
  task and attempt), complete it with submission id ``<worker>:<task>:<attempt>:<epoch>``
  and, AFTER the reply, append the receipt to their fsynced ``AckLog`` with the serving
  epoch and ``t_send`` (taken before the request was sent).  An ``IndeterminateCommit`` or
  a lost connection is retried (same submission id and result) on the current coordinator;
  5% of attempts are failed (``fail_task``) instead; 1% of the time a worker first asks
  the coordinator to collect garbage (results in flight must stay protected, D2).
* A seeded **supervisor** (in the calling process) for ``seconds``: SIGKILLs workers (and
  restarts them); SIGSTOPs workers for up to 1.5 s (leases of ``LEASE_SECONDS`` expire);
  SIGKILLs the coordinator and starts the next one with ``recover=True``; or SIGSTOPs the
  coordinator, starts the next one with ``recover=True, takeover=True`` while the old one
  still holds the lock, SIGCONTs the old one (whose replies must now all be refusals) and
  kills it a moment later.
* On JuiceFS (``shared``: two clients of one volume) the pool is on the volume, workers
  use client a, coordinators alternate between the clients (a takeover crosses clients:
  the fence must see an epoch file created through the other client) and the checker
  uses client b.
* The **checker** recovers a fresh coordinator and proves from the logs: no accepted
  result lost (every logged receipt's submission id is found by ``lookup_submission``
  with the same task, attempt, position and result, and the result reads back intact),
  none accepted twice (each task id at most once in ``read_commits``, no position given to
  two submissions), no stale acknowledgement (no success reply from an epoch-E coordinator
  to a request sent after a newer epoch started serving), and every acknowledged
  submission's tasks exist.  Task ids start with the run id, so the checker also proves
  that every commit is of its own run's tasks and results (``run``, ``roots``: runs that
  share one root with a queue of the same id, ``fault_injection.runs_fuzz``).
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from fault_injection.procs import (
    Proc,
    logged_violations,
    orphaned,
    report,
    stop_all,
    until_unlocked,
)
from straw import Record, RecordSetRef, SharedFilesystemStore
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.protocol import Lease, TaskSpec
from straw.publication_log import AckLog

RUN = "qfuzz"
QUEUE = "fuzzq"
LEASE_SECONDS = 2.0
REFUSALS = {"IndeterminateCommit", "Fenced"}
EXPECTED = REFUSALS | {"StaleAttempt", "LeaseExpired"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def payload(sid: str) -> bytes:
    r = random.Random(sid)
    return f"result {sid}|".encode() + r.randbytes(r.choice((0, 64, 256, 3000)))


def _open_store(root: str, writer_id: str, run: str = RUN) -> SharedFilesystemStore:
    store = SharedFilesystemStore(root, run, writer_id=writer_id, reserve_bytes=1 << 20,
                                  segment_target_bytes=8 << 20)
    until_unlocked(lambda: store.lookup_submission("-"))  # takes the writer lock
    return store


def _open_coordinator(store: SharedFilesystemStore, *, recover: bool,
                      takeover: bool = False) -> Coordinator:
    return until_unlocked(lambda: Coordinator(
        store, queue_id=QUEUE, recover=recover, takeover=takeover,
        lease_seconds=LEASE_SECONDS, snapshot_every=64))


# --- the coordinator process -----------------------------------------------------------------

def _exit(_sig: int, _frame: object) -> None:
    raise SystemExit(0)


def _watchdog() -> None:
    """The supervisor is gone: exit instead of serving forever."""
    while not orphaned():
        time.sleep(0.5)
    os._exit(0)


def _serve(q: Coordinator, conn: Connection) -> None:
    try:
        while True:
            try:
                op, a = conn.recv()
            except (EOFError, OSError):
                return
            try:
                if op == "acquire":
                    v: Any = q.acquire(a["worker"], 1)
                elif op == "complete":
                    v = q.complete_task(a["lease"], submission_id=a["sid"],
                                        result_ref=a["ref"])
                elif op == "fail":
                    v = q.fail_task(a["lease"], failure="fuzz failure")
                elif op == "submit":
                    v = q.submit_tasks(a["req"], a["tasks"])
                elif op == "gc":
                    v = q.collect_garbage()
                else:
                    raise ValueError(f"unknown op {op!r}")
                reply: tuple[Any, ...] = ("ok", v, q.epoch_number)
            except Exception as e:  # noqa: BLE001 - every error goes back to the caller
                reply = ("err", type(e).__name__, str(e), q.epoch_number)
            conn.send(reply)
    except (OSError, EOFError):
        return
    finally:
        conn.close()


def coordinator_main(root: str, logdir: str, gen: int, takeover: bool,
                     control: str | None = None, run: str = RUN) -> int:
    if control:  # a negative control: a deliberately broken coordinator
        from fault_injection.queue_campaign import QUEUE_CONTROLS
        with QUEUE_CONTROLS[control]():
            return _coordinator(root, logdir, gen, takeover, run)
    return _coordinator(root, logdir, gen, takeover, run)


def _coordinator(root: str, logdir: str, gen: int, takeover: bool, run: str = RUN) -> int:
    signal.signal(signal.SIGTERM, _exit)
    store = SharedFilesystemStore(root, run, writer_id=f"coord{gen}")
    q = None
    try:
        q = _open_coordinator(store, recover=gen > 0, takeover=takeover)
        # an abstract Unix socket (Linux): no path length limit, nothing left behind
        address = f"\0straw-queue-fuzz-{os.getpid()}-{gen}"
        listener = Listener(address, family="AF_UNIX")
        threading.Thread(target=_watchdog, daemon=True).start()
        info = {"gen": gen, "epoch": q.epoch_number, "address": address, "pid": os.getpid(),
                "t_serving": time.time(), "takeover": takeover}
        path = os.path.join(logdir, f"coord-{gen}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(info, f)
        os.replace(path + ".tmp", path)
        while True:
            conn = listener.accept()
            threading.Thread(target=_serve, args=(q, conn), daemon=True).start()
    except SystemExit:
        pass
    except Exception:
        report(logdir, f"coord{gen}", "coordinator raised:\n" + traceback.format_exc())
        return 2
    finally:
        if q is not None:
            try:
                q.close()
            except Exception:  # noqa: BLE001 - a fenced coordinator may fail to close
                pass
    return 0


# --- the worker process ----------------------------------------------------------------------

class _Lost(Exception):
    """The connection to the coordinator broke (it was killed or replaced)."""


class _Conn:
    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self.conn: Connection | None = None
        self.gen = -1

    def _connect(self) -> Connection:
        deadline = time.monotonic() + 60
        while True:
            infos = []
            for p in glob.glob(os.path.join(self.logdir, "coord-*.json")):
                try:
                    with open(p) as f:
                        infos.append(json.load(f))
                except (OSError, ValueError):
                    pass
            if infos:
                info = max(infos, key=lambda i: i["gen"])
                try:
                    conn = Client(info["address"], family="AF_UNIX")
                    self.gen = info["gen"]
                    return conn
                except OSError:
                    pass
            if time.monotonic() > deadline or _stop or orphaned():
                raise _Lost("no coordinator to connect to")
            time.sleep(0.05)

    def call(self, op: str, **args: Any) -> tuple[Any, ...]:
        if self.conn is None:
            self.conn = self._connect()
        try:
            self.conn.send((op, args))
            return tuple(self.conn.recv())
        except (OSError, EOFError) as e:
            self.drop()
            raise _Lost(repr(e)) from e

    def drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.conn = None


_stop = False


def _on_term(_sig: int, _frame: object) -> None:
    global _stop
    _stop = True


def worker_main(root: str, acks: str, logdir: str, worker_id: str, seed: int,
                run: str = RUN) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    log = AckLog(PosixFS(), os.path.join(acks, f"q-{worker_id}.log"))
    store = _open_store(root, worker_id, run)
    inc = f"{time.time_ns():x}"
    r = random.Random(f"{seed}:{worker_id}:{inc}")
    c = _Conn(logdir)
    retry: dict[str, Any] | None = None  # a completion whose outcome is unknown
    n_sub = 0
    try:
        while not _stop and not orphaned():
            try:
                if retry is not None:
                    done = _complete(c, log, logdir, worker_id, retry)
                    if done:
                        retry = None
                    continue
                rep = c.call("acquire", worker=worker_id)
                if rep[0] == "err":
                    _refused(c, log, logdir, worker_id, rep, "acquire")
                    continue
                res = rep[1]
                if not res.assignments:
                    tasks = [TaskSpec(f"{run}.{worker_id}.{inc}.{n_sub}.{i}",
                                      metadata={"by": worker_id},
                                      priority=r.randint(0, 2), max_attempts=50)
                             for i in range(r.randint(1, 4))]
                    req = f"{worker_id}.{inc}.req{n_sub}"
                    n_sub += 1
                    rep = c.call("submit", req=req, tasks=tasks)
                    if rep[0] == "ok":
                        log.append({"kind": "submit", "req": req, "epoch": rep[2],
                                    "tasks": list(rep[1])})
                    else:
                        _refused(c, log, logdir, worker_id, rep, "submit")
                    continue
                lease: Lease = res.assignments[0].lease
                if r.random() < 0.01:  # the pool collects while results are in flight (D2)
                    rep = c.call("gc")
                    if rep[0] == "err":
                        _refused(c, log, logdir, worker_id, rep, "gc")
                if r.random() < 0.05:
                    rep = c.call("fail", lease=lease)
                    if rep[0] == "err":
                        _refused(c, log, logdir, worker_id, rep, "fail")
                    continue
                sid = (f"{worker_id}:{lease.task_id}:{lease.generation}:"
                       f"{lease.coordinator_epoch}")
                ref = store.publish([Record("out", payload(sid), metadata={
                    "task_id": lease.task_id, "attempt_id": lease.attempt_id})],
                    submission_id=f"pub-{sid}")
                retry = {"sid": sid, "lease": lease, "ref": ref}
                if _complete(c, log, logdir, worker_id, retry):
                    retry = None
                time.sleep(r.random() * 0.003)
            except _Lost:
                time.sleep(0.02)
    except Exception:
        report(logdir, worker_id, "worker raised:\n" + traceback.format_exc())
        return 2
    finally:
        c.drop()
        store.close()
        log.close()
    return 0


def _refused(c: _Conn, log: AckLog, logdir: str, worker_id: str, rep: tuple[Any, ...],
             what: str) -> None:
    kind, msg = rep[1], rep[2]
    if kind == "Closed":  # (straw.errors.Closed, a ValueError too)
        c.drop()  # the coordinator is shutting down (SIGTERM): go to the next one
        return
    if kind not in EXPECTED:
        report(logdir, worker_id, f"{what}: unexpected {kind}: {msg}")
    if kind in REFUSALS:
        log.append({"kind": "refused", "what": what, "error": kind, "epoch": rep[3],
                    "gen": c.gen})
        c.drop()  # a fenced or broken coordinator: go to the newest one


def _complete(c: _Conn, log: AckLog, logdir: str, worker_id: str,
              job: dict[str, Any]) -> bool:
    """Send one completion; True when its outcome is known (acknowledged or refused for
    good), False to retry it on the current coordinator."""
    t_send = time.time()
    try:
        rep = c.call("complete", lease=job["lease"], sid=job["sid"], ref=job["ref"])
    except _Lost:
        return False
    if rep[0] == "ok":
        rc = rep[1]
        log.append({"kind": "receipt", "sid": job["sid"], "task": rc.task_id,
                    "attempt": job["lease"].generation, "position": rc.position,
                    "ref": rc.result_ref.to_dict(), "epoch": rep[2],
                    "receipt_epoch": int(job["lease"].coordinator_epoch),
                    "t_send": t_send, "t_ack": time.time(), "gen": c.gen})
        if (rc.task_id, rc.result_ref) != (job["lease"].task_id, job["ref"]):
            report(logdir, worker_id, f"receipt {rc} does not match {job['sid']}")
        return True
    _refused(c, log, logdir, worker_id, rep, "complete")
    return rep[1] != "IndeterminateCommit"


# --- the supervisor and the checker ----------------------------------------------------------

@dataclass
class QueueSummary:
    seed: int
    seconds: float
    workers: int
    target: str = "local"
    worker_kills: int = 0
    worker_stops: int = 0
    coordinator_kills: int = 0
    coordinator_stops: int = 0
    takeovers: int = 0
    slow_takeovers: int = 0
    refusals: int = 0
    submits: int = 0
    receipts: int = 0
    commits: int = 0
    final_epoch: int = 0
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"fuzz [queue/{self.target}] seed={self.seed} {self.seconds:.0f}s, "
                f"{self.workers} workers: "
                f"{self.worker_kills} worker kills, {self.worker_stops} worker stops, "
                f"{self.coordinator_kills} coordinator kills (recovered), "
                f"{self.coordinator_stops} coordinator stops, {self.takeovers} takeovers "
                f"({self.slow_takeovers} waited for the paused holder), "
                f"{self.refusals} refused replies (fenced/indeterminate); {self.receipts} "
                f"acknowledged receipts verified, {self.commits} commits, "
                f"{self.submits} submissions, final epoch {self.final_epoch}; "
                f"{len(self.violations)} violations")


def _argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fault_injection.queue_fuzz", "--role", role, *args]


def _wait_serving(logdir: str, gen: int, proc: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    path = os.path.join(logdir, f"coord-{gen}.json")
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        if proc.p.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def run_queue(base: str, *, seconds: float, n_workers: int, seed: int,
              control: str | None = None, shared: tuple[str, str] | None = None,
              target: str = "local", run: str = RUN,
              roots: tuple[str, str] | None = None, pace: float = 1.0,
              before_check: Callable[[], object] | None = None) -> QueueSummary:
    """One run; ``control``: a name from ``queue_campaign.QUEUE_CONTROLS`` to run every
    coordinator broken (the run must then report violations).  ``shared``: two mounts of
    one volume (JuiceFS clients a and b): the pool lives there, workers use client a,
    coordinators alternate between the clients (so a takeover crosses clients) and the
    checker uses client b; logs and sockets stay under ``base``.  ``roots``: the pool as
    seen through the two clients, if not the default (runs sharing a root); ``run``: the
    run id of every process; ``pace`` stretches the time between the supervisor's actions
    (a busier machine); ``before_check`` is called after every process ended, before the
    checker runs."""
    if roots is None:
        roots = (os.path.join(base, "pool"),) * 2 if shared is None else (
            os.path.join(shared[0], "queue-pool"), os.path.join(shared[1], "queue-pool"))
    root = roots[0]
    acks = os.path.join(base, "acks")
    logdir = os.path.join(base, "logs")
    os.makedirs(acks, exist_ok=True)
    os.makedirs(logdir, exist_ok=True)
    s = QueueSummary(seed, seconds, n_workers, target)
    rng = random.Random(seed)
    gen = 0

    def start_coord(g: int, takeover: bool) -> Any:
        return Proc(f"coord{g}", _argv("coordinator", "--root", roots[g % 2], "--logdir",
                                        logdir, "--run", run,
                                        "--gen", str(g),
                                        *(("--takeover",) if takeover else ()),
                                        *(("--control", control) if control else ())), logdir)

    coord = start_coord(0, False)
    if not _wait_serving(logdir, 0, coord, 60):
        s.violations.append(f"the first coordinator did not start:\n{coord.tail()}")
    names = [f"qw{i}" for i in range(n_workers)]
    workers: dict[str, Any] = {
        w: Proc(w, _argv("worker", "--root", root, "--acks", acks, "--logdir", logdir,
                          "--worker-id", w, "--seed", str(seed), "--run", run), logdir)
        for w in names}
    old_coords: list[Any] = []
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            time.sleep(rng.uniform(0.2, 0.7) * pace)
            for proc in workers.values():
                rc = proc.p.poll()
                if rc is not None:
                    s.violations.append(f"{proc.name} exited on its own (rc={rc}):\n"
                                        f"{proc.tail()}")
                    proc.start()
            rc = coord.p.poll()
            if rc is not None:
                s.violations.append(f"{coord.name} exited on its own (rc={rc}):\n"
                                    f"{coord.tail()}")
                gen += 1
                coord = start_coord(gen, False)
                _wait_serving(logdir, gen, coord, 60)
            action = rng.choices(["kill-worker", "stop-worker", "kill-coord", "takeover",
                                  "none"], weights=[4, 2, 2, 2, 1])[0]
            # even a short run kills and replaces the coordinator at least once each
            left = t_end - time.monotonic()
            if s.coordinator_kills == 0 and left < seconds * 2 / 3:
                action = "kill-coord"
            elif s.takeovers == 0 and left < seconds / 3:
                action = "takeover"
            w = workers[rng.choice(names)]
            if action == "kill-worker":
                os.kill(w.pid, signal.SIGKILL)
                w.p.wait()
                s.worker_kills += 1
                w.start()
            elif action == "stop-worker":
                os.kill(w.pid, signal.SIGSTOP)
                time.sleep(rng.uniform(0.05, 1.5))
                os.kill(w.pid, signal.SIGCONT)
                s.worker_stops += 1
            elif action == "kill-coord":
                os.kill(coord.pid, signal.SIGKILL)
                coord.p.wait()
                s.coordinator_kills += 1
                gen += 1
                coord = start_coord(gen, False)
                if not _wait_serving(logdir, gen, coord, 60):
                    s.violations.append(f"coordinator {gen} did not recover:\n{coord.tail()}")
            elif action == "takeover":
                old = coord
                time.sleep(rng.uniform(0.0, 0.05))
                os.kill(old.pid, signal.SIGSTOP)
                s.coordinator_stops += 1
                gen += 1
                coord = start_coord(gen, True)
                # the paused holder may hold the pool's catalog lock: then the takeover waits
                # for it (a liveness matter, counted), so resume it after a while
                if not _wait_serving(logdir, gen, coord, 5):
                    s.slow_takeovers += 1
                    os.kill(old.pid, signal.SIGCONT)
                    if not _wait_serving(logdir, gen, coord, 60):
                        s.violations.append(f"takeover {gen} did not start:\n{coord.tail()}")
                time.sleep(rng.uniform(0.0, 0.3))
                os.kill(old.pid, signal.SIGCONT)  # it resumes: it must acknowledge nothing
                s.takeovers += 1
                time.sleep(rng.uniform(0.2, 1.0))
                os.kill(old.pid, signal.SIGKILL)
                old.p.wait()
                old_coords.append(old)
    finally:
        s.violations += stop_all([*workers.values(), coord])
    s.violations += logged_violations(logdir)
    if before_check is not None:
        before_check()
    check_queue(roots[1], acks, logdir, names, s, run=run)
    return s


def _coordinators(logdir: str) -> list[dict[str, Any]]:
    out = []
    for p in glob.glob(os.path.join(logdir, "coord-*.json")):
        with open(p) as f:
            out.append(json.load(f))
    return sorted(out, key=lambda i: i["gen"])


def check_queue(root: str, acks: str, logdir: str, workers: Sequence[str],
                s: QueueSummary, *, run: str = RUN) -> None:
    """See the module docstring."""
    entries = []
    for w in workers:
        entries += AckLog(PosixFS(), os.path.join(acks, f"q-{w}.log")).read()
    receipts = [e for e in entries if e["kind"] == "receipt"]
    submits = [e for e in entries if e["kind"] == "submit"]
    s.refusals = sum(1 for e in entries if e["kind"] == "refused")
    coords = _coordinators(logdir)
    # no stale acknowledgement: a success of epoch E to a request sent after a newer epoch
    # was serving
    for e in receipts:
        newer = [c for c in coords if c["epoch"] > e["epoch"] and c["t_serving"] < e["t_send"]]
        if newer:
            s.violations.append(
                f"stale acknowledgement: {e['sid']} acknowledged by epoch {e['epoch']} for a "
                f"request sent {e['t_send'] - newer[0]['t_serving']:.3f}s after epoch "
                f"{newer[0]['epoch']} started serving")
    by_pos: dict[int, str] = {}
    for e in receipts:
        other = by_pos.setdefault(e["position"], e["sid"])
        if other != e["sid"]:
            s.violations.append(f"position {e['position']} acknowledged to {other} and "
                                f"{e['sid']}")
    store = SharedFilesystemStore(root, run, writer_id="checker")
    try:
        q = _open_coordinator(store, recover=True)
    except Exception as exc:
        s.violations.append(f"checker: recovery raised {type(exc).__name__}: {exc}")
        store.close()
        return
    try:
        s.final_epoch = q.epoch_number
        for e in receipts:
            got = q.lookup_submission(e["sid"])
            ref = RecordSetRef.from_dict(e["ref"])
            want = (e["task"], e["position"], ref)
            if got is None or (got.task_id, got.position, got.result_ref) != want:
                s.violations.append(f"lost receipt {e['sid']} (position {e['position']}, "
                                    f"epoch {e['epoch']}): lookup returned {got}")
                continue
            try:
                recs = list(store.read(ref))
                if len(recs) != 1 or bytes(recs[0].payload) != payload(e["sid"]):
                    raise AssertionError("payload differs")
            except Exception as exc:
                s.violations.append(f"result of {e['sid']} does not read back: "
                                    f"{type(exc).__name__}: {exc}")
                continue
            s.receipts += 1
        seen: dict[str, int] = {}
        cursor = 0
        while True:
            page = q.read_commits(cursor, 1000)
            if not page.commits:
                break
            for cm in page.commits:
                if not cm.task_id.startswith(f"{run}.") or cm.result_ref.run_id != run:
                    s.violations.append(f"queue of run {run!r} committed task {cm.task_id} "
                                        f"with result of run {cm.result_ref.run_id!r}")
                if cm.task_id in seen:
                    s.violations.append(f"task {cm.task_id} accepted twice (positions "
                                        f"{seen[cm.task_id]} and {cm.position})")
                seen[cm.task_id] = cm.position
            cursor = page.cursor
        s.commits = len(seen)
        for e in submits:
            for t in e["tasks"]:
                if q.task_status(t) is None:
                    s.violations.append(f"task {t} of acknowledged submission {e['req']} "
                                        "is missing")
            s.submits += 1
    finally:
        q.close()
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fault_injection.queue_fuzz")
    ap.add_argument("--role", choices=("coordinator", "worker"), required=True)
    for a in ("--root", "--acks", "--logdir", "--worker-id"):
        ap.add_argument(a)
    ap.add_argument("--gen", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--takeover", action="store_true")
    ap.add_argument("--control", default=None)
    ap.add_argument("--run", default=RUN)
    args = ap.parse_args(argv)
    if args.role == "coordinator":
        return coordinator_main(args.root, args.logdir, args.gen, args.takeover, args.control,
                                args.run)
    return worker_main(args.root, args.acks, args.logdir, args.worker_id, args.seed, args.run)


if __name__ == "__main__":
    sys.exit(main())
