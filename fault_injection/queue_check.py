"""The queue scenario's record and its checker (``fault_injection.queue_fuzz``): the run
and queue names, the payload a worker publishes for a submission (``payload``), how
every process opens the queue (``open_coordinator``), the run's tallies
(``QueueSummary``) and ``check_queue``, which recovers a fresh coordinator and proves
from the workers' logs that nothing acknowledged was lost, nothing accepted twice, no
acknowledgement was stale and every acknowledged submission's tasks exist."""

from __future__ import annotations

import glob
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fault_injection.procs import until_unlocked
from straw import RecordSetRef, SharedFilesystemStore
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.publication_log import AckLog

RUN = "qfuzz"
QUEUE = "fuzzq"
LEASE_SECONDS = 2.0

def payload(sid: str) -> bytes:
    r = random.Random(sid)
    return f"result {sid}|".encode() + r.randbytes(r.choice((0, 64, 256, 3000)))


def open_coordinator(store: SharedFilesystemStore, *, recover: bool,
                      takeover: bool = False) -> Coordinator:
    return until_unlocked(lambda: Coordinator(
        store, queue_id=QUEUE, recover=recover, takeover=takeover,
        lease_seconds=LEASE_SECONDS, snapshot_every=64))


@dataclass
class QueueSummary:
    seed: int
    seconds: float
    workers: int
    target: str = "local"
    worker_kills: int = 0
    worker_stops: int = 0
    coordinator_kills: int = 0
    coordinator_stops: int = 0
    takeovers: int = 0
    slow_takeovers: int = 0
    refusals: int = 0
    submits: int = 0
    receipts: int = 0
    commits: int = 0
    final_epoch: int = 0
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"fuzz [queue/{self.target}] seed={self.seed} {self.seconds:.0f}s, "
                f"{self.workers} workers: "
                f"{self.worker_kills} worker kills, {self.worker_stops} worker stops, "
                f"{self.coordinator_kills} coordinator kills (recovered), "
                f"{self.coordinator_stops} coordinator stops, {self.takeovers} takeovers "
                f"({self.slow_takeovers} waited for the paused holder), "
                f"{self.refusals} refused replies (fenced/indeterminate); {self.receipts} "
                f"acknowledged receipts verified, {self.commits} commits, "
                f"{self.submits} submissions, final epoch {self.final_epoch}; "
                f"{len(self.violations)} violations")


def _coordinators(logdir: str) -> list[dict[str, Any]]:
    out = []
    for p in glob.glob(os.path.join(logdir, "coord-*.json")):
        with open(p) as f:
            out.append(json.load(f))
    return sorted(out, key=lambda i: i["gen"])


def check_queue(root: str, acks: str, logdir: str, workers: Sequence[str],
                s: QueueSummary, *, run: str = RUN) -> None:
    """See the module docstring."""
    entries = []
    for w in workers:
        entries += AckLog(PosixFS(), os.path.join(acks, f"q-{w}.log")).read()
    receipts = [e for e in entries if e["kind"] == "receipt"]
    submits = [e for e in entries if e["kind"] == "submit"]
    s.refusals = sum(1 for e in entries if e["kind"] == "refused")
    _check_replies(receipts, _coordinators(logdir), s)
    store = SharedFilesystemStore(root, run, writer_id="checker")
    try:
        q = open_coordinator(store, recover=True)
    except Exception as exc:
        s.violations.append(f"checker: recovery raised {type(exc).__name__}: {exc}")
        store.close()
        return
    try:
        s.final_epoch = q.epoch_number
        _check_receipts(q, store, receipts, s)
        _check_commits(q, run, s)
        for e in submits:
            for t in e["tasks"]:
                if q.task_status(t) is None:
                    s.violations.append(f"task {t} of acknowledged submission {e['req']} "
                                        "is missing")
            s.submits += 1
    finally:
        q.close()
        store.close()


def _check_replies(receipts: list[dict[str, Any]], coords: list[dict[str, Any]],
                   s: QueueSummary) -> None:
    """No stale acknowledgement (a success of epoch E to a request sent after a newer
    epoch was serving) and no position acknowledged to two submissions."""
    for e in receipts:
        newer = [c for c in coords if c["epoch"] > e["epoch"] and c["t_serving"] < e["t_send"]]
        if newer:
            s.violations.append(
                f"stale acknowledgement: {e['sid']} acknowledged by epoch {e['epoch']} for a "
                f"request sent {e['t_send'] - newer[0]['t_serving']:.3f}s after epoch "
                f"{newer[0]['epoch']} started serving")
    by_pos: dict[int, str] = {}
    for e in receipts:
        other = by_pos.setdefault(e["position"], e["sid"])
        if other != e["sid"]:
            s.violations.append(f"position {e['position']} acknowledged to {other} and "
                                f"{e['sid']}")


def _check_receipts(q: Coordinator, store: SharedFilesystemStore,
                    receipts: list[dict[str, Any]], s: QueueSummary) -> None:
    """Every logged receipt found by its submission id, the same, its result intact."""
    for e in receipts:
        got = q.lookup_submission(e["sid"])
        ref = RecordSetRef.from_dict(e["ref"])
        want = (e["task"], e["position"], ref)
        if got is None or (got.task_id, got.position, got.result_ref) != want:
            s.violations.append(f"lost receipt {e['sid']} (position {e['position']}, "
                                f"epoch {e['epoch']}): lookup returned {got}")
            continue
        try:
            recs = list(store.read(ref))
            if len(recs) != 1 or bytes(recs[0].payload) != payload(e["sid"]):
                raise AssertionError("payload differs")
        except Exception as exc:
            s.violations.append(f"result of {e['sid']} does not read back: "
                                f"{type(exc).__name__}: {exc}")
            continue
        s.receipts += 1


def _check_commits(q: Coordinator, run: str, s: QueueSummary) -> None:
    """Each task accepted once, every commit of this run's tasks and results."""
    seen: dict[str, int] = {}
    cursor = 0
    while True:
        page = q.read_commits(cursor, 1000)
        if not page.commits:
            break
        for cm in page.commits:
            if not cm.task_id.startswith(f"{run}.") or cm.result_ref.run_id != run:
                s.violations.append(f"queue of run {run!r} committed task {cm.task_id} "
                                    f"with result of run {cm.result_ref.run_id!r}")
            if cm.task_id in seen:
                s.violations.append(f"task {cm.task_id} accepted twice (positions "
                                    f"{seen[cm.task_id]} and {cm.position})")
            seen[cm.task_id] = cm.position
        cursor = page.cursor
    s.commits = len(seen)
