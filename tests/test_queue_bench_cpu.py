"""The queue bench's client-process figures report CPU per completion on both sides
(issue 13): the coordinator's process and the client processes, counted from "go" to
the end.  Never asserts performance, only that the figures are there and sane."""

from __future__ import annotations

import math

import pytest

from bench import queue_bench as qb


@pytest.mark.parametrize("combined", [False, True])
def test_clients_report_cpu_per_completion_of_both_sides(tmp_path, combined):
    m = qb.clients(str(tmp_path), 30, 2, combined=combined)
    assert m["completed"] == 30
    for key in ("coordinator_cpu_ms", "client_cpu_ms"):
        # positive and finite: the coordinator and both clients did work after "go"
        assert math.isfinite(m[key]) and m[key] > 0, key
    # a client's CPU is its os.times delta after "go": its imports and store setup
    # (about 0.5 s of CPU per process here) are not in it; 30 completions of both
    # clients together take a few tens of ms
    assert m["client_cpu_ms"] * 30 < 500
    assert m["syncs_per_completion"] > 0
