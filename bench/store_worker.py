"""A store-workload worker, run as a script by ``bench.peer`` under either virtualenv.

    <python> bench/store_worker.py --impl ours|peer

straw and straw-queue are both imported as ``straw``, so each runs in its own
interpreter: this repository's ``.venv`` for ``ours``, ``.venv-peer`` for ``peer``.  The
worker loads ``workloads.py`` next to it as a plain module (run as a script, its own
directory is first on ``sys.path``, the repository root is not).

Protocol, one JSON object per line: the worker first prints ``{"hello": {...}}`` (which
implementation, version, module file, python); then for each line read from stdin,
``{"cmd": "round", "dir": DIR, "params": {...}}`` runs the three store workloads in DIR
(those of ``tensor_workloads`` when the params name ``tensor_rows``, and the one-client
queue loop when they name ``queue_tasks``); ``{"cmd": "queue_reopen", "dir": DIR,
"tasks": N}`` builds a queue with N completed tasks, then times reopening it.  Each prints
``{"ok": true, "result": {...}}`` (or ``{"ok": false, "error": "..."}``);
``{"cmd": "quit"}`` or end of input stops it.  Anything the libraries print goes to
stderr, so stdout carries only these lines.

The queue workloads (issue 6): for straw they are ``bench.queue_bench``'s own
``one_client`` and ``reopen``, imported from the repository; for straw-queue the same loop
is written here against its API (``Coordinator(store, queue_id=..., exclusive_owner=...)``,
``acquire`` -> ``publish`` one 256 B record naming the lease's task and attempt ->
``complete_task(..., result_digest=ref.digest)``).  Settings: straw-queue uses its
defaults; so do straw's stores, and its history queue snapshots every 5,000
transactions (default 20,000) with ``max_leases_per_worker`` raised so one worker can hold
a 5,000-task batch; straw-queue builds its history in batches of 256, its in-flight limit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

import tensor_workloads  # type: ignore[import-not-found]  # bench/tensor_workloads.py
import workloads  # type: ignore[import-not-found]  # bench/workloads.py, see above

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE_RUN_ID = "bench"  # the run id bench.queue_bench uses
QUEUE_OWNER = "bench/store_worker.py: the only coordinator of this queue"
PEER_BATCH = 256


def _import_our_straw() -> None:
    """Import ``straw`` from this repository (the tree being measured), not from wherever
    the virtualenv's install points: the worker runs with cwd ``/`` and no PYTHONPATH, so
    an editable install of another checkout would otherwise be measured instead."""
    sys.path.insert(0, REPO)
    try:
        importlib.import_module("straw")
    finally:
        sys.path.remove(REPO)


def _queue_bench() -> Any:
    """``bench.queue_bench`` (straw only).  This script's directory comes first on
    ``sys.path`` and holds a ``bench.py``, so the repository root goes first while the
    package is imported."""
    if "bench.queue_bench" not in sys.modules:
        sys.path.insert(0, REPO)
        try:
            sys.modules.pop("bench", None)
            importlib.import_module("bench.queue_bench")
        finally:
            sys.path.remove(REPO)
    return sys.modules["bench.queue_bench"]


def _peer_straw() -> Any:
    straw = importlib.import_module("straw")
    if not hasattr(straw, "store") or not hasattr(straw.store, "NativeStore"):
        raise RuntimeError(f"'straw' here ({straw.__file__}) is not straw-queue")
    return straw


def peer_one_client(root: str, n: int) -> float:
    """straw-queue: one client, ``n`` tasks of acquire -> publish a 256 B result ->
    complete; tasks/s of the loop (as ``bench.queue_bench.one_client``)."""
    straw = _peer_straw()
    with straw.SharedFilesystemStore(root, QUEUE_RUN_ID) as store, \
            straw.Coordinator(store, queue_id="one", exclusive_owner=QUEUE_OWNER) as q:
        q.submit_tasks("r", [straw.TaskSpec(f"t{i}") for i in range(n)])
        payload = os.urandom(256)
        t0 = time.perf_counter()
        for _ in range(n):
            got = q.acquire("w0")
            if not got.assignments:
                raise RuntimeError(f"straw-queue acquire returned {got.status!r}")
            lease = got.assignments[0].lease
            ref = store.publish([straw.Record("out", payload, metadata={
                "task_id": lease.task_id, "attempt_id": lease.attempt_id})],
                submission_id=f"out-{lease.task_id}")
            q.complete_task(lease, submission_id=f"done-{lease.task_id}", result_ref=ref,
                            result_digest=ref.digest)
        rate = n / (time.perf_counter() - t0)
        completed = q.metrics()["tasks"].get("completed", 0)
    if completed != n:
        raise RuntimeError(f"straw-queue completed {completed} of {n} tasks")
    return rate


def peer_reopen(root: str, n: int) -> dict[str, Any]:
    """straw-queue: a queue with ``n`` completed tasks, built the way
    ``bench.queue_bench.reopen`` builds ours (per batch: submit, acquire the whole batch,
    publish its results in one ``publish_many``, complete each), but in batches of
    ``PEER_BATCH``, straw-queue's default in-flight budget (``Limits.inflight_tasks``):
    its ``complete_task`` costs grow with the leases outstanding, and with ours' 5,000 a
    10,000-task history takes over 8 minutes to build (the journal bytes per task are the
    same within 1%).  Then the queue's control bytes on disk per task and the seconds of
    ``Coordinator(..., recover=True)``."""
    straw = _peer_straw()
    with straw.SharedFilesystemStore(root, QUEUE_RUN_ID) as store:
        q = straw.Coordinator(store, queue_id="big", exclusive_owner=QUEUE_OWNER)
        for b in range(0, n, PEER_BATCH):
            batch = min(PEER_BATCH, n - b)
            q.submit_tasks(f"r{b}", [straw.TaskSpec(f"task-{i:07d}")
                                     for i in range(b, b + batch)])
            got = q.acquire("w", max_tasks=batch)
            if len(got.assignments) != batch:
                raise RuntimeError(f"straw-queue acquired {len(got.assignments)} of {batch} "
                                   f"({got.status!r})")
            # straw-queue wants record ids unique across one publish_many call
            refs = store.publish_many(
                [straw.Publication([straw.Record(f"out-{a.lease.task_id}", b"r" * 256, metadata={
                    "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})])
                 for a in got.assignments], submission_id=f"results-{b}")
            for a, r in zip(got.assignments, refs, strict=True):
                q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}",
                                result_ref=r, result_digest=r.digest)
        journal = str(q.journal.path)
        q.close()
        # The queue's control state is its journal: straw-queue recovers from it alone
        # and writes no startup snapshot (its ``snapshot()`` is an on-demand inspection).
        control = os.path.getsize(journal)
        t0 = time.perf_counter()
        q2 = straw.Coordinator(store, queue_id="big", exclusive_owner=QUEUE_OWNER,
                               recover=True)
        seconds = time.perf_counter() - t0
        completed = q2.metrics()["tasks"].get("completed", 0)
        internal = q2.recovery_seconds
        q2.close()
    if completed != n:
        raise RuntimeError(f"straw-queue recovered {completed} of {n} completed tasks")
    return {"reopen_s": seconds, "control_bytes_per_task": control / n, "tasks": n,
            "control_bytes": control, "recovery_seconds_reported": internal}


def queue_one_client(impl: workloads.Impl, root: str, n: int) -> dict[str, Any]:
    if impl.name == "straw":
        rate = _queue_bench().one_client(root, n)
    else:
        rate = peer_one_client(root, n)
    return {"tasks_per_s": rate, "tasks": n}


def queue_reopen(impl: workloads.Impl, root: str, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = dict(_queue_bench().reopen(root, n) if impl.name == "straw" else peer_reopen(root, n))
    res["total_s"] = time.perf_counter() - t0  # building the history included
    return res


def run_round(impl: workloads.Impl, directory: str, p: dict[str, int]) -> dict[str, Any]:
    os.makedirs(directory, exist_ok=True)
    queue = ({"queue_one_client": queue_one_client(impl, os.path.join(directory, "queue"),
                                                   p["queue_tasks"])}
             if p.get("queue_tasks") else {})
    tensors = tensor_workloads.run_all(impl, directory, p) if "tensor_rows" in p else {}
    return {**queue, **tensors,
        "publish_large": workloads.publish_large(
            impl, os.path.join(directory, "large"), size=p["large_size"],
            count=p["large_count"]),
        "publish_small": workloads.publish_small(
            impl, os.path.join(directory, "small"), size=p["small_size"],
            count=p["small_count"], warmup=p["small_warmup"]),
        "read_large": workloads.read_large(
            impl, os.path.join(directory, "read"), size=p["read_size"],
            count=p["read_count"], passes=p["read_passes"]),
    }


MARK = "/nonexistent-straw-bench-mark-{}"


def count_pass(impl: workloads.Impl, directory: str, count: int, size: int = 1024) -> None:
    """For syscall counting under strace (``bench.peer``): warm up, then ``count`` small
    publications between two marker ``stat`` calls of paths that cannot exist."""
    store = impl.make_store(directory)
    try:
        data = workloads.payloads(size, 16)
        for i in range(20):
            store.publish([impl.record("warm", data[i % 16])], submission_id=f"warm-{i}")
        os.path.exists(MARK.format("start"))
        for i in range(count):
            store.publish([impl.record(f"r{i}", data[i % 16])], submission_id=f"count-{i}")
        os.path.exists(MARK.format("end"))
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("ours", "peer"), required=True)
    ap.add_argument("--count-pass", nargs=2, metavar=("DIR", "N"),
                    help="run only the syscall-counting pass (under strace) and exit")
    args = ap.parse_args()
    if args.impl == "ours":
        _import_our_straw()
    if args.count_pass:
        impl = workloads.ours() if args.impl == "ours" else workloads.peer()
        count_pass(impl, args.count_pass[0], int(args.count_pass[1]))
        return 0
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints, from Python or native code, go to stderr
    sys.stdout = sys.stderr
    impl = workloads.ours() if args.impl == "ours" else workloads.peer()
    out.write(json.dumps({"hello": {"impl": impl.name, "version": impl.version,
                                    "module": impl.module_file,
                                    "python": sys.executable}}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        try:
            if msg.get("cmd") == "queue_reopen":
                result = queue_reopen(impl, msg["dir"], msg["tasks"])
            else:
                result = run_round(impl, msg["dir"], msg["params"])
            reply = {"ok": True, "result": result}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
