"""A short CrossHair pass over the spec's pure helpers: any counterexample fails the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_crosshair_finds_no_counterexample() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "crosshair",
            "check",
            "spec/helpers.py",
            "--per_condition_timeout=1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"CrossHair reported:\n{report}"
    assert "error" not in report.lower(), report
