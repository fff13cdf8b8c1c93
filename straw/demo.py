"""The demo: a small, real RL job whose rollouts live in straw, killed and resumed.

    python3 dev.py demo       # or: python -m straw.demo [--root DIR] [--keep] [--quick]
                              #     [--kill-point between-batches|after-weights]

A tiny NumPy policy (``straw.rollout.toy``) learns to reverse 4-token prompts, fully
async, on an embedded pool in a temp directory:

* the **job** process: a ``RolloutController`` served to the workers
  (``straw.rollout.remote``) and a trainer: ``BatchBuilder.next_batch`` (GRPO advantages
  as the reward hook), one REINFORCE update per batch, the new weights published to the
  pool and recorded in the queue (the ``weights`` producer state: version, batches
  trained, the weights' reference, one transaction), the serving version bumped, then
  ``finish_batch``;
* **generation workers** (processes): a ``GenerationClient`` over ``RemoteController``;
  they take prompt groups, generate with ``ToyPolicy.generate`` (the generate-function
  protocol) and return them; when the serving version moves they abort, return what they
  have as partial groups (persisted for continuation) and load the new weights.

Mid-run one worker is SIGKILLed (its leases expire, the other workers take its groups
again; what it had accepted stays accepted); later the whole job (job process and every
worker) is SIGKILLed and started again on the same pool: the controller recovers the
queue, the builder its state, the trainer the weights the queue records (with
``--kill-point after-weights`` the job dies inside a step, after recording its weights and
before ``finish_batch``: the resumed job acknowledges that batch without training it
again).  Every process keeps an fsynced log (``demo-logs/`` beside the pool's ``runs/``),
and at the end the demo checks from the logs and the queue: nothing accepted lost,
nothing trained twice, one weight update per finished batch, no accepted group generated
again after the resume.  It prints the reward curve, groups accepted,
regenerated-after-resume, a staleness histogram, bytes on disk and where everything
lives.  (The storage checks of the earlier demo are covered by the test
suite: ``tests/test_store.py``, ``tests/test_tensor.py``, ``tests/test_coordinator.py``.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .coordinator import Coordinator
from .errors import LeaseExpired, StaleAttempt
from .fs import PosixFS
from .publication_log import AckLog
from .refs import RecordSetRef
from .rollout import (
    PROMPT_PREFIX,
    BatchBuilder,
    EnvironmentMix,
    GenerationClient,
    RankBatchRef,
    Returned,
    RolloutConfig,
    RolloutController,
    default_convert,
)
from .rollout.builder import COLLECTION_PREFIX
from .rollout.remote import RemoteController, start
from .rollout.toy import ToyPolicy, ToyTask, grpo_advantages
from .store import SharedFilesystemStore
from .tensor import tensor_from_record, tensor_record

RUN = "demo"
QUEUE = "rollout"
TOKEN = "straw-demo-token"
WEIGHTS = "weights"  # the queue producer whose state records the trained weights
LOGS = "demo-logs"
KILL_POINTS = ("between-batches", "after-weights")
RESERVE_BYTES = 1 << 20  # a toy job's packs grow 1 MiB at a time (a killed writer's slack)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The job's size; ``--quick`` is the test's."""

    steps: int = 30  # training batches
    batch_groups: int = 8  # prompt groups per batch
    samples: int = 4  # samples per prompt (GRPO group)
    workers: int = 3
    concurrency: int = 2  # groups a worker generates at once
    prompts: int = 64
    kill_worker_at: int = 8  # SIGKILL one worker after this many batches
    kill_job_at: int = 16  # SIGKILL the whole job after this many batches
    lease_seconds: float = 3.0
    token_seconds: float = 0.004
    lr: float = 8.0
    seed: int = 0
    # where the job dies: "between-batches" (the demo SIGKILLs it once kill_job_at batches
    # are trained) or "after-weights" (it SIGKILLs itself after recording the weights of
    # batch kill_job_at - 1, before its finish_batch: the resumed job must acknowledge
    # that batch without training it again)
    kill_point: str = "between-batches"

    def __post_init__(self) -> None:
        if self.kill_point not in KILL_POINTS:
            raise ValueError(f"kill_point must be one of {KILL_POINTS}, got "
                             f"{self.kill_point!r}")
        if not 0 < self.kill_worker_at < self.kill_job_at < self.steps:
            raise ValueError("the demo needs 0 < kill_worker_at < kill_job_at < steps")

    @classmethod
    def quick(cls) -> Settings:
        return cls(steps=14, batch_groups=6, workers=2, kill_worker_at=4, kill_job_at=8,
                   lease_seconds=2.0)

    def to_args(self) -> list[str]:
        return [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)]

    @classmethod
    def from_args(cls, items: Sequence[str]) -> Settings:
        kinds = {f.name: type(getattr(cls(), f.name)) for f in dataclasses.fields(cls)}
        values = dict(item.split("=", 1) for item in items)
        return cls(**{k: kinds[k](v) for k, v in values.items()})


def _store(root: str, writer_id: str, s: Settings) -> SharedFilesystemStore:
    return SharedFilesystemStore(root, RUN, writer_id=writer_id, reserve_bytes=RESERVE_BYTES,
                                 **_config(s).store_options())


def _config(s: Settings) -> RolloutConfig:
    return RolloutConfig(n_samples_per_prompt=s.samples, lease_seconds=s.lease_seconds,
                         segment_mib=8)


def _policy(s: Settings) -> ToyPolicy:
    return ToyPolicy(ToyTask(), seed=s.seed, lr=s.lr, token_seconds=s.token_seconds)


def _prompts(s: Settings) -> list[tuple[int, ...]]:
    return ToyTask().prompts(s.prompts, seed=s.seed)


def _log(logdir: str, name: str) -> AckLog:
    return AckLog(PosixFS(), os.path.join(logdir, name + ".log"))


def _read(logdir: str, name: str) -> list[Any]:
    return AckLog(PosixFS(), os.path.join(logdir, name + ".log")).read()


def _stop(_sig: int, _frame: object) -> None:
    raise SystemExit(0)


def _load_weights(store: SharedFilesystemStore, state: Mapping[str, Any]) -> np.ndarray:
    (rec,) = store.read(RecordSetRef.from_dict(state["weights"]))
    return tensor_from_record(rec)


# --- the job: controller and trainer --------------------------------------------------
def convert_with_versions(sample: Any, reward: float) -> dict[str, Any]:
    """The builder's default train data plus the sample's weight versions (the trainer
    measures staleness against the version it trains)."""
    return {**default_convert(sample, reward),
            "versions": [[v.start, v.stop, v.version] for v in sample.versions]}


def job_main(root: str, logdir: str, phase: int, s: Settings) -> int:
    signal.signal(signal.SIGTERM, _stop)
    log = _log(logdir, "trainer")
    config = _config(s)
    store = _store(root, "trainer", s)
    policy = _policy(s)
    controller = RolloutController(store, _prompts(s), config=config, queue_id=QUEUE,
                                   recover=phase > 1, shuffle=True, seed=s.seed,
                                   exclusive_owner="the demo's job process")
    coord = controller.coordinator
    # the weights the queue records (None: a new job), served before anything is served
    saved = coord.producer_state(WEIGHTS)
    if saved is not None:
        policy.load(_load_weights(store, saved), int(saved["version"]))
        controller.set_serving_version(policy.version)
    builder = BatchBuilder(coord, store, EnvironmentMix.single(s.batch_groups), dp_size=2,
                           config=config, reward_hook=grpo_advantages,
                           convert_hook=convert_with_versions)
    server = start(controller, ("127.0.0.1", 0), token=TOKEN)
    try:
        trained = int(saved["trained"]) if saved is not None else 0
        finished = len(builder.state()["finished_batches"])
        log.append({"ev": "start", "phase": phase, "version": policy.version,
                    "trained": trained, "finished": finished,
                    "commits": _commits(coord),
                    "url": server.url, "epoch": coord.epoch, "t": time.time()})
        if trained == finished + 1:
            # killed between recording the weights and finish_batch: the batch is trained
            # (its update is in the weights); acknowledge it, do not train it again
            refs = builder.next_batch(finished)  # ready: returned again, nothing written
            if refs is None:
                raise RuntimeError(f"the weights record batch {finished} as trained but the "
                                   "builder has no such batch: not this demo's pool?")
            builder.finish_batch(refs[0].batch_id)
            log.append({"ev": "acknowledged", "step": finished, "batch": refs[0].batch_id})
            finished += 1
        elif trained != finished:
            raise RuntimeError(f"the weights record {trained} trained batches but the "
                               f"builder finished {finished}: not this demo's pool?")
        while finished < s.steps:
            refs = builder.next_batch(finished)
            if refs is None:
                time.sleep(0.02)  # the workers are still filling the batch
                continue
            crash = phase == 1 and s.kill_point == "after-weights" and \
                finished + 1 == s.kill_job_at
            train_step(store, coord, controller, builder, policy, refs, finished, log,
                       crash=crash)
            finished += 1
        log.append({"ev": "done", "steps": finished, "version": policy.version,
                    "t": time.time()})
        while True:  # keep serving until the demo stops the workers, then us
            time.sleep(0.2)
    finally:
        server.close()
        builder.close()
        controller.close()
        store.close()


def _commits(coord: Coordinator) -> int:
    """The length of the durable commit log."""
    cursor = 0
    while True:
        page = coord.read_commits(cursor, 1000)
        cursor = page.cursor
        if not page.commits:
            return cursor


def train_step(store: SharedFilesystemStore, coord: Coordinator,
               controller: RolloutController, builder: BatchBuilder, policy: ToyPolicy,
               refs: Sequence[RankBatchRef], step: int, log: AckLog, *,
               crash: bool = False) -> None:
    """Train on one batch, publish and record the new weights, serve them, acknowledge.
    (One process stands in for the data-parallel ranks: it loads every rank's shard and
    sums their gradients, as an all-reduce would.)"""
    samples = [x for r in refs for x in r.load(store, rank=r.rank).samples]
    raw = [float(x["raw_reward"]) for x in samples]
    version = policy.update((x["tokens"].tolist(), x["response_length"], x["reward"])
                            for x in samples)
    ref = store.publish([tensor_record(policy.weights, f"weights:{version}")],
                        submission_id=f"weights:{version}")
    # version, progress and the weights' reference in ONE queue transaction (the state's
    # reference keeps the weights alive while it is the latest)
    coord.submit_tasks(f"weights:{version}", [], producer_id=WEIGHTS, producer_state={
        "version": version, "trained": step + 1, "batch_id": refs[0].batch_id,
        "weights": ref})
    controller.set_serving_version(version)
    if crash:  # the demo's kill point "after-weights"
        log.append({"ev": "killing-self", "step": step, "version": version})
        os.kill(os.getpid(), signal.SIGKILL)
    builder.finish_batch(refs[0].batch_id)  # RL4: after training, the only acknowledgement
    log.append({"ev": "trained", "step": step, "batch": refs[0].batch_id,
                "version": version, "reward": float(np.mean(raw)), "t": time.time()})


# --- a generation worker --------------------------------------------------------------
def worker_main(root: str, logdir: str, name: str, s: Settings) -> int:
    log = _log(logdir, name)
    url = _url(logdir, int(name[1:name.index("-")]))  # p<phase>-gen<i>
    store = _store(root, name, s)
    remote = RemoteController(url, token=TOKEN)
    client = GenerationClient(remote, store, worker_id=name, config=_config(s))
    policy = _policy(s)
    try:
        asyncio.run(_generate(client, remote, store, policy, log, s))
    finally:
        with contextlib.suppress(Exception):  # the job may be gone already
            client.close()
        store.close()
    return 0


async def _generate(client: GenerationClient, remote: RemoteController,
                    store: SharedFilesystemStore, policy: ToyPolicy, log: AckLog,
                    s: Settings) -> None:
    """Take groups, generate them concurrently, return them; a new serving version
    aborts the groups in flight (returned partial) and loads the recorded weights."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def serving() -> int:
        return int(remote.serving_version)

    async def follow(abort: asyncio.Event, done: asyncio.Event) -> None:
        # a new weight version aborts in-flight generation (returned as partial groups)
        while not done.is_set():
            if stop.is_set() or await asyncio.to_thread(serving) != policy.version:
                abort.set()
                return
            await asyncio.sleep(0.02)

    while not stop.is_set():
        if await asyncio.to_thread(serving) != policy.version:
            state = await asyncio.to_thread(remote.client.call, "producer_state",
                                            producer_id=WEIGHTS)
            policy.load(await asyncio.to_thread(_load_weights, store, state),
                        int(state["version"]))
        groups = await asyncio.to_thread(client.take, s.concurrency)
        if not groups:
            await asyncio.sleep(0.02)
            continue
        for g in groups:
            log.append({"ev": "generate", "group": g.group_index, "version": policy.version,
                        "progress": sum(x.response_length for x in g)})
        abort, done = asyncio.Event(), asyncio.Event()
        watcher = asyncio.create_task(follow(abort, done))
        out = await asyncio.gather(*(policy.generate(g, weight_version=policy.version,
                                                     abort=abort) for g in groups))
        done.set()
        await watcher
        try:
            returned = await asyncio.to_thread(client.return_groups, out)
        except (StaleAttempt, LeaseExpired):
            # a lease expired under us (a stalled machine): another worker has that group
            # now.  The others were returned; a retry answers each with its first outcome
            returned = []
            for g in out:
                try:
                    returned += await asyncio.to_thread(client.return_groups, [g])
                except (StaleAttempt, LeaseExpired):
                    returned.append(Returned(f"prompt:{g.group_index}", "lease-lost"))
        for g, r in zip(out, returned, strict=True):
            log.append({"ev": r.action, "group": g.group_index,
                        "progress": sum(x.response_length for x in g)})


def _url(logdir: str, phase: int, timeout: float = 120) -> str:
    """The URL the job process of ``phase`` serves its controller at (waits for it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        starts = [e for e in _read(logdir, "trainer")
                  if e.get("ev") == "start" and e["phase"] == phase]
        if starts:
            return str(starts[-1]["url"])
        time.sleep(0.05)
    raise TimeoutError(f"the job process did not serve its controller within {timeout:.0f} s")


# --- the demo: start, kill, resume, check ---------------------------------------------
class Job:
    """The processes of one start of the job."""

    def __init__(self, root: str, logdir: str, phase: int, s: Settings) -> None:
        self.root, self.logdir, self.phase, self.s = root, logdir, phase, s
        self.job = self._spawn("--job", str(phase))
        # the workers start meanwhile; each waits for this start's controller
        self.workers = {f"p{phase}-gen{i}": self._spawn("--worker", f"p{phase}-gen{i}")
                        for i in range(s.workers)}

    def _spawn(self, role: str, arg: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "straw.demo", role, arg, self.root,
                                 self.logdir, *self.s.to_args()])

    def alive(self) -> None:
        if self.job.poll() is not None:
            raise RuntimeError(f"the job process exited with {self.job.returncode}; see its "
                               "output above")

    def kill(self, name: str) -> None:
        proc = self.workers[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def kill_all(self) -> None:
        for proc in [self.job, *self.workers.values()]:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """Workers first (they release their leases), then the job."""
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.workers.values():
            proc.wait(timeout=60)
        self.job.terminate()
        if self.job.wait(timeout=60) != 0:
            raise RuntimeError(f"the job process exited with {self.job.returncode}")


def _trained(logdir: str) -> list[dict[str, Any]]:
    return [e for e in _read(logdir, "trainer") if e.get("ev") == "trained"]


def _wait_trained(job: Job, steps: int, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while len(_trained(job.logdir)) < steps:
        job.alive()
        if time.monotonic() > end:
            raise TimeoutError(f"the trainer did not reach {steps} batches in {timeout:.0f} s")
        time.sleep(0.05)


def run(root: str, s: Settings) -> dict[str, Any]:
    logdir = os.path.join(root, LOGS)
    PosixFS().makedirs(logdir)
    t0 = time.monotonic()
    job = Job(root, logdir, 1, s)
    victim = f"p1-gen{s.workers - 1}"
    try:
        _wait_trained(job, s.kill_worker_at)
        # kill it mid-generation: its last logged event is a group it started generating
        end = time.monotonic() + 30
        while (_read(logdir, victim) or [{}])[-1].get("ev") != "generate" \
                and time.monotonic() < end:
            time.sleep(0.005)
        job.kill(victim)
        if s.kill_point == "after-weights":
            job.job.wait(timeout=300)  # it kills itself inside batch kill_job_at - 1
            if not any(e["ev"] == "killing-self" for e in _read(logdir, "trainer")):
                raise RuntimeError(f"the job process exited with {job.job.returncode} "
                                   "before its kill point; see its output above")
        else:
            _wait_trained(job, s.kill_job_at)
        job.kill_all()
    except BaseException:
        job.kill_all()
        raise
    killed_job_after = len(_trained(logdir))
    job = Job(root, logdir, 2, s)
    try:
        end = time.monotonic() + 300
        while not any(e.get("ev") == "done" for e in _read(logdir, "trainer")):
            job.alive()
            if time.monotonic() > end:
                raise TimeoutError("the resumed job did not finish within 300 s")
            time.sleep(0.05)
        job.stop()
    except BaseException:
        job.kill_all()
        raise
    wall = time.monotonic() - t0
    report = check(root, logdir, victim)
    report.update(wall=wall, killed_job_after=killed_job_after, victim=victim)
    return report


def check(root: str, logdir: str, victim: str) -> dict[str, Any]:
    """What the logs and the queue prove (raises if anything was lost or done twice)."""
    with SharedFilesystemStore(root, RUN, writer_id="demo-check") as store:
        coord = Coordinator(store, queue_id=QUEUE, namespace=True, recover=True,
                            exclusive_owner="the demo's final check")
        try:
            commits: list[Any] = []
            cursor = 0
            while True:
                page = coord.read_commits(cursor, 1000)
                commits += page.commits
                cursor = page.cursor
                if not page.commits:
                    break
            starts = [e for e in _read(logdir, "trainer") if e.get("ev") == "start"]
            accepted = {c.position: int(c.task_id[len(PROMPT_PREFIX):]) for c in commits
                        if c.task_id.startswith(PROMPT_PREFIX)}
            accepted_before_resume = {g for p, g in accepted.items()
                                      if p < starts[-1]["commits"]}
            # every finished batch's plan: which accepted groups it trained
            in_batches: Counter[int] = Counter()
            consumer = coord.load_consumer_state(coord.consumer_id)
            assert consumer is not None, "the builder saved its state"
            (rec,) = store.read(RecordSetRef.from_dict(consumer["state_ref"]))
            builder_state = json.loads(bytes(rec.payload))
            rewards: list[float] = []
            stale: Counter[int] = Counter()
            for step, b in enumerate(builder_state["finished_batches"]):
                view = coord.get_batch(b)
                assert view is not None and view["finished"], b
                plan = _json(store, view["plan_ref"])
                in_batches.update(accepted[g["position"]] for g in plan["groups"])
                # what batch `step` trained on, read back from its rank shards; the policy
                # served version `step` while it trained (one update per batch)
                ready = _json(store, view["ready_ref"])
                samples = [x for r, ref in enumerate(ready["ranks"]) for x in RankBatchRef(
                    b, ready["plan_digest"], r, ready["world"],
                    RecordSetRef.from_dict(ref)).load(store, rank=r).samples]
                rewards.append(float(np.mean([x["raw_reward"] for x in samples])))
                stale.update(step - min(int(v[2]) for v in x["versions"]) for x in samples)
            twice = sorted(g for g, n in in_batches.items() if n > 1)
            # accepted, not trained yet: the builder's backlog, and what it has not
            # scanned yet (accepted after its last batch)
            backlog = {accepted[e["position"]] for e in builder_state["backlog"]} | {
                g for p, g in accepted.items() if p >= builder_state["scan_cursor"]}
            lost = sorted(set(accepted.values()) - set(in_batches) - backlog)
            weights = coord.producer_state(WEIGHTS)
            collections = sum(1 for c in commits if c.task_id.startswith(COLLECTION_PREFIX))
            disk = store.disk_usage()
            queue_dir = coord.dir
        finally:
            coord.close()
    # the workers' logs: generation after the resume, the killed worker's groups
    names = sorted(n[:-4] for n in os.listdir(logdir) if n.startswith("p") and
                   n.endswith(".log"))
    logs = {n: _read(logdir, n) for n in names}
    regenerated = sum(1 for n in names if n.startswith("p2-") for e in logs[n]
                      if e["ev"] == "generate" and e["group"] in accepted_before_resume)
    victim_done = {e["group"] for e in logs[victim] if e["ev"] == "completed"}
    last = {e["group"]: e["ev"] for e in logs[victim]}  # each group's last event
    victim_open = {g for g, ev in last.items() if ev == "generate"}
    # taken again by the other workers of the first start (after its leases expired), or
    # by the workers of the resumed job
    retaken = {e["group"] for n in names if n != victim and n.startswith("p1-")
               for e in logs[n] if e["ev"] == "generate" and e["group"] in victim_open}
    resumed = {e["group"] for n in names if n.startswith("p2-")
               for e in logs[n] if e["ev"] == "generate" and e["group"] in victim_open}
    resumed_partial = sum(1 for n in names for e in logs[n]
                          if e["ev"] == "generate" and e["progress"] > 0)
    calls = sum(1 for n in names for e in logs[n] if e["ev"] == "generate")
    victim_lost = sorted(victim_done - set(in_batches) - backlog)
    # one update per finished batch: a batch trained twice (say, again after the resume)
    # shows as more updates than batches
    updates = weights["version"]
    if updates != len(rewards) or weights["trained"] != len(rewards):
        raise RuntimeError(f"the demo's check failed: {updates} weight updates recorded for "
                           f"{len(rewards)} finished batches")
    if lost or twice or regenerated or victim_lost:
        raise RuntimeError(f"the demo's check failed: accepted groups lost {lost} (of the "
                           f"killed worker: {victim_lost}), trained twice {twice}, "
                           f"accepted groups generated again after the resume {regenerated}")
    trainer = _read(logdir, "trainer")
    return {"rewards": rewards, "steps": len(rewards),
            "accepted": len(accepted), "trained_groups": len(in_batches),
            "backlog": len(backlog), "lost": len(lost), "twice": len(twice),
            "accepted_before_resume": len(accepted_before_resume),
            "regenerated": regenerated, "victim_done": len(victim_done),
            "victim_open": len(victim_open), "retaken": len(retaken),
            "retaken_after_resume": len(resumed - retaken),
            "resumed_partial": resumed_partial, "generate_calls": calls,
            "staleness": dict(sorted(stale.items())), "version": weights["version"],
            "weights": weights, "collections": collections, "disk": disk,
            "queue_dir": queue_dir, "logdir": logdir, "commits": len(commits),
            "resumed_at": starts[-1],
            "acknowledged": [e["step"] for e in trainer if e["ev"] == "acknowledged"],
            "self_killed": [e["step"] for e in trainer if e["ev"] == "killing-self"]}


def _json(store: SharedFilesystemStore, ref: Mapping[str, Any]) -> Any:
    (rec,) = store.read(RecordSetRef.from_dict(ref))
    return json.loads(bytes(rec.payload))


def _bar(value: float, width: int = 40) -> str:
    return "#" * max(0, round(value * width))


def show(root: str, report: dict[str, Any], s: Settings, removed: bool) -> None:
    rewards = report["rewards"]
    print(f"straw demo: a toy policy learns to reverse {4}-token prompts; {s.workers} "
          f"generation workers, batches of {s.batch_groups} groups x {s.samples} samples")
    print(f"reward curve (mean reward of each trained batch; uniform policy: "
          f"{1 / 8:.3f}):")
    for step, r in enumerate(rewards):
        mark = ""
        if step == s.kill_worker_at:
            mark = f"   <- {report['victim']} SIGKILLed before this batch"
        if step in report["self_killed"]:
            mark = ("   <- the whole job SIGKILLed after recording these weights, before "
                    "finish_batch")
        elif step == report["killed_job_after"]:
            mark = "   <- the whole job SIGKILLed and resumed before this batch"
        print(f"  batch {step:3d}  {r:.3f}  {_bar(r)}{mark}")
    k = max(1, len(rewards) // 5)
    print(f"  reward: first {k} batches {np.mean(rewards[:k]):.3f} -> last {k} batches "
          f"{np.mean(rewards[-k:]):.3f}")
    print(f"groups accepted: {report['accepted']} ({report['trained_groups']} trained in "
          f"{report['steps']} batches, {report['backlog']} in the backlog for the next "
          f"one); lost: {report['lost']}; trained twice: {report['twice']}")
    print(f"worker {report['victim']} SIGKILLed: {report['victim_done']} groups it "
          f"completed stayed accepted; of its {report['victim_open']} groups in flight, "
          f"{report['retaken']} were taken again by the other workers once its leases "
          f"expired ({s.lease_seconds:g} s), {report['retaken_after_resume']} by the "
          "resumed job's workers")
    print(f"job SIGKILLed after {report['killed_job_after']} acknowledged batches and "
          f"resumed from the pool: {report['accepted_before_resume']} groups accepted before; "
          f"regenerated-after-resume: {report['regenerated']}")
    for step in report["acknowledged"]:
        print(f"  the resumed job found batch {step} trained (its weights recorded) but not "
              "acknowledged: it acknowledged it without training it again")
    print(f"generate calls: {report['generate_calls']}, {report['resumed_partial']} of them "
          f"continued a partial group (aborted by a weight update, persisted, resumed)")
    print("staleness of trained samples (serving version - oldest generating version): "
          + ", ".join(f"{k}: {v}" for k, v in report["staleness"].items()))
    disk = report["disk"]
    print(f"on disk: {disk['pack_files']} pack files, {disk['bytes']:,} bytes; weights "
          f"version {report['version']} recorded in the queue")
    print(f"where everything lives: pool {root}{' (removed)' if removed else ''}")
    print(f"  queue (journal, commit log, batches): {report['queue_dir']}")
    print(f"  packs (prompts, groups, shards, weights): {os.path.join(root, 'runs', RUN)}")
    print(f"  process logs: {report['logdir']}")
    print(f"({report['wall']:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--job"]:
        return job_main(args[2], args[3], int(args[1]), Settings.from_args(args[4:]))
    if args[:1] == ["--worker"]:
        return worker_main(args[2], args[3], args[1], Settings.from_args(args[4:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", help="pool directory (default: a fresh temp directory)")
    p.add_argument("--keep", action="store_true", help="keep the temp pool afterwards")
    p.add_argument("--quick", action="store_true", help="a smaller job (the tests')")
    p.add_argument("--kill-point", choices=KILL_POINTS, default=KILL_POINTS[0],
                   help="where the whole job is SIGKILLed: between two batches, or inside "
                        "one after its weights were recorded and before finish_batch")
    opts = p.parse_args(args)
    s = dataclasses.replace(Settings.quick() if opts.quick else Settings(),
                            kill_point=opts.kill_point)
    root = opts.root or tempfile.mkdtemp(prefix="straw-demo-")
    removed = not opts.root and not opts.keep
    try:
        report = run(root, s)
    finally:
        if removed:
            shutil.rmtree(root, ignore_errors=True)
    show(root, report, s, removed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
