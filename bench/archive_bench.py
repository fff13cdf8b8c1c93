"""Debug archives' figures (issue 16, "Performance"), part of ``just bench``; alone:
``python -m bench.archive_bench``.

The workload: a rollout of ``--samples`` (1,024) samples of ``--tokens`` (128) token ids
(half prompt, half response), each with uint8 R3 routes ``[tokens - 1, 48, 8]`` (uint8:
<= 256 experts), published into the pool as the generation client does (one group
publication each) and read back as lazy ``TensorRef``s, as the queue hands them out.

* **Save**: ``RolloutArchive.save`` of those samples into the same pool; every byte the
  store's filesystem writes meanwhile (``writev`` through a byte-counting ``Filesystem``:
  chunks, manifest, catalog records and the index file) is "new bytes".  Target < 1 MiB:
  the routes are shared, not copied; what is written is each sample's token ids (4 bytes
  a token: they are the sample) and a few bytes of pointer per capture, plus the index.
* **Lookup**: a fresh ``RolloutArchive`` (its own store, byte-counting too) and
  ``load_samples(sample_key=...)`` of one key: chunks decoded (``chunks_read``) and bytes
  read (index and manifest included, the routes not loaded).  Target < 2 chunks.

``--quick`` runs a small shape for the smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from straw import SharedFilesystemStore
from straw.fs import Buffer, PosixFS
from straw.rollout import RolloutArchive, Sample, SampleGroup, Status
from straw.rollout.codec import group_from_records, group_records
from straw.tensor import TensorRef

from .counting import CountingFS

MIB = 1 << 20
SAVE_TARGET = MIB
CHUNK_TARGET = 2
LAYERS, TOPK = 48, 8


class _ByteFS(CountingFS):
    """Counts the bytes written and read, besides the calls."""

    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.written = 0
        self.read = 0

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        n = super().writev(fd, buffers, offset)
        self.written += n
        return n

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        n = super().readinto(fd, buffer, offset)
        self.read += n
        return n


def published_samples(store: SharedFilesystemStore, samples: list[Sample]) -> list[Sample]:
    """The samples as a queue holds them: each published as a group of one, its captures
    lazy ``TensorRef``s (what an archive saves; the archive tests use it too)."""
    out = []
    for k, s in enumerate(samples):
        records, deps = group_records(SampleGroup((s,)))
        ref = store.publish(records, submission_id=f"group:{k}", dependencies=deps)
        head = store.read_record(store.checked_manifest(ref).record_refs[0])
        group = group_from_records([head], tensors=TensorRef.from_record_set_many(store, ref),
                                   lazy_tensors_over=0, store=store)
        out.append(group.samples[0])
    return out


def _queue_samples(store: SharedFilesystemStore, n: int, tokens: int) -> list[Sample]:
    """``n`` samples as the queue holds them: one group publication each, routes lazy."""
    half = tokens // 2
    return published_samples(store, [
        Sample(("prompt", i), tokens=tuple(range(i, i + tokens)), response_length=half,
               status=Status.COMPLETED, reward=1.0, group_index=i, index=i,
               metadata={"task_id": f"prompt:{i}"},
               routes=np.full((tokens - 1, LAYERS, TOPK), i % 251, dtype=np.uint8))
        for i in range(n)])


def run(samples: int, tokens: int, work: str) -> dict[str, Any]:
    root = os.path.join(work, "pool")
    fs = _ByteFS()
    with SharedFilesystemStore(root, "job", fs=fs) as store:
        queued = _queue_samples(store, samples, tokens)
        route_bytes = sum(s.routes.nbytes for s in queued)
        written, payload = fs.written, store.metrics["payload_bytes"]
        t0 = time.perf_counter()
        path = RolloutArchive.save(os.path.join(work, "rollout_7.straw.json"), queued,
                                   rollout_id=7, store=store)
        save_s = time.perf_counter() - t0
        new_bytes = fs.written - written
        new_payload = store.metrics["payload_bytes"] - payload
    index_bytes = os.path.getsize(path)
    rfs = _ByteFS()
    key = f"sample:{samples // 2}"
    t0 = time.perf_counter()
    with RolloutArchive(path, fs=rfs) as archive:
        opened = rfs.read
        got = archive.load_samples(sample_key=key)
        lookup_s = time.perf_counter() - t0
        chunks_read = archive.chunks_read
        assert [s.index for s in got] == [samples // 2]
        assert isinstance(got[0].routes, TensorRef)
    return {"samples": samples, "tokens": tokens, "route_bytes": route_bytes,
            "token_bytes": samples * tokens * 4,
            "save_new_bytes": new_bytes, "save_new_payload_bytes": new_payload,
            "index_bytes": index_bytes, "save_s": save_s,
            "save_target_bytes": SAVE_TARGET, "save_ok": new_bytes < SAVE_TARGET,
            "open_read_bytes": opened, "lookup_read_bytes": rfs.read - opened,
            "lookup_chunks_read": chunks_read, "lookup_s": lookup_s,
            "lookup_target_chunks": CHUNK_TARGET, "lookup_ok": chunks_read < CHUNK_TARGET}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="a small shape (smoke test)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.tokens = 130, 16
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="archive-bench-", dir=args.dir)
    try:
        r = run(args.samples, args.tokens, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"debug archive: {r['samples']} samples x {r['tokens']} tokens, uint8 routes "
          f"[{r['tokens'] - 1}, {LAYERS}, {TOPK}] already in the pool "
          f"({r['route_bytes'] / MIB:.1f} MiB)")
    print(f"  save writes {r['save_new_bytes'] / MIB:.3f} MiB new bytes (target < 1 MiB: "
          f"{'ok' if r['save_ok'] else 'MISSED'}); payload {r['save_new_payload_bytes']} B "
          f"(token ids {r['token_bytes']} B), index {r['index_bytes']} B, "
          f"{r['save_s'] * 1e3:.0f} ms")
    print(f"  load_samples(sample_key=...) reads {r['lookup_chunks_read']} chunk(s) "
          f"(target < {CHUNK_TARGET}: {'ok' if r['lookup_ok'] else 'MISSED'}), "
          f"{r['lookup_read_bytes']} B after opening ({r['open_read_bytes']} B), "
          f"{r['lookup_s'] * 1e3:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [r]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
