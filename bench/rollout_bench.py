"""Rollout control overhead (issue 14), part of ``just bench``; alone:
``python -m bench.rollout_bench [--processes 1 8] [--seconds 10] [--mode complete return]``.

Control overhead per group: generation processes loop ``take`` (64 groups a call) ->
build the groups (8 samples of 512 tokens: 32 prompt + 480 response, no model) ->
``return_groups``: ``complete`` mode returns them ready (published, completed: receipts),
``return`` mode returns them partial (published, yielded back with priority 1: the next
take hands them out again, read back from the pool).  Groups/s over all processes, for 1
and for N processes, and the ratio (the target: 8 processes >= 3x one).

The coordinator is one process: the controller serves it and its calls over
``straw.rollout.remote`` (JSON over HTTP, control messages only); each generation process
has its own store (writer) and reads and publishes the payloads itself.  Everything runs
on this machine, so the controller process and the generation processes share its cores:
``cpus`` in the output says how many there are.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from straw import SharedFilesystemStore
from straw.rollout import RolloutConfig, Status
from straw.rollout.controller import RolloutController
from straw.rollout.generation import GenerationClient
from straw.rollout.remote import RemoteController, start
from straw.rollout.samples import VersionSpan

from .report import scaling_bounds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES, TOKENS, PROMPT_TOKENS, GROUPS_PER_CALL = 8, 512, 32, 64


def _generated(group: Any, ready: bool, version: int) -> Any:
    """The group as an engine would return it: every sample 512 tokens (ready: completed
    with a reward; else aborted midway, a partial group)."""
    samples = []
    prompt = tuple(range(PROMPT_TOKENS))  # its token ids (the prompt itself is text)
    response = TOKENS - PROMPT_TOKENS
    for s in group:
        samples.append(dataclasses.replace(
            s, tokens=prompt + tuple(range(1000, 1000 + response)), response_length=response,
            versions=(VersionSpan(0, response, version),),
            status=Status.COMPLETED if ready else Status.ABORTED,
            reward=1.0 if ready else None))
    return dataclasses.replace(group, samples=tuple(samples))


def worker(root: str, url: str, token: str, name: str, mode: str, seconds: float) -> None:
    config = RolloutConfig(n_samples_per_prompt=SAMPLES)
    store = SharedFilesystemStore(root, "bench")
    client = GenerationClient(RemoteController(url, token=token), store, worker_id=name,
                              config=config)
    ready = mode == "complete"
    print("ready", flush=True)
    sys.stdin.readline()  # go
    groups = calls = empty = 0
    syncs0 = store.backend.metrics["syncs"]
    t0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        taken = client.take(GROUPS_PER_CALL)
        if not taken:  # another process's refill took it (or none is pending yet)
            empty += 1
            time.sleep(0.01)
            continue
        if ready:  # a partial group read back keeps its tokens: rebuild from the prompt
            out = [_generated(g, True, 1) for g in taken]
        else:
            out = [g if g.samples[0].response_length else _generated(g, False, 1)
                   for g in taken]
        client.return_groups(out)
        groups += len(taken)
        calls += 1
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    syncs = store.backend.metrics["syncs"] - syncs0
    client.close()
    store.close()
    print(json.dumps({"groups": groups, "calls": calls, "empty": empty, "seconds": elapsed,
                      "cpu": cpu, "syncs": syncs}), flush=True)


class _CpuSplit:
    """CPU seconds of the controller's calls, by part: each wrapped call adds the CPU time
    of the thread that ran it (``time.thread_time``), so nested and concurrent calls are
    counted where they run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                with self.lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + spent
        return timed


def _split_controller(controller: RolloutController) -> _CpuSplit:
    """Instrument ``controller`` (this bench's own instance) for the split of its CPU:
    ``take`` (acquire and refills: the prompts' encoding, publication and queue
    transaction), ``complete_tasks`` (the coordinator's batch completion: checks, one
    catalog adoption, one journal frame and its wait), ``complete_many`` (the call's own
    checks, its ``complete_tasks`` excluded) and ``yield``; the rest of the process's CPU is
    the serving (HTTP, JSON, the wire's decoding and encoding, heartbeats)."""
    split = _CpuSplit()
    coordinator = controller.coordinator
    coordinator.complete_tasks = split.wrap(  # type: ignore[method-assign]
        "complete_tasks", coordinator.complete_tasks)
    for name in ("take", "complete_many", "yield_groups"):
        setattr(controller, name, split.wrap(name, getattr(controller, name)))
    return split


def run(n: int, mode: str, seconds: float, base: str) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix=f"rollout-{mode}-{n}-", dir=base)
    try:
        store = SharedFilesystemStore(root, "bench", writer_id="controller")
        prompts = [f"prompt {i}: " + "x" * 120 for i in range(4096)]
        controller = RolloutController(store, prompts,
                                       config=RolloutConfig(n_samples_per_prompt=SAMPLES))
        split = _split_controller(controller)
        token = secrets.token_hex(16)
        server = start(controller, ("127.0.0.1", 0), token=token)
        try:
            procs = [subprocess.Popen(
                [sys.executable, "-m", "bench.rollout_bench", "--worker", root, server.url,
                 token, f"gen-{i}", mode, str(seconds)],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for i in range(n)]
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            cpu0 = time.process_time()  # the controller's: its serving threads and refills
            split.seconds.clear()  # (start-up excluded)
            syncs0 = store.backend.metrics["syncs"]  # its store's: queue, catalog, inputs
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                out, _ = p.communicate(timeout=seconds * 10 + 120)
                if p.returncode != 0:
                    raise RuntimeError(f"generation process failed ({p.returncode})")
                results.append(json.loads(out.strip().splitlines()[-1]))
            controller_cpu = time.process_time() - cpu0
            controller_syncs = store.backend.metrics["syncs"] - syncs0
        finally:
            server.close()
            controller.close()
            store.close()
        groups = sum(r["groups"] for r in results)
        wall = max(r["seconds"] for r in results)
        if "complete_many" in split.seconds:  # complete_tasks runs inside it: its own part
            split.seconds["complete_many"] -= split.seconds.get("complete_tasks", 0.0)
        return {"processes": n, "mode": mode, "groups": groups,
                "calls": sum(r["calls"] for r in results), "seconds": round(wall, 3),
                "groups_per_s": round(groups / wall, 1),
                # CPU per group: the controller's (one process: it bounds the total) and
                # the generation processes' (they scale with processes and cores)
                "controller_cpu_ms_per_group": round(1000 * controller_cpu / groups, 2),
                # ... and where it goes (the serving is what the calls below leave)
                "controller_split_ms_per_group": {
                    **{k: round(1000 * v / groups, 3) for k, v in sorted(split.seconds.items())},
                    "serving": round(1000 * (controller_cpu - sum(split.seconds.values()))
                                     / groups, 3)},
                "client_cpu_ms_per_group": round(
                    1000 * sum(r["cpu"] for r in results) / groups, 2),
                # durable steps per group (load-robust, unlike the rates): the controller's
                # (journal, catalog, refill inputs) and the clients' (their publications)
                "controller_syncs_per_group": round(controller_syncs / groups, 3),
                "client_syncs_per_group": round(sum(r["syncs"] for r in results) / groups, 3),
                "empty_takes": sum(r["empty"] for r in results)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--mode", nargs="+", choices=["complete", "return"],
                    default=["complete", "return"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--dir", default=os.environ.get("STRAW_BENCH_DIR"))
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        root, url, token, name, mode, seconds = args.worker
        worker(root, url, token, name, mode, float(seconds))
        return 0
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    print(f"rollout control overhead: take + return_groups, {GROUPS_PER_CALL} groups a call, "
          f"{SAMPLES} samples of {TOKENS} tokens; {os.cpu_count()} cpus")
    figures = []
    for mode in args.mode:
        rates = {}
        for n in args.processes:
            fig = run(n, mode, args.seconds, args.dir)
            rates[n] = fig["groups_per_s"]
            figures.append(fig)
            print(f"  {mode:8s} {n:2d} process(es): {fig['groups_per_s']:8.1f} groups/s "
                  f"({fig['groups']} groups, {fig['calls']} calls, {fig['seconds']} s; CPU "
                  f"per group: controller {fig['controller_cpu_ms_per_group']} ms, clients "
                  f"{fig['client_cpu_ms_per_group']} ms; syncs per group: controller "
                  f"{fig['controller_syncs_per_group']}, clients "
                  f"{fig['client_syncs_per_group']}; {fig['empty_takes']} empty takes)")
            print(f"  {'':8s} controller CPU ms per group: " + ", ".join(
                f"{k} {v}" for k, v in fig["controller_split_ms_per_group"].items()))
        lo, hi = min(args.processes), max(args.processes)
        if lo != hi and rates[lo]:
            ratio = rates[hi] / rates[lo]
            print(f"  {mode:8s} {hi} vs {lo}: {ratio:.2f}x (target >= 3x: "
                  f"{'pass' if ratio >= 3 else 'FAIL'})")
            # what free cores would give: N clients in parallel until the controller's
            # one process is saturated (a projection from the measured CPU, not a measure)
            one = next(f for f in figures if f.get("processes") == lo and f["mode"] == mode)
            bound = 1000 / one["controller_cpu_ms_per_group"]
            projected = min(hi / lo * rates[lo], bound)
            print(f"  {mode:8s} projected on {hi + 1}+ free cores: {projected:.0f} groups/s "
                  f"({projected / rates[lo]:.2f}x; the controller saturates at "
                  f"{bound:.0f} groups/s)")
            many = next(f for f in figures if f.get("processes") == hi and f["mode"] == mode)
            ceiling = scaling_bounds(rates[lo], many["controller_cpu_ms_per_group"],
                                     many["client_cpu_ms_per_group"], os.cpu_count() or 1)
            print(f"  {mode:8s} ceiling of {hi} vs {lo} on this machine: "
                  f"{ceiling['cores_bound']:.2f}x with its {os.cpu_count()} cores busy at the "
                  f"CPU per group of {hi}, {ceiling['coordinator_bound']:.2f}x with the "
                  f"controller busy ({lo}-process wall time per group over those CPU figures)")
            figures.append({"mode": mode, "ratio": round(ratio, 2), "target": 3.0,
                            "ceiling_on_these_cores": round(ceiling["cores_bound"], 2),
                            "pass": ratio >= 3, "projected_ratio_on_free_cores":
                            round(projected / rates[lo], 2)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "figures": figures}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
