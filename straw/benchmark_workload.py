"""The benchmark's workloads (``python -m straw.benchmark``): the record sizes of each
publication a worker cycles over its tasks (``load_sizes``: a profile, explicit sizes or
a size model), and a workload profile summarised from ``straw.tracing`` traces
(``profile``) with the rates it reports (``percentile``, ``completion_peak``)."""

from __future__ import annotations

import argparse
import json
import os
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .fs import PosixFS
from .reporting import write_report

MIB = 1 << 20


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank below; 0 when empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] if ordered else 0


def completion_peak(events: Sequence[dict[str, Any]], window: float, *,
                    checked: bool = False, payload: bool = False) -> float | None:
    """The highest MiB/s credited to one ``window``-second wall-clock bucket (bytes count
    when their operation completed); None if ``checked`` and a range read lacks
    ``checked_bytes``.  ``payload`` counts a write's record payloads only (its
    ``records[].bytes``), not the whole extent (framing and manifest included)."""
    if checked and any(e["op"] == "read_range" and "checked_bytes" not in e for e in events):
        return None
    buckets: defaultdict[int, int] = defaultdict(int)
    for e in events:
        if checked:
            n = e.get("checked_bytes", e["bytes"])
        elif payload:
            n = sum(r["bytes"] for r in e.get("records", []))
        else:
            n = e["bytes"]
        buckets[int(e["time"] // window)] += n
    return max(buckets.values(), default=0) / window / MIB


def load_sizes(args: argparse.Namespace) -> list[list[int]]:
    """The record sizes of each publication, cycled over the tasks."""
    if args.profile:
        data = json.loads(PosixFS().read_file(os.path.abspath(args.profile)))
        publications = list(data["publications"]) if isinstance(data, dict) else None
        if not publications:
            raise ValueError(f"--profile {args.profile}: expected a JSON object with a "
                             "non-empty 'publications' list (the profile command writes one)")
        random.Random(0).shuffle(publications)
        width = args.publications_per_task
        return [[n for p in publications[i:i + width] for n in p]
                for i in range(0, len(publications), width)]
    if args.record_bytes:
        return [list(args.record_bytes)]
    # per sample: routed experts (tokens x 48 layers x 8 experts x int32) and top-k ids and
    # log-probs (tokens x 128 x 4 bytes each): a shape model, not measured traffic
    rows = args.tokens
    return [[rows * 48 * 8 * 4, rows * 128 * 4, rows * 128 * 4] * args.samples]


def _check_sizes(sizes: list[list[int]]) -> None:
    if not sizes or any(not row or any(type(n) is not int or n <= 0 for n in row)
                        for row in sizes):
        raise ValueError("the workload must consist of non-empty publications of positive "
                         "integer record sizes")


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Summarise the traces in ``args.trace`` into a workload profile at ``args.output``."""
    fs = PosixFS()
    trace = os.path.abspath(args.trace)
    events: list[dict[str, Any]] = []
    for name in sorted(fs.listdir(trace)):
        if name.endswith(".jsonl"):
            text = fs.read_file(os.path.join(trace, name)).decode()
            events.extend(json.loads(line) for line in text.splitlines() if line.strip())
    writes = [e for e in events if e["op"] == "write"]
    reads = [e for e in events if e["op"] in ("read", "read_range")]
    sizes = [[r["bytes"] for r in e.get("records", [])] for e in writes]
    sizes = [s for s in sizes if s and sum(s) > 0]
    if not sizes:
        raise ValueError(f"the traces in {trace} hold no publication with payload (set "
                         "STRAW_TRACE_DIR in the traced processes)")
    write_bytes = sum(e["bytes"] for e in writes)
    read_bytes = sum(e["bytes"] for e in reads)
    checked_known = all(e["op"] != "read_range" or "checked_bytes" in e for e in reads)
    checked = sum(e.get("checked_bytes", e["bytes"]) for e in reads) if checked_known else None
    report = {
        "version": 1,
        "publications": sizes,
        "source_trace": trace,
        "observed_write_bytes": write_bytes,
        "observed_write_payload_bytes": sum(map(sum, sizes)),
        "observed_read_bytes": read_bytes,
        "checked_read_bytes": checked,
        "observed_seconds": max(e["time"] for e in events) - min(e["time"] for e in events),
        "hosts": sorted({e["host"] for e in events}),
        "read_to_extent_write_ratio": read_bytes / max(1, write_bytes),
        # bytes verified per byte returned (a range read checks whole chunks): None when
        # a range read did not report what it checked
        "checked_read_amplification": None if checked is None or not read_bytes
        else checked / read_bytes,
        "write_p50_seconds": percentile([e["seconds"] for e in writes], 0.5),
        "write_p99_seconds": percentile([e["seconds"] for e in writes], 0.99),
        "payload_completion_rates": [
            {"window_seconds": w,
             "write_peak_mib_s": completion_peak(writes, w, payload=True),
             "extent_write_peak_mib_s": completion_peak(writes, w),
             "read_peak_mib_s": completion_peak(reads, w),
             "checked_read_peak_mib_s": completion_peak(reads, w, checked=True)}
            for w in (1, 10)],
        "record_shapes": [r for e in writes for r in e.get("records", []) if "shape" in r],
    }
    write_report(args.output, report)
    return report
