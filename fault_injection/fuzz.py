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

Each scenario is one row of ``SCENARIOS`` (its name, how to start it on one filesystem,
how to read its summary back); adding a scenario is adding a row and its options.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fault_injection.job_fuzz import JobSummary
from fault_injection.queue_fuzz import QueueSummary
from fault_injection.rollout_fuzz import RolloutSummary
from fault_injection.runs_fuzz import RunsSummary
from fault_injection.store_fuzz import Summary, run_target


@contextlib.contextmanager
def _juicefs(base: str) -> Iterator[tuple[str, str] | str]:
    """Two clients of a fresh JuiceFS volume, or the reason there are none."""
    try:
        from fault_injection.juicefs import JuiceFSUnavailable, mount_pair
    except ImportError as e:  # pragma: no cover - run from outside the repository
        yield f"cannot import fault_injection.juicefs: {e}"
        return
    try:
        with mount_pair(os.path.join(base, "juicefs")) as m:
            yield (m.a, m.b)
    except JuiceFSUnavailable as e:
        yield str(e)


Clients = tuple[str, str]
"""Two clients (mount points) of one JuiceFS volume."""


@dataclass(frozen=True)
class Fuzz:
    """What every scenario of one invocation shares: the options, the work directory and
    the seed."""

    args: argparse.Namespace
    base: str
    seed: int

    def control(self, controls: Collection[str]) -> str | None:
        """``--control`` when it names one of ``controls``, else None."""
        return self.args.control if self.args.control in controls else None


@dataclass(frozen=True)
class Scenario:
    """One ``--scenario``: a row of ``SCENARIOS``.

    ``start`` runs it once on one filesystem (``target`` "local" with no clients, or
    "juicefs" with the two clients) for the seconds given and returns its summary, whose
    ``line()`` is printed as it ends; ``violations`` and ``tally`` read a summary back for
    the verdict and the closing summary line.  ``seconds`` is the name of the option
    holding its total duration, split between the filesystems (None: ``--seconds`` on
    each); ``juicefs`` says whether the options let it run on JuiceFS too."""

    name: str
    start: Callable[[Fuzz, str, Clients | None, float], Any]
    violations: Callable[[Any], list[str]]
    tally: Callable[[Any], str]
    seconds: str | None = None
    juicefs: Callable[[argparse.Namespace], bool] = lambda args: True

    def total(self, args: argparse.Namespace) -> float:
        own = getattr(args, self.seconds) if self.seconds else None
        return own if own is not None else float(args.seconds)


def _start_store(f: Fuzz, target: str, clients: Clients | None, seconds: float) -> Summary:
    write, read = clients or (os.path.join(f.base, "local"),) * 2
    prefixes = tuple(f"{s.name}-" for s in SCENARIOS if s.name != "store")
    control = f.args.control if f.args.control and \
        not f.args.control.startswith(prefixes) else None
    return run_target(target, write, read, os.path.join(f.base, f"logs-{target}"),
                      seconds=seconds, n_writers=f.args.writers, seed=f.seed, control=control)


def _start_queue(f: Fuzz, target: str, clients: Clients | None,
                 seconds: float) -> QueueSummary:
    from fault_injection.queue_campaign import QUEUE_CONTROLS
    from fault_injection.queue_fuzz import run_queue
    return run_queue(os.path.join(f.base, f"queue-{target}"), seconds=seconds,
                     n_workers=f.args.queue_workers, seed=f.seed, shared=clients, target=target,
                     control=f.control(QUEUE_CONTROLS))


def _start_runs(f: Fuzz, target: str, clients: Clients | None, seconds: float) -> RunsSummary:
    from fault_injection.controls import RUNS_CONTROLS
    from fault_injection.runs_fuzz import run_runs
    return run_runs(os.path.join(f.base, f"runs-{target}"), seconds=seconds,
                    n_writers=f.args.runs_writers, n_workers=f.args.runs_writers, seed=f.seed,
                    shared=clients, target=target, control=f.control(RUNS_CONTROLS))


def _start_rollout(f: Fuzz, target: str, clients: Clients | None,
                   seconds: float) -> RolloutSummary:
    from fault_injection.rollout_fuzz import CONTROLS, run_rollout
    return run_rollout(os.path.join(f.base, f"rollout-{target}"), seconds=seconds, seed=f.seed,
                       shared=clients, target=target, control=f.control(CONTROLS))


def _start_job(f: Fuzz, target: str, clients: Clients | None, seconds: float) -> JobSummary:
    from fault_injection.job_fuzz import CONTROLS, run_job
    # one client: the save directory records absolute paths of its mount
    return run_job(os.path.join(f.base, f"job-{target}"), seconds=seconds, seed=f.seed,
                   mount=clients[0] if clients else None, target=target,
                   control=f.control(CONTROLS))


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("store", _start_store, lambda s: s.violations, lambda s: ""),
    Scenario("queue", _start_queue, lambda q: q.violations,
             lambda q: f", queue/{q.target}: {q.worker_kills + q.coordinator_kills} kills, "
                       f"{q.worker_stops + q.coordinator_stops} stops, {q.takeovers} "
                       f"takeovers, {q.receipts} receipts verified",
             seconds="queue_seconds", juicefs=lambda args: args.queue_juicefs),
    Scenario("runs", _start_runs, lambda r: r.all_violations(),
             lambda r: f", runs/{r.target}: {sum(s.retained_verified for s in r.stores)} "
                       f"retained submissions and {sum(q.receipts for q in r.queues)} "
                       f"receipts verified in two runs",
             seconds="runs_seconds"),
    Scenario("rollout", _start_rollout, lambda r: r.violations,
             lambda r: f", rollout/{r.target}: {sum(r.kills.values())} kills, {r.batches} "
                       f"batches trained, {r.completed} accepted groups checked",
             seconds="rollout_seconds"),
    Scenario("job", _start_job, lambda j: j.violations,
             lambda j: f", job/{j.target}: {j.kills} kills, {sum(j.starts.values())} starts, "
                       f"{j.replayed} batches replayed, {j.accepted} accepted groups checked",
             seconds="job_seconds"),
)
"""The scenarios, in the order they run on each filesystem and are summed up.  A
``--control`` whose name starts with ``<scenario>-`` is that scenario's; any other is the
store's."""


def _parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--scenario", choices=(*(s.name for s in SCENARIOS), "all"),
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
    return ap


def _run(f: Fuzz, results: dict[str, list[Any]], notes: list[str]) -> int:
    """Every chosen scenario on the local directory, then on JuiceFS where it runs; 1
    when JuiceFS is required and missing."""
    args = f.args
    chosen = [s for s in SCENARIOS if args.scenario in (s.name, "all")]
    on_juicefs = [s for s in chosen if args.juicefs != "no" and s.juicefs(args)]
    mounting = _juicefs(f.base) if on_juicefs else contextlib.nullcontext("")
    with mounting as mounts:
        juicefs = [] if isinstance(mounts, str) else on_juicefs

        def run_on(s: Scenario, target: str, clients: Clients | None) -> None:
            # a total duration is split between the filesystems it runs on
            seconds = s.total(args) / 2 if s.seconds and s in juicefs else s.total(args)
            summary = s.start(f, target, clients, seconds)
            results[s.name].append(summary)
            print(summary.line(), flush=True)

        for s in chosen:
            run_on(s, "local", None)
        if isinstance(mounts, str):
            if on_juicefs:
                notes.append(f"JuiceFS skipped: {(mounts.splitlines() or [''])[0]}")
                if args.juicefs == "yes":
                    print(notes[-1])
                    return 1
        else:
            for s in juicefs:
                run_on(s, "juicefs", mounts)
    return 0


def _summary(f: Fuzz, results: dict[str, list[Any]], bad: list[str]) -> str:
    stores: list[Summary] = results["store"]
    tallies = "".join(s.tally(x) for s in SCENARIOS for x in results[s.name])
    return (f"fuzz summary: seed={f.seed}, {len(stores)} filesystem(s), "
            f"{sum(s.kills for s in stores)} kills, {sum(s.stops for s in stores)} stops, "
            f"{sum(s.restarts for s in stores)} restarts, "
            f"{sum(s.publications for s in stores)} acknowledged publications verified"
            f"{tallies}, {len(bad)} violations"
            + (f"; files in {f.base}" if f.args.keep or f.args.dir else ""))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    base = args.dir or tempfile.mkdtemp(prefix="straw-fuzz-")
    os.makedirs(base, exist_ok=True)
    f = Fuzz(args, base, seed)
    results: dict[str, list[Any]] = {s.name: [] for s in SCENARIOS}
    notes: list[str] = []
    try:
        if _run(f, results, notes):
            return 1
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    for n in notes:
        print(n)
    bad = [v for s in SCENARIOS for x in results[s.name] for v in s.violations(x)]
    for v in bad[:20]:
        print("VIOLATION " + v)
    print(_summary(f, results, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
