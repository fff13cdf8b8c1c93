"""``BatchBuilder``, the facade of the batch builder (``straw.rollout.batches``): it checks
its arguments, holds the builder's collaborators (the consumer, the state, the decoded
groups, the backlog, the collections, the planner and the conversion) and runs
``next_batch`` and ``finish_batch`` through them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from straw.protocol import CommitReceipt
from straw.refs import Publication, RecordSetRef

from ..config import RolloutConfig
from ..environments import EnvironmentMix, MixState
from ..online_gc import OnlineGC
from ..shards import RankBatchRef
from .backlog import Backlog
from .collection import Collections
from .consumer import BuilderConsumer
from .convert import Conversion, ConvertHook, RewardHook
from .entries import Accepted
from .groups import DecodedGroups
from .plan import Planner
from .records import COLLECTION_PREFIX, READY_SCHEMA, digest, json_record
from .state import BuilderState


def _conversion_field(name: str) -> Any:
    """A field of the builder's ``Conversion``, read and set through the builder."""
    return property(lambda self: getattr(self.conversion, name),
                    lambda self, value: setattr(self.conversion, name, value))


class BatchBuilder:
    """Accepted groups -> training batches -> rank shards (``straw.rollout.batches``).

    ``coordinator``/``store``: the controller's queue and a store of its run (the builder
    publishes collections, plans, shards and its state through it).  ``mix``: the
    environments and the batch size in groups (``EnvironmentMix.single(n)`` for one
    environment).  ``dp_size``: data-parallel ranks; ``parallel``: the rest of the
    parallel layout (JSON, e.g. ``{"tp": 8, "cp": 2}``); ``conversion``: the conversion
    configuration (JSON); both enter the plan digest, with the hooks' names and
    ``reward_key`` (which key of a dict reward is the reward)."""

    def __init__(self, coordinator: Any, store: Any, mix: EnvironmentMix, *, dp_size: int,
                 config: RolloutConfig | None = None,
                 conversion: Mapping[str, Any] | None = None,
                 parallel: Mapping[str, Any] | None = None,
                 reward_hook: RewardHook | None = None,
                 convert_hook: ConvertHook | None = None,
                 reward_key: str | None = None,
                 state: Mapping[str, Any] | None = None,
                 exclusive_owner: str = "the job's one BatchBuilder",
                 takeover: bool = False) -> None:
        self.config = _checked(mix, dp_size, config, reward_hook, convert_hook, reward_key)
        self._coord = coordinator
        self.store = store
        self.mix = mix
        self.dp_size = dp_size
        self.planner = Planner(store, dp_size=dp_size, conversion=conversion,
                               parallel=parallel, reward_hook=reward_hook,
                               convert_hook=convert_hook, reward_key=reward_key)
        if self.config.online_gc and not callable(getattr(coordinator, "collect_garbage",
                                                          None)):
            raise ValueError("online GC runs collections in the coordinator's process: with "
                             f"a {type(coordinator).__name__} (another process's queue), "
                             "leave RolloutConfig.online_gc off here and collect garbage "
                             "where the coordinator runs")
        self.consumer = BuilderConsumer(coordinator, store, exclusive_owner=exclusive_owner,
                                        takeover=takeover)
        self.consumer_id = self.consumer.id
        self._token = self.consumer.token
        self._closed = False
        # the background collector (RolloutConfig.online_gc), None when off
        self.online_gc: OnlineGC | None = None
        try:
            saved, progress = self.consumer.load_saved()
            self._state = BuilderState(saved if state is None else dict(state), progress, mix)
            if state is not None and not self._state.is_saved(saved):
                self._save(None)  # request id: restore:<its digest>
        except BaseException:
            self.consumer.close()
            raise
        self.decoded = DecodedGroups(store, mix, self._state)
        self.collections = Collections(coordinator, store)
        self._backlog = Backlog(coordinator, mix, self._state, self.decoded, self.collections)
        self.conversion = Conversion(store, self.decoded, dp_size, self.config.io_concurrency,
                                     reward_hook, convert_hook, reward_key)
        if self.config.online_gc:  # after the restored state is durable
            self.online_gc = OnlineGC(self.coord.collect_garbage)

    # --- the queue and the hooks, shared with the collaborators ------------------------
    @property
    def coord(self) -> Any:
        """The queue's coordinator (set: every collaborator calls the new one)."""
        return self._coord

    @coord.setter
    def coord(self, coordinator: Any) -> None:
        self._coord = coordinator
        self.consumer.coord = self.collections.coord = self._backlog.coord = coordinator

    reward_hook = _conversion_field("reward_hook")
    convert_hook = _conversion_field("convert_hook")
    reward_key = _conversion_field("reward_key")

    # --- state ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The builder state as JSON (what a checkpoint saves; ``state=`` restores it).
        Its size follows what is live (the backlog, unprocessed positions, quarantined
        groups), not the run's length: of the finished batches it keeps the count
        (``finished_count``, e.g. the next rollout id) and the newest ``FINISHED_KEPT``."""
        self._check()
        return {**self._state.fields(), "backlog": [e.to_dict() for e in self._state.backlog]}

    def state_entries(self) -> tuple[dict[str, Any], tuple[Accepted, ...]]:
        """``state()`` without its backlog, and the backlog's entries as they are (a
        checkpoint writes them as columns, ``backlog_columns``, and retains their
        references: no dict per group to build and parse back)."""
        self._check()
        return self._state.fields(), tuple(self._state.backlog)

    def quarantined(self) -> list[dict[str, Any]]:
        """The accepted groups the builder skipped for good, each with its commit
        (``position``, ``task_id``, ``commit_id``) and ``reason`` (``Backlog.scan``)."""
        self._check()
        return [dict(q) for q in self._state.quarantined]

    def metrics(self) -> dict[str, int]:
        """``backlog`` (accepted groups not yet in a batch), ``finished_batches``,
        ``quarantined`` (groups skipped for good: ``quarantined()`` says why)."""
        self._check()
        return {"backlog": len(self._state.backlog),
                "finished_batches": self._state.finished_count,
                "quarantined": len(self._state.quarantined)}

    def _save(self, request_id: str | None) -> dict[str, Any]:
        """Publish and save the consumer state.  ``request_id`` None:
        ``restore:<the state's digest>``."""
        self._check()
        return self.consumer.save(self._state, request_id)

    # --- the backlog --------------------------------------------------------------------
    def decode_ahead(self) -> int:
        """Read and decode the accepted groups committed since the last call (from the
        scan cursor on), so that the scan that reaches them finds them decoded; returns
        how many it decoded.  The one call that may run on another thread while
        ``next_batch``, ``finish_batch`` or ``backlog`` run (it uses only the queue's log
        and the pool, and a table of its own: the builder's state does not change), for a
        controller that decodes while the build waits on its durable writes
        (``ControllerWorker``).  It stops at ``DECODED_TOKENS_KEPT`` tokens decoded and
        not yet scanned.  A group it cannot decode is left to the scan, which quarantines
        it (``Backlog.scan``)."""
        if self._closed:
            return 0
        return self.decoded.decode_ahead(self.coord)

    def backlog(self) -> dict[str, int]:
        """Accepted groups not yet in a batch, per environment (scans the log first)."""
        self._check()
        self._backlog.scan()
        return self._backlog.counts()

    def admits_fresh(self, env: str) -> bool:
        """Whether ``env`` may admit fresh prompts: once its backlog is empty or short of
        the next batch's quota for it (a backlog drains at its share of every batch while
        its admission stays off; ``EnvironmentMix.admits_fresh``)."""
        self._check()
        return self.mix.admits_fresh(env, self.backlog(), self._state.mix_state)

    # --- batches ------------------------------------------------------------------------
    def next_batch(self, rollout_id: int | str) -> list[RankBatchRef] | None:
        """The training batch of ``rollout_id``: one ``RankBatchRef`` per rank, or None
        while the accepted groups cannot fill every environment's quota
        (``straw.rollout.batches``).  Safe to call again after any failure: it replays
        the same plan."""
        self._check()
        if isinstance(rollout_id, bool) or not isinstance(rollout_id, (int, str)) \
                or rollout_id == "":
            raise ValueError(f"rollout_id must be an int or a non-empty str, got "
                             f"{rollout_id!r}")
        rid = str(rollout_id)
        task_id = COLLECTION_PREFIX + rid
        receipt = self.coord.lookup_submission(task_id)
        if receipt is None:
            self._backlog.scan()
            selected = self._backlog.select()
            if selected is None:
                return None
            chosen, after = selected
            receipt = self.collections.collect(task_id, rid, chosen, self._state.mix_state,
                                               after)
        batch_id = "batch:" + receipt.commit_id
        view = self.coord.get_batch(batch_id)
        groups, mix_after = self.collections.collected(receipt)
        plan = self._plan(batch_id, rid, receipt, groups)
        if view is not None and view["ready"]:
            # returned again without writing anything, if this builder would plan it so
            return self.planner.ready_refs(RecordSetRef.from_dict(view["ready_ref"]),
                                           batch_id, plan["digest"])
        plan_ref = self.planner.ensure_planned(self.consumer, batch_id, plan, view)
        # RL3: the plan is durable from here on; hooks only run after this line
        return self._build(batch_id, plan, plan_ref, receipt, groups, mix_after)

    def _plan(self, batch_id: str, rid: str, receipt: CommitReceipt,
              groups: list[Accepted]) -> dict[str, Any]:
        return self.planner.plan(batch_id, rid, receipt, groups)

    def _rewards(self, batch_id: str, groups: list[Accepted]) -> list[list[float]]:
        return self.conversion.rewards(batch_id, groups)

    def _build(self, batch_id: str, plan: dict[str, Any], plan_ref: RecordSetRef,
               receipt: CommitReceipt, groups: list[Accepted],
               mix_after: MixState) -> list[RankBatchRef]:
        shards = self.conversion.shards(batch_id, plan, groups)
        digest_ = plan["digest"]
        ready = {"schema": READY_SCHEMA, "version": 1, "batch_id": batch_id,
                 "plan_digest": digest_, "world": self.dp_size,
                 "ranks": [s.to_dict() for s in shards]}
        # the state after the batch: its groups leave the backlog, the log is fetched
        # past its collection; nothing is acknowledged (RL4: only finish_batch does)
        self._backlog.scan(until=receipt.position + 1)
        taken = {e.commit_id for e in groups}
        self.decoded.forget(taken)
        new_backlog = [e for e in self._state.backlog if e.commit_id not in taken]
        self._check()
        state = {**self._state.fields(), "mix": mix_after.to_dict(),
                 "fetch_cursor": max(self._state.fetch, self._state.scan_cursor)}
        # the ready record published with the state, in one durable write, before
        # batch_ready names them (its shards and plan already durable)
        (ready_ref, state_ref, progress_ref), _ = self.consumer.publish_state(
            state, new_backlog, self._state.finished,
            Publication([json_record("ready", ready)], [*shards, plan_ref]),
            f"{batch_id}:{digest(ready)}")
        self.coord.batch_ready(self.consumer_id, token=self._token, batch_id=batch_id,
                               ready_ref=ready_ref, state_ref=state_ref,
                               fetch_cursor=state["fetch_cursor"],
                               processed_cursor=state["processed_cursor"],
                               progress_ref=progress_ref)
        self._state.backlog, self._state.mix_state = new_backlog, mix_after
        self._state.fetch = state["fetch_cursor"]
        # the queue retains the shards through the ready record now: drop their staging
        # (else they, and the groups their captures name, would outlive the batch)
        self.store.release_publications(shards)
        return [RankBatchRef(batch_id, digest_, r, self.dp_size, s)
                for r, s in enumerate(shards)]

    # --- acknowledgement (RL4) ----------------------------------------------------------
    def finish_batch(self, batch_id: str) -> None:
        """Every rank finished training on ``batch_id``: acknowledge its inputs
        (``straw.rollout.batches``).  Idempotent; an unknown or unready batch is a
        ``ValueError``."""
        self._check()
        view = self.coord.get_batch(batch_id) if isinstance(batch_id, str) and batch_id \
            else None
        if view is None or not view["ready"] or view["consumer_id"] != self.consumer_id:
            raise ValueError(f"cannot finish batch {batch_id!r}: it is not a ready batch of "
                             f"consumer {self.consumer_id!r} (next_batch returns ready "
                             "batches; finish each one after training on it)")
        if view["finished"] or batch_id in self._state.recent:
            return  # the queue's progress lists it: a retry
        # RL4: the only place inputs become processed, after training finished (with
        # the quarantined groups scanned so far: they never train, Backlog.scan)
        self._state.finish(batch_id, view["input_positions"])
        self._save(f"finish:{batch_id}")
        if self.online_gc is not None:
            self.online_gc.request()

    # --- online GC, shutdown ------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise RuntimeError("this BatchBuilder is closed")
        if self.online_gc is not None:
            self.online_gc.check()

    def wait_for_gc(self) -> Any:
        """Block until the background collections requested so far ran (online GC on);
        their last result.  Raises the latched failure."""
        self._check()
        if self.online_gc is None:
            raise RuntimeError("online GC is off (RolloutConfig(online_gc=True) turns it on)")
        return self.online_gc.wait()

    def close(self) -> None:
        """Stop online GC (finishing a pending collection) and give up the consumer;
        raises a latched GC failure (after closing)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.online_gc is not None:
                self.online_gc.close()
        finally:
            try:
                self.consumer.close()
            except Exception:
                if self.online_gc is None or self.online_gc.failure is None:
                    raise

    def __enter__(self) -> BatchBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _checked(mix: EnvironmentMix, dp_size: int, config: RolloutConfig | None,
             reward_hook: Any, convert_hook: Any, reward_key: str | None) -> RolloutConfig:
    """``BatchBuilder``'s arguments checked; its configuration."""
    if not isinstance(mix, EnvironmentMix):
        raise TypeError(f"mix must be an EnvironmentMix, got {type(mix).__name__} (use "
                        "EnvironmentMix.single(batch_size) for one environment)")
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"dp_size must be an int >= 1, got {dp_size!r}")
    out = config if config is not None else RolloutConfig()
    if not isinstance(out, RolloutConfig):
        raise TypeError(f"config must be a RolloutConfig, got {type(config).__name__}")
    for name, hook in (("reward_hook", reward_hook), ("convert_hook", convert_hook)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
    if reward_key is not None and (not isinstance(reward_key, str) or not reward_key):
        raise ValueError(f"reward_key must be a non-empty str or None, got "
                         f"{reward_key!r}")
    return out


__all__ = ["BatchBuilder"]
