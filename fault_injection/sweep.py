"""What every crash campaign repeats: the crash points of a workload (before and after each
of its ops, plus "ran to completion"), optional even sampling of them, and the sweep of
points x modes into a report.  A campaign supplies only how to run one crash state."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


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
