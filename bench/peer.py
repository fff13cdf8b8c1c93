"""``just bench-peer``: straw against straw-queue 0.1.6 on the same store workloads.

Run from the repository root: ``python -m bench.peer [--rounds N] [--json PATH] [--dir DIR]
[--quick] [--no-syscalls] [--queue-history N]``.

straw-queue is installed in its own virtualenv ``.venv-peer`` (created here if missing,
torch pinned first so pip does not pull a CUDA build).  Its import name is also
``straw``, so each implementation runs in a long-lived worker process
(``bench/store_worker.py``) under its own interpreter; rounds alternate which goes first,
with the machine's limits measured in this process in between.  Each side uses its
store's defaults.  Figures: publish of 16 MiB records (MiB/s), median latency of 1 KiB
publications (ms), checked read of 16 MiB records with a warm page cache (MiB/s); the
table gives medians [min-max] over rounds and ours/peer as the median of per-round
ratios.  Tensor figures (``bench.tensor_bench``): publish, ``load()`` and one-row slices of
float32 [8192, 1024] and int32 [8192, 48, 8] torch tensors, with the issue's targets.
Queue figures (issue 6): one client doing acquire -> publish a 256 B result -> complete
(tasks/s, every round; target: at least 1.5x straw-queue's rate), and, after the rounds,
reopening a queue with ``--queue-history`` completed tasks (default 10,000; seconds) and
its control bytes per completed task (journal + snapshot files), one pass per
implementation by default since building the history is slow.  With strace present, a
separate untimed pass counts the sync system calls per 1 KiB publication of each
implementation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from . import limits, tensor_bench
from .bench import DEFAULT_PARAMS, QUICK_PARAMS, REPO, human_bytes
from .report import (
    cpu_snapshot,
    filesystem_of,
    fmt,
    fmt_summary,
    machine,
    machine_after,
    summary,
    table,
    utc_iso,
    write_json,
)

PEER_VENV = os.path.join(REPO, ".venv-peer")
PEER_PYTHON = os.path.join(PEER_VENV, "bin", "python")
PEER_VERSION = "0.1.6"
TORCH_PIN = "torch==2.13.0"
WORKER = os.path.join(REPO, "bench", "store_worker.py")
SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range", "msync", "syncfs")
# queue workloads: tasks per one-client round; completed tasks of the reopened queue
# (0: skip); passes of the reopen figure (each builds the history anew)
QUEUE_PARAMS = {"queue_tasks": 500, "queue_history": 10_000, "queue_reopen_passes": 1}
QUEUE_QUICK = {"queue_tasks": 20, "queue_history": 200, "queue_reopen_passes": 1}
QUEUE_TARGET = 1.5  # one client: ours/peer tasks/s at least this (issue 6)


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    return env


def _peer_version() -> str | None:
    if not os.path.exists(PEER_PYTHON):
        return None
    proc = subprocess.run(
        [PEER_PYTHON, "-c", "import importlib.metadata as m; print(m.version('straw-queue'))"],
        cwd="/", env=_clean_env(), capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_peer_venv() -> str:
    """Create ``.venv-peer`` with straw-queue 0.1.6 if missing; returns its version."""
    version = _peer_version()
    if version == PEER_VERSION:
        return version
    steps = []
    if not os.path.exists(PEER_PYTHON):
        steps.append(["python3", "-m", "venv", PEER_VENV])
    pip = [os.path.join(PEER_VENV, "bin", "pip"), "install"]
    steps += [pip + [TORCH_PIN], pip + [f"straw-queue=={PEER_VERSION}"]]
    for cmd in steps:
        print("setting up the peer:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=_clean_env())
    version = _peer_version()
    if version != PEER_VERSION:
        raise SystemExit(f"{PEER_VENV} has straw-queue {version}, expected {PEER_VERSION}")
    return version


class Worker:
    """A long-lived ``store_worker.py`` process speaking JSON lines."""

    def __init__(self, impl: str, python: str) -> None:
        self.proc = subprocess.Popen(
            [python, WORKER, "--impl", impl], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1, cwd="/", env=_clean_env())
        self.hello = self._reply()["hello"]

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args!r} exited ({self.proc.wait()})")
        return json.loads(line)

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        reply = self._reply()
        if not reply["ok"]:
            raise RuntimeError(f"{self.hello['impl']} worker failed:\n{reply['error']}")
        return reply["result"]

    def round(self, directory: str, params: dict[str, int]) -> dict[str, Any]:
        return self.call({"cmd": "round", "dir": directory, "params": params})

    def queue_reopen(self, directory: str, tasks: int) -> dict[str, Any]:
        return self.call({"cmd": "queue_reopen", "dir": directory, "tasks": tasks})

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def limits_round(work: str, p: dict[str, int]) -> dict[str, Any]:
    return {
        "raw_write": limits.seq_write(work, total=p["raw_total"], piece=p["raw_piece"]),
        "raw_append_fsync": limits.append_fsync(work, size=p["raw_small_size"],
                                                count=p["raw_small_count"],
                                                warmup=p["raw_small_warmup"]),
        "memcpy": limits.memcpy(size=p["memcpy_size"], reps=p["memcpy_reps"]),
    }


def count_syncs(impl: str, python: str, work: str, n: int) -> dict[str, Any] | None:
    """Sync system calls per small publication, counted with strace in a separate,
    untimed pass; None without strace."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    out = os.path.join(work, f"strace-{impl}.txt")
    pool = os.path.join(work, f"count-{impl}")
    calls = ",".join(SYNC_CALLS) + ",stat,lstat,newfstatat,statx,access,faccessat,faccessat2"
    proc = subprocess.run(
        [strace, "-f", "-qq", "-e", f"trace={calls}", "-o", out, python, WORKER, "--impl",
         impl, "--count-pass", pool, str(n)], cwd="/", env=_clean_env(),
        capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    counts: dict[str, int] = {}
    inside = False
    with open(out) as f:
        for line in f:
            if "straw-bench-mark-start" in line:
                inside = True
                continue
            if "straw-bench-mark-end" in line:
                break
            m = re.match(r"^(?:\[pid\s+)?\d*\]?\s*([a-z_0-9]+)\(", line)
            if inside and m and m.group(1) in SYNC_CALLS:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    shutil.rmtree(pool, ignore_errors=True)
    return {"publications": n, "calls": counts,
            "syncs_per_publication": sum(counts.values()) / n}


FIGURES = [
    # key, workload, field, unit, higher is better, limit
    ("publish_large", "publish_large", "mib_s", "MiB/s", True, ("raw_write", "mib_s")),
    ("publish_small_latency", "publish_small", "ms", "ms", False, ("raw_append_fsync", "ms")),
    ("read_large", "read_large", "mib_s", "MiB/s", True, ("memcpy", "mib_s")),
]


def labels(p: dict[str, int]) -> dict[str, str]:
    return {"publish_large": f"publish {human_bytes(p['large_size'])} records",
            "publish_small_latency": f"publish {human_bytes(p['small_size'])}: median latency",
            "read_large": f"checked read {human_bytes(p['read_size'])} records"}


def compute(rounds: list[dict[str, Any]], p: dict[str, int]) -> dict[str, Any]:
    out = {}
    names = labels(p)
    for key, wl, field, unit, higher, (lname, lkey) in FIGURES:
        ours = [rd["ours"][wl][field] for rd in rounds]
        peer = [rd["peer"][wl][field] for rd in rounds]
        lim = [rd["limits"][lname][lkey] for rd in rounds]
        out[key] = {
            "label": names[key], "unit": unit, "higher_is_better": higher,
            "ours": summary(ours), "peer": summary(peer), "limit": summary(lim),
            "limit_name": lname,
            "ours_over_peer": summary([a / b for a, b in zip(ours, peer, strict=True)]),
            "ours_over_limit": summary([a / b for a, b in zip(ours, lim, strict=True)]),
            "peer_over_limit": summary([a / b for a, b in zip(peer, lim, strict=True)]),
        }
    return out


def queue_figures(rounds: list[dict[str, Any]],
                  reopens: list[dict[str, Any]]) -> dict[str, Any]:
    """ours vs peer on the queue: one-client tasks/s every round (with the 1.5x target);
    reopen seconds and control bytes per task from the reopen passes, if any."""
    def fig(label: str, unit: str, higher: bool, ours: list[float],
            peer: list[float]) -> dict[str, Any]:
        return {"label": label, "unit": unit, "higher_is_better": higher,
                "ours": summary(ours), "peer": summary(peer),
                "ours_over_peer": summary([a / b for a, b in zip(ours, peer, strict=True)]),
                "checks": []}

    out: dict[str, Any] = {}
    one = fig(f"queue, one client: acquire -> publish {human_bytes(256)} -> complete",
              "tasks/s", True, [rd["ours"]["queue_one_client"]["tasks_per_s"] for rd in rounds],
              [rd["peer"]["queue_one_client"]["tasks_per_s"] for rd in rounds])
    ratio = one["ours_over_peer"]["median"]
    one["checks"].append({"what": "ours/peer", "op": ">=", "bound": QUEUE_TARGET,
                          "value": ratio, "pass": ratio >= QUEUE_TARGET})
    out["queue_one_client"] = one
    if reopens:
        n = reopens[0]["ours"]["tasks"]
        for key, field, label, unit in (
                ("queue_reopen", "reopen_s", f"reopen a queue with {n:,} completed tasks",
                 "s"),
                ("queue_control_bytes", "control_bytes_per_task",
                 f"control bytes per completed task ({n:,}; journal + snapshot)", "B")):
            out[key] = fig(label, unit, False, [rp["ours"][field] for rp in reopens],
                           [rp["peer"][field] for rp in reopens])
    return out


def print_queue_table(figures: dict[str, Any]) -> None:
    rows = []
    for fig in figures.values():
        checks = "; ".join(f"{c['what']} {fmt(c['value'])} {c['op']} {c['bound']:g}: "
                           f"{'PASS' if c['pass'] else 'MISS'}" for c in fig["checks"])
        rows.append([f"{fig['label']} ({fig['unit']})", fmt_summary(fig["ours"]),
                     fmt_summary(fig["peer"]), fmt_summary(fig["ours_over_peer"]),
                     "higher" if fig["higher_is_better"] else "lower", checks or "-"])
    print(table(["queue figure", "straw [min-max]", "straw-queue [min-max]",
                 "ours/peer [min-max]", "better", "targets"], rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peer",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 9, quick 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--dir", help="where to make the temp pools (default $STRAW_BENCH_DIR or "
                                  "bench-out/ of the repository)")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--no-syscalls", action="store_true",
                    help="skip the strace pass that counts sync calls per publication")
    ap.add_argument("--queue-history", type=int, metavar="N",
                    help="completed tasks of the queue whose reopening is timed (default "
                         f"{QUEUE_PARAMS['queue_history']:,}, quick "
                         f"{QUEUE_QUICK['queue_history']}; 0 skips it)")
    args = ap.parse_args(argv)

    p = dict(QUICK_PARAMS if args.quick else DEFAULT_PARAMS)
    p.update(QUEUE_QUICK if args.quick else QUEUE_PARAMS)
    p["rounds"] = 9 if not args.quick else 1
    if args.rounds is not None:
        if args.rounds < 1:
            ap.error("--rounds must be at least 1")
        p["rounds"] = args.rounds
    if args.queue_history is not None:
        if args.queue_history < 0:
            ap.error("--queue-history must be at least 0")
        p["queue_history"] = args.queue_history
    peer_version = ensure_peer_venv()
    base = args.dir or os.environ.get("STRAW_BENCH_DIR") or os.path.join(REPO, "bench-out")
    os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-peer-", dir=base)
    fs_info = filesystem_of(work)
    before = machine()
    cpu0 = cpu_snapshot()
    started = time.time()
    workers = {"ours": Worker("ours", sys.executable), "peer": Worker("peer", PEER_PYTHON)}
    for w in workers.values():
        print(f"{w.hello['impl']} {w.hello['version']} ({w.hello['module']})")
    print(f"pools in {work}: {fs_info['type']} on {fs_info['device']} (mounted at "
          f"{fs_info['mount']}); {before['cpus']} cpus, load {before['loadavg']}; peer "
          f"straw-queue {peer_version}")
    print(f"{p['rounds']} rounds (+{p['warmup_rounds']} warm-up), alternating which "
          "implementation goes first, limits measured in between; each store with its "
          "defaults; medians [min-max]; ratios are medians of per-round ratios")
    rounds: list[dict[str, Any]] = []
    reopens: list[dict[str, Any]] = []
    syscalls: dict[str, Any] = {}
    try:
        for r in range(-p["warmup_rounds"], p["rounds"]):
            order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
            rd: dict[str, Any] = {"order": order}
            if r % 2 == 0:
                rd["limits"] = limits_round(work, p)
            for impl in order:
                d = os.path.join(work, f"{impl}-r{r}")
                rd[impl] = workers[impl].round(d, p)
                shutil.rmtree(d, ignore_errors=True)
            if r % 2 != 0:
                rd["limits"] = limits_round(work, p)
            if r < 0:
                print("  warm-up round done (not counted)", flush=True)
                continue
            rounds.append(rd)
            print(f"  round {r + 1}/{p['rounds']} ({' then '.join(order)}): publish "
                  f"{fmt(rd['ours']['publish_large']['mib_s'])} vs "
                  f"{fmt(rd['peer']['publish_large']['mib_s'])} MiB/s; 1 KiB "
                  f"{fmt(rd['ours']['publish_small']['ms'])} vs "
                  f"{fmt(rd['peer']['publish_small']['ms'])} ms; read "
                  f"{fmt(rd['ours']['read_large']['mib_s'])} vs "
                  f"{fmt(rd['peer']['read_large']['mib_s'])} MiB/s; queue "
                  f"{fmt(rd['ours']['queue_one_client']['tasks_per_s'])} vs "
                  f"{fmt(rd['peer']['queue_one_client']['tasks_per_s'])} tasks/s", flush=True)
        for k in range(p["queue_reopen_passes"] if p["queue_history"] else 0):
            order = ["ours", "peer"] if k % 2 == 0 else ["peer", "ours"]
            rp: dict[str, Any] = {"order": order}
            for impl in order:
                d = os.path.join(work, f"{impl}-reopen{k}")
                rp[impl] = workers[impl].queue_reopen(d, p["queue_history"])
                shutil.rmtree(d, ignore_errors=True)
            reopens.append(rp)
            print(f"  reopen pass {k + 1}/{p['queue_reopen_passes']} "
                  f"({' then '.join(order)}), {p['queue_history']:,} completed tasks: "
                  f"{fmt(rp['ours']['reopen_s'])} vs {fmt(rp['peer']['reopen_s'])} s, "
                  f"{fmt(rp['ours']['control_bytes_per_task'])} vs "
                  f"{fmt(rp['peer']['control_bytes_per_task'])} control B/task (building "
                  f"took {rp['ours']['total_s']:.0f} vs {rp['peer']['total_s']:.0f} s)",
                  flush=True)
        for w in workers.values():
            w.close()
        if not args.no_syscalls:
            n = 20 if args.quick else 100
            for impl, python in (("ours", sys.executable), ("peer", PEER_PYTHON)):
                syscalls[impl] = count_syncs(impl, python, work, n)
    finally:
        for w in workers.values():
            w.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    duration = time.time() - started
    figures = compute(rounds, p)
    tensor_figures = tensor_bench.peer_figures(rounds, p)
    queue = queue_figures(rounds, reopens)
    rows = []
    for fig in figures.values():
        rows.append([
            f"{fig['label']} ({fig['unit']})",
            fmt_summary(fig["ours"]), fmt_summary(fig["peer"]),
            fmt_summary(fig["ours_over_peer"]),
            "higher" if fig["higher_is_better"] else "lower",
            f"{fmt_summary(fig['limit'])} ({fig['limit_name']})",
            fmt(fig["ours_over_limit"]["median"]), fmt(fig["peer_over_limit"]["median"]),
        ])
    if syscalls.get("ours") and syscalls.get("peer") and "error" not in syscalls["ours"] \
            and "error" not in syscalls["peer"]:
        a = syscalls["ours"]["syncs_per_publication"]
        b = syscalls["peer"]["syncs_per_publication"]
        rows.append(["publish 1 KiB: sync syscalls/publication (strace)", fmt(a), fmt(b),
                     fmt(a / b) if b else "-", "lower", "-", "-", "-"])
    print()
    print(table(["figure", "straw [min-max]", "straw-queue [min-max]", "ours/peer [min-max]",
                 "better", "limit [min-max]", "straw/limit", "peer/limit"], rows))
    print()
    tensor_bench.print_peer_table(tensor_figures)
    print()
    print_queue_table(queue)
    for impl, res in syscalls.items():
        if res is None:
            print(f"{impl}: strace not found, sync calls not counted")
        elif "error" in res:
            print(f"{impl}: syscall counting failed: {res['error']}")
        else:
            print(f"sync syscalls per {human_bytes(p['small_size'])} publication, {impl}: "
                  + ", ".join(f"{k} {fmt(v / res['publications'])}"
                              for k, v in sorted(res["calls"].items())))
    after = machine_after(before, cpu0, duration)
    if args.json:
        doc = {
            "tool": "bench.peer",
            "started": utc_iso(started),
            "duration_s": duration, "quick": args.quick, "params": p, "dir": work,
            "filesystem": fs_info, "machine_before": before, "machine_after": after,
            "workers": {k: w.hello for k, w in workers.items()},
            "figures": figures, "tensor_figures": tensor_figures, "queue_figures": queue,
            "syscalls": syscalls, "rounds": rounds, "queue_reopen": reopens,
        }
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
