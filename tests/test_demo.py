"""The README's demo command runs a small RL job on a local Ray cluster, checkpoints it,
SIGKILLs a generation actor and then the whole job, resumes it by salvage, and what it
prints is what the pool holds (checked here from the queues, the batches, the branch
files and the weights, not from the demo's own arithmetic)."""

from __future__ import annotations

import json
import os
import pathlib
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
from straw.rollout.builder import read_stored_state
from straw.rollout.toy import ToyPolicy, ToyTask
from straw.tensor import tensor_from_record

pytest.importorskip("ray")

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICK = {"steps": 12, "prompts": 64, "samples": 4, "kill_job_at": 7}  # Settings.quick()


def run_demo(root):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "straw.cli.demo", "--quick", "--root", str(root)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def number(pattern, out):
    m = re.search(pattern, out)
    assert m, f"{pattern!r} not in the demo's output:\n{out}"
    return [int(g.replace(",", "")) for g in m.groups()]


def read_json(store, ref):
    (rec,) = store.read(RecordSetRef.from_dict(ref))
    return json.loads(bytes(rec.payload))


def branch(directory):
    return json.loads((directory / "rollout" / "branch.json").read_text())


class Queue:
    """One start's queue, read back: accepted groups by commit id, batches by step."""

    def __init__(self, store, info):
        self.store = store
        self.coord = Coordinator(store, queue_id=info["queue_id"],
                                 namespace=info["namespace"], recover=True)
        commits, cursor = [], 0
        while page := self.coord.read_commits(cursor, 1000).commits:
            commits += page
            cursor += len(page)
        self.accepted = {c.commit_id: c for c in commits if c.task_id.startswith("prompt:")}
        view = self.coord.load_consumer_state(self.coord.consumer_id)
        self.builder = read_stored_state(read_json(store, view["state_ref"]))

    def batch(self, step):
        receipt = self.coord.lookup_submission(f"collection:{step}")
        if receipt is None:
            return None
        batch_id = "batch:" + receipt.commit_id
        b = self.coord.get_batch(batch_id)
        if b is None or not b["finished"]:
            return None
        ready = read_json(self.store, b["ready_ref"])
        samples = [x for r, ref in enumerate(ready["ranks"]) for x in RankBatchRef(
            batch_id, ready["plan_digest"], r, ready["world"],
            RecordSetRef.from_dict(ref)).load(self.store, rank=r).samples]
        return read_json(self.store, b["plan_ref"]), samples


def check_against_the_pool(root, out):
    """Every number the demo printed, recomputed from the pool."""
    curve = [float(r) for r in re.findall(r"^  batch +\d+  (\d\.\d{3})", out, re.M)]
    accepted, trained, batches, backlog = number(
        r"groups accepted: (\d+) \((\d+) trained in (\d+) batches, (\d+) in the backlog", out)
    assert "lost: 0; trained twice: 0" in out
    assert "regenerated-after-resume: 0" in out
    (k, restored) = number(r"resumed by salvage of checkpoint (\d+): (\d+) groups restored",
                           out)
    replayed = [int(x) for x in re.search(r"batches \[([\d, ]*)\] replayed identical",
                                          out).group(1).split(",") if x.strip()]
    packs, size = number(r"on disk: (\d+) pack files, ([\d,]+) bytes", out)
    (version,) = number(r"weights version (\d+) recorded in the queue", out)
    stale = {int(a): int(b) for a, b in re.findall(r"(\d+): (\d+)", out.split(
        "oldest generating version): ")[1].splitlines()[0])}
    assert len(curve) == batches == version == QUICK["steps"]

    save = root / "checkpoints"
    first = branch(save)
    (second_dir,) = (save / "branches").iterdir()
    second = branch(second_dir)
    assert (first["mode"], second["mode"]) == ("new", "salvage")
    assert second["parent"]["step"] == k  # the newest checkpoint before the kill
    assert sorted(int(p.name[len("committed_"):-5]) for p in (save / "rollout").glob(
        "committed_*.json"))[-1] == k

    with SharedFilesystemStore(str(root), "demo", writer_id="test-check") as store:
        assert store.disk_usage() == {"pack_files": packs, "bytes": size}
        q1, q2 = Queue(store, first["queue"]), Queue(store, second["queue"])
        try:
            task_of = {cid: c.task_id for q in (q1, q2) for cid, c in q.accepted.items()}
            lineage = [(q1 if step <= k else q2).batch(step) for step in range(batches)]
            assert None not in lineage
            # the batches the killed job trained after the checkpoint: replayed identical
            again = [step for step in range(k + 1, batches) if q1.batch(step) is not None]
            assert again == replayed and replayed
            for step in replayed:
                (p1, s1), (p2, s2) = q1.batch(step), lineage[step]
                assert [(g["commit_id"], g["digest"]) for g in p1["groups"]] == \
                    [(g["commit_id"], g["digest"]) for g in p2["groups"]]
                assert [x["tokens"].tolist() for x in s1] == [x["tokens"].tolist() for x in s2]
            seen = Counter(task_of[g["commit_id"]] for plan, _ in lineage
                           for g in plan["groups"])
            assert max(seen.values()) == 1 and len(seen) == trained  # nothing trained twice
            # restored into the resumed builder: the groups accepted by the first start and
            # not trained at the checkpoint, none of them accepted again by the second
            assert restored == sum(1 for plan, _ in lineage for g in plan["groups"]
                                   if g.get("restored")) + sum(
                1 for e in q2.builder["backlog"] if e.get("restored"))
            first_tasks = {c.task_id for c in q1.accepted.values()}
            second_tasks = {c.task_id for c in q2.accepted.values()}
            assert not first_tasks & second_tasks
            assert len(first_tasks | second_tasks) == accepted
            left = {task_of[e["commit_id"]] for e in q2.builder["backlog"]} | {
                c.task_id for c in q2.accepted.values()
                if c.position >= q2.builder["scan_cursor"]}
            assert len(left) == backlog and (first_tasks | second_tasks) - set(seen) == left
            for step, (_, samples) in enumerate(lineage):
                assert len(samples) == QUICK["samples"] * len(lineage[step][0]["groups"])
                assert round(float(np.mean([x["raw_reward"] for x in samples])), 3) == \
                    curve[step]
            histogram = Counter(step - min(v[2] for v in x["versions"])
                                for step, (_, samples) in enumerate(lineage) for x in samples)
            assert dict(histogram) == stale
            weights = q2.coord.producer_state("weights")
            assert weights["version"] == weights["trained"] == batches
            (rec,) = store.read(RecordSetRef.from_dict(weights["weights"]))
            policy = ToyPolicy(ToyTask())
            start = policy.greedy_reward(ToyTask().prompts(QUICK["prompts"]))
            policy.load(tensor_from_record(rec), weights["version"])
            assert policy.greedy_reward(ToyTask().prompts(QUICK["prompts"])) > start
        finally:
            q1.coord.close()
            q2.coord.close()
    # the generation actors' calls: none after the resume for a group accepted before it
    logs = root / "demo-logs"
    after = [e for f in sorted(logs.glob("p2-gen-*.log"))
             for e in AckLog(PosixFS(), str(f)).read() if e["ev"] == "generate"]
    assert not [e for e in after if f"prompt:{e['group']}" in first_tasks]
    return out


def test_demo_learns_survives_kills_resumes_by_salvage_and_reports_what_the_pool_holds(
        tmp_path):
    out = check_against_the_pool(tmp_path / "pool", run_demo(tmp_path / "pool"))
    assert "a generation actor SIGKILLed before this batch" in out
    (held,) = number(r"SIGKILLed after batch \d+ holding (\d+) leases: retired", out)
    assert held > 0
    # the supervisor SIGKILLs the driver once it logged kill_job_at batches (a batch more
    # if the driver was quicker than the supervisor's poll)
    (killed_after,) = number(r"job SIGKILLed after (\d+) trained batches", out)
    assert killed_after >= QUICK["kill_job_at"]
    assert "where everything lives: pool" in out
