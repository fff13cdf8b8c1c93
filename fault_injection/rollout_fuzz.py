"""``just fuzz`` rollout scenario: a rollout job's processes under SIGKILL.

Role: verification layer 7 of DESIGN.md for ``straw.rollout`` (RL1, RL2, RL4, RL5).

Processes (each ``python -m fault_injection.rollout_fuzz --role ...``):

* the **controller**: a ``RolloutController`` (``recover=True`` after its first start)
  served with ``straw.rollout.remote``; it writes its URL to ``controller.url``;
* **generation** processes: a ``GenerationClient`` over ``RemoteController``, each with its
  own store; a toy generator extends every sample a token or two per step, now and then
  saves its progress or returns the group partial, and completes ready groups;
* a **trainer**: a ``BatchBuilder`` over the served coordinator
  (``straw.rpc.RemoteCoordinator``): ``next_batch`` (rollout id = batches finished so
  far, so a restart replays the batch it had not finished), "trains" (a sleep, after
  loading its shard), ``finish_batch``.

A seeded supervisor SIGKILLs one of them at random and restarts it; a client whose
controller went away builds a new client; a restarted trainer takes the consumer over
from its dead predecessor (``takeover=True``: the old token is fenced).  Every process
logs to its own fsynced acknowledgement log, always AFTER the call it acknowledges
returned:

* generation: ``take`` (task, lease generation, the progress it resumes from),
  ``persist`` (a partial group durable as the task's input: its progress), ``complete``
  (the receipt's commit id);
* trainer: ``training`` (batch id and the tasks of its shard) before ``finish_batch``,
  ``finished`` after it returned.

The checker (after every process stopped) proves from the logs and the final queue:
RL1, the prompt tasks are groups 0..G-1 (G from the committed cursor), each dataset index
at most once per epoch and every finished epoch complete; RL2, a prompt task is committed
at most once and every logged completion is in the commit log; no accepted group lost,
each committed prompt is trained in a finished batch, in the builder's backlog or in the
one collection a restarted trainer replays; no group trained twice; RL4, every batch the
builder finished was logged as training; RL5, a take of generation g resumes at least at
the progress persisted under any earlier generation.  The negative control
``rollout-restart-partial`` (generation clients restart every group from its prompt) and
``rollout-trainer-skips-replay`` (a restarted trainer abandons the batch it had not
finished) must be reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fault_injection.procs import REPO, AckLines, Proc, read_ack_lines, stop_all
from straw import (
    Coordinator,
    IndeterminateCommit,
    LeaseExpired,
    SharedFilesystemStore,
    StaleAttempt,
    StrawError,
    UnsafeRecovery,
)
from straw.protocol import CommitReceipt, TaskSpec
from straw.rollout.builder import read_stored_state
from straw.rpc import RemoteCoordinator

RUN = "rollout-fuzz"
QUEUE = "rollout"
TOKEN = "rollout-fuzz-token"  # the generation clients' (the controller's calls only)
TRAINER_TOKEN = "rollout-fuzz-trainer-token"  # the trainer's (the consumer calls)
N_PROMPTS = 12
N_SAMPLES = 2
TARGET = 6  # response tokens per sample of a ready group
BATCH = 4  # groups per training batch
LEASE_SECONDS = 3.0
# negative controls: generation clients that restart partial groups from the prompt (RL5);
# a trainer that, restarted, goes on to a new rollout id instead of replaying the batch it
# had not finished (its groups are lost)
CONTROLS = ("rollout-restart-partial", "rollout-trainer-skips-replay")
# what a process meets while the controller restarts: it builds its clients again
_GONE = (ConnectionError, StaleAttempt, LeaseExpired, UnsafeRecovery, IndeterminateCommit)


def _stop(_sig: int, _frame: object) -> None:
    raise SystemExit(0)


def _config() -> Any:
    from straw.rollout import RolloutConfig
    return RolloutConfig(n_samples_per_prompt=N_SAMPLES, lease_seconds=LEASE_SECONDS)


def _prompts() -> list[tuple[int, ...]]:
    return [tuple(range(i, i + 3)) for i in range(N_PROMPTS)]


def _url(logdir: str, timeout: float = 60) -> str:
    """The serving controller's URL (waits for a controller to serve)."""
    path = os.path.join(logdir, "controller.url")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path) as f:
                return f.read().strip()
        except FileNotFoundError:
            time.sleep(0.1)
    raise TimeoutError("no controller served within 60 s")


# --- the controller ---------------------------------------------------------------------
def controller_main(root: str, logdir: str, gen: int) -> int:
    from straw.rollout import RolloutController
    from straw.rollout.remote import start
    signal.signal(signal.SIGTERM, _stop)
    store = SharedFilesystemStore(root, RUN, writer_id=f"controller-{gen}")
    ctl = RolloutController(store, _prompts(), config=_config(), queue_id=QUEUE,
                            recover=gen > 0, shuffle=True, seed=11,
                            exclusive_owner="the rollout fuzz's one controller process")
    server = start(ctl, ("127.0.0.1", 0), token=TOKEN, trainer_token=TRAINER_TOKEN)
    tmp = os.path.join(logdir, f"controller.url.{gen}")
    with open(tmp, "w") as f:
        f.write(server.url)
    os.replace(tmp, os.path.join(logdir, "controller.url"))
    try:
        while True:
            time.sleep(1)
    finally:
        server.close()
        ctl.close()
        store.close()


# --- generation -------------------------------------------------------------------------
def _token(prompt: Sequence[int], j: int) -> int:
    """The toy generator's j-th response token of a prompt (deterministic: checkable)."""
    return 1000 + 7 * int(prompt[0]) + j


def _progress(group: Any) -> int:
    return sum(s.response_length for s in group)


def _step(group: Any, r: random.Random) -> Any:
    from straw.rollout import Status
    samples = []
    for s in group:
        n = min(TARGET, s.response_length + r.randint(1, 2))
        tokens = tuple(s.tokens) or tuple(s.prompt)
        tokens += tuple(_token(s.prompt, j) for j in range(s.response_length, n))
        done = n >= TARGET
        samples.append(replace(s, tokens=tokens, response_length=n,
                               status=Status.COMPLETED if done else Status.PENDING,
                               reward=float(s.group_index or 0) if done else None))
    return replace(group, samples=tuple(samples))


def _check_content(group: Any) -> str | None:
    for s in group:
        want = tuple(s.prompt) + tuple(_token(s.prompt, j) for j in range(s.response_length))
        if s.response_length and tuple(s.tokens) != want:
            return f"group {s.group_index} sample {s.index} holds tokens {s.tokens}"
    return None


def generation_main(root: str, logdir: str, name: str, gen: int, seed: int,
                    control: str | None) -> int:
    from straw.rollout import GenerationClient
    from straw.rollout.remote import RemoteController
    from straw.rollout.scheduling import restart_from_prompt
    signal.signal(signal.SIGTERM, _stop)
    r = random.Random(f"{seed}:{name}:{gen}")
    log = AckLines(os.path.join(logdir, f"{name}.acks"))
    store = SharedFilesystemStore(root, RUN, writer_id=f"{name}-{gen}")
    while True:
        client = GenerationClient(RemoteController(_url(logdir), token=TOKEN), store,
                                  worker_id=f"{name}-{gen}", config=_config())
        try:
            _generate(client, log, r, logdir, name, control, restart_from_prompt)
        except _GONE:
            time.sleep(0.3)  # the controller restarted: a new client, new leases
        finally:
            try:
                client.close()
            except (StrawError, ConnectionError, OSError):
                pass


def _generate(client: Any, log: AckLines, r: random.Random, logdir: str, name: str,
              control: str | None, restart: Any) -> None:
    while True:
        groups = client.take(r.randint(1, 3))
        if not groups:
            time.sleep(0.2)
            continue
        gens = {t: le.generation for t, le in client.leases.items()}
        work = []
        for g in groups:
            tid = f"prompt:{g.group_index}"
            bad = _check_content(g)
            if bad:
                report(logdir, name, f"took {tid} with a wrong content: {bad}")
            if control == "rollout-restart-partial":
                g = restart(g)  # the planted bug: partial work thrown away
            log.write(ev="take", task=tid, gen=gens[tid], progress=_progress(g))
            work.append(g)
        while work:
            time.sleep(r.uniform(0.02, 0.1))
            work = [_step(g, r) for g in work]
            ready = [g for g in work if all(s.response_length >= TARGET for s in g)]
            rest = [g for g in work if g not in ready]
            if ready:
                for g, out in zip(ready, client.return_groups(ready), strict=True):
                    tid = f"prompt:{g.group_index}"
                    log.write(ev="complete", task=tid, gen=gens[tid],
                              commit_id=out.receipt.commit_id)
            if rest and r.random() < 0.3:
                client.save_progress(rest)
                for g in rest:
                    tid = f"prompt:{g.group_index}"
                    log.write(ev="persist", task=tid, gen=gens[tid],
                              progress=_progress(g))
            if rest and r.random() < 0.15:
                client.return_groups(rest)  # partial groups back to the queue
                for g in rest:
                    tid = f"prompt:{g.group_index}"
                    log.write(ev="persist", task=tid, gen=gens[tid],
                              progress=_progress(g))
                rest = []
            work = rest


def report(logdir: str, who: str, message: str) -> None:
    AckLines(os.path.join(logdir, "violations")).write(who=who, message=message)


# --- the trainer ------------------------------------------------------------------------
def trainer_main(root: str, logdir: str, gen: int, seed: int, control: str | None) -> int:
    from straw.rollout import BatchBuilder, EnvironmentMix
    signal.signal(signal.SIGTERM, _stop)
    r = random.Random(f"{seed}:trainer:{gen}")
    log = AckLines(os.path.join(logdir, "trainer.acks"))
    store = SharedFilesystemStore(root, RUN, writer_id=f"trainer-{gen}")
    while True:
        queue = RemoteCoordinator(_url(logdir), token=TRAINER_TOKEN, timeout=30, retries=2,
                                  retry_wait=0.1)  # a restarted controller: a new URL
        try:
            # the supervisor runs one trainer: a restarted one succeeds a dead one, whose
            # consumer the controller still holds open (fenced here), unless the
            # controller restarted since
            builder = BatchBuilder(queue, store, EnvironmentMix.single(BATCH), dp_size=1,
                                   config=_config(), takeover=True)
            while True:
                rollout: int | str = builder.state()["finished_count"]
                if control == "rollout-trainer-skips-replay":
                    rollout = f"{gen}.{rollout}"  # the planted bug: a fresh id per process
                refs = builder.next_batch(rollout)
                if refs is None:
                    time.sleep(0.2)
                    continue
                shard = refs[0].load(store, rank=0)
                tasks = sorted({f"prompt:{s['group_index']}" for s in shard.samples})
                for s in shard.samples:  # what trains is what the generator made
                    tokens = [int(t) for t in s["tokens"]]
                    if s["response_length"] != TARGET or tokens[-TARGET:] != [
                            _token(tokens, j) for j in range(TARGET)]:
                        report(logdir, "trainer", f"batch {refs[0].batch_id} trains sample "
                                f"{s['group_index']}/{s['index']} with tokens {tokens}")
                log.write(ev="training", batch=refs[0].batch_id, rollout=rollout, tasks=tasks)
                time.sleep(r.uniform(0.2, 0.6))  # "training"
                builder.finish_batch(refs[0].batch_id)
                log.write(ev="finished", batch=refs[0].batch_id)
        except _GONE:
            time.sleep(0.3)


# --- the supervisor and the checker -----------------------------------------------------
@dataclass
class RolloutSummary:
    target: str
    seed: int
    seconds: float
    kills: dict[str, int] = field(default_factory=dict)
    tasks: int = 0
    completed: int = 0
    batches: int = 0
    resumed: int = 0  # takes that resumed partial work
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        kills = ", ".join(f"{n} {k}" for k, n in sorted(self.kills.items()))
        return (f"fuzz [rollout/{self.target}] seed={self.seed} {self.seconds:.0f}s: kills "
                f"({kills}); {self.tasks} prompt groups admitted, {self.completed} accepted, "
                f"{self.batches} batches trained, {self.resumed} takes resumed partial "
                f"work; {len(self.violations)} violations")


def _argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fault_injection.rollout_fuzz", "--role", role, *args]


def run_rollout(base: str, *, seconds: float, n_generators: int = 3, seed: int = 0,
                shared: tuple[str, str] | None = None, target: str = "local",
                control: str | None = None) -> RolloutSummary:
    """One run (module docstring).  ``shared``: two JuiceFS clients of one volume (the
    controller and trainer use the first, generation processes alternate), else ``base``."""
    mounts = shared or (base, base)
    roots = [os.path.join(m, "pool") for m in mounts]
    logdir = os.path.join(base, "logs")
    os.makedirs(logdir, exist_ok=True)
    out = RolloutSummary(target, seed, seconds)
    r = random.Random(seed)
    gens = {"controller": 0, "trainer": 0}
    ctl_args = lambda: _argv("controller", roots[0], logdir, "--gen", str(gens["controller"]))  # noqa: E731
    procs = {"controller": Proc("controller", ctl_args(), logdir)}
    _url(logdir)  # the queue exists before anyone else opens it
    names = [f"gen{i}" for i in range(n_generators)]
    for i, n in enumerate(names):
        gens[n] = 0
        procs[n] = Proc(n, _argv("generation", roots[i % 2], logdir, "--name", n,
                                  "--gen", "0", "--seed", str(seed),
                                  *(("--control", control) if control else ())), logdir)
    procs["trainer"] = Proc("trainer", _argv("trainer", roots[0], logdir, "--gen", "0",
                                              "--seed", str(seed),
                                              *(("--control", control) if control else ())),
                             logdir)
    # warm-up: the kills start once the job trained a batch (process start-up is slow on a
    # busy machine; a run of a few seconds must still make progress), at most 60 s
    warm = time.monotonic() + 60
    while time.monotonic() < warm and not any(
            e["ev"] == "finished" for e in read_ack_lines(os.path.join(logdir, "trainer.acks"))):
        time.sleep(0.2)
    end = time.monotonic() + seconds
    # every role is killed once first (in a seeded order), then at random
    first = ["controller", "trainer", *names]
    r.shuffle(first)
    try:
        while time.monotonic() < end:
            time.sleep(r.uniform(0.8, 2.0))
            for n, q in procs.items():  # no process ends but by our signals
                assert q.p is not None
                if q.p.poll() is not None:
                    out.violations.append(f"{n} ended by itself (rc={q.p.returncode}):\n"
                                          f"{q.tail()}")
                    q.start()
            victim = first.pop() if first else r.choice(
                ["controller", "trainer", *names, *names])
            if victim == "trainer" and (control == "rollout-trainer-skips-replay"
                                        or r.random() < 0.5):
                # half the trainer's kills (all of them for the control, whose bug shows
                # only then) while it trains: a collected batch is not finished
                _await_training(os.path.join(logdir, "trainer.acks"), end)
            p = procs[victim]
            assert p.p is not None
            p.p.kill()
            p.p.wait()
            out.kills[victim] = out.kills.get(victim, 0) + 1
            gens[victim] += 1
            if victim == "controller":
                with contextlib.suppress(FileNotFoundError):  # killed before it served
                    os.unlink(os.path.join(logdir, "controller.url"))
                p.argv = ctl_args()
            else:
                p.argv[p.argv.index("--gen") + 1] = str(gens[victim])
            p.start()
    finally:
        # clients first: a controller stopped first would leave them retrying
        stopping = [procs[n] for n in [*names, "trainer", "controller"]]
        out.violations += stop_all(stopping)
    out.violations += check(roots[0], logdir, names, out)
    return out


def _await_training(path: str, end: float) -> None:
    """Wait (until ``end`` at most) for the trainer's log to end with a ``training``
    entry: it is training on a batch it has not finished."""
    while time.monotonic() < end:
        log = read_ack_lines(path)
        if log and log[-1]["ev"] == "training":
            return
        time.sleep(0.05)


def check(root: str, logdir: str, names: Sequence[str], s: RolloutSummary) -> list[str]:
    out: list[str] = []
    vpath = os.path.join(logdir, "violations")
    out += [f"{e['who']}: {e['message']}" for e in read_ack_lines(vpath)]
    store = SharedFilesystemStore(root, RUN, writer_id="checker")
    coord = Coordinator(store, queue_id=QUEUE, namespace=True, recover=True)
    try:
        admitted = _check_admitted(coord, store, s)
        if admitted is None:
            return [*out, "the job admitted no prompt group"]
        out += admitted
        # the commit log: accepted groups and collections
        commits = _all_commits(coord)
        prompt_commits = {c.position: c for c in commits if c.task_id.startswith("prompt:")}
        s.completed = len(prompt_commits)
        gen_logs = {n: read_ack_lines(os.path.join(logdir, f"{n}.acks")) for n in names}
        out += _check_accepted(commits, prompt_commits, gen_logs)
        out += _check_batches(coord, store, logdir, commits, prompt_commits, s)
        out += _check_resumes(gen_logs, s)
    finally:
        coord.close()
        store.close()
    return out


def _check_admitted(coord: Coordinator, store: SharedFilesystemStore,
                    s: RolloutSummary) -> list[str] | None:
    """RL1: the admitted prompt groups are 0..G-1, each dataset index once per epoch
    (None: no group admitted)."""
    from straw.rollout import codec, data_source
    out: list[str] = []
    cursor = data_source.cursor_from_producer_state(coord.producer_state("dataset"))
    if cursor is None:
        return None
    count = cursor.sample_group_index
    s.tasks = count
    seen: dict[int, list[int]] = {}
    for gid in range(count + 20):
        status = coord.task_status(f"prompt:{gid}")
        if (status is None) != (gid >= count):
            out.append(f"RL1: task prompt:{gid} {'missing' if status is None else 'exists'}"
                       f" with the cursor at group {count}")
            continue
        if status is None:
            continue
        ref = TaskSpec.from_dict(status["spec"]).input_ref
        assert ref is not None
        g = codec.group_from_records(list(store.read(ref)))
        seen.setdefault(g.metadata["epoch_id"], []).append(g.metadata["dataset_index"])
    for epoch, idx in sorted(seen.items()):
        if len(set(idx)) != len(idx):
            out.append(f"RL1: epoch {epoch} admitted a dataset index twice: {sorted(idx)}")
        if epoch < cursor.epoch_id and sorted(idx) != list(range(N_PROMPTS)):
            out.append(f"RL1: finished epoch {epoch} lost dataset indices: {sorted(idx)}")
    return out


def _all_commits(coord: Coordinator) -> list[CommitReceipt]:
    commits: list[CommitReceipt] = []
    pos = 0
    while True:
        page = coord.read_commits(pos, 256)
        commits += page.commits
        if page.cursor == pos:
            break
        pos = page.cursor
    return commits


def _check_accepted(commits: list[CommitReceipt], prompt_commits: dict[int, CommitReceipt],
                    gen_logs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """RL2: each group accepted once, and every acknowledged completion in the log."""
    by_task: dict[str, list[int]] = {}
    for c in prompt_commits.values():
        by_task.setdefault(c.task_id, []).append(c.position)
    out = [f"RL2: {t} accepted twice (positions {p})" for t, p in by_task.items()
           if len(p) > 1]
    commit_ids = {c.commit_id for c in commits}
    for n, entries in gen_logs.items():
        for e in entries:
            if e["ev"] == "complete" and e["commit_id"] not in commit_ids:
                out.append(f"RL2: {n}'s acknowledged completion of {e['task']} "
                           f"({e['commit_id']}) is not in the commit log")
    return out


def _builder_state(coord: Coordinator,
                   store: SharedFilesystemStore) -> tuple[Any, dict[str, Any], set[str]]:
    """The builder's final view, state, and the batches its progress lists finished."""
    view = coord.load_consumer_state(coord.consumer_id)
    state: dict[str, Any] = {"backlog": [], "scan_cursor": 0} if view is None else \
        read_stored_state(json.loads(bytes(list(store.read(_ref(view["state_ref"])))[0]
                                           .payload)))
    progress: dict[str, Any] = {"finished_batches": []} \
        if view is None or not view.get("progress_ref") else json.loads(
        bytes(list(store.read(_ref(view["progress_ref"])))[0].payload))
    return view, state, set(progress["finished_batches"])


def _check_batches(coord: Coordinator, store: SharedFilesystemStore, logdir: str,
                   commits: list[CommitReceipt], prompt_commits: dict[int, CommitReceipt],
                   s: RolloutSummary) -> list[str]:
    """RL4 and no loss: every finished batch trained once with what its collection holds,
    every accepted group trained, in the backlog or in the batch to replay."""
    out: list[str] = []
    batches: dict[str, set[int]] = {}  # batch id -> positions of its groups
    by_rollout: dict[str, str] = {}
    for c in commits:
        if c.task_id.startswith("collection:"):
            body = json.loads(bytes(list(store.read(c.result_ref))[0].payload))
            batches["batch:" + c.commit_id] = {int(e["position"]) for e in body["groups"]}
            by_rollout[c.task_id[len("collection:"):]] = "batch:" + c.commit_id
    view, state, finished = _builder_state(coord, store)
    if view is not None and state.get("finished_count") != len(finished):
        out.append(f"the builder state counts {state.get('finished_count')} finished "
                   f"batches, its progress lists {len(finished)}")
    # the backlog: what the builder saved, and what it has not scanned yet
    backlog = {int(e["position"]) for e in state["backlog"]}
    backlog |= {p for p in prompt_commits if p >= int(state["scan_cursor"])}
    tlog = read_ack_lines(os.path.join(logdir, "trainer.acks"))
    training = {e["batch"]: e for e in tlog if e["ev"] == "training"}
    logged_done = {e["batch"] for e in tlog if e["ev"] == "finished"}
    out += [f"RL4: batch {b} finished by the builder but never logged as training"
            for b in sorted(finished - set(training))]
    out += [f"batch {b} logged finished but the builder did not finish it"
            for b in sorted(logged_done - finished)]
    trained = {b for b in training if b in finished}
    s.batches = len(trained)
    # the one batch a restarted trainer would replay (collected, not finished)
    pending = by_rollout.get(str(len(finished)))
    where: dict[int, list[str]] = {}
    for b in trained:
        want = sorted(prompt_commits[p].task_id for p in batches.get(b, ()))
        if sorted(training[b]["tasks"]) != want:
            out.append(f"batch {b} trained tasks {training[b]['tasks']}, its collection "
                       f"holds {want}")
        for p in batches.get(b, ()):
            where.setdefault(p, []).append(b)
    out += [f"group at position {p} ({prompt_commits[p].task_id}) trained twice: {bs}"
            for p, bs in where.items() if len(bs) > 1]
    extra = [b for b in by_rollout.values() if b not in finished and b != pending]
    out += [f"collection of {b} is neither finished nor the next to replay"
            for b in extra]
    for p, c in sorted(prompt_commits.items()):
        if p not in where and p not in backlog and \
                (pending is None or p not in batches[pending]):
            out.append(f"accepted group {c.task_id} (position {p}) lost: not trained, "
                       "not in the backlog, not in the pending batch")
    return out


def _check_resumes(gen_logs: dict[str, list[dict[str, Any]]], s: RolloutSummary) -> list[str]:
    """RL5: a take resumes at least where any earlier attempt's persisted work got."""
    out: list[str] = []
    persisted: dict[str, list[tuple[int, int]]] = {}
    for entries in gen_logs.values():
        for e in entries:
            if e["ev"] == "persist":
                persisted.setdefault(e["task"], []).append((e["gen"], e["progress"]))
    for n, entries in gen_logs.items():
        for e in entries:
            if e["ev"] != "take":
                continue
            before = [pr for g, pr in persisted.get(e["task"], ()) if g < e["gen"]]
            if before and e["progress"] < max(before):
                out.append(f"RL5: {n} took {e['task']} (attempt {e['gen']}) at progress "
                           f"{e['progress']}, an earlier attempt persisted {max(before)}")
            elif e["progress"] > 0:
                s.resumed += 1
    return out


def _ref(value: Mapping[str, Any]) -> Any:
    from straw.refs import RecordSetRef
    return RecordSetRef.from_dict(value)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fault_injection.rollout_fuzz")
    ap.add_argument("--role", choices=("controller", "generation", "trainer"))
    ap.add_argument("root", nargs="?")
    ap.add_argument("logdir", nargs="?")
    ap.add_argument("--gen", type=int, default=0)
    ap.add_argument("--name", default="gen0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--control", choices=CONTROLS, default=None)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.role == "controller":
        return controller_main(args.root, args.logdir, args.gen)
    if args.role == "generation":
        return generation_main(args.root, args.logdir, args.name, args.gen, args.seed,
                               args.control)
    if args.role == "trainer":
        return trainer_main(args.root, args.logdir, args.gen, args.seed, args.control)
    import tempfile
    s = run_rollout(args.dir or tempfile.mkdtemp(prefix="straw-rollout-fuzz-"),
                    seconds=args.seconds, seed=args.seed, control=args.control)
    print(s.line())
    for v in s.violations[:20]:
        print("VIOLATION " + v)
    return 1 if s.violations else 0


if __name__ == "__main__":
    sys.exit(main())
