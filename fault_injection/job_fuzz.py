"""``just fuzz --scenario job``: a whole checkpointed rollout job under SIGKILL, resumed
from its joint checkpoints.

Role: verification layer 7 of DESIGN.md for ``straw.rollout`` checkpoints (RL6, RL8).

One **job process** (``python -m fault_injection.job_fuzz --role job ...``) holds the
whole job: ``resolve_checkpoint(save)`` + ``open_job`` (new, salvage of the newest
checkpoint, or recover), a ``GenerationClient`` over its controller, and a trainer loop:
``next_batch(rollout id)``, generating only while it returns None, "training" (loading
every rank's shard), ``finish_batch``, and a joint checkpoint ``job.save(rollout id)``
every ``SAVE_EVERY`` batches.  A seeded supervisor SIGKILLs it (the whole job: every part
of it dies at once) at random times and starts it again, many rounds; at the end one
**drain** incarnation resumes the same way, trains the batches its restored backlog fills
without generating, and logs what is left in its backlog.

The job logs to one fsynced acknowledgement log, always AFTER the call it acknowledges
returned: ``start`` (mode, step, first rollout id), ``take`` (the prompt tasks a
generator call leased), ``complete`` (a task whose group was accepted), ``training``
(rollout id, batch id, the tasks of the batch in plan order, and a sha256 of the plan and
the shard contents of every rank) before ``finish_batch``, ``finished`` after it, and
``saved`` after a checkpoint.  Only one incarnation runs at a time (the supervisor waits
for the killed one), so the log is in time order.

The checker proves from the log alone:

* nothing accepted was regenerated: no task is taken after its completion was logged;
* each trained batch is identical when replayed: every ``training`` entry of a rollout
  id carries the same digest (plan and shard bytes), whichever incarnation trained it;
* nothing accepted was lost or trained twice: every completed task is in the batch of
  exactly one rollout id, or in the drain's final backlog; no task in two rollout ids;
* the job made progress and resumed: kills, salvage starts, replayed batches.

Negative controls (the checker must report them): ``job-exact-resume`` (a resume that
restores the checkpoint exactly instead of salvaging: groups accepted after it are
generated again, the batches after it differ) and ``job-trainer-skips-replay`` (a
resumed trainer that continues after the last rollout id it logged instead of replaying
from the checkpoint: replayed groups are trained a second time).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fault_injection.procs import REPO, AckLines, Proc, read_ack_lines, stop_all
from straw import SharedFilesystemStore

RUN = "job-fuzz"
N_PROMPTS = 40
BATCH = 2  # groups per batch
SAVE_EVERY = 3  # a joint checkpoint after every SAVE_EVERY-th batch
CONTROLS = ("job-exact-resume", "job-trainer-skips-replay")
LOG = "job.acks"


def _config() -> Any:
    from straw.rollout import RolloutConfig
    return RolloutConfig(n_samples_per_prompt=2, lease_seconds=60, min_refill=4,
                         max_refill=4)


def _prompts() -> list[tuple[int, ...]]:
    return [(i, i + 1, i + 2) for i in range(N_PROMPTS)]


def _save_model(model_dir: str) -> dict[str, Any]:
    with open(os.path.join(model_dir, "weights.bin"), "wb") as f:
        f.write(np.arange(256, dtype=np.float32).tobytes())
    return {"files": ["weights.bin"], "optimizer": True, "rng": True}


def _stop(_sig: int, _frame: object) -> None:
    raise SystemExit(0)


def _token(group: int) -> int:
    """The toy generator's one response token for the group ``group``."""
    return 1000 + 7 * group


def _wrong(tokens: Sequence[int], group: Any, reward: Any, index: Any) -> bool:
    """Whether a sample is not what the generator made (its response token, reward)."""
    return list(tokens) != [_token(int(group))] or reward != float(index or 0)


def _digest(refs: Sequence[Any], store: Any) -> tuple[str, list[str], list[str]]:
    """(sha256 of the batch's plan and every rank's shard content, its tasks in order,
    the samples whose content is not what the generator made)."""
    h = hashlib.sha256()
    tasks: list[str] = []
    bad: list[str] = []
    for ref in sorted(refs, key=lambda r: r.rank):
        shard = ref.load(store, rank=ref.rank)
        for s in shard.samples:
            tokens = [int(t) for t in np.asarray(s["tokens"]).tolist()]
            tasks.append(f"prompt:{s['group_index']}")
            if _wrong(tokens, s["group_index"], s["reward"], s["index"]):
                bad.append(f"{s['group_index']}/{s['index']}: {tokens}, reward {s['reward']}")
            h.update(json.dumps([ref.rank, tokens, s["response_length"], s["reward"],
                                 s["group_index"], s["index"]]).encode())
    return h.hexdigest(), list(dict.fromkeys(tasks)), bad


def _backlog(job: Any, store: Any) -> tuple[list[str], list[str]]:
    """The tasks of the groups left in the builder's backlog, read from the pool, and
    the samples among them whose content is wrong."""
    from straw.rollout.builder import Accepted
    from straw.rollout.codec import group_from_records
    tasks, bad = [], []
    for entry in job.builder.state()["backlog"]:
        group = group_from_records(list(store.read(Accepted.from_dict(entry).ref)))
        tasks.append(f"prompt:{group.group_index}")
        bad += [f"{s.group_index}/{s.index}: {list(s.tokens)}" for s in group
                if _wrong([int(t) for t in s.tokens], s.group_index, s.reward, s.index)]
    return tasks, bad


def _generate(client: Any, log: AckLines, r: random.Random) -> None:
    """One generator call: lease one to three groups, complete each (deterministic
    tokens).  An odd count now and then: a batch of two leaves a group in the backlog."""
    from straw.rollout import Status
    groups = client.take(r.randint(1, 3))
    if not groups:
        time.sleep(0.05)
        return
    log.write(ev="take", tasks=[f"prompt:{g.group_index}" for g in groups])
    done = [dataclasses.replace(g, samples=tuple(
        dataclasses.replace(s, tokens=tuple(s.tokens) + (_token(int(g.group_index)),),
                            response_length=1, status=Status.COMPLETED,
                            reward=float(s.index or 0))
        for s in g.samples)) for g in groups]
    outs = client.return_groups(done)
    for g, out in zip(done, outs, strict=True):
        if out.action == "completed":
            log.write(ev="complete", task=f"prompt:{g.group_index}")


def job_main(root: str, save: str, logdir: str, gen: int, seed: int, control: str | None,
             drain: bool) -> int:
    from straw.rollout import EnvironmentMix, GenerationClient
    from straw.rollout.resolve import SALVAGE, resolve_checkpoint
    from straw.rollout.restore import open_job
    signal.signal(signal.SIGTERM, _stop)
    r = random.Random(f"{seed}:job:{gen}")
    log = AckLines(os.path.join(logdir, LOG))
    store = SharedFilesystemStore(root, RUN, writer_id=f"job-{gen}")
    gen_store = SharedFilesystemStore(root, RUN, writer_id=f"job-{gen}-gen")
    resolution = resolve_checkpoint(save)
    if control == "job-exact-resume" and resolution.mode == SALVAGE:
        # the planted bug: the newest checkpoint restored exactly (a rollback to it)
        resolution = resolve_checkpoint(save, step=resolution.step)
    config = _config()
    job = open_job(resolution, store, _prompts(), EnvironmentMix.single(BATCH), dp_size=1,
                   config=config)
    client = GenerationClient(job.controller, gen_store, worker_id=f"gen-{gen}",
                              config=config)
    rollout = job.next_rollout_id
    if control == "job-trainer-skips-replay":
        # the planted bug: go on after the last batch this job ever trained
        trained = [e["rollout"] for e in read_ack_lines(os.path.join(logdir, LOG))
                   if e["ev"] == "training"]
        rollout = max(trained, default=-1) + 1
    log.write(ev="start", gen=gen, mode=resolution.mode, step=resolution.step,
              rollout=rollout, restored=job.restored)
    try:
        while True:
            refs = job.builder.next_batch(rollout)
            if refs is None:
                if drain:
                    break
                _generate(client, log, r)
                continue
            digest, tasks, bad = _digest(refs, store)
            log.write(ev="training", rollout=rollout, batch=refs[0].batch_id, tasks=tasks,
                      digest=digest, bad=bad)
            time.sleep(r.uniform(0.01, 0.08))  # "training"
            job.builder.finish_batch(refs[0].batch_id)
            log.write(ev="finished", rollout=rollout)
            if rollout % SAVE_EVERY == SAVE_EVERY - 1:
                job.save(rollout, _save_model)
                log.write(ev="saved", step=rollout)
            rollout += 1
        left, bad = _backlog(job, store)
        log.write(ev="drained", backlog=left, bad=bad)
    finally:
        client.close()
        job.close()
        gen_store.close()
        store.close()
    return 0


# --- the supervisor and the checker -----------------------------------------------------
@dataclass
class JobSummary:
    target: str
    seed: int
    seconds: float
    kills: int = 0
    starts: dict[str, int] = field(default_factory=dict)  # resolution mode -> starts
    accepted: int = 0
    batches: int = 0  # rollout ids trained
    replayed: int = 0  # training entries of a rollout id trained before
    saves: int = 0
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        starts = ", ".join(f"{n} {m}" for m, n in sorted(self.starts.items()))
        return (f"fuzz [job/{self.target}] seed={self.seed} {self.seconds:.0f}s: "
                f"{self.kills} kills, starts ({starts}), {self.saves} checkpoints, "
                f"{self.accepted} groups accepted, {self.batches} batches trained, "
                f"{self.replayed} replayed; {len(self.violations)} violations")


def _argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fault_injection.job_fuzz", "--role", role, *args]


def _wait_for(path: str, ev: str, count: int, end: float) -> None:
    while time.monotonic() < end:
        if sum(e["ev"] == ev for e in read_ack_lines(path)) >= count:
            return
        time.sleep(0.05)


def run_job(base: str, *, seconds: float, seed: int = 0, mount: str | None = None,
            target: str = "local", control: str | None = None) -> JobSummary:
    """One run (module docstring): the pool and save directory on ``mount`` (a JuiceFS
    mount), else under ``base``; the logs under ``base``."""
    where = mount or base
    root, save = os.path.join(where, "pool"), os.path.join(where, "save")
    logdir = os.path.join(base, "logs")
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(save, exist_ok=True)
    logpath = os.path.join(logdir, LOG)
    out = JobSummary(target, seed, seconds)
    r = random.Random(seed)
    ctl = ("--control", control) if control else ()
    gen = 0

    def argv(role: str) -> list[str]:
        return _argv(role, root, save, logdir, "--gen", str(gen), "--seed", str(seed), *ctl)

    starts = 0
    proc = Proc("job", argv("job"), logdir)
    # warm-up: the kills start once the job checkpointed (start-up is slow on a busy
    # machine; a run of a few seconds must still resume), at most 60 s
    _wait_for(logpath, "saved", 1, time.monotonic() + 60)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            # a kill at a random point: now and then while it starts (imports,
            # resolve, open_job), else once it started: while it trains, saves, generates
            if r.random() < 0.3:
                time.sleep(r.uniform(0.2, 2.0))
            else:
                _wait_for(logpath, "start", starts + 1, end)
                time.sleep(r.uniform(0.05, 1.5))
            assert proc.p is not None
            if proc.p.poll() is not None:
                out.violations.append(f"job ended by itself (rc={proc.p.returncode}):\n"
                                      f"{proc.tail()}")
            else:
                proc.p.kill()
                out.kills += 1
            proc.p.wait()
            gen += 1
            proc.argv = argv("job")
            starts = sum(e["ev"] == "start" for e in read_ack_lines(logpath))
            proc.start()
    finally:
        out.violations += stop_all([proc])
    gen += 1
    drain = Proc("drain", [*argv("job"), "--drain"], logdir)
    assert drain.p is not None
    try:
        rc = drain.p.wait(timeout=120)
    except subprocess.TimeoutExpired:  # a hung drain is a finding
        drain.p.kill()
        rc = drain.p.wait()
    if rc != 0:
        out.violations.append(f"the drain incarnation ended with rc={rc}:\n{drain.tail()}")
    out.violations += check(logpath, out)
    return out


def check(logpath: str, s: JobSummary) -> list[str]:
    out: list[str] = []
    log = read_ack_lines(logpath)
    completed: dict[str, int] = {}  # task -> index of its logged completion
    taken: set[str] = set()
    digests: dict[int, str] = {}
    tasks_of: dict[int, list[str]] = {}  # rollout id -> the tasks of its (last) training
    backlog: list[str] | None = None
    for i, e in enumerate(log):
        ev = e["ev"]
        if ev == "start":
            s.starts[e["mode"]] = s.starts.get(e["mode"], 0) + 1
        elif ev == "take":
            taken.update(e["tasks"])
            for t in e["tasks"]:
                if t in completed:
                    out.append(f"regenerated: {t} taken again (log line {i + 1}) after its "
                               f"group was accepted (line {completed[t] + 1})")
        elif ev == "complete":
            completed.setdefault(e["task"], i)
        elif ev == "training":
            rid = int(e["rollout"])
            if rid in digests:
                s.replayed += 1
                if digests[rid] != e["digest"]:
                    out.append(f"rollout {rid} replayed with other training data (log line "
                               f"{i + 1}): tasks {e['tasks']}, before {tasks_of[rid]}")
            digests.setdefault(rid, e["digest"])
            out += [f"rollout {rid} trained a sample the generator did not make: {b}"
                    for b in e.get("bad", ())]
            tasks_of[rid] = list(e["tasks"])
        elif ev == "saved":
            s.saves += 1
        elif ev == "drained":
            backlog = list(e["backlog"])
            out += [f"the final backlog holds a sample the generator did not make: {b}"
                    for b in e.get("bad", ())]
    s.accepted = len(completed)
    s.batches = len(tasks_of)
    if backlog is None:
        return [*out, "the drain incarnation logged no final backlog"]
    where: dict[str, list[int]] = {}
    for rid, tasks in sorted(tasks_of.items()):
        for t in tasks:
            where.setdefault(t, []).append(rid)
            # (a kill between return_groups and its log line leaves an acceptance
            # unlogged; the take before the generation is always logged)
            if t not in taken:
                out.append(f"rollout {rid} trained {t}, which no generator call took")
    out += [f"{t} trained twice: rollout ids {rids}" for t, rids in where.items()
            if len(rids) > 1]
    out += [f"{t} trained and still in the final backlog (rollout ids {where[t]})"
            for t in backlog if t in where]
    out += [f"lost: accepted group {t} neither trained nor in the final backlog"
            for t in sorted(completed) if t not in where and t not in backlog]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fault_injection.job_fuzz")
    ap.add_argument("--role", choices=("job",))
    ap.add_argument("root", nargs="?")
    ap.add_argument("save", nargs="?")
    ap.add_argument("logdir", nargs="?")
    ap.add_argument("--gen", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--control", choices=CONTROLS, default=None)
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.role == "job":
        return job_main(args.root, args.save, args.logdir, args.gen, args.seed, args.control,
                        args.drain)
    import tempfile
    s = run_job(args.dir or tempfile.mkdtemp(prefix="straw-job-fuzz-"),
                seconds=args.seconds, seed=args.seed, control=args.control)
    print(s.line())
    for v in s.violations[:20]:
        print("VIOLATION " + v)
    return 1 if s.violations else 0


if __name__ == "__main__":
    sys.exit(main())
