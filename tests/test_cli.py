"""The ``straw`` command, run as a subprocess: inspect/top/gc on a live pool (read-only
where promised), qualify and bench, bad input -> exit status 2 with nothing written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from straw import Record, SharedFilesystemStore
from straw.cli import main
from straw.coordinator import Coordinator
from straw.protocol import TaskSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD_DECLARATION = {"direct_mount": True, "writeback": False, "open_cache": 0,
                    "readdir_cache": False, "client_version": "1.4.2",
                    "durability_description": "test"}


def straw(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "straw.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def tree(path) -> dict[str, object]:
    """Every entry under ``path`` with its size, mtime and content digest."""
    out: dict[str, object] = {}
    for d, dirs, files in os.walk(path):
        for n in dirs:
            out[os.path.relpath(os.path.join(d, n), path) + "/"] = None
        for n in files:
            p = os.path.join(d, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, path)] = (st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def live_pool(tmp_path):
    """A pool with a live coordinator (its epoch lock held): 5 tasks, 3 leased by gen-0,
    2 completed with staleness 1 and 3, a consumer, a checkpoint, a planned batch, and a
    sealed pack nothing references (garbage)."""
    root = str(tmp_path / "pool")
    producer = SharedFilesystemStore(root, "job", writer_id="producer")
    worker = SharedFilesystemStore(root, "job", writer_id="gen-0")
    q = Coordinator(producer, queue_id="rollout", namespace="rl")
    prompts = [producer.publish([Record("p", b"prompt %d" % i)], submission_id=f"p{i}")
               for i in range(5)]
    q.submit_tasks("admit-0", [TaskSpec(f"t{i}", input_ref=r, metadata={"stage": "generate"})
                               for i, r in enumerate(prompts)])
    got = q.acquire("gen-0", 3)
    for a, staleness in zip(got.assignments[:2], (1, 3), strict=True):
        out = worker.publish([Record("sample", b"tokens", metadata={
            "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id, "staleness": staleness})],
            submission_id=f"s-{a.lease.task_id}")
        q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}", result_ref=out)
    token = q.open_consumer("trainer", exclusive_owner="the test's one trainer")
    state = worker.publish([Record("state", b"step 10")], submission_id="trainer-state")
    q.save_consumer_state("trainer", token=token, request_id="save-10", state_ref=state,
                          fetch_cursor=2, processed_cursor=1)
    ck = worker.publish([Record("ck", json.dumps({
        "version": 1, "checkpoint_id": "step-10", "consumer_state": dataclasses.asdict(state),
        "batch_ids": [], "training_dependencies": []}).encode(), codec="json.v1")],
        submission_id="ck-10", dependencies=[state])
    q.register_checkpoint("step-10", ck, cursor=0)
    q.plan_batch("trainer", token=token, batch_id="batch-0", input_positions=[0, 1],
                 plan_ref=state)
    with SharedFilesystemStore(root, "job", writer_id="junk") as junk:
        ref = junk.publish([Record("junk", b"x" * 4096)], submission_id="junk-0")
        junk.seal()
        junk.release_publications([ref])
    yield root
    q.close()
    worker.close()
    producer.close()


def test_console_script_entry_point_resolves():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        (target,) = re.findall(r'^straw = "([^"]+)"$', f.read(), re.M)
    module, func = target.split(":")
    assert target == "straw.cli:main" and callable(main)
    assert getattr(__import__(module, fromlist=[func]), func) is main


def test_inspect_shows_a_live_pool_and_writes_nothing(live_pool, tmp_path):
    before = tree(live_pool)
    plot = tmp_path / "inspect.png"
    args = ["--plot", plot] if _has_matplotlib() else []
    p = straw("inspect", live_pool, "--json", "-", *args)
    assert p.returncode == 0, p.stderr
    assert tree(live_pool) == before  # no file created, no byte appended, no lock file
    v = json.loads(p.stdout)
    assert v["packs"]["total"] == 3 and v["packs"]["open"] == 2 and v["packs"]["sealed"] == 1
    assert v["owners"]["job/queue:rl/rollout"]["packs"] == 2
    assert v["collectable"]["packs"] == 1 and v["collectable"]["paths"][0].startswith(
        "runs/job/writers/junk/")
    (q,) = v["queues"]
    assert q["queue"] == "runs/job/queues/rl/rollout" and q["epoch"] == 1
    assert q["tasks"] == {"completed": 2, "leased": 1, "pending": 2}
    assert q["tasks_by_stage"] == {"generate/leased": 1, "generate/pending": 2}
    assert q["leases_by_worker"] == {"gen-0": 1}
    assert q["commits"] == 2 and q["consumers"] == {"trainer": {"fetch": 2, "processed": 1}}
    assert q["checkpoints"] == ["step-10"] and q["batches"] == {"planned": 1}
    assert q["staleness_histogram"] == {"1": 1, "3": 1}
    if args:
        assert plot.stat().st_size > 0
    text = straw("inspect", live_pool)
    assert text.returncode == 0 and "queue runs/job/queues/rl/rollout" in text.stdout
    assert "gen-0" in text.stdout and tree(live_pool) == before


def test_top_refreshes_n_times_then_exits(live_pool, tmp_path):
    before = tree(live_pool)
    log = tmp_path / "top.jsonl"
    p = straw("top", live_pool, "--iterations", "3", "--interval", "0", "--json", log)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("straw top") == 3
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["refresh"] for x in lines] == [1, 2, 3]
    assert lines[-1]["queues"][0]["commits"] == 2
    assert tree(live_pool) == before


def test_gc_dry_run_writes_nothing_then_gc_reclaims(live_pool):
    before = tree(live_pool)
    p = straw("gc", live_pool, "--dry-run", "--json", "-")
    assert p.returncode == 0, p.stderr
    dry = json.loads(p.stdout)
    assert dry["would_reclaim_files"] == 1 and tree(live_pool) == before
    p = straw("gc", live_pool, "--json", "-")
    assert p.returncode == 0, p.stderr
    done = json.loads(p.stdout)
    assert done["reclaimed_files"] == 1 and done["tombstoned"] == dry["paths"]
    assert not os.path.exists(os.path.join(live_pool, dry["paths"][0]))
    v = json.loads(straw("inspect", live_pool, "--json", "-").stdout)
    assert v["tombstones"] == {"total": 1, "not_unlinked": 0}
    assert v["collectable"]["packs"] == 0


def test_cli2_gc_prints_its_report(live_pool):
    # issue 39 CLI2: the text report (not --json) crashed with a TypeError after collecting
    p = straw("gc", live_pool)
    assert p.returncode == 0, p.stderr
    assert re.search(r"reclaimed 1 pack files, .*; \d+ packs retained by \d+ owners",
                     p.stdout), p.stdout


def test_cli1_inspect_of_a_fifo_in_place_of_a_journal_segment_answers(tmp_path):
    # issue 39 CLI1: straw inspect blocked for ever opening a FIFO put in place of a
    # journal segment; it reports that queue as unreadable, naming the FIFO, and goes on
    root = tmp_path / "pool"
    with SharedFilesystemStore(root, "job") as store:
        Coordinator(store, queue_id="rollout").close()
    (segment,) = root.glob("runs/job/queues/default/rollout/journal/j-*.log")
    segment.unlink()
    os.mkfifo(segment)
    p = straw("inspect", root, timeout=60)
    assert p.returncode == 1
    assert f"{segment} is a FIFO, not a regular file" in p.stdout + p.stderr


def _bad_inputs(tmp_path) -> list[tuple[list[object], str]]:
    empty, newer, a, b = (tmp_path / n for n in ("empty", "newer", "a", "b"))
    for d in (empty, newer, a, b):
        d.mkdir()
    (newer / "POOL").write_text(json.dumps({"format": "straw-pool", "version": 99}))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({**GOOD_DECLARATION, "writeback": "no"}))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD_DECLARATION))
    missing = tmp_path / "missing"
    return [
        (["inspect", missing], "does not exist"),
        (["inspect", empty], "not a straw pool"),
        (["inspect", newer], "format version 99"),
        (["top", empty, "--iterations", "1"], "not a straw pool"),
        (["gc", empty], "not a straw pool"),
        (["gc", newer, "--dry-run"], "format version 99"),
        (["qualify", missing], "does not exist"),
        (["qualify", a, "--peer", b, "--deadline", "0.2"], "same volume"),
        (["qualify", a, "--declaration", wrong], "'writeback' must be a bool"),
        (["qualify", a, "--declaration", good], "fuse.juicefs"),
        (["qualify", a, "--rounds", "0"], "--rounds must be positive"),
        (["inspect"], "the following arguments are required: pool"),
        (["frobnicate"], "invalid choice"),
    ]


def test_bad_input_exits_2_with_a_message_and_writes_nothing(tmp_path):
    cases = _bad_inputs(tmp_path)
    before = tree(tmp_path)
    for argv, message in cases:
        p = straw(*argv)
        assert p.returncode == 2, (argv, p.stdout, p.stderr)
        assert message in p.stderr, (argv, p.stderr)
        assert tree(tmp_path) == before, argv
    assert not (tmp_path / "missing").exists()


def test_qualify_a_temp_dir(tmp_path):
    out, plot = tmp_path / "q.json", tmp_path / "cdf.png"
    target = tmp_path / "fs"
    target.mkdir()
    args = ["--plot", plot] if _has_matplotlib() else []
    p = straw("qualify", target, "--quick", "--json", out, *args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout and "implied settings" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["passed"] and rep["verdicts"]["lock_release_on_death"] == "pass"
    assert os.listdir(target / ".straw-qualify") == []
    if args:
        assert plot.stat().st_size > 0


def test_qualify_full_check_verdicts_and_cleanup(tmp_path, small_tmpfs):
    """--full-check on a directory of a big filesystem with a tiny limit: no ENOSPC ->
    the clause fails and qualify exits 1; on a small tmpfs it passes and leaves nothing."""
    p = straw("qualify", tmp_path, "--quick", "--clause", "full_filesystem", "--full-check",
              tmp_path, "--full-limit", str(1 << 20), "--json", "-")
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["verdicts"] == {"full_filesystem": "fail"}
    ok = straw("qualify", tmp_path, "--clause", "full_filesystem", "--full-check",
               small_tmpfs, "--json", "-")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["clauses"][0]["figures"]["errno"] == "ENOSPC"
    assert os.listdir(small_tmpfs) == []  # qualify removed what it wrote there


def test_bench_reports_a_ratio_to_the_raw_limit(tmp_path):
    p = straw("bench", "--root", tmp_path, "--rounds", "1", "--records", "2",
              "--record-bytes", "65536", "--json", "-")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["raw_mib_s"] > 0 and r["publish_mib_s"] > 0 and r["ratio"] > 0
    assert os.listdir(tmp_path) == []  # its scratch pool is removed


def test_demo_subcommand_help():
    p = straw("demo", "--help")
    assert p.returncode == 0 and "--root" in p.stdout


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_inspect_reports_a_damaged_queue_and_shows_the_rest(live_pool):
    """A queue whose journal fails its checksum (D6) is named with the error, exit 1; the
    packs and owners are still shown, and nothing is repaired (written)."""
    jdir = os.path.join(live_pool, "runs", "job", "queues", "rl", "rollout", "journal")
    (seg,) = [n for n in os.listdir(jdir) if n.endswith(".log")]
    path = os.path.join(jdir, seg)
    with open(path, "r+b") as f:
        data = f.read()
        end = len(data.rstrip(b"\0"))
        f.seek(end // 2)
        f.write(bytes([data[end // 2] ^ 0xFF]))
    before = tree(live_pool)
    p = straw("inspect", live_pool, "--json", "-")
    assert p.returncode == 1, p.stderr
    v = json.loads(p.stdout)
    assert v["queues"] == [] and len(v["errors"]) == 1
    assert v["errors"][0].startswith("queue runs/job/queues/rl/rollout: CorruptData")
    assert v["packs"]["total"] == 3 and tree(live_pool) == before
