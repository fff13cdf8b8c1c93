"""A short run of the shared-root fuzz scenario (``fault_injection.runs_fuzz``: two runs in
one root, each with retaining writers and a queue of the same id), and its negative
control (issue 11, finding 2)."""

from __future__ import annotations

from fault_injection.runs_fuzz import run_runs


def test_two_run_ids_in_one_root_fuzz_short_run(tmp_path) -> None:
    s = run_runs(str(tmp_path), seconds=10, n_writers=1, n_workers=1, seed=7)
    assert not s.all_violations(), s.all_violations()[:3]
    assert len(s.stores) == len(s.queues) == 2, s.line()
    # every writer retains at its clean end, so each run's owners are checked
    assert all(st.retained_verified > 0 for st in s.stores), s.line()
    assert sum(q.receipts for q in s.queues) > 0, s.line()


def test_two_run_ids_in_one_root_fuzz_catches_shared_owners(tmp_path) -> None:
    """With owner names global to the root and pool-wide collection (the former
    behaviour), one run's retained window is reclaimed by the other's retain + collect."""
    s = run_runs(str(tmp_path), seconds=10, n_writers=1, n_workers=1, seed=7,
                 control="runs-share-owners")
    bad = s.all_violations()
    assert any("retained" in v or "holds" in v for v in bad), s.line()
