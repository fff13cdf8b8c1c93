"""Siblings: group commit's bounded wait for callers that are on their way.

PostgreSQL's commit_delay with commit_siblings, in its simplest form: a caller about to
join a group announces itself; the thread about to write the group (and sync it) waits
while any announced caller has not arrived yet, at most ``group_wait`` seconds, so that
its work shares the sync instead of paying one of its own.  Nobody announced (a lone
caller) means no wait at all.  The wait is wall-clock performance tuning, not protocol
time, so it does not use the injected clock.  Used by the journal (transactions) and the
catalog (queue adoptions).
"""

from __future__ import annotations

import threading
import time

DEFAULT_GROUP_WAIT = 0.0005  # seconds: 3-5 small syncs on this ext4


class Siblings:
    """Announced callers of one group stage; every method needs ``lock`` held."""

    def __init__(self, lock: threading.Lock, group_wait: float = DEFAULT_GROUP_WAIT) -> None:
        self._arrivals = threading.Condition(lock)  # only the gathering thread waits here
        self.group_wait = max(0.0, group_wait)
        self.count = 0  # announced and not arrived yet
        self.waits = 0  # how many times a group waited for siblings

    def announce(self) -> None:
        self.count += 1

    def arrive(self) -> None:
        """The announced caller joined the group (or gave up)."""
        self.count -= 1
        if self.count == 0:
            self._arrivals.notify_all()

    def gather(self) -> None:
        """Wait until every announced caller arrived, at most ``group_wait``."""
        if not self.count or self.group_wait <= 0:
            return
        self.waits += 1
        deadline = time.monotonic() + self.group_wait
        while self.count and (left := deadline - time.monotonic()) > 0:
            self._arrivals.wait(left)
