"""straw.rollout.producer without Ray: slots take, generate and return; pause turns the
generation under way into durable partial groups and takes nothing more; resume continues
them under the new weight version (each token range tagged with its own); a group already
ready is not generated again; a generate function that breaks the protocol stops the
producer with its error, its lease left to expire (nothing lost)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from straw import QuotaExceeded, SharedFilesystemStore, StorageUnavailable
from straw.rollout import RolloutConfig, SampleGroup, Status
from straw.rollout.codec import group_from_records
from straw.rollout.controller import RolloutController
from straw.rollout.generate import extend_sample
from straw.rollout.generation import GenerationClient
from straw.rollout.producer import Producer

CONFIG = RolloutConfig(n_samples_per_prompt=2, lease_seconds=60)
LENGTH = 4


class Gated:
    """Version 0 generates one token per sample, then waits for the abort (the pause);
    any later version finishes the group.  Counts its calls by group."""

    def __init__(self) -> None:
        self.calls: dict[int, list[int]] = {}
        self.waiting = 0

    async def __call__(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup:
        self.calls.setdefault(group.group_index, []).append(weight_version)
        samples = [extend_sample(s, [s.response_length], weight_version=weight_version)
                   for s in group.samples]
        if weight_version == 0:
            self.waiting += 1
            await abort.wait()
            self.waiting -= 1
            samples = [dataclasses.replace(s, status=Status.ABORTED) for s in samples]
        else:
            samples = [extend_sample(s, range(s.response_length, LENGTH),
                                     weight_version=weight_version, status=Status.COMPLETED,
                                     reward=1.0) for s in samples]
        return dataclasses.replace(group, samples=tuple(samples))


@pytest.fixture
def job(tmp_path):
    store = SharedFilesystemStore(tmp_path, "job", writer_id="controller")
    controller = RolloutController(store, [(i,) for i in range(16)], config=CONFIG)
    gen_store = SharedFilesystemStore(tmp_path, "job", writer_id="gen")
    client = GenerationClient(controller, gen_store, worker_id="gen-0", config=CONFIG)
    yield controller, client, gen_store
    client.close()
    controller.close()
    gen_store.close()
    store.close()


async def until(cond, what: str) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_pause_persists_in_flight_groups_and_resume_continues_them(job):
    controller, client, store = job
    gen = Gated()

    async def run() -> tuple[dict, dict]:
        producer = Producer(client, gen, slots=2)
        await producer.start()
        await until(lambda: gen.waiting == 2, "two groups in generation")
        paused = await producer.pause()
        # durable when pause returns: nothing leased, both groups are continuations
        states = {t: s for t, s in controller.coordinator.tasks.items()
                  if t.startswith("prompt:")}
        assert not [t for t, s in states.items() if s["state"] == "leased"]
        assert not client.leases
        await asyncio.sleep(0.2)
        assert not client.leases and gen.waiting == 0  # admission stays shut
        controller.set_serving_version(1)
        producer.resume(1)
        await until(lambda: producer.counts["completed"] >= 2, "the continued groups")
        await producer.pause()
        await producer.stop()
        return paused, states

    paused, states = asyncio.run(run())
    # the two in generation come back partial; the groups leased ahead of the slots
    # (prefetch) come back as they were taken, never generated
    assert paused["counts"]["returned"] == 2 + paused["counts"].get("untouched", 0)
    partial = sorted(t for t, s in states.items()
                     if s["spec"]["metadata"].get("stage") == "partial")
    assert len(partial) == 2
    receipts = {r.task_id: r for r in controller.coordinator.read_commits(0, 100).commits}
    with store.read_session() as reader:
        for t in partial:
            g = group_from_records(list(reader.read(receipts[t].result_ref)))
            for s in g:  # token 0 under version 0, the rest under version 1
                assert [(v.start, v.stop, v.version) for v in s.versions] == \
                    [(0, 1, 0), (1, LENGTH, 1)]
            assert gen.calls[g.group_index] == [0, 1]  # continued, never restarted


def test_a_group_taken_after_the_pause_is_returned_unchanged(job):
    controller, client, _ = job
    gen = Gated()

    async def run() -> Producer:
        producer = Producer(client, gen, slots=1, prefetch=0)  # one group at a time
        real_take = client.take

        def slow_take(n):  # the pause lands while the take is in flight
            got = real_take(n)
            asyncio.run_coroutine_threadsafe(producer.pause(), loop)
            import time
            time.sleep(0.1)
            return got

        loop = asyncio.get_running_loop()
        client.take = slow_take  # type: ignore[method-assign]
        await producer.start()
        await until(lambda: producer.counts["untouched"] == 1, "the untouched group")
        client.take = real_take  # type: ignore[method-assign]
        await producer.pause()
        await producer.stop()
        return producer

    producer = asyncio.run(run())
    assert gen.calls == {} and producer.counts["returned"] == 1
    states = controller.coordinator.tasks
    assert not [t for t, s in states.items() if s["state"] == "leased"]


def test_a_generate_function_breaking_the_protocol_stops_the_producer(job):
    controller, client, _ = job

    async def rewrites(group, *, weight_version, abort):
        return dataclasses.replace(group, samples=tuple(
            dataclasses.replace(s, tokens=(9,), response_length=1) for s in group.samples))

    async def run() -> Producer:
        producer = Producer(client, rewrites, slots=1, prefetch=0)  # one group held
        await producer.start()
        with pytest.raises(RuntimeError, match="not tagged|tagged with weight version 0"):
            await producer.wait()
        return producer

    producer = asyncio.run(run())
    assert isinstance(producer.error, ValueError)
    # its lease is still held (it expires, or close releases it): the task is not lost
    assert len(client.leases) == 1
    with pytest.raises(RuntimeError, match="producer 'gen-0' stopped"):
        producer.stats()


class Valve:
    """While shut, generates one token per sample and waits for the abort (a partial
    group); while open, finishes every group at once."""

    def __init__(self) -> None:
        self.open = False
        self.waiting = 0

    async def __call__(self, group, *, weight_version, abort):
        self.waiting += 1
        while not self.open and not abort.is_set():
            await asyncio.sleep(0.005)
        self.waiting -= 1
        if self.open:
            return await Finishes()(group, weight_version=weight_version, abort=abort)
        return dataclasses.replace(group, samples=tuple(
            dataclasses.replace(extend_sample(s, [1], weight_version=weight_version),
                                status=Status.ABORTED) for s in group.samples))


class Finishes:
    """Finishes every group at once (version 0)."""

    async def __call__(self, group, *, weight_version, abort):
        return dataclasses.replace(group, samples=tuple(
            extend_sample(s, range(LENGTH), weight_version=weight_version,
                          status=Status.COMPLETED, reward=1.0) for s in group.samples))


def failing_calls(client, name, errors):
    """``client.<name>`` (take or return_and_take) raising ``errors`` in turn, before the
    call, then working (a take that fails has given its leases back)."""
    real = getattr(client, name)
    calls = []

    def call(arg, **kwargs):
        calls.append(arg if isinstance(arg, int) else len(arg))
        if not errors:
            return real(arg, **kwargs)
        raise errors.pop(0)
    setattr(client, name, call)
    return calls


def lost_replies(controller, errors):
    """The controller's ``complete_and_take`` raising ``errors`` in turn, then working:
    the first after the real call went through (its reply lost: the groups completed,
    the next ones leased), the others before the call."""
    real = controller.complete_and_take
    calls = []

    def call(items, worker_id, count, *, request_id):
        calls.append((len(items), request_id))
        if not errors:
            return real(items, worker_id, count, request_id=request_id)
        if len(calls) == 1:
            real(items, worker_id, count, request_id=request_id)
        raise errors.pop(0)
    controller.complete_and_take = call
    return calls


def run_until_completed(client, n: int) -> Producer:  # type: ignore[no-untyped-def]
    """A two-slot producer of ``Finishes`` run until ``n`` groups completed, then stopped."""
    async def run() -> Producer:
        producer = Producer(client, Finishes(), slots=2)
        await producer.start()
        await until(lambda: producer.counts["completed"] >= n, f"{n} completed groups")
        await producer.stop()
        return producer
    return asyncio.run(run())


def test_a_return_meeting_storage_unavailable_is_retried(job):
    """A return refused by StorageUnavailable (another client's visibility lag, say) is
    tried again with backoff; the retry answers the same outcomes (a lost reply included):
    every group is completed once, nothing lost, the producer goes on."""
    controller, client, _ = job
    calls = lost_replies(controller, [StorageUnavailable("lag"), StorageUnavailable("lag")])
    producer = run_until_completed(client, 4)
    assert producer.error is None
    assert producer.counts["storage_retried"] == 2
    # the same batch again, its take under the same request id
    assert len(calls) >= 3 and calls[0] == calls[1] == calls[2]
    commits = [r for r in controller.coordinator.read_commits(0, 100).commits
               if r.task_id.startswith("prompt:")]
    assert len({r.task_id for r in commits}) == len(commits) >= 4  # each once
    # the take whose reply was lost was answered again with its leases: none of them is
    # left held by this worker once the producer stopped (its client released the rest)
    states = controller.coordinator.tasks
    assert not [t for t, st in states.items() if st["state"] == "leased"]


def test_a_take_meeting_storage_unavailable_is_retried(job):
    """A take whose input read failed (its leases given back) is taken again: no lease
    is left behind, the groups are generated and completed."""
    controller, client, _ = job
    failing_calls(client, "take", [StorageUnavailable("lag")])
    producer = run_until_completed(client, 2)
    assert producer.error is None and producer.counts["storage_retried"] == 1
    states = controller.coordinator.tasks
    assert not [t for t, st in states.items() if st["state"] == "leased"]


@pytest.mark.parametrize("error", [QuotaExceeded("disk full"), StorageUnavailable("gone")])
def test_a_full_disk_or_a_lasting_outage_stops_the_producer(job, error):
    """A full disk is not retried; an outage longer than storage_retry_seconds stops the
    producer with its error (its leases left to expire: nothing lost)."""
    _, client, _ = job
    failing_calls(client, "return_and_take", [error] * 100)

    async def run() -> Producer:
        producer = Producer(client, Finishes(), slots=1, storage_retry_seconds=0.3)
        await producer.start()
        with pytest.raises(RuntimeError, match=type(error).__name__):
            await producer.wait()
        return producer

    producer = asyncio.run(run())
    assert producer.error is error
    retried = producer.counts["storage_retried"]
    assert retried == 0 if isinstance(error, QuotaExceeded) else retried >= 1


def test_bad_arguments(job):
    _, client, _ = job
    with pytest.raises(ValueError, match="slots must be an int >= 1"):
        Producer(client, Gated(), slots=0)
    with pytest.raises(TypeError, match="GenerationClient"):
        Producer(object(), Gated(), slots=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weight_version must be an int >= 0"):
        Producer(client, Gated(), slots=1, weight_version=-1)
    with pytest.raises(ValueError, match="storage_retry_seconds must be a number >= 0"):
        Producer(client, Gated(), slots=1, storage_retry_seconds=-1)
    with pytest.raises(ValueError, match="prefetch must be None or an int >= 0"):
        Producer(client, Gated(), slots=1, prefetch=-1)


def test_groups_are_leased_ahead_of_the_slots_and_a_return_takes_the_next(job):
    """``prefetch`` groups are leased beyond the slots (a slot that finishes starts the
    next at once), and a return of ready groups leases the next ones in the same
    controller call (complete_and_take): a steady producer makes about one call per
    batch of groups; at a pause the groups leased ahead go back as they were taken."""
    controller, client, _ = job
    real = controller.complete_and_take
    folded = []

    def counted(items, worker_id, count, *, request_id):
        folded.append(count)
        return real(items, worker_id, count, request_id=request_id)
    controller.complete_and_take = counted
    gen = Valve()

    async def run() -> tuple[Producer, int, int]:
        producer = Producer(client, gen, slots=2, prefetch=3)
        await producer.start()
        await until(lambda: gen.waiting == 2 and len(client.leases) == 5,
                    "two groups in generation, three leased ahead")
        held = len(client.leases)
        gen.open = True
        await until(lambda: producer.counts["completed"] >= 8, "completed groups")
        gen.open = False
        paused = await producer.pause()
        assert not client.leases  # everything held is back in the queue
        await producer.stop()
        return producer, held, paused["counts"].get("untouched", 0)

    producer, held, untouched = asyncio.run(run())
    assert held == 5 and untouched >= 1
    assert folded and all(n >= 1 for n in folded)  # the returns took the next groups
    commits = [r for r in controller.coordinator.read_commits(0, 100).commits
               if r.task_id.startswith("prompt:")]
    assert len({r.task_id for r in commits}) == len(commits) == producer.counts["completed"]
    states = controller.coordinator.tasks
    assert not [t for t, st in states.items() if st["state"] == "leased"]


def test_adaptive_prefetch_is_what_the_slots_finish_during_a_round_trip():
    from straw.rollout.producer import PREFETCH_MAX_FACTOR, adaptive_prefetch
    # a real engine: groups take seconds, a return milliseconds: about one ahead
    assert adaptive_prefetch(8, 0.02, 5.0) == 1
    assert adaptive_prefetch(8, 0.5, 2.0) == 2  # 8 x 0.25, rounded up
    # a trivial generate function: the round trip is the cycle, the cap holds
    assert adaptive_prefetch(8, 0.02, 0.001) == PREFETCH_MAX_FACTOR * 8
    assert adaptive_prefetch(8, 0.02, 0.0) == PREFETCH_MAX_FACTOR * 8
    assert adaptive_prefetch(3, 0.0, 1.0) == 1  # never none: a slot would wait


def test_a_producer_whose_returns_are_slow_leases_further_ahead(job):
    """``prefetch=None``: starts at the slots, then follows the measured round trip of
    its returns and the generation time of its groups (here: instant groups, returns of
    50 ms: the cap); an int stays fixed."""
    import time

    from straw.rollout.producer import PREFETCH_MAX_FACTOR
    controller, client, _ = job
    real = controller.complete_and_take

    def slow(items, worker_id, count, *, request_id):
        time.sleep(0.05)
        return real(items, worker_id, count, request_id=request_id)
    controller.complete_and_take = slow
    assert Producer(client, Finishes(), slots=2, prefetch=1).prefetch == 1

    async def run() -> tuple[int, int, dict]:
        producer = Producer(client, Finishes(), slots=2)
        start = producer.prefetch
        await producer.start()
        await until(lambda: producer.counts["completed"] >= 12, "completed groups")
        stats = producer.stats()
        await producer.stop()
        return start, producer.prefetch, stats

    start, adapted, stats = asyncio.run(run())
    assert start == 2
    assert adapted == PREFETCH_MAX_FACTOR * 2 == stats["prefetch"]
