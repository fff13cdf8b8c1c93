"""The catalog's damaged acknowledged tail versus a torn one, and a full pool that frees
itself (issue 11, findings 3 (catalog half) and 6).

D6 for the catalog: a transaction is followed by a confirm frame of a later write group,
so one flipped byte in the last acknowledged transaction is ``CorruptData`` (fail closed,
the operator repairs it), while a torn, never-acknowledged tail is still cut silently.
Headroom: releasing and collecting work on a full disk (a real, small tmpfs)."""

from __future__ import annotations

import errno
import os

import msgpack
import pytest

from fault_injection import SimFS, SimulatedCrash
from straw import (
    CorruptData,
    QuotaExceeded,
    Record,
    SharedFilesystemStore,
    UnsafeRecovery,
)
from straw import framing as fr
from straw.clock import ManualClock
from tests.tmpfs_fixture import free_bytes


def _store(root, **kw) -> SharedFilesystemStore:  # type: ignore[no-untyped-def]
    kw.setdefault("reserve_bytes", 0)
    kw.setdefault("clock", ManualClock())
    kw.setdefault("visibility_retries", 1)
    return SharedFilesystemStore(str(root), "run", **kw)


def _pub(store, name: str, size: int = 300):  # type: ignore[no-untyped-def]
    return store.publish([Record(name, (name.encode() * size)[:size])], submission_id=name)


def _frames(data: bytes) -> list[fr.ScannedFrame]:
    return fr.scan_frames(lambda o, n: data[o:o + n], len(data)).frames


def _ops(f: fr.ScannedFrame) -> list[dict]:  # type: ignore[type-arg]
    return _ops_of(f.body)


def _ops_of(body) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    return msgpack.unpackb(body, raw=False)["ops"]


def _transaction(path, op: str, owner: str | None = None) -> fr.ScannedFrame:  # type: ignore[no-untyped-def]
    """The last catalog frame holding operation ``op`` (for ``owner``)."""
    frames = [f for f in _frames(path.read_bytes())
              if any(o["op"] == op and (owner is None or o.get("owner") == owner)
                     for o in _ops(f))]
    return frames[-1]


def _flip(path, offset: int) -> None:  # type: ignore[no-untyped-def]
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_flipped_byte_in_last_acknowledged_catalog_transaction_fails_closed(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.release_publications([a])
        store.retain("keep", [a])  # acknowledged: the last transaction of the catalog
    cat = tmp_path / "CATALOG"
    retain = _transaction(cat, "retain")
    _flip(cat, retain.offset + fr.HEADER_SIZE + 3)
    damaged = cat.read_bytes()
    with _store(tmp_path) as store:
        # before: the damaged retain was cut off as a torn tail, and GC reclaimed a's pack
        with pytest.raises(CorruptData, match=rf"offset {retain.offset}.*repair_catalog"):
            store.owners()
        with pytest.raises(CorruptData, match="repair_catalog"):
            store.collect_garbage()
        with pytest.raises(CorruptData, match="repair_catalog"):
            store.release("keep")
    assert (tmp_path / a.path).exists()
    assert cat.read_bytes() == damaged  # never cut


def test_catalog_repair_keeps_damaged_bytes_aside_and_later_transactions_and_stops_gc(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        b = _pub(store, "b")
        store.seal()
        store.release_publications([a, b])
        store.retain("first", [a])
        store.retain("second", [b])  # a later, valid transaction
    live = _store(tmp_path, writer_id="live")
    assert live.owners() == ["first", "second"]  # replayed past what will be damaged
    cat = tmp_path / "CATALOG"
    first = _transaction(cat, "retain", "first")
    raw = cat.read_bytes()[first.offset:first.offset + first.header.frame_length]
    _flip(cat, first.offset + fr.HEADER_SIZE + 7)
    with _store(tmp_path) as store, _store(tmp_path, writer_id="other") as other:
        with pytest.raises(CorruptData, match="repair_catalog"):
            other.owners()
        reports = store.repair_catalog()
        assert [(r["offset"], r["lost_bytes"]) for r in reports] == \
            [(first.offset, first.header.frame_length)]
        side = tmp_path / reports[0]["side_file"]
        kept = side.read_bytes()
        assert kept[:len(raw)] != raw and len(kept) >= len(raw)  # the damaged bytes, aside
        assert sum(x != y for x, y in zip(kept, raw, strict=False)) == 1
        # only the damaged transaction is lost; the later one is kept, on every client
        assert store.owners() == other.owners() == ["second"]
        for client in (store, other, live):
            with pytest.raises(UnsafeRecovery, match="confirm_catalog_repair"):
                client.collect_garbage()
        store.retain("first", [a])  # the operator re-retains what must live
        assert other.confirm_catalog_repair() == [reports[0]["side_file"]]
        assert store.collect_garbage()["tombstoned"] == []
        assert live.collect_garbage()["tombstoned"] == []
        assert store.repair_catalog() == []  # nothing left to repair
    live.close()
    with _store(tmp_path) as fresh:
        assert fresh.owners() == ["first", "second"]
        assert next(fresh.read(a)).payload == b"a" * 300
        fresh.release("first")
        assert fresh.collect_garbage()["tombstoned"] == [a.path]


def test_repair_of_a_damaged_confirm_keeps_the_transactions_around_it(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.release_publications([a])
        store.retain("one", [a])
        store.retain("two", [a])
    cat = tmp_path / "CATALOG"
    frames = _frames(cat.read_bytes())
    one = _transaction(cat, "retain", "one")
    confirm = next(f for f in frames if f.offset > one.offset)
    assert _ops(confirm) == []
    _flip(cat, confirm.offset + fr.HEADER_SIZE + 1)
    with _store(tmp_path) as store:
        with pytest.raises(CorruptData, match=f"offset {confirm.offset}"):
            store.owners()
        # the damaged region (one confirm) is too short for the repair's own frame: the
        # next transaction is absorbed into it, operations and all
        [report] = store.repair_catalog()
        assert report["offset"] == confirm.offset
        assert report["lost_bytes"] == confirm.header.frame_length
        assert store.owners() == ["one", "two"]
        with pytest.raises(UnsafeRecovery):
            store.collect_garbage()
        store.confirm_catalog_repair()
        assert store.collect_garbage()["tombstoned"] == []
    with _store(tmp_path) as fresh:
        assert fresh.owners() == ["one", "two"]


def test_client_replays_from_the_start_when_the_catalog_was_rewritten_under_it(tmp_path):
    with _store(tmp_path / "p1") as store:
        a = _pub(store, "a")
        store.retain("x", [a])
    with _store(tmp_path / "p2") as store:
        b = _pub(store, "b")
        store.retain("y", [b])
        store.retain("z", [b])
    client = _store(tmp_path / "p1")
    assert client.owners() == ["x"]
    # the catalog's bytes where this client stopped replaying changed (as a repair that
    # absorbs frames rewrites them): it must not resume from its old offset
    target = tmp_path / "p1" / "CATALOG"
    with open(target, "r+b") as f:
        f.write((tmp_path / "p2" / "CATALOG").read_bytes())
    assert client.owners() == ["y", "z"]
    client.close()


def test_torn_last_catalog_transaction_is_still_cut_silently(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.retain("keep", [a])
    cat = tmp_path / "CATALOG"
    good = cat.read_bytes()
    scan = fr.scan_frames(lambda o, n: good[o:o + n], len(good))
    # a client that died mid-append: half of its transaction, in the last frame's group
    frame = fr.encode_frame(fr.KIND_CATALOG, msgpack.packb(
        {"v": 1, "ops": [{"op": "release", "owner": "keep"}]}),
        group_start=scan.frames[-1].offset)
    with open(cat, "r+b") as f:
        f.seek(scan.end)
        f.write(frame[:len(frame) // 2])
    with _store(tmp_path) as store:
        assert store.owners() == ["keep"]
    cut = cat.read_bytes()
    assert cut[:scan.end] == good[:scan.end] and not any(cut[scan.end:])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("CATALOG.")) == []


def test_complete_torn_catalog_frame_is_kept_aside_before_the_cut(tmp_path):
    with _store(tmp_path) as store:
        a = _pub(store, "a")
        store.seal()
        store.retain("keep", [a])
    cat = tmp_path / "CATALOG"
    good = cat.read_bytes()
    scan = fr.scan_frames(lambda o, n: good[o:o + n], len(good))
    # a whole, never-acknowledged frame of the last (unsynced) group with a garbage byte:
    # a torn tail, but all its bytes are present, so they are copied aside first
    frame = bytearray(fr.encode_frame(fr.KIND_CATALOG, msgpack.packb(
        {"v": 1, "ops": [{"op": "release", "owner": "keep"}]}),
        group_start=scan.frames[-1].offset))
    frame[-3] ^= 0x01
    with open(cat, "r+b") as f:
        f.seek(scan.end)
        f.write(frame)
    with _store(tmp_path) as store:
        assert store.owners() == ["keep"]
    side = tmp_path / f"CATALOG.torn-{scan.end}-0"
    assert side.read_bytes() == bytes(frame)
    assert not any(cat.read_bytes()[scan.end:])


@pytest.mark.parametrize("variant", ["torn-op", "torn-seq", "clear-cache"])
def test_power_loss_tearing_the_unsynced_catalog_group_is_recovered(variant):
    for seed in range(16):
        sim = SimFS(seed)
        store = SharedFilesystemStore("/pool", "run", fs=sim, clock=ManualClock(),
                                      reserve_bytes=0, visibility_retries=1)
        a = _pub(store, "a")
        store.seal()
        store.retain("one", [a])
        # the next transaction is written but the machine dies before its fsync: (confirm
        # of "one" + the transaction) is one unsynced write group, torn by the power loss
        sim.crash_at(1, ops=["fsync", "fdatasync"], path="CATALOG$")
        with pytest.raises(SimulatedCrash):
            store.retain("two", [a])
        sim.crash(variant)
        again = SharedFilesystemStore("/pool", "run", fs=sim, clock=ManualClock(),
                                      reserve_bytes=0, visibility_retries=1)
        assert again.owners() in (["one"], ["one", "two"]), (variant, seed)
        again.collect_garbage()
        assert next(again.read(a)).payload == (b"a" * 300)
        again.close()


def test_writer_killed_before_its_confirm_is_confirmed_by_the_next_client():
    sim = SimFS(3)

    def open_store(name: str) -> SharedFilesystemStore:
        return SharedFilesystemStore("/pool", "run", fs=sim.client(name), clock=ManualClock(),
                                     writer_id=name, reserve_bytes=0, visibility_retries=1)

    store = open_store("w")
    a = _pub(store, "a")
    store.seal()
    store.release_publications([a])
    # the retain's frame is written and synced; the process dies before its confirm
    sim.crash_at(2, ops="writev", path="CATALOG$", client="w")
    with pytest.raises(SimulatedCrash):
        store.retain("keep", [a])
    sim.kill_client("w")  # process death: the written bytes stay intact
    other = open_store("other")
    assert other.owners() == ["keep"]  # replayed, and now followed by a confirm
    path = "/pool/CATALOG"
    data = sim.files()[path]
    frames = _frames(data)
    retain = next(f for f in frames if any(o["op"] == "retain" for o in _ops(f)))
    assert frames[-1].offset > retain.offset and _ops(frames[-1]) == []
    i = retain.offset + fr.HEADER_SIZE + 2
    fd = sim.open(path, write=True)
    sim.writev(fd, [bytes([data[i] ^ 0x01])], i)
    sim.fsync(fd)
    sim.close(fd)
    with pytest.raises(CorruptData, match="repair_catalog"):
        open_store("third").owners()


def _fill_with_publications(store: SharedFilesystemStore) -> list:  # type: ignore[type-arg]
    """Publish ever smaller publications until even a tiny one is refused."""
    refs = []
    size = 128 << 10
    n = 0
    while size >= 64:
        try:
            refs.append(store.publish([Record(f"r{n}", os.urandom(size))],
                                      submission_id=f"s{n}"))
            n += 1
        except QuotaExceeded:
            size //= 2
    return refs


def _ballast(root: str) -> None:
    """Whatever room is left (less than a publication), taken by another program."""
    with open(os.path.join(root, "ballast"), "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\xff" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC


def test_full_pool_frees_itself_through_straw(small_tmpfs):
    root = os.path.join(small_tmpfs, "pool")
    # reserve_bytes=0 for packs: the test holds however much a pack reserves ahead
    store = _store(root, segment_target_bytes=256 << 10)
    keep = _pub(store, "keep")
    store.retain("ckpt", [keep])
    refs = _fill_with_publications(store)
    assert len(refs) > 10
    _ballast(small_tmpfs)
    full = free_bytes(small_tmpfs)
    assert full < 4096
    with pytest.raises(QuotaExceeded):
        store.publish([Record("more", b"x" * 4096)], submission_id="more")
    # appends that add retention stop where the reserved floor begins ...
    with pytest.raises(QuotaExceeded, match="filesystem is full.*collect_garbage"):
        for i in range(5000):
            store.retain("o", [refs[i % 2]])
    # ... which is kept for freeing appends (before: each needed a new block and failed)
    for r in [keep, *refs]:
        store.release_publications([r])  # one catalog transaction each
    assert store.release("ckpt") is True and store.release("o") is True
    res = store.collect_garbage()
    assert res["reclaimed_files"] > 0 and res["reclaimed_bytes"] > 1 << 20
    assert free_bytes(small_tmpfs) > full + (1 << 20)
    ref = store.publish([Record("again", b"y" * 10_000)], submission_id="again")
    assert next(store.read(ref)).payload == b"y" * 10_000
    store.close()
    with _store(root) as reopened:  # and the catalog replays cleanly afterwards
        assert reopened.owners() == []
        assert next(reopened.read(ref)).payload == b"y" * 10_000


def test_b10_a_full_pool_of_many_owners_frees_itself(small_tmpfs):
    # issue 39 B10: once small retains had filled the disk, releasing hundreds of owners
    # one by one used up the fixed 64 KiB floor, then release and collect_garbage raised
    # QuotaExceeded: the full pool could not free itself.  The floor now keeps what
    # freeing every owner and pack appends.
    root = os.path.join(small_tmpfs, "pool")
    store = _store(root, segment_target_bytes=256 << 10)
    refs = _fill_with_publications(store)
    _ballast(small_tmpfs)
    owners = 0
    with pytest.raises(QuotaExceeded, match="filesystem is full"):
        for i in range(100_000):
            store.retain(f"checkpoint:job/rollout:{i:06d}", [refs[i % len(refs)]])
            owners += 1
    assert owners > 100
    store.release_publications(refs)
    for i in range(owners):  # one catalog transaction each
        assert store.release(f"checkpoint:job/rollout:{i:06d}") is True
    res = store.collect_garbage()
    assert res["reclaimed_files"] > 0 and res["reclaimed_bytes"] > 1 << 20
    ref = store.publish([Record("again", b"y" * 10_000)], submission_id="again")
    assert next(store.read(ref)).payload == b"y" * 10_000
    store.close()


def test_repair_filler_fits_every_region_length():
    """The in-place replacement of a damaged region is one valid frame of exactly its
    length (msgpack's bin header grows at 256 and 65536 bytes: no length is skipped)."""
    from straw.pool.catalog.repair import _filler

    op = {"op": "repaired", "at": 12345, "lost": 99, "side": "CATALOG.damaged-12345-0"}
    lengths = [*range(60, 700), *range(65_500, 65_700), 200_000]
    for length in lengths:
        for ops in ([], [op]):
            frame = _filler(4096, length, ops)
            if frame is None:
                body = msgpack.packb({"v": 1, "ops": ops, "pad": b""})
                assert length < fr.HEADER_SIZE + len(body) + 3, (length, ops)
                continue
            assert len(frame) == length
            header, body = fr.decode_frame(frame)
            assert header.group_start == 4096 and _ops_of(body) == ops


def test_a_retain_names_each_pack_once_and_older_retains_still_replay(tmp_path):
    """Catalog version 4: a retain lists its roots grouped by pack (a checkpoint retaining
    10,000 groups wrote each root's pack path again: 530 KB); a version-3 retain (one
    [path, offset] pair per root) replays to the same owner."""
    from straw import Publication
    from straw.catalog import CatalogState, read_state
    with _store(tmp_path) as store:
        refs = store.publish_many([Publication([Record("x", b"y" * 50)]) for _ in range(200)],
                                  submission_id="many")
        store.seal()  # the next publication goes to a second pack
        refs = [*refs, _pub(store, "last")]
        store.retain("ckpt", refs)
        frame = _transaction(tmp_path / "CATALOG", "retain")
        retain = next(o for o in _ops(frame) if o["op"] == "retain")
        assert "roots" not in retain
        assert [p for p, _ in retain["packs"]] == sorted({r.path for r in refs})
        assert sum(len(offs) for _, offs in retain["packs"]) == 201
        want = {(r.path, r.offset) for r in refs}
        assert set(read_state(store.fs, str(tmp_path)).owners[("run", "ckpt")]) == want
        old = CatalogState()
        old.apply({"op": "retain", "run": "run", "owner": "ckpt",
                   "roots": [[r.path, r.offset] for r in refs]})
        assert set(old.owners[("run", "ckpt")]) == want


def test_b10_a_full_pool_of_many_staged_publications_frees_itself(small_tmpfs):
    # issue 39 B10, the staging side: tens of thousands of small publications fill the
    # disk; their release_publications is one catalog transaction naming each one, far
    # beyond a fixed floor.  The floor keeps what unstaging every staged publication of
    # the sealed packs appends (a few bytes each: unstages name each pack once).
    from straw import Publication
    root = os.path.join(small_tmpfs, "pool")
    store = _store(root, segment_target_bytes=256 << 10)
    refs: list = []
    try:
        for n in range(10_000):
            refs += store.publish_many(
                [Publication([Record("r", b"%08d" % (n * 100 + i))]) for i in range(100)],
                submission_id=f"s{n}")
    except QuotaExceeded:
        pass
    store.seal()
    _ballast(small_tmpfs)
    assert len(refs) > 5_000
    with pytest.raises(QuotaExceeded):
        store.publish([Record("more", b"z" * 4096)], submission_id="more")
    assert store.release_publications(refs) == len(refs)
    res = store.collect_garbage()
    assert res["reclaimed_files"] > 0 and res["reclaimed_bytes"] > 1 << 20
    ref = store.publish([Record("again", b"y" * 10_000)], submission_id="again")
    assert next(store.read(ref)).payload == b"y" * 10_000
    store.close()


def test_an_unstage_names_each_pack_once_and_the_staged_count_stays_exact(tmp_path):
    """Catalog version 5: an unstage groups its extents by pack; a version-4 unstage (one
    [path, offset] pair each) replays the same.  The count of staged publications in
    sealed packs that the floor is sized by, maintained op by op, equals a recount."""
    from straw import Publication
    from straw.catalog import CatalogState, read_state
    with _store(tmp_path) as store:
        assert store.catalog.state.staged_in_sealed_packs() == 0  # counted from here on
        refs = []
        for n in range(3):
            refs += store.publish_many([Publication([Record("r", b"%d" % i)])
                                        for i in range(50)], submission_id=f"s{n}")
            store.seal()
        store.retain("keep", refs[:10])
        store.release_publications(refs[:120])
        store.collect_garbage()
        maintained = store.catalog.state.staged_in_sealed_packs()
        assert maintained == 30
        fresh = read_state(store.fs, str(tmp_path))
        assert fresh.staged_in_sealed_packs() == maintained
        frames = _frames(open(tmp_path / "CATALOG", "rb").read())
        unstages = [op for f in frames for op in _ops(f) if op["op"] == "unstage"]
        assert [len(op["packs"]) for op in unstages] == [3]
        (path, offsets), = [g for g in unstages[0]["packs"] if g[0] == refs[0].segment.path]
        assert len(offsets) == 50
    old = CatalogState()
    for op in [{"op": "sealed", "path": "runs/r/p.pack", "offsets": [0, 64], "unstage": []},
               {"op": "unstage", "extents": [["runs/r/p.pack", 0]]}]:
        old.apply(op)
    assert old.staged_in_sealed_packs() == 1 and 0 in old.packs["runs/r/p.pack"].unstaged
