"""A short run of the whole-job scenario (``fault_injection.job_fuzz``: one checkpointed
rollout job SIGKILLed at random and resumed through resolve_checkpoint + open_job), and
its two negative controls (issue 15, item 6)."""

from __future__ import annotations

from fault_injection.job_fuzz import JobSummary, check, run_job


def test_job_under_sigkill_resumes_from_its_checkpoints(tmp_path) -> None:
    s = run_job(str(tmp_path), seconds=8, seed=3)
    assert not s.violations, s.violations[:3]
    # resumed after kills: salvages of the newest checkpoint (the drain is one), and
    # recoveries when a kill came before a branch's first checkpoint
    assert s.kills >= 2 and s.starts.get("salvage", 0) >= 1, s.line()
    assert s.starts.get("salvage", 0) + s.starts.get("recover", 0) >= 2, s.line()
    assert s.saves > 0 and s.batches > 0 and s.accepted > 0, s.line()
    assert s.replayed > 0, s.line()  # batches trained before a kill were replayed, checked


def test_job_fuzz_catches_an_exact_resume(tmp_path) -> None:
    """Resuming the newest checkpoint exactly (not salvaged): the groups accepted after it
    are generated again, and the batches after it are not replayed as they were."""
    s = run_job(str(tmp_path), seconds=6, seed=3, control="job-exact-resume")
    assert s.starts.get("exact", 0) > 0, s.line()
    assert any(v.startswith("regenerated:") for v in s.violations), s.line()


def test_job_fuzz_catches_a_trainer_that_skips_the_replayed_batches(tmp_path) -> None:
    """A resumed trainer that continues after the last batch it ever trained, instead of
    replaying from the checkpoint: the restored groups are trained a second time."""
    s = run_job(str(tmp_path), seconds=6, seed=3, control="job-trainer-skips-replay")
    assert any("trained twice" in v for v in s.violations), s.line()


def _write(path, *entries) -> str:
    import json
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    return str(path)


def test_job_checker_reports_a_batch_replayed_with_other_data_and_a_lost_group(
        tmp_path) -> None:
    """The checker on a hand-written log: rollout 0 trained twice with different digests
    (the replay with a sample the generator did not make), prompt:2 accepted but neither
    trained nor left in the backlog."""
    log = _write(tmp_path / "job.acks",
                 {"ev": "start", "mode": "new", "gen": 0, "step": None, "rollout": 0},
                 {"ev": "take", "tasks": ["prompt:0", "prompt:1", "prompt:2"]},
                 {"ev": "complete", "task": "prompt:0"},
                 {"ev": "complete", "task": "prompt:1"},
                 {"ev": "complete", "task": "prompt:2"},
                 {"ev": "training", "rollout": 0, "batch": "b", "tasks": ["prompt:0"],
                  "digest": "aa"},
                 {"ev": "start", "mode": "salvage", "gen": 1, "step": None, "rollout": 0},
                 {"ev": "training", "rollout": 0, "batch": "b", "tasks": ["prompt:1"],
                  "digest": "bb", "bad": ["1/0: [1, 2, 3, 5]"]},
                 {"ev": "drained", "backlog": []})
    v = check(log, JobSummary("local", 0, 0))
    assert any(x.startswith("rollout 0 replayed with other training data") for x in v), v
    assert "lost: accepted group prompt:2 neither trained nor in the final backlog" in v, v
    assert "rollout 0 trained a sample the generator did not make: 1/0: [1, 2, 3, 5]" in v, v
    assert not any("prompt:1" in x and "lost" in x for x in v), v  # trained by the replay
