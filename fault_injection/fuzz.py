"""``just fuzz``: real processes on a real filesystem, killed and paused at random.

Role: verification layer 7 of DESIGN.md.  Each scenario runs on a real directory and, when
one can be mounted, on a JuiceFS mount (two clients of one volume), and is checked against
the acknowledgement logs its processes keep: nothing acknowledged lost, nothing accepted
twice.  Prints a summary per scenario and filesystem and exits non-zero on any violation.

``--scenario`` picks the store scenario (``fault_injection.store_fuzz``: writer and
reader processes of one pool, with forks, checked publication by publication), the queue
scenarios (``fault_injection.queue_fuzz``: a coordinator process and worker processes, SIGKILLed,
SIGSTOPped and taken over, checked against the workers' receipt logs; on the local
directory and on JuiceFS, coordinators alternating between the two clients and
``--queue-seconds`` split between the filesystems; ``--no-queue-juicefs`` keeps them on
the local directory), the shared-root scenario ``runs`` (``fault_injection.runs_fuzz``:
two runs in one root, each with retaining writers and a queue of the same id;
``--runs-seconds`` split between the filesystems), the rollout scenario ``rollout``
(``fault_injection.rollout_fuzz``: a rollout controller, generation processes and a
trainer, SIGKILLed and restarted; ``--rollout-seconds`` split between the filesystems),
the whole-job scenario ``job`` (``fault_injection.job_fuzz``: one checkpointed rollout job
SIGKILLed and resumed through ``resolve_checkpoint`` + ``open_job``; ``--job-seconds``
split between the filesystems) or ``all`` (the default).  ``--juicefs no`` skips JuiceFS
for all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence

from fault_injection.job_fuzz import JobSummary
from fault_injection.queue_fuzz import QueueSummary
from fault_injection.rollout_fuzz import RolloutSummary
from fault_injection.runs_fuzz import RunsSummary
from fault_injection.store_fuzz import Summary, run_target


@contextlib.contextmanager
def _juicefs(base: str) -> Iterator[tuple[str, str] | str]:
    """Two clients of a fresh JuiceFS volume, or the reason there are none."""
    try:
        from tests.juicefs_fixture import JuiceFSUnavailable, mount_pair
    except ImportError as e:  # pragma: no cover - run from outside the repository
        yield f"cannot import tests.juicefs_fixture: {e}"
        return
    try:
        with mount_pair(os.path.join(base, "juicefs")) as m:
            yield (m.a, m.b)
    except JuiceFSUnavailable as e:
        yield str(e)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fault_injection.fuzz",
                                 description="straw fuzz harness: real processes, SIGKILL, "
                                             "SIGSTOP/SIGCONT, checked against ack logs")
    ap.add_argument("--seconds", type=float, default=60.0, help="per filesystem")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--juicefs", choices=("auto", "yes", "no"), default="auto",
                    help="also run on a JuiceFS mount (both scenarios): when available / "
                         "required / never")
    ap.add_argument("--keep", action="store_true", help="keep the pools and logs")
    ap.add_argument("--control", default=None,
                    help="negative control: run the writers on a deliberately broken engine "
                         "(a name from fault_injection.controls.STORE_CONTROLS), or the "
                         "coordinators of the queue scenarios (queue_campaign.QUEUE_CONTROLS, "
                         "e.g. queue-no-fencing), or the writers of the shared-root scenario "
                         "(controls.RUNS_CONTROLS, e.g. runs-share-owners), or the generation "
                         "processes of the rollout scenario (rollout_fuzz.CONTROLS, e.g. "
                         "rollout-restart-partial), or the job of the job scenario "
                         "(job_fuzz.CONTROLS, e.g. job-exact-resume); the run must then "
                         "report violations")
    ap.add_argument("--scenario", choices=("store", "queue", "runs", "rollout", "job", "all"),
                    default="all",
                    help="store: writer/reader processes (per filesystem); queue: a "
                         "coordinator process and worker processes, killed, paused and taken "
                         "over (fault_injection.queue_fuzz); runs: two runs in one root, each "
                         "with retaining writers and a queue of the same id "
                         "(fault_injection.runs_fuzz); rollout: a rollout job's controller, "
                         "generation and trainer processes (fault_injection.rollout_fuzz); "
                         "job: a whole checkpointed rollout job SIGKILLed and resumed from its "
                         "joint checkpoints (fault_injection.job_fuzz); all: all five")
    ap.add_argument("--queue-seconds", type=float, default=None,
                    help="total duration of the queue scenarios, split between the local "
                         "directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--queue-workers", type=int, default=3)
    ap.add_argument("--queue-juicefs", action=argparse.BooleanOptionalAction, default=True,
                    help="run the queue scenarios on JuiceFS too (coordinators alternating "
                         "between the two clients), unless --juicefs no; "
                         "--no-queue-juicefs keeps them on the local directory")
    ap.add_argument("--runs-seconds", type=float, default=None,
                    help="total duration of the shared-root scenario, split between the "
                         "local directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--runs-writers", type=int, default=2,
                    help="store writers (and queue workers) per run in the shared-root "
                         "scenario")
    ap.add_argument("--rollout-seconds", type=float, default=None,
                    help="total duration of the rollout scenario, split between the local "
                         "directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--job-seconds", type=float, default=None,
                    help="total duration of the job scenario, split between the local "
                         "directory and JuiceFS when it runs (default: --seconds)")
    args = ap.parse_args(argv)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    base = args.dir or tempfile.mkdtemp(prefix="straw-fuzz-")
    os.makedirs(base, exist_ok=True)
    summaries: list[Summary] = []
    queue_summaries: list[QueueSummary] = []
    notes: list[str] = []
    store_part = args.scenario in ("store", "all")
    store_control = args.control if args.control and not args.control.startswith(
        ("queue-", "runs-", "rollout-", "job-")) else None
    queue_part = args.scenario in ("queue", "all")
    queue_total = args.queue_seconds if args.queue_seconds is not None else args.seconds
    runs_part = args.scenario in ("runs", "all")
    runs_total = args.runs_seconds if args.runs_seconds is not None else args.seconds
    runs_summaries: list[RunsSummary] = []
    rollout_part = args.scenario in ("rollout", "all")
    rollout_total = args.rollout_seconds if args.rollout_seconds is not None else args.seconds
    rollout_summaries: list[RolloutSummary] = []
    job_part = args.scenario in ("job", "all")
    job_total = args.job_seconds if args.job_seconds is not None else args.seconds
    job_summaries: list[JobSummary] = []

    def run_queue_on(target: str, shared: tuple[str, str] | None, seconds: float) -> None:
        from fault_injection.queue_campaign import QUEUE_CONTROLS
        from fault_injection.queue_fuzz import run_queue
        qs = run_queue(os.path.join(base, f"queue-{target}"), seconds=seconds,
                       n_workers=args.queue_workers, seed=seed, shared=shared, target=target,
                       control=args.control if args.control in QUEUE_CONTROLS else None)
        queue_summaries.append(qs)
        print(qs.line(), flush=True)

    def run_runs_on(target: str, shared: tuple[str, str] | None, seconds: float) -> None:
        from fault_injection.controls import RUNS_CONTROLS
        from fault_injection.runs_fuzz import run_runs
        rs = run_runs(os.path.join(base, f"runs-{target}"), seconds=seconds,
                      n_writers=args.runs_writers, n_workers=args.runs_writers, seed=seed,
                      shared=shared, target=target,
                      control=args.control if args.control in RUNS_CONTROLS else None)
        runs_summaries.append(rs)
        print(rs.line(), flush=True)

    def run_rollout_on(target: str, shared: tuple[str, str] | None, seconds: float) -> None:
        from fault_injection.rollout_fuzz import CONTROLS, run_rollout
        rs = run_rollout(os.path.join(base, f"rollout-{target}"), seconds=seconds, seed=seed,
                         shared=shared, target=target,
                         control=args.control if args.control in CONTROLS else None)
        rollout_summaries.append(rs)
        print(rs.line(), flush=True)

    def run_job_on(target: str, mount: str | None, seconds: float) -> None:
        from fault_injection.job_fuzz import CONTROLS, run_job
        js = run_job(os.path.join(base, f"job-{target}"), seconds=seconds, seed=seed,
                     mount=mount, target=target,
                     control=args.control if args.control in CONTROLS else None)
        job_summaries.append(js)
        print(js.line(), flush=True)

    try:
        store_jfs = store_part and args.juicefs != "no"
        queue_jfs = queue_part and args.queue_juicefs and args.juicefs != "no"
        runs_jfs = runs_part and args.juicefs != "no"
        rollout_jfs = rollout_part and args.juicefs != "no"
        job_jfs = job_part and args.juicefs != "no"
        want_jfs = store_jfs or queue_jfs or runs_jfs or rollout_jfs or job_jfs
        mounting = _juicefs(base) if want_jfs else contextlib.nullcontext("")
        with mounting as mounts:
            # the queue and shared-root scenarios' time is split between the filesystems
            queue_jfs = queue_jfs and not isinstance(mounts, str)
            queue_seconds = queue_total / 2 if queue_jfs else queue_total
            runs_jfs = runs_jfs and not isinstance(mounts, str)
            runs_seconds = runs_total / 2 if runs_jfs else runs_total
            rollout_jfs = rollout_jfs and not isinstance(mounts, str)
            rollout_seconds = rollout_total / 2 if rollout_jfs else rollout_total
            job_jfs = job_jfs and not isinstance(mounts, str)
            job_seconds = job_total / 2 if job_jfs else job_total
            if store_part:
                local = os.path.join(base, "local")
                summaries.append(run_target("local", local, local,
                                            os.path.join(base, "logs-local"),
                                            seconds=args.seconds, n_writers=args.writers,
                                            seed=seed, control=store_control))
                print(summaries[-1].line(), flush=True)
            if queue_part:
                run_queue_on("local", None, queue_seconds)
            if runs_part:
                run_runs_on("local", None, runs_seconds)
            if rollout_part:
                run_rollout_on("local", None, rollout_seconds)
            if job_part:
                run_job_on("local", None, job_seconds)
            if isinstance(mounts, str):
                if want_jfs:
                    notes.append(f"JuiceFS skipped: {(mounts.splitlines() or [''])[0]}")
                    if args.juicefs == "yes":
                        print(notes[-1])
                        return 1
            else:
                a, b = mounts
                if store_jfs:
                    s = run_target("juicefs", a, b, os.path.join(base, "logs-juicefs"),
                                   seconds=args.seconds, n_writers=args.writers, seed=seed,
                                   control=store_control)
                    summaries.append(s)
                    print(s.line(), flush=True)
                if queue_jfs:
                    run_queue_on("juicefs", (a, b), queue_seconds)
                if runs_jfs:
                    run_runs_on("juicefs", (a, b), runs_seconds)
                if rollout_jfs:
                    run_rollout_on("juicefs", (a, b), rollout_seconds)
                if job_jfs:
                    # one client: the save directory records absolute paths of its mount
                    run_job_on("juicefs", a, job_seconds)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    for n in notes:
        print(n)
    bad = [v for s in summaries for v in s.violations]
    bad += [v for q in queue_summaries for v in q.violations]
    bad += [v for r in runs_summaries for v in r.all_violations()]
    bad += [v for r in rollout_summaries for v in r.violations]
    bad += [v for j in job_summaries for v in j.violations]
    for v in bad[:20]:
        print("VIOLATION " + v)
    queue_text = "".join(
        f", queue/{q.target}: {q.worker_kills + q.coordinator_kills} kills, "
        f"{q.worker_stops + q.coordinator_stops} stops, {q.takeovers} takeovers, "
        f"{q.receipts} receipts verified" for q in queue_summaries)
    queue_text += "".join(
        f", runs/{r.target}: {sum(s.retained_verified for s in r.stores)} retained "
        f"submissions and {sum(q.receipts for q in r.queues)} receipts verified in two runs"
        for r in runs_summaries)
    queue_text += "".join(
        f", rollout/{r.target}: {sum(r.kills.values())} kills, {r.batches} batches trained, "
        f"{r.completed} accepted groups checked" for r in rollout_summaries)
    queue_text += "".join(
        f", job/{j.target}: {j.kills} kills, {sum(j.starts.values())} starts, "
        f"{j.replayed} batches replayed, {j.accepted} accepted groups checked"
        for j in job_summaries)
    print(f"fuzz summary: seed={seed}, {len(summaries)} filesystem(s), "
          f"{sum(s.kills for s in summaries)} kills, {sum(s.stops for s in summaries)} stops, "
          f"{sum(s.restarts for s in summaries)} restarts, "
          f"{sum(s.publications for s in summaries)} acknowledged publications verified"
          f"{queue_text}, {len(bad)} violations"
          + (f"; files in {base}" if args.keep or args.dir else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
