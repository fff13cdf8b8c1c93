"""Smoke test of the debug archives' benchmark: ``python -m bench.archive_bench --quick``
completes and reports every figure (never asserts performance: DESIGN.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_archive_bench_reports_save_bytes_and_lookup_chunks(tmp_path):
    out = tmp_path / "archive.json"
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.archive_bench", "--quick", "--json", str(out),
         "--dir", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert result["samples"] == 130
    for key in ("save_new_bytes", "save_new_payload_bytes", "index_bytes", "save_s",
                "lookup_read_bytes", "lookup_s"):
        assert isinstance(result[key], (int, float)) and math.isfinite(result[key]), key
    assert result["save_new_bytes"] >= result["save_new_payload_bytes"] > 0
    assert result["lookup_chunks_read"] >= 1
    assert "load_samples(sample_key=...) reads" in proc.stdout
    assert not os.listdir(tmp_path / "work")  # the pool is removed
