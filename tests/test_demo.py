"""The README's demo command works and reports what it verified."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_reports(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "straw.demo", "--root", str(tmp_path / "pool")],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert "published and read back checked" in out
    assert "SIGKILLed mid-publication" in out
    assert "read back intact" in out
    assert "accepted exactly once" in out
    assert "pack files" in out
