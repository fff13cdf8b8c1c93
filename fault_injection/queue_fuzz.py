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
from fault_injection.queue_check import LEASE_SECONDS as LEASE_SECONDS
from fault_injection.queue_check import QUEUE as QUEUE
from fault_injection.queue_check import RUN as RUN
from fault_injection.queue_check import QueueSummary as QueueSummary
from fault_injection.queue_check import check_queue as check_queue
from fault_injection.queue_check import open_coordinator, payload
from straw import Record, SharedFilesystemStore
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.protocol import Lease, TaskSpec
from straw.publication_log import AckLog

REFUSALS = {"IndeterminateCommit", "Fenced"}
EXPECTED = REFUSALS | {"StaleAttempt", "LeaseExpired"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _open_store(root: str, writer_id: str, run: str = RUN) -> SharedFilesystemStore:
    store = SharedFilesystemStore(root, run, writer_id=writer_id, reserve_bytes=1 << 20,
                                  segment_target_bytes=8 << 20)
    until_unlocked(lambda: store.lookup_submission("-"))  # takes the writer lock
    return store


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
        from fault_injection.queue_controls import QUEUE_CONTROLS
        with QUEUE_CONTROLS[control]():
            return _coordinator(root, logdir, gen, takeover, run)
    return _coordinator(root, logdir, gen, takeover, run)


def _coordinator(root: str, logdir: str, gen: int, takeover: bool, run: str = RUN) -> int:
    signal.signal(signal.SIGTERM, _exit)
    store = SharedFilesystemStore(root, run, writer_id=f"coord{gen}")
    q = None
    try:
        q = open_coordinator(store, recover=gen > 0, takeover=takeover)
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


class _Supervisor:
    """The seeded supervisor of one run: it starts the coordinator incarnations (``gen``
    0, 1, ...; alternating between the two roots) and SIGKILLs, pauses and takes over
    them, and SIGKILLs and pauses the worker processes, counting it all in ``s``."""

    def __init__(self, s: QueueSummary, rng: random.Random, logdir: str,
                 roots: tuple[str, str], run: str, control: str | None) -> None:
        self.s, self.rng, self.logdir, self.roots = s, rng, logdir, roots
        self.run, self.control = run, control
        self.gen = 0
        self.workers: dict[str, Any] = {}
        self.old_coords: list[Any] = []
        self.coord = self.start_coord(0, False)

    def start_coord(self, g: int, takeover: bool) -> Any:
        return Proc(f"coord{g}", _argv("coordinator", "--root", self.roots[g % 2], "--logdir",
                                        self.logdir, "--run", self.run,
                                        "--gen", str(g),
                                        *(("--takeover",) if takeover else ()),
                                        *(("--control", self.control) if self.control else ())),
                    self.logdir)

    def unsettle(self, seconds: float, pace: float) -> None:
        """Seeded actions for ``seconds``; a process that exited on its own is a
        violation (and restarted)."""
        s, rng, names = self.s, self.rng, list(self.workers)
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            time.sleep(rng.uniform(0.2, 0.7) * pace)
            self._restart_exited()
            action = rng.choices(["kill-worker", "stop-worker", "kill-coord", "takeover",
                                  "none"], weights=[4, 2, 2, 2, 1])[0]
            # even a short run kills and replaces the coordinator at least once each
            left = t_end - time.monotonic()
            if s.coordinator_kills == 0 and left < seconds * 2 / 3:
                action = "kill-coord"
            elif s.takeovers == 0 and left < seconds / 3:
                action = "takeover"
            w = self.workers[rng.choice(names)]
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
                self._kill_coord()
            elif action == "takeover":
                self._takeover()

    def _restart_exited(self) -> None:
        s = self.s
        for proc in self.workers.values():
            rc = proc.p.poll()
            if rc is not None:
                s.violations.append(f"{proc.name} exited on its own (rc={rc}):\n"
                                    f"{proc.tail()}")
                proc.start()
        rc = self.coord.p.poll()
        if rc is not None:
            s.violations.append(f"{self.coord.name} exited on its own (rc={rc}):\n"
                                f"{self.coord.tail()}")
            self.gen += 1
            self.coord = self.start_coord(self.gen, False)
            _wait_serving(self.logdir, self.gen, self.coord, 60)

    def _kill_coord(self) -> None:
        os.kill(self.coord.pid, signal.SIGKILL)
        self.coord.p.wait()
        self.s.coordinator_kills += 1
        self.gen += 1
        self.coord = self.start_coord(self.gen, False)
        if not _wait_serving(self.logdir, self.gen, self.coord, 60):
            self.s.violations.append(f"coordinator {self.gen} did not recover:\n"
                                     f"{self.coord.tail()}")

    def _takeover(self) -> None:
        s, rng, gen = self.s, self.rng, self.gen + 1
        old = self.coord
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(old.pid, signal.SIGSTOP)
        s.coordinator_stops += 1
        self.gen = gen
        self.coord = coord = self.start_coord(gen, True)
        # the paused holder may hold the pool's catalog lock: then the takeover waits
        # for it (a liveness matter, counted), so resume it after a while
        if not _wait_serving(self.logdir, gen, coord, 5):
            s.slow_takeovers += 1
            os.kill(old.pid, signal.SIGCONT)
            if not _wait_serving(self.logdir, gen, coord, 60):
                s.violations.append(f"takeover {gen} did not start:\n{coord.tail()}")
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(old.pid, signal.SIGCONT)  # it resumes: it must acknowledge nothing
        s.takeovers += 1
        time.sleep(rng.uniform(0.2, 1.0))
        os.kill(old.pid, signal.SIGKILL)
        old.p.wait()
        self.old_coords.append(old)


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
    sup = _Supervisor(s, random.Random(seed), logdir, roots, run, control)
    if not _wait_serving(logdir, 0, sup.coord, 60):
        s.violations.append(f"the first coordinator did not start:\n{sup.coord.tail()}")
    names = [f"qw{i}" for i in range(n_workers)]
    sup.workers = {
        w: Proc(w, _argv("worker", "--root", root, "--acks", acks, "--logdir", logdir,
                          "--worker-id", w, "--seed", str(seed), "--run", run), logdir)
        for w in names}
    try:
        sup.unsettle(seconds, pace)
    finally:
        s.violations += stop_all([*sup.workers.values(), sup.coord])
    s.violations += logged_violations(logdir)
    if before_check is not None:
        before_check()
    check_queue(roots[1], acks, logdir, names, s, run=run)
    return s


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
