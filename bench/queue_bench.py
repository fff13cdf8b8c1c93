"""Queue figures (issue 6), part of ``just bench``; alone: ``python -m bench.queue_bench``.

* one client in process: acquire -> publish a 256 B result -> complete, tasks/s (the
  figure ``just bench-peer`` sets against straw-queue); and the same work with
  ``complete_and_acquire`` (straw's addition: the commit and the next grant in one journal
  transaction) — every client figure below is given for both loops, alternated per round;
* the same loop from client *processes* (workers live on other machines in production):
  each publishes into its own store and calls the coordinator, which runs in this
  process with one serving thread per client, over a pipe carrying only control messages
  (leases, references) as Ray would.  1 and N clients, tasks/s and the ratio, plus
  coordinator syncs (journal + catalog fsync/fdatasync, counted by ``CountingFS`` on the
  coordinator's store) per completion — group commit;
* reopening (recovering) a queue with N completed tasks: seconds;
* control bytes per completed task: journal + snapshot bytes on disk / tasks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from straw import Publication, Record, SharedFilesystemStore
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.protocol import Limits, TaskSpec

from .counting import CountingFS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNCS = ("fsync", "fdatasync", "fsync_dir")


def _work(store: SharedFilesystemStore, q: Coordinator, worker: str, n: int,
          combined: bool = False) -> None:
    payload = os.urandom(256)
    got = q.acquire(worker)
    for _ in range(n):
        if not got.assignments:
            return
        lease = got.assignments[0].lease
        ref = store.publish([Record("out", payload, metadata={"task_id": lease.task_id,
                                                              "attempt_id": lease.attempt_id})],
                            submission_id=f"out-{lease.task_id}")
        if combined:  # straw's addition: the commit and the next grant in one step
            _, got = q.complete_and_acquire(lease, submission_id=f"done-{lease.task_id}",
                                            result_ref=ref)
        else:
            q.complete_task(lease, submission_id=f"done-{lease.task_id}", result_ref=ref)
            got = q.acquire(worker)


def one_client(root: str, n: int, combined: bool = False) -> float:
    """One client in process, acquire -> publish -> complete (``combined``: publish ->
    complete_and_acquire); tasks/s."""
    with SharedFilesystemStore(root, "bench", writer_id="w0") as store:
        q = Coordinator(store, queue_id="one")
        q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(n)])
        t0 = time.perf_counter()
        _work(store, q, "w0", n, combined)
        rate = n / (time.perf_counter() - t0)
        q.close()
    return rate


def _client_process(conn: Connection, root: str, worker: str, combined: bool = False) -> None:
    """One client in its own process (workers run on other machines in production): it
    publishes into its own store and calls the coordinator over ``conn``.  Control
    messages only (leases and references) cross the pipe, as they would cross Ray."""
    with SharedFilesystemStore(root, "bench", writer_id=worker) as store:
        payload = os.urandom(256)
        conn.send("ready")
        conn.recv()  # go
        done = 0
        conn.send(("acquire", worker))
        lease = conn.recv()
        while lease is not None:
            ref = store.publish([Record("out", payload, metadata={
                "task_id": lease.task_id, "attempt_id": lease.attempt_id})],
                submission_id=f"out-{lease.task_id}")
            if combined:  # one call: the commit and the next lease
                conn.send(("complete_next", lease, f"done-{lease.task_id}", ref))
                lease = conn.recv()
            else:
                conn.send(("complete", lease, f"done-{lease.task_id}", ref))
                conn.recv()
                conn.send(("acquire", worker))
                lease = conn.recv()
            done += 1
        conn.send(("bye", done))


def _serve(q: Coordinator, conn: Connection, errors: list[BaseException]) -> None:
    """The coordinator's side of one client connection (one thread per client).  An error
    is kept for the caller, and the client is told to stop (``None``) instead of hanging."""
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "acquire":
                got = q.acquire(msg[1])
                conn.send(got.assignments[0].lease if got.assignments else None)
            elif msg[0] == "complete":
                _, lease, sub, ref = msg
                q.complete_task(lease, submission_id=sub, result_ref=ref)
                conn.send(True)
            elif msg[0] == "complete_next":
                _, lease, sub, ref = msg
                _, got = q.complete_and_acquire(lease, submission_id=sub, result_ref=ref)
                conn.send(got.assignments[0].lease if got.assignments else None)
            else:
                return
        except Exception as e:  # noqa: BLE001 - reported by clients()
            errors.append(e)
            conn.send(None)


def clients(root: str, n: int, nclients: int, combined: bool = False) -> dict[str, float]:
    """``nclients`` client processes against one coordinator (this process, one serving
    thread per client): tasks/s and coordinator syncs per completion.  ``combined``: the
    clients finish each task with ``complete_and_acquire``."""
    ctx = mp.get_context("spawn")
    counting = CountingFS(PosixFS())
    coord_store = SharedFilesystemStore(root, "bench", writer_id="coord", fs=counting)
    q = Coordinator(coord_store, queue_id="many")
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(n)])
    pairs = [ctx.Pipe() for _ in range(nclients)]
    procs = [ctx.Process(target=_client_process, args=(child, root, f"w{i}", combined),
                         daemon=True)
             for i, (_, child) in enumerate(pairs)]
    for pr in procs:
        pr.start()
    conns = [parent for parent, _ in pairs]
    for c in conns:
        if c.recv() != "ready":
            raise RuntimeError("a bench client failed to start")
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_serve, args=(q, c, errors), daemon=True)
               for c in conns]
    for t in threads:
        t.start()
    before = sum(counting.calls.get(op, 0) for op in SYNCS)
    t0 = time.perf_counter()
    for c in conns:
        c.send("go")
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    syncs = sum(counting.calls.get(op, 0) for op in SYNCS) - before
    done = q.metrics()["completed"]
    for pr in procs:
        pr.join(timeout=30)
    q.close()
    coord_store.close()
    if errors:
        raise RuntimeError(f"the coordinator failed serving a client: {errors[0]!r}")
    if done != n:
        raise RuntimeError(f"{done} of {n} tasks completed")
    return {"rate": done / wall, "syncs_per_completion": syncs / done, "completed": done}


def reopen(root: str, n: int) -> dict[str, float]:
    with SharedFilesystemStore(root, "bench", writer_id="w") as store:
        q = Coordinator(store, queue_id="big", snapshot_every=5_000,
                        limits=Limits(max_leases_per_worker=10**6))
        batch = min(5_000, n)
        for b in range(0, n, batch):
            q.submit_tasks(f"r{b}", [TaskSpec(f"task-{i:07d}") for i in range(b, b + batch)])
            got = q.acquire("w", max_tasks=batch)
            # one small result per task (they must name their lease), one publish_many
            refs = store.publish_many(
                [Publication([Record("out", b"r" * 256, metadata={
                    "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})])
                 for a in got.assignments], submission_id=f"results-{b}")
            for a, r in zip(got.assignments, refs, strict=True):
                q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}", result_ref=r)
        q.close()
        jdir = q.journal_dir
        control = sum(os.path.getsize(os.path.join(jdir, f)) for f in os.listdir(jdir))
        t0 = time.perf_counter()
        q2 = Coordinator(store, queue_id="big", recover=True)
        seconds = time.perf_counter() - t0
        assert q2.metrics()["completed"] == n
        q2.close()
        with store.catalog.locked():  # its data (not the reserved tail) and its snapshot
            foot = store.catalog.footprint()
        catalog = foot["catalog_bytes"] + foot["snapshot_bytes"]
    return {"reopen_s": seconds, "control_bytes_per_task": control / n, "tasks": n,
            "fresh_process_s": _reopen_fresh(root), "catalog_bytes_per_task": catalog / n}


_FRESH = """
import sys, time
from straw import SharedFilesystemStore
from straw.coordinator import Coordinator
t0 = time.perf_counter()
with SharedFilesystemStore(sys.argv[1], "bench", writer_id="fresh") as s:
    Coordinator(s, queue_id="big", recover=True).close()
print(time.perf_counter() - t0)
"""


def _reopen_fresh(root: str) -> float:
    """Reopen from a new process (imports excluded): this also replays the pool catalog,
    which a coordinator restarted in a process whose store is open does not."""
    out = subprocess.run([sys.executable, "-c", _FRESH, root], check=True, text=True,
                         capture_output=True, cwd=REPO).stdout
    return float(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--history", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=os.environ.get("STRAW_BENCH_DIR",
                                                   os.path.join(REPO, "bench-out")))
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.history, args.rounds = 50, 500, 1
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-queue-", dir=args.dir)
    loops = {"plain": False, "combined": True}  # acquire + complete_task / complete_and_acquire
    try:
        ones: dict[str, list[float]] = {k: [] for k in loops}
        singles: dict[str, list[dict[str, float]]] = {k: [] for k in loops}
        manys: dict[str, list[dict[str, float]]] = {k: [] for k in loops}
        for r in range(args.rounds):
            # the two loops alternate within a round (this disk's speed drifts between runs)
            for k, comb in (loops.items() if r % 2 == 0 else reversed(loops.items())):
                ones[k].append(one_client(os.path.join(work, f"one-{k}{r}"), args.tasks, comb))
                singles[k].append(clients(os.path.join(work, f"single-{k}{r}"), args.tasks, 1,
                                          comb))
                manys[k].append(clients(os.path.join(work, f"many-{k}{r}"), args.tasks,
                                        args.clients, comb))
        big = reopen(os.path.join(work, "big"), args.history)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fig: dict[str, dict[str, float]] = {}
    for k in loops:
        fig[k] = {
            "one": statistics.median(ones[k]),
            "single": statistics.median(m["rate"] for m in singles[k]),
            "many": statistics.median(m["rate"] for m in manys[k]),
            # per round: N clients over 1 client measured next to each other
            "scaling": statistics.median(m["rate"] / s["rate"] for m, s in
                                         zip(manys[k], singles[k], strict=True)),
            "syncs": statistics.median(m["syncs_per_completion"] for m in manys[k]),
            "syncs_single": statistics.median(m["syncs_per_completion"] for m in singles[k]),
        }
    one, single, many = fig["plain"]["one"], fig["plain"]["single"], fig["plain"]["many"]
    scaling, syncs = fig["plain"]["scaling"], fig["plain"]["syncs"]
    res: dict[str, Any] = {
        "rounds": args.rounds,
        "one_client_in_process_tasks_per_s": one,
        "one_client_process_tasks_per_s": single,
        "clients": args.clients,
        "many_clients_tasks_per_s": many,
        "many_vs_one": scaling,
        "coordinator_syncs_per_completion": syncs,
        "combined": fig["combined"],
        "reopen_s": big["reopen_s"],
        "reopen_tasks": big["tasks"],
        "control_bytes_per_task": big["control_bytes_per_task"],
        "reopen_fresh_process_s": big["fresh_process_s"],
        "catalog_bytes_per_task": big["catalog_bytes_per_task"],
    }
    print(f"queue ({args.rounds} rounds, medians; the two loops alternate in each round): "
          "a worker loop of acquire -> publish 256 B -> complete_task ('plain', straw-queue's "
          "calls) or publish -> complete_and_acquire ('combined', straw's addition)")
    for k in loops:
        f = fig[k]
        print(f"  {k:8s} one client in process {f['one']:.0f} tasks/s; client processes: "
              f"1 -> {f['single']:.0f} tasks/s ({f['syncs_single']:.2f} coordinator syncs per "
              f"completion), {args.clients} -> {f['many']:.0f} tasks/s ({f['scaling']:.2f}x "
              f"of 1, target >= 3x; {f['syncs']:.2f} coordinator syncs per completion, "
              "target <= 0.7)")
    print(f"  reopen with {big['tasks']:,} completed tasks: {big['reopen_s']:.3f} s "
          f"(target < 0.3 s); control bytes per task {big['control_bytes_per_task']:.0f} "
          "(target <= 400)")
    print(f"  the same reopen from a fresh process (replays the pool catalog too): "
          f"{big['fresh_process_s']:.3f} s; catalog bytes per task "
          f"{big['catalog_bytes_per_task']:.0f} (catalog frames + snapshot; bench.catalog_bench "
          "has the figures at 1,000,000 tasks)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
