"""``just fuzz`` shared-root scenario: two runs in one pool root, at once.

Role: verification layer 7 of DESIGN.md for run isolation (owners and queues belong to a
run; one run's collection never deletes another's data).

Runs ``runA`` and ``runB`` share one root.  Each run has, at the same time:

* the store scenario of ``fault_injection.fuzz`` with retention: writers (the same writer
  ids in both runs) publish, retain their latest acknowledged submissions under
  ``keep-<writer>`` (the same owner names in both runs), drop their staging and collect
  garbage; a reader pins and verifies what they acknowledge; SIGKILL and SIGSTOP;
* the queue scenario of ``fault_injection.queue_fuzz`` on a queue of the same id in both
  runs (coordinators killed, paused and taken over; workers that collect garbage).

On JuiceFS run A's writers and workers use client a and run B's client b (the readers and
checkers the other client), so each run's collection and takeovers cross clients.

Checked with the acknowledgement logs, per run: nothing acknowledged is lost (every
submission that was never released reads back; every logged receipt is found; each
owner holds exactly its run's last retained window, which reads back), nothing accepted
twice, every commit is of the run's own tasks and results; and, across the runs, every
root of every owner of a run lies in that run's packs.  The checkers run only after every
process of both runs ended (a late collection of one run must not delete what the other's
checker already verified).  The negative control ``runs-share-owners``
(``controls.RUNS_CONTROLS``: owner names global to the root, collection pool-wide) must
make the run report a lost retained window.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from fault_injection.queue_fuzz import QueueSummary, run_queue
from fault_injection.store_fuzz import Summary, run_target
from straw.catalog import Catalog
from straw.catalog_state import run_prefix
from straw.fs import PosixFS

RUNS = ("runA", "runB")
# the supervisors' actions come this many times slower than in the store and queue
# scenarios: four scenarios' processes share the machine
PACE = 2.5


@dataclass
class RunsSummary:
    target: str
    seed: int
    seconds: float
    stores: list[Summary] = field(default_factory=list)
    queues: list[QueueSummary] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # the cross-run check's

    def all_violations(self) -> list[str]:
        out = list(self.violations)
        for run, s in zip(RUNS, self.stores, strict=False):
            out += [f"{run}/store: {v}" for v in s.violations]
        for run, q in zip(RUNS, self.queues, strict=False):
            out += [f"{run}/queue: {v}" for v in q.violations]
        return out

    def line(self) -> str:
        parts = [f"{run}: {s.kills} writer kills, {q.worker_kills + q.coordinator_kills} queue "
                 f"kills, {q.takeovers} takeovers; {s.reader_verified} submissions followed "
                 f"live by the reader, {s.retained_verified} retained at the end verified, "
                 f"{q.receipts} receipts verified"
                 for run, s, q in zip(RUNS, self.stores, self.queues, strict=False)]
        return (f"fuzz [runs/{self.target}] seed={self.seed} {self.seconds:.0f}s, two runs "
                f"in one root: {'; '.join(parts)}; {len(self.all_violations())} violations")


def run_runs(base: str, *, seconds: float, n_writers: int, n_workers: int, seed: int,
             shared: tuple[str, str] | None = None, target: str = "local",
             control: str | None = None) -> RunsSummary:
    """Both runs' store and queue scenarios at once in one root (see the module
    docstring); ``shared``: two JuiceFS clients of one volume, else a local ``base``;
    ``control``: a name from ``controls.RUNS_CONTROLS`` to run every store writer broken
    (the run must then report violations)."""
    mounts = shared or (base, base)
    out = RunsSummary(target, seed, seconds)
    # every checker runs after every process of both runs ended: a late collection of one
    # run must not be able to delete what the other run's checker already verified
    ended = threading.Barrier(2 * len(RUNS), timeout=600)
    results: dict[tuple[int, str], Summary | QueueSummary] = {}
    jobs: list[tuple[tuple[int, str], Callable[[], Summary | QueueSummary]]] = []
    for i, run in enumerate(RUNS):
        # run A writes through client a and reads through b; run B the other way round
        mine, other = (mounts[0], mounts[1]) if i == 0 else (mounts[1], mounts[0])
        pools = (os.path.join(mine, "pool"), os.path.join(other, "pool"))
        jobs.append(((i, "store"), _store_job(
            target, os.path.join(mine, f"{run}-store"), os.path.join(other, f"{run}-store"),
            os.path.join(base, f"logs-{run}"), seconds=seconds, n_writers=n_writers,
            seed=seed + i, run=run, pools=pools, control=control, before_check=ended.wait)))
        jobs.append(((i, "queue"), _queue_job(
            os.path.join(base, f"{run}-queue"), seconds=seconds, n_workers=n_workers,
            seed=seed + i, shared=None if shared is None else (mine, other), target=target,
            run=run, roots=pools, before_check=ended.wait)))
    errors: list[str] = []

    def work(key: tuple[int, str], job: Callable[[], Summary | QueueSummary]) -> None:
        try:
            results[key] = job()
        except Exception:  # noqa: BLE001 - reported as a violation
            ended.abort()  # the others do not wait for this one
            errors.append(f"{RUNS[key[0]]}/{key[1]} supervisor raised:\n"
                          f"{traceback.format_exc()}")

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.violations += errors
    for i in range(len(RUNS)):
        s, q = results.get((i, "store")), results.get((i, "queue"))
        if isinstance(s, Summary):
            out.stores.append(s)
        if isinstance(q, QueueSummary):
            out.queues.append(q)
    out.violations += check_isolated(os.path.join(mounts[1], "pool"))
    return out


def _store_job(target: str, write_base: str, read_base: str, logdir: str, *, seconds: float,
               n_writers: int, seed: int, run: str, pools: tuple[str, str],
               control: str | None, before_check: Callable[[], object]
               ) -> Callable[[], Summary]:
    return lambda: run_target(target, write_base, read_base, logdir, seconds=seconds,
                              n_writers=n_writers, seed=seed, run=run, pools=pools,
                              retention=True, control=control, pace=PACE,
                              before_check=before_check)


def _queue_job(base: str, *, seconds: float, n_workers: int, seed: int,
               shared: tuple[str, str] | None, target: str, run: str,
               roots: tuple[str, str], before_check: Callable[[], object]
               ) -> Callable[[], QueueSummary]:
    return lambda: run_queue(base, seconds=seconds, n_workers=n_workers, seed=seed,
                             shared=shared, target=target, run=run, roots=roots, pace=PACE,
                             before_check=before_check)


def check_isolated(root: str) -> list[str]:
    """Every root of every owner of a run lies in that run's packs (no run's retain or
    queue ever took roots of another), and both runs have owners (they retained)."""
    cat = Catalog(PosixFS(), root)
    try:
        with cat.locked() as st:
            owners = dict(st.owners)
    finally:
        cat.close()
    out = []
    for (run, name), roots in sorted(owners.items()):
        stray = sorted(p for p, _ in roots if not p.startswith(run_prefix(run)))
        if stray:
            out.append(f"owner {name!r} of run {run!r} holds packs of another run: "
                       f"{stray[:3]}")
    for run in RUNS:
        if not any(r == run for r, _ in owners):
            out.append(f"run {run!r} has no owners at the end: it never retained?")
    return out
