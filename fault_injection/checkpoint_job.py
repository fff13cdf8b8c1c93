"""The checkpoint campaign's job (``fault_injection.checkpoint_campaign``): a small
rollout job on SimFS (a controller, a builder, a generation worker completing groups,
one at a time so that every run makes the same ops), its save thread run serially in one
of two deterministic schedules (``schedule``), and what a started job holds, compared
across crashes: its content (``content``), the source queue's logical state
(``source_view``) and files (``source_files``)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import types
from collections.abc import Callable, Iterator
from typing import Any

from fault_injection.rules import SimulatedCrash
from fault_injection.simfs import SimFS
from straw import Coordinator, SharedFilesystemStore
from straw.clock import ManualClock
from straw.refs import RecordSetRef
from straw.rollout import EnvironmentMix, RolloutConfig, Status
from straw.rollout import checkpoint as checkpoint_mod
from straw.rollout.builder import Accepted, lazy_group
from straw.rollout.checkpoint_files import read_json, rollout_file
from straw.rollout.data_source import PRODUCER_ID, PROMPT_PREFIX
from straw.rollout.generation import GenerationClient
from straw.rollout.resolve import Resolution, resolve_checkpoint
from straw.rollout.restore import RolloutJob, open_job

ROOT = "/pool"
RUN = "job"
SAVE = "/save"
PROMPTS = [(i, i + 1, i + 2) for i in range(64)]
BATCH = 2  # groups per batch
CONFIG = RolloutConfig(n_samples_per_prompt=2, lease_seconds=60, min_refill=4, max_refill=4)


# --- the job --------------------------------------------------------------------------------

def sim_store(sim: SimFS, clock: ManualClock, writer: str) -> SharedFilesystemStore:
    return SharedFilesystemStore(ROOT, RUN, writer_id=writer, fs=sim, clock=clock,
                                 reserve_bytes=16 * 1024, segment_target_bytes=1 << 20,
                                 visibility_retries=2, visibility_backoff=0.0)


def save_model(sim: SimFS) -> Callable[[str], dict[str, Any]]:
    """The user's model save: it writes through SimFS WITHOUT syncing, so the
    checkpoint's own fsyncs must make the model durable before the marker (RL9)."""
    def save(model_dir: str) -> dict[str, Any]:
        fd = sim.open(model_dir + "/weights.bin", write=True, create=True)
        try:
            sim.writev(fd, [b"w" * 3000], 0)
        finally:
            sim.close(fd)
        return {"files": ["weights.bin"], "optimizer": True, "rng": True}
    return save


def start(sim: SimFS, clock: ManualClock, resolution: Resolution | None = None
          ) -> tuple[SharedFilesystemStore, RolloutJob]:
    """A job started from ``resolution`` (default: the automatic one)."""
    r = resolution if resolution is not None else resolve_checkpoint(SAVE, fs=sim)
    store = sim_store(sim, clock, "manager")
    try:
        job = open_job(r, store, PROMPTS, EnvironmentMix.single(BATCH), dp_size=1,
                       config=CONFIG, fs=sim, clock=clock)
    except BaseException:
        with contextlib.suppress(Exception, SimulatedCrash):
            store.close()
        raise
    return store, job


def accept_two(sim: SimFS, clock: ManualClock, job: RolloutJob, tag: str) -> None:
    """Two groups taken and completed by a generation worker (another writer), one at a
    time and without a heartbeat thread: their commit order, and so every op of the run,
    is the same in every run (a crash point names the same op in each)."""
    gen = sim_store(sim, clock, f"gen-{tag}")
    client = GenerationClient(job.controller, gen, worker_id=f"gen-{tag}", config=CONFIG,
                              clock=clock, heartbeat=False)
    for g in client.take(2):
        client.return_groups([dataclasses.replace(g, samples=tuple(dataclasses.replace(
            s, tokens=s.tokens + (7, 8 + (s.index or 0)), response_length=2,
            status=Status.COMPLETED, reward=float((s.index or 0) % 3)) for s in g.samples))])
    client.close()
    gen.close()


def run_prefix(sim: SimFS, clock: ManualClock) -> tuple[SharedFilesystemStore, RolloutJob]:
    """A new run: two groups accepted, batch 0 trained, step 0 saved, two more accepted."""
    store, job = start(sim, clock)
    accept_two(sim, clock, job, "a")
    refs = job.builder.next_batch(0)
    assert refs is not None
    job.builder.finish_batch(refs[0].batch_id)
    job.save(0, save_model(sim))
    accept_two(sim, clock, job, "b")
    return store, job


def close_job(store: SharedFilesystemStore, job: RolloutJob) -> None:
    try:
        job.close()
    finally:
        store.close()


# --- deterministic schedules (the save's thread) ----------------------------------------------

class _Future:
    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args, self.done, self.value = fn, args, False, None

    def result(self) -> Any:
        if not self.done:
            self.done = True
            self.value = self.fn(*self.args)
        return self.value


def _serial_executor(eager: bool) -> type:
    class Serial:
        """A one-thread executor run in the caller's thread: ``eager`` at ``submit``,
        else at ``result`` (the two extreme interleavings of the save's thread)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def submit(self, fn: Callable[..., Any], *args: Any) -> _Future:
            f = _Future(fn, args)
            if eager:
                f.result()
            return f

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            return None
    return Serial


@contextlib.contextmanager
def schedule(name: str) -> Iterator[None]:
    """Run the checkpoint module's thread pool serially (``eager`` or ``lazy``)."""
    fake = types.SimpleNamespace(futures=types.SimpleNamespace(
        ThreadPoolExecutor=_serial_executor(name == "eager")))
    saved = checkpoint_mod.concurrent  # type: ignore[attr-defined]
    checkpoint_mod.concurrent = fake  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        checkpoint_mod.concurrent = saved  # type: ignore[attr-defined]


# --- what a started job holds -----------------------------------------------------------------

def payload(store: SharedFilesystemStore, ref: RecordSetRef) -> str:
    """The digest of what ``ref``'s records hold, read back (not where they are: a
    control that reorders writes moves them)."""
    h = hashlib.sha256()
    for r in store.read(ref):
        h.update(json.dumps([r.record_id, r.codec, dict(r.metadata)], sort_keys=True).encode())
        h.update(bytes(r.payload))
    return h.hexdigest()


def content(store: SharedFilesystemStore, job: RolloutJob) -> dict[str, Any]:
    """The started job's queue content, independent of ids the start chose (its nonce):
    the backlog in selection order with each group's payload read back, the mix state,
    the pending prompt tasks and the dataset cursor."""
    st = job.builder.state()
    backlog = []
    for e in st["backlog"]:
        a = Accepted.from_dict(e)
        g = lazy_group(store, a.ref)
        backlog.append([a.commit_id, a.environment, a.key, list(a.tokens),
                        [[list(s.tokens), s.reward, s.group_index, s.index]
                         for s in g.samples]])
    coord = job.controller.coordinator
    tasks = sorted([t.task_id, None if t.input_ref is None else payload(store, t.input_ref)]
                   for t in coord.pending_tasks(task_prefix=PROMPT_PREFIX))
    return {"backlog": backlog, "mix": st["mix"], "tasks": tasks,
            "producer": coord.producer_state(PRODUCER_ID)}


def without_ids(c: dict[str, Any]) -> dict[str, Any]:
    """``c`` without the commit ids of its groups (a rerun of a whole job draws new ones;
    the group's payload still says which prompt and samples it holds)."""
    return {**c, "backlog": [e[1:] for e in c["backlog"]]}


def started_content(sim: SimFS, resolution: Resolution | None = None) -> dict[str, Any]:
    """Start a job (automatic resolution unless given), take its content, close it."""
    clock = ManualClock()
    store, job = start(sim, clock, resolution)
    try:
        return content(store, job)
    finally:
        close_job(store, job)


def source_queue(sim: SimFS) -> dict[str, str]:
    """The source run's queue (the one ``SAVE``'s step 0 names)."""
    marker = read_json(sim, rollout_file(SAVE, "committed", 0), "marker")
    return dict(marker["queue"])


def source_view(sim: SimFS, queue: dict[str, str]) -> dict[str, Any]:
    """The source queue's logical state, read by recovering it (a dead run's queue: what
    its own restart would do; nothing of what the view holds changes)."""
    store = sim_store(sim, ManualClock(), "checker")
    try:
        coord = Coordinator(store, queue_id=queue["queue_id"], namespace=queue["namespace"],
                            recover=True, clock=ManualClock())
        try:
            commits = [[r.task_id, r.commit_id, r.position, r.result_ref.to_dict()]
                       for r in checkpoint_mod.commits_between(coord, 0, None)]
            tasks = sorted(t.task_id for t in coord.pending_tasks())
            return {"commits": commits, "tasks": tasks,
                    "producer": coord.producer_state(PRODUCER_ID),
                    "checkpoints": sorted(coord.checkpoints)}
        finally:
            coord.close()
    finally:
        store.close()


def source_files(sim: SimFS, queue: dict[str, str]) -> dict[str, bytes]:
    """The files an exact restore must leave byte for byte: the source queue's and the
    checkpoints' (markers, state files, models)."""
    qdir = f"{ROOT}/runs/{RUN}/queues/{queue['namespace']}/{queue['queue_id']}/"
    keep = (qdir, f"{SAVE}/iter_", f"{SAVE}/rollout/committed_",
            f"{SAVE}/rollout/queue_state_", f"{SAVE}/rollout/builder_state_")
    return {p: d for p, d in sim.files().items() if p.startswith(keep)}
