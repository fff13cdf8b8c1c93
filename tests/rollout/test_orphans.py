"""Orphaned retention (``straw.orphans``, ``straw.rollout.orphans``): every owner is
judged by what names it; ``straw inspect`` lists the orphans, ``straw gc --release-orphans``
frees them, and nothing named (or that cannot be judged) is ever released."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from straw import Record, SharedFilesystemStore
from straw import orphans as core
from straw.cli import main
from straw.coordinator import Coordinator
from straw.rollout import RolloutArchive, Sample, Status
from straw.rollout.orphans import namers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _samples(n: int = 2) -> list[Sample]:
    return [Sample(("prompt", i), tokens=(1, 2, 3), response_length=1,
                   status=Status.COMPLETED, index=i, routes=np.full((16, 4), i, np.int32))
            for i in range(n)]


@pytest.fixture
def pool(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "job")
    yield store
    store.close()


def _status(store, directories=None) -> dict[str, tuple[str, str, str]]:
    judges = namers(store.root, directories)
    return {o.name: (o.kind, o.status, o.why) for o in core.survey(store.root, namers=judges)}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_an_archive_is_named_by_its_index_and_orphaned_when_it_is_deleted(tmp_path, pool):
    index = RolloutArchive.save(tmp_path / "debug" / "rollout_1.straw.json", _samples(),
                                rollout_id=1, store=pool)
    (owner,) = pool.owners()
    assert _status(pool)[owner][:2] == ("archive", core.NAMED)
    os.unlink(index)
    kind, status, why = _status(pool)[owner]
    assert (kind, status) == ("archive", core.ORPHAN) and "no archive index" in why


def test_an_index_moved_out_of_sight_is_found_where_the_operator_says(tmp_path, pool):
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    RolloutArchive.save(elsewhere / "rollout_1.straw.json", _samples(), rollout_id=1,
                        store=pool)
    (owner,) = pool.owners()
    assert _status(pool)[owner][1] == core.ORPHAN  # not under the pool's parent
    assert _status(pool, [str(elsewhere)])[owner][1] == core.NAMED


def test_an_index_of_another_pool_or_run_does_not_name_the_owner(tmp_path, pool):
    index = RolloutArchive.save(tmp_path / "rollout_1.straw.json", _samples(), rollout_id=1,
                                store=pool)
    body = json.loads(open(index).read())
    (owner,) = pool.owners()
    os.unlink(index)
    with open(tmp_path / "copy.straw.json", "w") as f:
        json.dump({**body, "pool_id": "another pool"}, f)
    assert _status(pool)[owner][1] == core.ORPHAN


def test_a_checkpoint_owner_is_named_by_its_marker_and_judged_only_with_no_live_controller(
        tmp_path, pool):
    ref = pool.publish([Record("state", b"x")], submission_id="s")
    owner = "checkpoint:rl/rollout:3"
    pool.retain(owner, [ref])
    rollout = tmp_path / "save" / "rollout"
    rollout.mkdir(parents=True)
    marker = rollout / "committed_3.json"
    marker.write_text(json.dumps({"owner": owner, "pool": pool.pool_id,
                                  "run_id": pool.run_id, "step": 3}))
    assert _status(pool)[owner][:2] == ("checkpoint", core.NAMED)
    marker.unlink()
    assert _status(pool)[owner][1] == core.ORPHAN
    # a live controller of a save directory may be retaining before its marker (RL7, RL9)
    (rollout / "LOCK").write_text(json.dumps({"host": socket.gethostname(),
                                              "pid": os.getpid()}))
    assert _status(pool)[owner][1] == core.UNKNOWN
    (rollout / "LOCK").write_text(json.dumps({"host": socket.gethostname(),
                                              "pid": _dead_pid()}))
    assert _status(pool)[owner][1] == core.ORPHAN


def test_pins_are_judged_by_their_reader_process(pool):
    ref = pool.publish([Record("r", b"x")], submission_id="s")
    extent = [(ref.segment.path, ref.segment.offset)]
    host = socket.gethostname()
    live = f"publication:pin:{host}:{os.getpid()}:a"
    dead = f"publication:pin:{host}:{_dead_pid()}:b"
    remote = "publication:pin:another-host.invalid:1:c"
    for name in (live, dead, remote):
        pool.catalog.retain(name, extent)
    got = _status(pool)
    assert got[live][:2] == ("pin", core.NAMED)
    assert got[dead][:2] == ("pin", core.ORPHAN)
    assert got[remote][:2] == ("pin", core.UNKNOWN)


def test_queue_owners_are_named_by_their_queue_and_never_released_here(tmp_path, pool):
    q = Coordinator(pool, queue_id="rollout", namespace="rl")
    q.close()
    owner = "queue:rl/rollout"
    assert _status(pool)[owner][:2] == ("queue", core.NAMED)
    with pytest.raises(ValueError, match="managed by straw itself"):
        core.release(pool.root, [(pool.run_id, owner)])


def test_application_owners_are_never_judged(pool):
    ref = pool.publish([Record("r", b"x")], submission_id="s")
    pool.retain("my-own-owner", [ref])
    assert _status(pool)["my-own-owner"][:2] == ("application", core.UNKNOWN)


def test_a_search_stopped_by_its_bound_judges_nothing_orphan(tmp_path, pool):
    RolloutArchive.save(tmp_path / "rollout_1.straw.json", _samples(), rollout_id=1,
                        store=pool)
    (owner,) = pool.owners()
    os.unlink(tmp_path / "rollout_1.straw.json")
    for i in range(5):
        (tmp_path / f"noise-{i}").mkdir()
    judges = namers(pool.root, None, max_entries=3)
    (got,) = [o for o in core.survey(pool.root, namers=judges) if o.name == owner]
    assert got.status == core.UNKNOWN and "stopped short" in got.why


def test_straw_gc_release_orphans_frees_only_the_orphans(tmp_path, pool, capsys):
    lost = RolloutArchive.save(tmp_path / "lost.straw.json", _samples(3), rollout_id=2,
                               store=pool)
    pool.seal()  # a pack of its own, so that its release frees a file
    kept = RolloutArchive.save(tmp_path / "kept.straw.json", _samples(), rollout_id=1,
                               store=pool)
    lost_owner = json.loads(open(lost).read())["storage_owner"]
    kept_owner = json.loads(open(kept).read())["storage_owner"]
    os.unlink(lost)
    pool.seal()
    assert main(["inspect", pool.root]) == 0
    out = capsys.readouterr().out
    assert "1 orphaned owners keep" in out and "straw gc --release-orphans" in out
    assert main(["gc", pool.root, "--release-orphans", "--dry-run"]) == 0
    assert "would release 1 orphaned owners" in capsys.readouterr().out
    assert set(pool.owners()) == {kept_owner, lost_owner}
    assert main(["gc", pool.root, "--release-orphans", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["released_orphans"] == [f"{pool.run_id}/{lost_owner}"]
    assert report["reclaimed_files"] >= 1
    assert pool.owners() == [kept_owner]
    with RolloutArchive(kept) as archive:
        assert len(archive.load_samples()) == 2


def test_straw_inspect_names_a_missing_search_directory_as_bad_input(tmp_path, pool):
    p = subprocess.run([sys.executable, "-m", "straw.cli", "inspect", pool.root,
                        "--named-in", str(tmp_path / "nowhere")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--named-in" in p.stderr
