"""``straw bench``: a short measurement of the store on a directory, as a ratio to this
machine's own limit measured in the same run (DESIGN: performance principles).

Rounds alternate a raw loop (write one file of the same bytes + ``fdatasync``) and
``store.publish`` of the same records, so the bimodal disk speed of these machines hits
both alike; the medians and their ratio are reported, and a checked read-back pass.  The
full benchmarks (latency, tensors, queues, straw-queue as a peer) are ``just bench``."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ..fs import PosixFS
from ..refs import Record
from ..store import SharedFilesystemStore


def run(root: str | None = None, *, rounds: int = 5, records: int = 16,
        record_bytes: int = 1 << 20, step: Callable[[str], None] | None = None
        ) -> dict[str, Any]:
    base = root or tempfile.mkdtemp(prefix="straw-bench-")
    if root is not None:
        os.makedirs(base, exist_ok=True)
        base = tempfile.mkdtemp(prefix="straw-bench-", dir=base)
    payload = os.urandom(record_bytes)
    fs = PosixFS()
    raw, pub, rd = [], [], []
    try:
        with SharedFilesystemStore(os.path.join(base, "pool"), "bench",
                                   writer_id="bench") as store:
            for r in range(rounds):
                t0 = time.perf_counter()
                for i in range(records):
                    fd = fs.open(os.path.join(base, f"raw-{r}-{i}"), write=True, create=True)
                    fs.writev(fd, [payload], 0)
                    fs.fdatasync(fd)
                    fs.close(fd)
                raw.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                refs = [store.publish([Record(f"r{i}", payload)], submission_id=f"b-{r}-{i}")
                        for i in range(records)]
                pub.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for ref in refs:
                    store.read(ref)
                rd.append(time.perf_counter() - t0)
                if step is not None:
                    step(f"round {r + 1}/{rounds}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    mib = records * record_bytes / 2**20

    def rate(ts: list[float]) -> float:
        return round(mib / statistics.median(ts), 1)

    return {"root": root or "(temp dir)", "rounds": rounds, "records": records,
            "record_bytes": record_bytes, "raw_mib_s": rate(raw), "publish_mib_s": rate(pub),
            "read_mib_s": rate(rd), "ratio": round(rate(pub) / rate(raw), 3)}
