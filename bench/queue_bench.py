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
  coordinator's store) per completion — group commit; and CPU milliseconds per completion
  of the coordinator's process and of the client processes, counted from "go" to the end
  only (what bounds the rate on a machine whose cores are shared);
* reopening (recovering) a queue with N completed tasks (``--history``, default 100,000;
  ``--history 1000000`` for issue 13's figure, about 15 min to build): seconds, in process
  and from a fresh process (split into the catalog's part, the queue's part and the first
  lookup of an old task, which reads history segments on demand);
* control bytes per completed task: journal + snapshot + history segment bytes / tasks.
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
from .report import scaling_bounds

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
        # this process's CPU from "go" on (its imports and setup excluded); process_time,
        # not os.times: os.times counts in clock ticks (10 ms here), more than a short
        # run's whole CPU, so it read 0.0 for a client now and then
        t0 = time.process_time()
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
        conn.send(("bye", done, time.process_time() - t0))


def _serve(q: Coordinator, conn: Connection, errors: list[BaseException],
           client_cpu: list[float]) -> None:
    """The coordinator's side of one client connection (one thread per client).  An error
    is kept for the caller, and the client is told to stop (``None``) instead of hanging.
    The client's CPU seconds from "go" to its last call go to ``client_cpu``."""
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
            else:  # ("bye", done, cpu seconds)
                client_cpu.append(msg[2])
                return
        except Exception as e:  # noqa: BLE001 - reported by clients()
            errors.append(e)
            conn.send(None)


def clients(root: str, n: int, nclients: int, combined: bool = False) -> dict[str, float]:
    """``nclients`` client processes against one coordinator (this process, one serving
    thread per client): tasks/s, coordinator syncs per completion, and CPU milliseconds
    per completion of the coordinator's process (``time.process_time``: all its threads,
    the pipe's unpickling and pickling included) and of the client processes together
    (each reports its ``time.process_time`` from "go" to its last call), both counted
    from "go" to the end only.  ``combined``: the clients finish each task with
    ``complete_and_acquire``."""
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
    client_cpu: list[float] = []
    threads = [threading.Thread(target=_serve, args=(q, c, errors, client_cpu), daemon=True)
               for c in conns]
    for t in threads:
        t.start()
    before = sum(counting.calls.get(op, 0) for op in SYNCS)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    for c in conns:
        c.send("go")
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    coord_cpu = time.process_time() - cpu0
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
    if len(client_cpu) != nclients:
        raise RuntimeError(f"{len(client_cpu)} of {nclients} clients reported their CPU")
    return {"rate": done / wall, "syncs_per_completion": syncs / done, "completed": done,
            "coordinator_cpu_ms": coord_cpu / done * 1e3,
            "client_cpu_ms": sum(client_cpu) / done * 1e3}


def complete_in_threads(q: Coordinator, work: list[tuple[Any, Any]], threads: int) -> None:
    """Complete every (assignment, result_ref) of ``work`` with its own ``complete_task``,
    from ``threads`` threads (group commit shares their journal syncs); the first error of
    any thread is raised after all have stopped."""
    errors: list[BaseException] = []

    def complete(part: int) -> None:
        try:
            for a, r in work[part::threads]:
                q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}",
                                result_ref=r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    ts = [threading.Thread(target=complete, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def build_history(store: SharedFilesystemStore, n: int, *, fast: bool = True,
                  threads: int = 32, batch: int = 5_000) -> Coordinator:
    """A queue ``big`` with ``n`` completed tasks, through the public calls: submits and
    acquires of ``batch`` tasks, then every task completed by its own ``complete_task``
    (snapshots every 20,000 transactions move history to history segments, as in
    production).  ``fast``: from ``threads`` threads (group commit shares the journal
    syncs), the tasks allowing an empty result and all completing with one empty
    publication, so the build costs journal syncs only, no catalog adoption per task --
    the queue's history is what a real job's would be, built several times faster.  Not
    ``fast``: one 256 B result per task (one ``publish_many`` per batch), completed in
    order, as ``bench.store_worker.peer_reopen`` builds straw-queue's.  Returns the open
    coordinator."""
    q = Coordinator(store, queue_id="big", snapshot_every=20_000 if fast else 5_000,
                    limits=Limits(max_leases_per_worker=10**6))
    empty = store.publish([], submission_id="empty-result") if fast else None
    for b in range(0, n, batch):
        k = min(batch, n - b)
        q.submit_tasks(f"r{b}", [TaskSpec(f"task-{i:07d}", allow_empty=fast)
                                 for i in range(b, b + k)])
        work = q.acquire("w", max_tasks=k).assignments
        if empty is None:
            refs = store.publish_many(
                [Publication([Record("out", b"r" * 256, metadata={
                    "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})])
                 for a in work], submission_id=f"results-{b}")
            for a, r in zip(work, refs, strict=True):
                q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}", result_ref=r)
            continue
        complete_in_threads(q, [(a, empty) for a in work], threads)
    return q


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) \
        if os.path.isdir(path) else 0


def reopen(root: str, n: int, fast: bool = False) -> dict[str, float]:
    """Build a history of ``n`` completed tasks (``build_history``), then reopen it in
    this process and from fresh processes."""
    t0 = time.perf_counter()
    with SharedFilesystemStore(root, "bench", writer_id="w") as store:
        q = build_history(store, n, fast=fast)
        q.close()
        build_s = time.perf_counter() - t0
        control = _dir_bytes(q.journal_dir) + _dir_bytes(q.history_dir)
        history = _dir_bytes(q.history_dir)
        t0 = time.perf_counter()
        q2 = Coordinator(store, queue_id="big", recover=True)
        seconds = time.perf_counter() - t0
        assert q2.metrics()["completed"] == n
        q2.close()
    fresh = [_reopen_fresh(root, k) for k in range(3)]
    best = min(fresh, key=lambda f: f["total_s"])
    return {"reopen_s": seconds, "control_bytes_per_task": control / n, "tasks": n,
            "history_bytes_per_task": history / n, "build_s": build_s,
            "fresh_process_s": statistics.median(f["total_s"] for f in fresh),
            "fresh_catalog_s": best["catalog_s"], "fresh_queue_s": best["queue_s"],
            "fresh_lookup_s": best["lookup_s"]}


_FRESH = """
import json, sys, time
from straw import SharedFilesystemStore
from straw.coordinator import Coordinator
t0 = time.perf_counter()
s = SharedFilesystemStore(sys.argv[1], "bench", writer_id=sys.argv[2])
with s.catalog.locked():
    pass
t1 = time.perf_counter()
q = Coordinator(s, queue_id="big", recover=True)
t2 = time.perf_counter()
assert q.task_status("task-0000007")["state"] == "completed"  # history, on demand
t3 = time.perf_counter()
q.close()
s.close()
print(json.dumps({"catalog_s": t1 - t0, "queue_s": t2 - t1, "total_s": t2 - t0,
                  "lookup_s": t3 - t2}))
"""


def _reopen_fresh(root: str, k: int) -> dict[str, float]:
    """Open the pool and recover the queue from a new process (imports excluded): the
    catalog's part (snapshot + suffix), the queue's (journal snapshot + suffix, history
    segments checked present, none read) and the first lookup of an old task."""
    out = subprocess.run([sys.executable, "-c", _FRESH, root, f"fresh{k}"], check=True,
                         text=True, capture_output=True, cwd=REPO).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


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
        big = reopen(os.path.join(work, "big"), args.history, fast=True)
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
            # CPU ms per completion from "go" to the end: the coordinator's process (all
            # its threads) and the client processes together
            "coord_cpu_ms_single": statistics.median(m["coordinator_cpu_ms"]
                                                     for m in singles[k]),
            "coord_cpu_ms": statistics.median(m["coordinator_cpu_ms"] for m in manys[k]),
            "client_cpu_ms_single": statistics.median(m["client_cpu_ms"] for m in singles[k]),
            "client_cpu_ms": statistics.median(m["client_cpu_ms"] for m in manys[k]),
        }
        fig[k].update(scaling_bounds(fig[k]["single"], fig[k]["coord_cpu_ms"],
                                     fig[k]["client_cpu_ms"], os.cpu_count() or 1))
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
        # CPU ms per completion from "go" to the end (the "combined" entry has its own)
        "coordinator_cpu_ms_per_completion": fig["plain"]["coord_cpu_ms"],
        "client_cpu_ms_per_completion": fig["plain"]["client_cpu_ms"],
        "combined": fig["combined"],
        "reopen_s": big["reopen_s"],
        "reopen_tasks": big["tasks"],
        "control_bytes_per_task": big["control_bytes_per_task"],
        "reopen_fresh_process_s": big["fresh_process_s"],
        "reopen_fresh_catalog_s": big["fresh_catalog_s"],
        "reopen_fresh_queue_s": big["fresh_queue_s"],
        "reopen_fresh_first_lookup_s": big["fresh_lookup_s"],
        "history_bytes_per_task": big["history_bytes_per_task"],
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
        print(f"  {'':8s} CPU ms per completion (from go to the end): coordinator process "
              f"{f['coord_cpu_ms_single']:.2f} at 1 client, {f['coord_cpu_ms']:.2f} at "
              f"{args.clients}; client processes {f['client_cpu_ms_single']:.2f} at 1, "
              f"{f['client_cpu_ms']:.2f} at {args.clients}")
        print(f"  {'':8s} ceiling of the ratio on this machine: {f['cores_bound']:.2f}x with "
              f"its {f['cores']:.0f} cores busy at that CPU per completion, "
              f"{f['coordinator_bound']:.2f}x with the coordinator's one thread busy "
              "(1-client wall time per completion over those CPU figures)")
    print("  catalog bytes per task: bench.catalog_bench (this build shares one result)")
    print(f"  reopen with {big['tasks']:,} completed tasks (built in {big['build_s']:.0f} s): "
          f"{big['reopen_s']:.3f} s in process; control bytes per task "
          f"{big['control_bytes_per_task']:.0f} (journal + snapshot + history segments; "
          f"history {big['history_bytes_per_task']:.0f})")
    print(f"  the same from a fresh process (median of 3): {big['fresh_process_s']:.3f} s "
          f"(target < 0.3 s at 1,000,000: --history 1000000); best run: catalog "
          f"{big['fresh_catalog_s']:.3f} s + queue {big['fresh_queue_s']:.3f} s (live state + "
          f"the history manifest); first lookup of an old task "
          f"{big['fresh_lookup_s'] * 1e3:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
