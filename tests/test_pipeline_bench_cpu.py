"""The pipeline bench's load-robust measure: ``tree_cpu`` counts the CPU seconds of this
process and every live descendant (the local Ray cluster's processes); ``tree_cpu_pids``
and ``_ms_per_group`` split them by the part of the pipeline each process is."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray")
from bench.pipeline_bench import (  # noqa: E402
    ROLES,
    _cluster_per_batch,
    _ms_per_group,
    _per_batch,
    tree_cpu,
    tree_cpu_pids,
)

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("title, role", [("ray::ControllerWorker", "controller"),
                                         ("ray::GenerationWorker.run", "generation"),
                                         ("ray::ObjectStoreGenerator", "generation"),
                                         ("ray::IDLE", "ray")])
def test_cpu_per_group_is_split_by_the_process_title_ray_gives_an_actor(title, role):
    before = tree_cpu_pids()
    child = subprocess.Popen([title, "-c", BURN], executable=sys.executable,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"
        after = tree_cpu_pids()
    finally:
        child.communicate("")
    assert after[child.pid][1] == role and child.pid not in before
    split = _ms_per_group(before, after, 10)  # 0.5 s over 10 groups: >= 45 ms each
    assert set(split) == set(ROLES) and split[role] >= 45
    assert all(v < 45 for r, v in split.items() if r not in (role, "driver"))
    assert _cluster_per_batch(before, after, 1) >= 0.45
    assert _ms_per_group(None, after, 10) is None and _cluster_per_batch(before, None, 1) is None
