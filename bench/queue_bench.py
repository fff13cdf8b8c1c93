"""Queue figures (issue 6), part of ``just bench``; alone: ``python -m bench.queue_bench``.

* one client: acquire -> publish a 256 B result -> complete, tasks/s;
* 8 concurrent clients (threads sharing one coordinator) doing the same: tasks/s, and
  coordinator syncs (journal + catalog fsync/fdatasync) per completion — group commit;
* reopening (recovering) a queue with N completed tasks: seconds;
* control bytes per completed task: journal + snapshot bytes on disk / tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from straw import Publication, Record, SharedFilesystemStore
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.queue_types import Limits, TaskSpec

from .counting import CountingFS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNCS = ("fsync", "fdatasync", "fsync_dir")


def _work(store: SharedFilesystemStore, q: Coordinator, worker: str, n: int) -> None:
    payload = os.urandom(256)
    for _ in range(n):
        got = q.acquire(worker)
        if not got.assignments:
            return
        lease = got.assignments[0].lease
        ref = store.publish([Record("out", payload, metadata={"task_id": lease.task_id,
                                                              "attempt": lease.attempt})],
                            submission_id=f"out-{lease.task_id}")
        q.complete_task(lease, submission_id=f"done-{lease.task_id}", result_ref=ref)


def one_client(root: str, n: int) -> float:
    with SharedFilesystemStore(root, "bench", writer_id="w0", reserve_bytes=0) as store:
        q = Coordinator(store, queue_id="one")
        q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(n)])
        t0 = time.perf_counter()
        _work(store, q, "w0", n)
        rate = n / (time.perf_counter() - t0)
        q.close()
    return rate


def many_clients(root: str, n: int, clients: int) -> dict[str, float]:
    counting = CountingFS(PosixFS())
    stores = [SharedFilesystemStore(root, "bench", writer_id=f"w{i}", reserve_bytes=0)
              for i in range(clients)]
    coord_store = SharedFilesystemStore(root, "bench", writer_id="coord", fs=counting,
                                        reserve_bytes=0)
    q = Coordinator(coord_store, queue_id="many")
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(n)])
    before = sum(counting.calls.get(op, 0) for op in SYNCS)
    threads = [threading.Thread(target=_work, args=(stores[i], q, f"w{i}", n))
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = q.metrics()["completed"]
    syncs = sum(counting.calls.get(op, 0) for op in SYNCS) - before
    q.close()
    for s in stores + [coord_store]:
        s.close()
    return {"rate": done / wall, "syncs_per_completion": syncs / max(done, 1),
            "completed": done}


def reopen(root: str, n: int) -> dict[str, float]:
    with SharedFilesystemStore(root, "bench", writer_id="w", reserve_bytes=0) as store:
        q = Coordinator(store, queue_id="big", snapshot_every=5_000,
                        limits=Limits(max_leases_per_worker=10**6))
        batch = min(5_000, n)
        for b in range(0, n, batch):
            q.submit_tasks(f"r{b}", [TaskSpec(f"task-{i:07d}") for i in range(b, b + batch)])
            got = q.acquire("w", max_tasks=batch)
            # one small result per task (they must name their lease), one publish_many
            refs = store.publish_many(
                [Publication([Record("out", b"r" * 256, metadata={
                    "task_id": a.lease.task_id, "attempt": a.lease.attempt})])
                 for a in got.assignments], submission_id=f"results-{b}")
            for a, r in zip(got.assignments, refs, strict=True):
                q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}", result_ref=r)
        q.close()
        jdir = os.path.join(root, "queues", "default", "big", "journal")
        control = sum(os.path.getsize(os.path.join(jdir, f)) for f in os.listdir(jdir))
        t0 = time.perf_counter()
        q2 = Coordinator(store, queue_id="big", recover=True)
        seconds = time.perf_counter() - t0
        assert q2.metrics()["completed"] == n
        q2.close()
    return {"reopen_s": seconds, "control_bytes_per_task": control / n, "tasks": n}


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
    try:
        ones, manys = [], []
        for r in range(args.rounds):
            ones.append(one_client(os.path.join(work, f"one{r}"), args.tasks))
            manys.append(many_clients(os.path.join(work, f"many{r}"), args.tasks, args.clients))
        big = reopen(os.path.join(work, "big"), args.history)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    one = statistics.median(ones)
    many = statistics.median(m["rate"] for m in manys)
    syncs = statistics.median(m["syncs_per_completion"] for m in manys)
    res: dict[str, Any] = {
        "one_client_tasks_per_s": one,
        "clients": args.clients,
        "many_clients_tasks_per_s": many,
        "many_vs_one": many / one,
        "coordinator_syncs_per_completion": syncs,
        "reopen_s": big["reopen_s"],
        "reopen_tasks": big["tasks"],
        "control_bytes_per_task": big["control_bytes_per_task"],
    }
    print(f"queue: one client {one:.0f} tasks/s; {args.clients} clients {many:.0f} tasks/s "
          f"({many / one:.2f}x, target >= 4x); coordinator syncs/completion {syncs:.2f} "
          f"(target <= 0.5)")
    print(f"  reopen with {big['tasks']:,} completed tasks: {big['reopen_s']:.3f} s "
          f"(target < 0.3 s); control bytes per task {big['control_bytes_per_task']:.0f} "
          "(target <= 400)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
