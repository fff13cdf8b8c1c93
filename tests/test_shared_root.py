"""Several runs sharing one pool root are isolated (issue 11, finding 2).

Owners (and pins, and a coordinator's queue owner) belong to a run; queues live under
their run; a store's collection reclaims only its own run's packs, while reachability stays
pool-wide.  Each test sets up runs A and B in one root and checks that nothing B does
releases, collects or leases A's data.  Catalogs written before owners had a run (format
version 1) keep their retention."""

from __future__ import annotations

import os

import msgpack
import pytest

from straw import (
    Record,
    RecordSetRef,
    SharedFilesystemStore,
    UnsafeRecovery,
    UnsupportedSchema,
    framing,
)
from straw.catalog import Catalog
from straw.catalog_state import LEGACY_RUN
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.protocol import TaskSpec


def _store(root: object, run: str, writer: str = "w") -> SharedFilesystemStore:
    return SharedFilesystemStore(str(root), run, writer_id=writer, reserve_bytes=0)


def _sealed(store: SharedFilesystemStore, name: str) -> RecordSetRef:
    """One publication in a sealed pack of its own, protected by staging only."""
    ref = store.publish([Record(name, f"{store.run_id}:{name}".encode() * 64)],
                        submission_id=name)
    store.seal()
    return ref


def _readable(store: SharedFilesystemStore, ref: RecordSetRef) -> bool:
    recs = list(store.read(ref))
    return bytes(recs[0].payload) == f"{store.run_id}:{recs[0].record_id}".encode() * 64


def _exists(root: object, ref: RecordSetRef) -> bool:
    return os.path.exists(os.path.join(str(root), ref.path))


def test_two_run_ids_in_one_root_retain_of_same_owner_name_keeps_other_runs_roots(tmp_path):
    """B's retain("checkpoint-7") does not replace A's roots, so B's collection cannot
    delete A's retained pack (it was: owner names were global to the root)."""
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra, rb = _sealed(a, "a0"), _sealed(b, "b0")
    a.retain("checkpoint-7", [ra])
    b.retain("checkpoint-7", [rb])
    a.release_publications([ra])
    b.release_publications([rb])
    with a.catalog.locked() as st:
        assert st.owners[("A", "checkpoint-7")] == {(ra.path, ra.offset)}
        assert st.owners[("B", "checkpoint-7")] == {(rb.path, rb.offset)}
    b.collect_garbage()
    a.collect_garbage()
    assert _readable(a, ra) and _readable(b, rb)
    a.close()
    b.close()


def test_two_run_ids_in_one_root_release_of_other_runs_owner_returns_false(tmp_path):
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra = _sealed(a, "a0")
    a.retain("checkpoint-7", [ra])
    a.release_publications([ra])
    assert b.release("checkpoint-7") is False
    assert b.collect_garbage()["reclaimed_files"] == 0
    assert a.collect_garbage()["reclaimed_files"] == 0
    assert _readable(a, ra)
    assert a.release("checkpoint-7") is True
    assert a.collect_garbage()["reclaimed_files"] == 1
    a.close()
    b.close()


def test_two_run_ids_in_one_root_collect_never_deletes_other_runs_files(tmp_path):
    """Even a pack of A that nothing reaches is left to A's own collection."""
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra, rb = _sealed(a, "a0"), _sealed(b, "b0")
    a.release_publications([ra])
    b.release_publications([rb])
    got = b.collect_garbage()
    assert got["tombstoned"] == [rb.path] and got["reclaimed_files"] == 1
    assert all(p.startswith("runs/B/") for p in got["retained_pack_paths"])
    assert _exists(tmp_path, ra) and not _exists(tmp_path, rb)
    assert _readable(a, ra)
    assert a.collect_garbage()["tombstoned"] == [ra.path]
    assert not _exists(tmp_path, ra)
    a.close()
    b.close()


def test_two_run_ids_in_one_root_owners_lists_only_own_run(tmp_path):
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra, rb = _sealed(a, "a0"), _sealed(b, "b0")
    a.retain("shared-name", [ra])
    a.retain("a-only", [ra])
    b.retain("shared-name", [rb])
    assert a.owners() == ["a-only", "shared-name"]
    assert b.owners() == ["shared-name"]
    assert b.collect_garbage()["owner_names"] == ["shared-name"]
    a.close()
    b.close()


def test_two_run_ids_in_one_root_pins_are_per_run(tmp_path):
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra = _sealed(a, "a0")
    a.release_publications([ra])
    with a.pin([ra]) as pin:
        assert a.owners() == [pin.owner] and b.owners() == []
        assert b.release(pin.owner) is False  # a pin of A is not B's to release
        assert a.collect_garbage()["reclaimed_files"] == 0
        assert _readable(a, ra)
    assert a.collect_garbage()["reclaimed_files"] == 1
    a.close()
    b.close()


def test_two_run_ids_in_one_root_queues_of_same_id_are_independent(tmp_path):
    """Both serve at once; B's recover (even a takeover) sees only B's queue and never
    fences A's coordinator or leases A's tasks."""
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B", "wb")
    qa = Coordinator(a, queue_id="rollout")
    qb = Coordinator(b, queue_id="rollout")
    inp = a.publish([Record("prompt", b"of run A")], submission_id="in")
    qa.submit_tasks("r", [TaskSpec("a-task", input_ref=inp)])
    assert qb.acquire("wb", 1).assignments == ()
    qb.close()
    qb = Coordinator(b, queue_id="rollout", recover=True, takeover=True)
    assert qb.pending_tasks() == [] and qb.acquire("wb", 1).assignments == ()
    got = qa.acquire("wa", 1).assignments  # A is not fenced
    assert [x.lease.task_id for x in got] == ["a-task"]
    out = a.publish([Record("out", b"done", metadata={"task_id": "a-task",
                                                      "attempt_id": got[0].lease.attempt_id})],
                    submission_id="out")
    qa.complete_task(got[0].lease, submission_id="c", result_ref=out)
    assert qb.read_commits(0, 10).commits == ()
    assert a.owners() == ["queue:default/rollout"] and b.owners() == ["queue:default/rollout"]
    b.collect_garbage()
    assert _exists(tmp_path, out) and bytes(next(a.read(out)).payload) == b"done"
    for x in (qa, qb, a, b):
        x.close()


def test_two_run_ids_in_one_root_second_coordinator_of_own_run_still_refused(tmp_path):
    """Isolation does not weaken exclusivity within a run (D8)."""
    a, a2 = _store(tmp_path, "A"), _store(tmp_path, "A", "w2")
    qa = Coordinator(a, queue_id="rollout")
    with pytest.raises(UnsafeRecovery, match="served by"):
        Coordinator(a2, queue_id="rollout", recover=True)
    for x in (qa, a, a2):
        x.close()


def test_legacy_root_wide_queue_is_refused_not_replaced(tmp_path):
    """A queue of the former layout (``queues/<ns>/<id>`` for the whole root) makes a
    coordinator refuse to start an empty queue of its run beside it."""
    os.makedirs(tmp_path / "queues" / "default" / "rollout" / "epochs")
    a = _store(tmp_path, "A")
    with pytest.raises(UnsupportedSchema, match="move the directory to .*runs/A/queues"):
        Coordinator(a, queue_id="rollout", recover=True)
    Coordinator(a, queue_id="other").close()  # other queue ids are unaffected
    a.close()


def _rewrite_as_v1(root: object, extra_ops: list[dict[str, object]]) -> None:
    """Turn the catalog into one the previous straw wrote: format version 1, owner
    operations without a run field; then append ``extra_ops`` (old-format operations)."""
    path = os.path.join(str(root), "CATALOG")
    with open(path, "rb") as f:
        data = f.read()
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    ops = []
    for fr in scan.frames:
        for op in msgpack.unpackb(fr.body, raw=False)["ops"]:
            op.pop("run", None)
            ops.append({**op, "v": 1} if op["op"] == "init" else op)
    ops += extra_ops
    out = b""
    for op in ops:
        body = msgpack.packb({"v": 1, "ops": [op]}, use_bin_type=True)
        out += framing.encode_frame(framing.KIND_CATALOG, body, group_start=len(out))
    with open(path, "wb") as f:
        f.write(out)


def test_v1_catalog_owners_keep_retention_and_belong_to_their_run(tmp_path):
    """A catalog written before owners had a run: each v1 owner belongs to the run its
    roots name, keeps protecting them, and only that run lists and releases it."""
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra, ra2, rb = _sealed(a, "a0"), _sealed(a, "a1"), _sealed(b, "b0")
    a.close()
    b.close()
    unstage = [[r.path, r.offset] for r in (ra, ra2, rb)]
    _rewrite_as_v1(tmp_path, [
        {"op": "unstage", "extents": unstage},
        {"op": "retain", "owner": "ckpt", "roots": [[rb.path, rb.offset]]},
        {"op": "retain", "owner": "ckpt", "roots": [[ra.path, ra.offset]]},  # replaced: A's
        {"op": "retain", "owner": "b-keep", "roots": [[rb.path, rb.offset]]},
        {"op": "retain", "owner": "gone", "roots": [[ra2.path, ra2.offset]]},
        {"op": "release", "owner": "gone"},
        # a v1 queue owner: its first claim names no roots, a later addition names A's
        {"op": "adopt", "owner": "queue:default/q", "epoch": 3, "add": [], "unstage": []},
        {"op": "adopt", "owner": "queue:default/q", "epoch": 3,
         "add": [[ra2.path, ra2.offset]], "unstage": []},
        {"op": "adopt", "owner": "queue:default/q", "epoch": 2, "replace": [],
         "add": [], "unstage": []},  # fenced (older epoch): ignored
        {"op": "retain", "owner": "empty", "roots": []},
    ])
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    with a.catalog.locked() as st:
        assert st.owners[("A", "ckpt")] == {(ra.path, ra.offset)}
        assert st.owners[("A", "queue:default/q")] == {(ra2.path, ra2.offset)}
        assert st.owner_epochs[("A", "queue:default/q")] == 3
        assert (LEGACY_RUN, "empty") in st.owners
    assert a.owners() == ["ckpt", "queue:default/q"]
    assert b.owners() == ["b-keep"]
    assert b.release("ckpt") is False
    for s in (a, b):
        assert s.collect_garbage()["reclaimed_files"] == 0
    assert _readable(a, ra) and _readable(a, ra2) and _readable(b, rb)
    assert a.release("ckpt") is True
    assert a.collect_garbage()["tombstoned"] == [ra.path]
    # the new straw appends version-2 transactions to the old catalog; it still replays
    a.retain("ckpt", [ra2])
    a.close()
    again = Catalog(PosixFS(), str(tmp_path))
    with again.locked() as st:
        assert st.run_owners("A") == {"ckpt": {(ra2.path, ra2.offset)},
                                      "queue:default/q": {(ra2.path, ra2.offset)}}
    again.close()
    b.close()


def test_pool_wide_collection_is_an_operator_entry_point(tmp_path):
    a, b = _store(tmp_path, "A"), _store(tmp_path, "B")
    ra, rb = _sealed(a, "a0"), _sealed(b, "b0")
    a.release_publications([ra])
    b.release_publications([rb])
    b.retain("keep", [rb])
    operator = Catalog(PosixFS(), str(tmp_path))
    with pytest.raises(ValueError, match="without a run"):
        operator.retain("x", [])
    got = operator.collect_pool()
    operator.close()
    assert got["tombstoned"] == [ra.path] and got["owner_names"] == ["B/keep"]
    assert not _exists(tmp_path, ra) and _readable(b, rb)
    a.close()
    b.close()


@pytest.mark.juicefs
def test_two_run_ids_in_one_root_on_two_juicefs_mounts(juicefs_dirs):
    """Run A on client a, run B on client b, one root: same owner name, same queue id."""
    a = _store(juicefs_dirs.a, "A")
    b = _store(juicefs_dirs.b, "B")
    ra, rb = _sealed(a, "a0"), _sealed(b, "b0")
    a.retain("checkpoint-7", [ra])
    b.retain("checkpoint-7", [rb])
    a.release_publications([ra])
    b.release_publications([rb])
    assert b.release("checkpoint-7") is True and b.release("checkpoint-7") is False
    assert b.collect_garbage()["tombstoned"] == [rb.path]
    assert a.collect_garbage()["reclaimed_files"] == 0
    assert _readable(a, ra) and a.owners() == ["checkpoint-7"]
    qa = Coordinator(a, queue_id="rollout")
    qb = Coordinator(b, queue_id="rollout", recover=True, takeover=True)
    qa.submit_tasks("r", [TaskSpec("a-task")])
    assert qb.acquire("wb", 1).assignments == ()
    assert [x.lease.task_id for x in qa.acquire("wa", 1).assignments] == ["a-task"]
    for x in (qa, qb, a, b):
        x.close()
