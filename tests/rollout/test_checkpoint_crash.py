"""A power loss at points spread over every step of a checkpoint's save (model files,
rollout state, retention, queue registration, marker, trackers) on SimFS: resolution
afterwards selects the old or the new checkpoint, whole (RL9: a marker implies every
component durable), never a mix, and the job resumes from it.  (Round 2's campaign
crashes every syscall of save, commit and restore; this drives the same entry points.)"""

from __future__ import annotations

import dataclasses

from fault_injection.queue_campaign import crash_in
from fault_injection.rules import MUTATING_OPS
from fault_injection.simfs import SimFS
from straw import SharedFilesystemStore
from straw.clock import ManualClock
from straw.rollout import EnvironmentMix, Status
from straw.rollout.generation import GenerationClient
from straw.rollout.resolve import resolve_checkpoint
from straw.rollout.restore import open_job

from .ckpt_job import BATCH, CONFIG, PROMPTS

SAVE = "/save"


def sim_store(sim, clock, writer):
    return SharedFilesystemStore("/pool", "job", writer_id=writer, fs=sim, clock=clock,
                                 reserve_bytes=16 * 1024, segment_target_bytes=1 << 20,
                                 visibility_retries=2, visibility_backoff=0.0)


def sim_model(sim):
    """A model save writing through the simulated filesystem WITHOUT syncing: the
    checkpoint's own fsyncs must make it durable before the marker."""
    def save(model_dir):
        fd = sim.open(model_dir + "/weights.bin", write=True, create=True)
        sim.writev(fd, [b"w" * 3000], 0)
        sim.close(fd)
        return {"files": ["weights.bin"], "optimizer": True, "rng": True}
    return save


def start(sim, clock):
    store = sim_store(sim, clock, "manager")
    job = open_job(resolve_checkpoint(SAVE, fs=sim), store, PROMPTS,
                   EnvironmentMix.single(BATCH), dp_size=1, config=CONFIG, fs=sim,
                   clock=clock)
    return store, job


def accept_two(sim, clock, job, tag):
    """Two accepted groups, completed through the coordinator (a generation worker)."""
    gen = sim_store(sim, clock, f"gen-{tag}")
    client = GenerationClient(job.controller, gen, worker_id=f"gen-{tag}", config=CONFIG,
                              clock=clock)
    groups = client.take(2)
    client.return_groups([dataclasses.replace(g, samples=tuple(dataclasses.replace(
        s, tokens=s.tokens + (7,), response_length=1, status=Status.COMPLETED, reward=1.0)
        for s in g.samples)) for g in groups])
    client.close()
    gen.close()


def prefix(sim, clock):
    """A new run: a batch trained, step 0 saved, two more groups accepted."""
    store, job = start(sim, clock)
    accept_two(sim, clock, job, "a")
    refs = job.builder.next_batch(0)
    job.builder.finish_batch(refs[0].batch_id)
    job.save(0, sim_model(sim))
    accept_two(sim, clock, job, "b")
    return store, job


def test_a_power_loss_during_a_save_selects_the_old_or_the_new_checkpoint_whole():
    probe = SimFS(0)
    clock = ManualClock()
    store, job = prefix(probe, clock)
    before = sum(1 for e in probe.trace if e.op in MUTATING_OPS)
    job.save(1, sim_model(probe))
    total = sum(1 for e in probe.trace if e.op in MUTATING_OPS)
    job.close()
    store.close()
    assert total - before > 10
    seen = set()
    crashed = 0
    # a crash point counts the matching calls made after it is set (here: in the save)
    for nth in range(1, total - before + 1, max(1, (total - before) // 25)):
        sim = SimFS(0, record_trace=False)
        clock = ManualClock()
        store, job = prefix(sim, clock)
        sim.crash_at(nth, ops=MUTATING_OPS)
        try:
            job.save(1, sim_model(sim))
        except BaseException as e:  # noqa: BLE001 - only a simulated crash is expected
            if crash_in(e) is None:
                raise
            crashed += 1
        sim.crash("clear-cache")
        r = resolve_checkpoint(SAVE, fs=sim)  # validates every component of the marker
        assert r.step in (0, 1), (nth, r)
        seen.add(r.step)
        store, job = start(sim, clock)  # and the job resumes from it
        try:
            assert job.resolution.step == r.step
            assert job.builder.next_batch(job.next_rollout_id) is not None  # payloads there
        finally:
            job.close()
            store.close()
    assert crashed > 10 and seen == {0, 1}, (crashed, seen)
