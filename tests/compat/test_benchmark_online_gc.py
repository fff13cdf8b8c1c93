"""``python -m straw.benchmark run --local --online-gc`` (straw-queue's documented command,
smaller): collections run while the worker publishes and reads, and once every result
read is acknowledged the last one reclaims every pack the workers wrote."""

import json

import pytest

from straw import benchmark


def _command(tmp_path, report):
    # docs/BENCHMARKS.md's command with a small volume, 1 MiB packs (several per writer)
    # and a short collection period so that passes overlap the worker's run
    return ["run", "--local", "--root", str(tmp_path / "bench-root"), "--report",
            str(report), "--record-bytes", "65536", "16384", "--gib", "0.01",
            "--writers", "2", "--readers", "2", "--segment-mib", "1", "--online-gc",
            "--max-files", "64", "--max-gib", "0.25", "--timeout", "120",
            "--gc-interval", "0.2", "--bind", "127.0.0.1"]


def test_online_gc_collects_concurrently_and_reclaims_every_worker_pack(tmp_path, capsys):
    report = tmp_path / "out" / "local.json"
    benchmark.main(_command(tmp_path, report))
    result = json.loads(report.read_text())
    assert result["status"] == "passed"
    assert result["concurrent_gc_pass_count"] >= 1
    assert len(result["concurrent_gc_passes"]) == result["concurrent_gc_pass_count"]
    # nothing was acknowledged while the worker ran: the concurrent passes kept every result
    assert sum(p["reclaimed_files"] for p in result["concurrent_gc_passes"]) == 0
    assert result["concurrent_gc_seconds"] >= 0 and result["gc_seconds"] > 0
    packs = result["worker_packs"]
    assert packs["before_last_gc"] >= 4 and packs["after_last_gc"] == 0  # 2 writers x >=2
    gc = result["gc"]
    assert gc["reclaimed_files"] == gc["tombstones"] == packs["before_last_gc"]
    assert gc["reclaimed_bytes"] >= result["written_bytes"] > 0
    assert all("/writers/bench-" in f"/{p}" for p in gc["tombstoned"])
    assert not (tmp_path / "bench-root").exists()
    printed = json.loads(capsys.readouterr().out)
    assert printed["gc"]["reclaimed_files"] == gc["reclaimed_files"]


def test_online_gc_fails_the_run_when_a_result_stays_retained(tmp_path, monkeypatch):
    """An application owner that keeps one result alive keeps its pack: the run fails
    and names the pack, and the temporary root is kept for inspection."""
    acknowledge = benchmark._acknowledge_reads

    def and_keep_one(coordinator, store, commits):
        acknowledge(coordinator, store, commits)
        first = coordinator.read_commits(cursor=0, limit=1).commits[0]
        store.retain("app:keep-one-result", [first.result_ref])

    monkeypatch.setattr(benchmark, "_acknowledge_reads", and_keep_one)
    report = tmp_path / "out" / "local.json"
    with pytest.raises(AssertionError, match=r"left 1 of the workers' \d+ packs"):
        benchmark.main(_command(tmp_path, report))
    assert not report.exists()
    assert (tmp_path / "bench-root").exists()  # a failed run leaves its root
    cleanup = json.loads((tmp_path / "out" / "local.cleanup.json").read_text())
    assert cleanup["removed"] is False
