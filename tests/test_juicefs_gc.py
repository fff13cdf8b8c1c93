"""Online GC across two real clients of one JuiceFS volume.

Publishers on both mounts, collectors on both mounts, all at once; pins held on one mount
while the other collects.  Nothing pinned or owned is ever reclaimed; everything released
is reclaimed in the end."""

from __future__ import annotations

import os
import threading

import pytest

from straw import InvalidReference, Record, RecordSetRef, SharedFilesystemStore

pytestmark = pytest.mark.juicefs


def _payload(w: str, i: int) -> bytes:
    return f"{w}:{i}:".encode() * (50 + i * 37 % 400)


def _pack_files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(os.path.join(root, "runs")):
        out += [os.path.join(d, n) for n in names if n.endswith(".pack")]
    return out


def test_concurrent_publishers_and_collectors_on_two_mounts(juicefs_dirs):
    mounts = {"a": juicefs_dirs.a, "b": juicefs_dirs.b}
    n = 30
    stop = threading.Event()
    errors: list[BaseException] = []
    kept: dict[str, tuple[str, RecordSetRef]] = {}  # owner -> (writer, ref)
    kept_lock = threading.Lock()
    collections = {"a": 0, "b": 0}

    def guard(fn):  # type: ignore[no-untyped-def]
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # surfaced in the main thread
                errors.append(e)
                stop.set()
        return run

    def publisher(name: str, mount: str) -> None:
        other = "b" if mount == "a" else "a"
        with SharedFilesystemStore(mounts[mount], "run", writer_id=name,
                                   segment_target_bytes=16 << 10, reserve_bytes=0) as store, \
                SharedFilesystemStore(mounts[other], "run") as reader:
            for i in range(n):
                if stop.is_set():
                    return
                ref = store.publish([Record("r", _payload(name, i))],
                                    submission_id=f"{name}-{i}")
                if i % 3 == 0:
                    owner = f"{name}-keep-{i}"
                    store.retain(owner, [ref])  # adopted, then staging dropped
                    store.release_publications([ref])
                    with kept_lock:
                        kept[owner] = (name, ref)
                else:
                    # pinned on this mount while the other mount's collector runs
                    with store.pin([ref]):
                        store.release_publications([ref])
                        seen = collections[other]
                        while collections[other] == seen and not stop.is_set():
                            stop.wait(0.005)
                        assert bytes(next(store.read(ref)).payload) == _payload(name, i)
                        assert bytes(next(reader.read(ref)).payload) == _payload(name, i)
                if i % 4 == 3:
                    store.seal()

    def collector(mount: str) -> None:
        with SharedFilesystemStore(mounts[mount], "run") as store:
            while not stop.is_set():
                store.collect_garbage()
                collections[mount] += 1
                with kept_lock:
                    snapshot = list(kept.items())
                for _, (w, ref) in snapshot:  # owned data is never reclaimed
                    (rec,) = store.read(ref)
                    assert bytes(rec.payload).startswith(f"{w}:".encode())

    pubs = [threading.Thread(target=guard(lambda w=w, m=m: publisher(w, m)))
            for w, m in (("wa", "a"), ("wb", "b"))]
    cols = [threading.Thread(target=guard(lambda m=m: collector(m))) for m in ("a", "b")]
    for t in pubs + cols:
        t.start()
    for t in pubs:
        t.join(timeout=300)
    stop.set()
    for t in cols:
        t.join(timeout=60)
    assert not errors, errors
    assert len(kept) == 2 * len(range(0, n, 3))

    # everything owned is still there; then release it all: everything is reclaimed
    with SharedFilesystemStore(mounts["b"], "run") as store:
        for w, ref in kept.values():
            assert bytes(next(store.read(ref)).payload).startswith(f"{w}:".encode())
        assert set(store.owners()) == set(kept)
        for owner in kept:
            assert store.release(owner)
        store.collect_garbage()
    with SharedFilesystemStore(mounts["a"], "run") as store:
        store.collect_garbage()  # finishes anything the other client left
        for _, ref in kept.values():
            with pytest.raises(InvalidReference):
                store.retain("late", [ref])
    assert _pack_files(mounts["a"]) == []
