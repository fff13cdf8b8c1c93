"""The batch builder (manager side): accepted groups in, one training batch per rollout
out, a shard per data-parallel rank, acknowledgement after training.

An accepted group is a completed prompt task (``prompt:...``) whose result holds
``group_records(group)``.  ``BatchBuilder`` scans the queue's commit log for them (its
*backlog*; a collection commit it meets takes its groups out of the backlog, so a group
is planned in at most one batch, RL2, whatever failed or restarted since), and
``next_batch(rollout_id)``:

1. **composes** the batch with the ``EnvironmentMix``: each environment's quota taken from
   its backlog, oldest weight version first (``scheduling_key``), then FIFO (commit
   position).  Until every quota is filled it returns None (the controller keeps
   generating: ``admits_fresh(env)`` says which environments may admit fresh prompts, the
   producer-side balancing of ``environments``); every batch keeps the proportions.
2. **collects** the selection durably: a control task ``collection:<rollout_id>`` acquired
   by id, its list of group receipts published (depending on the groups) and completed:
   the collection receipt.  ``batch_id = "batch:" + receipt.commit_id``.
3. **plans** (invariant RL3, a planned batch never changes): the plan (the selected groups'
   positions, commit ids and digests, each sample's token count, the rank partition, the
   conversion configuration and the parallel layout) and its digest are published and
   ``plan_batch`` is durable BEFORE any hook runs.  Planning an existing batch id again
   with another plan is ``IdempotencyConflict``; a batch already ready is returned again
   from its ready record without writing anything.
4. **runs the hooks**: ``reward_hook(rewards)`` (per group, the samples' raw rewards ->
   post-processed rewards, e.g. GRPO normalisation) then ``convert_hook(sample, reward)``
   per sample (a dict of train data; the default keeps tokens, lengths, rewards, indices,
   and the captures as lazy ``TensorRef``s: no capture byte is read or copied).  A hook
   that raises, or a reward that is not finite, leaves the batch planned and not ready;
   calling ``next_batch`` again replays the same plan.
5. **publishes every rank's shard** (samples divided by ``partition_by_tokens``), then one
   ready record naming them, then ``batch_ready`` (which saves the builder state with it,
   in one queue transaction) and returns one ``RankBatchRef`` per rank.

``finish_batch(batch_id)`` after training (invariant RL4, nothing acknowledged before its
training finished): the batch's input positions (its groups and its collection) become
processed in the designated consumer's progress and the batch finished, so the queue's
next collection releases them; with ``RolloutConfig.online_gc`` that collection runs in
the background (``online_gc``) and their packs are reclaimed once nothing else holds
them.  No other call acknowledges anything: ``batch_ready`` only advances the fetch
cursor.

Memory: the builder reads each accepted group's record 0 (token ids, rewards, metadata)
and never a capture tensor.  It decodes a group once: the scan's decoded group (checked
there, so a corrupt group is quarantined before any plan names it) is kept for the build
while the kept groups hold at most ``DECODED_TOKENS_KEPT`` tokens; past that budget (a
large backlog, or batches of long samples) a group is read again at build, one group at
a time, so the builder's memory stays bounded whatever the backlog.  ``decode_ahead``
(another thread's, while a build runs) decodes accepted groups before the scan reaches
them, into a table of its own under the same budget; the scan takes them from there.
The converted batch it holds while publishing is the samples' token arrays and
references.

The builder state (``state()``, JSON: scan cursor, backlog, consumer cursors, processed
positions, the count and newest ids of the finished batches, quarantined groups, the
``MixState``) is saved with every ready and finished batch as the consumer's state (in
its stored form, ``STORED_VERSION``: the backlog as one array per field;
``read_stored_state`` turns a record back into ``state()``'s form), so a
new builder on a recovered queue resumes from it; ``BatchBuilder(..., state=saved)``
restores one taken from a checkpoint.  Its size follows what is live, not the run's
length (the queue's progress record is what lists every finished batch).

A builder in a trainer process apart from the controller takes the served coordinator
as ``straw.rpc.RemoteCoordinator(url, token=...)`` (the server's trainer token).  The
consumer has one owner at a time; a trainer restarted after its predecessor died (its
token was not revoked: the coordinator lives on in the controller) opens with
``takeover=True``, which fences the predecessor's token, so one still alive fails its
next save instead of interleaving.

Example (runnable; a generation client completes prompt tasks in a real job)::

    import dataclasses, tempfile
    from straw import Coordinator, SharedFilesystemStore, TaskSpec
    from straw.rollout import BatchBuilder, EnvironmentMix, Sample, SampleGroup, Status
    from straw.rollout.codec import group_records

    root = tempfile.mkdtemp()
    store = SharedFilesystemStore(root, "job")
    coord = Coordinator(store, queue_id="rollout")
    prompt = store.publish([], submission_id="prompt-0")
    coord.submit_tasks("admit-0", [TaskSpec(f"prompt:{i}", input_ref=prompt)
                                   for i in range(2)])
    for a in coord.acquire("gen-0", 2, task_prefix="prompt:").assignments:
        g = SampleGroup(tuple(Sample("2+2?", tokens=(1, 2, 3, 4), response_length=2,
                                     status=Status.COMPLETED, reward=float(j),
                                     group_index=int(a.lease.task_id[7:]), index=j)
                              for j in range(2)))
        records, deps = group_records(g)
        records[0] = dataclasses.replace(records[0], metadata={
            **records[0].metadata, "task_id": a.lease.task_id,
            "attempt_id": a.lease.attempt_id})
        ref = store.publish(records, submission_id=f"group:{a.lease.attempt_id}",
                            dependencies=deps)
        coord.complete_task(a.lease, submission_id=f"result:{a.lease.attempt_id}",
                            result_ref=ref)
    builder = BatchBuilder(coord, store, EnvironmentMix.single(2), dp_size=2)
    refs = builder.next_batch(0)          # one small RankBatchRef per rank
    shard = refs[1].load(store, rank=1)   # on rank 1: only its shard
    builder.finish_batch(refs[0].batch_id)  # after training: acknowledges its inputs
    builder.close(); coord.close(); store.close()
"""

from __future__ import annotations

import array
import concurrent.futures
import hashlib
import json
import math
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from straw.errors import CorruptData, IdempotencyConflict, InvalidReference, UnsupportedSchema
from straw.protocol import CommitReceipt, Lease, TaskSpec
from straw.refs import Publication, Record, RecordRef, RecordSetRef, SegmentRef
from straw.tensor import TensorRef

from .codec import group_from_records
from .config import RolloutConfig
from .data_source import PROMPT_PREFIX
from .environments import EnvironmentMix, MixState
from .online_gc import OnlineGC
from .replay_group import is_replay_group, read_replay_group
from .samples import Sample, SampleGroup, Stage, classify
from .scheduling import scheduling_key
from .shards import RankBatchRef, partition_by_tokens, shard_records

COLLECTION_PREFIX = "collection:"
BUILDER_WORKER = "batch-builder"
STATE_VERSION = 2
# finished batch ids the state keeps (the newest): enough to recognise a retried
# finish_batch and to match a restored state against the queue's progress record
FINISHED_KEPT = 16
PLAN_SCHEMA = "straw.rollout.plan"
READY_SCHEMA = "straw.rollout.ready"
COLLECTION_SCHEMA = "straw.rollout.collection"
_PAGE = 256
# token ids the builder keeps decoded between a group's scan and its build (module
# docstring, "Memory"): a Sample holds its ids as a tuple of Python ints (~40 bytes each
# at worst), so this is ~20 MiB at most; the pipeline's batches (64 groups x 4 x ~260
# tokens) fit several times over
DECODED_TOKENS_KEPT = 1 << 19

RewardHook = Callable[[list[list[Any]]], Sequence[Sequence[float]]]
ConvertHook = Callable[[Sample, float], Mapping[str, Any]]


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


def _digest(value: Any) -> str:
    return hashlib.sha256(_canonical(value)).hexdigest()[:32]


def _json_record(record_id: str, value: Any, metadata: Mapping[str, Any] | None = None
                 ) -> Record:
    return Record(record_id, _canonical(value), "json.v1", dict(metadata or {}))


def _hook_name(hook: Any) -> str | None:
    """A hook's identity in the plan digest: changing the hook changes the plan."""
    if hook is None:
        return None
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


@dataclass(frozen=True)
class Accepted:
    """One accepted group in the backlog: its commit, where its environment and
    scheduling key put it, and its samples' token counts (for rank balancing).

    ``restored``: the group was accepted by ANOTHER queue and restored into this
    builder's backlog (a checkpoint's exact or salvage restore, ``straw.rollout.isolated``):
    its ``commit_id`` is the source queue's, its ``position`` is its rank in the restored
    order, never a commit position of this queue.  Restored groups are selected first, in
    that order (a salvage replays the dead run's batches identically), and their
    positions are never acknowledged on this queue (they are not its commits)."""

    position: int
    commit_id: str
    ref: RecordSetRef
    environment: str
    key: int
    tokens: tuple[int, ...]
    restored: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {"position": self.position, "commit_id": self.commit_id,
               "ref": self.ref.to_dict(), "environment": self.environment, "key": self.key,
               "tokens": list(self.tokens)}
        if self.restored:  # only when set: states and plans written before stay the same
            out["restored"] = True
        return out

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Accepted:
        return cls(int(value["position"]), str(value["commit_id"]),
                   RecordSetRef.from_dict(value["ref"]), str(value["environment"]),
                   int(value["key"]), tuple(map(int, value["tokens"])),
                   bool(value.get("restored", False)))

    def order(self) -> tuple[int, int, int]:
        """Selection order: restored groups first in their restored order, then this
        queue's by oldest weight version (scheduling key), then FIFO."""
        return _order(self.restored, self.key, self.position)


def _order(restored: bool, key: int, position: int) -> tuple[int, int, int]:
    """``Accepted.order`` of an entry's fields (also of a stored table's rows, sorted
    before any entry is built: ``backlog_of_columns``)."""
    return (0, 0, position) if restored else (1, key, position)


class _Untrainable(ValueError):
    """An accepted group that can never enter a batch (``BatchBuilder._scan``)."""


def empty_state(backlog: Sequence[Accepted] = (), mix: MixState | None = None
                ) -> dict[str, Any]:
    """A builder state (``BatchBuilder.state()``) of a queue nothing was read from yet,
    holding ``backlog`` (e.g. restored groups, ``straw.rollout.isolated``)."""
    return {"version": STATE_VERSION, "scan_cursor": 0, "fetch_cursor": 0,
            "processed_cursor": 0, "processed_positions": [], "finished_count": 0,
            "recent_finished": [], "quarantined": [],
            "backlog": [e.to_dict() for e in backlog], "mix": (mix or MixState()).to_dict()}


# The consumer-state record (what ``batch_ready``/``save_consumer_state`` name) holds the
# state in its *stored form*: ``state()`` with version STORED_VERSION and the backlog as
# one array per field (``_COLUMNS``) instead of one JSON object per group.  A backlog of
# 10,000 restored groups was 4.9 MB of JSON, mostly key names repeated per group and per
# reference level, encoded at every save (the restore's first save was a third of its
# CPU).  ``read_stored_state`` reads both forms (a version 2 record, written before, holds
# ``state()`` as it is).
STORED_VERSION = 3
_COLUMNS = ("position", "commit_id", "environment", "key", "tokens", "restored",
            "run_id", "path", "segment_id", "size", "checksum", "segment_version",
            "checksum_algorithm", "offset", "ordinal", "digest", "records",
            "payload_bytes", "ref_tokens")


def backlog_columns(backlog: Sequence[Accepted]) -> dict[str, list[Any]]:
    """``backlog`` in the stored form: one list per field of ``_COLUMNS`` (also the form
    of a checkpoint's backlog, ``straw.rollout.checkpoint``)."""
    refs = [e.ref for e in backlog]
    segs = [r.manifest.segment for r in refs]
    return {"position": [e.position for e in backlog],
            "commit_id": [e.commit_id for e in backlog],
            "environment": [e.environment for e in backlog],
            "key": [e.key for e in backlog],
            "tokens": [list(e.tokens) for e in backlog],
            "restored": [e.restored for e in backlog],
            "run_id": [s.run_id for s in segs], "path": [s.path for s in segs],
            "segment_id": [s.segment_id for s in segs], "size": [s.size for s in segs],
            "checksum": [s.checksum for s in segs],
            "segment_version": [s.version for s in segs],
            "checksum_algorithm": [s.checksum_algorithm for s in segs],
            "offset": [s.offset for s in segs],
            "ordinal": [r.manifest.ordinal for r in refs],
            "digest": [r.digest for r in refs], "records": [r.records for r in refs],
            "payload_bytes": [r.payload_bytes for r in refs],
            "ref_tokens": [r.tokens for r in refs]}


def backlog_of_columns(value: Any, *, restored_from: int | None = None,
                       leave_out: Collection[str] = ()) -> list[Accepted]:
    """The backlog entries of a stored form's columns, in their order, each reference
    checked as ``RecordSetRef.from_dict`` checks it (``CorruptData`` for a malformed
    table; ``InvalidReference``/``UnsupportedSchema`` for a reference not of ours).

    ``restored_from`` (a restore into another queue, ``straw.rollout.isolated``): instead
    the rows whose commit id is not in ``leave_out``, in selection order
    (``Accepted.order``), as restored entries ranked from ``restored_from`` on, which is
    what ``isolated.restored_backlog`` makes of them (it keeps such entries as they are).
    The rows are sorted on the columns and each entry built once: parsing 10,000, sorting
    the entries and building them again for their ranks cost a tenth of a restore."""
    if not isinstance(value, dict) or set(value) != set(_COLUMNS):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise CorruptData(f"the stored builder state's backlog is not a table of the "
                          f"columns {list(_COLUMNS)}: got {got}")
    columns = [value[c] for c in _COLUMNS]
    if not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) > 1:
        raise CorruptData("the stored builder state's backlog columns are not lists of one "
                          "length: the record was edited or damaged")
    (_, _, _, _, _, _, run_id, path, segment_id, size, checksum, version, algorithm, offset,
     ordinal, digest, records, payload_bytes, ref_tokens) = columns
    out = []
    try:
        # the entries' own fields converted column by column (as from_dict converts them)
        position, key = list(map(int, columns[0])), list(map(int, columns[3]))
        commit_id, env = list(map(str, columns[1])), list(map(str, columns[2]))
        tokens = [tuple(map(int, t)) for t in columns[4]]
        restored = list(map(bool, columns[5]))
        rows: Sequence[int] = range(len(position))
        if restored_from is not None:
            skip = set(leave_out)
            rows = sorted((i for i in rows if commit_id[i] not in skip),
                          key=lambda i: _order(restored[i], key[i], position[i]))
        for rank, i in enumerate(rows, restored_from or 0):
            ref = RecordSetRef(RecordRef(SegmentRef(
                run_id[i], path[i], segment_id[i], size[i], checksum[i], version[i],
                algorithm[i], offset[i]), ordinal[i]), digest[i], records[i],
                payload_bytes[i], ref_tokens[i])
            ref.check()  # InvalidReference / UnsupportedSchema, as from_dict raises them
            if restored_from is None:
                out.append(Accepted(position[i], commit_id[i], ref, env[i], key[i],
                                    tokens[i], restored[i]))
            else:
                out.append(Accepted(rank, commit_id[i], ref, env[i], key[i], tokens[i],
                                    True))
    except (InvalidReference, UnsupportedSchema):
        raise  # a reference that is not one of ours: refused as everywhere else
    except (TypeError, ValueError) as e:
        raise CorruptData(f"the stored builder state's backlog holds a malformed entry: "
                          f"{e}") from None
    return out


def read_stored_state(value: Any) -> dict[str, Any]:
    """A consumer-state record's JSON value as ``state()`` returns it (backlog entries as
    dicts): for code that reads the builder's saved state from the queue (a version 2
    record, or a version 1 one, is returned as it is)."""
    if isinstance(value, dict) and value.get("version") == STORED_VERSION:
        return {**value, "version": STATE_VERSION,
                "backlog": [e.to_dict() for e in backlog_of_columns(value.get("backlog"))]}
    return value  # type: ignore[no-any-return]


def read_accepted(store: Any, mix: EnvironmentMix, receipt: CommitReceipt) -> Accepted:
    """The backlog entry of an accepted group's commit ``receipt`` (its record 0 read,
    no capture byte): what a builder scanning the log adds, and what a salvage reads
    from a dead run's log."""
    return _accepted_of(mix, receipt, _scanned_group(store, receipt))


def _where(receipt: CommitReceipt) -> str:
    return f"accepted group of task {receipt.task_id!r} (commit {receipt.position})"


def _scanned_group(store: Any, receipt: CommitReceipt) -> SampleGroup:
    """The group of an accepted commit, decoded and checked (``_Untrainable`` if its
    stored bytes are corrupt or of another schema)."""
    try:
        return lazy_group(store, receipt.result_ref)
    except (CorruptData, UnsupportedSchema) as e:
        raise _Untrainable(f"{_where(receipt)}: {type(e).__name__}: {e}") from None


def _accepted_of(mix: EnvironmentMix, receipt: CommitReceipt, group: SampleGroup
                 ) -> Accepted:
    """The backlog entry of ``group``, accepted by ``receipt`` (``_Untrainable`` if it is
    not ready)."""
    where = _where(receipt)
    if classify(group) is not Stage.READY:
        bad = next(i for i, s in enumerate(group.samples) if not s.finished)
        raise _Untrainable(f"{where} is not ready: sample {bad} is "
                           f"{group.samples[bad].status.value} with reward "
                           f"{group.samples[bad].reward!r}; complete only groups whose "
                           "samples are all completed or truncated and scored")
    env = mix.environment_of(group)
    return Accepted(receipt.position, receipt.commit_id, receipt.result_ref, env,
                    scheduling_key(group), tuple(len(s.tokens) for s in group.samples))


def lazy_group(store: Any, ref: RecordSetRef) -> SampleGroup:
    """A group with its captures lazy: the manifest and record 0 only (of a replayed
    group, ``straw.rollout.replay_group``: record 0 of the archive chunks it names)."""
    manifest = store.checked_manifest(ref)
    if not manifest.record_refs:
        raise CorruptData(f"accepted group {ref!r} has no records")
    if is_replay_group(manifest):
        return read_replay_group(store, ref, manifest)
    head = store.read_record(manifest.record_refs[0])
    # record 0 alone: no capture tensor to bind (the pipeline's groups; skips a second
    # manifest look-up per group)
    tensors = TensorRef.from_record_set_many(store, ref) if len(manifest.record_refs) > 1 \
        else {}
    return group_from_records([head], tensors=tensors, lazy_tensors_over=0, store=store)


# a C int is 4 bytes on every platform we run on (checked: NumPy is the fallback)
_INT32_CODE = "i" if array.array("i").itemsize == 4 else None


def _token_array(tokens: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """The ids as an int32 array when they all fit (every vocabulary in use), else int64:
    one C pass that fails on the first id past int32 (half the cost of an int64 array
    plus its min and max; this runs for every sample of every batch)."""
    if _INT32_CODE is not None:
        try:
            return np.frombuffer(array.array(_INT32_CODE, tokens), dtype=np.int32)
        except OverflowError:
            return np.asarray(tokens, dtype=np.int64)
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size == 0 or (int(ids.min()) >= -(2**31) and int(ids.max()) < 2**31):
        ids = ids.astype(np.int32)
    return ids


def default_convert(sample: Sample, reward: float) -> dict[str, Any]:
    """The default train data of a sample: token ids (int32/int64 array), lengths,
    reward (post-processed) and raw reward, status, indices, metadata, and the capture
    tensors as they are (lazy ``TensorRef``s: stored as references, never copied)."""
    decoded = sample.int32_ids()  # a stored group's sample: its array, no round trip
    tokens = decoded.copy() if decoded is not None else _token_array(sample.tokens)
    return {"tokens": tokens, "response_length": sample.response_length,
            "reward": reward, "raw_reward": sample.reward, "status": sample.status.value,
            "group_index": sample.group_index, "index": sample.index,
            "metadata": dict(sample.metadata), "routes": sample.routes,
            "topk_ids": sample.topk_ids, "topk_logprobs": sample.topk_logprobs}


class BatchBuilder:
    """Accepted groups -> training batches -> rank shards (module docstring).

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
        if not isinstance(mix, EnvironmentMix):
            raise TypeError(f"mix must be an EnvironmentMix, got {type(mix).__name__} (use "
                            "EnvironmentMix.single(batch_size) for one environment)")
        if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
            raise ValueError(f"dp_size must be an int >= 1, got {dp_size!r}")
        self.config = config if config is not None else RolloutConfig()
        if not isinstance(self.config, RolloutConfig):
            raise TypeError(f"config must be a RolloutConfig, got {type(config).__name__}")
        for name, hook in (("reward_hook", reward_hook), ("convert_hook", convert_hook)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
        if reward_key is not None and (not isinstance(reward_key, str) or not reward_key):
            raise ValueError(f"reward_key must be a non-empty str or None, got "
                             f"{reward_key!r}")
        self.coord = coordinator
        self.store = store
        self.mix = mix
        self.dp_size = dp_size
        self.reward_hook = reward_hook
        self.convert_hook = convert_hook
        self.reward_key = reward_key
        # what the plan digest covers besides the selection
        try:
            self._configuration = json.loads(_canonical({
                "conversion": dict(conversion or {}), "reward_key": reward_key,
                "reward_hook": _hook_name(reward_hook),
                "convert_hook": _hook_name(convert_hook)}))
            self._parallel = json.loads(_canonical({**dict(parallel or {}),
                                                    "dp_size": dp_size}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"conversion and parallel must be JSON mappings: {e}") from None
        if self.config.online_gc and not callable(getattr(coordinator, "collect_garbage",
                                                          None)):
            raise ValueError("online GC runs collections in the coordinator's process: with "
                             f"a {type(coordinator).__name__} (another process's queue), "
                             "leave RolloutConfig.online_gc off here and collect garbage "
                             "where the coordinator runs")
        self.consumer_id = coordinator.consumer_id
        # takeover=True: this builder succeeds one whose process died holding the
        # consumer (a trainer apart from the controller: no recovery revoked its token);
        # the old token is fenced, so a predecessor still alive can write nothing more
        open_args = {"takeover": True} if takeover else {}
        self._token = coordinator.open_consumer(self.consumer_id,
                                                exclusive_owner=exclusive_owner, **open_args)
        self._closed = False
        # the background collector (RolloutConfig.online_gc), None when off
        self.online_gc: OnlineGC | None = None
        try:
            saved, progress = self._load_saved()
            self._set_state(saved if state is None else dict(state), progress)
            if state is not None and not self._is_saved(saved):
                self._save(None)  # request id: restore:<its digest>
        except BaseException:
            coordinator.close_consumer(self.consumer_id, self._token)
            raise
        if self.config.online_gc:  # after the restored state is durable
            self.online_gc = OnlineGC(self.coord.collect_garbage)

    # --- state ----------------------------------------------------------------------------
    def _empty_state(self) -> dict[str, Any]:
        return empty_state()

    def _load_saved(self) -> tuple[dict[str, Any], list[str]]:
        """The saved builder state and the finished batches of the saved progress."""
        view = self.coord.load_consumer_state(self.consumer_id)
        if view is None:
            return self._empty_state(), []
        state = self._read_json(RecordSetRef.from_dict(view["state_ref"]), "builder state")
        if isinstance(state, dict) and state.get("version") == STORED_VERSION:
            # the stored form: its backlog parsed into entries at once (no dicts between)
            state = {**state, "version": STATE_VERSION,
                     "backlog": backlog_of_columns(state.get("backlog"))}
        progress: list[str] = []
        if view.get("progress_ref"):
            value = self._read_json(RecordSetRef.from_dict(view["progress_ref"]),
                                    "builder progress")
            if isinstance(value, dict) and isinstance(value.get("finished_batches"), list):
                progress = [str(b) for b in value["finished_batches"]]
        return state, progress

    def _set_state(self, value: Mapping[str, Any], progress: Sequence[str]) -> None:
        """Adopt ``value`` (``state()``'s form; a version 1 state, with every finished
        batch listed, is read too).  ``progress``: the finished batches the queue's saved
        progress lists, in finishing order."""
        keys = set(self._empty_state())
        if isinstance(value, Mapping) and value.get("version") == 1 \
                and isinstance(value.get("finished_batches"), list):
            listed = [str(b) for b in value["finished_batches"]]
            value = {**{k: v for k, v in value.items() if k != "finished_batches"},
                     "version": STATE_VERSION, "finished_count": len(listed),
                     "recent_finished": listed[-FINISHED_KEPT:], "quarantined": []}
            progress = listed
        if not isinstance(value, Mapping) or set(value) != keys \
                or value.get("version") != STATE_VERSION:
            raise ValueError(f"a builder state is a mapping with version {STATE_VERSION} and "
                             f"keys {sorted(keys)} (BatchBuilder.state()), got "
                             f"{sorted(value) if isinstance(value, Mapping) else value!r}")
        self._scan_cursor = int(value["scan_cursor"])
        self._fetch = int(value["fetch_cursor"])
        self._processed = int(value["processed_cursor"])
        self._sparse = sorted(int(p) for p in value["processed_positions"])
        self._finished_count = int(value["finished_count"])
        self._recent = [str(b) for b in value["recent_finished"]][-FINISHED_KEPT:]
        # every finished batch, for the progress record: the queue releases a batch's
        # plan and ready data while its consumer's progress lists it (a list without it
        # would make them needed again), so that list is cumulative; the state keeps only
        # its count and newest ids, and the list is the saved progress's first
        # ``finished_count`` (a restored state whose newest ids are not there brings its
        # own, e.g. into another queue)
        prefix = list(progress[:self._finished_count])
        n = len(self._recent)
        self._finished = prefix if len(prefix) >= n and prefix[len(prefix) - n:] == \
            self._recent else list(self._recent)
        self._quarantined = [dict(q) for q in value["quarantined"]]
        # an entry may be an Accepted already (a restore hands over the groups it parsed
        # and retained: parsing 10,000 references again cost a third of the restore)
        self._backlog = [e if isinstance(e, Accepted) else Accepted.from_dict(e)
                         for e in value["backlog"]]
        missing = sorted({e.environment for e in self._backlog} - set(self.mix.environments))
        if missing:
            # at open, naming them: not a KeyError at the first next_batch
            raise ValueError(
                f"the restored backlog holds groups of environments {missing} that the "
                f"configured mix ({list(self.mix.environments)}) does not have: configure "
                "them (any weight) to train those groups, or restore another checkpoint")
        # the scanned groups kept decoded for their build (commit id -> group; "Memory")
        self._kept: dict[str, SampleGroup] = {}
        self._kept_tokens = 0
        # groups ``decode_ahead`` (another thread) decoded before the scan reached them:
        # commit id -> (position, group, tokens), until the scan takes them; its own lock
        # and budget, its own read position in the log
        self._ahead_lock = threading.Lock()
        self._ahead: dict[str, tuple[int, SampleGroup, int]] = {}
        self._ahead_tokens = 0
        self._ahead_cursor = self._scan_cursor
        # the collections this builder committed, by commit id, until its scan passes
        # them: (publication, groups, mix state after) as written (``_collected``)
        self._own_collections: dict[str, tuple[RecordSetRef, tuple[Accepted, ...],
                                               MixState]] = {}
        self._mix_state = MixState.from_dict(value["mix"])
        self.mix.quota(self._mix_state)  # checks its environments against the mix

    def state(self) -> dict[str, Any]:
        """The builder state as JSON (what a checkpoint saves; ``state=`` restores it).
        Its size follows what is live (the backlog, unprocessed positions, quarantined
        groups), not the run's length: of the finished batches it keeps the count
        (``finished_count``, e.g. the next rollout id) and the newest ``FINISHED_KEPT``."""
        self._check()
        return {**self._state_fields(), "backlog": [e.to_dict() for e in self._backlog]}

    def state_entries(self) -> tuple[dict[str, Any], tuple[Accepted, ...]]:
        """``state()`` without its backlog, and the backlog's entries as they are (a
        checkpoint writes them as columns, ``backlog_columns``, and retains their
        references: no dict per group to build and parse back)."""
        self._check()
        return self._state_fields(), tuple(self._backlog)

    def _state_fields(self) -> dict[str, Any]:
        """``state()`` without its backlog (the stored form encodes that apart)."""
        return {"version": STATE_VERSION, "scan_cursor": self._scan_cursor,
                "fetch_cursor": self._fetch, "processed_cursor": self._processed,
                "processed_positions": list(self._sparse),
                "finished_count": self._finished_count,
                "recent_finished": list(self._recent),
                "quarantined": [dict(q) for q in self._quarantined],
                "mix": self._mix_state.to_dict()}

    def _is_saved(self, saved: Mapping[str, Any]) -> bool:
        """Whether the adopted state is ``saved`` (``_load_saved``'s) already: then it is
        durable as it is, nothing to save."""
        fields = self._state_fields()
        if {k: v for k, v in saved.items() if k != "backlog"} != fields:
            return False
        entries = list(saved.get("backlog", ()))
        if len(entries) != len(self._backlog):
            return False
        return all((e if isinstance(e, Accepted) else Accepted.from_dict(e)) == mine
                   for e, mine in zip(entries, self._backlog, strict=True))

    def quarantined(self) -> list[dict[str, Any]]:
        """The accepted groups the builder skipped for good, each with its commit
        (``position``, ``task_id``, ``commit_id``) and ``reason`` (see ``_scan``)."""
        self._check()
        return [dict(q) for q in self._quarantined]

    def metrics(self) -> dict[str, int]:
        """``backlog`` (accepted groups not yet in a batch), ``finished_batches``,
        ``quarantined`` (groups skipped for good: ``quarantined()`` says why)."""
        self._check()
        return {"backlog": len(self._backlog), "finished_batches": self._finished_count,
                "quarantined": len(self._quarantined)}

    def _publish_state(self, state: Mapping[str, Any], backlog: Sequence[Accepted],
                       ready: Publication | None = None,
                       ready_id: str = "") -> tuple[list[RecordSetRef], str]:
        """The consumer state and progress records (the progress depends on the state),
        after ``ready`` (a batch's ready record, ``ready_id`` naming its content) when
        given: ``[ready_ref,] state_ref, progress_ref``, in ONE durable write (one sync
        for all of them instead of one each: this runs for every ready and finished
        batch), and the state's digest.  The state is encoded once: its record's payload
        and its digest are the same canonical bytes (a restored backlog of 10,000 groups
        was encoded three times)."""
        # the stored form (STORED_VERSION): the backlog as columns, from its entries
        body = {**state, "version": STORED_VERSION, "backlog": backlog_columns(backlog)}
        encoded = _canonical(body)
        digest = hashlib.sha256(encoded).hexdigest()[:32]  # = _digest(body)
        progress = {"version": 1, "processed_positions": body["processed_positions"],
                    "finished_batches": list(self._finished)}
        before = [] if ready is None else [ready]
        pubs = [*before, Publication([Record("builder-state", encoded, "json.v1", {})]),
                Publication([_json_record("progress", progress)], dependencies=[len(before)])]
        prefix = "builder-state" if ready is None else f"ready:{ready_id}"
        refs = self.store.publish_many(
            pubs, submission_id=f"{prefix}:{_digest([digest, progress])}")
        return refs, digest

    def _save(self, request_id: str | None) -> dict[str, Any]:
        """Publish and save the consumer state.  ``request_id`` None:
        ``restore:<the state's digest>``."""
        self._check()
        state = self._state_fields()
        (state_ref, progress_ref), digest = self._publish_state(state, self._backlog)
        return self.coord.save_consumer_state(
            self.consumer_id, token=self._token,
            request_id=f"restore:{digest}" if request_id is None else request_id,
            state_ref=state_ref, fetch_cursor=state["fetch_cursor"],
            processed_cursor=state["processed_cursor"], progress_ref=progress_ref)

    # --- reading ------------------------------------------------------------------------
    def _read_json(self, ref: RecordSetRef, what: str) -> Any:
        records = list(self.store.read(ref))
        if len(records) != 1 or records[0].codec != "json.v1":
            raise CorruptData(f"{what} {ref!r} is not one json.v1 record")
        try:
            return json.loads(bytes(records[0].payload))
        except ValueError as e:
            raise CorruptData(f"{what} {ref!r} is not valid JSON: {e}") from None

    def _group(self, ref: RecordSetRef) -> SampleGroup:
        return lazy_group(self.store, ref)

    def _accepted(self, receipt: CommitReceipt) -> Accepted:
        with self._ahead_lock:
            ahead = self._ahead.pop(receipt.commit_id, None)
            if ahead is not None:
                self._ahead_tokens -= ahead[2]
        group = ahead[1] if ahead is not None else _scanned_group(self.store, receipt)
        entry = _accepted_of(self.mix, receipt, group)
        self._keep(entry.commit_id, group)
        return entry

    def _keep(self, commit_id: str, group: SampleGroup) -> None:
        """Keep ``group`` decoded for its build, within the token budget."""
        tokens = sum(len(s.tokens) for s in group.samples)
        if self._kept_tokens + tokens <= DECODED_TOKENS_KEPT and commit_id not in self._kept:
            self._kept[commit_id] = group
            self._kept_tokens += tokens

    def _forget(self, commit_ids: set[str]) -> None:
        """Drop the kept groups of ``commit_ids`` (they left the backlog)."""
        for c in commit_ids & self._kept.keys():
            group = self._kept.pop(c)
            self._kept_tokens -= sum(len(s.tokens) for s in group.samples)

    def _batch_group(self, e: Accepted) -> SampleGroup:
        """A selected group for the build: the scan's decoded one if kept, else read."""
        kept = self._kept.get(e.commit_id)
        return kept if kept is not None else self._group(e.ref)

    def decode_ahead(self) -> int:
        """Read and decode the accepted groups committed since the last call (from the
        scan cursor on), so that the scan that reaches them finds them decoded; returns
        how many it decoded.  The one call that may run on another thread while
        ``next_batch``, ``finish_batch`` or ``backlog`` run (it uses only the queue's log
        and the pool, and a table of its own: the builder's state does not change), for a
        controller that decodes while the build waits on its durable writes: decoding
        was the largest part of a build's CPU (``ControllerWorker``).  It stops at
        ``DECODED_TOKENS_KEPT`` tokens decoded and not yet scanned.  A group it cannot
        decode is left to the scan, which quarantines it (``_scan``)."""
        if self._closed:
            return 0
        with self._ahead_lock:
            cursor = max(self._ahead_cursor, self._scan_cursor)
        decoded = 0
        while True:
            page = self.coord.read_commits(cursor, _PAGE)
            for receipt in page.commits:
                if not receipt.task_id.startswith(PROMPT_PREFIX):
                    continue
                with self._ahead_lock:
                    if self._ahead_tokens >= DECODED_TOKENS_KEPT:
                        self._ahead_cursor = receipt.position  # (not decoded yet)
                        return decoded  # the scan has enough to take for now
                try:
                    group = _scanned_group(self.store, receipt)
                except _Untrainable:
                    continue
                tokens = sum(len(x.tokens) for x in group.samples)
                with self._ahead_lock:
                    # (not if the scan passed it meanwhile: it decoded it itself)
                    if receipt.position >= self._scan_cursor:
                        self._ahead[receipt.commit_id] = (receipt.position, group, tokens)
                        self._ahead_tokens += tokens
                        decoded += 1
            if page.cursor == cursor:
                break
            cursor = page.cursor
        with self._ahead_lock:
            self._ahead_cursor = cursor
        return decoded

    def _drop_passed_ahead(self) -> None:
        """Forget decoded-ahead groups the scan passed without taking (another
        builder's collection took them, or the scan raced ``decode_ahead``)."""
        with self._ahead_lock:
            passed = [c for c, (pos, _, _) in self._ahead.items() if pos < self._scan_cursor]
            for c in passed:
                self._ahead_tokens -= self._ahead.pop(c)[2]

    def _scan(self, until: int | None = None) -> None:
        """Add the accepted groups committed since the scan cursor to the backlog (up to
        position ``until`` exclusive, else to the end of the durable log).

        A group that can never be trained (its stored bytes are corrupt or of another
        schema, or it is not ready) is **quarantined**, not retried: skipped with its
        reason in ``quarantined()`` (and the state, saved with the next batch), so the
        groups after it flow.  The next ``finish_batch`` acknowledges its position with
        the batch's (it will never train; else the processed cursor would stop there for
        good).  A group of an environment the mix does not configure still raises: that
        is this builder's configuration to fix, not the group's fault."""
        while until is None or self._scan_cursor < until:
            limit = _PAGE if until is None else min(_PAGE, until - self._scan_cursor)
            page = self.coord.read_commits(self._scan_cursor, limit)
            for receipt in page.commits:
                if receipt.task_id.startswith(PROMPT_PREFIX):
                    try:
                        self._backlog.append(self._accepted(receipt))
                    except _Untrainable as e:
                        self._quarantined.append({
                            "position": receipt.position, "task_id": receipt.task_id,
                            "commit_id": receipt.commit_id, "reason": str(e)})
                elif receipt.task_id.startswith(COLLECTION_PREFIX):
                    # RL2: a collected group belongs to that collection's batch from now
                    # on, ready or not (a later rollout never selects it again)
                    # (by commit id: restored groups' positions are not this queue's)
                    taken = {e.commit_id for e in self._collected(receipt)[0]}
                    self._own_collections.pop(receipt.commit_id, None)
                    self._backlog = [e for e in self._backlog if e.commit_id not in taken]
                    if self._kept:  # kept for a build: another builder's collection
                        self._forget(taken)
            if page.cursor == self._scan_cursor:
                if until is not None:
                    raise RuntimeError(f"commit {until - 1} is not durable yet")
                break
            self._scan_cursor = page.cursor
        if self._ahead:
            self._drop_passed_ahead()

    # --- composition --------------------------------------------------------------------
    def backlog(self) -> dict[str, int]:
        """Accepted groups not yet in a batch, per environment (scans the log first)."""
        self._check()
        self._scan()
        return self._counts()

    def _counts(self) -> dict[str, int]:
        counts = {env: 0 for env in self.mix.environments}
        for e in self._backlog:
            counts[e.environment] += 1
        return counts

    def admits_fresh(self, env: str) -> bool:
        """Whether ``env`` may admit fresh prompts: once its backlog is empty or short of
        the next batch's quota for it (a backlog drains at its share of every batch while
        its admission stays off; ``EnvironmentMix.admits_fresh``)."""
        self._check()
        return self.mix.admits_fresh(env, self.backlog(), self._mix_state)

    def _select(self) -> tuple[list[Accepted], MixState] | None:
        composition, after = self.mix.compose(self._mix_state, self._counts())
        if any(composition.fresh.values()):
            return None  # an environment's quota is not filled yet
        chosen: list[Accepted] = []
        for env in self.mix.environments:
            mine = sorted((e for e in self._backlog if e.environment == env),
                          key=Accepted.order)
            chosen += mine[:composition.from_backlog[env]]
        chosen.sort(key=Accepted.order)
        return chosen, after

    # --- collection ---------------------------------------------------------------------
    def _collection_lease(self, task_id: str) -> Lease | None:
        self.coord.submit_tasks(task_id, [TaskSpec(task_id, control=True,
                                                   estimated_records=0)])
        got = self.coord.acquire(BUILDER_WORKER, 1, task_ids=[task_id], control=True)
        if got.assignments:
            return got.assignments[0].lease
        status = self.coord.task_status(task_id)
        if status is not None and status["state"] == "leased" and status["lease"]:
            return Lease(**status["lease"])  # ours, from before a lost reply or a restart
        return None

    def _collect(self, task_id: str, rollout_id: str, chosen: list[Accepted],
                 before: MixState, after: MixState) -> CommitReceipt:
        lease = self._collection_lease(task_id)
        if lease is None:
            receipt = self.coord.lookup_submission(task_id)
            if receipt is None:
                status = self.coord.task_status(task_id)
                raise RuntimeError(f"collection task {task_id!r} cannot be acquired (state "
                                   f"{status and status['state']!r}); it was cancelled or "
                                   "failed: use a new rollout id")
            return receipt
        body = {"schema": COLLECTION_SCHEMA, "version": 1, "rollout_id": rollout_id,
                "groups": [e.to_dict() for e in chosen], "mix_before": before.to_dict(),
                "mix_after": after.to_dict()}
        ref = self.store.publish(
            [_json_record("collection", body, {"task_id": lease.task_id,
                                               "attempt_id": lease.attempt_id})],
            submission_id=f"collection:{lease.attempt_id}",
            dependencies=[e.ref for e in chosen])
        receipt = self.coord.complete_task(lease, submission_id=task_id, result_ref=ref,
                                           result_digest=ref.digest)
        if receipt.result_ref == ref:  # the commit names what was just written: keep it
            # (until the scan passes the commit: at most the batches being built)
            self._own_collections[receipt.commit_id] = (ref, tuple(chosen), after)
        return receipt

    # --- batches ------------------------------------------------------------------------
    def next_batch(self, rollout_id: int | str) -> list[RankBatchRef] | None:
        """The training batch of ``rollout_id``: one ``RankBatchRef`` per rank, or None
        while the accepted groups cannot fill every environment's quota (module
        docstring).  Safe to call again after any failure: it replays the same plan."""
        self._check()
        if isinstance(rollout_id, bool) or not isinstance(rollout_id, (int, str)) \
                or rollout_id == "":
            raise ValueError(f"rollout_id must be an int or a non-empty str, got "
                             f"{rollout_id!r}")
        rid = str(rollout_id)
        task_id = COLLECTION_PREFIX + rid
        receipt = self.coord.lookup_submission(task_id)
        if receipt is None:
            self._scan()
            selected = self._select()
            if selected is None:
                return None
            chosen, after = selected
            receipt = self._collect(task_id, rid, chosen, self._mix_state, after)
        batch_id = "batch:" + receipt.commit_id
        view = self.coord.get_batch(batch_id)
        groups, mix_after = self._collected(receipt)
        plan = self._plan(batch_id, rid, receipt, groups)
        if view is not None and view["ready"]:
            # returned again without writing anything, if this builder would plan it so
            return self._ready_refs(RecordSetRef.from_dict(view["ready_ref"]), batch_id,
                                    plan["digest"])
        plan_ref = self._ensure_planned(batch_id, plan, view)
        # RL3: the plan is durable from here on; hooks only run after this line
        return self._build(batch_id, plan, plan_ref, receipt, groups, mix_after)

    def _collection(self, receipt: CommitReceipt) -> dict[str, Any]:
        value = self._read_json(receipt.result_ref, f"collection {receipt.task_id!r}")
        if not isinstance(value, dict) or value.get("schema") != COLLECTION_SCHEMA:
            raise CorruptData(f"the result of {receipt.task_id!r} is not a "
                              f"{COLLECTION_SCHEMA}")
        return value

    def _collected(self, receipt: CommitReceipt) -> tuple[list[Accepted], MixState]:
        """The groups of a collection commit and the mix state after it: as this builder
        wrote them when the receipt names its own collection publication (``_collect``;
        parsing 64 references back was a tenth of a batch's build), else read and
        parsed from the pool."""
        own = self._own_collections.get(receipt.commit_id)
        if own is not None and own[0] == receipt.result_ref:
            return list(own[1]), own[2]
        value = self._collection(receipt)
        return ([Accepted.from_dict(e) for e in value["groups"]],
                MixState.from_dict(value["mix_after"]))

    def _plan(self, batch_id: str, rid: str, receipt: CommitReceipt,
              groups: list[Accepted]) -> dict[str, Any]:
        flat = [(g, j) for g in range(len(groups)) for j in range(len(groups[g].tokens))]
        parts = partition_by_tokens([groups[g].tokens[j] for g, j in flat], self.dp_size)
        # restored groups are not commits of this queue: nothing of theirs to acknowledge
        positions = sorted({receipt.position, *(e.position for e in groups if not e.restored)})
        plan: dict[str, Any] = {
            "schema": PLAN_SCHEMA, "version": 1, "batch_id": batch_id, "rollout_id": rid,
            "collection": {"position": receipt.position, "commit_id": receipt.commit_id,
                           "digest": receipt.digest},
            "groups": [{"position": e.position, "commit_id": e.commit_id,
                        "digest": e.ref.digest, "environment": e.environment,
                        "tokens": list(e.tokens), **({"restored": True} if e.restored else {})}
                       for e in groups],
            "partition": [[list(flat[i]) for i in part] for part in parts],
            "configuration": self._configuration, "parallel": self._parallel,
            "input_positions": positions}
        plan["digest"] = _digest(plan)
        return plan

    def _ensure_planned(self, batch_id: str, plan: dict[str, Any],
                        view: Mapping[str, Any] | None) -> RecordSetRef:
        if view is not None:
            ref = RecordSetRef.from_dict(view["plan_ref"])
            stored = self._read_json(ref, f"plan of batch {batch_id!r}")
            if not isinstance(stored, dict) or stored.get("digest") != plan["digest"]:
                raise IdempotencyConflict(
                    f"batch {batch_id!r} was planned with another selection, conversion "
                    f"configuration or parallel layout (plan {stored.get('digest')!r}, now "
                    f"{plan['digest']!r}); an existing batch id cannot be reused with "
                    "another plan: restore the configuration it was planned with")
            return ref
        ref = self.store.publish([_json_record("plan", plan)],
                                 submission_id=f"plan:{batch_id}:{plan['digest']}")
        self.coord.plan_batch(self.consumer_id, token=self._token, batch_id=batch_id,
                              input_positions=plan["input_positions"], plan_ref=ref)
        return ref

    def _raw_reward(self, group: SampleGroup, g: int, j: int, batch_id: str) -> Any:
        reward = group.samples[j].reward
        if isinstance(reward, dict) and self.reward_hook is None:
            if self.reward_key is None or self.reward_key not in reward:
                raise ValueError(f"batch {batch_id!r} group {g} sample {j} has the reward "
                                 f"mapping {sorted(reward)}: pass reward_key= (one of them) "
                                 "or a reward_hook that makes one number per sample")
            return reward[self.reward_key]
        return reward

    def _rewards(self, batch_id: str, groups: list[Accepted]) -> list[list[float]]:
        raw: list[list[Any]] = []
        for g, e in enumerate(groups):
            group = self._batch_group(e)
            self._keep(e.commit_id, group)  # for the conversion, within the budget
            raw.append([self._raw_reward(group, g, j, batch_id)
                        for j in range(len(group.samples))])
        out = self.reward_hook(raw) if self.reward_hook is not None else raw
        if len(out) != len(raw):
            raise ValueError(f"batch {batch_id!r}: the reward hook returned {len(out)} "
                             f"groups for {len(raw)}")
        checked: list[list[float]] = []
        for g, (got, want) in enumerate(zip(out, raw, strict=True)):
            got = list(got)
            if len(got) != len(want):
                raise ValueError(f"batch {batch_id!r} group {g}: the reward hook returned "
                                 f"{len(got)} rewards for {len(want)} samples")
            row = []
            for j, r in enumerate(got):
                value = float(r) if isinstance(r, (int, float, np.floating, np.integer)) \
                    and not isinstance(r, bool) else math.nan
                if not math.isfinite(value):
                    raise ValueError(f"batch {batch_id!r} group {g} (commit "
                                     f"{groups[g].position}) sample {j}: reward {r!r} is "
                                     "not a finite number; the batch stays planned, not "
                                     "ready: fix the reward hook and call next_batch again")
                row.append(value)
            checked.append(row)
        return checked

    def _build(self, batch_id: str, plan: dict[str, Any], plan_ref: RecordSetRef,
               receipt: CommitReceipt, groups: list[Accepted],
               mix_after: MixState) -> list[RankBatchRef]:
        rewards = self._rewards(batch_id, groups)
        owner: dict[tuple[int, int], int] = {}
        for rank, part in enumerate(plan["partition"]):
            for g, j in part:
                owner[(g, j)] = rank
        converted: dict[tuple[int, int], Mapping[str, Any]] = {}
        for g, e in enumerate(groups):  # one group at a time: captures stay lazy
            group = self._batch_group(e)
            for j, sample in enumerate(group.samples):
                item = (self.convert_hook(sample, rewards[g][j])
                        if self.convert_hook is not None else default_convert(
                            sample, rewards[g][j]))
                if not isinstance(item, Mapping):
                    raise TypeError(f"batch {batch_id!r}: the conversion hook returned a "
                                    f"{type(item).__name__} for group {g} sample {j}; it "
                                    "returns a mapping of train data")
                converted[(g, j)] = {**item, "environment": e.environment}
        digest = plan["digest"]

        def publish(rank: int) -> RecordSetRef:
            part = plan["partition"][rank]
            records, deps = shard_records(batch_id, digest, rank, self.dp_size,
                                          [converted[(g, j)] for g, j in part])
            return self.store.publish(
                records, submission_id=f"shard:{batch_id}:{rank}:{_content(records, deps)}",
                dependencies=deps)

        # every rank's shard serialized and published, at most io_concurrency at a time
        # (the payload copies and the pack writes release the GIL); all of them are
        # durable before the ready record names them
        shards = _bounded_map(publish, range(self.dp_size), self.config.io_concurrency)
        converted.clear()  # the batch's train data: published, not held any longer
        ready = {"schema": READY_SCHEMA, "version": 1, "batch_id": batch_id,
                 "plan_digest": digest, "world": self.dp_size,
                 "ranks": [s.to_dict() for s in shards]}
        # the state after the batch: its groups leave the backlog, the log is fetched
        # past its collection; nothing is acknowledged (RL4: only finish_batch does)
        self._scan(until=receipt.position + 1)
        taken = {e.commit_id for e in groups}
        self._forget(taken)
        new_backlog = [e for e in self._backlog if e.commit_id not in taken]
        self._check()
        state = {**self._state_fields(), "mix": mix_after.to_dict(),
                 "fetch_cursor": max(self._fetch, self._scan_cursor)}
        # the ready record published with the state, in one durable write, before
        # batch_ready names them (its shards and plan already durable)
        (ready_ref, state_ref, progress_ref), _ = self._publish_state(
            state, new_backlog, Publication([_json_record("ready", ready)], [*shards, plan_ref]),
            f"{batch_id}:{_digest(ready)}")
        self.coord.batch_ready(self.consumer_id, token=self._token, batch_id=batch_id,
                               ready_ref=ready_ref, state_ref=state_ref,
                               fetch_cursor=state["fetch_cursor"],
                               processed_cursor=state["processed_cursor"],
                               progress_ref=progress_ref)
        self._backlog, self._mix_state = new_backlog, mix_after
        self._fetch = state["fetch_cursor"]
        # the queue retains the shards through the ready record now: drop their staging
        # (else they, and the groups their captures name, would outlive the batch)
        self.store.release_publications(shards)
        return [RankBatchRef(batch_id, digest, r, self.dp_size, s)
                for r, s in enumerate(shards)]

    def _ready_refs(self, ready_ref: RecordSetRef, batch_id: str,
                    plan_digest: str) -> list[RankBatchRef]:
        """A ready batch's rank references, if it was built from ``plan_digest`` (what
        this builder plans for it now): a ready batch is bound to its plan, as a planned
        one is (another conversion configuration or layout must not get the stored batch
        back, converted the old way)."""
        ready = self._read_json(ready_ref, f"ready record of batch {batch_id!r}")
        if not isinstance(ready, dict) or ready.get("schema") != READY_SCHEMA:
            raise CorruptData(f"the ready record of batch {batch_id!r} is not a "
                              f"{READY_SCHEMA}")
        if ready["world"] != self.dp_size:
            raise ValueError(f"batch {batch_id!r} is ready for {ready['world']} ranks, this "
                             f"builder has dp_size {self.dp_size}: an existing batch cannot "
                             "be reused with another parallel layout")
        if ready.get("plan_digest") != plan_digest:  # RL11: only under its own plan
            raise IdempotencyConflict(
                f"batch {batch_id!r} is ready, built with another selection, conversion "
                f"configuration or parallel layout (plan {ready.get('plan_digest')!r}, now "
                f"{plan_digest!r}); an existing batch id cannot be reused with another "
                "plan: restore the configuration it was built with")
        return [RankBatchRef(batch_id, ready["plan_digest"], r, ready["world"],
                             RecordSetRef.from_dict(s)) for r, s in enumerate(ready["ranks"])]

    # --- acknowledgement (RL4) ----------------------------------------------------------
    def finish_batch(self, batch_id: str) -> None:
        """Every rank finished training on ``batch_id``: acknowledge its inputs (module
        docstring).  Idempotent; an unknown or unready batch is a ``ValueError``."""
        self._check()
        view = self.coord.get_batch(batch_id) if isinstance(batch_id, str) and batch_id \
            else None
        if view is None or not view["ready"] or view["consumer_id"] != self.consumer_id:
            raise ValueError(f"cannot finish batch {batch_id!r}: it is not a ready batch of "
                             f"consumer {self.consumer_id!r} (next_batch returns ready "
                             "batches; finish each one after training on it)")
        if view["finished"] or batch_id in self._recent:
            return  # the queue's progress lists it: a retry
        # RL4: the only place inputs become processed, after training finished (with
        # the quarantined groups scanned so far: they never train, _scan)
        skipped = {q["position"] for q in self._quarantined if q["position"] < self._fetch}
        done = set(self._sparse) | {p for p in [*view["input_positions"], *skipped]
                                    if p >= self._processed}
        cursor = self._processed
        while cursor in done:
            cursor += 1
        self._processed = cursor
        self._sparse = sorted(p for p in done if p >= cursor)
        self._finished.append(batch_id)
        self._finished_count += 1
        self._recent = [*self._recent, batch_id][-FINISHED_KEPT:]
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
                self.coord.close_consumer(self.consumer_id, self._token)
            except Exception:
                if self.online_gc is None or self.online_gc.failure is None:
                    raise

    def __enter__(self) -> BatchBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bounded_map(fn: Callable[[int], RecordSetRef], items: Sequence[int], bound: int
                 ) -> list[RecordSetRef]:
    """``[fn(i) for i in items]``, at most ``bound`` running at once (in order; the first
    error raised once every started call ended)."""
    if bound <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    with concurrent.futures.ThreadPoolExecutor(min(bound, len(items)),
                                               thread_name_prefix="straw.rollout io") as pool:
        return list(pool.map(fn, items))


def _content(records: Sequence[Record], deps: Sequence[RecordSetRef]) -> str:
    """A digest of a shard's content, for its submission id: a retry after a hook changed
    its output writes a new shard instead of conflicting (the plan is what is fixed)."""
    h = hashlib.blake2b(digest_size=16)
    for r in records:
        h.update(_canonical([r.record_id, r.codec, dict(r.metadata), r.tokens]))
        h.update(memoryview(r.payload).cast("B"))
    for d in deps:
        h.update(d.digest.encode())
    return h.hexdigest()


__all__ = ["BatchBuilder", "Accepted", "default_convert", "read_accepted", "lazy_group",
           "read_stored_state", "STORED_VERSION", "backlog_columns", "backlog_of_columns",
           "COLLECTION_PREFIX",
           "BUILDER_WORKER", "PLAN_SCHEMA", "READY_SCHEMA", "COLLECTION_SCHEMA"]
