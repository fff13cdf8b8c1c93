"""Retention and online garbage collection (D1–D4): owners, pins, staging, tombstones."""

from __future__ import annotations

import errno
import os

import pytest

from straw import (
    CorruptData,
    InvalidReference,
    Publication,
    Record,
    SharedFilesystemStore,
    StorageUnavailable,
    UnsupportedSchema,
)
from straw import framing as fr
from straw.clock import ManualClock
from straw.fs import PosixFS


def _store(root, **kw) -> SharedFilesystemStore:
    kw.setdefault("reserve_bytes", 0)
    kw.setdefault("clock", ManualClock())
    kw.setdefault("visibility_retries", 1)
    kw.setdefault("writer_id", "w")  # a named writer: these tests restart it
    return SharedFilesystemStore(str(root), "run", **kw)


def _pub(store, name: str, deps=()):  # type: ignore[no-untyped-def]
    return store.publish([Record(name, name.encode() * 100)], submission_id=name,
                         dependencies=deps)


def test_staging_protects_until_released_then_collection_reclaims(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        assert store.collect_garbage()["reclaimed_files"] == 0  # open pack
        store.seal()
        assert store.collect_garbage()["reclaimed_files"] == 0  # staged
        assert store.release_publications([a]) == 1
        assert store.release_publications([a]) == 0  # already released: says so
        res = store.collect_garbage()
        assert res["reclaimed_files"] == 1 and res["tombstoned"] == [a.path]
        assert res["reclaimed_bytes"] > 0
        assert not (tmp_path / a.path).exists()
        with pytest.raises(InvalidReference, match="does not exist"):
            store.read(a)
        with pytest.raises(InvalidReference, match=r"reclaimed \(tombstoned\)"):
            store.retain("late", [a])
        with pytest.raises(InvalidReference, match="reclaimed"):
            _pub(store, "b", deps=[a])


def test_owner_keeps_pack_and_release_frees_it(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.retain("checkpoint-1", [a])
        store.release_publications([a])
        assert store.collect_garbage()["reclaimed_files"] == 0
        assert bytes(next(store.read(a)).payload) == b"a" * 100
        assert store.owners() == ["checkpoint-1"]
        assert store.release("checkpoint-1") is True
        assert store.release("checkpoint-1") is False  # unknown owner: False, documented
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_retain_replaces_roots(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        b = _pub(store, "b")
        store.seal()
        store.retain("o", [a])
        store.retain("o", [b])  # replaces: a is no longer retained
        store.release_publications([a, b])
        res = store.collect_garbage()
        assert res["tombstoned"] == [a.path]
        assert b.path in res["retained_pack_paths"]


def test_dependencies_are_retained_transitively_across_packs(tmp_path):
    with _store(tmp_path) as store:
        base = _pub(store, "base")
        store.seal()
        mid = _pub(store, "mid", deps=[base])
        store.seal()
        top, sibling = store.publish_many(
            [Publication([Record("top", b"t")], dependencies=[mid]),
             Publication([Record("sib", b"s")], dependencies=[0])],
            submission_id="batch",
        )
        store.seal()
        store.retain("owner", [sibling])  # sibling -> top (same pack) -> mid -> base
        store.release_publications([base, mid, top, sibling])
        res = store.collect_garbage()
        assert res["reclaimed_files"] == 0
        assert {base.path, mid.path, top.path} <= set(res["retained_pack_paths"])
        store.release("owner")
        assert store.collect_garbage()["reclaimed_files"] == 3


def test_staged_publication_protects_its_dependencies(tmp_path):
    with _store(tmp_path) as store:
        base = _pub(store, "base")
        store.seal()
        store.release_publications([base])
        child = _pub(store, "child", deps=[base])  # staged: protects base
        store.seal()
        assert store.collect_garbage()["reclaimed_files"] == 0
        store.release_publications([child])
        assert store.collect_garbage()["reclaimed_files"] == 2


def test_pin_holds_during_the_block(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.release_publications([a])
        with store.pin([a]) as pin:
            assert pin.owner.startswith("publication:pin:") and pin.owner in store.owners()
            assert store.collect_garbage()["reclaimed_files"] == 0
            assert bytes(next(store.read(a)).payload) == b"a" * 100
        assert store.owners() == []
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_owner_names_and_bad_arguments(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        for name in ("queue:q", "publication:x", "publication:pin:me"):
            with pytest.raises(ValueError, match="reserved"):
                store.retain(name, [a])
        with pytest.raises(ValueError, match="non-empty"):
            store.retain("", [a])
        with pytest.raises(TypeError, match="owner must be a str"):
            store.retain(3, [a])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="list of references"):
            store.retain("o", a)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"refs\[0\] must be a RecordSetRef"):
            store.retain("o", ["x"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="belongs to straw"):
            store.release("queue:q")
        with pytest.raises(ValueError, match="belongs to straw"):
            store.release("publication:x")
        assert store.release("nobody") is False


def test_a_publication_without_external_dependencies_writes_nothing_to_the_catalog(tmp_path):
    class CatalogWrites(PosixFS):
        writes = 0

        def writev(self, fd, buffers, offset):  # type: ignore[no-untyped-def]
            if self.catalog_fds and fd in self.catalog_fds:
                CatalogWrites.writes += 1
            return super().writev(fd, buffers, offset)

        catalog_fds: set[int] = set()

        def open(self, path, **kw):  # type: ignore[no-untyped-def]
            fd = super().open(path, **kw)
            if path.endswith("CATALOG"):
                self.catalog_fds.add(fd)
            return fd

        def close(self, fd):  # type: ignore[no-untyped-def]
            self.catalog_fds.discard(fd)
            super().close(fd)

    fs = CatalogWrites()
    with _store(tmp_path, fs=fs) as store:
        first = _pub(store, "warm-up")  # opens the pack: one catalog write per pack
        before = CatalogWrites.writes
        refs = [_pub(store, f"p{i}") for i in range(20)]
        refs.append(store.publish([Record("same-pack-dep", b"x")], submission_id="d",
                                  dependencies=[first]))
        assert CatalogWrites.writes == before
        store.seal()  # once per pack: one transaction and its (unsynced) confirm frame
        assert CatalogWrites.writes == before + 2


def test_interrupted_collection_is_finished_by_the_next(tmp_path):
    class CrashOnUnlink(PosixFS):
        armed = True

        def unlink_beneath(self, root, rel):  # type: ignore[no-untyped-def]
            if self.armed and rel.endswith(".pack"):  # how a collection deletes a pack
                raise KeyboardInterrupt("simulated crash between tombstone and unlink")
            super().unlink_beneath(root, rel)

    fs = CrashOnUnlink()
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        b = _pub(store, "b")
        store.seal()
        store.release_publications([a, b])
    crashing = _store(tmp_path, fs=fs)
    with pytest.raises(KeyboardInterrupt):
        crashing.collect_garbage()
    crashing.catalog.close()
    assert (tmp_path / a.path).exists()
    # another client already removed one of them: ENOENT on unlink is success
    os.unlink(tmp_path / b.path)
    with _store(tmp_path) as store:
        with pytest.raises(InvalidReference, match="tombstoned"):
            store.retain("o", [a])  # the tombstone was durable before any unlink (D3)
        res = store.collect_garbage()
        assert sorted(res["finished_interrupted"]) == sorted([a.path, b.path])
        assert res["reclaimed_files"] == 2 and res["tombstoned"] == []
        assert not (tmp_path / a.path).exists()
        assert store.collect_garbage()["reclaimed_files"] == 0


def test_unlink_errors_other_than_enoent_are_raised(tmp_path):
    class EIOUnlink(PosixFS):
        def unlink_beneath(self, root, rel):  # type: ignore[no-untyped-def]
            raise OSError(errno.EIO, "I/O error", rel)

    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.release_publications([a])
    with _store(tmp_path, fs=EIOUnlink()) as store:
        with pytest.raises(StorageUnavailable, match="cannot unlink"):
            store.collect_garbage()


def test_restart_seals_a_dead_writers_open_pack_in_the_catalog(tmp_path):
    store = _store(tmp_path)
    a = _pub(store, "a")
    # the process dies: no close(), no seal; its lock dies with it
    store._writer.release()  # type: ignore[union-attr]
    store.catalog.close()
    with _store(tmp_path) as again:
        again.publish([Record("b", b"b")], submission_id="b")  # starts the new incarnation
        with again.catalog.locked() as st:
            assert st.packs[a.path].state == "sealed"
        again.release_publications([a])
        assert again.collect_garbage()["tombstoned"] == [a.path]


def test_catalog_torn_tail_is_repaired_and_corruption_fails_closed(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.retain("o", [a])
    cat = tmp_path / "CATALOG"
    good = cat.read_bytes()
    # a dying client's bytes at the end of the data (the file's tail is reserved zeros)
    end = fr.scan_frames(lambda o, n: good[o:o + n], len(good)).end
    garbage = b"\x00garbage-from-a-dying-client"
    cat.write_bytes(good[:end] + garbage + good[end + len(garbage):])
    with _store(tmp_path) as store:
        assert store.owners() == ["o"]
    cut = cat.read_bytes()
    assert cut[:end] == good[:end] and not any(cut[end:])  # cut off under the lock
    damaged = bytearray(good)
    damaged[fr.HEADER_SIZE + 5] ^= 0xFF  # inside the first transaction; later ones follow
    cat.write_bytes(damaged)
    with _store(tmp_path) as store:
        with pytest.raises(CorruptData, match="catalog"):
            store.owners()


def test_catalog_of_a_newer_format_is_unsupported(tmp_path):
    import msgpack

    frame = fr.encode_frame(fr.KIND_CATALOG,
                            msgpack.packb({"v": 9, "ops": [{"op": "init", "v": 9}]}),
                            group_start=0)
    with _store(tmp_path) as store:
        pass
    (tmp_path / "CATALOG").write_bytes(frame)
    with _store(tmp_path) as store:
        with pytest.raises(UnsupportedSchema, match="version 9"):
            store.owners()


def test_announced_adopts_share_one_catalog_transaction(tmp_path):
    """Group commit for the catalog: a writer of pending adopts waits (bounded) for an
    announced sibling, and both additions go into one transaction with one fsync."""
    import threading
    import time

    from fault_injection.faultyfs import FaultyFS
    from straw.catalog import Catalog

    fs = FaultyFS(PosixFS())
    cat = Catalog(fs, str(tmp_path), "run")
    cat.siblings.group_wait = 30.0
    with cat.locked():
        pass  # creates the catalog

    def fsyncs() -> int:
        return sum(1 for e in fs.plan.trace if e.op in ("fsync", "fdatasync"))

    before = fsyncs()
    announced, go = threading.Event(), threading.Event()

    def sibling() -> None:
        with cat.adopting_soon() as a:
            announced.set()
            go.wait(10)
            assert cat.adopt("queue:d/q", 1, add=[("p/b", 0)], announced=a)

    t = threading.Thread(target=sibling)
    t.start()
    assert announced.wait(10)
    leader = threading.Thread(target=lambda: cat.adopt("queue:d/q", 1, add=[("p/a", 0)]))
    leader.start()
    deadline = time.monotonic() + 10
    while cat.siblings.waits == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    go.set()
    for th in (leader, t):
        th.join(10)
    assert not leader.is_alive() and cat.siblings.waits == 1  # woken by the arrival
    assert fsyncs() - before == 1
    with cat.locked() as st:
        assert st.owners[("run", "queue:d/q")] == {("p/a", 0), ("p/b", 0)}
    # a lone adopt never waits
    cat.adopt("queue:d/q", 1, add=[("p/c", 0)])
    assert cat.siblings.waits == 1
    cat.close()
