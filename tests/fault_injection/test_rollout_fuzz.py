"""A short run of the rollout fuzz scenario (``fault_injection.rollout_fuzz``: a rollout
controller, generation processes and a trainer SIGKILLed and restarted), and its negative
control (issue 14, item 8)."""

from __future__ import annotations

from fault_injection.rollout_fuzz import run_rollout


def test_rollout_job_under_sigkill_short_run(tmp_path) -> None:
    s = run_rollout(str(tmp_path), seconds=10, n_generators=2, seed=5)
    assert not s.violations, s.violations[:3]
    assert sum(s.kills.values()) > 0, s.line()
    assert s.batches > 0 and s.completed > 0, s.line()
    assert s.resumed > 0, s.line()  # partial work was taken up again, and checked


def test_rollout_fuzz_catches_partial_work_restarted_from_the_prompt(tmp_path) -> None:
    """Generation clients that throw partial work away (restart every group from its
    prompt) break RL5: the checker must say so."""
    s = run_rollout(str(tmp_path), seconds=8, n_generators=2, seed=5,
                    control="rollout-restart-partial")
    assert any(v.startswith("RL5:") for v in s.violations), s.line()


def test_rollout_fuzz_catches_a_trainer_that_abandons_its_unfinished_batch(tmp_path) -> None:
    """A restarted trainer that moves on to a new rollout id instead of replaying the batch
    it had collected but not finished: the checker sees that collection abandoned (neither
    finished nor the next to replay) and, when the run lasts long enough after the kill for
    the checker to place every accepted group, those groups lost (never trained).  Either is
    the control's signature: a CI run under load once showed the abandoned collection
    alone (the kill came late in the run)."""
    s = run_rollout(str(tmp_path), seconds=8, n_generators=2, seed=5,
                    control="rollout-trainer-skips-replay")
    assert s.kills.get("trainer", 0) > 0, s.line()
    assert any("lost" in v or "neither finished nor the next to replay" in v
               for v in s.violations), (s.line(), s.violations)
