"""Smoke test of the batch builder's benchmark: ``python -m bench.builder_bench --quick``
completes and reports every figure (never asserts performance: DESIGN.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_builder_bench_reports_memory_and_rank_reads(tmp_path):
    out = tmp_path / "builder.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.builder_bench", "--quick", "--json", str(out),
         "--dir", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert result["samples"] == 16 and len(result["ranks"]) == 2
    for key in ("rss_growth_mib", "build_s", "read_ratio_max", "ref_pickle_bytes"):
        assert isinstance(result[key], (int, float)) and math.isfinite(result[key]), key
    for rank in result["ranks"]:
        assert rank["samples"] == 8 and rank["read_bytes"] >= rank["shard_bytes"] > 0
    assert "rank reads / shard bytes" in proc.stdout
    assert not os.listdir(tmp_path / "work")  # the pool is removed
