"""Smoke test of the rollout control-overhead benchmark: ``python -m bench.rollout_bench``
with 1 and 2 generation processes for a moment, both modes, reports every figure (never
asserts performance: DESIGN.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_short_rollout_bench_reports_rates_cpu_its_split_and_syncs_per_group(tmp_path):
    out = tmp_path / "rollout.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.rollout_bench", "--processes", "1", "2", "--seconds",
         "0.5", "--json", str(out), "--dir", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())["figures"]
    runs = [f for f in figures if "processes" in f]
    assert sorted((f["mode"], f["processes"]) for f in runs) == [
        ("complete", 1), ("complete", 2), ("return", 1), ("return", 2)]
    for f in runs:
        assert f["groups"] >= 64 and f["calls"] >= 1, f
        for key in ("groups_per_s", "controller_cpu_ms_per_group", "client_cpu_ms_per_group",
                    "controller_syncs_per_group", "client_syncs_per_group"):
            assert isinstance(f[key], (int, float)) and math.isfinite(f[key]) and f[key] > 0, \
                (key, f)
        assert isinstance(f["empty_takes"], int) and f["empty_takes"] >= 0
        # the controller's CPU split by call: its take (and refills), its completions (or
        # returns) and the serving; together the controller's CPU per group
        split = f["controller_split_ms_per_group"]
        calls = {"take", "complete_tasks", "complete_many"} if f["mode"] == "complete" \
            else {"take", "yield_groups"}
        assert set(split) == calls | {"serving"}, split
        assert all(split[k] > 0 for k in calls), split
        assert math.isclose(sum(split.values()), f["controller_cpu_ms_per_group"],
                            abs_tol=0.01 + 0.01 * len(split)), split
    assert sum(1 for f in figures if "ratio" in f) == 2
    assert "syncs per group: controller" in proc.stdout
    assert "controller CPU ms per group: " in proc.stdout
    assert not os.listdir(tmp_path / "work")  # the pools are removed
