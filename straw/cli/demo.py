"""The demo: a small, real RL job on a local Ray cluster whose rollouts live in straw,
checkpointed, killed and resumed by salvage.

    python3 dev.py demo       # or: python -m straw.cli.demo [--root DIR] [--keep] [--quick]

A tiny NumPy policy (``straw.rollout.toy``) learns to reverse 4-token prompts, fully
async, on an embedded pool in a temp directory:

* the **supervisor** (this process) starts a local Ray cluster once (``straw.rollout.ray.
  local``) and runs each start of the job as a driver process that joins it;
* the **driver** (the job): ``RayRollout`` with its controller actor (the queue, the
  dataset, the batch builder and the ``Checkpointer``, started by ``restore.open_job``
  from ``resolve_checkpoint``) and a generation actor per worker, each a ``Producer``
  running ``ToyGenerate`` (the toy policy behind the generate-function protocol); the
  trainer in the driver takes each batch (``next_batch``, GRPO advantages as the reward
  hook), pauses admission (in-flight groups persisted as partial ones), makes one
  REINFORCE update, publishes the new weights to the pool and records their reference in
  the queue (``record_state``), resumes generation under the new version (each actor's
  ``ToyGenerate`` loads those weights from the pool itself), then ``finish_batch``; every
  few batches a joint checkpoint (the policy's files, the queue, the builder, a marker);
* mid-run the driver SIGKILLs one generation actor's process: the controller retires it
  (its leases revoked, its tasks pending again for the other actors; what it had
  accepted stays accepted);
* later the supervisor SIGKILLs the driver (Ray ends its actors) and starts a new one:
  ``resolve_checkpoint`` selects the newest checkpoint and ``open_job`` SALVAGES it: the
  groups accepted after it are restored, not generated again, and the batches trained
  after it are replayed with the same groups (the same data, hence the same weights).

Every process keeps an fsynced log (``demo-logs/`` beside the pool's ``runs/``); at the
end the demo checks from the pool's queues and batches (and the logs for the generate
calls): nothing accepted lost, nothing trained twice in the trained lineage, the
replayed batches identical, no accepted group generated again after the resume.  It
prints the reward curve, groups accepted, regenerated-after-resume, a staleness
histogram, bytes on disk and where everything lives.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..fs import PosixFS
from ..publication_log import AckLog
from ..refs import RecordSetRef
from ..rollout import RankBatchRef, SampleGroup, default_convert
from ..rollout.checkpoint_files import model_dir

try:
    from ..rollout.ray import NodeSpec, RayRollout, controller_state
    from ..rollout.ray import local as ray_local
except ModuleNotFoundError as e:  # pragma: no cover - the ray extra is missing
    if e.name != "ray":
        raise
    raise ModuleNotFoundError("the demo runs on a local Ray cluster: install the ray extra "
                              "(pip install 'straw-store[ray]'; python3 dev.py demo does)",
                              name="ray") from e
from ..rollout.resolve import Resolution, resolve_checkpoint
from ..rollout.toy import ToyPolicy, grpo_advantages
from ..store import SharedFilesystemStore
from ..tensor import tensor_from_record, tensor_record
from .demo_check import QueueView as QueueView
from .demo_check import check as check
from .demo_settings import CHECKPOINTS as CHECKPOINTS
from .demo_settings import LOGS as LOGS
from .demo_settings import RUN as RUN
from .demo_settings import WEIGHTS as WEIGHTS
from .demo_settings import Settings as Settings
from .demo_settings import _config, _log, _policy, _prompts, _read, _store
from .demo_settings import controller_name as controller_name


def convert_with_versions(sample: Any, reward: float) -> dict[str, Any]:
    """The builder's default train data plus the sample's prompt (the trainer's update
    needs it: the toy's samples hold their response tokens only) and weight versions (the
    check measures staleness against the version that trained it)."""
    return {**default_convert(sample, reward), "prompt": [int(t) for t in sample.prompt],
            "versions": [[v.start, v.stop, v.version] for v in sample.versions]}


def weights_digest(weights: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(weights).tobytes()).hexdigest()[:16]


# --- the generate function the generation actors run ----------------------------------
class ToyGenerate:
    """The toy policy behind the generate-function protocol, as a generation actor runs
    it.  Pickled once when the actors start, so it finds each new weight version itself:
    the trainer records the weights' reference in the queue (``record_state``); this asks
    the controller actor for it and reads the weights from the pool through its own
    client.  Every call is logged (group, version, progress) for the demo's checks."""

    def __init__(self, root: str, logdir: str, phase: int, s: Settings) -> None:
        self.root, self.logdir, self.phase, self.s = root, logdir, phase, s
        self._reset()

    def _reset(self) -> None:
        self._policies: dict[int, ToyPolicy] = {}
        self._store: SharedFilesystemStore | None = None
        self._calls: AckLog | None = None

    def __getstate__(self) -> dict[str, Any]:  # what is shipped: the settings, no caches
        return {"root": self.root, "logdir": self.logdir, "phase": self.phase, "s": self.s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    async def _policy_of(self, version: int, abort: asyncio.Event) -> ToyPolicy | None:
        """The policy of ``version``: loaded from the pool once the trainer recorded it
        (None if ``abort`` is set first, or the trainer moved past it meanwhile)."""
        if version in self._policies:
            return self._policies[version]
        while not abort.is_set():
            state = await controller_state(controller_name(self.phase), WEIGHTS)
            if state is None and version == 0:
                policy = _policy(self.s)  # a new job: the initial (uniform) weights
                break
            if state is not None and int(state["version"]) == version:
                policy = _policy(self.s)
                policy.load(await asyncio.to_thread(self._weights, state), version)
                break
            if state is not None and int(state["version"]) > version:
                return None  # a slot that lags a weight update: nothing to generate
            await asyncio.sleep(0.02)  # the trainer is recording these weights
        else:
            return None
        self._policies = {v: p for v, p in self._policies.items() if v >= version - 1}
        self._policies[version] = policy
        return policy

    def _weights(self, state: Mapping[str, Any]) -> np.ndarray:
        if self._store is None:  # this actor's own client of the pool, for reading
            self._store = SharedFilesystemStore(
                self.root, RUN, writer_id=f"p{self.phase}-weights-{os.getpid()}")
        (rec,) = self._store.read(RecordSetRef.from_dict(state["weights"]))
        return tensor_from_record(rec)

    async def __call__(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup:
        policy = await self._policy_of(weight_version, abort)
        if policy is None:
            return group  # back unchanged (a partial group with nothing new)
        if self._calls is None:
            self._calls = _log(self.logdir, f"p{self.phase}-gen-{os.getpid()}")
        self._calls.append({"ev": "generate", "group": group.group_index, "version":
                            weight_version, "progress": sum(x.response_length for x in group)})
        return await policy.generate(group, weight_version=weight_version, abort=abort)


@dataclasses.dataclass(frozen=True)
class SaveWeights:
    """The checkpoint's model save (``save_model``), run by the controller actor: the
    policy's weights and its training state (plain SGD keeps no moments: its optimizer
    state is its step size; its sampling RNG is a function of the seed and version)."""

    weights: bytes  # np.save of the table
    state: Mapping[str, Any]

    def __call__(self, where: str) -> dict[str, Any]:
        fs = PosixFS()
        fs.write_file_durable(os.path.join(where, "policy.npy"), self.weights)
        fs.write_file_durable(os.path.join(where, "state.json"),
                              json.dumps(dict(self.state), sort_keys=True).encode())
        return {"files": ["policy.npy", "state.json"], "optimizer": True, "rng": True}


def _save_weights(policy: ToyPolicy) -> SaveWeights:
    buf = io.BytesIO()
    np.save(buf, policy.weights, allow_pickle=False)
    return SaveWeights(buf.getvalue(), {"version": policy.version, "lr": policy.lr,
                                        "seed": policy.seed})


def _load_checkpoint(policy: ToyPolicy, directory: str, step: int) -> None:
    fs = PosixFS()
    where = model_dir(directory, step)
    state = json.loads(fs.read_file(os.path.join(where, "state.json")))
    weights = np.load(io.BytesIO(fs.read_file(os.path.join(where, "policy.npy"))),
                      allow_pickle=False)
    policy.load(weights, int(state["version"]))


# --- the job: one driver process ------------------------------------------------------
def job_main(root: str, logdir: str, phase: int, address: str, s: Settings) -> int:
    ray_local.connect(address)
    log = _log(logdir, "trainer")
    store = _store(root, f"trainer-p{phase}", s)
    policy = _policy(s)
    resolution = resolve_checkpoint(os.path.join(root, CHECKPOINTS))
    if resolution.step is not None:
        assert resolution.source is not None
        _load_checkpoint(policy, resolution.source, resolution.step)
    try:
        return _drive(root, logdir, phase, s, log, store, policy, resolution)
    finally:
        store.close()
        ray_local.shutdown()


def _drive(root: str, logdir: str, phase: int, s: Settings, log: AckLog,
           store: SharedFilesystemStore, policy: ToyPolicy, resolution: Resolution) -> int:
    """The job's driver loop (``job_main``): start the Ray job from the resolution, train
    until the last batch, checkpoint, kill a generation actor once."""
    node = ray_local.node_id()
    job = RayRollout(root, RUN, _prompts(s), ToyGenerate(root, logdir, phase, s),
                     concurrency=s.workers * s.slots * s.samples, config=_config(s),
                     nodes=[NodeSpec(node, num_cpus=0) for _ in range(s.workers)],
                     batch_groups=s.batch_groups, dp_size=2, name=controller_name(phase),
                     weight_version=policy.version, checkpoint=resolution,
                     builder_options={"reward_hook": grpo_advantages,
                                      "convert_hook": convert_with_versions})
    try:
        if policy.version:  # the checkpoint's weights, where the actors load them
            assert resolution.step is not None
            _record_weights(store, job, policy, resolution.step + 1, None)
            job.resume(policy.version)
        started = job.resolution()
        log.append({"ev": "start", "phase": phase, "resolution": started,
                    "version": policy.version, "t": time.time(),
                    "pids": [job.where()["pid"]] +
                            [job.where(w.worker_id)["pid"] for w in job.workers]})
        step = started["next_rollout_id"]
        while step < s.steps:
            refs = job.next_batch(step, timeout=1.0)  # waits while the actors fill it
            if refs is None:
                continue
            train_step(store, job, policy, refs, step, phase, log)
            if (step + 1) % s.checkpoint_every == 0:
                job.save_checkpoint(step, _save_weights(policy))
                log.append({"ev": "checkpoint", "phase": phase, "step": step,
                            "version": policy.version, "t": time.time()})
            if phase == 1 and step + 1 == s.kill_worker_at:
                kill_a_worker(job, log, step)
            step += 1
        log.append({"ev": "done", "phase": phase, "steps": step, "version": policy.version,
                    "t": time.time()})
        job.close()
    except BaseException:
        job.close(force=True)
        raise
    return 0


def _record_weights(store: SharedFilesystemStore, job: RayRollout, policy: ToyPolicy,
                    trained: int | None, batch_id: str | None) -> None:
    """Publish the policy's weights and record their reference in the queue, where the
    generation actors read it."""
    v = policy.version
    ref = store.publish([tensor_record(policy.weights, f"weights:{v}")],
                        submission_id=f"weights:{v}")
    job.record_state(f"weights:{v}", WEIGHTS, {"version": v, "trained": trained,
                                              "batch_id": batch_id, "weights": ref.to_dict()})


def train_step(store: SharedFilesystemStore, job: RayRollout, policy: ToyPolicy,
               refs: Sequence[RankBatchRef], step: int, phase: int, log: AckLog) -> None:
    """Pause generation, train on one batch, publish and record the new weights, resume
    generation under them, acknowledge the batch.  (One process stands in for the
    data-parallel ranks: it loads every rank's shard and sums their gradients, as an
    all-reduce would.)"""
    job.pause()  # in-flight groups persisted as partial ones before the weights change
    samples = [x for r in refs for x in r.load(store, rank=r.rank).samples]
    raw = [float(x["raw_reward"]) for x in samples]
    policy.update((x["prompt"], x["tokens"][-x["response_length"]:].tolist(), x["reward"])
                  for x in samples)
    _record_weights(store, job, policy, step + 1, refs[0].batch_id)
    job.resume(policy.version)
    job.finish_batch(refs[0].batch_id)  # RL4: after training, the only acknowledgement
    log.append({"ev": "trained", "phase": phase, "step": step, "batch": refs[0].batch_id,
                "version": policy.version, "reward": float(np.mean(raw)),
                "weights": weights_digest(policy.weights), "t": time.time()})


def kill_a_worker(job: RayRollout, log: AckLog, step: int) -> None:
    """SIGKILL the last generation actor's process while it holds leases (mid-work), then
    let the controller retire it (its leases revoked, its tasks pending again)."""
    victim = job.workers[-1]
    held: list[str] = []
    end = time.monotonic() + 10
    while not held and time.monotonic() < end:
        held = job.held().get(victim.worker_id, [])
        if not held:
            time.sleep(0.01)
    pid = job.where(victim.worker_id)["pid"]
    os.kill(pid, signal.SIGKILL)
    lost = job.check_workers()
    log.append({"ev": "killed-worker", "step": step, "worker": victim.worker_id, "pid": pid,
                "held": held, "retired": [w.worker_id for w in lost], "t": time.time()})


# --- the demo: start, kill, resume, check ---------------------------------------------
def _trained(logdir: str, phase: int) -> list[dict[str, Any]]:
    return [e for e in _read(logdir, "trainer")
            if e.get("ev") == "trained" and e["phase"] == phase]


def _spawn(root: str, logdir: str, phase: int, address: str, s: Settings
           ) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "straw.cli.demo", "--job", str(phase), root,
                             logdir, address, *s.to_args()])


def _wait(proc: subprocess.Popen[bytes], until: Any, what: str, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not until():
        if proc.poll() is not None:
            raise RuntimeError(f"the job process exited with {proc.returncode} before "
                               f"{what}; see its output above")
        if time.monotonic() > end:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.02)


def _await_exit(pids: Sequence[int], timeout: float = 60) -> None:
    """Until the processes ``pids`` are gone (Ray ends a dead driver's actors; the next
    job reuses the controller's writer and the save directory's lock)."""
    end = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if time.monotonic() > end:
                raise TimeoutError(f"actor process {pid} still runs {timeout:.0f} s after "
                                   "its driver was killed")
            time.sleep(0.02)


def run(root: str, s: Settings) -> dict[str, Any]:
    logdir = os.path.join(root, LOGS)
    PosixFS().makedirs(logdir)
    t0 = time.monotonic()
    address = ray_local.start_local(num_cpus=1)
    try:
        ray_started = time.monotonic() - t0
        proc = _spawn(root, logdir, 1, address, s)
        try:
            _wait(proc, lambda: len(_trained(logdir, 1)) >= s.kill_job_at,
                  f"{s.kill_job_at} trained batches")
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # the whole job: its driver
            proc.wait()
        starts = [e for e in _read(logdir, "trainer") if e.get("ev") == "start"]
        _await_exit(starts[-1]["pids"])
        killed_after = len(_trained(logdir, 1))
        proc = _spawn(root, logdir, 2, address, s)
        try:
            if proc.wait(timeout=300) != 0:
                raise RuntimeError(f"the resumed job exited with {proc.returncode}; see its "
                                   "output above")
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        ray_local.shutdown()
    wall = time.monotonic() - t0
    report = check(root, logdir, s)
    report.update(wall=wall, ray_started=ray_started, killed_after=killed_after)
    return report


def _bar(value: float, width: int = 40) -> str:
    return "#" * max(0, round(value * width))


def show(root: str, report: dict[str, Any], s: Settings, removed: bool) -> None:
    rewards = report["rewards"]
    k = report["checkpoint"]
    print(f"straw demo: a toy policy learns to reverse 4-token prompts on a local Ray "
          f"cluster; {s.workers} generation actors, batches of {s.batch_groups} groups x "
          f"{s.samples} samples, a checkpoint every {s.checkpoint_every} batches")
    print(f"reward curve (mean reward of each trained batch; uniform policy: "
          f"{1 / 8:.3f}):")
    for step, r in enumerate(rewards):
        mark = ""
        if step == s.kill_worker_at:
            mark = "   <- a generation actor SIGKILLed before this batch"
        if step == k:
            mark = "   <- checkpoint the resumed job salvaged"
        elif step in report["replayed"]:
            mark = "   <- replayed after the resume: same groups, same weights"
        elif step == report["killed_after"]:
            mark = "   <- the whole job SIGKILLed before this batch, resumed by salvage"
        print(f"  batch {step:3d}  {r:.3f}  {_bar(r)}{mark}")
    n = max(1, len(rewards) // 5)
    print(f"  reward: first {n} batches {np.mean(rewards[:n]):.3f} -> last {n} batches "
          f"{np.mean(rewards[-n:]):.3f}")
    print(f"groups accepted: {report['accepted']} ({report['trained_groups']} trained in "
          f"{report['steps']} batches, {report['backlog']} in the backlog for the next "
          f"one); lost: {report['lost']}; trained twice: {report['twice']}")
    killed = report["killed"]
    print(f"generation actor {killed['worker']} (pid {killed['pid']}) SIGKILLed after batch "
          f"{killed['step']} holding {len(killed['held'])} leases: retired, its groups "
          f"returned to the queue, {report['held_done']} of them accepted since")
    print(f"job SIGKILLed after {report['killed_after']} trained batches; resumed by salvage "
          f"of checkpoint {k}: {report['restored']} groups restored, not generated; "
          f"batches {report['replayed']} replayed identical; "
          f"regenerated-after-resume: {report['regenerated']}")
    print(f"generate calls: {report['calls_before']} before the kill, "
          f"{report['calls_after']} after; {report['continued']} continued a partial group "
          "(paused for a weight update, persisted, resumed)")
    print("staleness of trained samples (batch - oldest generating version): "
          + ", ".join(f"{a}: {b}" for a, b in report["staleness"].items()))
    disk = report["disk"]
    print(f"on disk: {disk['pack_files']} pack files, {disk['bytes']:,} bytes; weights "
          f"version {report['version']} recorded in the queue")
    print(f"where everything lives: pool {root}{' (removed)' if removed else ''}")
    print(f"  queues (journal, commit log, batches): {', '.join(report['queue_dirs'])}")
    print(f"  packs (prompts, groups, shards, weights): {os.path.join(root, 'runs', RUN)}")
    print(f"  checkpoints: {report['checkpoints']} (the resumed run's branch: "
          f"{report['branch']})")
    print(f"  process logs: {report['logdir']}")
    print(f"({report['wall']:.1f} s, of which {report['ray_started']:.1f} s starting Ray)")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--job"]:
        return job_main(args[2], args[3], int(args[1]), args[4], Settings.from_args(args[5:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", help="pool directory (default: a fresh temp directory)")
    p.add_argument("--keep", action="store_true", help="keep the temp pool afterwards")
    p.add_argument("--quick", action="store_true", help="a smaller job (the tests')")
    opts = p.parse_args(args)
    s = Settings.quick() if opts.quick else Settings()
    root = opts.root or tempfile.mkdtemp(prefix="straw-demo-")
    removed = not opts.root and not opts.keep
    try:
        report = run(os.path.abspath(root), s)
    finally:
        if removed:
            shutil.rmtree(root, ignore_errors=True)
    show(root, report, s, removed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
