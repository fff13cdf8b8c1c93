"""The environment of a ``straw qualify`` run and the measurement helpers its clauses
share: two clients of one directory (``Client``), the bounded wait (``converge``), the
window figures (p50/p99/max, ``window``) and verdicts.  See ``straw.qualify.clauses``."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..clock import Clock
from ..fs import Filesystem

PASS, FAIL, SKIP = "pass", "fail", "skip"


class LockHolder(Protocol):
    """Another process holding the flock of one file (started by a ``HolderFactory``)."""

    def kill(self) -> None:
        """SIGKILL it (its lock must then be released by the filesystem)."""

    def close(self) -> None: ...


HolderFactory = Callable[[str], LockHolder]  # path as client A sees it -> lock held


@dataclass
class Client:
    """One client's view of the qualified directory."""

    fs: Filesystem
    dir: str

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)


@dataclass
class Env:
    a: Client
    b: Client
    clock: Clock
    token: str  # prefix of every name this run creates (removed at the end)
    rounds: int = 8
    deadline: float = 5.0
    poll: float = 0.01
    holder: HolderFactory | None = None
    full: Client | None = None
    full_limit: int = 256 << 20
    large_offsets: tuple[int, ...] = ((1 << 31) + 7, (1 << 32) + 4099, (1 << 34) + 13)
    seed: int = 0
    _n: int = 0

    def name(self, what: str) -> str:
        self._n += 1
        return f"{self.token}-{what}-{self._n}"

    def rng(self, salt: str) -> random.Random:
        return random.Random(f"{self.seed}-{salt}")


@dataclass
class Result:
    clause: str
    verdict: str  # pass | fail | skip
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"clause": self.clause, "verdict": self.verdict, "detail": self.detail,
                "figures": self.figures}


# --- small helpers on one client ----------------------------------------------------------
def write_file(c: Client, name: str, data: bytes, *, exclusive: bool = False) -> None:
    fd = c.fs.open(c.path(name), write=True, create=True, exclusive=exclusive)
    try:
        c.fs.truncate(fd, 0)
        c.fs.writev(fd, [data], 0)
        c.fs.fsync(fd)
    finally:
        c.fs.close(fd)


def append_file(c: Client, name: str, data: bytes, offset: int) -> None:
    fd = c.fs.open(c.path(name), write=True)
    try:
        c.fs.writev(fd, [data], offset)
        c.fs.fsync(fd)
    finally:
        c.fs.close(fd)


def read_file(c: Client, name: str) -> bytes | None:
    """The file's bytes through a fresh open (None if the name is not found)."""
    try:
        fd = c.fs.open(c.path(name))
    except FileNotFoundError:
        return None
    try:
        return c.fs.read_to_end(fd)
    finally:
        c.fs.close(fd)


def remove(c: Client, name: str) -> None:
    try:
        c.fs.unlink(c.path(name))
    except FileNotFoundError:
        pass


def stat_size(c: Client, name: str) -> int | None:
    try:
        return c.fs.stat(c.path(name)).size
    except FileNotFoundError:
        return None


def converge(env: Env, check: Callable[[], bool]) -> float | None:
    """Seconds until ``check()`` held (0.0: at once), or None if not within the deadline."""
    t0 = env.clock.now()
    while True:
        if check():
            return max(0.0, env.clock.now() - t0)
        if env.clock.now() - t0 >= env.deadline:
            return None
        env.clock.sleep(env.poll)


def window(samples: list[float | None]) -> dict[str, Any]:
    """p50/p99/max of the converged samples (seconds) and how many never converged."""
    done = sorted(s for s in samples if s is not None)

    def pct(q: float) -> float | None:
        if not done:
            return None
        return round(done[min(len(done) - 1, int(q * (len(done) - 1) + 0.999999))], 4)

    return {"samples": len(samples), "p50": pct(0.5), "p99": pct(0.99),
            "max": round(done[-1], 4) if done else None,
            "unconverged": len(samples) - len(done), "values": [round(v, 4) for v in done]}


def verdict(name: str, violations: list[str], ok: str, figures: dict[str, Any]) -> Result:
    if violations:
        more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
        return Result(name, FAIL, "; ".join(violations[:3]) + more, figures)
    return Result(name, PASS, ok, figures)


def window_verdict(name: str, env: Env, samples: list[float | None], what: str) -> Result:
    fig = window(samples)
    if fig["unconverged"]:
        return Result(name, FAIL, f"{fig['unconverged']} of {fig['samples']} {what} still "
                      f"stale after {env.deadline:g} s (the deadline): the window is not "
                      "bounded by anything straw can wait for", fig)
    return Result(name, PASS, f"{what} ({fig['samples']} samples)", fig)

def poll_batch(env: Env, pending: dict[str, tuple[float, Callable[[], bool]]],
                samples: list[float | None], *, once: bool = False) -> None:
    """Poll every pending (start time, check) until it holds or the deadline passes
    (``once``: one pass, so that samples started later do not wait for earlier ones)."""
    while pending:
        now = env.clock.now()
        for key, (t0, check) in list(pending.items()):
            if check():
                samples.append(max(0.0, env.clock.now() - t0))
                del pending[key]
            elif now - t0 >= env.deadline:
                samples.append(None)
                del pending[key]
        if once:
            return
        if pending:
            env.clock.sleep(env.poll)

def both_orders(env: Env, i: int) -> tuple[Client, Client]:
    return (env.a, env.b) if i % 2 == 0 else (env.b, env.a)


def race(fns: list[Callable[[], Any]]) -> list[BaseException | Any]:
    """Run the functions at the same moment (threads behind a barrier); their results or
    exceptions, in order."""
    barrier = threading.Barrier(len(fns))
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            out[i] = fns[i]()
        except BaseException as e:  # noqa: B036 - reported as the outcome
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
