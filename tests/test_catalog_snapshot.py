"""Catalog snapshots and compaction (issue 13 item 1, invariant CS1).

A client opens the pool from the latest durable catalog snapshot plus the catalog's suffix
(D9's rule applied to the catalog); a compaction writes the snapshot, then a durable copy of
the new base frame, then truncates the catalog in place (its inode is the pool lock) and
writes the base frame.  A crash at any step leaves the old or the new catalog state, never
a mix; a client that opens meanwhile sees a consistent state; repair of a damaged catalog
keeps working across snapshots; on a full disk compaction refuses cleanly."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import msgpack
import pytest

from fault_injection import catalog_campaign as campaign
from fault_injection.controls import COMPACTION_CONTROLS
from straw import CorruptData, QuotaExceeded, Record, SharedFilesystemStore
from straw import framing as fr
from straw.catalog import Catalog, CatalogState, read_state
from straw.catalog_snapshot import HEAD_NAME, SNAP_PREFIX
from straw.clock import ManualClock
from straw.fs import PosixFS


def _store(root: Any, writer: str = "w", **kw: Any) -> SharedFilesystemStore:
    kw.setdefault("reserve_bytes", 0)
    kw.setdefault("clock", ManualClock())
    kw.setdefault("visibility_retries", 1)
    s = SharedFilesystemStore(str(root), "run", writer_id=writer, **kw)
    s.catalog.compact_after = None  # compaction only when a test asks for it
    return s


def _pub(store: SharedFilesystemStore, name: str, deps: tuple[Any, ...] = ()) -> Any:
    return store.publish([Record(name, name.encode() * 30)], submission_id=name,
                         dependencies=list(deps))


def canon(st: CatalogState) -> tuple[Any, ...]:
    """Everything a catalog state holds, comparable (the edge index without empty sets)."""
    packs = {p: (i.state, i.offsets, frozenset(i.unstaged), i.tombstoned, i.unlinked)
             for p, i in st.packs.items()}
    return (packs, dict(st.edges), {p: frozenset(v) for p, v in st.edge_offsets.items() if v},
            {k: frozenset(v) for k, v in st.owners.items()}, dict(st.owner_epochs),
            dict(st.v1_owners), frozenset(st.unconfirmed_repairs))


def _state(store: SharedFilesystemStore) -> tuple[Any, ...]:
    with store.catalog.locked() as st:
        return canon(st)


def _fresh(root: Any) -> tuple[tuple[Any, ...], dict[str, int]]:
    """What a new client (a fresh process) opens: the state and the catalog's footprint."""
    cat = Catalog(PosixFS(), str(root), "run")
    try:
        with cat.locked() as st:
            return canon(st), cat.footprint()
    finally:
        cat.close()


def _history(s: SharedFilesystemStore) -> list[Any]:
    """Every kind of catalog state: packs open and sealed, edges, owners, an adopted and
    fenced queue owner, pins, released staging, tombstones and unlinks."""
    a = _pub(s, "a")
    b = _pub(s, "b", (a,))
    s.seal()
    c = _pub(s, "c")
    d = _pub(s, "d", (b,))
    s.retain("keep", [d])
    s.retain("other", [c, a])
    s.release("other")
    s.catalog.adopt("queue:ns/q", 3, add=[(c.path, c.offset)])
    assert not s.catalog.adopt("queue:ns/q", 2, add=[(a.path, a.offset)])  # fenced
    s.release_publications([a, b, c, d])
    s.seal()
    e = _pub(s, "e")
    s.seal()
    s.release_publications([e])
    s.collect_garbage()  # e's pack: tombstoned and unlinked
    pin = s.pin([c])
    pin.__enter__()
    return [a, b, c, d, pin]


def _catalog_ops(root: Any) -> list[list[dict[str, Any]]]:
    data = (root / "CATALOG").read_bytes()
    frames = fr.scan_frames(lambda o, n: data[o:o + n], len(data)).frames
    return [msgpack.unpackb(f.body, raw=False)["ops"] for f in frames]


def test_open_from_snapshot_plus_suffix(tmp_path: Any) -> None:
    s = _store(tmp_path)
    a, b, c, d, pin = _history(s)
    before = _state(s)
    assert before[0] and before[1] and before[3]  # packs, edges, owners: a real state
    rep = s.catalog.compact()
    assert rep is not None and rep["generation"] == 1 and rep["suffix_ops"] == 0
    ops = _catalog_ops(tmp_path)
    # the history left the catalog: it holds the base frame (and its confirm) only
    assert ops[0][0]["op"] == "base" and ops[0][0]["snap"] == rep["snapshot"]
    assert all(not o for o in ops[1:])
    assert (tmp_path / rep["snapshot"]).exists() and (tmp_path / HEAD_NAME).exists()
    assert _fresh(tmp_path)[0] == before
    assert canon(read_state(PosixFS(), str(tmp_path))) == before
    # the suffix: later operations replay on top of the snapshot
    s.retain("after", [b])
    s.release("keep")
    pin.__exit__(None, None, None)
    expected = _state(s)
    got, foot = _fresh(tmp_path)
    assert got == expected and foot["generation"] == 1
    assert canon(read_state(PosixFS(), str(tmp_path))) == expected
    # a second generation replaces the first (its snapshot is deleted)
    rep2 = s.catalog.compact()
    assert rep2 is not None and rep2["generation"] == 2
    snaps = sorted(n for n in os.listdir(tmp_path) if n.startswith(SNAP_PREFIX))
    assert snaps == [rep2["snapshot"]]
    assert _fresh(tmp_path) == (expected, _fresh(tmp_path)[1])
    s.collect_garbage()  # the pool goes on working from the snapshot
    s.close()
    with _store(tmp_path, "w2") as again:
        assert sorted(again.owners()) == ["after", "queue:ns/q"]
        assert bytes(next(again.read(b)).payload) == b"b" * 30


def test_a_client_that_replayed_before_the_compaction_follows_it(tmp_path: Any) -> None:
    one, two = _store(tmp_path, "w1"), _store(tmp_path, "w2")
    r1 = _pub(one, "r1")
    one.retain("x", [r1])
    assert two.owners() == ["x"]  # two replayed the old catalog
    one.catalog.compact()
    r2 = _pub(two, "r2")
    two.retain("y", [r2])  # two notices the new base frame and replays from it
    assert sorted(one.owners()) == sorted(two.owners()) == ["x", "y"]
    assert _state(one) == _state(two) == _fresh(tmp_path)[0]
    one.close()
    two.close()


def test_operations_during_the_snapshot_become_the_suffix(tmp_path: Any) -> None:
    one, two = _store(tmp_path, "w1"), _store(tmp_path, "w2")
    r = [_pub(one, f"r{i}") for i in range(3)]
    one.retain("x", r[:1])
    job = one.catalog._write_snapshot()  # steps 1-2: the snapshot covers x only
    assert job is not None
    two.retain("y", r[1:2])  # committed while the snapshot was written
    two.release("x")
    rep = one.catalog._make_base(job)
    assert rep is not None and rep["suffix_ops"] == 2
    assert _fresh(tmp_path)[0] == _state(two) == _state(one)
    assert one.owners() == ["y"]
    one.close()
    two.close()


def test_a_compaction_overtaken_by_another_changes_nothing(tmp_path: Any) -> None:
    one, two = _store(tmp_path, "w1"), _store(tmp_path, "w2")
    one.retain("x", [_pub(one, "r")])
    job = one.catalog._write_snapshot()
    assert job is not None
    assert two.catalog.compact() is not None  # two compacts first
    assert one.catalog._make_base(job) is None  # one's snapshot is dropped, not installed
    assert not (tmp_path / job.name).exists()
    assert _fresh(tmp_path)[1]["generation"] == 1
    assert _state(one) == _state(two) == _fresh(tmp_path)[0]
    one.close()
    two.close()


def test_automatic_compaction_in_the_background(tmp_path: Any) -> None:
    s = _store(tmp_path)
    s.catalog.compact_after = 4096
    refs = [_pub(s, f"r{i}") for i in range(40)]
    for i, ref in enumerate(refs):
        s.retain(f"o{i}", [ref])
    compactor = s.catalog._compactor
    assert compactor is not None
    compactor.join()
    assert s.catalog.compactions["done"] >= 1, s.catalog.compactions
    assert s.catalog.compactions["errors"] == 0, s.catalog.compactions
    got, foot = _fresh(tmp_path)
    assert got == _state(s) and foot["generation"] >= 1
    assert foot["suffix_bytes"] < 4096 + 2048
    s.close()


# --- crash points inside compaction (the crash campaign's compaction workload) -------------

def _compaction_points() -> list[int]:
    points = campaign.compaction_points()
    assert points, "the workload compacts"
    return points


def test_crash_at_every_step_of_compaction_leaves_old_or_new_state() -> None:
    points = _compaction_points()
    assert len(points) >= 20
    bad = []
    for nth in points:
        for when, mode in (("before", "power/torn-op"), ("after", "kill"),
                           ("after", "power/clear-cache")):
            msg = campaign.run_state("compact", nth, when, mode)
            if msg is not None:
                bad.append(msg)
    assert not bad, bad[0]


def test_compaction_controls_are_caught() -> None:
    """Negative controls: a compaction that truncates before its snapshot is durable, or
    forgets the suffix, breaks CS1 at some crash point of the same campaign."""
    found = campaign.run_compaction_controls()
    assert set(found) == set(COMPACTION_CONTROLS)
    missed = [name for name, v in found.items() if v is None]
    assert not missed, missed


# --- repair across a snapshot ------------------------------------------------------------

def _flip(path: Any, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_repair_of_a_damaged_suffix_frame_after_a_snapshot(tmp_path: Any) -> None:
    s = _store(tmp_path)
    r = [_pub(s, f"r{i}") for i in range(3)]
    s.retain("x", r[:1])
    s.catalog.compact()
    s.retain("y", r[1:2])  # the suffix: damaged below
    s.retain("z", r[2:3])
    s.close()
    data = (tmp_path / "CATALOG").read_bytes()
    frames = fr.scan_frames(lambda o, n: data[o:o + n], len(data)).frames
    y = next(f for f in frames if any(o.get("owner") == "y" for o in
                                      msgpack.unpackb(f.body, raw=False)["ops"]))
    _flip(tmp_path / "CATALOG", y.offset + fr.HEADER_SIZE + 3)
    s = _store(tmp_path)
    with pytest.raises(CorruptData, match="repair_catalog"):
        s.owners()
    (rep,) = s.repair_catalog()
    assert rep["offset"] == y.offset and rep["lost_bytes"] > 0
    assert sorted(s.owners()) == ["x", "z"]  # the snapshot's x and the later z survive
    with pytest.raises(Exception, match="confirm_catalog_repair"):
        s.collect_garbage()
    assert s.confirm_catalog_repair() == [rep["side_file"]]
    s.catalog.compact()  # a repaired catalog compacts like any other
    assert _fresh(tmp_path)[0] == _state(s)
    s.close()


def test_a_damaged_base_frame_is_restored_from_its_copy(tmp_path: Any) -> None:
    s = _store(tmp_path)
    r = [_pub(s, f"r{i}") for i in range(2)]
    s.retain("x", r[:1])
    s.catalog.compact()
    s.retain("y", r[1:])
    s.close()
    expected = _fresh(tmp_path)[0]
    _flip(tmp_path / "CATALOG", fr.HEADER_SIZE + 5)  # inside the base frame's body
    s = _store(tmp_path)
    with pytest.raises(CorruptData, match="offset 0"):
        s.owners()
    (rep,) = s.repair_catalog()
    assert rep["offset"] == 0 and rep["lost_bytes"] == 0 and rep["restored_from"] == HEAD_NAME
    assert (tmp_path / rep["side_file"]).exists()  # the damaged bytes are kept aside
    assert _state(s) == expected  # nothing lost: no repair to confirm, collection goes on
    s.collect_garbage()
    s.close()


def test_a_damaged_snapshot_fails_closed(tmp_path: Any) -> None:
    s = _store(tmp_path)
    s.retain("x", [_pub(s, "r")])
    rep = s.catalog.compact()
    assert rep is not None
    s.close()
    _flip(tmp_path / rep["snapshot"], 100)
    cat = Catalog(PosixFS(), str(tmp_path), "run")
    with pytest.raises(CorruptData, match=rep["snapshot"]):
        with cat.locked():
            pass
    cat.close()
    with pytest.raises(CorruptData, match="digest"):
        read_state(PosixFS(), str(tmp_path))


def test_an_empty_catalog_with_a_head_copy_rolls_forward(tmp_path: Any) -> None:
    """The crash window between truncation and the base frame: the next client writes
    the head copy back (the new state)."""
    s = _store(tmp_path)
    s.retain("x", [_pub(s, "r")])
    s.close()  # seals the pack (after the base frame: the suffix)
    s = _store(tmp_path)
    s.catalog.compact()
    expected = _state(s)
    s.close()
    os.truncate(tmp_path / "CATALOG", 0)
    assert canon(read_state(PosixFS(), str(tmp_path))) == expected
    got, foot = _fresh(tmp_path)
    assert got == expected and foot["generation"] == 1
    assert (tmp_path / "CATALOG").read_bytes().startswith((tmp_path / HEAD_NAME).read_bytes())


# --- a full disk --------------------------------------------------------------------------

def _fill(where: str) -> str:
    """Fill the filesystem of ``where`` to the last byte; returns the filler's path."""
    path = os.path.join(where, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (64 << 10, 4096, 512, 1):
            while True:
                try:
                    os.write(fd, b"\xff" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return path


@pytest.mark.parametrize("small_tmpfs", [8 << 20], indirect=True)
def test_compaction_on_a_full_disk_refuses_cleanly(small_tmpfs: str) -> None:
    root = os.path.join(small_tmpfs, "pool")
    s = SharedFilesystemStore(root, "run", writer_id="w", reserve_bytes=0)
    s.catalog.compact_after = None
    refs = [s.publish([Record(f"r{i}", b"x" * 100)], submission_id=f"r{i}")
            for i in range(200)]
    for i, ref in enumerate(refs):
        s.retain(f"o{i}", [ref])
    s.seal()
    before = _state(s)
    names = set(os.listdir(root))
    filler = _fill(small_tmpfs)
    try:
        with pytest.raises(QuotaExceeded):
            s.catalog.compact()
        assert set(os.listdir(root)) == names  # no snapshot, head copy or temp file left
        assert _state(s) == before == canon(read_state(PosixFS(), root))
        # the full pool still frees itself: releases and a collection
        for i in range(100):
            s.release(f"o{i}")
        s.release_publications(refs)
        s.collect_garbage()
    finally:
        os.unlink(filler)
    rep = s.catalog.compact()  # space again: the compaction goes through
    assert rep is not None
    assert _fresh(root)[0] == _state(s)
    assert sorted(s.owners()) == sorted(f"o{i}" for i in range(100, 200))
    s.close()


# --- a second client opening while the first compacts, on two JuiceFS mounts -------------

def _prefix_consistent(st: CatalogState, refs: dict[str, Any]) -> int:
    """The owners a writer retains in order o0, o1, ...: a consistent state holds exactly
    a prefix of them, each with its root.  Returns the prefix length."""
    names = sorted((n for (run, n) in st.owners if run == "run"), key=lambda n: int(n[1:]))
    assert names == [f"o{i}" for i in range(len(names))], names
    for n in names:
        ref = refs[n]
        assert st.owners[("run", n)] == {(ref.path, ref.offset)}, n
    return len(names)


def _concurrent_open_during_compaction(a: str, b: str, n: int = 60) -> None:
    writer = _store(a, "wa")
    refs = {f"o{i}": _pub(writer, f"p{i}") for i in range(n)}
    writer.seal()
    done = threading.Event()
    errors: list[BaseException] = []
    compactions = [0]

    def write() -> None:
        try:
            for i in range(n):
                writer.retain(f"o{i}", [refs[f"o{i}"]])
                if i % 6 == 5:
                    job = writer.catalog._write_snapshot()
                    writer.retain(f"o{i}", [refs[f"o{i}"]])  # same content: a suffix op
                    if job is not None and writer.catalog._make_base(job) is not None:
                        compactions[0] += 1
        except BaseException as e:  # surfaced below
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=write)
    t.start()
    seen = []
    while not done.is_set() or len(seen) < 3:
        cat = Catalog(PosixFS(), b, "run")  # a fresh client on the other mount
        try:
            with cat.locked() as st:
                seen.append(_prefix_consistent(st, refs))
        finally:
            cat.close()
        try:
            _prefix_consistent(read_state(PosixFS(), b), refs)  # the lock-free view too
        except CorruptData as e:
            assert "kept changing" in str(e)
    t.join()
    assert not errors, errors[0]
    assert compactions[0] >= 5
    assert seen == sorted(seen)  # never went back
    final = _state(writer)
    cat = Catalog(PosixFS(), b, "run")
    with cat.locked() as st:
        assert _prefix_consistent(st, refs) == n
        assert canon(st) == final
    cat.close()
    writer.close()


def test_concurrent_open_during_compaction_local(tmp_path: Any) -> None:
    _concurrent_open_during_compaction(str(tmp_path), str(tmp_path), n=30)


@pytest.mark.juicefs
def test_concurrent_open_during_compaction_on_two_juicefs_mounts(juicefs_dirs: Any) -> None:
    _concurrent_open_during_compaction(juicefs_dirs.a, juicefs_dirs.b)


def test_root_sets_behave_as_sets_across_a_snapshot() -> None:
    """RootSet (a snapshot's sorted base plus overlays) answers exactly as a set of tuples,
    before and after it is written to a snapshot and read back."""
    import random

    from straw.catalog_roots import RootSet, SortedOffsets

    rng = random.Random(7)
    model: set[tuple[str, int]] = set()
    roots = RootSet()
    for round_ in range(4):
        for _ in range(400):
            e = (f"p{rng.randrange(3)}", rng.randrange(200))
            if rng.random() < 0.7:
                roots.add(e)
                model.add(e)
            else:
                roots.discard(e)
                model.discard(e)
        assert roots == model and len(roots) == len(model) and set(roots) == model
        assert all((e in roots) == (e in model) for e in
                   [(f"p{i}", o) for i in range(4) for o in range(-1, 201)])
        # through a snapshot: the base becomes the sorted arrays
        roots = RootSet.from_packs({p: SortedOffsets.from_le_bytes(b)
                                    for p, b in roots.packed()})
        assert roots == model, round_
        copy = roots.copy()
        copy.add(("p9", 1))
        assert ("p9", 1) not in roots and ("p9", 1) in copy


def test_offset_sets_behave_as_sets_across_a_snapshot() -> None:
    """OffsetSet (a pack's unstaged extents: a snapshot's sorted base plus overlays)
    answers exactly as a set of ints, before and after it is written to a snapshot and
    read back; ``missing_from`` is set difference."""
    import random

    from straw.catalog_roots import OffsetSet, SortedOffsets, le_u64

    rng = random.Random(11)
    model: set[int] = set()
    offs = OffsetSet()
    everything = SortedOffsets(range(0, 300, 3))
    for round_ in range(4):
        for _ in range(300):
            o = rng.randrange(300)
            r = rng.random()
            if r < 0.5:
                offs.add(o)
                model.add(o)
            elif r < 0.8:
                offs.discard(o)
                model.discard(o)
            else:
                more = [rng.randrange(300) for _ in range(5)]
                offs.update(more)
                model.update(more)
        assert offs == model and len(offs) == len(model) and set(offs) == model
        assert all((o in offs) == (o in model) for o in range(-1, 301))
        assert le_u64(offs) == le_u64(model)
        assert set(offs.missing_from(everything)) == set(everything) - model
        assert set(offs.missing_from(frozenset(everything))) == set(everything) - model
        # through a snapshot: the base becomes the sorted array
        offs = OffsetSet.from_base(SortedOffsets.from_le_bytes(le_u64(offs)))
        assert offs == model, round_


def test_a_snapshot_open_keeps_unstaged_extents_as_arrays(tmp_path: Any) -> None:
    """What grows with a job's history is decoded with C-level calls: a fresh client's
    packs hold their unstaged extents as the snapshot's array (no Python set of every
    released publication: a million of them cost ~0.2 s of every open, issue 13), and
    answer as the replayed state does (staged extents, a later unstage)."""
    from straw.catalog_roots import OffsetSet

    s = _store(tmp_path)
    refs = [_pub(s, f"r{i}") for i in range(20)]
    s.seal()
    s.release_publications(refs[:15])
    before = _state(s)
    s.catalog.compact()
    cat = Catalog(PosixFS(), str(tmp_path), "run")
    try:
        with cat.locked() as st:
            (info,) = [i for p, i in st.packs.items() if p == refs[0].path]
            assert isinstance(info.unstaged, OffsetSet)
            assert len(info.unstaged._base) == 15 and not info.unstaged._added
            assert set(info.staged() or ()) == {r.offset for r in refs[15:]}
            assert canon(st) == before
    finally:
        cat.close()
    s.release_publications(refs[15:])  # the suffix adds to the snapshot's array
    got, _ = _fresh(tmp_path)
    assert got == _state(s)
    cat = Catalog(PosixFS(), str(tmp_path), "run")
    try:
        with cat.locked() as st:
            assert not list(st.packs[refs[0].path].staged() or ())
    finally:
        cat.close()
    s.close()


def test_an_empty_catalog_without_its_head_copy_fails_closed(tmp_path: Any) -> None:
    """Snapshots exist, so the pool is not new: an empty catalog without ``CATALOG.head``
    means catalog files were lost; the catalog never starts over."""
    s = _store(tmp_path)
    s.retain("x", [_pub(s, "r")])
    s.catalog.compact()
    s.close()
    os.truncate(tmp_path / "CATALOG", 0)
    os.unlink(tmp_path / HEAD_NAME)
    cat = Catalog(PosixFS(), str(tmp_path), "run")
    with pytest.raises(CorruptData, match="files were lost"):
        with cat.locked():
            pass
    cat.close()
    assert (tmp_path / "CATALOG").read_bytes() == b""  # nothing written
