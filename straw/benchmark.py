"""A queue benchmark with durable control and checked payload I/O (straw-queue 0.1.6's
``python -m straw.benchmark``: ``run``, ``worker``, ``profile``).

``run --local`` starts a coordinator served over ``straw.rpc``, submits tasks, and
launches one ``worker`` process.  Its writer threads acquire tasks, publish records of
the workload's sizes into the pool and complete the tasks; its reader threads follow the
commit log and read every result back, checked.  The run fails unless every planned task
was published and every byte written was read back; the report (JSON, ``--report``,
outside the temporary root) gives bandwidth, latency percentiles and pool file counts.

Workloads: ``--record-bytes N ...`` (the records of one publication), ``--profile FILE``
(a JSON ``{"publications": [[sizes], ...]}``, e.g. from ``profile``), or by default a
model of routed-expert and top-k tensors per sample (``--tokens``, ``--samples``).
``profile --trace DIR --output FILE`` summarises ``STRAW_TRACE_DIR`` traces
(``straw.tracing``) into such a workload.

Differences from straw-queue's: workers run on this machine only (``--hosts`` over SSH is
refused; start ``worker`` yourself on other hosts, with ``STRAW_RPC_TOKEN`` set, to spread
them), the token reaches the worker in its environment (``STRAW_RPC_TOKEN``), not in a
file.  The machine-relative benchmarks of straw itself are ``straw bench`` and
``just bench``.

``--online-gc`` (as in straw-queue) collects while the run goes: a thread of the
orchestrator runs the coordinator's ``collect_garbage`` every ``--gc-interval`` seconds
(ours, default 1 s: straw-queue's fixed 5 s outlasts a short run) while the worker
publishes and reads.  Nothing is acknowledged meanwhile, so those passes must keep
every result.  Once all readers
finished, the orchestrator saves the designated consumer's (``training``) progress past
every commit, which acknowledges every result read, and runs a last collection; the run
fails unless that collection left none of the workers' packs on disk.  The report then
has ``gc`` (what the last collection returned), ``gc_seconds`` (acknowledging plus the
last collection), ``concurrent_gc_passes`` (each pass's counts) and, ours,
``concurrent_gc_pass_count``, ``concurrent_gc_seconds`` and ``worker_packs`` (before and
after the last collection).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .benchmark_worker import TOKEN_ENV as TOKEN_ENV
from .benchmark_worker import worker as worker
from .benchmark_workload import MIB as MIB
from .benchmark_workload import _check_sizes
from .benchmark_workload import completion_peak as completion_peak
from .benchmark_workload import load_sizes as load_sizes
from .benchmark_workload import percentile as percentile
from .benchmark_workload import profile as profile
from .fs import PosixFS
from .pool.refs import PACK_SUFFIXES
from .reporting import write_report

TASK_CHUNK = 128  # tasks per submit_tasks request


# --- the orchestrator -------------------------------------------------------------------
def _files(root: str) -> list[tuple[str, int]]:
    fs, out, todo = PosixFS(), [], [root]
    while todo:
        here = todo.pop()
        try:
            names = fs.listdir(here)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for n in names:
            path = os.path.join(here, n)
            try:
                st = fs.stat(path)
            except FileNotFoundError:
                continue
            if st.is_dir:
                todo.append(path)
            else:
                out.append((path, st.size))
    return out


def _plan(args: argparse.Namespace, sizes: list[list[int]]) -> int:
    """Tasks per writer for ``args.gib``, after checking the storage budget."""
    average = sum(map(sum, sizes)) / len(sizes)
    count = max(1, int(args.gib * 2**30 / (args.writers * average)))
    volume = args.writers * sum(sum(sizes[i % len(sizes)]) for i in range(count))
    packs = max(1, -(-int(volume / args.writers) // (args.segment_mib * MIB)) + 1)
    if volume > args.max_gib * 2**30 or packs * args.writers + 32 > args.max_files:
        raise ValueError(f"the run would write {volume / 2**30:.2f} GiB in about "
                         f"{packs * args.writers} packs: over --max-gib {args.max_gib} or "
                         f"--max-files {args.max_files}")
    return count


class _ConcurrentGC:
    """``--online-gc``'s collector: a thread running ``coordinator.collect_garbage()``
    every ``interval`` seconds until ``stop``; a pass that fails ends the thread and is
    raised by ``stop`` (the run then fails, as its other checks do)."""

    def __init__(self, coordinator: Any, interval: float) -> None:
        self.coordinator, self.interval = coordinator, interval
        self.passes: list[dict[str, Any]] = []
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="benchmark-online-gc",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            t0 = time.monotonic()
            try:
                result = self.coordinator.collect_garbage()
            except BaseException as e:  # raised in the orchestrator by stop()
                self.error = e
                return
            took = time.monotonic() - t0
            self.seconds += took
            # the counts only: the path lists would grow the report with every pass
            self.passes.append({**{k: v for k, v in result.items() if isinstance(v, int)},
                                "seconds": took})

    def stop_quietly(self) -> None:
        """End the thread without raising (a run that already failed)."""
        self._stop.set()
        self._thread.join()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"a concurrent --online-gc collection (pass "
                               f"{len(self.passes) + 1}) failed: {self.error!r}") \
                from self.error


def _worker_packs(pool: str) -> list[str]:
    """The pack files the benchmark's worker stores (writer ids ``bench-...``) hold in
    ``pool`` now; the orchestrator's own pack (the consumer's progress) is not theirs."""
    writers = os.path.join(pool, "runs", "benchmark", "writers")
    return sorted(p for p, _ in _files(writers) if p.endswith(PACK_SUFFIXES) and
                  os.path.relpath(p, writers).split(os.sep)[0].startswith("bench-"))


def _acknowledge_reads(coordinator: Any, store: Any, commits: int) -> None:
    """Acknowledge every result the readers read: the designated consumer's progress
    (``processed_cursor``) past all ``commits`` is what releases results in our queue
    (``collect_garbage`` then retires their roots)."""
    from . import Record
    consumer = coordinator.consumer_id
    token = coordinator.open_consumer(consumer,
                                      exclusive_owner="the benchmark orchestrator, after "
                                                      "all benchmark readers finished")
    body = {"version": 1, "processed_positions": [], "finished_batches": []}
    progress = store.publish([Record("progress", json.dumps(body).encode(), "json.v1")],
                             submission_id="benchmark-readers-finished")
    coordinator.save_consumer_state(consumer, token=token,
                                    request_id="benchmark-readers-finished",
                                    state_ref=progress, progress_ref=progress,
                                    fetch_cursor=commits, processed_cursor=commits)
    coordinator.close_consumer(consumer, token)


def _final_collection(coordinator: Any, store: Any, pool: str,
                      commits: int) -> dict[str, Any]:
    """``--online-gc`` after the readers: acknowledge, collect, and check that no pack
    of the workers is left.  Returns the report's gc keys."""
    started = time.monotonic()
    before = _worker_packs(pool)
    _acknowledge_reads(coordinator, store, commits)
    result = coordinator.collect_garbage()
    left = _worker_packs(pool)
    out = {"gc": result, "gc_seconds": time.monotonic() - started,
           "worker_packs": {"before_last_gc": len(before), "after_last_gc": len(left)}}
    if not before:
        raise AssertionError(f"--online-gc: the pool {pool} holds no pack of the workers "
                             "before the last collection (a concurrent pass reclaimed "
                             "results nobody had acknowledged, or nothing was written)")
    if left:
        raise AssertionError(
            f"--online-gc: the last collection left {len(left)} of the workers' "
            f"{len(before)} packs in {pool} (e.g. {left[0]}) after every result was "
            f"acknowledged: something still keeps them (retained {result.get('retained_packs')}"
            f" packs, owners {result.get('owners')}); see `straw gc` / `straw inspect`")
    return out


def _check_args(args: argparse.Namespace) -> tuple[str, str]:
    """The run's options checked; returns its root and report path."""
    if not args.local:
        raise ValueError("straw.benchmark runs its worker on this machine (--local); to "
                         "spread workers over hosts start `python -m straw.benchmark worker` "
                         f"on each with {TOKEN_ENV} set")
    if min(args.writers, args.readers, args.timeout, args.max_files, args.segment_mib,
           args.publications_per_task, args.gc_interval) <= 0:
        raise ValueError("writers, readers, timeout, max-files, segment-mib, "
                         "publications-per-task and gc-interval must be positive")
    if args.fanout != 1:
        raise ValueError("--fanout must be 1 with one host")
    if not 0 < args.gib <= args.max_gib:
        raise ValueError(f"--gib {args.gib} must be positive and at most --max-gib "
                         f"{args.max_gib}")
    root = os.path.abspath(args.root)
    report_path = os.path.abspath(args.report)
    if report_path == root or report_path.startswith(root + os.sep):
        raise ValueError(f"--report {report_path} must lie outside the temporary root {root}")
    return root, report_path


def _start_worker(args: argparse.Namespace, root: str, endpoint: str, token: str,
                  count: int, output: list[bytes]
                  ) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """The worker process, and the thread draining its output into ``output``."""
    command = [sys.executable, "-m", "straw.benchmark", "worker", "--root", root,
               "--address", endpoint, "--index", "0", "--host-count", "1",
               "--start-at", str(time.time() + 1), "--writers", str(args.writers),
               "--readers", str(args.readers), "--fanout", "1",
               "--tokens", str(args.tokens), "--samples", str(args.samples),
               "--segment-mib", str(args.segment_mib),
               "--publications-per-task", str(args.publications_per_task),
               "--tasks-per-writer", str(count)]
    if args.profile:
        command += ["--profile", os.path.abspath(args.profile)]
    if args.record_bytes:
        command += ["--record-bytes", *map(str, args.record_bytes)]
    # the worker imports the straw this process runs (a source tree or the install)
    source = args.source_dir or str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, TOKEN_ENV: token,
           "PYTHONPATH": os.pathsep.join(filter(None, [source,
                                                       os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    pipe = process.stdout
    drain = threading.Thread(target=lambda: output.append(pipe.read() if pipe else b""),
                             daemon=True)
    drain.start()
    return process, drain


def _await_worker(args: argparse.Namespace, root: str, process: subprocess.Popen[bytes],
                  collector: _ConcurrentGC | None, deadline: float) -> None:
    """Until the worker exits, within the storage budget and ``deadline``; a failed
    concurrent collection is raised at once."""
    while True:
        try:
            process.wait(timeout=1)
            break
        except subprocess.TimeoutExpired:
            pass
        if collector is not None and collector.error is not None:
            collector.stop()  # raises the failed pass's error now, not at the end
        files = _files(root)
        if len(files) > args.max_files or sum(s for _, s in files) > args.max_gib * 2**30:
            raise RuntimeError("the benchmark exceeded its storage budget "
                               "(--max-files/--max-gib)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not finish within --timeout {args.timeout}s")


def _report(args: argparse.Namespace, workers: list[dict[str, Any]],
            totals: tuple[int, int, int], files: list[tuple[str, int]], metrics: Any,
            gc: dict[str, Any]) -> dict[str, Any]:
    """The run's report from the workers' and their checked ``totals``."""
    written, read, publications = totals
    duration = max(w["seconds"] for w in workers)
    return {
        "version": 1, "status": "passed", "hosts": ["localhost"], "workers": workers,
        "elapsed_seconds": duration, "written_bytes": written, "read_bytes": read,
        "write_mib_s": written / MIB / duration, "read_mib_s": read / MIB / duration,
        "file_count": len(files),
        "data_files": sum(p.endswith(PACK_SUFFIXES) for p, _ in files),
        "physical_bytes": sum(s for _, s in files), "publications": publications,
        "coordinator": metrics,
        "parameters": {k: v for k, v in vars(args).items() if k != "func"},
        "cache_policy": "fresh paths, reads by the same client as the writes (one "
                        "host); no cache eviction: not a cold-storage measurement",
        "profile_source": "measured trace" if args.profile else
                          "explicit record sizes" if args.record_bytes else
                          "routed-expert and top-k size model",
        **gc,
    }


def _check_workers(args: argparse.Namespace, workers: list[dict[str, Any]],
                   count: int) -> tuple[int, int, int]:
    """Every planned task published and every byte written read back; returns the bytes
    written and read and the publications."""
    written = sum(w["written_bytes"] for w in workers)
    read = sum(w["read_bytes"] for w in workers)
    publications = sum(w["publications"] for w in workers)
    if publications != args.writers * count:
        raise AssertionError(f"the worker published {publications} of "
                             f"{args.writers * count} planned tasks")
    if read != written:
        raise AssertionError(f"read back {read} bytes of the {written} written")
    return written, read, publications


def _stop_worker(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait(timeout=30)


def _clean_up(root: str, report_path: str, completed: bool) -> None:
    """What the run left, reported next to its report; the root removed if it passed."""
    left = _files(root)
    write_report(os.path.splitext(report_path)[0] + ".cleanup.json", {
        "root": root, "files": len(left), "bytes": sum(s for _, s in left),
        "workers_stopped": True, "removed": completed})
    if completed:
        shutil.rmtree(root)  # a temporary tree of this run only, as `straw bench` does


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One local run; returns (and writes to ``--report``) the report."""
    from . import Coordinator, SharedFilesystemStore, TaskSpec, rpc
    root, report_path = _check_args(args)
    sizes = load_sizes(args)
    _check_sizes(sizes)
    count = _plan(args, sizes)
    fs = PosixFS()
    if fs.exists(root):
        raise ValueError(f"--root {root} exists; give a fresh directory (it is removed "
                         "after a passed run)")
    fs.makedirs_durable(root)
    token = secrets.token_hex(32)
    store = SharedFilesystemStore(os.path.join(root, "queue"), "benchmark",
                                  writer_id="orchestrator",
                                  segment_target_bytes=args.segment_mib * MIB)
    coordinator = Coordinator(store, lease_seconds=max(300.0, float(args.timeout)))
    server = rpc.start(coordinator, (args.bind, 0), token=token)
    host = args.advertise_host or ("127.0.0.1" if args.bind in ("", "0.0.0.0") else args.bind)
    endpoint = f"http://{host}:{server.address[1]}"
    completed, process = False, None
    output: list[bytes] = []
    collector: _ConcurrentGC | None = None
    try:
        for w in range(args.writers):
            for start in range(0, count, TASK_CHUNK):
                coordinator.submit_tasks(f"submit-0-{w}-{start}", [
                    TaskSpec(f"0:{w}:{i}") for i in range(start, min(count, start + TASK_CHUNK))])
        process, drain = _start_worker(args, root, endpoint, token, count, output)
        deadline = time.monotonic() + args.timeout
        if args.online_gc:
            collector = _ConcurrentGC(coordinator, args.gc_interval)
        _await_worker(args, root, process, collector, deadline)
        drain.join(30)
        if collector is not None:  # the worker's readers have all finished
            collector.stop()
        if process.returncode:
            log = b"".join(output).decode(errors="replace")
            raise RuntimeError(f"the worker failed (exit {process.returncode}):\n{log[-4000:]}")
        workers = [json.loads(fs.read_file(os.path.join(root, "worker-0.json")))]
        totals = _check_workers(args, workers, count)
        files = _files(os.path.join(root, "queue"))  # the run's footprint, before gc
        gc: dict[str, Any] = {}
        if collector is not None:
            gc = _final_collection(coordinator, store, os.path.join(root, "queue"),
                                   totals[2])
            gc.update(concurrent_gc_passes=collector.passes,
                      concurrent_gc_pass_count=len(collector.passes),
                      concurrent_gc_seconds=collector.seconds)
        report = _report(args, workers, totals, files, rpc.to_wire(coordinator.metrics()), gc)
        write_report(os.path.join(root, "report.json"), report)
        write_report(report_path, report)
        print(json.dumps({k: v for k, v in report.items()
                          if k not in ("workers", "coordinator", "parameters",
                                       "concurrent_gc_passes")}, indent=2))
        completed = True
        return report
    finally:
        if collector is not None:
            collector.stop_quietly()
        fs.write_file_durable(os.path.join(root, "STOP"), b"")
        _stop_worker(process)
        server.close()
        coordinator.close()
        store.close()
        _clean_up(root, report_path, completed)


# --- the command ------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m straw.benchmark",
                                description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    extract = sub.add_parser("profile", help="a workload profile from STRAW_TRACE_DIR traces")
    extract.add_argument("--trace", required=True)
    extract.add_argument("--output", required=True)
    for name in ("run", "worker"):
        r = sub.add_parser(name)
        r.add_argument("--root", required=True)
        r.add_argument("--online-gc", action="store_true",
                       help="collect garbage while the run goes, then acknowledge every "
                            "result read and fail unless the last collection reclaims "
                            "every pack the workers wrote" if name == "run" else
                            "accepted for straw-queue (the orchestrator collects)")
        workload = r.add_mutually_exclusive_group()
        workload.add_argument("--profile", help="JSON workload from the profile command")
        workload.add_argument("--record-bytes", nargs="+", type=int,
                              help="byte sizes of the records of each publication")
        r.add_argument("--publications-per-task", type=int, default=1)
        r.add_argument("--writers", type=int, default=2)
        r.add_argument("--readers", type=int, default=2)
        r.add_argument("--fanout", type=int, default=1)
        r.add_argument("--tokens", type=int, default=8192)
        r.add_argument("--samples", type=int, default=4)
        r.add_argument("--segment-mib", type=int, default=256)
        if name == "run":
            where = r.add_mutually_exclusive_group(required=True)
            where.add_argument("--hosts", nargs="+", help="refused: workers run locally")
            where.add_argument("--local", action="store_true", help="one local worker process")
            r.add_argument("--python", default="python3", help="accepted for straw-queue")
            r.add_argument("--source-dir", help="a source tree the worker imports straw from")
            r.add_argument("--advertise-host", help="the address workers reach this host at")
            r.add_argument("--gib", type=float, default=32)
            r.add_argument("--report", required=True)
            r.add_argument("--max-files", type=int, default=256)
            r.add_argument("--max-gib", type=float, default=64)
            r.add_argument("--bind", default="0.0.0.0")
            r.add_argument("--timeout", type=int, default=1800)
            r.add_argument("--gc-interval", type=float, default=1.0,
                           help="seconds between --online-gc's concurrent collections")
        else:
            r.add_argument("--address", required=True)
            r.add_argument("--index", type=int, required=True)
            r.add_argument("--host-count", type=int, default=4)
            r.add_argument("--start-at", type=float, required=True)
            r.add_argument("--tasks-per-writer", type=int,
                           help="tasks per writer thread: readers stop after all commits")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    {"run": run, "worker": worker, "profile": profile}[args.role](args)


__all__ = ["completion_peak", "load_sizes", "main", "percentile", "profile", "run", "worker"]

if __name__ == "__main__":
    main()
