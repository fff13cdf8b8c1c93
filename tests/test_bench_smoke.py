"""Smoke test of the benchmark harness: it runs and reports every figure.

Never asserts performance (DESIGN.md: benchmarks, not timed tests): only that
``python -m bench.bench --quick`` completes and its JSON is complete and well formed, and
that ``CountingFS`` counts and delegates.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from bench.counting import CountingFS
from straw import Record, SharedFilesystemStore
from straw.fs import PosixFS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = ("publish_large", "publish_small_syncs", "publish_small_latency", "read_large")


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_quick_bench_completes_and_reports_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "STRAW_BENCH_DIR"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench", "--quick", "--json", str(out),
         "--dir", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc["figures"]) == set(FIGURES)
    for key, fig in doc["figures"].items():
        assert _number(fig["value"]["median"]), key
        assert fig["value"]["min"] <= fig["value"]["median"] <= fig["value"]["max"], key
        assert isinstance(fig["pass"], bool), key
        assert fig["target"]["op"] in (">=", "<="), key
        if key == "publish_small_syncs":
            assert fig["limit"] is None and fig["target"]["on"] == "value"
        else:
            assert _number(fig["limit"]["median"]) and fig["limit"]["median"] > 0, key
            assert _number(fig["ratio"]["median"]), key
    for name in ("raw_write", "raw_append_fsync", "memcpy"):
        assert _number(doc["limits"][name]["median"]), name
    assert len(doc["rounds"]) == doc["params"]["rounds"] == 1
    for fig in doc["figures"].values():  # the table names every figure
        assert fig["label"] in proc.stdout
    # where a tensor load's time goes: the bare loops of its method, against memcpy
    assert "where a one-thread load's time goes" in proc.stdout
    for kind in ("f32", "i32"):
        load = doc["rounds"][0][f"tensor_{kind}_load"]
        for prefix in ("preads_", "bare_"):
            assert _number(load[f"{prefix}vs_memcpy"]) and load[f"{prefix}vs_memcpy"] > 0
    # the temp pool is removed afterwards
    assert not any((tmp_path / "work").iterdir())


def test_counting_fs_counts_calls_and_delegates(tmp_path):
    fs = CountingFS(PosixFS())
    with SharedFilesystemStore(str(tmp_path / "pool"), "run", fs=fs) as store:
        store.publish([Record("a", b"x")], submission_id="warm")
        before = fs.snapshot()
        ref = store.publish([Record("b", b"y" * 1024)], submission_id="s1")
        calls = fs.delta(before)
        assert [bytes(r.payload) for r in store.read(ref)] == [b"y" * 1024]
    assert calls.get("writev") == 1
    assert CountingFS.syncs(calls) == calls.get("fdatasync", 0) + calls.get("fsync", 0) + \
        calls.get("fsync_dir", 0) >= 1
    assert fs.calls["open"] >= 1 and fs.calls["readinto"] >= 1
    assert fs.realpath(str(tmp_path)) == os.path.realpath(tmp_path)


def test_retention_bench_quick_smoke(tmp_path):
    out = tmp_path / "retention.json"
    subprocess.run([sys.executable, "-m", "bench.retention", "--quick", "--dir", str(tmp_path),
                    "--json", str(out)], check=True, cwd=REPO, capture_output=True, timeout=300)
    res = json.loads(out.read_text())
    for key in ("retain_median_ms", "release_median_ms", "collect_reclaiming_half_s",
                "publish_with_vs_without_ratio"):
        assert key in res


def test_quick_catalog_bench_reports_its_figures(tmp_path):
    """``python -m bench.catalog_bench --quick``: every figure present and a number."""
    out = tmp_path / "catalog.json"
    env = {k: v for k, v in os.environ.items() if k != "STRAW_BENCH_DIR"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.catalog_bench", "--quick", "--json", str(out),
         "--dir", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["history"] == 2_000
    for key in ("fresh_open_s", "catalog_open_s", "queue_recover_s", "catalog_bytes_per_task",
                "build_s", "fresh_open_cpu_s", "catalog_open_cpu_s"):
        assert _number(doc[key]) and doc[key] > 0, key
    assert doc["generation"] >= 1  # the figures are taken after a compaction
    after = doc["after_compaction"]
    assert after["followed"] == 3 and _number(after["first_append_s"])  # CS2
    # the build stopped on the way for the figures at 1,000 tasks, then went on
    assert [m["history"] for m in doc["sizes"]] == [1_000, 2_000]
    assert all(_number(m["fresh_open_s"]) and m["fresh_open_s"] > 0 for m in doc["sizes"])
    for key in ("pause_max_s", "baseline_max_s", "lock_held_s", "compaction_s"):
        assert _number(doc["publisher"][key]), key
    assert "catalog bytes per completed task" in proc.stdout
    assert not any((tmp_path / "work").iterdir())
