"""The distributed pipeline with payloads in Ray's object store versus in straw (issue 17,
"Performance"): ``just bench-pipeline`` (``python -m bench.pipeline_bench [--batches 12]``).

Both sides run the same toy pipeline on one local Ray cluster (``ray.cluster_utils``): a
head node (the driver, which "trains": it touches every token of each batch) and two
generation nodes, one generation actor each, the same trivial generate function
(``fill``: ``--tokens`` response tokens per sample, no model), ``--samples`` samples per
prompt, ``--concurrency`` samples generated at once, batches of ``--batch-groups`` groups.

* **object store** (what users run without straw): each actor's generate call returns the
  group as a Ray object; the driver keeps ``concurrency`` calls in flight, buffers the
  groups it gets and trains on every ``batch_groups`` of them.
* **straw**: ``straw.rollout.ray.RayRollout`` on a pool in a temp directory: the groups
  are published in the pool by the generation actors, Ray carries references; the driver
  takes ``next_batch``, loads its shard from the pool, trains, and acknowledges the batch
  in its next ``next_batch`` call (``finish=``; ``finish_batch`` after the last).  Prompts
  are admitted a batch at a time (``--refill``, default ``--batch-groups``: one queue
  transaction per batch of prompts) and generation runs at most ``--ahead`` batches of
  accepted groups ahead of training (``max_ahead_groups``), as the object store's driver
  holds only what it keeps in flight: unbounded, generation outruns training and its
  surplus spends the CPU the batches need.

Throughput is groups trained per second after the first batch (start-up excluded),
the two sides alternated ``--rounds`` times in one run; the ratio is straw's median over
the object store's (target >= 0.8).  On a loaded machine throughput follows the load; the
CPU seconds per batch of the whole cluster (every process of the local cluster: driver,
raylets, actors; from ``/proc``, Linux) do much less, so they are reported too, per side,
with their ratio (how much more CPU straw spends on a batch).
The same readings split by process give CPU ms per group of each part: the
``driver``, straw's ``controller`` actor (coordinator, data source, batch builder), the
``generation`` actors of either side, and ``ray`` (raylets, GCS, idle workers, agents),
from the title Ray gives each actor's process: where each side's CPU goes.

The kill: each side is stopped abruptly (every actor and the driver's state gone, as when
the job's driver process is SIGKILLed) once the next batch is half full, then started
again.  The object store's buffered groups were only in memory: they are lost and
generated again.  straw's accepted groups are in the pool: the restarted job
(``recover=True``) finds them in its builder's backlog and trains them, none generated
again.  Both counts are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from straw import SharedFilesystemStore
from straw.rollout import RolloutConfig, Sample, SampleGroup, Status
from straw.rollout.generate import extend_sample
from straw.rollout.ray import NodeSpec, RayRollout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Fill:
    """The trivial generate function: ``tokens`` response tokens per sample at once."""

    tokens: int = 256

    async def __call__(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup:
        g = group.group_index or 0
        return dataclasses.replace(group, samples=tuple(
            extend_sample(s, [(g + (s.index or 0) + i) % 32_000 for i in range(self.tokens)],
                          weight_version=weight_version, status=Status.COMPLETED,
                          reward=float((g + (s.index or 0)) % 2))
            for s in group.samples))


class ObjectStoreGenerator:
    """The object-store side's generation actor: a group in, the generated group out (as
    a Ray object)."""

    def __init__(self, generate: Fill, samples: int) -> None:
        self.generate, self.samples = generate, samples

    def group(self, gid: int) -> SampleGroup:
        g = SampleGroup(tuple(Sample((gid,), group_index=gid, index=gid * self.samples + j)
                              for j in range(self.samples)))
        return asyncio.run(self.generate(g, weight_version=0, abort=asyncio.Event()))


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _role(pid: int) -> str:
    """Which part of the pipeline process ``pid`` is: ``driver`` (this process),
    ``controller`` (straw's controller actor: coordinator, data source, builder),
    ``generation`` (the generation actors of either side) or ``ray`` (raylets, GCS, idle
    workers, agents), from the title Ray gives an actor's process (``ray::Class...``)."""
    if pid == os.getpid():
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return "ray"
    if title.startswith("ray::ControllerWorker"):
        return "controller"
    if title.startswith(("ray::GenerationWorker", "ray::ObjectStoreGenerator")):
        return "generation"
    return "ray"


ROLES = ("driver", "controller", "generation", "ray")


def tree_cpu_pids() -> dict[int, tuple[float, str]] | None:
    """CPU seconds (user + system) and role of this process and of every live descendant
    (the local cluster's processes), by pid, or None without ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        cpu[int(name)] = (int(fields[11]) + int(fields[12])) / _TICK
    out: dict[int, tuple[float, str]] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in cpu:
            out[pid] = (cpu[pid], _role(pid))
        todo += children.get(pid, [])
    return out


def tree_cpu() -> float | None:
    """CPU seconds (user + system) of this process and every live descendant (the
    local cluster's processes), or None without ``/proc``."""
    pids = tree_cpu_pids()
    return None if pids is None else sum(c for c, _ in pids.values())


def _per_batch(c0: float | None, c1: float | None, batches: int) -> float | None:
    return None if c0 is None or c1 is None else (c1 - c0) / batches


def _cluster_per_batch(p0: dict[int, tuple[float, str]] | None,
                       p1: dict[int, tuple[float, str]] | None, batches: int) -> float | None:
    """The whole cluster's CPU seconds per batch between two ``tree_cpu_pids`` readings
    (per process, as ``_ms_per_group``)."""
    if p0 is None or p1 is None:
        return None
    return sum(c - p0.get(pid, (0.0, r))[0] for pid, (c, r) in p1.items()) / batches


def _ms_per_group(p0: dict[int, tuple[float, str]] | None,
                  p1: dict[int, tuple[float, str]] | None, groups: int
                  ) -> dict[str, float] | None:
    """CPU ms per group by role between two ``tree_cpu_pids`` readings (a process that
    started in between counts from 0; one that exited in between is not counted)."""
    if p0 is None or p1 is None or groups <= 0:
        return None
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, (cpu, role) in p1.items():
        spent[role] += cpu - p0.get(pid, (0.0, role))[0]
    return {r: round(1000 * v / groups, 3) for r, v in spent.items()}


def train(samples: list[Any]) -> int:
    """The 'training': touch every token of the batch."""
    return sum(len(s) for s in samples)


def object_store_run(nodes: list[str], args: argparse.Namespace, batches: int, *,
                     kill_at: int | None = None) -> dict[str, Any]:
    """``batches`` batches through the object store; with ``kill_at`` the job is killed
    once that many groups of the next batch are buffered (and started again)."""
    def spawn() -> list[Any]:
        return [ray.remote(ObjectStoreGenerator).options(  # type: ignore[attr-defined]
            num_cpus=1, max_restarts=0, max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)
        ).remote(Fill(args.tokens), args.samples) for n in nodes]

    actors = spawn()
    slots = max(1, args.concurrency // args.samples)
    next_gid, trained, lost, generated = 0, 0, 0, 0
    inflight: dict[Any, int] = {}
    buffer: list[SampleGroup] = []
    t0: float | None = None
    c0: dict[int, tuple[float, str]] | None = None
    killed = False
    while trained < batches:
        while len(inflight) < slots:
            inflight[actors[next_gid % len(actors)].group.remote(next_gid)] = next_gid
            next_gid += 1
        done, _ = ray.wait(list(inflight), num_returns=1)
        for ref in done:
            inflight.pop(ref)
            buffer.append(ray.get(ref))
            generated += 1
        if kill_at is not None and not killed and trained >= 1 and len(buffer) >= kill_at:
            # the job dies: its actors, its buffer and what was in flight are gone
            for a in actors:
                ray.kill(a, no_restart=True)
            lost += len(buffer)
            buffer, inflight, killed = [], {}, True
            actors = spawn()
            continue
        if len(buffer) >= args.batch_groups:
            batch, buffer = buffer[:args.batch_groups], buffer[args.batch_groups:]
            train([s.tokens for g in batch for s in g])
            trained += 1
            if trained == 1:
                t0, c0 = time.perf_counter(), tree_cpu_pids()
    elapsed, c1 = time.perf_counter() - (t0 or 0), tree_cpu_pids()
    for a in actors:
        ray.kill(a, no_restart=True)
    return {"groups_per_s": (batches - 1) * args.batch_groups / elapsed,
            "cpu_s_per_batch": _cluster_per_batch(c0, c1, batches - 1),
            "cpu_ms_per_group": _ms_per_group(c0, c1, (batches - 1) * args.batch_groups),
            "generated": generated, "lost_groups": lost,
            "regenerated_groups": lost}


def straw_run(root: str, run: str, nodes: list[str], args: argparse.Namespace, batches: int,
              *, kill_at: int | None = None) -> dict[str, Any]:
    """``batches`` batches through straw; with ``kill_at`` the job is killed once that many
    accepted groups wait for the next batch, then recovered from the pool."""
    # refills of a batch's worth of prompts (one queue transaction per batch, not one per
    # take of a few groups); generation at most ``--ahead`` batches ahead of training, as
    # the object-store side's driver, which holds only the calls it keeps in flight
    config = RolloutConfig(n_samples_per_prompt=args.samples, lease_seconds=10,
                           segment_mib=64, min_refill=args.refill or args.batch_groups,
                           max_refill=max(args.refill or args.batch_groups, 64))
    specs = [NodeSpec(n) for n in nodes]

    def start(recover: bool) -> RayRollout:
        return RayRollout(root, run, list(range(100_000)), Fill(args.tokens),
                          concurrency=args.concurrency, config=config, nodes=specs,
                          batch_groups=args.batch_groups,
                          max_ahead_groups=(args.ahead * args.batch_groups
                                            if args.ahead else None),
                          controller_options={"recover": recover},
                          prefetch=args.prefetch)

    store = SharedFilesystemStore(root, run)
    job = start(False)
    trained, t0, c0, lost, regenerated, waiting = 0, None, None, 0, 0, 0
    killed = False
    trained_last: str | None = None  # a trained batch not finished yet
    try:
        while trained < batches:
            if kill_at is not None and not killed and trained >= 1:
                backlog = sum(job.backlog().values())
                if backlog >= kill_at:
                    if trained_last is not None:  # the kill comes after its acknowledgement
                        job.finish_batch(trained_last)
                        trained_last = None
                    before = {r.task_id for r in job.accepted()}
                    waiting = backlog
                    job.close(force=True)  # every actor killed: no pause, no close
                    job = start(True)
                    killed = True
                    after = [r.task_id for r in job.accepted()]
                    regenerated = len(after) - len(set(after))
                    lost = len(before - set(after))
                    if sum(job.backlog().values()) < waiting:
                        lost += waiting - sum(job.backlog().values())
            # waits in the controller; acknowledges the batch trained last first, in
            # the same call (one round trip per batch)
            refs = job.next_batch(trained, timeout=1.0, finish=trained_last)
            trained_last = None
            if refs is None:
                continue
            shard = refs[0].load(store, rank=0)
            train([s["tokens"] for s in shard.samples])
            trained_last = refs[0].batch_id
            trained += 1
            if trained == 1:  # the warm-up batch, acknowledged before the clock starts
                job.finish_batch(trained_last)
                trained_last = None
                t0, c0 = time.perf_counter(), tree_cpu_pids()
        if trained_last is not None:  # the last batch's acknowledgement is measured too
            job.finish_batch(trained_last)
        elapsed, c1 = time.perf_counter() - (t0 or 0), tree_cpu_pids()
        accepted = len(job.accepted())
    finally:
        job.close(force=True)
        store.close()
    return {"groups_per_s": (batches - 1) * args.batch_groups / elapsed,
            "cpu_s_per_batch": _cluster_per_batch(c0, c1, batches - 1),
            "cpu_ms_per_group": _ms_per_group(c0, c1, (batches - 1) * args.batch_groups),
            "accepted": accepted, "lost_groups": lost, "regenerated_groups": regenerated,
            "survived_kill": waiting}


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 12: a sustained run (11 measured batches, about 0.7 s of straw's); with 4 the three
    # measured batches last about 0.2 s and the ramp-up of the producers' leases ahead
    # and the generation-ahead bound decide the figure, not the pipeline's steady state
    ap.add_argument("--batches", type=int, default=12, help="batches per run (>= 2)")
    ap.add_argument("--batch-groups", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt")
    ap.add_argument("--tokens", type=int, default=256, help="response tokens per sample")
    ap.add_argument("--concurrency", type=int, default=64, help="samples generated at once")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two sides")
    ap.add_argument("--refill", type=int, default=0,
                    help="straw: prompt groups admitted per refill (0: --batch-groups)")
    ap.add_argument("--ahead", type=int, default=2,
                    help="straw: batches of accepted groups generation may run ahead of "
                         "training (0: unbounded)")
    ap.add_argument("--prefetch", type=int, default=None,
                    help="straw: groups each node leases ahead of its slots (default: "
                         "the library's)")
    ap.add_argument("--dir", default=None, help="where the pool lives (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.batches < 2:
        ap.error("--batches must be >= 2 (the first batch is the warm-up)")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    base = tempfile.mkdtemp(prefix="straw-pipeline-", dir=args.dir)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False})
    for i in range(2):
        cluster.add_node(num_cpus=1, resources={f"gen{i}": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        nodes = sorted(n["NodeID"] for n in ray.nodes()
                       if n["Alive"] and any(k.startswith("gen") for k in n["Resources"]))
        rates: dict[str, list[float]] = {"object_store": [], "straw": []}
        cpus: dict[str, list[float]] = {"object_store": [], "straw": []}
        roles: dict[str, list[dict[str, float]]] = {"object_store": [], "straw": []}
        for r in range(args.rounds):
            os_side = object_store_run(nodes, args, args.batches)
            st = straw_run(os.path.join(base, "pool"), f"run{r}", nodes, args, args.batches)
            for side, got in (("object_store", os_side), ("straw", st)):
                rates[side].append(got["groups_per_s"])
                if got["cpu_s_per_batch"] is not None:
                    cpus[side].append(got["cpu_s_per_batch"])
                if got["cpu_ms_per_group"] is not None:
                    roles[side].append(got["cpu_ms_per_group"])
            print(f"round {r}: object store {os_side['groups_per_s']:.1f} groups/s, "
                  f"straw {st['groups_per_s']:.1f} groups/s; cluster CPU s per batch: "
                  f"object store {_fmt(os_side['cpu_s_per_batch'])}, straw "
                  f"{_fmt(st['cpu_s_per_batch'])}", flush=True)
        half = args.batch_groups // 2
        os_kill = object_store_run(nodes, args, 3, kill_at=half)
        st_kill = straw_run(os.path.join(base, "pool"), "kill", nodes, args, 3, kill_at=half)
        med = {k: statistics.median(v) for k, v in rates.items()}
        cpu_med = {k: statistics.median(v) if v else None for k, v in cpus.items()}
        # CPU ms per group of each part of the pipeline (median over the rounds): where
        # each side spends what the cluster's figure sums
        role_med = {side: {r: statistics.median(d[r] for d in ds) for r in ROLES} if ds
                    else None for side, ds in roles.items()}
        cpu_ratio = (cpu_med["straw"] / cpu_med["object_store"]
                     if cpu_med["straw"] and cpu_med["object_store"] else None)
        doc = {"cpus": os.cpu_count(), "nodes": 2, "batch_groups": args.batch_groups,
               "samples": args.samples, "tokens": args.tokens,
               "concurrency": args.concurrency, "rounds": args.rounds, "ahead": args.ahead,
               "groups_per_s": rates, "median": med,
               "ratio_straw_over_object_store": med["straw"] / med["object_store"],
               "cpu_s_per_batch": cpus, "cpu_median": cpu_med,
               "cpu_ratio_straw_over_object_store": cpu_ratio,
               "cpu_ms_per_group": roles, "cpu_ms_per_group_median": role_med,
               "kill": {"object_store": os_kill, "straw": st_kill}}
        print(f"median groups/s: object store {med['object_store']:.1f}, straw "
              f"{med['straw']:.1f}, ratio {doc['ratio_straw_over_object_store']:.2f} "
              f"(target >= 0.8; {os.cpu_count()} cpus shared by the 3 nodes)")
        print(f"median cluster CPU s per batch: object store {_fmt(cpu_med['object_store'])}, "
              f"straw {_fmt(cpu_med['straw'])}, straw/object store "
              f"{_fmt(cpu_ratio, '.2f')} (load-robust: what each side spends on a batch)")
        for side, med_roles in role_med.items():
            if med_roles is not None:
                print(f"median CPU ms per group, {side.replace('_', ' ')}: " + ", ".join(
                    f"{r} {med_roles[r]:.3f}" for r in ROLES) +
                      f" (total {sum(med_roles.values()):.3f})")
        print(f"kill of the whole job with half a batch accepted: object store lost "
              f"{os_kill['lost_groups']} groups (generated again); straw lost "
              f"{st_kill['lost_groups']}, regenerated {st_kill['regenerated_groups']}, "
              f"{st_kill['survived_kill']} accepted groups trained after recovery")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
