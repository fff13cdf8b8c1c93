"""Smoke test of the checkpoint benchmark: ``python -m bench.checkpoint_bench --quick``
completes and reports every figure (never asserts performance: DESIGN.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_checkpoint_bench_reports_save_and_restore(tmp_path):
    out = tmp_path / "checkpoint.json"
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-m", "bench.checkpoint_bench", "--quick",
                           "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    for key in ("save_s", "save_small_history_s", "restore_s", "history_build_s"):
        assert isinstance(result[key], float) and math.isfinite(result[key]) and \
            result[key] > 0, key
    assert result["history"] == 1000 and result["live"] == 100
    assert result["restore_ready"] == 500  # every ready group of the checkpoint restored
    assert "checkpoint save, 1,000 accepted groups" in proc.stdout
