"""The data source: a dataset of prompts turned into prompt groups, epoch after epoch, with
the cursor that says how far it got.

``DataSource(prompts, n_samples_per_prompt=n, seed=s, shuffle=True)`` serves the dataset in
epochs; epoch ``e`` visits the dataset indices in ``random.Random(seed + e)``'s shuffle of
``range(len(dataset))`` (or in order without ``shuffle``), a private RNG: the global
``random`` state is never touched.  Each prompt becomes one ``SampleGroup`` of ``n``
samples; group indices and sample indices count up across epochs (group ``g`` of ``n=2``
holds samples ``2g`` and ``2g + 1``); the group's metadata records where it came from
(``epoch_id``, ``dataset_index``).

The cursor (``Cursor``: ``sample_offset`` in the epoch's order, ``epoch_id``,
``sample_group_index``, ``sample_index``, ``metadata``) is a plain JSON-able value, saved as
the queue's producer state (``producer_state``/``cursor_from_producer_state``).

``refill(count)`` makes the next ``clamp(count)`` groups (8..64) from the **committed**
cursor and returns them with the advanced cursor, and moves nothing.  The controller
publishes the groups, then submits their tasks *and* the advanced cursor in ONE queue
transaction (``Refill.request_id``, ``Refill.producer_state``), and only then calls
``commit(refill)``.  A refill that failed anywhere before that transaction was durable moves
no cursor: the next one starts from the same place.  After a crash the controller calls
``reset(cursor)`` with the cursor the queue holds.

Exactly once per epoch (invariant RL1, exactly-once dataset admission): the queue holds a
cursor ``c`` and exactly the tasks of every refill before ``c`` (they were committed
together), and every refill starts at the committed cursor; so the groups in the queue are
the dataset indices of the epochs' orders up to ``c``, each once, whatever crashed between
refills and commits.  ``tests/rollout/test_data_source.py`` checks this on the pure part with
crashes at random points between refill and commit.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from straw.checks import check_count, short_repr
from straw.refs import canonical_metadata

from .samples import Sample, SampleGroup

MIN_REFILL = 8
MAX_REFILL = 64
PRODUCER_ID = "dataset"
STATE_VERSION = 1
PROMPT_PREFIX = "prompt:"
_CURSOR_KEYS = ("sample_offset", "epoch_id", "sample_group_index", "sample_index", "metadata")


@dataclass(frozen=True)
class Cursor:
    """How far the data source got: the next position in epoch ``epoch_id``'s order, and the
    next group and sample index.  ``metadata`` is the caller's (JSON)."""

    sample_offset: int = 0
    epoch_id: int = 0
    sample_group_index: int = 0
    sample_index: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _CURSOR_KEYS[:4]:
            check_count(f"Cursor.{name}", getattr(self, name))
        canonical_metadata(self.metadata, "Cursor")
        object.__setattr__(self, "metadata", dict(self.metadata))

    def to_dict(self) -> dict[str, Any]:
        return {"sample_offset": self.sample_offset, "epoch_id": self.epoch_id,
                "sample_group_index": self.sample_group_index,
                "sample_index": self.sample_index, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, value: object) -> Cursor:
        if not isinstance(value, Mapping) or set(value) != set(_CURSOR_KEYS):
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(f"a dataset cursor is a mapping with keys {list(_CURSOR_KEYS)}, "
                             f"got {short_repr(got)}")
        return cls(**{k: value[k] for k in _CURSOR_KEYS})


def producer_state(cursor: Cursor) -> dict[str, Any]:
    """The queue producer state that records ``cursor`` (producer id ``PRODUCER_ID``)."""
    return {"version": STATE_VERSION, "cursor": cursor.to_dict()}


def cursor_from_producer_state(state: Mapping[str, Any] | None) -> Cursor | None:
    """The cursor saved in a producer state (None when nothing was ever committed)."""
    if state is None:
        return None
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION \
            or "cursor" not in state:
        raise ValueError(f"dataset producer state {short_repr(state)} is not version "
                         f"{STATE_VERSION} with a cursor; was it written by another program?")
    return Cursor.from_dict(state["cursor"])


def refill_size(count: int, minimum: int = MIN_REFILL, maximum: int = MAX_REFILL) -> int:
    """How many groups a refill asked for ``count`` makes: ``count`` clamped to
    ``minimum..maximum`` (by default 8..64; ``RolloutConfig.min_refill``/``max_refill`` in a
    job: small refills would cost a queue transaction per group, large ones hold prompts
    back from other workers)."""
    check_count("count", count)
    return min(max(count, minimum), maximum)


def task_id(group_index: int) -> str:
    """The queue task id of prompt group ``group_index``."""
    return f"{PROMPT_PREFIX}{group_index}"


@dataclass(frozen=True)
class Refill:
    """The next groups and the cursor after them; nothing is committed until the queue
    transaction holding both is durable."""

    start: Cursor
    cursor: Cursor
    groups: tuple[SampleGroup, ...]

    @property
    def request_id(self) -> str:
        """The idempotency id of the transaction submitting this refill: a retry of the same
        refill (same start) is the same request."""
        return f"{PRODUCER_ID}:{self.start.sample_group_index}"

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(task_id(self.start.sample_group_index + i) for i in range(len(self.groups)))

    @property
    def producer_state(self) -> dict[str, Any]:
        return producer_state(self.cursor)

    @property
    def positions(self) -> tuple[tuple[int, int], ...]:
        """``(epoch_id, dataset_index)`` of every group, in order."""
        return tuple((g.metadata["epoch_id"], g.metadata["dataset_index"]) for g in self.groups)


class DataSource:
    """Prompts into prompt groups, by epochs and a committed cursor (module docstring).

    ``prompts``: a sequence of prompts (any value the sample codec encodes); ``keep``: an
    optional filter, applied once here (an empty result is a ``ValueError``);
    ``environment``: the environment the groups belong to (``""`` for a single one)."""

    def __init__(self, prompts: Sequence[Any], *, n_samples_per_prompt: int = 1,
                 seed: int = 0, shuffle: bool = False,
                 keep: Callable[[Any], bool] | None = None, environment: str = "",
                 cursor: Cursor | None = None) -> None:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a sequence of prompts, got "
                            f"{type(prompts).__name__}")
        check_count("n_samples_per_prompt", n_samples_per_prompt, minimum=1)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.prompts = [p for p in prompts if keep is None or keep(p)]
        if not self.prompts:
            raise ValueError(f"the rollout dataset is empty after filtering ({len(prompts)} "
                             "prompts given, none kept): give prompts, or loosen the filter")
        if not isinstance(environment, str):
            raise TypeError(f"environment must be a str, got {type(environment).__name__}")
        self.n_samples_per_prompt = n_samples_per_prompt
        self.seed = seed
        self.shuffle = bool(shuffle)
        self.environment = environment
        self._orders: dict[int, list[int]] = {}
        self._cursor = Cursor()
        self.reset(cursor)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def cursor(self) -> Cursor:
        """The committed cursor: where the next refill starts."""
        return self._cursor

    def reset(self, cursor: Cursor | None) -> None:
        """Make ``cursor`` (the one the queue holds; None: the start) the committed one."""
        cursor = Cursor() if cursor is None else cursor
        if not isinstance(cursor, Cursor):
            raise TypeError(f"cursor must be a Cursor, got {type(cursor).__name__}")
        if cursor.sample_offset > len(self.prompts):
            raise ValueError(f"cursor.sample_offset {cursor.sample_offset} is beyond this "
                             f"dataset of {len(self.prompts)} prompts: is it the dataset the "
                             "cursor was saved with?")
        self._cursor = cursor

    def order(self, epoch_id: int) -> list[int]:
        """The dataset indices in the order epoch ``epoch_id`` visits them."""
        check_count("epoch_id", epoch_id)
        order = self._orders.get(epoch_id)
        if order is None:
            order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(self.seed + epoch_id).shuffle(order)
            self._orders = {epoch_id: order}  # one epoch at a time is all a refill needs
        return order

    def refill(self, count: int, *, minimum: int = MIN_REFILL,
               maximum: int = MAX_REFILL) -> Refill:
        """The next ``refill_size(count, minimum, maximum)`` groups from the committed
        cursor, and the cursor after them; the committed cursor does not move (``commit``
        does)."""
        wanted = refill_size(count, minimum, maximum)
        start = c = self._cursor
        offset, epoch = c.sample_offset, c.epoch_id
        gid, sid = c.sample_group_index, c.sample_index
        made: list[SampleGroup] = []
        for _ in range(wanted):
            if offset >= len(self.prompts):  # the epoch is done: the next one reshuffles
                offset, epoch = 0, epoch + 1
            index = self.order(epoch)[offset]
            prompt = self.prompts[index]
            # each sample its own copy of a mutable prompt (a chat's list of dicts); an
            # immutable one (text, token ids) is shared: copying it is all cost
            immutable = type(prompt) in (str, bytes, int) or (
                type(prompt) is tuple and all(type(t) is int for t in prompt))
            # the group's first sample is built (and checked) once, the others are its
            # siblings: the same fields but the index (and their own prompt copy)
            first = Sample(prompt if immutable else copy.deepcopy(prompt), group_index=gid,
                           index=sid)
            samples = (first, *(first._sibling(sid + k, prompt if immutable
                                               else copy.deepcopy(prompt))
                                for k in range(1, self.n_samples_per_prompt)))
            made.append(SampleGroup(samples, self.environment,
                                    {"epoch_id": epoch, "dataset_index": index}))
            offset += 1
            gid += 1
            sid += self.n_samples_per_prompt
        end = Cursor(offset, epoch, gid, sid, c.metadata)
        return Refill(start, end, tuple(made))

    def commit(self, refill: Refill) -> None:
        """Advance the committed cursor past ``refill``, once its queue transaction is
        durable.  Only a refill made from the committed cursor can be committed: a stale
        one would skip or repeat prompts."""
        if not isinstance(refill, Refill):
            raise TypeError(f"refill must be a Refill, got {type(refill).__name__}")
        if refill.start != self._cursor:
            raise ValueError(f"this refill starts at group {refill.start.sample_group_index} "
                             f"but the committed cursor is at group "
                             f"{self._cursor.sample_group_index}: commit only the refill made "
                             "from the committed cursor (reset to the queue's cursor and "
                             "refill again)")
        self._cursor = refill.cursor


__all__ = ["MIN_REFILL", "MAX_REFILL", "PRODUCER_ID", "STATE_VERSION", "PROMPT_PREFIX",
           "Cursor", "producer_state", "cursor_from_producer_state", "refill_size", "task_id",
           "Refill", "DataSource"]
