"""What every crash campaign repeats: the crash points of a workload (before and after each
of its ops, plus "ran to completion"), optional even sampling of them, the sweep of
points x modes into a report, the crash modes themselves (``run_crash_state``), the
negative-control loop (``catch_controls``) and the command line of the journal and
coordinator campaigns (``campaign_main``).  A campaign supplies its workloads, its driver
and its check."""

from __future__ import annotations

import argparse
import random
import time
import traceback
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from fault_injection.rules import SimulatedCrash
from fault_injection.simfs import SimFS

L = TypeVar("L", bound="AckLog")


class AckLog(Protocol):
    """A workload driver's acknowledgement log."""

    def copy(self: L) -> L: ...


@dataclass
class WorkloadReport:
    name: str
    crash_points: int = 0
    states: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def state_seed(key: str) -> int:
    """The SimFS seed of one crash state: a function of its replay key only."""
    return zlib.crc32(key.encode())


def crash_points(n_ops: int, max_points: int | None = None) -> list[tuple[int | None, str]]:
    """(nth op, "before"|"after") for every op, then (None, "complete"); with
    ``max_points``, an even sample that always keeps the completed run."""
    pts: list[tuple[int | None, str]] = []
    for nth in range(1, n_ops + 1):
        pts.append((nth, "before"))
        pts.append((nth, "after"))
    pts.append((None, "complete"))
    if max_points is not None and len(pts) > max_points:
        step = len(pts) / max_points
        pts = [pts[int(i * step)] for i in range(max_points)] + [pts[-1]]
    return pts


RunState = Callable[[int | None, str, str, str], "str | None"]  # (nth, when, mode, key)


def sweep(name: str, key_prefix: str, points: Sequence[tuple[int | None, str]],
          modes: Sequence[str], run_state: RunState, *,
          stop_at_first: bool = False) -> WorkloadReport:
    """Run every point x mode; keys are ``<prefix>:<nth|end>:<when>:<mode>``."""
    t0 = time.perf_counter()
    report = WorkloadReport(name, crash_points=len(points))
    for nth, when in points:
        for mode in modes:
            key = f"{key_prefix}:{nth if nth is not None else 'end'}:{when}:{mode}"
            report.states += 1
            msg = run_state(nth, when, mode, key)
            if msg is not None:
                report.violations.append(msg)
                if stop_at_first:
                    report.seconds = time.perf_counter() - t0
                    return report
    report.seconds = time.perf_counter() - t0
    return report


def run_all(names: Sequence[str], run_one: Callable[[str], WorkloadReport], *,
            only: Sequence[str] | None = None, stop_at_first: bool = False,
            log: Callable[[str], None] = print) -> list[WorkloadReport]:
    """Run the named workloads (or the ``only`` ones), logging one line per workload."""
    reports = []
    for name in names:
        if only is not None and name not in only:
            continue
        r = run_one(name)
        reports.append(r)
        log(f"  {r.name:<24} crash points {r.crash_points:>4}  states {r.states:>6}  "
            f"violations {len(r.violations):>3}  {r.seconds:6.1f}s")
        if stop_at_first and r.violations:
            break
    return reports


def is_simulated_crash(exc: BaseException) -> bool:
    return isinstance(exc, SimulatedCrash)


def run_crash_state(sim: SimFS, key: str, mode: str, run: Callable[[], object], log: L,
                    check: Callable[[L, str, L | None], L], *, kill: Sequence[str],
                    recrash_window: int, violation: type[Exception], module: str,
                    is_crash: Callable[[BaseException], bool] = is_simulated_crash,
                    damage: Callable[[str], str] | None = None,
                    fail_closed: tuple[type[Exception], ...] = ()) -> str | None:
    """One crash state: ``run`` the workload on ``sim`` (its crash point already armed;
    ``log`` is the driver's acknowledgement log, which the workload updates in place),
    apply ``mode``, check what survived with ``check(log, fresh_tag, out)``, then check
    once more after a clean restart.  Returns a violation message or None.

    Modes: ``power/<variant>/<k>`` (power loss), ``kill`` (the ``kill`` clients are
    killed: the page cache survives), ``kill+power/<variant>/<k>`` (kill, recovery +
    check, power loss, check again), ``power+recrash/<variant>/<k>`` (power loss, a crash
    at a seeded op among the first ``recrash_window`` of the recovery and its check, power
    loss, check again), ``kill+damage/<kind>`` (kill, then ``damage(kind)`` damages
    synced data the way a bad disk or an operator might -- a flipped byte, deleted files
    -- and the check must either raise one of ``fail_closed`` (refusing the damaged data,
    D6) or find everything acknowledged).  A crash counts as one where ``is_crash`` says
    so; ``violation`` is the campaign's violation class and ``module`` names it in the
    replay line."""
    state = _CrashState(sim, key, check, kill, recrash_window, is_crash, damage, fail_closed)
    try:
        try:
            run()
        except (SimulatedCrash, Exception) as e:
            if not is_crash(e):
                raise
        after = state.apply(mode, log)
        if after is None:
            return None  # refused, naming the damage: nothing acknowledged was lost
        # a clean restart must change nothing
        state.stage = "clean restart after recovery"
        check(after, "fresh-again", None)
    except (violation, Exception, SimulatedCrash) as e:
        kind = "violation" if isinstance(e, violation) else f"raised {type(e).__name__}"
        tb = "" if isinstance(e, violation) else "\n" + "".join(
            traceback.format_exception(type(e), e, e.__traceback__, limit=-4))
        return (f"[{key}] {state.stage}: {kind}: {e}{tb}\n  replay: python -m "
                f"{module} --replay {key}\n  {sim.describe()}")
    return None


@dataclass
class _CrashState(Generic[L]):
    """The modes of ``run_crash_state`` after the workload crashed; ``stage`` names the
    step under way, for the violation message."""

    sim: SimFS
    key: str
    check: Callable[[L, str, L | None], L]
    kill: Sequence[str]
    recrash_window: int
    is_crash: Callable[[BaseException], bool]
    damage: Callable[[str], str] | None
    fail_closed: tuple[type[Exception], ...]
    stage: str = "workload"

    def apply(self, mode: str, log: L) -> L | None:
        """``mode`` applied and its checks run: the log to check a clean restart
        against, or None when the check refused damaged data."""
        parts = mode.split("/")
        if parts[0] == "power":
            self.stage = f"power loss ({parts[1]})"
            self.sim.crash(parts[1])
            self.stage = "recovery"
            return self.check(log, "fresh", None)
        if parts[0] in ("kill", "kill+power"):
            return self._kill(parts, log)
        if parts[0] == "kill+damage":
            return self._damage(mode, parts, log)
        if parts[0] == "power+recrash":
            return self._recrash(parts, log)
        raise ValueError(f"unknown mode {mode!r}")

    def _kill(self, parts: list[str], log: L) -> L:
        for client in self.kill:
            self.sim.kill_client(client)
        self.stage = "recovery after kill"
        log = self.check(log, "fresh", None)
        if parts[0] == "kill+power":
            self.stage = f"power loss ({parts[1]}) after recovery"
            self.sim.crash(parts[1])
            self.stage = "second recovery"
            log = self.check(log, "fresh2", None)
        return log

    def _damage(self, mode: str, parts: list[str], log: L) -> L | None:
        for client in self.kill:
            self.sim.kill_client(client)
        if self.damage is None:
            raise ValueError(f"mode {mode!r}: this campaign damages nothing")
        self.stage = f"damage ({parts[1]}) after kill"
        done = self.damage(parts[1])
        self.stage = f"recovery after damage ({done})"
        try:
            return self.check(log, "fresh", None)
        except self.fail_closed:
            return None

    def _recrash(self, parts: list[str], log: L) -> L:
        self.stage = f"power loss ({parts[1]})"
        self.sim.crash(parts[1])
        nth = random.Random(self.key).randint(1, self.recrash_window)
        point = self.sim.crash_at(nth)
        self.stage = f"recovery (crash at its op #{nth})"
        out = log.copy()
        try:
            self.check(log, "fresh", out)
        except (SimulatedCrash, Exception) as e:
            if not self.is_crash(e):
                raise
        point.fired = True  # disarmed if the recovery finished before it
        self.stage = f"second power loss ({parts[1]})"
        self.sim.crash(parts[1])
        self.stage = "second recovery"
        return self.check(out, "fresh2", None)


Control = Callable[[], AbstractContextManager[None]]


def catch_controls(controls: Mapping[str, Control],
                   runs: Sequence[Callable[[], list[WorkloadReport]]],
                   log: Callable[[str], None] = print) -> dict[str, str | None]:
    """Each negative control against the campaign: the ``runs`` in turn, each under the
    control, until one reports a violation; returns name -> first violation (None:
    MISSED), logging one line per control."""
    out: dict[str, str | None] = {}
    for name, control in controls.items():
        t0 = time.perf_counter()
        found: list[str] = []
        for run in runs:
            with control():
                reports = run()
            found = [v for r in reports for v in r.violations]
            if found:
                break
        out[name] = found[0] if found else None
        log(f"  {'caught' if found else 'MISSED':<7} {name:<32} {time.perf_counter() - t0:5.1f}s"
            f"  {found[0].splitlines()[0][:100] if found else ''}")
    return out


def campaign_main(argv: Sequence[str] | None, *, prog: str, doc: str | None, title: str,
                  full_modes: Sequence[str], quick_modes: Sequence[str],
                  run_campaign: Callable[..., list[WorkloadReport]],
                  run_controls: Callable[..., dict[str, str | None]],
                  replay: Callable[[str], str | None]) -> int:
    """The command line of a crash campaign (``python -m <prog>``): ``run_campaign(modes,
    only=..., max_points=...)``, then ``run_controls(quick_modes, max_points=...)``, or
    ``replay(key)``.  Exit status 1 on any violation or missed negative control."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}",
                                 description=doc.split("\n\n")[0] if doc else None)
    ap.add_argument("--quick", action="store_true", help="fewer modes per crash point")
    ap.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    ap.add_argument("--max-points", type=int, default=None,
                    help="sample at most this many crash points per workload")
    ap.add_argument("--replay", metavar="KEY", help="rerun one crash state and print it")
    ap.add_argument("--no-controls", action="store_true", help="skip the negative controls")
    args = ap.parse_args(argv)
    if args.replay:
        msg = replay(args.replay)
        print(msg or f"{args.replay}: no violation")
        return 1 if msg else 0
    modes = quick_modes if args.quick else full_modes
    t0 = time.perf_counter()
    print(f"{title} crash campaign: {len(modes)} modes per crash point")
    reports = run_campaign(modes, only=args.workload, max_points=args.max_points)
    violations = [v for r in reports for v in r.violations]
    missed: list[str] = []
    if not args.no_controls:
        print("negative controls (each must be caught):")
        controls = run_controls(quick_modes, max_points=args.max_points)
        missed = [k for k, v in controls.items() if v is None]
    for v in violations[:20]:
        print("\nVIOLATION " + v)
    print(f"\nsummary: {sum(r.crash_points for r in reports)} crash points, "
          f"{sum(r.states for r in reports)} states, {len(violations)} violations; "
          f"{time.perf_counter() - t0:.1f}s")
    if missed:
        print("MISSED negative controls: " + ", ".join(missed))
    return 1 if violations or missed else 0
