"""Rollout samples and groups: the values the rollout layer schedules, stores and trains on.

A ``Sample`` is one response to one prompt: the whole token sequence (prompt tokens then
response tokens), how many of them are the response, its status, its reward, which weight
version generated which response tokens, its indices, free metadata, and optional capture
tensors (R3 routed experts, score-centering top-k ids and log-probs) held opaquely: NumPy
arrays, torch tensors or ``straw.tensor.TensorRef``s, whatever has a ``shape``.

A ``SampleGroup`` is the ``n_samples_per_prompt`` samples of one prompt: the unit a
generation worker takes under one lease and returns.  It belongs to one environment
(``""`` when a job has a single environment: no id is needed then).

Both are frozen values (equality leaves the capture tensors out: arrays have no boolean
``==``); every constructor validates, so a group that exists is consistent:

* a group's samples share one prompt and one group index, and their sample indices are
  distinct (a group mixing prompts is a ``ValueError`` naming both);
* a reward is a finite number or a mapping of names to finite numbers (NaN or infinity is
  a ``ValueError``: it would poison every advantage computed from its group);
* ``response_length <= len(tokens)``; version spans lie inside the response, in order,
  without overlap.

Stage (``classify``): **ready** when every sample is COMPLETED or TRUNCATED and carries a
reward, **partial** when any sample has response tokens, **fresh** otherwise.  The stage is
the queue priority (``Stage.READY == 2``, ``PARTIAL == 1``, ``FRESH == 0``): ready groups
are handed out first so finished work reaches training and is never generated again.

``captures_cover`` says whether a sample's capture tensors cover its tokens (R3: one row per
token but the last, ``len(tokens) - 1``; top-k: one row per response token).  A group whose
captures do not is not stored as a continuation: the generation client releases its lease
and the task resumes from its previous durable input (issue 14, generation client).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from straw.checks import INT64_MAX, INT64_MIN, check_count, short_repr


class Status(str, enum.Enum):
    """Where a sample's generation stands (string values: they are stored as such)."""

    PENDING = "pending"  # not generated yet, or generation under way
    COMPLETED = "completed"  # the model ended the response
    TRUNCATED = "truncated"  # stopped at the length limit: finished, trainable
    ABORTED = "aborted"  # interrupted (weight update, shutdown): continue it later
    FAILED = "failed"  # generation failed for this sample


FINISHED = frozenset({Status.COMPLETED, Status.TRUNCATED})


class Stage(enum.IntEnum):
    """A group's stage; its value is the queue priority (higher is handed out first)."""

    FRESH = 0
    PARTIAL = 1
    READY = 2


@dataclass(frozen=True)
class VersionSpan:
    """Response tokens ``start..stop`` (offsets into the response, stop exclusive) were
    generated under weight ``version`` (an int or a str, as the engine reports it)."""

    start: int
    stop: int
    version: int | str

    def __post_init__(self) -> None:
        check_count("VersionSpan.start", self.start)
        check_count("VersionSpan.stop", self.stop)
        if self.stop <= self.start:
            raise ValueError(f"VersionSpan covers tokens {self.start}..{self.stop}: a span "
                             "names at least one generated token (stop > start)")
        v = self.version
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise TypeError(f"VersionSpan.version must be an int or a str, got "
                            f"{type(v).__name__} {short_repr(v)}")


def _check_reward(where: str, reward: object) -> float | dict[str, float] | None:
    """A finite float, a mapping of str to finite floats, or None (not scored yet)."""
    if reward is None:
        return None
    if isinstance(reward, Mapping):
        out: dict[str, float] = {}
        for k, v in reward.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} keys must be str, got {short_repr(k)}")
            out[k] = _finite(f"{where}[{k!r}]", v)
        return out
    return _finite(where, reward)


def _finite(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # NumPy scalars: float(x) first
        raise TypeError(f"{where} must be a number, got {type(value).__name__} "
                        f"{short_repr(value)} (use float(x) for NumPy scalars)")
    try:
        f = float(value)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ValueError(f"{where} is {short_repr(value)}: a reward must be finite (a NaN "
                         "or infinite reward would poison its group's advantages); fix the "
                         "reward function or reject the group with its reason")
    return f


def _rows(x: Any, where: str) -> int:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) == 0:
        raise TypeError(f"{where} must be an array, tensor or TensorRef with at least one "
                        f"dimension, got {type(x).__name__}")
    return int(shape[0])


class BufferIds(tuple):  # type: ignore[type-arg]
    """Token ids decoded from a little-endian int32/int64 buffer (only
    ``token_ids_from_buffer`` makes them): Python ints in the signed 64-bit range by
    construction, which ``Sample`` then need not check id by id again.  Decoded from
    int32, it also carries the decoded array (``int32``): a sample made from it keeps that
    array, so the batch builder's conversion need not turn the ids back into an array
    (half of its CPU per sample: ``Sample.int32_ids``)."""

    int32: np.ndarray[Any, Any] | None = None


_BUFFER_DTYPES: dict[int, np.dtype[Any]] = {4: np.dtype("<i4"), 8: np.dtype("<i8")}


def token_ids_from_buffer(data: bytes, width: int) -> tuple[int, ...]:
    """The token ids of ``data``, little-endian signed ints of ``width`` bytes (4 or 8;
    ``len(data)`` a multiple of it), as ``Sample.tokens`` takes them."""
    if width not in _BUFFER_DTYPES or len(data) % width:
        raise ValueError(f"token ids are {width}-byte ints in {len(data)} bytes: expected "
                         "4 or 8 bytes per id and a whole number of ids")
    decoded = np.frombuffer(data, dtype=_BUFFER_DTYPES[width])
    ids = BufferIds(decoded.tolist())
    if width == 4:
        ids.int32 = decoded
    return ids


@dataclass(frozen=True)
class Sample:
    """One response to one prompt (see the module docstring)."""

    prompt: Any
    tokens: tuple[int, ...] = ()
    response_length: int = 0
    status: Status = Status.PENDING
    reward: float | dict[str, float] | None = None
    versions: tuple[VersionSpan, ...] = ()
    group_index: int | None = None
    index: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # captures: compared by nothing (arrays have no boolean ==); compare them yourself
    routes: Any = field(default=None, compare=False)  # R3, [len(tokens) - 1, layers, top-k]
    topk_ids: Any = field(default=None, compare=False)  # score centering, [response, k]
    topk_logprobs: Any = field(default=None, compare=False)  # score centering, [response, k]

    def __post_init__(self) -> None:
        # every sample a client takes or returns and every prompt a refill makes passes
        # here: the common values (exact ints, a Status, a float reward, no captures) take
        # the short checks, anything else the full ones (and their messages)
        tokens = self.tokens
        if type(tokens) is BufferIds:
            # ints in the signed 64-bit range by construction (token_ids_from_buffer):
            # the checks below are what that construction already guarantees (they were
            # half of decoding a stored group, the batch builder's scan)
            if tokens.int32 is not None:
                object.__setattr__(self, "_int32_ids", tokens.int32)
            tokens = tuple(tokens)
            object.__setattr__(self, "tokens", tokens)
        else:
            if type(tokens) is not tuple:
                tokens = tuple(tokens)
                object.__setattr__(self, "tokens", tokens)
            if tokens:
                if not set(map(type, tokens)) <= {int}:  # (C speed: no Python loop per token)
                    i, t = next((i, t) for i, t in enumerate(tokens) if type(t) is not int)
                    raise TypeError(f"Sample.tokens[{i}] must be an int token id, got "
                                    f"{type(t).__name__} {short_repr(t)} (convert NumPy ids "
                                    "with .tolist())")
                if min(tokens) < INT64_MIN or max(tokens) > INT64_MAX:
                    raise ValueError("Sample.tokens holds an id outside the signed 64-bit "
                                     "range")
        length = self.response_length
        if type(length) is not int or not 0 <= length <= INT64_MAX:
            check_count("Sample.response_length", length)
        if length > len(tokens):
            raise ValueError(f"Sample.response_length {length} exceeds its "
                             f"{len(tokens)} tokens (tokens hold the prompt, then the response)")
        if type(self.status) is not Status:
            object.__setattr__(self, "status", Status(self.status))
        reward = self.reward
        if reward is not None and (type(reward) is not float or not math.isfinite(reward)):
            object.__setattr__(self, "reward", _check_reward("Sample.reward", reward))
        spans = self.versions
        if type(spans) is not tuple:
            spans = tuple(spans)
            object.__setattr__(self, "versions", spans)
        end = 0
        for i, s in enumerate(spans):
            if not isinstance(s, VersionSpan):
                raise TypeError(f"Sample.versions[{i}] must be a VersionSpan, got "
                                f"{type(s).__name__}")
            if s.start < end:
                raise ValueError(f"Sample.versions[{i}] starts at token {s.start}, inside or "
                                 f"before the previous span (ending at {end}): spans are in "
                                 "order and do not overlap")
            end = s.stop
        if end > length:
            raise ValueError(f"Sample.versions cover response tokens up to {end}, beyond its "
                             f"response of {length} tokens")
        for name in ("group_index", "index"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 <= value <= INT64_MAX):
                check_count(f"Sample.{name}", value)
        if not isinstance(self.metadata, Mapping):
            raise TypeError(f"Sample.metadata must be a mapping, got "
                            f"{type(self.metadata).__name__}")
        object.__setattr__(self, "metadata", dict(self.metadata))
        if self.routes is not None or self.topk_ids is not None or \
                self.topk_logprobs is not None:
            for name in ("routes", "topk_ids", "topk_logprobs"):
                value = getattr(self, name)
                if value is not None:
                    _rows(value, f"Sample.{name}")

    def int32_ids(self) -> np.ndarray[Any, Any] | None:
        """The token ids as the read-only int32 array they were decoded from, when this
        sample was decoded from a stored int32 buffer (else None): the same ids as
        ``tokens``, which is immutable, so the array stays theirs."""
        return self.__dict__.get("_int32_ids")

    def __getstate__(self) -> dict[str, Any]:
        # pickled (Ray, a user's cache): the fields only, not the decoded array
        state = dict(self.__dict__)
        state.pop("_int32_ids", None)
        return state

    def _sibling(self, index: int, prompt: Any) -> Sample:
        """This sample under another sample ``index``, answering ``prompt`` (this one's
        prompt or an equal copy), with its own empty metadata: a data source makes the
        ``n`` samples of a prompt group this way.  Every other field is this validated
        sample's, so only the index is checked (a full construction costs the refill more
        than encoding the sample)."""
        check_count("Sample.index", index)
        if self.metadata:
            raise ValueError("_sibling copies a sample without metadata (a prompt's)")
        twin = object.__new__(Sample)
        fields = twin.__dict__
        fields.update(self.__dict__)
        fields["index"], fields["prompt"], fields["metadata"] = index, prompt, {}
        return twin

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def weight_versions(self) -> tuple[int | str, ...]:
        """The versions that generated this sample's response tokens, in token order."""
        return tuple(s.version for s in self.versions)

    @property
    def finished(self) -> bool:
        """Completed or truncated, with a reward: nothing is left to generate or score."""
        return self.status in FINISHED and self.reward is not None


def _same_prompt(a: Any, b: Any) -> bool:
    """``a == b`` as a bool; a prompt whose ``==`` is not one (a NumPy array) is a clear
    error rather than numpy's "truth value is ambiguous"."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        raise TypeError(f"prompts {short_repr(a)} and {short_repr(b)} cannot be compared "
                        "with ==; put arrays in a prompt inside a value that compares "
                        "(e.g. a tuple of token ids) or in Sample.metadata") from None


def captures_cover(sample: Sample) -> bool:
    """Whether the sample's capture tensors cover its tokens: R3 routes one row per token
    but the last, top-k ids and log-probs one row per response token.  A sample without
    response tokens, or without captures, has nothing to cover."""
    if sample.response_length == 0:
        return True
    if sample.routes is not None and _rows(sample.routes, "routes") != len(sample.tokens) - 1:
        return False
    for name in ("topk_ids", "topk_logprobs"):
        value = getattr(sample, name)
        if value is not None and _rows(value, name) != sample.response_length:
            return False
    if (sample.topk_ids is None) != (sample.topk_logprobs is None):
        return False  # one half of score centering's capture without the other
    return True


@dataclass(frozen=True)
class SampleGroup:
    """The samples of one prompt, returned and scheduled together (see the module
    docstring).  ``environment`` names its environment (``""``: the only one);
    ``metadata`` is free (the data source records the dataset position there)."""

    samples: tuple[Sample, ...]
    environment: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        samples = tuple(self.samples)
        if not samples:
            raise ValueError("a SampleGroup holds at least one sample")
        for i, s in enumerate(samples):
            if not isinstance(s, Sample):
                raise TypeError(f"SampleGroup.samples[{i}] must be a Sample, got "
                                f"{type(s).__name__}")
        first = samples[0]
        seen: set[int] = set()
        for i, s in enumerate(samples):
            if s.group_index != first.group_index:
                raise ValueError(f"SampleGroup.samples[{i}] has group index {s.group_index}, "
                                 f"samples[0] {first.group_index}: a group holds the samples "
                                 "of one prompt")
            if not _same_prompt(s.prompt, first.prompt):
                raise ValueError(f"SampleGroup.samples[{i}] answers prompt "
                                 f"{short_repr(s.prompt)}, samples[0] "
                                 f"{short_repr(first.prompt)}: a group holds the samples of "
                                 "one prompt")
            if s.index is not None:
                if s.index in seen:
                    raise ValueError(f"SampleGroup.samples[{i}] repeats sample index "
                                     f"{s.index}")
                seen.add(s.index)
        object.__setattr__(self, "samples", samples)
        if not isinstance(self.environment, str):
            raise TypeError(f"SampleGroup.environment must be a str, got "
                            f"{type(self.environment).__name__}")
        if not isinstance(self.metadata, Mapping):
            raise TypeError(f"SampleGroup.metadata must be a mapping, got "
                            f"{type(self.metadata).__name__}")
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def prompt(self) -> Any:
        return self.samples[0].prompt

    @property
    def group_index(self) -> int | None:
        return self.samples[0].group_index

    @property
    def tokens(self) -> int:
        """All tokens of the group (prompts included): its size for token balancing."""
        return sum(len(s.tokens) for s in self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Any:
        return iter(self.samples)


def classify(group: SampleGroup) -> Stage:
    """READY (every sample finished, with a reward), PARTIAL (some response tokens) or
    FRESH."""
    if all(s.finished for s in group.samples):
        return Stage.READY
    if any(s.response_length > 0 for s in group.samples):
        return Stage.PARTIAL
    return Stage.FRESH


def captures_cover_group(group: SampleGroup) -> bool:
    """Whether every sample's captures cover its tokens (``captures_cover``)."""
    return all(captures_cover(s) for s in group.samples)


__all__ = ["Status", "Stage", "FINISHED", "VersionSpan", "Sample", "SampleGroup", "classify",
           "captures_cover", "captures_cover_group"]
