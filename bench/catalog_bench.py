"""Catalog figures (issue 13 item 1), part of ``just bench``; alone:
``python -m bench.catalog_bench [--history N] [--at N1,N2,...]``.

At each history size of ``--at`` (default 100,000) and at ``--history`` N (default
1,000,000), from ONE build that stops there, closes its queue and store, is measured, and
goes on after reopening both with ``recover=True``:

* a fresh process opening a pool whose history holds that many completed tasks and
  recovering its queue (median of ``--opens``, each its own process; imports excluded):
  seconds, split into the catalog's part (the store's first catalog lock: snapshot +
  suffix as the build left it) and the queue's part (journal snapshot + suffix, the
  coordinator's replay), with the CPU time of the same (which other processes holding the
  cores do not inflate: the wall time of a fresh open on 2 shared cores at a load average
  of 16 was 3-4x its CPU time); and once more right after a compaction;
* catalog bytes per completed task after that compaction: catalog frames + the snapshot
  they name + the head copy, over the tasks;

and at N only: the longest pause a publisher in another process sees while the catalog of
that pool is compacted, against its longest pause without compaction in the same run.

The history is built through the real completion path, in batches of ``BATCH`` tasks:
one ``submit_tasks`` and one ``acquire`` of the whole batch, one ``publish_many`` of its
5,000 results (256 B each, naming its task and attempt: each an extent of its own), then
every task completed by its own ``complete_task`` from 32 threads, so that group commit
shares the journal and catalog syncs and every completion adopts its result into the
catalog; the catalog compacts itself in the background meanwhile, as in production.
Completing is the slow part: the coordinator has no call completing many tasks at once,
and a completion costs about 1.2 ms of CPU (2 cores shared with other work: 100,000 tasks
took 245 s, about 10,000 a minute at a load average of 13).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.queue_bench import complete_in_threads
from straw import Publication, Record, SharedFilesystemStore
from straw.catalog_snapshot import HEAD_NAME
from straw.coordinator import Coordinator
from straw.protocol import Limits, TaskSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 5_000


def build(root: str, n: int, threads: int = 32, *, at: tuple[int, ...] = (),
          reached: Callable[[int], None] | None = None) -> dict[str, Any]:
    """A queue ``big`` with ``n`` completed tasks, each with its own 256 B result.

    ``at``: history sizes at which the build stops, closes the
    queue and the store and calls ``reached(size)`` (which measures the pool from other
    processes), then reopens both (``recover=True``, as after a restart) and goes on: one
    build gives the figures at several sizes.  The time in ``reached`` is not build
    time."""
    t0 = time.perf_counter()
    paused = 0.0
    compactions: dict[str, Any] = {}
    stops = sorted(a for a in at if 0 < a < n)
    done = 0
    for stop in [*stops, n]:
        with SharedFilesystemStore(root, "bench", writer_id="w") as store:
            q = Coordinator(store, queue_id="big", recover=done > 0,
                            limits=Limits(max_leases_per_worker=10**6))
            for b in range(done, stop, BATCH):
                k = min(BATCH, stop - b)
                q.submit_tasks(f"r{b}", [TaskSpec(f"task-{i:07d}") for i in range(b, b + k)])
                got = q.acquire("w", max_tasks=k)
                refs = store.publish_many(
                    [Publication([Record("out", b"r" * 256, metadata={
                        "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})])
                     for a in got.assignments], submission_id=f"results-{b}")
                complete_in_threads(q, list(zip(got.assignments, refs, strict=True)),
                                    threads)
            q.close()
            for key, value in store.catalog.compactions.items():
                compactions[key] = (compactions.get(key, 0) + value
                                    if isinstance(value, (int, float)) else value)
        done = stop
        if stop < n and reached is not None:
            p0 = time.perf_counter()
            reached(stop)
            paused += time.perf_counter() - p0
    return {"build_s": time.perf_counter() - t0 - paused, "compactions": compactions}


_FRESH = """
import json, sys, time
from straw import SharedFilesystemStore
from straw.coordinator import Coordinator
t0, c0 = time.perf_counter(), time.process_time()
s = SharedFilesystemStore(sys.argv[1], "bench", writer_id=sys.argv[2])
with s.catalog.locked():
    foot = s.catalog.footprint()
t1, c1 = time.perf_counter(), time.process_time()
q = Coordinator(s, queue_id="big", recover=True)
t2, c2 = time.perf_counter(), time.process_time()
done = q.metrics()["completed"]
q.close()
s.close()
print(json.dumps({"catalog_s": t1 - t0, "queue_s": t2 - t1, "total_s": t2 - t0,
                  "catalog_cpu_s": c1 - c0, "queue_cpu_s": c2 - c1, "total_cpu_s": c2 - c0,
                  "completed": done, **foot}))
"""


def fresh_open(root: str, k: int) -> dict[str, Any]:
    """Open the pool and recover the queue from a new process (imports excluded)."""
    out = subprocess.run([sys.executable, "-c", _FRESH, root, f"fresh{k}"], check=True,
                         text=True, capture_output=True, cwd=REPO).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


_PUBLISHER = """
import json, sys, time
from straw import Record, SharedFilesystemStore
root, seconds = sys.argv[1], float(sys.argv[2])
with SharedFilesystemStore(root, "bench", writer_id="publisher") as s:
    s.catalog.compact_after = None
    ref = s.publish([Record("p", b"p" * 256)], submission_id="p")
    out = []
    end = time.time() + seconds
    i = 0
    print("ready", flush=True)
    while time.time() < end:
        t = time.time()
        s.retain(f"p{i % 50}", [ref])  # a catalog append under the pool lock
        out.append((t, time.time() - t))
        i += 1
print(json.dumps(out))
"""


def after_compaction(root: str) -> dict[str, float]:
    """A client's first catalog append after another client compacted the catalog: the
    client follows the new base frame from its view (CS2) or, if it cannot, decodes the
    snapshot under the pool lock.  Two stores in this process; medians of 3."""
    firsts, plains, follows = [], [], 0
    for k in range(3):
        with SharedFilesystemStore(root, "bench", writer_id=f"after{k}") as a, \
                SharedFilesystemStore(root, "bench", writer_id=f"compactor{k}") as b:
            a.catalog.compact_after = b.catalog.compact_after = None
            ref = a.publish([Record("p", b"p" * 256)], submission_id=f"after{k}")
            t = time.perf_counter()
            a.retain(f"after{k}", [ref])
            plains.append(time.perf_counter() - t)
            b.catalog.compact()
            before = a.catalog.follows
            t = time.perf_counter()
            a.release(f"after{k}")
            firsts.append(time.perf_counter() - t)
            follows += a.catalog.follows - before
    return {"first_append_s": statistics.median(firsts),
            "plain_append_s": statistics.median(plains), "followed": follows}


def publisher_pause(root: str) -> dict[str, float]:
    """The longest catalog append a publisher process sees while this process compacts
    the pool's catalog, and its longest one in a window without compaction."""
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, root, "8"], text=True,
                            stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the publisher did not start")
    with SharedFilesystemStore(root, "bench", writer_id="compactor") as store:
        store.catalog.compact_after = None
        time.sleep(2.0)  # the baseline window
        t0 = time.time()
        rep = store.catalog.compact()
        t1 = time.time()
    lines = proc.communicate()[0].strip().splitlines()
    ops = json.loads(lines[-1])
    base = [d for t, d in ops if t + d < t0 - 0.1]
    during = [d for t, d in ops if t < t1 and t + d > t0]
    return {"compaction_s": t1 - t0, "lock_held_s": (rep or {}).get("lock_held_s", 0.0),
            "pause_max_s": max(during, default=0.0), "baseline_max_s": max(base, default=0.0),
            "appends_during": len(during), "snapshot_bytes": (rep or {}).get("snapshot_bytes", 0)}


def measure(root: str, opens: int) -> dict[str, Any]:
    """The figures of one history size (the pool quiescent): ``opens`` fresh opens (each
    its own process) as the build left the catalog, then one right after a compaction
    and the catalog bytes per completed task there."""
    got = [fresh_open(root, k) for k in range(opens)]
    with SharedFilesystemStore(root, "bench", writer_id="compact") as store:
        store.catalog.compact_after = None
        store.catalog.compact()  # the footprint right after a compaction
    after = fresh_open(root, opens)
    head = os.path.getsize(os.path.join(root, HEAD_NAME))
    n = got[0]["completed"]
    med = {k: statistics.median(o[k] for o in got)
           for k in ("catalog_s", "queue_s", "total_s", "catalog_cpu_s", "queue_cpu_s",
                     "total_cpu_s")}
    return {"history": n, "opens": opens, "fresh_open_s": med["total_s"],
            "fresh_open_all_s": [o["total_s"] for o in got],
            "catalog_open_s": med["catalog_s"], "queue_recover_s": med["queue_s"],
            "fresh_open_cpu_s": med["total_cpu_s"], "catalog_open_cpu_s": med["catalog_cpu_s"],
            "queue_recover_cpu_s": med["queue_cpu_s"],
            "suffix_bytes_before": got[0]["suffix_bytes"],
            "open_after_compaction_s": after["total_s"],
            "catalog_bytes_per_task": (after["catalog_bytes"] + after["snapshot_bytes"]
                                       + head) / n,
            "snapshot_bytes": after["snapshot_bytes"], "suffix_bytes": after["suffix_bytes"],
            "generation": after["generation"]}


def report(m: dict[str, Any]) -> None:
    print(f"  {m['history']:,} completed tasks: fresh process opening the pool and "
          f"recovering its queue {m['fresh_open_s']:.3f} s (target < 0.3 s; median of "
          f"{m['opens']}: {', '.join(f'{x:.3f}' for x in m['fresh_open_all_s'])}) = catalog "
          f"{m['catalog_open_s']:.3f} s (suffix {m['suffix_bytes_before']:,} B as the build "
          f"left it) + queue {m['queue_recover_s']:.3f} s (journal snapshot + suffix, "
          f"replay); {m['open_after_compaction_s']:.3f} s right after a compaction "
          f"(snapshot {m['snapshot_bytes']:,} B)", flush=True)
    print(f"    CPU time of that open (not inflated while other processes hold the cores): "
          f"{m['fresh_open_cpu_s']:.3f} s = catalog {m['catalog_open_cpu_s']:.3f} s + queue "
          f"{m['queue_recover_cpu_s']:.3f} s", flush=True)
    print(f"    catalog bytes per completed task after compaction: "
          f"{m['catalog_bytes_per_task']:.1f} (target <= 50; catalog frames + snapshot + "
          "head copy)", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--history", type=int, default=1_000_000)
    p.add_argument("--at", default="100000",
                   help="smaller history sizes measured on the way, comma-separated")
    p.add_argument("--opens", type=int, default=3)
    p.add_argument("--dir", default=os.environ.get("STRAW_BENCH_DIR",
                                                   os.path.join(REPO, "bench-out")))
    p.add_argument("--keep", help="build the pool here and keep it (reused if it exists)")
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    at = tuple(int(a) for a in args.at.split(",") if a)
    if args.quick:
        args.history, args.opens, at = 2_000, 1, (1_000,)
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-catalog-", dir=args.dir)
    root = args.keep or os.path.join(work, "pool")
    sizes: list[dict[str, Any]] = []

    def reached(size: int) -> None:
        sizes.append(measure(root, args.opens))
        report(sizes[-1])

    try:
        if args.keep and os.path.exists(os.path.join(root, "CATALOG")):
            built: dict[str, Any] = {"build_s": 0.0, "compactions": {}, "reused": True}
        else:
            print(f"catalog: building a history of {args.history:,} completed tasks "
                  f"(measured on the way at {', '.join(f'{a:,}' for a in at)}) ...",
                  flush=True)
            built = build(root, args.history, at=at, reached=reached)
        sizes.append(measure(root, args.opens))
        pause = publisher_pause(root)
        after = after_compaction(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    final = sizes[-1]
    res = {**final, "build_s": built["build_s"], "sizes": sizes, "publisher": pause,
           "after_compaction": after,
           "background_compactions": built["compactions"]}
    print(f"catalog ({final['history']:,} completed tasks; history built in "
          f"{built['build_s']:.0f} s, {built['compactions'].get('done', 0)} background "
          "compactions meanwhile)")
    report(final)
    print(f"  publisher in another process during a compaction ({pause['compaction_s']:.2f} "
          f"s, pool lock held {pause['lock_held_s'] * 1e3:.1f} ms): longest catalog append "
          f"{pause['pause_max_s'] * 1e3:.1f} ms vs {pause['baseline_max_s'] * 1e3:.1f} ms "
          "without compaction in the same run")
    print(f"  a client's first catalog append after another client's compaction "
          f"{after['first_append_s'] * 1e3:.1f} ms (it followed the new base {after['followed']} "
          f"of 3 times, CS2; a plain append {after['plain_append_s'] * 1e3:.1f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
