"""The coordinator crash campaign (bounded) and a short run of the queue fuzz scenarios
(``fault_injection.queue_campaign``, ``fault_injection.queue_fuzz``)."""

from __future__ import annotations

import time

import pytest

from fault_injection.queue_campaign import (
    CONTROL_DAMAGE,
    HISTORY_DAMAGE,
    QUICK_MODES,
    WORKLOADS,
    Driver,
    damage_queue,
    recover_and_check,
    run_queue_campaign,
    run_queue_controls,
    run_state,
    wl_history,
)
from fault_injection.queue_fuzz import run_queue
from fault_injection.simfs import SimFS
from straw import CorruptData, SharedFilesystemStore, UnsafeRecovery
from straw.coordinator import Coordinator
from straw.protocol import TaskSpec


def test_bounded_coordinator_campaign() -> None:
    # Bounded by max_points (crash points per workload), not by a wall-clock limit: timing is
    # measured in `just crash`, never asserted in a test (it failed under load, not on code).
    reports = run_queue_campaign(QUICK_MODES, max_points=70, log=lambda _m: None)
    assert {r.name for r in reports} == {"queue-basic", "queue-history", "queue-takeover",
                                         "queue-lifecycle"}
    assert all(r.states > 300 for r in reports)
    bad = [v for r in reports for v in r.violations]
    assert not bad, bad[0]


def test_damaged_history_segments_fail_closed() -> None:
    """Every history segment deleted, or a byte flipped in each: the recovering
    coordinator (or its first lookup) raises CorruptData, or loses nothing."""
    reports = run_queue_campaign(HISTORY_DAMAGE, only=["history"], max_points=40,
                                 log=lambda _m: None)
    bad = [v for r in reports for v in r.violations]
    assert not bad, bad[0]
    for kind in ("drop-history", "flip-history"):  # the damage is real, and refused
        sim = SimFS(0, record_trace=False)
        d = Driver(sim)
        wl_history(d)
        assert ".hist" in damage_queue(sim, kind)
        with pytest.raises(CorruptData, match="history segment"):
            recover_and_check(sim, d.log)


def test_bounded_coordinator_campaign_with_damaged_journals() -> None:
    """A flipped byte in the newest journal transaction, or every segment of the newest
    epoch deleted: the recovering coordinator raises CorruptData or loses nothing."""
    reports = run_queue_campaign(CONTROL_DAMAGE, max_points=40, log=lambda _m: None)
    bad = [v for r in reports for v in r.violations]
    assert not bad, bad[0]


def test_completed_runs_recover_under_every_mode() -> None:
    for wl in WORKLOADS:
        for mode in QUICK_MODES:
            key = f"{wl.name}:end:complete:{mode}"
            assert run_state(wl, None, "complete", mode, key) is None


def test_queue_negative_controls_are_caught() -> None:
    found = run_queue_controls(QUICK_MODES[:3], max_points=30, log=lambda _m: None)
    assert found and all(v is not None for v in found.values()), found
    # the damaged-tail controls are caught by the damage they do not survive (checked with
    # the damage modes alone: with the others first, another mode may catch them earlier)
    damage = run_queue_controls((), max_points=30, log=lambda _m: None)
    assert "kill+damage/drop-newest" in (damage["queue-no-started-mark"] or "")
    assert "kill+damage/flip-last-txn" in (damage["queue-journal-no-confirm"] or "")
    assert "history segment" in (found["queue-history-not-durable"] or "")


def test_queue_fuzz_short_run(tmp_path) -> None:
    t0 = time.perf_counter()
    s = run_queue(str(tmp_path), seconds=6, n_workers=2, seed=11)
    assert not s.violations, s.violations[:3]
    assert s.coordinator_kills >= 1 and s.takeovers >= 1, s.line()
    assert s.receipts > 0 and s.commits >= s.receipts, s.line()
    assert time.perf_counter() - t0 < 20, s.line()


def test_queue_fuzz_catches_an_unfenced_coordinator(tmp_path) -> None:
    # the control means something only once a takeover happened; on a loaded machine 5 s
    # may pass before the processes even start, so a run without one is run again, longer
    for seconds in (5, 15, 40):
        s = run_queue(str(tmp_path / f"s{seconds}"), seconds=seconds, n_workers=2, seed=12,
                      control="queue-no-fencing")
        if s.takeovers >= 1:
            break
    assert s.takeovers >= 1, s.line()
    assert any(v.startswith(("stale acknowledgement", "lost receipt")) for v in s.violations), \
        s.line()


def test_second_coordinator_after_a_takeover_is_refused(tmp_path) -> None:
    stores = [SharedFilesystemStore(str(tmp_path), "run", writer_id=w) for w in "abc"]
    old = Coordinator(stores[0], queue_id="q")
    new = Coordinator(stores[1], queue_id="q", recover=True, takeover=True)
    old.close()  # the paused old coordinator dies
    try:
        with pytest.raises(UnsafeRecovery, match="served by"):
            Coordinator(stores[2], queue_id="q", recover=True).close()
        new.submit_tasks("r", [TaskSpec("t")])  # still the only one serving
    finally:
        new.close()
        for s in stores:
            s.close()
