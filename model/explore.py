"""Exhaustive breadth-first explorer of the straw specification, with mutants.

Role: enumerate every reachable state of a bounded configuration (`spec.config`), check every
state invariant in every state and every step invariant on every transition
(`spec.invariants`), then check liveness on the finished graph. Breadth-first order makes the
first counterexample a shortest one; it is printed as a numbered list of actions.

Liveness on a bounded graph: property L holds when from *every* reachable state some path of
L's fair actions reaches a goal state (AG EF goal, restricted to fair actions). Computed by a
backward search from the goal states over the fair edges; a reachable state it does not reach is
a counterexample (reported with the shortest trace to it). Fairness assumption: the actions of
L's fair set keep being taken while enabled (weak fairness); faults, producers and cancellation
are not assumed to happen.

Two machines are explored: the queue protocol (`spec/actions.py`: publication, retention, GC,
queue, leases, coordinators) and the rollout layer above it (`spec/rollout.py`, RL1-RL12:
admission, generation, batches, checkpoints, forks and salvage, the resume's selection, and
the environment mix's progress); each brings its own configurations, invariants, liveness
properties and mutants (`Machine`).

Usage:
    python -m model.explore [--machine queue|rollout|all] [--config small|full] [--mutants]
                            [--only MUTANT] [--jobs N]

Exit status 1 when the correct protocol has a counterexample, or with --mutants when a mutant
survives (no counterexample in any configuration). Mutants are hunted on the small bounds first,
then on the requested ones; the correct protocol is explored at the requested bounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import spec.rollout as rollout
from spec.actions import Action, successors
from spec.config import CONFIGS
from spec.invariants import LIVENESS, check_state, check_step
from spec.mutants import CORRECT, MUTANT_NAMES, mutant
from spec.state import initial_state

CONFIG_SETS: dict[str, tuple[str, ...]] = {
    "small": ("gc-small", "queue-small", "queue-preempt", "order-small", "share", "consume",
              "restore", "catalog", "history", "release-closure"),
    "full": ("gc-full", "queue-full", "queue-preempt", "order-full", "share", "consume",
             "restore", "catalog", "history", "release-closure"),
}

# Where each mutant is expected to be caught first (the other configurations are tried after).
MUTANT_HOME: dict[str, str] = {
    "reply_before_fsync": "gc",
    "dependency_not_protected": "gc",
    "collect_without_lock": "gc",
    "gc_ignores_dependencies": "gc",
    "unlink_before_tombstone": "gc",
    "reclaimed_path_reused": "gc",
    "retain_ignores_tombstone": "gc",
    "interrupted_collection_abandoned": "gc",
    "journal_before_retain": "queue",
    "staging_released_before_journal": "queue",
    "release_closure_unchecked": "release",
    "release_removes_shared_root": "share",
    "pin_dropped_on_expiry": "queue",
    "checkpoint_rewind_without_readopt": "share",
    "sparse_ack_ignores_checkpoint": "consume",
    "restore_without_readopt": "consume",
    "restore_skips_usable_check": "restore",
    "lease_grant_not_journaled": "queue",
    "expired_lease_commits": "queue",
    "combined_commit_skips_liveness": "queue",
    "combined_grant_without_read_pin": "order",
    "retry_without_idempotency": "queue",
    "fencing_skipped": "queue",
    "epoch_not_durable_before_service": "queue",
    "lease_attempt_not_incremented": "queue",
    "order_ignores_priority": "order",
    "expired_task_never_requeued": "queue",
    "retire_spends_no_budget": "queue",
    "recovery_spends_no_budget": "queue",
    "request_retry_refused": "queue",
    "catalog_truncated_before_snapshot_durable": "catalog",
    "compaction_drops_suffix": "catalog",
    "old_snapshot_deleted_early": "catalog",
    "history_snapshot_before_segment_durable": "history",
    "history_deleted_before_snapshot": "history",
}


# Mutants only a liveness check catches: they need the whole graph, so they run first.
LIVENESS_MUTANTS = frozenset({"interrupted_collection_abandoned", "expired_task_never_requeued"})


@dataclass(frozen=True)
class Machine:
    """One specification to explore: its transition relation, checks and mutants."""

    name: str
    configs: dict[str, Any]
    config_sets: dict[str, tuple[str, ...]]
    initial_state: Callable[[Any], Any]
    successors: Callable[[Any, Any, Any], Iterator[tuple[Action, Any]]]
    check_state: Callable[[Any, Any], tuple[str, str] | None]
    check_step: Callable[[Any, Any, Action, Any], tuple[str, str] | None]
    liveness: tuple[Any, ...]
    correct: Any
    mutant: Callable[[str], Any]
    mutant_names: tuple[str, ...]
    mutant_home: dict[str, str]
    liveness_mutants: frozenset[str]


QUEUE = Machine("queue", CONFIGS, CONFIG_SETS, initial_state, successors, check_state, check_step,
                LIVENESS, CORRECT, mutant, MUTANT_NAMES, MUTANT_HOME, LIVENESS_MUTANTS)
ROLLOUT = Machine("rollout", rollout.CONFIGS, rollout.CONFIG_SETS, rollout.initial_state,
                  rollout.successors, rollout.check_state, rollout.check_step,
                  rollout.LIVENESS, rollout.CORRECT, rollout.mutant, rollout.MUTANT_NAMES,
                  rollout.MUTANT_HOME, rollout.LIVENESS_MUTANTS)
MACHINES: dict[str, Machine] = {m.name: m for m in (QUEUE, ROLLOUT)}


@dataclass
class Violation:
    iid: str
    message: str
    trace: list[Action]

    def render(self) -> str:
        lines = [f"  {i}. {a}" for i, a in enumerate(self.trace, 1)]
        return "\n".join([f"violates {self.iid}: {self.message}", *lines])


@dataclass
class Result:
    config: str
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    violation: Violation | None = None
    liveness_checked: list[str] = field(default_factory=list)


def _trace(parent: list[tuple[int, Action] | None], sid: int) -> list[Action]:
    out: list[Action] = []
    node = parent[sid]
    while node is not None:
        pid, action = node
        out.append(action)
        node = parent[pid]
    out.reverse()
    return out


def explore(
    cfg: Any, mut: Any = None, *, liveness: bool = True, max_states: int | None = None,
    machine: Machine = QUEUE,
) -> Result:
    """Breadth-first search of cfg under protocol mut (the machine's correct protocol when
    None). Stops at the first safety violation (a shortest one); otherwise checks liveness
    (unless disabled) on the whole graph."""
    t0 = time.perf_counter()
    if mut is None:
        mut = machine.correct
    successors, check_state, check_step = (machine.successors, machine.check_state,
                                           machine.check_step)
    res = Result(cfg.name)
    init = machine.initial_state(cfg)
    index: dict[Any, int] = {init: 0}
    states: list[Any] = [init]
    parent: list[tuple[int, Action] | None] = [None]
    props = [p for p in machine.liveness if liveness and p.applies(cfg)]
    rev: list[list[list[int]]] = [[[]] for _ in props]  # per property: fair predecessors

    bad = check_state(cfg, init)
    if bad is not None:
        res.violation = Violation(bad[0], bad[1], [])
    queue: deque[int] = deque([0])
    while queue and res.violation is None:
        sid = queue.popleft()
        s = states[sid]
        for action, s2 in successors(cfg, mut, s):
            res.transitions += 1
            step_bad = check_step(cfg, s, action, s2)
            if step_bad is not None:
                res.violation = Violation(step_bad[0], step_bad[1], _trace(parent, sid) + [action])
                break
            nid = index.get(s2)
            if nid is None:
                nid = len(states)
                index[s2] = nid
                states.append(s2)
                parent.append((sid, action))
                for r in rev:
                    r.append([])
                bad = check_state(cfg, s2)
                if bad is not None:
                    res.violation = Violation(bad[0], bad[1], _trace(parent, nid))
                    break
                queue.append(nid)
                if max_states is not None and len(states) > max_states:
                    raise RuntimeError(f"{cfg.name}: more than {max_states} states")
            for k, prop in enumerate(props):
                if prop.fair(action):
                    rev[k][nid].append(sid)
    res.states = len(states)

    if res.violation is None:
        for k, prop in enumerate(props):
            ok = bytearray(len(states))
            work = [i for i, st in enumerate(states) if prop.goal(cfg, st)]
            for i in work:
                ok[i] = 1
            while work:
                i = work.pop()
                for j in rev[k][i]:
                    if not ok[j]:
                        ok[j] = 1
                        work.append(j)
            res.liveness_checked.append(prop.iid)
            stuck = next((i for i in range(len(states)) if not ok[i]), None)
            if stuck is not None:
                res.violation = Violation(
                    prop.iid,
                    f"from the state after this trace no fair path reaches: {prop.description}",
                    _trace(parent, stuck),
                )
                break
    res.seconds = time.perf_counter() - t0
    return res


def _family(name: str) -> str:
    return name.split("-")[0]


def _correct_job(machine: str, name: str) -> Result:
    m = MACHINES[machine]
    return explore(m.configs[name], m.correct, machine=m)


def _mutant_job(machine: str, name: str, config_names: tuple[str, ...]
                ) -> tuple[str, Result | None]:
    return hunt_mutant(name, config_names, machine=MACHINES[machine])


def hunt_mutant(name: str, config_names: Sequence[str], *, machine: Machine = QUEUE
                ) -> tuple[str, Result | None]:
    """Search for a counterexample of mutant `name`: the small bounds first (a counterexample
    there is one of the protocol, and it is cheaper), then the requested configurations; within
    each group the mutant's home (a configuration, or a family of them) first. The first
    counterexample wins."""
    home = machine.mutant_home.get(name, "")

    def away(c: str) -> bool:
        return home not in (c, _family(c))

    small = list(machine.config_sets["small"])
    rest = [c for c in config_names if c not in small]
    ordered = sorted(small, key=away)
    ordered += sorted(rest, key=away)
    last: Result | None = None
    for cname in ordered:
        res = explore(machine.configs[cname], machine.mutant(name), machine=machine)
        last = res
        if res.violation is not None:
            return cname, res
    return "", last


def report_correct(results: Sequence[Result], out: list[str]) -> bool:
    ok = True
    for res in results:
        live = ",".join(res.liveness_checked) or "-"
        out.append(
            f"correct  {res.config:12s} states={res.states:8d} transitions={res.transitions:9d} "
            f"seconds={res.seconds:7.2f} liveness={live}"
        )
        if res.violation is not None:
            ok = False
            out.append(f"COUNTEREXAMPLE in the correct protocol ({res.config}):")
            out.append(res.violation.render())
    out.append(
        f"correct  {'total':12s} states={sum(r.states for r in results):8d} "
        f"transitions={sum(r.transitions for r in results):9d} "
        f"seconds={sum(r.seconds for r in results):7.2f}"
    )
    return ok


def report_mutants(hunted: Sequence[tuple[str, tuple[str, Result | None]]], out: list[str]) -> bool:
    ok = True
    for name, (cname, res) in hunted:
        if res is None or res.violation is None:
            ok = False
            out.append(f"mutant   {name:34s} SURVIVED (no counterexample)")
            continue
        v = res.violation
        out.append(
            f"mutant   {name:34s} caught by {v.iid:3s} in {cname:12s} "
            f"trace length {len(v.trace):2d} ({res.states} states, {res.seconds:.2f}s)"
        )
        out.extend("    " + line for line in v.render().splitlines())
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m model.explore", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("--machine", choices=[*MACHINES, "all"], default="all")
    ap.add_argument("--config", choices=sorted(CONFIG_SETS), default="small")
    ap.add_argument("--mutants", action="store_true", help="also run every mutant")
    ap.add_argument("--only", help="run just this mutant (of the machines selected)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes (default: min(2, CPUs))",
    )
    args = ap.parse_args(argv)
    machines = list(MACHINES.values()) if args.machine == "all" else [MACHINES[args.machine]]
    if args.only:
        machines = [m for m in machines if args.only in m.mutant_names]
        if not machines:
            ap.error(f"unknown mutant {args.only!r}")

    t0 = time.perf_counter()
    ok = True
    caught = total = 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        # Submit every machine's work first, the expensive runs (full explorations, liveness
        # mutants) before the cheap ones, then report machine by machine.
        jobs = []
        for m in machines:
            config_names = m.config_sets[args.config]
            mutant_names: list[str] = []
            if args.only:
                mutant_names = [args.only]
            elif args.mutants:
                mutant_names = list(m.mutant_names)
            correct_names = [] if args.only else list(config_names)
            correct_f = {n: pool.submit(_correct_job, m.name, n) for n in correct_names}
            expensive = [x for x in mutant_names if x in m.liveness_mutants]
            cheap = [x for x in mutant_names if x not in m.liveness_mutants]
            mutant_f = {x: pool.submit(_mutant_job, m.name, x, config_names)
                        for x in expensive + cheap}
            jobs.append((m, correct_names, correct_f, mutant_names, mutant_f))
        for m, correct_names, correct_f, mutant_names, mutant_f in jobs:
            if len(machines) > 1:
                print(f"== {m.name} ==", flush=True)
            if correct_names:
                lines: list[str] = []
                ok = report_correct([correct_f[n].result() for n in correct_names], lines) and ok
                print("\n".join(lines), flush=True)
            if mutant_names:
                lines = []
                hunted = [(x, mutant_f[x].result()) for x in mutant_names]
                ok = report_mutants(hunted, lines) and ok
                print("\n".join(lines), flush=True)
                caught += sum(1 for _, (_, r) in hunted if r is not None and r.violation)
                total += len(mutant_names)
    summary = f"{caught}/{total} mutants caught; " if total else ""
    print(f"{'OK' if ok else 'FAILED'}: {summary}wall time {time.perf_counter() - t0:.1f}s")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
