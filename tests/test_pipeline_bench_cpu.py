"""The pipeline bench's load-robust measure: ``tree_cpu`` counts the CPU seconds of this
process and every live descendant (the local Ray cluster's processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray")
from bench.pipeline_bench import _per_batch, tree_cpu  # noqa: E402

BURN = ("import time, sys\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\n"
        "print('burnt', flush=True)\n"
        "sys.stdin.read()\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_tree_cpu_counts_a_live_child_process():
    before = tree_cpu()
    assert before is not None and before > 0
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"  # 0.5 CPU s spent, still alive
        after = tree_cpu()
    finally:
        child.communicate("")
    assert after - before >= 0.45


def test_per_batch_is_none_without_a_reading():
    assert _per_batch(None, 2.0, 4) is None and _per_batch(1.0, 3.0, 4) == 0.5
