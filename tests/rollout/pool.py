"""A rollout pool for the batch builder's tests: a manager store and coordinator, a
generation store, and accepted groups completed directly through the Coordinator (what
the generation client does in a job: acquire prompt tasks, publish ``group_records(g)``,
``complete_task``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.archive_bench import published_samples  # noqa: F401 - the archive tests' helper
from bench.counting import CountingFS
from straw import Coordinator, SharedFilesystemStore, TaskSpec
from straw.fs import Buffer, Filesystem, PosixFS
from straw.rollout import Sample, SampleGroup, Status
from straw.rollout.codec import group_records
from straw.rollout.samples import VersionSpan


class ByteCountingFS(CountingFS):
    """``CountingFS`` that also sums the bytes every ``readinto`` returned."""

    def __init__(self, inner: Filesystem | None = None) -> None:
        super().__init__(inner if inner is not None else PosixFS())
        self.read_bytes = 0

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        n = super().readinto(fd, buffer, offset)
        self.read_bytes += n
        return n

    def writes(self) -> int:
        return sum(self.calls[m] for m in ("writev", "fsync", "fdatasync", "fsync_dir",
                                           "rename", "unlink", "truncate"))


def make_group(index: int, *, env: str = "", n: int = 2, prompt_len: int = 4,
               response: Sequence[int] | int = 4, rewards: Sequence[Any] | None = None,
               version: int | None = None, routes: tuple[int, int] | None = None
               ) -> SampleGroup:
    """Group ``index``: ``n`` completed samples with ``response`` tokens each (or one
    length per sample), generated under weight ``version``; ``routes=(layers, topk)``
    adds int32 R3 routes of ``len(tokens) - 1`` rows."""
    lengths = [response] * n if isinstance(response, int) else list(response)
    samples = []
    for j, length in enumerate(lengths):
        tokens = tuple(range(index * 1000 + j, index * 1000 + j + prompt_len + length))
        r = None
        if routes is not None:
            layers, topk = routes
            r = np.full((len(tokens) - 1, layers, topk), index * 100 + j, dtype=np.int32)
        samples.append(Sample(
            ("prompt", index), tokens=tokens, response_length=length,
            status=Status.COMPLETED,
            reward=float(j) if rewards is None else rewards[j],
            versions=() if version is None else (VersionSpan(0, length, version),),
            group_index=index, index=index * n + j, routes=r))
    return SampleGroup(tuple(samples), environment=env)


class Pool:
    """Manager store + coordinator (``fs`` for both), and a generation store."""

    def __init__(self, root: str, *, fs: Filesystem | None = None,
                 gen_fs: Filesystem | None = None, recover: bool = False,
                 segment_target_bytes: int = 1 << 30) -> None:
        self.root = root
        self.store = SharedFilesystemStore(root, "job", fs=fs, writer_id="manager",
                                           segment_target_bytes=segment_target_bytes)
        self.gen = SharedFilesystemStore(root, "job", fs=gen_fs, writer_id="gen-0",
                                         segment_target_bytes=segment_target_bytes)
        self.coord = Coordinator(self.store, queue_id="rollout", recover=recover)

    def accept(self, groups: Sequence[SampleGroup]) -> list[int]:
        """Submit, lease and complete one prompt task per group; their commit positions."""
        base = sum(1 for t in self.coord.tasks if t.startswith("prompt:"))
        ids = [f"prompt:{base + i}" for i in range(len(groups))]
        prompt = self.gen.publish([], submission_id=f"prompts:{base}")
        self.coord.submit_tasks(f"admit:{base}", [TaskSpec(t, input_ref=prompt)
                                                  for t in ids])
        got = self.coord.acquire("gen-0", len(ids), task_ids=ids, task_prefix="prompt:")
        leases = {a.lease.task_id: a.lease for a in got.assignments}
        positions = []
        for t, g in zip(ids, groups, strict=True):
            lease = leases[t]
            records, deps = group_records(g)
            records[0] = dataclasses.replace(records[0], metadata={
                **records[0].metadata, "task_id": lease.task_id,
                "attempt_id": lease.attempt_id})
            ref = self.gen.publish(records, submission_id=f"group:{lease.attempt_id}",
                                   dependencies=deps)
            receipt = self.coord.complete_task(lease, submission_id=f"result:{t}",
                                               result_ref=ref)
            positions.append(receipt.position)
        # the generation worker is done reading its inputs (else they stay protected)
        self.coord.release_task_reads(list(leases.values()))
        return positions

    def close(self) -> None:
        for part in (self.coord, self.gen, self.store):
            try:
                part.close()
            except Exception:  # a test that failed storage on purpose
                pass
