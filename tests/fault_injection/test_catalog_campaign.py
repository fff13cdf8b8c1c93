"""Bounded catalog crash campaign (``fault_injection.catalog_campaign``): two clients,
crash points sampled over every mutating op of each workload, every persistence variant
and a process kill; nothing owned, pinned or staged is reclaimed and every committed
catalog operation stays visible.  The full campaign: ``python -m
fault_injection.catalog_campaign``."""

from __future__ import annotations

import pytest

from fault_injection.catalog_campaign import (
    MODES,
    WORKLOADS,
    check_damaged_tail,
    mutating_ops,
    run_damaged_tail_controls,
    run_workload,
)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_bounded_catalog_campaign(workload: str) -> None:
    assert mutating_ops(workload) > 200
    report = run_workload(workload, MODES, max_points=160)
    assert report.crash_points == 161 and report.states == 161 * len(MODES)
    assert not report.violations, "\n\n".join(report.violations[:3])


def test_catalog_campaign_catches_collection_that_ignores_dependencies(monkeypatch) -> None:
    """Negative control: a collector that does not follow dependency edges must be caught."""
    from straw.catalog import CatalogState

    def no_edges(self: CatalogState) -> set[tuple[str, int]]:
        live = {e for roots in self.owners.values() for e in roots}
        return live | self.staged_extents()

    monkeypatch.setattr(CatalogState, "live_extents", no_edges)
    report = run_workload("owners", ("power/clear-cache",), max_points=40)
    assert report.violations


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_damaged_acknowledged_catalog_tail_is_corrupt_never_cut(workload: str) -> None:
    """Every byte of the last acknowledged transaction flipped: CorruptData (D6)."""
    assert check_damaged_tail(workload) == []


def test_catalog_campaign_catches_catalog_without_confirm_frames() -> None:
    """Negative control: without confirm frames a flipped byte in the last acknowledged
    transaction is silently cut as a torn tail; the damaged-tail check must flag it."""
    found = run_damaged_tail_controls()
    assert set(found) == {"catalog-without-confirm"}
    assert all(found.values()), found
