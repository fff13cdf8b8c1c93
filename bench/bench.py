"""``just bench``: straw's store against this machine's own limits, in one run.

Run from the repository root: ``python -m bench.bench [--rounds N] [--json PATH]
[--dir DIR] [--quick] [--keep]``.

Limits, measured in a temp dir on the filesystem of the pool (``--dir``, else
``$STRAW_BENCH_DIR``, else ``bench-out/`` of the repository), see ``bench.limits``:
(a) sequential write+fsync bandwidth, (b) median small append+fsync latency, (c) memcpy.
Store workloads (``bench.workloads``): publish of 16 MiB records (vs a, target >= 0.6),
publish of 1 KiB records (syncs per publication in the steady state counted with
``bench.counting.CountingFS``, target <= 2; median latency vs b, target <= 4x), checked read
of 16 MiB records with a warm page cache (vs c, target >= 0.5).  Tensor figures in a second
table (``bench.tensor_bench``): publish (vs a), ``load()``, ``load(out=)`` and ``rows()`` (each
vs a 16 MiB memcpy timed alternately with its calls, target >= 0.7) and one-row slices
(<= 0.5 ms) of float32 [8192, 1024] and int32 [8192, 48, 8] tensors.

The disk of these machines is noisy (the same raw test can vary 5x back to back; much of
it is the VM's memory: the first touch of a page the guest handed back to the host costs
up to ~10 us, and page-cache writes need such pages), and other work shares the two
cores, so each round runs every limit next to its store workload, alternating which goes
first; the table gives medians over rounds with their spread [min-max], a ratio is the
median of the per-round paired ratios, and the last line says how busy other processes
kept the cores.  The memcpy limit is the strict one: a cache-warm copy into a pre-faulted
buffer.  This is a benchmark: it reports MISS, it never fails a build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from straw.fs import PosixFS

from . import limits, tensor_bench, tensor_workloads, workloads
from .counting import CountingFS
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

MiB = 1024 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_PARAMS: dict[str, int] = {
    "rounds": 21, "warmup_rounds": 1,
    "raw_total": 64 * MiB, "raw_piece": MiB,
    "raw_small_size": 1024, "raw_small_count": 200, "raw_small_warmup": 10,
    "memcpy_size": 16 * MiB, "memcpy_reps": 15,
    "large_size": 16 * MiB, "large_count": 4,
    "small_size": 1024, "small_count": 200, "small_warmup": 20,
    "read_size": 16 * MiB, "read_count": 4, "read_passes": 2,
    **tensor_bench.PARAMS,
}
QUICK_PARAMS: dict[str, int] = {
    **DEFAULT_PARAMS,
    "rounds": 1, "warmup_rounds": 0,
    "raw_total": 4 * MiB,
    "raw_small_count": 20, "raw_small_warmup": 2,
    "memcpy_size": MiB, "memcpy_reps": 3,
    "large_size": MiB, "large_count": 2,
    "small_count": 20, "small_warmup": 3,
    "read_size": MiB, "read_count": 2, "read_passes": 1,
    **tensor_bench.QUICK,
}


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def figure_specs(p: dict[str, int]) -> list[dict[str, Any]]:
    """What the table shows: the store figure, its limit, and the target on the ratio
    (or on the value itself when there is no limit)."""
    return [
        {"key": "publish_large", "label": f"publish {human_bytes(p['large_size'])} records",
         "unit": "MiB/s", "value": ("publish_large", "mib_s"),
         "limit": ("raw_write", "mib_s"), "limit_label": "raw write+fsync",
         "op": ">=", "bound": 0.6},
        {"key": "publish_small_syncs",
         "label": f"publish {human_bytes(p['small_size'])}: syncs/publication",
         "unit": "calls", "value": ("publish_small", "syncs_per_publication"),
         "limit": None, "limit_label": "", "op": "<=", "bound": 2},
        {"key": "publish_small_latency",
         "label": f"publish {human_bytes(p['small_size'])}: median latency",
         "unit": "ms", "value": ("publish_small", "ms"),
         "limit": ("raw_append_fsync", "ms"), "limit_label": "append+fsync",
         "op": "<=", "bound": 4},
        {"key": "read_large", "label": f"checked read {human_bytes(p['read_size'])} records",
         "unit": "MiB/s", "value": ("read_large", "mib_s"),
         "limit": ("memcpy", "mib_s"), "limit_label": "memcpy", "op": ">=", "bound": 0.5},
    ]


def run_round(r: int, work: str, p: dict[str, int], impl: workloads.Impl
              ) -> dict[str, dict[str, Any]]:
    """One round: each limit next to its store workload; the order flips every round."""

    def root(name: str) -> str:
        return os.path.join(work, f"pool-{name}-r{r}")

    pairs: list[tuple[tuple[str, Callable[[], dict[str, Any]]],
                      tuple[str, Callable[[], dict[str, Any]]]]] = [
        (("raw_write", lambda: limits.seq_write(work, total=p["raw_total"],
                                                piece=p["raw_piece"])),
         ("publish_large", lambda: workloads.publish_large(
             impl, root("large"), size=p["large_size"], count=p["large_count"],
             counter=CountingFS(PosixFS())))),
        (("raw_append_fsync", lambda: limits.append_fsync(
            work, size=p["raw_small_size"], count=p["raw_small_count"],
            warmup=p["raw_small_warmup"])),
         ("publish_small", lambda: workloads.publish_small(
             impl, root("small"), size=p["small_size"], count=p["small_count"],
             warmup=p["small_warmup"], counter=CountingFS(PosixFS())))),
        (("memcpy", lambda: limits.memcpy(size=p["memcpy_size"], reps=p["memcpy_reps"])),
         ("read_large", lambda: workloads.read_large(
             impl, root("read"), size=p["read_size"], count=p["read_count"],
             passes=p["read_passes"]))),
    ]
    out: dict[str, dict[str, Any]] = {}
    tensors = os.path.join(work, f"tensors-r{r}")
    if r % 2:  # the tensor workloads (tensor_bench) go first in odd rounds, last in even
        out.update(tensor_workloads.run_all(impl, tensors, p))
    for limit, store in pairs:
        for name, fn in ((limit, store) if r % 2 == 0 else (store, limit)):
            out[name] = fn()
    if r % 2 == 0:
        out.update(tensor_workloads.run_all(impl, tensors, p))
    return out


def compute_figures(rounds: list[dict[str, dict[str, Any]]], p: dict[str, int],
                    specs: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    figures = {}
    for spec in figure_specs(p) if specs is None else specs:
        vname, vkey = spec["value"]
        values = [rd[vname][vkey] for rd in rounds]
        fig: dict[str, Any] = {"label": spec["label"], "unit": spec["unit"],
                               "value": summary(values), "limit": None, "ratio": None,
                               "ratio_of_medians": None,
                               "target": {"on": "ratio" if spec["limit"] else "value",
                                          "op": spec["op"], "bound": spec["bound"]}}
        checked = fig["value"]["median"]
        if spec["limit"] is not None:
            lname, lkey = spec["limit"]
            lims = [rd[lname][lkey] for rd in rounds]
            fig["limit"] = {**summary(lims), "name": spec["limit_label"]}
            fig["ratio"] = summary([v / lim for v, lim in zip(values, lims, strict=True)])
            fig["ratio_of_medians"] = fig["value"]["median"] / fig["limit"]["median"]
            checked = fig["ratio"]["median"]
        ok = checked >= spec["bound"] if spec["op"] == ">=" else checked <= spec["bound"]
        fig["pass"] = bool(ok)
        figures[spec["key"]] = fig
    return figures


def print_table(figures: dict[str, dict[str, Any]]) -> None:
    rows = []
    for fig in figures.values():
        t = fig["target"]
        unit = fig["unit"]
        target = f"{t['op']} {t['bound']:g}" + ("x" if t["on"] == "ratio" else f" {unit}")
        lim = fig["limit"]
        rows.append([
            f"{fig['label']} ({unit})",
            fmt_summary(fig["value"]),
            f"{fmt_summary(lim)} ({lim['name']})" if lim else "-",
            fmt_summary(fig["ratio"]) if fig["ratio"] else "-",
            target,
            "PASS" if fig["pass"] else "MISS",
        ])
    print(table(["figure", "value [min-max]", "limit [min-max]", "ratio [min-max]",
                 "target", "result"], rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 21, quick 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--dir", help="where to make the temp pool (default $STRAW_BENCH_DIR or "
                                  "bench-out/ of the repository)")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (seconds)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args(argv)

    p = dict(QUICK_PARAMS if args.quick else DEFAULT_PARAMS)
    if args.rounds is not None:
        if args.rounds < 1:
            ap.error("--rounds must be at least 1")
        p["rounds"] = args.rounds
    base = args.dir or os.environ.get("STRAW_BENCH_DIR") or os.path.join(REPO, "bench-out")
    os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-", dir=base)
    impl = workloads.ours()
    fs_info = filesystem_of(work)
    before = machine()
    cpu0 = cpu_snapshot()
    started = time.time()
    print(f"straw {impl.version} ({impl.module_file})")
    print(f"pool and raw files in {work}: {fs_info['type']} on {fs_info['device']} "
          f"(mounted at {fs_info['mount']}); {before['cpus']} cpus, load {before['loadavg']}")
    print(f"{p['rounds']} rounds, each limit next to its store workload, order flipped "
          "every round; medians [min-max] over rounds; ratio = median of per-round ratios")
    rounds: list[dict[str, dict[str, Any]]] = []
    warmup = []
    try:
        for r in range(p["warmup_rounds"]):
            warmup.append(run_round(r, work, p, impl))
        if warmup:
            print(f"  {len(warmup)} warm-up round(s) done (not counted)", flush=True)
        for r in range(p["rounds"]):
            rounds.append(run_round(r, work, p, impl))
            rd = rounds[-1]
            print(f"  round {r + 1}/{p['rounds']}: raw write {fmt(rd['raw_write']['mib_s'])} "
                  f"MiB/s, publish {fmt(rd['publish_large']['mib_s'])} MiB/s; append+fsync "
                  f"{fmt(rd['raw_append_fsync']['ms'])} ms, publish "
                  f"{fmt(rd['publish_small']['ms'])} ms; memcpy {fmt(rd['memcpy']['mib_s'])} "
                  f"MiB/s, read {fmt(rd['read_large']['mib_s'])} MiB/s; tensors "
                  f"{tensor_bench.round_line(rd)}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    duration = time.time() - started
    figures = compute_figures(rounds, p)
    tensor_figures = compute_figures(rounds, p, tensor_bench.figure_specs(p))
    print()
    print_table(figures)
    print()
    print_table(tensor_figures)
    print(tensor_bench.NOTE)
    print(tensor_bench.cpu_line(rounds))
    print(tensor_bench.split_line(rounds))
    calls = rounds[-1]["publish_small"]["calls"] or {}
    per = ", ".join(f"{k} {fmt(v / p['small_count'])}" for k, v in calls.items())
    print(f"\nsteady-state filesystem calls per {human_bytes(p['small_size'])} publication "
          f"(last round): {per}")
    after = machine_after(before, cpu0, duration)
    if args.json:
        doc = {
            "tool": "bench.bench",
            "started": utc_iso(started),
            "duration_s": duration,
            "quick": args.quick,
            "params": p,
            "dir": work,
            "filesystem": fs_info,
            "machine_before": before,
            "machine_after": after,
            "python": sys.version.split()[0],
            "impl": {"name": impl.name, "version": impl.version, "module": impl.module_file},
            "figures": figures,
            "tensor_figures": tensor_figures,
            "limits": {name: summary([rd[name][key] for rd in rounds]) for name, key in
                       (("raw_write", "mib_s"), ("raw_append_fsync", "ms"),
                        ("memcpy", "mib_s"))},
            "rounds": rounds,
            "warmup": warmup,
        }
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
