"""Online GC: garbage collection in the background after acknowledgements (issue 14,
item 6; ``RolloutConfig.online_gc``, off by default).

``OnlineGC(collect)`` owns one daemon thread that runs ``collect()`` (the Coordinator's
``collect_garbage``: it retires the queue's acknowledged roots, then collects the pool)
each time ``request()`` is called after an acknowledgement; requests made while a
collection runs coalesce into one more run.  Collection never blocks the caller;
``paused()`` holds it back for a while (a checkpoint), ``wait()`` waits for it.

A failure is **latched**: the thread stops collecting, and ``check()`` (which every
builder call makes first) and ``close()`` raise ``OnlineGCFailed`` whose ``__cause__``
is the original exception (``QuotaExceeded`` on a full disk, ``StorageUnavailable``,
...), so the job sees it at its next step or at shutdown, never later.  Nothing is
undone: collection only retires what was acknowledged and only unlinks tombstoned
packs, so stored data stays readable and the queue's state (journaled) is untouched; a
full disk never resets the queue, it needs retention released or space added, then a
restart (which collects again).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


class OnlineGCFailed(RuntimeError):
    """A background collection failed; ``__cause__`` is the original error."""


class OnlineGC:
    """One background collector (module docstring)."""

    def __init__(self, collect: Callable[[], Any], *, name: str = "straw-online-gc") -> None:
        self._collect = collect
        self._cond = threading.Condition()
        self._wanted = 0  # requests made
        self._done = 0  # requests a finished run covered
        self._stop = False
        self._paused = 0
        self._failure: BaseException | None = None
        self.runs = 0
        self.last_result: Any = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def check(self) -> None:
        """Raise the latched failure (``OnlineGCFailed`` from the original), if any."""
        failure = self._failure
        if failure is not None:
            raise OnlineGCFailed(f"online garbage collection failed: {failure!r}; stored "
                                 "data stays readable and the queue is unchanged; free "
                                 "space or release retention, then restart the job"
                                 ) from failure

    def request(self) -> None:
        """Ask for a collection (after an acknowledgement); returns at once."""
        self.check()
        with self._cond:
            self._wanted += 1
            self._cond.notify_all()

    def wait(self) -> Any:
        """Block until every request made so far is collected (or failed: raises); the
        last collection's result."""
        with self._cond:
            target = self._wanted
            self._cond.wait_for(lambda: self._done >= target or self._failure is not None
                                or self._stop)
        self.check()
        return self.last_result

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold collections back inside the block (one running now finishes first):
        e.g. while a checkpoint records what it retains; requests made meanwhile run
        after it."""
        with self._cond:
            self._paused += 1
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or (self._wanted > self._done
                                                           and not self._paused))
                if self._stop:
                    return
                target = self._wanted
            try:
                result = self._collect()
            except BaseException as e:  # latched, raised by every later call
                with self._cond:
                    self._failure = e
                    self._cond.notify_all()
                return
            with self._cond:
                self.runs += 1
                self.last_result = result
                self._done = target
                self._cond.notify_all()

    def close(self) -> None:
        """Finish the pending collection, stop the thread, and raise a latched failure."""
        with self._cond:
            target = self._wanted
            # (inside paused() a pending collection is dropped: a restart collects again)
            self._cond.wait_for(lambda: self._done >= target or self._failure is not None
                                or self._paused > 0)
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self.check()


__all__ = ["OnlineGC", "OnlineGCFailed"]
