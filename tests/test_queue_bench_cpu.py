"""The queue bench's client-process figures report CPU per completion on both sides
(issue 13): the coordinator's process and the client processes, counted from "go" to
the end.  Never asserts performance, only that the figures are there and sane."""

from __future__ import annotations

import math

import pytest

from bench import queue_bench as qb
from bench.report import scaling_bounds


@pytest.mark.parametrize("combined", [False, True])
def test_clients_report_cpu_per_completion_of_both_sides(tmp_path, combined):
    m = qb.clients(str(tmp_path), 30, 2, combined=combined)
    assert m["completed"] == 30
    for key in ("coordinator_cpu_ms", "client_cpu_ms"):
        # positive and finite: the coordinator and both clients did work after "go"
        assert math.isfinite(m[key]) and m[key] > 0, key
    # a client's CPU is its process_time delta after "go": its imports and store setup
    # (about 0.5 s of CPU per process here) are not in it; 30 completions of both
    # clients together take a few tens of ms
    assert m["client_cpu_ms"] * 30 < 500
    assert m["syncs_per_completion"] > 0


def test_scaling_bounds_are_the_cores_and_the_coordinator_thread_ceilings():
    # one client at 500 completions/s waits 2 ms per completion; at N clients a completion
    # costs 0.5 ms of coordinator CPU and 0.5 ms of client CPU: 2 cores finish at most
    # 2000/s (4x), the coordinator's one thread at most 2000/s too (4x); 4 cores: 8x, 4x
    b = scaling_bounds(500.0, 0.5, 0.5, 2)
    assert b["cores_bound"] == pytest.approx(4.0)
    assert b["coordinator_bound"] == pytest.approx(4.0)
    b = scaling_bounds(500.0, 0.5, 0.5, 4)
    assert b["cores_bound"] == pytest.approx(8.0)
    assert b["coordinator_bound"] == pytest.approx(4.0)
    # a dearer coordinator lowers only its own ceiling
    assert scaling_bounds(500.0, 1.0, 0.5, 8)["coordinator_bound"] == pytest.approx(2.0)
