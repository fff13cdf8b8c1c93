"""The checkpoint figures of issue 15, part of ``just bench``; alone:
``python -m bench.checkpoint_bench`` (``--quick`` for the smoke test).

The workload: a queue whose history holds ``--history`` (100,000) accepted groups, all
trained in batches of ``--batch`` (256) and acknowledged, then ``--live`` (1,000) live
ones: half accepted and untrained (the builder's backlog), half pending prompt tasks.

* **Save**: ``Checkpointer.save`` of one step (model save: one small file), the median
  of ``--rounds`` (5) saves, first with a small history (``--batch`` groups) and then
  with the full one: the cost follows the live state, not the history.  Target < 0.2 s.
* **Restore**: ``resolve_checkpoint`` + ``open_job`` (exact) of a checkpoint whose backlog
  holds ``--ready`` (10,000) accepted untrained groups.  Target < 1 s.

Groups are one sample of a few tokens (the figures are about metadata, not payload);
the history is built in slices of 512: admitted in one transaction, leased in one call,
published in one write and completed concurrently (group commit), then trained.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

from bench.counting import CountingFS
from straw import Coordinator, Publication, SharedFilesystemStore, TaskSpec
from straw.fs import PosixFS
from straw.rollout import BatchBuilder, EnvironmentMix, RolloutConfig, Sample, SampleGroup, Status
from straw.rollout.checkpoint import Checkpointer
from straw.rollout.codec import group_records
from straw.rollout.data_source import PRODUCER_ID, Cursor, producer_state
from straw.rollout.resolve import resolve_checkpoint
from straw.rollout.restore import open_job

SAVE_TARGET = 0.2
RESTORE_TARGET = 1.0
# groups per acquire and publication while building the history: larger ones gain little
# (a publication's cost is per group) and the completions of one chunk run concurrently
_CHUNK = 512
# completions in flight: more share each journal and catalog sync (group commit)
_THREADS = 64
# groups accepted between trainings while building the history: the builder's state,
# published at every batch, holds its backlog, so a large backlog makes each batch dearer
_SLICE = 512


def save_model(model_dir: str) -> dict[str, Any]:
    with open(os.path.join(model_dir, "weights.bin"), "wb") as f:
        f.write(b"w" * 4096)
    return {"files": ["weights.bin"], "optimizer": True, "rng": True}


class Bench:
    def __init__(self, root: str, batch: int) -> None:
        # every call of the job's stores is counted: the syncs of a save are its own and
        # its queue's (load-free figures, unlike the times)
        self.fs = CountingFS(PosixFS())
        self.store = SharedFilesystemStore(root, "job", writer_id="manager", fs=self.fs)
        self.gen = SharedFilesystemStore(root, "job", writer_id="gen", fs=self.fs)
        self.coord = Coordinator(self.store, queue_id="rollout", namespace="bench")
        self.builder = BatchBuilder(self.coord, self.store, EnvironmentMix.single(batch),
                                    dp_size=1)
        self.ck = Checkpointer(os.path.join(root, "save"),
                               controller=SimpleNamespace(coordinator=self.coord),
                               builder=self.builder)
        self.admitted = 0
        self.rollout = 0
        self.threads = concurrent.futures.ThreadPoolExecutor(_THREADS)

    def admit(self, n: int) -> list[str]:
        """``n`` prompt tasks and the dataset cursor after them, in one transaction."""
        start = self.admitted
        ids = [f"prompt:{start + i}" for i in range(n)]
        prompt = self.gen.publish([], submission_id=f"prompt:{start}")
        cursor = Cursor(sample_offset=start + n, sample_group_index=start + n)
        for lo in range(0, n, 50_000):
            self.coord.submit_tasks(
                f"admit:{start}:{lo}",
                [TaskSpec(t, input_ref=prompt, metadata={"group_index": start + lo + i})
                 for i, t in enumerate(ids[lo:lo + 50_000])],
                producer_id=PRODUCER_ID, producer_state=producer_state(cursor))
        self.admitted += n
        return ids

    def accept(self, n: int) -> None:
        """Admit, lease and complete ``n`` groups: one acquire and one publication per
        ``_CHUNK`` groups, their completions concurrent (they share journal and catalog
        syncs: group commit).  Leased in scheduling order, as generation leases: the
        oldest pending tasks first (so ``n`` pending tasks are left, whatever was pending
        before), and no lease leaves a stale entry deep in the pending heap (leases by
        ``task_ids`` would, and ``pending_tasks`` would then scan the whole history)."""
        self.admit(n)
        for lo in range(0, n, _CHUNK):
            got = self.coord.acquire("gen", min(_CHUNK, n - lo))
            pubs = []
            for a in got.assignments:
                index = int(a.lease.task_id.split(":")[1])
                group = SampleGroup((Sample(("p", index), tokens=(1, 2, 3, 4),
                                            response_length=2, status=Status.COMPLETED,
                                            reward=1.0, group_index=index, index=0),))
                records, deps = group_records(group)
                records[0] = dataclasses.replace(records[0], metadata={
                    **records[0].metadata, "task_id": a.lease.task_id,
                    "attempt_id": a.lease.attempt_id})
                pubs.append(Publication(records, tuple(deps)))
            refs = self.gen.publish_many(pubs, submission_id=f"groups:{lo}:{self.admitted}")
            leases = [a.lease for a in got.assignments]
            list(self.threads.map(lambda lr: self.coord.complete_task(
                lr[0], submission_id=f"result:{lr[0].attempt_id}", result_ref=lr[1]),
                zip(leases, refs, strict=True)))
            self.coord.release_task_reads(leases)

    def train_all(self) -> None:
        while True:
            refs = self.builder.next_batch(self.rollout)
            if refs is None:
                return
            self.builder.finish_batch(refs[0].batch_id)
            self.rollout += 1

    def saves(self, rounds: int, first_step: int) -> tuple[list[float], list[int]]:
        """``rounds`` saves: their times and their syncs (fsync, fdatasync, fsync_dir:
        the checkpoint's own and those of the queue calls it makes)."""
        times, syncs = [], []
        for k in range(first_step, first_step + rounds):
            before = self.fs.snapshot()
            t = time.perf_counter()
            self.ck.save(k, save_model)
            times.append(time.perf_counter() - t)
            syncs.append(CountingFS.syncs(self.fs.delta(before)))
        return times, syncs

    def close(self) -> None:
        self.threads.shutdown()
        self.builder.close()
        self.coord.close()
        self.gen.close()
        self.store.close()


def run(history: int, live: int, ready: int, batch: int, rounds: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="straw-ckpt-bench-")
    try:
        b = Bench(root, batch)
        b.accept(batch)
        b.train_all()
        b.accept(live // 2)
        b.admit(live - live // 2)
        small, small_syncs = b.saves(rounds, 0)
        _progress(f"small-history saves: {[round(x * 1000, 1) for x in small]} ms, "
                  f"{small_syncs} syncs")
        t = time.perf_counter()
        for lo in range(batch, history, _SLICE):  # accepted and trained in slices
            b.accept(min(_SLICE, history - lo))
            b.train_all()
            done = min(history, lo + _SLICE)
            if done % 10_000 < _SLICE or done == history:
                _progress(f"history: {done:,} groups accepted and trained "
                          f"({time.perf_counter() - t:.0f} s)")
        build = time.perf_counter() - t
        # the same live state again: the history's training took the backlog, the
        # pending tasks are still pending
        b.accept(live // 2)
        large, large_syncs = b.saves(rounds, 100)
        _progress(f"full-history saves: {[round(x * 1000, 1) for x in large]} ms, "
                  f"{large_syncs} syncs")
        # a checkpoint of `ready` accepted untrained groups, restored exactly
        b.accept(ready - sum(b.builder.backlog().values()))
        b.ck.save(200, save_model)
        prompts = [(i, i + 1) for i in range(b.admitted)]  # the dataset the cursor is of
        b.close()
        save = os.path.join(root, "save")
        store = SharedFilesystemStore(root, "job")
        # wall and CPU (this process's: the load-robust figure on a shared machine)
        t, cpu = time.perf_counter(), time.process_time()
        resolution = resolve_checkpoint(save, step=200)
        job = open_job(resolution, store, prompts, EnvironmentMix.single(batch), dp_size=1,
                       config=RolloutConfig(n_samples_per_prompt=1))
        restore, restore_cpu = time.perf_counter() - t, time.process_time() - cpu
        restored = job.restored
        job.close()
        store.close()
        return {"history": history, "live": live, "batch": batch,
                "save_small_history_s": statistics.median(small),
                "save_s": statistics.median(large), "save_all_s": large,
                "save_syncs": statistics.median(large_syncs),
                "save_small_history_syncs": statistics.median(small_syncs),
                "save_target_s": SAVE_TARGET, "history_build_s": build,
                "restore_ready": restored, "restore_s": restore,
                "restore_cpu_s": restore_cpu,
                "restore_target_s": RESTORE_TARGET}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, default=100_000)
    p.add_argument("--live", type=int, default=1_000)
    p.add_argument("--ready", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="a small shape (smoke test)")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    if a.quick:
        a.history, a.live, a.ready, a.batch, a.rounds = 1_000, 100, 500, 64, 2
    out = run(a.history, a.live, a.ready, a.batch, a.rounds)
    print(f"checkpoint save, {out['history']:,} accepted groups of history and "
          f"{out['live']:,} live: {out['save_s'] * 1000:.1f} ms median (small history: "
          f"{out['save_small_history_s'] * 1000:.1f} ms; target < {SAVE_TARGET * 1000:.0f} ms), "
          f"{out['save_syncs']} syncs a save (small history: "
          f"{out['save_small_history_syncs']})")
    print(f"exact restore of {out['restore_ready']:,} ready groups: {out['restore_s']:.3f} s "
          f"(CPU {out['restore_cpu_s']:.3f} s; target < {RESTORE_TARGET:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
