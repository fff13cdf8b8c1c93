"""Crash campaigns (``just crash``, ``python -m fault_injection.campaigns``).

Role: verification layer 6 of DESIGN.md.  For each fixed store workload
(``fault_injection.workloads``: publish of several sizes, publish_many with index and ref
dependencies, seal and rotation, writer restart, retention and garbage collection through
the catalog), with space reservation and without:

* a probe run records the workload's trace of filesystem ops;
* for every op of the trace, crash *before* it and *after* it (plus the completed run),
  and for each such crash point every *mode*:

  - ``power/<variant>/<k>``: power loss with each SimFS persistence variant
    (``clear-cache``; ``torn-seq`` and ``torn-op`` sampled with several seeds, since their
    subsets explode);
  - ``kill``: SIGKILL of the process (page cache survives);
  - ``kill+power/<variant>/<k>``: SIGKILL, recovery (whose lookups and retries are then
    acknowledged too), then a power loss, then a second recovery -- recovery itself
    must make what it hands out durable;
  - ``power+recrash/<variant>/<k>``: power loss, a crash at a seeded op of the recovery
    (and its check), a second power loss, a second recovery;

* after each, ``workloads.recover_and_check`` reopens a store on what survived and checks
  it against the acknowledgement log kept by the workload driver; then a clean restart
  checks it once more against what that recovery acknowledged (lookups stay stable).

The journal campaign (``fault_injection.journal_campaign``) and the coordinator campaign
(``fault_injection.queue_campaign``: submit/acquire/complete/fail/yield/release, clean
recovery, snapshots, garbage collection and a takeover of a paused coordinator, checked by
recovering a coordinator: acknowledged receipts survive, no task is accepted twice,
acknowledged submissions' tasks exist, recovery raises nothing) run the same way, with
their own modes, and count in the totals; their negative controls join the others.  Both
add the damage modes ``kill+damage/<kind>`` (``journal_campaign.damage_journal``: a
flipped byte in the newest journal transaction, the newest segment or every segment of
the newest epoch deleted), where recovery must raise ``CorruptData`` or lose nothing
acknowledged; the controls without confirm records, rotated records or started epochs
must be caught by them.

Each state runs on a fresh ``SimFS`` whose seed is derived from the state's key
(``workload:r<reserve>:<nth>:<when>:<mode>``), so a violation replays exactly with
``--replay KEY``.  Plus the frame campaign (``fault_injection.frames``), and the negative
controls (``fault_injection.controls``): each campaign is rerun on deliberately broken
variants of the engine and must report a violation for each of them.

Exit status 1 on any violation or on any negative control that was not caught.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from fault_injection.controls import FRAME_CONTROLS, STORE_CONTROLS
from fault_injection.frames import run_frame_campaign
from fault_injection.journal_campaign import FULL_MODES as JOURNAL_FULL_MODES
from fault_injection.journal_campaign import QUICK_MODES as JOURNAL_QUICK_MODES
from fault_injection.journal_campaign import run_journal_campaign, run_journal_controls
from fault_injection.queue_campaign import FULL_MODES as QUEUE_FULL_MODES
from fault_injection.queue_campaign import QUICK_MODES as QUEUE_QUICK_MODES
from fault_injection.queue_campaign import run_queue_campaign, run_queue_controls
from fault_injection.simfs import SimFS
from fault_injection.sweep import WorkloadReport, crash_points, run_crash_state, state_seed, sweep
from fault_injection.workloads import (
    Driver,
    Violation,
    Workload,
    recover_and_check,
    workloads,
)

RESERVES = (64 * 1024, 0)
RECRASH_WINDOW = 50  # a recovery + its check makes some 40-90 ops

FULL_MODES: tuple[str, ...] = (
    "power/clear-cache/0",
    "power/torn-seq/0", "power/torn-seq/1",
    "power/torn-op/0", "power/torn-op/1", "power/torn-op/2", "power/torn-op/3",
    "kill",
    "kill+power/clear-cache/0", "kill+power/torn-op/0",
    "power+recrash/clear-cache/0", "power+recrash/torn-op/0", "power+recrash/torn-seq/0",
)  # fmt: skip
"""Modes per crash point for ``just crash``."""

QUICK_MODES: tuple[str, ...] = (
    "power/clear-cache/0", "power/torn-seq/0", "power/torn-op/0", "kill",
    "kill+power/clear-cache/0", "power+recrash/torn-op/0",
)  # fmt: skip
"""Modes per crash point for the bounded test-suite campaign."""


def _ops_of(wl: Workload) -> int:
    probe = SimFS(0)
    wl.run(Driver(probe, wl.params))
    return probe.op_count


def run_state(wl: Workload, nth: int | None, when: str, mode: str, key: str) -> str | None:
    """One crash state: run ``wl`` on a fresh SimFS with a crash point at op ``nth``
    (None: run to completion), apply ``mode``, recover and check.  Returns a violation
    message or None."""
    sim = SimFS(state_seed(key))
    if nth is not None:
        sim.crash_at(nth, when=when)
    d = Driver(sim, wl.params)
    return run_crash_state(sim, key, mode, lambda: wl.run(d), d.log,
                           functools.partial(recover_and_check, sim, wl.params), kill=("main",),
                           recrash_window=RECRASH_WINDOW, violation=Violation,
                           module="fault_injection.campaigns")


def run_workload(wl: Workload, reserve: int, modes: Sequence[str], *,
                 stop_at_first: bool = False, max_points: int | None = None) -> WorkloadReport:
    """Every crash point of ``wl`` x every mode."""
    name = f"{wl.name}:r{reserve}"
    return sweep(name, name, crash_points(_ops_of(wl), max_points), modes,
                 lambda nth, when, mode, key: run_state(wl, nth, when, mode, key),
                 stop_at_first=stop_at_first)


def run_store_campaign(modes: Sequence[str], *, reserves: Iterable[int] = RESERVES,
                       only: Iterable[str] | None = None, stop_at_first: bool = False,
                       max_points: int | None = None,
                       log: Callable[[str], None] = print) -> list[WorkloadReport]:
    reports = []
    wanted = set(only) if only is not None else None
    for reserve in reserves:
        for wl in workloads(reserve):
            if wanted is not None and wl.name not in wanted:
                continue
            r = run_workload(wl, reserve, modes, stop_at_first=stop_at_first,
                             max_points=max_points)
            reports.append(r)
            log(f"  {r.name:<22} crash points {r.crash_points:>4}  states {r.states:>6}  "
                f"violations {len(r.violations):>3}  {r.seconds:6.1f}s")
            if stop_at_first and r.violations:
                return reports
    return reports


def replay(key: str) -> str | None:
    """Rerun one state from its key (as printed with a violation)."""
    wl_name, r, nth, when, mode = key.split(":", 4)
    reserve = int(r.removeprefix("r"))
    wl = next(w for w in workloads(reserve) if w.name == wl_name)
    return run_state(wl, None if nth == "end" else int(nth), when, mode, key)


@dataclass
class ControlResult:
    name: str
    campaign: str
    caught: bool
    detail: str
    seconds: float


def _catch_store_control(control: Callable[[], AbstractContextManager[None]],
                         modes: Sequence[str], max_points: int | None) -> tuple[str, int]:
    """Run the store campaign under ``control`` until a state shows a violation that the
    unpatched engine does not show in the same state (so that a bug of the engine itself
    never passes for a caught control).  Returns (first such violation or "", states)."""
    states = 0
    for reserve in RESERVES:
        for wl in workloads(reserve):
            for nth, when in crash_points(_ops_of(wl), max_points):
                for mode in modes:
                    key = f"{wl.name}:r{reserve}:{nth if nth is not None else 'end'}:{when}:{mode}"
                    states += 1
                    with control():
                        msg = run_state(wl, nth, when, mode, key)
                    if msg is not None and run_state(wl, nth, when, mode, key) is None:
                        return msg, states
    return "", states


def run_controls(modes: Sequence[str], *, max_points: int | None = None,
                 log: Callable[[str], None] = print) -> list[ControlResult]:
    """Each negative control against its campaign(s); each must be caught."""
    results = []
    for name, control in STORE_CONTROLS.items():
        t0 = time.perf_counter()
        found, states = _catch_store_control(control, modes, max_points)
        detail = found.splitlines()[0] if found else f"NOT caught in {states} states"
        results.append(ControlResult(name, "store", bool(found), detail,
                                     time.perf_counter() - t0))
    baseline = run_frame_campaign()
    for name, control in FRAME_CONTROLS.items():
        t0 = time.perf_counter()
        with control():
            fr = run_frame_campaign()
        new = [v for v in fr.violations if v not in baseline.violations]
        detail = new[0] if new else f"NOT caught in {fr.checks} checks"
        results.append(ControlResult(name, "frame", bool(new), detail,
                                     time.perf_counter() - t0))
    for c in results:
        log(f"  {'caught' if c.caught else 'MISSED':<7} {c.campaign:<6} {c.name:<27} "
            f"{c.seconds:5.1f}s  {c.detail[:110]}")
    return results


def classify(violations: Sequence[str]) -> dict[str, list[str]]:
    """Group violation reports by their message with keys, refs, ids and numbers blanked."""
    out: dict[str, list[str]] = {}
    for v in violations:
        first = v.splitlines()[0]
        sig = re.sub(r"^\[[^\]]*\] ", "", first)
        sig = re.sub(r"RecordSetRef\([^)]*\)", "REF", sig)
        sig = re.sub(r"'[^']*'", "'..'", sig)
        sig = re.sub(r"\d+", "N", sig)[:240]
        out.setdefault(sig, []).append(v)
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))


def _all_controls(max_points: int | None) -> list[ControlResult]:
    """Every campaign's negative controls, run and reported."""
    print("negative controls (each must be caught):")
    controls = run_controls(QUICK_MODES, max_points=max_points)
    for campaign, run in (("journal", run_journal_controls),
                          ("queue", run_queue_controls)):
        t0c = time.perf_counter()
        found = run(max_points=max_points)
        per = (time.perf_counter() - t0c) / max(1, len(found))
        controls += [ControlResult(name, campaign, v is not None,
                                   (v or "NOT caught").splitlines()[0], per)
                     for name, v in found.items()]
    return controls


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fault_injection.campaigns",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="fewer modes per crash point (the test-suite budget)")
    ap.add_argument("--workload", action="append",
                    help="only these workloads (repeatable): store workload names, "
                         "journal-<name> (fault_injection.journal_campaign) and queue-<name> "
                         "(fault_injection.queue_campaign)")
    ap.add_argument("--max-points", type=int, default=None,
                    help="sample at most this many crash points per workload")
    ap.add_argument("--no-controls", action="store_true", help="skip the negative controls")
    ap.add_argument("--replay", metavar="KEY", help="rerun one crash state and print it")
    args = ap.parse_args(argv)
    if args.replay:
        msg = replay(args.replay)
        print(msg or f"{args.replay}: no violation")
        return 1 if msg else 0
    modes = QUICK_MODES if args.quick else FULL_MODES
    t0 = time.perf_counter()
    print(f"store crash campaign: {len(modes)} modes per crash point "
          f"(before and after every op of each workload, and the completed run)")
    wanted = args.workload

    def only(prefix: str) -> list[str] | None:
        if wanted is None:
            return None
        return [w.removeprefix(prefix) for w in wanted if w.startswith(prefix)]

    reports: list[WorkloadReport] = run_store_campaign(
        modes, only=[w for w in wanted if not w.startswith(("journal-", "queue-"))]
        if wanted is not None else None, max_points=args.max_points)
    print("frame campaign:")
    fr = run_frame_campaign()
    print(f"  frames (5 types) + pack file   checks {fr.checks:>6}  violations "
          f"{len(fr.violations):>3}  {fr.seconds:6.1f}s")
    jmodes = JOURNAL_QUICK_MODES if args.quick else JOURNAL_FULL_MODES
    print(f"journal crash campaign: {len(jmodes)} modes per crash point")
    jreports = run_journal_campaign(jmodes, only=only("journal-"), max_points=args.max_points)
    qmodes = QUEUE_QUICK_MODES if args.quick else QUEUE_FULL_MODES
    print(f"coordinator crash campaign: {len(qmodes)} modes per crash point")
    qreports = run_queue_campaign(qmodes, only=only("queue-"), max_points=args.max_points)
    others: list[Any] = [*jreports, *qreports]
    violations = ([v for r in reports for v in r.violations] + fr.violations
                  + [v for r in others for v in r.violations])
    controls = [] if args.no_controls else _all_controls(args.max_points)
    missed = [c for c in controls if not c.caught]
    classes = classify(violations)
    for sig, examples in classes.items():
        print(f"\nVIOLATION CLASS ({len(examples)} states): {sig}\n  first: {examples[0]}")
    states = sum(r.states for r in reports) + sum(r.states for r in others)
    points = sum(r.crash_points for r in reports) + sum(r.crash_points for r in others)
    print(f"\nsummary: {len(reports) + len(others)} workload runs (store "
          f"{sum(r.states for r in reports)} states, journal "
          f"{sum(r.states for r in jreports)}, coordinator {sum(r.states for r in qreports)}), "
          f"{points} crash points, {states} crash "
          f"states checked, {fr.checks} frame checks, {len(violations)} violations; "
          f"negative controls caught {len(controls) - len(missed)}/{len(controls)}; "
          f"{time.perf_counter() - t0:.1f}s")
    if missed:
        print("MISSED negative controls: " + ", ".join(c.name for c in missed))
    return 1 if violations or missed else 0


if __name__ == "__main__":
    sys.exit(main())
