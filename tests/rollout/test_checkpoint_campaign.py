"""The checkpoint crash campaign (``fault_injection.checkpoint_campaign``, issue 15 item 6),
bounded: an even sample of the crash points of a save (both schedules of its thread) and
of an exact and a salvage restore, each under power loss and SIGKILL; its negative
controls; and the regression of the bug it found (a branch recorded as seeded before its
builder's restored state was durable: a crash in between lost the restored groups)."""

from __future__ import annotations

import pytest

from fault_injection import checkpoint_campaign as cc


def test_a_sample_of_the_crash_points_of_save_and_restore_shows_no_violation():
    reports = cc.run_checkpoint_campaign(cc.QUICK_MODES, max_points=40, log=lambda _m: None)
    assert [r.name for r in reports] == list(cc.WORKLOADS)
    for r in reports:  # every workload crashed at its sampled points and completed
        assert r.crash_points == 41 and r.states == 41 * len(cc.QUICK_MODES), r
    violations = [v for r in reports for v in r.violations]
    assert not violations, violations[0]


def test_every_workload_is_deterministic_so_a_key_names_one_crash_state():
    for w in cc.WORKLOADS:
        first = [(e.op, len(e.paths)) for e in cc.probe(w)]
        assert first == [(e.op, len(e.paths)) for e in cc.probe(w)], w
    # the two schedules of the save's thread are different orders of the same ops
    eager, lazy = (cc.probe(w) for w in ("save-eager", "save-lazy"))
    assert sorted(e.op for e in eager) == sorted(e.op for e in lazy)
    assert [e.op for e in eager] != [e.op for e in lazy]


def _seeded_window() -> list[int]:
    """Under the old order: the ops from ``seeded.json`` durable to the end of the start
    (where a crash lost the restored groups)."""
    with cc.seeded_before_builder():
        ops = cc.probe("restore-salvage")
    seeded = [i for i, e in enumerate(ops, 1) if e.op == "fsync_dir"
              and any("seeded" in o for o in ops[i - 2].paths)]
    assert seeded, "seeded.json is never made durable"
    return list(range(seeded[0], seeded[1] if len(seeded) > 1 else len(ops)))


def test_the_old_seeded_order_loses_restored_groups_and_the_campaign_catches_it():
    window = _seeded_window()
    with cc.seeded_before_builder():
        msg = cc.run_state("restore-salvage", window[len(window) // 2], "after", "kill",
                           "restore-salvage:control:after:kill")
    assert msg is not None and "neither never started nor restored" in msg, msg


@pytest.mark.parametrize("workload", ["restore-salvage", "restore-exact"])
def test_a_crash_between_seeding_and_the_builder_state_keeps_the_restored_groups(workload):
    """Regression: ``seeded.json`` is written only after the builder's restored state is
    durable; a crash anywhere in that stretch restarts (or redoes) the restore whole."""
    ops = cc.probe(workload)
    seeded = next(i for i, e in enumerate(ops, 1) if any("seeded" in p for p in e.paths))
    for nth in range(max(1, seeded - 120), min(len(ops), seeded + 8) + 1, 6):
        for mode in ("power/clear-cache/0", "kill"):
            key = f"{workload}:{nth}:after:{mode}"
            assert cc.run_state(workload, nth, "after", mode, key) is None


@pytest.mark.parametrize("name", sorted(cc.CONTROLS))
def test_each_negative_control_is_caught(name):
    if name == "seeded_before_builder":
        window = _seeded_window()
        found = cc.run_control(name, ("kill",), points=[(n, "after") for n in window[::8]])
    else:
        found = cc.run_control(name, ("power/clear-cache/0", "kill"), max_points=40)
    assert found is not None, f"{name} was not caught"
    assert "violation" in found.splitlines()[0]


def test_a_key_replays_from_the_command_line(capsys):
    assert cc.main(["--replay", "save-eager:40:after:power/clear-cache/0"]) == 0
    assert "no violation" in capsys.readouterr().out
