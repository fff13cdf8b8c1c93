"""The threads of the tensors package: its thread pool (chunk checksums of large
publications, helper threads of large loads), the blocks of a span handed out to the
threads that read it, and the policy that decides when a load gets a helper thread."""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..fs import runnable_threads

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> int:
    return min(4, os.cpu_count() or 1)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_workers(), thread_name_prefix="straw-tensor")
        return _pool


class _Blocks:
    """The block offsets of one span, handed out once each to whichever thread asks
    next (thread-safe); ``stop()`` hands out no more."""

    def __init__(self, nbytes: int, block: int) -> None:
        self.block = block
        self.count = -(-nbytes // block)
        self._next = 0
        self._lock = threading.Lock()

    def __iter__(self) -> _Blocks:
        return self

    def __next__(self) -> int:
        with self._lock:
            i = self._next
            if i >= self.count:
                raise StopIteration
            self._next = i + 1
        return i * self.block

    def stop(self) -> None:
        with self._lock:
            self._next = self.count


def _cores() -> int:
    """The cores this process may run on (1 where the platform cannot tell)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 1


@dataclass
class _Modes:
    """What the loads of one size class measured (``_HelperPolicy``): the seconds per
    byte of the last few loads read by one thread and by two."""

    one: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=_WINDOW))
    two: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=_WINDOW))
    using_two: bool = False  # the mode in use
    since_probe: int = 0  # loads in the mode in use since the last probe
    interval: int = 8  # loads between probes

    def times(self, two: bool) -> deque[float]:
        return self.two if two else self.one

    def estimate(self, two: bool) -> float:
        return statistics.median(self.times(two))


_WINDOW = 5  # loads per mode whose median is its estimate


_CPUS = os.cpu_count() or 1  # the machine's CPUs (asked once: the call is not free)


def _core_idle_now() -> bool | None:
    """Whether a CPU of the machine is idle at this moment: the threads runnable right
    now (the 4th field of ``/proc/loadavg``, "runnable/total", this thread included)
    leave one of the CPUs free.  A count at this instant, unlike the load averages,
    which lag by a minute.  None where the platform does not tell (the load measurements
    of ``_HelperPolicy`` then decide alone).  Cheap enough to ask before every large
    load."""
    runnable = runnable_threads()
    return None if runnable is None else runnable < _CPUS


class _HelperPolicy:
    """Whether a large load gets a helper thread, judged by what recent loads took.

    A helper pays only on a core nobody else wants: on two free cores it brings a large
    load close to a memcpy, while on busy shared cores it makes loads slower (the two
    threads take turns on one core, the GIL changes hands at every block, and the loader
    waits for a helper preempted in the middle of its block).  A load average cannot
    tell these apart in time: the 1-minute one lags the machine by about a minute, and a
    steady stream of loads keeps it up by itself.  So two present signals decide.

    First, whether a CPU is idle at this moment (``idle``, ``_core_idle_now``: the count
    of runnable threads): if not, one thread, and nothing is measured (on a loaded
    machine the time of a single load varies widely from preemption alone, and no
    choice made from such times beats one thread).  If one is, or the platform cannot
    tell, the loads measure whether a helper pays (a CPU idle by that count may still
    not be ours: another process's affinity, a hypervisor's steal).

    Per size class (the bit length of the span: how much of a tensor the CPU caches hold
    differs between 12 and 32 MiB) it keeps the seconds per byte of the last
    ``_WINDOW`` loads read by one thread and by two; a mode's estimate is their median
    (on a shared machine single loads vary widely either way: a mean, or the latest
    load, would follow the noise).  A load takes the mode with the lower estimate (an
    unmeasured mode first: one thread, then two).  After ``interval`` loads in one mode,
    one load probes the other.  A probe that beats the mode in use is followed by
    another probe at once, until the other mode's median wins (the choice changes and the
    interval is reset to ``MIN_INTERVAL``) or a probe loses; a probe that loses doubles
    the interval, up to ``MAX_INTERVAL``, so where the second core stays busy the
    probes cost about a percent of the loads.  With fewer than two cores (``cores``) no
    load gets a helper.  A probe with two threads is cheap: the blocks are shared
    (``_Blocks``), so a helper that gets no core takes none.  Thread-safe; ``cores``,
    ``idle`` and ``timer`` (monotonic seconds) are injectable."""

    MIN_INTERVAL = 8
    MAX_INTERVAL = 128

    def __init__(self, cores: Callable[[], int] = _cores,
                 idle: Callable[[], bool | None] = _core_idle_now,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.cores = cores
        self.idle = idle
        self.timer = timer
        self.lock = threading.Lock()
        self.classes: dict[int, _Modes] = {}
        self.spans = 0  # large spans asked about (for reports: ``bench.tensor_workloads``)
        self.helped = 0  # of them, read by two threads
        self.loads = 0  # of them, measured

    def _modes(self, nbytes: int) -> _Modes:
        return self.classes.setdefault(nbytes.bit_length(),
                                       _Modes(interval=self.MIN_INTERVAL))

    def choose(self, nbytes: int) -> bool | None:
        """Whether a span of ``nbytes`` is read by two threads: True or False (the caller
        then reports its time to ``record``), or None: one thread, not to be measured."""
        two = self._choose(nbytes)
        with self.lock:
            self.spans += 1
            self.helped += bool(two)
        return two

    def _choose(self, nbytes: int) -> bool | None:
        if self.cores() < 2 or self.idle() is False:
            return None
        with self.lock:
            m = self._modes(nbytes)
            if not m.one:
                return False
            if not m.two:
                return True
            if m.since_probe >= m.interval:
                m.since_probe = 0  # (one probe, even with loads in flight on other threads)
                return not m.using_two
            return m.using_two

    def record(self, two: bool, nbytes: int, seconds: float) -> None:
        """A span of ``nbytes`` took ``seconds``, read by two threads or by one."""
        if nbytes <= 0:
            return
        per_byte = max(seconds, 0.0) / nbytes
        with self.lock:
            self.loads += 1
            m = self._modes(nbytes)
            first = not m.times(two)
            m.times(two).append(per_byte)
            if not (m.one and m.two):
                return
            if first:  # both modes measured once: the faster one
                m.using_two = m.estimate(True) < m.estimate(False)
                return
            used = m.estimate(m.using_two)
            if two == m.using_two:
                m.since_probe += 1
            elif per_byte >= used:  # a probe that lost
                m.interval = min(2 * m.interval, self.MAX_INTERVAL)
            elif m.estimate(two) >= used:  # won, but its mode's median not yet: again
                m.since_probe = m.interval
            if m.estimate(not m.using_two) < m.estimate(m.using_two):
                m.using_two, m.since_probe, m.interval = (not m.using_two, 0,
                                                          self.MIN_INTERVAL)


def _split(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """[first, last) cut into ``parts`` contiguous ranges."""
    n = last - first
    step = -(-n // parts)
    return [(a, min(a + step, last)) for a in range(first, last, step)]


def _reset_after_fork() -> None:
    """In a forked child: the parent's pool threads do not exist there (work submitted to
    its pool would never run), and a lock another thread held at the fork stays held."""
    global _pool, _pool_lock
    _pool = None  # never shut down: it is the parent's
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
