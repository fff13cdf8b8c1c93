"""Whether a large tensor load gets a helper thread: ``_HelperPolicy`` decides
from present signals (a CPU idle at this moment, the times of recent loads), not from a
lagging load average.  Driven here through its injectable core count and idle signal and
by the times it is told (the decision logic), then end to end with a helper thread that is
slow (a busy second core) or loads whose reads wait (where two threads pay), and damage
found whichever of the two threads reads it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import straw.fs as straw_fs
import straw.tensors.loads as loads
import straw.tensors.threads as threads
from straw import CorruptData, SharedFilesystemStore
from straw.fs import PosixFS
from straw.tensor import publish_tensors

MB = 8 << 20  # a span of one size class
FAST, SLOW = 1e-3, 4e-3  # seconds per MB-span: the mode that pays, the one that costs


def _policy(cores: int = 2, idle: bool | None = True) -> threads._HelperPolicy:
    return threads._HelperPolicy(cores=lambda: cores, idle=lambda: idle)


def _run(policy: threads._HelperPolicy, loads: int, seconds) -> list[bool]:
    """``loads`` loads of one span: the mode each was given (``seconds(two)`` the time
    each took)."""
    modes = []
    for _ in range(loads):
        two = policy.choose(MB)
        policy.record(two, MB, seconds(two))
        modes.append(two)
    return modes


def _run_signalled(policy: threads._HelperPolicy, loads: int, seconds) -> list[bool | None]:
    """As ``_run``, measuring only the loads the policy wants measured."""
    modes = []
    for _ in range(loads):
        two = policy.choose(MB)
        if two is not None:
            policy.record(two, MB, seconds(two))
        modes.append(two)
    return modes


def test_one_core_never_gets_a_helper():
    policy = _policy(cores=1)
    assert _run_signalled(policy, 50, lambda two: FAST if two else SLOW) == [None] * 50
    assert policy.spans == 50 and policy.helped == 0 and policy.loads == 0


def test_no_idle_cpu_now_means_one_thread_and_nothing_measured():
    idle = [False]
    policy = threads._HelperPolicy(cores=lambda: 2, idle=lambda: idle[0])
    assert _run_signalled(policy, 20, lambda two: FAST if two else SLOW) == [None] * 20
    assert policy.loads == 0  # (a busy machine's load times would mislead the choice)
    idle[0] = True  # a CPU fell idle: measured both ways at once, then the faster
    assert _run_signalled(policy, 4, lambda two: FAST if two else SLOW) == [False, True,
                                                                           True, True]
    idle[0] = False  # taken again: one thread from the next load on
    assert _run_signalled(policy, 3, lambda two: FAST if two else SLOW) == [None] * 3
    idle[0] = None  # a platform that cannot tell: the measurements decide alone
    assert _run_signalled(policy, 2, lambda two: FAST if two else SLOW) == [True, True]
    assert policy.spans == 29 and policy.helped == 5 and policy.loads == 6


@pytest.mark.parametrize(("field", "idle"), [(b"1/180", True), (b"2/180", False),
                                             (b"9/400", False), (b"x", None)])
def test_an_idle_cpu_is_judged_from_the_threads_runnable_now(monkeypatch, field, idle):
    monkeypatch.setattr(straw_fs, "_loadavg_fd", 99)  # (never read: pread is replaced)
    monkeypatch.setattr(threads, "_CPUS", 2)
    monkeypatch.setattr(threads.os, "pread", lambda fd, n, at: b"7.95 8.10 8.00 " + field
                        + b" 4242\n")
    assert threads._core_idle_now() is idle


def test_each_mode_is_measured_first_then_the_faster_one_is_used_and_the_other_probed():
    policy = _policy()
    modes = _run(policy, 2 + 8 + 1, lambda two: FAST if two else SLOW)
    assert modes[:2] == [False, True]  # one thread, then two: both measured
    assert modes[2:10] == [True] * 8  # two threads were faster
    assert modes[10] is False  # after MIN_INTERVAL loads: one probe of one thread


def test_probes_that_keep_losing_grow_rare():
    policy = _policy()  # a machine whose second core stays busy: a helper costs
    modes = _run(policy, 2000, lambda two: SLOW if two else FAST)
    probes = [i for i, two in enumerate(modes) if two]  # load 1 measured two threads
    gaps = np.diff(probes)
    assert list(gaps[:5]) == [9, 17, 33, 65, 129]  # the interval doubles each confirmation
    assert max(gaps) == threads._HelperPolicy.MAX_INTERVAL + 1  # ... up to MAX_INTERVAL
    assert len(probes) < 25  # about 1% of 2000 loads paid for a helper


def test_a_core_taken_and_freed_again_is_noticed_within_a_few_loads():
    policy = _policy()
    busy = [False]

    def seconds(two: bool) -> float:
        return (SLOW if busy[0] else FAST) if two else 2 * FAST

    assert _run(policy, 40, seconds)[-5:] == [True] * 5  # settled on two threads
    busy[0] = True  # another process takes the second core
    modes = _run(policy, 10, seconds)
    assert modes[-6:] == [False] * 6  # the helper's slower loads moved the choice
    busy[0] = False  # the core is free again
    modes = _run(policy, 40, seconds)
    assert modes[-8:].count(True) >= 7  # a probe found two threads faster again


def test_one_slow_load_in_use_does_not_flip_the_choice():
    policy = _policy()
    _run(policy, 6, lambda two: FAST if two else SLOW)
    policy.record(True, MB, SLOW * 1.2)  # one preempted load
    assert policy.choose(MB) is True


def test_a_lucky_probe_is_tried_again_before_the_choice_changes():
    policy = _policy()  # one thread in use; a helper costs, but one probe gets lucky
    _run(policy, 10, lambda two: SLOW if two else FAST)  # (load 10 is the next probe)
    lucky = iter([FAST / 2, SLOW, SLOW])
    modes = _run(policy, 3, lambda two: next(lucky) if two else FAST)
    assert modes == [True, True, False]  # the lucky probe, one more probe (lost): back
    assert _run(policy, 15, lambda two: SLOW if two else FAST) == [False] * 15


def test_size_classes_are_judged_apart():
    policy = _policy()
    _run(policy, 20, lambda two: FAST if two else SLOW)  # MB spans: two threads pay
    big = 32 << 20
    for _ in range(20):  # 32 MiB spans: one thread pays
        two = policy.choose(big)
        policy.record(two, big, (SLOW if two else FAST) * 4)
    assert policy.choose(big) is False and policy.choose(MB) is True
    assert policy.loads == 40 and 0 < policy.helped < 40


# --- end to end: the load times itself ---------------------------------------------------


class SlowThreadFS(PosixFS):
    """PosixFS whose reads by threads other than ``loader`` take ``helper_delay`` seconds
    more (a helper thread on a busy core) and reads by ``loader`` ``loader_delay`` more
    (reads that wait, where a second thread pays); records the reading thread of every
    read, and can flip one byte of the reads covering ``flip_at`` (damage)."""

    def __init__(self) -> None:
        self.loader = threading.get_ident()
        self.helper_delay = 0.0
        self.loader_delay = 0.0
        self.threads: list[int] = []
        self.flip_at = -1
        self.hit_by: list[int] = []  # the threads that read a flipped byte
        self.rendezvous = False
        self.other_read = threading.Event()

    def readinto(self, fd: int, buffer, offset: int) -> int:
        me = threading.get_ident()
        self.threads.append(me)
        if self.rendezvous and me == self.loader:
            assert self.other_read.wait(10), "no helper read a block"
        view = memoryview(buffer).cast("B")
        n = super().readinto(fd, view, offset)
        if offset <= self.flip_at < offset + n:
            view[self.flip_at - offset] ^= 0xFF
            self.hit_by.append(me)
        time.sleep(self.loader_delay if me == self.loader else self.helper_delay)
        if me != self.loader:
            self.other_read.set()
        return n


@pytest.fixture
def slow(tmp_path, monkeypatch):
    monkeypatch.setattr(loads, "_PARALLEL_LOAD", 2 * loads._READ_BYTES)
    monkeypatch.setattr(loads, "_helpers", threads._HelperPolicy(cores=lambda: 2, idle=lambda: True))
    fs = SlowThreadFS()
    with SharedFilesystemStore(str(tmp_path), "t", fs=fs) as store:
        value = np.random.default_rng(3).standard_normal((2048, 1024)).astype(np.float32)
        (ref,) = publish_tensors(store, {"x": value}, submission_id="a")  # 8 blocks
        yield ref, value, fs


def _loads(ref, value, fs, n: int, monkeypatch) -> tuple[list[bool], list[bool]]:
    """``n`` loads: the policy's choice for each, and whether each had a reading thread
    besides the loader.  A load given a helper waits for the helper's first block (a
    helper that gets no core would take none, and there would be nothing to measure)."""
    chosen, used = [], []

    def use(nbytes: int) -> bool | None:
        two = loads._helpers.choose(nbytes)
        chosen.append(bool(two))
        fs.other_read, fs.rendezvous = threading.Event(), bool(two)
        return two

    monkeypatch.setattr(loads, "_use_helper", use)
    for _ in range(n):
        fs.threads.clear()
        assert np.array_equal(ref.load(), value)
        used.append(set(fs.threads) != {fs.loader})
    return chosen, used


def test_a_helper_on_a_busy_core_is_given_up(slow, monkeypatch):
    ref, value, fs = slow
    fs.helper_delay = 0.1  # every block the helper takes costs the load 100 ms
    chosen, used = _loads(ref, value, fs, 10, monkeypatch)
    assert used == chosen  # (every helper chosen read a block)
    assert chosen[:2] == [False, True]  # measured both ways
    # then one thread: the helper made the loads slower (at once, or within the loads
    # its median takes to rise past one thread's, if the first load, which faults its
    # buffer in, took longer still)
    assert chosen[-5:] == [False] * 5 and sum(chosen) <= 4
    assert loads._helpers.loads == 10 and loads._helpers.helped == sum(chosen)


def test_a_helper_that_pays_is_kept(slow, monkeypatch):
    ref, value, fs = slow
    fs.loader_delay = fs.helper_delay = 0.02  # each block read waits: two threads halve it
    chosen, used = _loads(ref, value, fs, 6, monkeypatch)
    assert used == chosen
    assert chosen == [False, True, True, True, True, True]


def test_damage_is_corrupt_data_whichever_thread_reads_it(slow, monkeypatch):
    ref, value, fs = slow
    monkeypatch.setattr(loads, "_use_helper", lambda nbytes: True)
    at = ref._session().payload_location(ref.record)[2]
    fs.rendezvous = True  # the loader's first block waits for the helper's first
    for block in (0, 1):  # so these two blocks are read one by each thread
        fs.other_read = threading.Event()
        fs.flip_at = at + block * loads._READ_BYTES + 5  # every read of it: damage
        with pytest.raises(CorruptData, match=rf"chunk {block * 4} "):
            ref.load()
    assert len(set(fs.hit_by)) == 2 and fs.loader in fs.hit_by  # the helper and the loader
    fs.flip_at, fs.rendezvous = -1, False
    assert np.array_equal(ref.load(), value)
