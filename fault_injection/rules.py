"""Fault rules shared by SimFS and FaultyFS: crash points, errno rules, the op trace and
the fault schedule.

Role: decide, deterministically from a seed, which filesystem call is the "crash
moment" and which calls fail with an injected errno, and keep a record of every fault
injected so that a failing run can print its seed and schedule (``FaultPlan.describe``).

Every ``Filesystem`` primitive call counts as one *op* (global index over all clients,
starting at 0).  Op names are the method names of ``straw.fs.Filesystem``:
``open open_beneath close writev readinto fsync fdatasync truncate fstat reserve lock
unlock fsync_dir mkdir rename unlink stat listdir realpath``.  Paths are the absolute paths
the call was made with (for fd calls: the path the handle was opened with; for ``rename``
both source and destination; a rule matches when its regex ``re.search``-matches any).

Invariants:
* A fired crash point raises ``SimulatedCrash`` (a ``BaseException``, so engine
  ``except Exception`` cannot swallow it) and marks the calling client dead: every later
  call by that client raises ``SimulatedCrash`` too, until the test revives it
  (``SimFS.crash()``/``SimFS.kill_client()``/``FaultPlan.revive()``).  Nothing the dead
  process would have done afterwards can happen.
* Random decisions use only ``FaultPlan.rng`` (seeded), so a run replays from its seed.
"""

from __future__ import annotations

import errno as _errno
import os
import random
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

ALL_OPS = frozenset(
    {
        "open", "close", "writev", "readinto", "fsync", "fdatasync", "truncate", "fstat",
        "reserve", "lock", "unlock", "fsync_dir", "mkdir", "rename", "unlink", "stat",
        "listdir", "realpath", "open_beneath",
    }
)  # fmt: skip
"""Every op name a rule may name."""

MUTATING_OPS = frozenset(
    {
        "open", "close", "writev", "fsync", "fdatasync", "truncate", "reserve", "lock",
        "unlock", "fsync_dir", "mkdir", "rename", "unlink",
    }
)  # fmt: skip
"""Ops that can change durable or shared state: the crash points worth enumerating
(crashing before a read gives the same state as crashing before the next mutating op)."""

SYNC_OPS = frozenset({"fsync", "fdatasync", "fsync_dir"})


class SimulatedCrash(BaseException):
    """The simulated process (or machine) died at this call.  Derives from
    ``BaseException`` so that engine code catching ``Exception`` lets it through."""

    def __init__(self, message: str, op_index: int = -1) -> None:
        super().__init__(message)
        self.op_index = op_index


def _ops(ops: Iterable[str] | str | None) -> frozenset[str] | None:
    if ops is None:
        return None
    out = frozenset([ops]) if isinstance(ops, str) else frozenset(ops)
    unknown = out - ALL_OPS
    if unknown:
        raise ValueError(f"unknown op names {sorted(unknown)}; known: {sorted(ALL_OPS)}")
    return out


def _matches(
    ops: frozenset[str] | None,
    regex: re.Pattern[str] | None,
    client: str | None,
    op: str,
    paths: tuple[str, ...],
    who: str,
) -> bool:
    if ops is not None and op not in ops:
        return False
    if client is not None and client != who:
        return False
    if regex is not None and not any(regex.search(p) for p in paths):
        return False
    return True


@dataclass
class CrashPoint:
    """Crash before/after the ``nth`` (1-based) call matching ``ops`` (None: any op),
    ``path`` (regex, ``re.search``; None: any path) and ``client`` (None: any)."""

    nth: int
    ops: frozenset[str] | None = None
    path: str | None = None
    when: str = "before"
    client: str | None = None
    seen: int = field(default=0, init=False)
    fired: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.ops = _ops(self.ops)
        if self.nth < 1:
            raise ValueError("CrashPoint.nth is 1-based")
        if self.when not in ("before", "after"):
            raise ValueError("CrashPoint.when must be 'before' or 'after'")
        self._re = re.compile(self.path) if self.path is not None else None

    def __str__(self) -> str:
        ops = ",".join(sorted(self.ops)) if self.ops is not None else "any op"
        where = f" on path ~ {self.path!r}" if self.path is not None else ""
        who = f" by {self.client}" if self.client is not None else ""
        return f"crash {self.when} call #{self.nth} of {ops}{where}{who}"


@dataclass
class ErrnoRule:
    """Fail matching calls with ``errno``.  Either ``nth`` (1-based, the default is 1:
    fail the nth matching call and the ``count - 1`` following ones; ``count=None`` fails
    every call from the nth on, e.g. a full disk) or ``probability`` (each matching call
    fails with that probability, at most ``count`` times; ``None``: unlimited)."""

    ops: frozenset[str]
    errno: int
    path: str | None = None
    nth: int | None = None
    probability: float | None = None
    count: int | None = 1
    client: str | None = None
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        ops = _ops(self.ops)
        assert ops is not None
        self.ops = ops
        if self.nth is not None and self.probability is not None:
            raise ValueError("ErrnoRule takes nth or probability, not both")
        if self.nth is None and self.probability is None:
            self.nth = 1
        if self.probability is not None and not 0.0 <= self.probability <= 1.0:
            raise ValueError("ErrnoRule.probability must be in [0, 1]")
        self._re = re.compile(self.path) if self.path is not None else None

    def decide(self, rng: random.Random) -> bool:
        """Count one matching call; True if it must fail."""
        self.seen += 1
        if self.count is not None and self.fired >= self.count:
            return False
        if self.nth is not None:
            hit = self.seen >= self.nth
        else:
            assert self.probability is not None
            hit = rng.random() < self.probability
        if hit:
            self.fired += 1
        return hit

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno, str(self.errno))
        if self.nth is not None:
            times = "onwards" if self.count is None else f"x{self.count}"
            when = f"from call #{self.nth} {times}"
        else:
            when = f"with p={self.probability} (max {self.count})"
        where = f" on path ~ {self.path!r}" if self.path is not None else ""
        who = f" by {self.client}" if self.client is not None else ""
        return f"{name} on {','.join(sorted(self.ops))} {when}{where}{who}"


@dataclass(frozen=True)
class TraceEntry:
    """One recorded call: global op index, client, op name and paths."""

    index: int
    client: str
    op: str
    paths: tuple[str, ...]

    def __str__(self) -> str:
        return f"#{self.index} {self.client} {self.op} {' -> '.join(self.paths)}"


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault (errno, crash point, power loss, dropped fsync data)."""

    index: int
    client: str
    op: str
    paths: tuple[str, ...]
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"#{self.index} {self.client} {self.op} {' -> '.join(self.paths)}: "
        if self.index < 0:
            where = ""
        return f"{where}{self.kind}{' (' + self.detail + ')' if self.detail else ''}"


def raise_errno(err: int, path: str) -> None:
    """Raise the ``OSError`` subclass Python maps ``err`` to (ENOENT -> FileNotFoundError)."""
    raise OSError(err, os.strerror(err), path)


class FaultPlan:
    """Seeded rng + crash points + errno rules + trace + schedule, for one simulated run.

    Used by SimFS and FaultyFS as: ``rule, after = plan.begin(client, op, paths)`` before
    doing the op (raises ``SimulatedCrash`` for a crash point *before* it; ``rule`` is the
    errno rule to inject or None) and ``plan.end(after)`` once the op finished or raised.
    """

    def __init__(self, seed: int = 0, *, record_trace: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.crash_points: list[CrashPoint] = []
        self.errno_rules: list[ErrnoRule] = []
        self.events: list[FaultEvent] = []
        self.trace: list[TraceEntry] = []
        self.record_trace = record_trace
        self.op_count = 0
        self.dead: dict[str, SimulatedCrash] = {}  # client -> the crash that killed it
        self._mu = threading.Lock()

    # --- configuration ------------------------------------------------------------
    def add_crash_point(self, point: CrashPoint) -> CrashPoint:
        self.crash_points.append(point)
        return point

    def crash_at(
        self,
        nth: int,
        *,
        ops: Iterable[str] | str | None = None,
        path: str | None = None,
        when: str = "before",
        client: str | None = None,
    ) -> CrashPoint:
        """Crash before (or after) the ``nth`` matching call; see ``CrashPoint``."""
        return self.add_crash_point(CrashPoint(nth, _ops(ops), path, when, client))

    def add_errno_rule(self, rule: ErrnoRule) -> ErrnoRule:
        self.errno_rules.append(rule)
        return rule

    def fail(
        self,
        ops: Iterable[str] | str,
        err: int,
        *,
        path: str | None = None,
        nth: int | None = None,
        probability: float | None = None,
        count: int | None = 1,
        client: str | None = None,
    ) -> ErrnoRule:
        """Add an errno rule; see ``ErrnoRule``."""
        op_set = _ops(ops)
        assert op_set is not None
        return self.add_errno_rule(ErrnoRule(op_set, err, path, nth, probability, count, client))

    def revive(self, client: str | None = None) -> None:
        """Let a crashed client (None: every client) make calls again."""
        if client is None:
            self.dead.clear()
        else:
            self.dead.pop(client, None)

    # --- per call -------------------------------------------------------------------
    def begin(
        self, client: str, op: str, paths: tuple[str, ...]
    ) -> tuple[ErrnoRule | None, CrashPoint | None]:
        with self._mu:
            if client in self.dead:
                # the same exception again, so a cleanup handler's call (``finally: close``)
                # still surfaces the original crash point
                raise self.dead[client]
            index = self.op_count
            self.op_count += 1
            if self.record_trace:
                self.trace.append(TraceEntry(index, client, op, paths))
            after = None
            for cp in self.crash_points:
                if cp.fired or not _matches(cp.ops, cp._re, cp.client, op, paths, client):
                    continue
                cp.seen += 1
                if cp.seen == cp.nth:
                    cp.fired = True
                    if cp.when == "before":
                        self._fire(cp, index, client, op, paths)
                    after = cp
            for rule in self.errno_rules:
                if _matches(rule.ops, rule._re, rule.client, op, paths, client) and rule.decide(
                    self.rng
                ):
                    self.events.append(
                        FaultEvent(index, client, op, paths, _errno.errorcode[rule.errno])
                    )
                    return rule, after
            return None, after

    def end(self, after: CrashPoint | None, client: str, op: str, paths: tuple[str, ...]) -> None:
        """Fire a crash point that was due *after* this call."""
        if after is not None:
            with self._mu:
                self._fire(after, self.op_count - 1, client, op, paths)

    def _fire(
        self, cp: CrashPoint, index: int, client: str, op: str, paths: tuple[str, ...]
    ) -> None:
        exc = SimulatedCrash(f"{cp} fired at #{index} {client} {op} {paths}", index)
        self.dead[client] = exc
        self.events.append(FaultEvent(index, client, op, paths, "crash point", str(cp)))
        raise exc

    def record(
        self,
        kind: str,
        detail: str = "",
        *,
        index: int = -1,
        client: str = "",
        op: str = "",
        paths: tuple[str, ...] = (),
    ) -> None:
        """Append an event to the schedule (e.g. how an errno fault or a power loss played
        out); an event about an op (``op`` given) defaults to that op's index."""
        with self._mu:
            if op and index < 0:
                index = self.op_count - 1
            self.events.append(FaultEvent(index, client, op, paths, kind, detail))

    def describe(self) -> str:
        """The seed, rules and every injected fault: print this when a run fails."""
        lines = [f"seed={self.seed} ops={self.op_count}"]
        lines += [f"  rule: {cp}" for cp in self.crash_points]
        lines += [f"  rule: {r}" for r in self.errno_rules]
        lines += [f"  event: {e}" for e in self.events] or ["  no faults injected"]
        return "\n".join(lines)
