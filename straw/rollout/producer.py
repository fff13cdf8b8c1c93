"""The producer: one generation process's slots running a generate function, with an
admission pause for weight updates (issue 17, item 3).  Framework-neutral (asyncio only):
the Ray generation actor (``straw.rollout.ray``) runs one, and so can any process.

``Producer(client, generate, slots=n, weight_version=v, prefetch=p)`` over a
``GenerationClient``: ``start()`` (in a running event loop) starts ``n`` slots, each a
loop of

1. get one prompt group (a fresh prompt or a durable continuation): one ``client.take``
   leases groups for every slot waiting (up to ``MAX_TAKE``), one controller round trip;
2. generate on it (``generate(group, weight_version=v, abort=event)``, the protocol of
   ``straw.rollout.generate``), the result checked by ``check_generated``; a group that is
   already ready (a continuation whose samples are all finished) is not generated again;
3. return it (``client.return_and_take``): ready groups are completed (a receipt),
   partial ones yielded as the task's durable continuation; the groups finished meanwhile
   go back in one call (one publication, one group commit of their completions), which
   also leases the groups for the slots waiting then (the slots that finished them): a
   take riding the completion's round trip (``complete_and_take``), so a steady producer
   makes one controller call per batch of groups, not two.  The taker (step 1) leaves the
   slots a return is about to serve to it, and takes for whoever still waits after.

``prefetch`` groups are leased ahead of the slots, waiting in the producer's inbox: a
slot that finishes starts its next group at once instead of waiting for the round trip
that returns the last one, so generation overlaps the queue's durable writes.  They hold
leases (the heartbeat renews them) but no generation: at a pause they go back as they
were taken.  By default (``prefetch=None``) the producer leases ahead what its slots
finish during one return's round trip (``adaptive_prefetch``: ``slots x round trip /
generation time`` of a group, both measured as it runs, at least 1 and at most
``PREFETCH_MAX_FACTOR`` x the slots; it starts at the slots): a real engine, whose groups
take seconds, leases about one ahead, so prompts do not wait on a slow node's slots; a
trivial generate function, whose round trip is the producer's cycle, leases the most.
(In ``bench.pipeline_bench`` prefetch took straw from 0.57 to 0.81-0.87 of the object
store's throughput.)  An int fixes it (0: none).

``pause()`` closes admission (no slot takes again), sets the abort event of the generation
under way, and returns once every slot is idle: each aborted group returned as a partial
group (durable: its continuation published and the queue's yield transaction committed)
and each finished one completed.  A group a slot took after the pause began is returned
unchanged, never generated.  ``resume(weight_version)`` (after the weight update) reopens
admission with the new version: continuations go on under it, so each token range of a
sample carries the version that generated it (``VersionSpan``).  ``stop()`` pauses, ends
the slots and closes the client (its leases released).

A lease lost meanwhile (``StaleAttempt``/``LeaseExpired`` on return: this process was too
slow, the task is someone else's now) is counted and the slot goes on.  A return that
fails with ``StorageUnavailable`` (the controller could not read the returned group yet:
another client's visibility lag on a shared filesystem, a storage hiccup) is retried with
backoff for up to ``STORAGE_RETRY_SECONDS`` (a return is safe to retry: the same call
answers the same outcomes; the heartbeat keeps the leases meanwhile, and a pause waits for
it); a full disk (``QuotaExceeded``) is not.  A take that could not read a group's input
is retried the same way (a take that fails gives its leases back first).  Any other error
(a generate function that raises or breaks the protocol, the controller gone) stops the
producer: it is latched and raised by ``pause``, ``stats``, ``wait`` and ``stop``; the
leases it holds are left to expire (their tasks return to the queue; nothing is lost).

The client's calls block (they reach the controller and the pool); they run on the
producer's own threads (the taker, the returner, ``stop``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from straw import LeaseExpired, QuotaExceeded, StaleAttempt, StorageUnavailable

from .generate import GenerateFn, check_generated
from .generation import GenerationClient
from .samples import SampleGroup, Stage, classify

IDLE_SECONDS = 0.05  # a take that found nothing is tried again after this long
MAX_TAKE = 64  # prompt groups leased in one take
# A take or a return that meets StorageUnavailable is tried again for this long (backoff from
# STORAGE_RETRY_FIRST, doubling, at most 2 s apart): longer than any visibility lag of a
# correctly mounted shared filesystem (JuiceFS's default caches: about 1 s), shorter than a
# lease (the heartbeat renews it meanwhile), so an outage that lasts stops the producer.
STORAGE_RETRY_SECONDS = 30.0
STORAGE_RETRY_FIRST = 0.1
# the adaptive prefetch leases at most this many times the slots ahead
PREFETCH_MAX_FACTOR = 4
# weight of the newest measurement in the running means of the adaptive prefetch
_EWMA = 0.2


class Producer:
    """Generation slots of one process (see the module docstring)."""

    def __init__(self, client: GenerationClient, generate: GenerateFn, *, slots: int,
                 weight_version: int = 0, idle_seconds: float = IDLE_SECONDS,
                 storage_retry_seconds: float = STORAGE_RETRY_SECONDS,
                 prefetch: int | None = None) -> None:
        if not isinstance(client, GenerationClient):
            raise TypeError(f"client must be a GenerationClient, got {type(client).__name__}")
        if not callable(generate):
            raise TypeError(f"generate must be an async generate function (see "
                            f"straw.rollout.generate), got {type(generate).__name__}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1 (prompt groups generated at once), "
                             f"got {slots!r}")
        _check_weight_version(weight_version)
        if isinstance(storage_retry_seconds, bool) \
                or not isinstance(storage_retry_seconds, (int, float)) or storage_retry_seconds < 0:
            raise ValueError(f"storage_retry_seconds must be a number >= 0 (how long a take "
                             f"or a return that meets StorageUnavailable is retried), got "
                             f"{storage_retry_seconds!r}")
        checked = check_prefetch(prefetch)
        self.client = client
        self.generate = generate
        self.slots = slots
        self.adaptive = checked is None  # prefetch follows the measured cycle
        self.prefetch = slots if checked is None else checked
        self._round_trip: float | None = None  # running mean of a return's seconds
        self._generate_seconds: float | None = None  # running mean of a group's
        self.weight_version = weight_version
        self.idle_seconds = idle_seconds
        self.storage_retry_seconds = storage_retry_seconds
        self.counts: Counter[str] = Counter()  # what became of the groups returned
        self.error: BaseException | None = None
        self._threads = concurrent.futures.ThreadPoolExecutor(
            3, thread_name_prefix=f"straw.rollout producer {client.worker_id}")
        self._tasks: list[asyncio.Task[None]] = []
        self._admission: asyncio.Event | None = None  # set: slots may take
        self._abort: asyncio.Event | None = None  # set: the generation under way stops
        self._idle: asyncio.Condition | None = None
        self._busy = 0  # groups held: from their take until their durable return
        self._hungry = 0  # slots waiting for a group
        self._inbox: asyncio.Queue[SampleGroup] = asyncio.Queue()  # taken, not started
        self._outbox: list[SampleGroup] = []  # generated, not returned yet
        self._hunger = asyncio.Event()  # set: a slot waits for a group
        self._taking = 0  # groups asked for by the takes under way
        self._returning = False  # a return under way (it takes for the slots waiting)
        self._returns = asyncio.Event()  # set: the outbox has groups
        self._stopping = False

    # --- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Start the slots in the running event loop (admission open)."""
        if self._tasks:
            raise RuntimeError(f"producer {self.client.worker_id!r} is already started")
        self._admission, self._abort = asyncio.Event(), asyncio.Event()
        self._idle = asyncio.Condition()
        self._admission.set()
        self._inbox = asyncio.Queue()
        self._hunger, self._returns = asyncio.Event(), asyncio.Event()
        self._tasks = [asyncio.create_task(self._guard(self._slot()), name=f"slot {i}")
                       for i in range(self.slots)]
        self._tasks += [asyncio.create_task(self._guard(self._feed()), name="take"),
                        asyncio.create_task(self._guard(self._return()), name="return")]

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"producer {self.client.worker_id!r} stopped: "
                               f"{type(self.error).__name__}: {self.error}") from self.error

    def _started(self) -> tuple[asyncio.Event, asyncio.Condition]:
        if self._admission is None or self._idle is None:
            raise RuntimeError(f"producer {self.client.worker_id!r} is not started: await "
                               "start() first")
        return self._admission, self._idle

    async def pause(self) -> dict[str, Any]:
        """Stop new takes, abort the generation under way, and return once every group
        held is back in the queue, durably (module docstring): ``{"paused": True,
        "counts": {...}}``."""
        admission, idle = self._started()
        admission.clear()
        assert self._abort is not None
        self._abort.set()
        async with idle:
            await idle.wait_for(lambda: self._busy == 0 or self.error is not None)
        self._check()
        return {"paused": True, "counts": dict(self.counts)}

    def resume(self, weight_version: int) -> None:
        """Reopen admission; generation goes on under ``weight_version``."""
        admission, _ = self._started()
        self._check()
        _check_weight_version(weight_version)
        self.weight_version = weight_version
        self._abort = asyncio.Event()  # a fresh one: the old one stays set for its users
        admission.set()

    @property
    def paused(self) -> bool:
        return self._admission is not None and not self._admission.is_set()

    def stats(self) -> dict[str, Any]:
        """Counts by outcome, slots busy, leases held, the weight version; raises the
        latched error if the producer stopped."""
        self._check()
        return {"counts": dict(self.counts), "busy": self._busy, "slots": self.slots,
                "leases": len(self.client.leases), "weight_version": self.weight_version,
                "paused": self.paused, "prefetch": self.prefetch}

    async def wait(self) -> None:
        """Until the slots end (they end only on ``stop`` or an error, which is raised)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._check()

    async def stop(self) -> None:
        """Pause, end the slots, close the client (releasing its leases).  Idempotent."""
        if self._stopping:
            return
        try:
            if self._tasks and self.error is None:
                await self.pause()
        finally:
            self._stopping = True
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._call(self.client.close)
            self._threads.shutdown(wait=True)
        self._check()

    # --- the slots ----------------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def _done(self, n: int) -> None:
        """``n`` groups (or takes) are no longer held: wake a pause waiting for idle."""
        self._busy -= n
        assert self._idle is not None
        idle = self._idle

        async def notify() -> None:
            async with idle:
                idle.notify_all()
        asyncio.get_running_loop().create_task(notify())

    async def _guard(self, coro: Any) -> None:
        """Run a loop of the producer; an error stops the producer (latched)."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - latched: pause/stats/stop raise it
            self.error = e
            self._done(0)
            me = asyncio.current_task()
            for t in self._tasks:  # the producer stops; the leases it holds expire
                if t is not me:
                    t.cancel()

    async def _feed(self) -> None:
        """Take for the slots waiting, in one call (one controller round trip and one
        read session for all of them)."""
        admission = self._admission
        assert admission is not None
        while not self._stopping:
            await admission.wait()
            # a return under way (or about to start) takes for the slots waiting now
            want = 0 if self._returning or self._outbox else self._want()
            if want <= 0:
                self._hunger.clear()
                await self._hunger.wait()
                continue
            self._busy += 1  # a take in flight: a pause waits for its groups
            self._taking += want
            try:
                groups: list[SampleGroup] = await self._retrying(self.client.take, want)
                self._busy += len(groups)
            finally:
                self._taking -= want
                self._done(1)
            for g in groups:
                self._inbox.put_nowait(g)
            if not groups:
                await asyncio.sleep(self.idle_seconds)

    def _want(self) -> int:
        """Groups to take now: for the slots waiting plus ``prefetch`` more, less those in
        the inbox and those a take under way asks for (0 while admission is closed)."""
        if self._stopping or self._admission is None or not self._admission.is_set():
            return 0
        return min(MAX_TAKE, self._hungry + self.prefetch - self._inbox.qsize()
                   - self._taking)

    async def _slot(self) -> None:
        admission = self._admission
        assert admission is not None
        while not self._stopping:
            self._hungry += 1
            self._hunger.set()
            try:
                group = await self._inbox.get()
            finally:
                self._hungry -= 1
            version, abort = self.weight_version, self._abort
            assert abort is not None
            if not admission.is_set():
                out = group  # taken after the pause began: back unchanged, never generated
                self.counts["untouched"] += 1
            elif classify(group) is Stage.READY:
                out = group  # a finished continuation: complete it, do not generate again
            else:
                started = asyncio.get_running_loop().time()
                out = check_generated(group, await self.generate(
                    group, weight_version=version, abort=abort), version)
                self._measured("_generate_seconds",
                               asyncio.get_running_loop().time() - started)
                self.counts["generated"] += 1
            self._outbox.append(out)
            self._returns.set()

    async def _return(self) -> None:
        """Return the groups the slots finished, all waiting ones in one call (one
        publication and one group commit for all of them)."""
        while not self._stopping or self._outbox:
            await self._returns.wait()
            self._returns.clear()
            batch, self._outbox = self._outbox, []
            if not batch:
                continue
            want = max(0, self._want())  # the slots that finished these wait for more
            self._returning = True
            self._taking += want
            try:
                try:
                    started = asyncio.get_running_loop().time()
                    returned, taken = await self._retrying(
                        functools.partial(self.client.return_and_take, count=want), batch)
                    self._measured("_round_trip", asyncio.get_running_loop().time() - started)
                    self._busy += len(taken)
                    for g in taken:
                        self._inbox.put_nowait(g)
                except (StaleAttempt, LeaseExpired):
                    # a lease in the batch is gone (the others were returned): one by one
                    # for the outcomes (a retry answers the returned ones again)
                    returned = []
                    for g in batch:
                        try:
                            returned += await self._retrying(self.client.return_groups, [g])
                        except (StaleAttempt, LeaseExpired):
                            self.counts["lease_lost"] += 1  # another worker's task now
                for r in returned:
                    self.counts[r.action] += 1
            finally:
                self._returning = False
                self._taking -= want
                self._hunger.set()  # the feeder takes for whoever is still waiting
                self._done(len(batch))

    def _measured(self, name: str, seconds: float) -> None:
        """One more measurement of a return's round trip or a group's generation into
        its running mean; the adaptive prefetch follows them."""
        before = getattr(self, name)
        setattr(self, name, seconds if before is None else before + _EWMA * (seconds - before))
        if self.adaptive and self._round_trip is not None \
                and self._generate_seconds is not None:
            self.prefetch = adaptive_prefetch(self.slots, self._round_trip,
                                              self._generate_seconds)

    async def _retrying(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)`` (a take or a return: both safe to call again), tried again on
        ``StorageUnavailable`` (not a full disk) with backoff until
        ``storage_retry_seconds`` have passed (module docstring); then, or on any other
        error, the error is raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.storage_retry_seconds
        delay = STORAGE_RETRY_FIRST
        while True:
            try:
                return await self._call(fn, arg)
            except QuotaExceeded:
                raise
            except StorageUnavailable:
                if loop.time() + delay > deadline:
                    raise
                self.counts["storage_retried"] += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


def adaptive_prefetch(slots: int, round_trip: float, generate_seconds: float) -> int:
    """Groups to lease ahead so that ``slots`` slots stay busy through one return's
    ``round_trip`` seconds when a group takes ``generate_seconds`` to generate: what they
    finish meanwhile, ``slots x round_trip / generate_seconds`` rounded up, at least 1 and
    at most ``PREFETCH_MAX_FACTOR x slots``."""
    cap = PREFETCH_MAX_FACTOR * slots
    if generate_seconds <= 0:
        return cap
    return max(1, min(cap, math.ceil(slots * round_trip / generate_seconds)))


def check_prefetch(prefetch: object) -> int | None:
    """``prefetch`` checked: None (adaptive: ``adaptive_prefetch``) or an int >= 0."""
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int)
                                 or prefetch < 0):
        raise ValueError(f"prefetch must be None or an int >= 0 (groups leased ahead of "
                         f"the slots), got {prefetch!r}")
    return prefetch


def _check_weight_version(version: object) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"weight_version must be an int >= 0, got {version!r}")


__all__ = ["Producer", "IDLE_SECONDS", "STORAGE_RETRY_SECONDS", "PREFETCH_MAX_FACTOR",
           "adaptive_prefetch", "check_prefetch"]
