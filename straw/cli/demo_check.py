"""The demo's check: what the pool's queues and batches prove about the two starts of
the job (nothing accepted lost, nothing trained twice in the trained lineage, the
replayed batches identical), and what the processes' logs say about generate calls (no
accepted group generated again after the resume)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..coordinator import Coordinator
from ..refs import RecordSetRef
from ..rollout import RankBatchRef
from ..rollout.builder import COLLECTION_PREFIX, read_stored_state
from ..rollout.data_source import PROMPT_PREFIX
from ..rollout.resolve import NEW, SALVAGE
from ..store import SharedFilesystemStore
from .demo_settings import CHECKPOINTS, RUN, WEIGHTS, Settings, _read


def _json(store: SharedFilesystemStore, ref: Mapping[str, Any]) -> Any:
    (rec,) = store.read(RecordSetRef.from_dict(ref))
    return json.loads(bytes(rec.payload))


@dataclasses.dataclass
class QueueView:
    """What one start's queue holds: its accepted groups and its batches."""

    coord: Coordinator
    store: SharedFilesystemStore

    def __post_init__(self) -> None:
        self.commits: list[Any] = []
        cursor = 0
        while page := self.coord.read_commits(cursor, 1000).commits:
            self.commits += page
            cursor += len(page)
        self.accepted = {c.commit_id: c for c in self.commits
                         if c.task_id.startswith(PROMPT_PREFIX)}
        view = self.coord.load_consumer_state(self.coord.consumer_id)
        self.builder = {} if view is None else read_stored_state(
            _json(self.store, view["state_ref"]))

    def batch(self, step: int) -> dict[str, Any] | None:
        """Batch ``step``'s plan and samples (None: never planned here)."""
        receipt = self.coord.lookup_submission(COLLECTION_PREFIX + str(step))
        if receipt is None:
            return None
        batch_id = "batch:" + receipt.commit_id
        view = self.coord.get_batch(batch_id)
        if view is None or not view["finished"]:
            return None
        ready = _json(self.store, view["ready_ref"])
        samples = [x for r, ref in enumerate(ready["ranks"]) for x in RankBatchRef(
            batch_id, ready["plan_digest"], r, ready["world"],
            RecordSetRef.from_dict(ref)).load(self.store, rank=r).samples]
        return {"batch_id": batch_id, "plan": _json(self.store, view["plan_ref"]),
                "samples": samples}


@dataclasses.dataclass
class _Lineage:
    """What the two starts' queues hold: the trained lineage of batches, the groups
    accepted by each start, the batches replayed after the resume (and whether each is
    identical), the backlog, and the pool's figures."""

    batches: list[dict[str, Any]]
    replayed: list[tuple[int, bool]]
    in_batches: Counter[str]
    twice: list[str]
    backlog: set[str]
    accepted1: set[str]
    accepted2: set[str]
    lost: list[str]
    weights: Any
    disk: Any
    queue_dirs: list[str]


def _lineage(store: SharedFilesystemStore, q1: QueueView, q2: QueueView, k: int,
             s: Settings) -> _Lineage:
    """Batches ``0..k`` from the first start's queue, the rest from the second's (raises
    if one was not trained)."""
    views = (q1, q2)
    task_of = {cid: c.task_id for q in views for cid, c in q.accepted.items()}
    lineage = [(q1 if step <= k else q2).batch(step) for step in range(s.steps)]
    missing = [step for step, b in enumerate(lineage) if b is None]
    if missing:
        raise RuntimeError(f"the demo's check failed: batches {missing} not trained")
    batches = [b for b in lineage if b is not None]
    # the batches the dead job trained after the checkpoint, replayed by the new one
    replayed = []
    for step in range(k + 1, s.steps):
        old = q1.batch(step)
        if old is None:
            break
        new = batches[step]
        same = [(g["commit_id"], g["digest"]) for g in old["plan"]["groups"]] == \
            [(g["commit_id"], g["digest"]) for g in new["plan"]["groups"]]
        replayed.append((step, same))
    in_batches = Counter(task_of[g["commit_id"]] for b in batches
                         for g in b["plan"]["groups"])
    twice = sorted(t for t, n in in_batches.items() if n > 1)
    backlog = {task_of[e["commit_id"]] for e in q2.builder["backlog"]} | {
        c.task_id for c in q2.accepted.values()
        if c.position >= q2.builder["scan_cursor"]}
    accepted1 = {c.task_id for c in q1.accepted.values()}
    accepted2 = {c.task_id for c in q2.accepted.values()}
    lost = sorted((accepted1 | accepted2) - set(in_batches) - backlog)
    return _Lineage(batches, replayed, in_batches, twice, backlog, accepted1, accepted2,
                    lost, q2.coord.producer_state(WEIGHTS), store.disk_usage(),
                    [q.coord.dir for q in views])


def _problems(t: _Lineage, regenerated: int, same_weights: list[bool],
              s: Settings) -> list[str]:
    problems = []
    if t.lost or t.twice:
        problems.append(f"accepted groups lost {t.lost}, trained twice {t.twice}")
    if regenerated or t.accepted1 & t.accepted2:
        problems.append(f"{regenerated} generate calls after the resume for groups accepted "
                        f"before it; accepted in both starts: "
                        f"{sorted(t.accepted1 & t.accepted2)}")
    if not t.replayed or not all(same for _, same in t.replayed) or not all(same_weights):
        problems.append(f"replayed batches not identical: {t.replayed}, "
                        f"weights {same_weights}")
    w = t.weights
    if w is None or w["version"] != s.steps or w["trained"] != s.steps:
        problems.append(f"the weights recorded {w and w['version']} updates for "
                        f"{s.steps} batches")
    return problems


def check(root: str, logdir: str, s: Settings) -> dict[str, Any]:
    """What the pool's queues and batches prove, and the logs' generate calls (raises if
    anything accepted was lost, trained twice, replayed differently or generated again)."""
    trainer = _read(logdir, "trainer")
    starts = {e["phase"]: e for e in trainer if e["ev"] == "start"}
    r1, r2 = starts[1]["resolution"], starts[2]["resolution"]
    if r1["mode"] != NEW or r2["mode"] != SALVAGE:
        raise RuntimeError(f"the demo's check failed: the job started as {r1['mode']!r} "
                           f"and resumed as {r2['mode']!r} (expected new, then salvage)")
    k = int(r2["step"])  # the checkpoint the resumed job salvaged
    with SharedFilesystemStore(root, RUN, writer_id="demo-check") as store:
        views = [QueueView(Coordinator(store, queue_id=r["queue"]["queue_id"],
                                       namespace=r["queue"]["namespace"], recover=True),
                           store) for r in (r1, r2)]
        try:
            t = _lineage(store, views[0], views[1], k, s)
        finally:
            for q in views:
                q.coord.close()
    rewards = [float(np.mean([x["raw_reward"] for x in b["samples"]])) for b in t.batches]
    stale = Counter(step - min(int(v[2]) for v in x["versions"])
                    for step, b in enumerate(t.batches) for x in b["samples"])
    logs = {n[:-4]: _read(logdir, n[:-4]) for n in sorted(os.listdir(logdir))
            if n.startswith("p") and n.endswith(".log")}
    calls = {phase: [e for n, evs in logs.items() if n.startswith(f"p{phase}-gen-")
                     for e in evs if e["ev"] == "generate"] for phase in (1, 2)}
    accepted_before = {int(x[len(PROMPT_PREFIX):]) for x in t.accepted1}
    regenerated = sum(1 for e in calls[2] if e["group"] in accepted_before)
    killed = next(e for e in trainer if e["ev"] == "killed-worker")
    held_done = sum(1 for x in killed["held"] if x in t.accepted1 | t.accepted2)
    trained1 = {e["step"]: e for e in trainer if e["ev"] == "trained" and e["phase"] == 1}
    trained2 = {e["step"]: e for e in trainer if e["ev"] == "trained" and e["phase"] == 2}
    same_weights = [trained1[st]["weights"] == trained2[st]["weights"] for st, _ in t.replayed]
    problems = _problems(t, regenerated, same_weights, s)
    if problems:
        raise RuntimeError("the demo's check failed: " + "; ".join(problems))
    return {"rewards": rewards, "steps": len(t.batches), "checkpoint": k,
            "replayed": [st for st, _ in t.replayed], "restored": r2["restored"],
            "accepted": len(t.accepted1 | t.accepted2), "accepted_before": len(t.accepted1),
            "trained_groups": len(t.in_batches), "backlog": len(t.backlog),
            "lost": len(t.lost), "twice": len(t.twice), "regenerated": regenerated,
            "calls_before": len(calls[1]), "calls_after": len(calls[2]),
            "continued": sum(1 for p in (1, 2) for e in calls[p] if e["progress"] > 0),
            "killed": killed, "held_done": held_done,
            "staleness": dict(sorted(stale.items())), "version": t.weights["version"],
            "disk": t.disk, "queue_dirs": t.queue_dirs, "logdir": logdir,
            "checkpoints": os.path.join(root, CHECKPOINTS), "branch": r2["directory"]}
