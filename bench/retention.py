"""Retention figures (issue 5), part of ``just bench``; alone: ``python -m bench.retention``.

* retain / release median latency with 1,000 owners over 1,000 packs (each owner retains
  one publication of its own pack), and the time of one collection over that pool;
* 1 KiB publish throughput in a pool where retention is in use (1,000 owners, a catalog
  with their history, collections running between rounds) versus a fresh pool where nothing
  is retained, interleaved round by round; target: within 10 % of each other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from straw import Record, SharedFilesystemStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def build_pool(root: str, n: int) -> tuple[SharedFilesystemStore, list[Any]]:
    store = SharedFilesystemStore(root, "bench", writer_id="w", reserve_bytes=0)
    refs = []
    for i in range(n):
        refs.append(store.publish([Record("r", os.urandom(1024))], submission_id=f"p{i}"))
        store.seal()  # one pack per publication
    return store, refs


def publish_rate(store: SharedFilesystemStore, count: int, tag: str) -> float:
    payload = os.urandom(1024)
    t0 = time.perf_counter()
    for i in range(count):
        store.publish([Record("r", payload)], submission_id=f"{tag}-{i}")
    return count / (time.perf_counter() - t0)


def run(directory: str, *, owners: int, rounds: int, publishes: int) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="bench-retention-", dir=directory)
    try:
        store, refs = build_pool(os.path.join(work, "retained"), owners)
        retain_s = []
        for i, ref in enumerate(refs):
            t0 = time.perf_counter()
            store.retain(f"owner-{i}", [ref])
            retain_s.append(time.perf_counter() - t0)
        store.release_publications(refs)
        t0 = time.perf_counter()
        first = store.collect_garbage()
        collect_all_s = time.perf_counter() - t0
        release_s = []
        for i in range(0, owners, 2):
            t0 = time.perf_counter()
            store.release(f"owner-{i}")
            release_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        second = store.collect_garbage()
        collect_half_s = time.perf_counter() - t0

        fresh = SharedFilesystemStore(os.path.join(work, "fresh"), "bench", writer_id="w",
                                      reserve_bytes=0)
        with_rates, without_rates = [], []
        for r in range(rounds):
            order = [(store, with_rates), (fresh, without_rates)]
            for s, out in (order if r % 2 == 0 else order[::-1]):
                out.append(publish_rate(s, publishes, f"round{r}"))
            store.retain(f"round-{r}", [refs[1]])  # retention keeps changing meanwhile
            store.collect_garbage()
        store.close()
        fresh.close()
        ratio = statistics.median(w / f for w, f in zip(with_rates, without_rates, strict=True))
        return {
            "owners": owners,
            "packs": owners,
            "retain_median_ms": _ms(retain_s),
            "release_median_ms": _ms(release_s),
            "collect_with_all_retained_s": collect_all_s,
            "collect_reclaiming_half_s": collect_half_s,
            "reclaimed_files_first": first["reclaimed_files"],
            "reclaimed_files_second": second["reclaimed_files"],
            "publish_1k_with_retention_per_s": statistics.median(with_rates),
            "publish_1k_without_retention_per_s": statistics.median(without_rates),
            "publish_with_vs_without_ratio": ratio,
            "target": "ratio within [0.9, 1.1]",
            "result": "PASS" if 0.9 <= ratio <= 1.1 else "MISS",
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_report(res: dict[str, Any]) -> None:
    print(f"retention: {res['owners']} owners over {res['packs']} packs")
    print(f"  retain median {res['retain_median_ms']:.3f} ms, release median "
          f"{res['release_median_ms']:.3f} ms")
    print(f"  collection with every pack retained: {res['collect_with_all_retained_s']:.3f} s "
          f"(reclaimed {res['reclaimed_files_first']}); after releasing half: "
          f"{res['collect_reclaiming_half_s']:.3f} s (reclaimed {res['reclaimed_files_second']})")
    print(f"  1 KiB publish with retention in use {res['publish_1k_with_retention_per_s']:.0f}/s "
          f"vs nothing retained {res['publish_1k_without_retention_per_s']:.0f}/s: ratio "
          f"{res['publish_with_vs_without_ratio']:.3f} (target 0.9-1.1) {res['result']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--owners", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--publishes", type=int, default=300)
    p.add_argument("--dir", default=os.environ.get("STRAW_BENCH_DIR",
                                                   os.path.join(REPO, "bench-out")))
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.owners, args.rounds, args.publishes = 20, 1, 20
    os.makedirs(args.dir, exist_ok=True)
    res = run(args.dir, owners=args.owners, rounds=args.rounds, publishes=args.publishes)
    print_report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
