"""The batch builder's figures (issue 14, "Performance"), part of ``just bench``; alone:
``python -m bench.builder_bench``.

The workload: a batch of ``--samples`` (1,024) samples, ``--group`` (8) per group, each
with ``--rows`` (8,192) response+prompt tokens and int32 R3 routes ``[rows, 48, 8]``
(12.6 MB each, 12.9 GB in all), divided among ``--ranks`` (8) data-parallel ranks.

* A generation *process* publishes the groups into its own store; this process owns the
  coordinator and the batch builder and completes the prompt tasks with the references it
  gets back over a pipe (as Ray would carry them), so the builder process never holds a
  capture byte it did not read itself.
* **Builder memory**: this process's resident set (``/proc/self/statm``, sampled every
  2 ms by a thread) during ``next_batch``: peak minus the value right before.  Target
  < 256 MiB.  The builder reads each group's record 0 (token ids, rewards) and never a
  route byte: the growth follows the batch's token ids, not its captures.
* **Rank reads**: each rank, a process of its own with a byte-counting filesystem, loads
  its shard from the pickled ``RankBatchRef`` and materialises every tensor of it (token
  ids and routes); bytes read / the shard's bytes (its samples' token and route bytes).
  Target <= 1.1x each.  Also reported: the reference's pickled size and the read MiB/s.

``--samples`` takes a comma list (e.g. ``256,1024``) to show the memory growth is
independent of the sample count; ``--quick`` runs a small shape for the smoke test.
The disk needs samples x 12.6 MB free: the run checks first and refuses (use smaller
``--samples``) rather than fill the disk.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from straw import Coordinator, RecordSetRef, SharedFilesystemStore, TaskSpec
from straw.fs import Buffer, PosixFS
from straw.rollout import BatchBuilder, EnvironmentMix, Sample, SampleGroup, Status
from straw.rollout.codec import group_records
from straw.tensor import TensorRef

from .counting import CountingFS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
RSS_TARGET_MIB = 256
READ_TARGET = 1.1
PAGE = os.sysconf("SC_PAGE_SIZE")


class _ReadCounter(CountingFS):
    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.read_bytes = 0

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        n = super().readinto(fd, buffer, offset)
        self.read_bytes += n
        return n


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class _PeakRSS:
    """The largest resident set seen while the block runs (a sampling thread)."""

    def __enter__(self) -> _PeakRSS:
        self.before = _rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.before


def _group(index: int, p: dict[str, Any]) -> SampleGroup:
    rows, n = p["rows"], p["group"]
    samples = []
    for j in range(n):
        gi = index * n + j
        tokens = tuple(((np.arange(rows + 1, dtype=np.int64) * 7919 + gi) % 32000).tolist())
        routes = np.full((rows, p["layers"], p["topk"]), gi % 128, dtype=np.int32)
        samples.append(Sample(("prompt", index), tokens=tokens, response_length=rows // 2,
                              status=Status.COMPLETED, reward=float(j % 2),
                              group_index=index, index=gi, routes=routes))
    return SampleGroup(tuple(samples))


def _generator(conn: Connection, root: str, p: dict[str, Any]) -> None:
    """A generation process: publish the group of each lease it is sent, reply its ref."""
    import dataclasses

    with SharedFilesystemStore(root, "bench", writer_id="gen-0") as store:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            out = []
            for task_id, attempt_id, index in msg:
                records, deps = group_records(_group(index, p))
                records[0] = dataclasses.replace(records[0], metadata={
                    **records[0].metadata, "task_id": task_id, "attempt_id": attempt_id})
                ref = store.publish(records, submission_id=f"group:{attempt_id}",
                                    dependencies=deps)
                out.append(ref.to_dict())
            conn.send(out)
        store.seal()
    conn.send("done")


def _rank(conn: Connection, root: str, blob: bytes) -> None:
    """A training rank: load its shard from the pickled reference, read every tensor."""
    ref = pickle.loads(blob)
    fs = _ReadCounter()
    with SharedFilesystemStore(root, "bench", fs=fs) as store:
        t0 = time.perf_counter()
        base = fs.read_bytes
        shard = ref.load(store, rank=ref.rank)
        shard_bytes = 0
        for s in shard.samples:
            for name in ("tokens", "routes"):
                value = s[name]
                if isinstance(value, TensorRef):
                    value = value.load()
                shard_bytes += value.nbytes
        seconds = time.perf_counter() - t0
        conn.send({"rank": ref.rank, "samples": len(shard.samples),
                   "read_bytes": fs.read_bytes - base, "shard_bytes": shard_bytes,
                   "seconds": seconds})


def run(root: str, p: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    groups = p["samples"] // p["group"]
    store = SharedFilesystemStore(root, "bench", writer_id="manager")
    coord = Coordinator(store, queue_id="rollout")
    here, there = ctx.Pipe()
    gen = ctx.Process(target=_generator, args=(there, root, p))
    gen.start()
    t0 = time.perf_counter()
    prompt = store.publish([], submission_id="prompt")
    coord.submit_tasks("admit", [TaskSpec(f"prompt:{i}", input_ref=prompt)
                                 for i in range(groups)])
    step = 4
    for first in range(0, groups, step):
        ids = [f"prompt:{i}" for i in range(first, min(groups, first + step))]
        leases = {a.lease.task_id: a.lease for a in
                  coord.acquire("gen-0", len(ids), task_ids=ids).assignments}
        here.send([(t, leases[t].attempt_id, int(t[7:])) for t in ids])
        for t, ref in zip(ids, here.recv(), strict=True):
            coord.complete_task(leases[t], submission_id=f"result:{t}",
                                result_ref=RecordSetRef.from_dict(ref))
        coord.release_task_reads(list(leases.values()))
    here.send(None)
    assert here.recv() == "done"
    gen.join()
    generate_s = time.perf_counter() - t0
    builder = BatchBuilder(coord, store, EnvironmentMix.single(groups), dp_size=p["ranks"])
    t0 = time.perf_counter()
    with _PeakRSS() as rss:
        refs = builder.next_batch(0)
    build_s = time.perf_counter() - t0
    assert refs is not None
    blobs = [pickle.dumps(r) for r in refs]
    ranks = []
    for blob in blobs:  # one at a time: each rank's reads are its own
        a, b = ctx.Pipe()
        proc = ctx.Process(target=_rank, args=(b, root, blob))
        proc.start()
        ranks.append(a.recv())
        proc.join()
    builder.finish_batch(refs[0].batch_id)
    builder.close()
    coord.close()
    store.close()
    route_bytes = p["samples"] * p["rows"] * p["layers"] * p["topk"] * 4
    ratios = [r["read_bytes"] / r["shard_bytes"] for r in ranks]
    return {"samples": p["samples"], "route_bytes": route_bytes, "generate_s": generate_s,
            "build_s": build_s, "rss_before_mib": rss.before / MIB,
            "rss_growth_mib": rss.growth / MIB, "ref_pickle_bytes": max(map(len, blobs)),
            "ranks": ranks, "read_ratio_max": max(ratios), "read_ratio_min": min(ratios),
            "rank_read_mib_s": [r["read_bytes"] / MIB / r["seconds"] for r in ranks]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", default="1024", help="sample counts, comma separated")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--dir", default=os.environ.get("STRAW_BENCH_DIR",
                                                    os.path.join(REPO, "bench-out")))
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.samples.split(",")]
    if args.quick:
        counts, args.rows, args.ranks = [16], 512, 2
    os.makedirs(args.dir, exist_ok=True)
    results = []
    for n in counts:
        p = {"samples": n, "rows": args.rows, "layers": args.layers, "topk": args.topk,
             "group": args.group, "ranks": args.ranks}
        need = n * args.rows * args.layers * args.topk * 4
        free = shutil.disk_usage(args.dir).free
        if need * 1.2 + 2 * 1024**3 > free:
            print(f"builder bench: {n} samples need {need / 1e9:.1f} GB, {args.dir} has "
                  f"{free / 1e9:.1f} GB free: skipped (pass smaller --samples)")
            continue
        work = tempfile.mkdtemp(prefix="bench-builder-", dir=args.dir)
        try:
            results.append(run(os.path.join(work, "pool"), p))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    ok = True
    for r in results:
        rss_ok = r["rss_growth_mib"] < RSS_TARGET_MIB
        read_ok = r["read_ratio_max"] <= READ_TARGET
        ok = ok and rss_ok and read_ok
        print(f"batch builder: {r['samples']} samples x int32 routes [{args.rows}, "
              f"{args.layers}, {args.topk}] ({r['route_bytes'] / 1e9:.1f} GB), "
              f"{args.ranks} ranks")
        print(f"  builder RSS growth while building {r['rss_growth_mib']:.1f} MiB "
              f"(target < {RSS_TARGET_MIB} MiB) {'ok' if rss_ok else 'MISSED'}; build "
              f"{r['build_s']:.2f} s (generation {r['generate_s']:.1f} s)")
        print(f"  rank reads / shard bytes {r['read_ratio_min']:.4f}..{r['read_ratio_max']:.4f}"
              f" (target <= {READ_TARGET}) {'ok' if read_ok else 'MISSED'}; rank reference "
              f"{r['ref_pickle_bytes']} B pickled; rank read "
              f"{min(r['rank_read_mib_s']):.0f}..{max(r['rank_read_mib_s']):.0f} MiB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "pass": ok}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
