"""The README's demo command runs a small RL job, kills and resumes it, and what it prints
is what the pool holds (checked here from the queue, the batches and the weights, not from
the demo's own arithmetic)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from straw import Coordinator, SharedFilesystemStore
from straw.fs import PosixFS
from straw.publication_log import AckLog
from straw.refs import RecordSetRef
from straw.rollout import RankBatchRef
from straw.rollout.toy import ToyPolicy, ToyTask
from straw.tensor import tensor_from_record

QUICK = {"steps": 14, "prompts": 64}  # Settings.quick(): what the checks below expect


def run_demo(root, *extra):
    done = subprocess.run([sys.executable, "-m", "straw.demo", "--quick", "--root", str(root),
                           *extra], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def number(pattern, out):
    m = re.search(pattern, out)
    assert m, f"{pattern!r} not in the demo's output:\n{out}"
    return [int(g.replace(",", "")) for g in m.groups()]


def read_json(store, ref):
    (rec,) = store.read(RecordSetRef.from_dict(ref))
    return json.loads(bytes(rec.payload))


def check_against_the_pool(root, out):
    """Every number the demo printed, recomputed from the pool."""
    curve = [float(r) for r in re.findall(r"^  batch +\d+  (\d\.\d{3})", out, re.M)]
    accepted, trained, batches, backlog = number(
        r"groups accepted: (\d+) \((\d+) trained in (\d+) batches, (\d+) in the backlog", out)
    assert "lost: 0; trained twice: 0" in out
    assert "regenerated-after-resume: 0" in out
    packs, size = number(r"on disk: (\d+) pack files, ([\d,]+) bytes", out)
    (version,) = number(r"weights version (\d+) recorded in the queue", out)
    stale = {int(k): int(v) for k, v in re.findall(r"(\d+): (\d+)", out.split(
        "oldest generating version): ")[1].splitlines()[0])}
    assert len(curve) == batches == version == QUICK["steps"]

    with SharedFilesystemStore(str(root), "demo", writer_id="test-check") as store:
        assert store.disk_usage() == {"pack_files": packs, "bytes": size}
        coord = Coordinator(store, queue_id="rollout", namespace=True, recover=True)
        try:
            commits, cursor = [], 0
            while page := coord.read_commits(cursor, 1000).commits:
                commits += page
                cursor += len(page)
            prompt_commits = {c.position: c.task_id for c in commits
                              if c.task_id.startswith("prompt:")}
            assert len(prompt_commits) == accepted
            assert len(set(prompt_commits.values())) == accepted  # each accepted once
            view = coord.load_consumer_state(coord.consumer_id)
            state = read_json(store, view["state_ref"])
            assert len(state["finished_batches"]) == batches
            seen: Counter[str] = Counter()
            histogram: Counter[int] = Counter()
            for step, batch_id in enumerate(state["finished_batches"]):
                b = coord.get_batch(batch_id)
                assert b["finished"]
                plan = read_json(store, b["plan_ref"])
                seen.update(prompt_commits[g["position"]] for g in plan["groups"])
                ready = read_json(store, b["ready_ref"])
                samples = [x for r, ref in enumerate(ready["ranks"]) for x in RankBatchRef(
                    batch_id, ready["plan_digest"], r, ready["world"],
                    RecordSetRef.from_dict(ref)).load(store, rank=r).samples]
                assert len(samples) == 4 * len(plan["groups"])
                assert round(float(np.mean([x["raw_reward"] for x in samples])), 3) == \
                    curve[step]
                histogram.update(step - min(v[2] for v in x["versions"]) for x in samples)
            assert max(seen.values()) == 1  # nothing trained twice
            assert len(seen) == trained
            untrained = set(prompt_commits.values()) - set(seen)
            assert len(untrained) == backlog == accepted - trained  # nothing lost
            assert dict(histogram) == stale
            weights = coord.producer_state("weights")
            # one update per finished batch: a batch trained twice would show here
            assert weights["version"] == weights["trained"] == batches
            (rec,) = store.read(RecordSetRef.from_dict(weights["weights"]))
            policy = ToyPolicy(ToyTask())
            start = policy.greedy_reward(ToyTask().prompts(QUICK["prompts"]))
            policy.load(tensor_from_record(rec), weights["version"])
            assert policy.greedy_reward(ToyTask().prompts(QUICK["prompts"])) > start
        finally:
            coord.close()
    # nothing accepted before the resume was generated again after it
    logs = root / "demo-logs"
    starts = [e for e in AckLog(PosixFS(), str(logs / "trainer.log")).read()
              if e["ev"] == "start"]
    assert [e["phase"] for e in starts] == [1, 2]
    before = {t for p, t in prompt_commits.items() if p < starts[1]["commits"]}
    assert before
    after = [e for f in sorted(logs.glob("p2-*.log"))
             for e in AckLog(PosixFS(), str(f)).read() if e["ev"] == "generate"]
    assert after and not [e for e in after if f"prompt:{e['group']}" in before]
    return out


def test_demo_learns_survives_kills_and_reports_what_the_pool_holds(tmp_path):
    out = check_against_the_pool(tmp_path / "pool", run_demo(tmp_path / "pool"))
    assert "p1-gen1 SIGKILLed before this batch" in out
    assert "the whole job SIGKILLed and resumed before this batch" in out
    (kept,) = number(r"SIGKILLed: (\d+) groups it completed stayed accepted", out)
    assert kept > 0
    assert "where everything lives: pool" in out


@pytest.mark.parametrize("point", ["after-weights"])
def test_a_job_killed_after_recording_weights_does_not_train_that_batch_again(tmp_path,
                                                                                point):
    out = run_demo(tmp_path / "pool", "--kill-point", point)
    assert re.search(r"found batch \d+ trained \(its weights recorded\) but not "
                     r"acknowledged: it acknowledged it without training it again", out)
    check_against_the_pool(tmp_path / "pool", out)
