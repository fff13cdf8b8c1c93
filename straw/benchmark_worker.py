"""The benchmark's worker process (``python -m straw.benchmark worker``): writer threads
acquire tasks from the coordinator over ``straw.rpc``, publish records of the workload's
sizes and complete the tasks; reader threads follow the commit log and read every result
back.  The totals and latency percentiles go to ``worker-<index>.json`` under the root."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import resource
import socket
import threading
import time
from typing import Any

from .benchmark_workload import MIB, load_sizes, percentile
from .fs import PosixFS
from .reporting import write_report

TOKEN_ENV = "STRAW_RPC_TOKEN"


class _Host:
    """One host's writer and reader threads and what they share: the RPC client, the
    totals and latencies (under ``lock``) and ``failed``, which stops every thread once
    one raised."""

    def __init__(self, args: argparse.Namespace, client: Any, pool: str, stop: str) -> None:
        self.args, self.client, self.pool, self.stop = args, client, pool, stop
        self.fs = PosixFS()
        self.sizes = load_sizes(args)
        self.expected = args.tasks_per_writer * args.writers * args.host_count \
            if args.tasks_per_writer else None
        self.totals = {"written_bytes": 0, "read_bytes": 0, "publications": 0, "reads": 0}
        self.latencies: dict[str, list[float]] = {"write": [], "read": [], "commit": []}
        self.lock = threading.Lock()
        self.failed = threading.Event()

    def write(self, rank: int) -> None:
        from . import Record, SharedFilesystemStore
        args, client, totals, latencies = self.args, self.client, self.totals, self.latencies
        rng = random.Random(args.index * 1000 + rank)
        cache: dict[int, bytes] = {}  # one publication's buffers, reused (never zeros)
        done = 0
        with SharedFilesystemStore(self.pool, "benchmark",
                                   writer_id=f"bench-{args.index}-{rank}",
                                   segment_target_bytes=args.segment_mib * MIB) as store:
            while not self.failed.is_set() and not self.fs.probe(self.stop):
                page = client.call("acquire", worker_id=f"host-{args.index}-writer-{rank}",
                                   max_tasks=1, task_prefix=f"{args.index}:{rank}:")
                if not page["assignments"]:
                    return
                lease = page["assignments"][0]["lease"]  # the server rebuilds the Lease
                task = lease["task_id"]
                # the result names its task and attempt (whichever key the lease uses)
                meta = {k: lease[k] for k in ("task_id", "attempt", "attempt_id") if k in lease}
                shape = self.sizes[done % len(self.sizes)]
                cache = {n: cache[n] if n in cache else rng.randbytes(n) for n in set(shape)}
                t0 = time.monotonic()
                ref = store.publish([Record(f"{task}:{i}", cache[n], metadata=meta)
                                     for i, n in enumerate(shape)], submission_id=task)
                t1 = time.monotonic()
                client.call("complete_task", lease=lease, submission_id=task, result_ref=ref,
                            result_digest=ref.digest)
                t2 = time.monotonic()
                with self.lock:
                    totals["written_bytes"] += sum(shape)
                    totals["publications"] += 1
                    latencies["write"].append(t1 - t0)
                    latencies["commit"].append(t2 - t1)
                done += 1

    def read(self, rank: int) -> None:
        from . import RecordSetRef, SharedFilesystemStore
        args, client, totals, latencies = self.args, self.client, self.totals, self.latencies
        cursor = 0
        with SharedFilesystemStore(self.pool, "benchmark",
                                   writer_id=f"bench-reader-{args.index}-{rank}") as store:
            while not self.failed.is_set() and not self.fs.probe(self.stop):
                page = client.call("read_commits", cursor=cursor, limit=64)
                for receipt in page["commits"]:
                    producer = int(str(receipt["task_id"]).split(":")[0])
                    # a ring: each host reads the previous host's results (itself alone)
                    mine = args.fanout == args.host_count or \
                        producer == (args.index - 1) % args.host_count
                    if not mine or receipt["position"] % args.readers != rank:
                        continue
                    t0 = time.monotonic()
                    ref = RecordSetRef.from_dict(receipt["result_ref"])
                    amount = sum(memoryview(r.payload).nbytes for r in store.read(ref))
                    with self.lock:
                        totals["read_bytes"] += amount
                        totals["reads"] += 1
                        latencies["read"].append(time.monotonic() - t0)
                cursor = page.get("cursor", page.get("next_cursor", cursor))
                if page.get("end_of_input") or (self.expected is not None and
                                                 cursor >= self.expected):
                    return
                if not page["commits"]:
                    time.sleep(0.02)  # poll the commit log

    def run(self) -> None:
        """Every thread to its end; the first error is raised once all stopped."""
        args = self.args
        with concurrent.futures.ThreadPoolExecutor(args.writers + args.readers) as threads:
            futures = [threads.submit(self.write, i) for i in range(args.writers)] + \
                [threads.submit(self.read, i) for i in range(args.readers)]
            for future in concurrent.futures.as_completed(futures):
                try:
                    future.result()
                except BaseException:
                    self.failed.set()
                    raise


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Writer and reader threads of one host, controlled through ``args.address``."""
    from .rpc import QueueClient
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise ValueError(f"the worker needs the coordinator's RPC token in {TOKEN_ENV}")
    root = os.path.abspath(args.root)
    write_report(os.path.join(root, f"worker-{args.index}.pid.json"), {"pid": os.getpid()})
    client = QueueClient(args.address, token=token)
    host = _Host(args, client, os.path.join(root, "queue"), os.path.join(root, "STOP"))
    while time.time() < args.start_at:  # every host starts at once
        time.sleep(min(0.1, max(0.0, args.start_at - time.time())))
    cpu, started = time.process_time(), time.monotonic()
    host.run()
    latencies = host.latencies
    report = {**host.totals, "host": socket.gethostname(), "index": args.index,
              "seconds": time.monotonic() - started, "cpu_seconds": time.process_time() - cpu,
              "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              "write_p50_seconds": percentile(latencies["write"], 0.5),
              "write_p99_seconds": percentile(latencies["write"], 0.99),
              "read_p50_seconds": percentile(latencies["read"], 0.5),
              "read_p99_seconds": percentile(latencies["read"], 0.99),
              "commit_p99_seconds": percentile(latencies["commit"], 0.99)}
    write_report(os.path.join(root, f"worker-{args.index}.json"), report)
    return report
