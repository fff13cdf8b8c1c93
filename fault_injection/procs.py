"""The fuzz scenarios' process plumbing: child processes started with the repository on
their path and their stderr kept (``Proc``), stopped or awaited with their exit status
checked (``stop_all``, ``wait_all``), violations reported to a fsynced log a supervisor
reads back (``report``, ``logged_violations``), acknowledgement logs of JSON lines
(``AckLines``, ``read_ack_lines``), and a child's view of its supervisor
(``orphaned``) and of a predecessor's lock (``until_unlocked``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from straw import UnsafeRecovery

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = TypeVar("T")
VIOLATIONS = "violations.jsonl"
_PARENT = os.getppid()


class AckLines:
    """One process's acknowledgement log: JSON lines, each fsynced before it counts."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **entry: Any) -> None:
        os.write(self.fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        os.fsync(self.fd)


def read_ack_lines(path: str) -> list[dict[str, Any]]:
    """The entries of an ``AckLines`` log that count (fully written)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:  # a torn last line (killed mid-write) was never acknowledged
        return [json.loads(line) for line in f if line.endswith("\n")]


def report(logdir: str, who: str, message: str) -> None:
    with open(os.path.join(logdir, VIOLATIONS), "a") as f:
        f.write(json.dumps({"who": who, "message": message}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def orphaned() -> bool:
    """The supervisor is gone: stop instead of running on forever."""
    return os.getppid() != _PARENT


def until_unlocked(open_: Callable[[], T]) -> T:
    """``open_()``, retried for up to 30 s while it raises ``UnsafeRecovery``: a killed
    predecessor's lock may take a moment to go away on a network filesystem.  (Also used
    by ``fault_injection.queue_fuzz``.)"""
    deadline = time.monotonic() + 30
    while True:
        try:
            return open_()
        except UnsafeRecovery:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Proc:
    def __init__(self, name: str, argv: list[str], logdir: str) -> None:
        self.name = name
        self.argv = argv
        self.logpath = os.path.join(logdir, f"{name}.stderr")
        self.p: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (REPO, env.get("PYTHONPATH", "")) if p)
        with open(self.logpath, "ab") as err:
            self.p = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err,
                                      cwd=REPO, env=env)

    @property
    def pid(self) -> int:
        assert self.p is not None
        return self.p.pid

    def tail(self) -> str:
        try:
            with open(self.logpath, errors="replace") as f:
                return "".join(f.readlines()[-15:])
        except OSError:
            return ""


def stop_all(procs: Sequence[Proc]) -> list[str]:
    """SIGCONT and SIGTERM every process still running, then wait for each (SIGKILL after
    60 s).  Returns violations: a process that did not stop, or ended with another status
    than 0 or SIGTERM.  (Also used by ``fault_injection.queue_fuzz``.)"""
    violations = []
    for proc in procs:
        assert proc.p is not None
        if proc.p.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.p.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.p is not None
        try:
            rc = proc.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.p.kill()
            rc = proc.p.wait()
            violations.append(f"{proc.name} did not stop within 60 s of SIGTERM")
        if rc not in (0, -signal.SIGTERM):
            violations.append(f"{proc.name} ended with rc={rc}:\n{proc.tail()}")
    return violations


def wait_all(procs: Sequence[Proc], timeout: float) -> list[str]:
    """Wait for processes that end by themselves; violations: a status other than 0, or
    still running after ``timeout`` seconds (then SIGKILLed)."""
    violations = []
    for proc in procs:
        assert proc.p is not None
        try:
            rc = proc.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.p.kill()
            rc = proc.p.wait()
            violations.append(f"{proc.name} did not end within {timeout:.0f} s")
        if rc != 0:
            violations.append(f"{proc.name} ended with rc={rc}:\n{proc.tail()}")
    return violations


def logged_violations(logdir: str) -> list[str]:
    """What the processes reported with ``report`` in ``logdir``."""
    vpath = os.path.join(logdir, VIOLATIONS)
    if not os.path.exists(vpath):
        return []
    with open(vpath) as f:
        return [json.loads(line)["who"] + ": " + json.loads(line)["message"]
                for line in f if line.strip()]


__all__ = ["REPO", "VIOLATIONS", "Proc", "logged_violations", "orphaned", "report",
           "stop_all", "until_unlocked", "wait_all"]
