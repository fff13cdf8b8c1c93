"""A read session's descriptors are shared by its threads (a generation worker's slots, the
batch builder's shard threads).  A descriptor that one thread drops (evicted from the cache,
reopened after visibility lag, its pack reclaimed) while another thread reads through it
must stay open until that read ends: closed under the reader, the read fails with EBADF
(found as a StorageUnavailable in a Ray generation actor), or its number is reused by
another file and the read returns that file's bytes."""

from __future__ import annotations

import threading

from straw import Record, SharedFilesystemStore
from straw.fs import PosixFS
from straw.fs_delegating import DelegatingFilesystem


class _PausingFS(DelegatingFilesystem):
    """The first read of a pack pauses after its descriptor was looked up, until the test
    let another thread drop that descriptor."""

    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.armed = False
        self.in_read = threading.Event()
        self.dropped = threading.Event()

    def readinto(self, fd, buf, offset):  # type: ignore[override]
        if self.armed:
            self.armed = False
            self.in_read.set()
            assert self.dropped.wait(10)
        return self.inner.readinto(fd, buf, offset)


def test_a_descriptor_dropped_while_another_thread_reads_through_it_stays_open(tmp_path):
    fs = _PausingFS()
    store = SharedFilesystemStore(str(tmp_path), "run", fs=fs)
    try:
        ref = store.publish([Record("r", b"x" * 5000)], submission_id="s")
        with store.read_session() as session:
            assert [r.payload for r in session.read(ref)] == [b"x" * 5000]  # fd cached
            fs.armed = True
            out: list[object] = []

            def reader() -> None:
                try:
                    out.append([r.payload for r in session.read(ref)])
                except BaseException as e:  # noqa: BLE001 (reported below)
                    out.append(e)

            t = threading.Thread(target=reader)
            t.start()
            assert fs.in_read.wait(10)
            session._cache.drop(ref.path)  # another thread's drop, under the read
            retired_meanwhile = list(session._cache.retired)
            fs.dropped.set()
            t.join(10)
            assert out == [[b"x" * 5000]], out
            assert len(retired_meanwhile) == 1  # retired, not closed, while in flight
            with session._lock:  # closed once the read ended
                assert session._cache.inflight == 0 and session._cache.retired == []
            assert [r.payload for r in session.read(ref)] == [b"x" * 5000]  # reopened
    finally:
        store.close()


class _OpenRaceFS(DelegatingFilesystem):
    """Two threads miss the descriptor cache for one pack together: the first open waits
    until the second thread's open has returned, so both hold a fresh descriptor before
    either is cached.  Counts opens and closes."""

    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.armed = False
        self.first_opened = threading.Event()
        self.second_opened = threading.Event()
        self.opened: list[int] = []
        self.closed: list[int] = []

    def open_beneath(self, root, path):  # type: ignore[override]
        fd = self.inner.open_beneath(root, path)
        if self.armed:
            self.opened.append(fd)
            if len(self.opened) == 1:
                self.first_opened.set()
                assert self.second_opened.wait(10)
            else:
                self.second_opened.set()
        return fd

    def close(self, fd):  # type: ignore[override]
        self.closed.append(fd)
        return self.inner.close(fd)


def test_two_threads_opening_one_pack_together_leak_no_descriptor(tmp_path):
    """Both threads read the right bytes, one descriptor stays cached, the other is
    closed at once (before the mend the second insert dropped the first descriptor from
    the cache without closing it: one leaked descriptor per race)."""
    fs = _OpenRaceFS()
    store = SharedFilesystemStore(str(tmp_path), "run", fs=fs)
    try:
        ref = store.publish([Record("r", b"y" * 3000)], submission_id="s")
        with store.read_session() as session:
            fs.armed = True
            out: list[object] = []

            def reader() -> None:
                try:
                    out.append([r.payload for r in session.read(ref)])
                except BaseException as e:  # noqa: BLE001 (reported below)
                    out.append(e)

            first = threading.Thread(target=reader)
            first.start()
            assert fs.first_opened.wait(10)
            second = threading.Thread(target=reader)
            second.start()
            first.join(10)
            second.join(10)
            fs.armed = False
            assert out == [[b"y" * 3000]] * 2, out
            assert len(fs.opened) == 2
            cached = [fd for fd in fs.opened if fd in session._cache.fds.values()]
            assert len(cached) == 1
            assert [fd for fd in fs.opened if fd not in cached] == \
                [fd for fd in fs.closed if fd in fs.opened]  # the other one closed, once
        assert sorted(fd for fd in fs.closed if fd in fs.opened) == sorted(fs.opened)
    finally:
        store.close()
