"""straw.rollout.data_source: epochs, seeded shuffles that leave the global RNG alone, the
cursor, refills that move nothing until committed, and exactly-once admission per epoch
(RL1) across crashes at any point between refill and commit."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from straw.rollout.data_source import (
    MAX_REFILL,
    MIN_REFILL,
    PRODUCER_ID,
    Cursor,
    DataSource,
    Refill,
    cursor_from_producer_state,
    producer_state,
    refill_size,
    task_id,
)
from straw.rollout.samples import Stage, classify

PROMPTS = [f"prompt-{i}" for i in range(20)]


def test_bad_input():
    with pytest.raises(ValueError, match="empty after filtering"):
        DataSource([])
    with pytest.raises(ValueError, match="empty after filtering"):
        DataSource(PROMPTS, keep=lambda p: False)
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        DataSource(PROMPTS, n_samples_per_prompt=0)
    with pytest.raises(TypeError, match="sequence of prompts"):
        DataSource("abc")
    with pytest.raises(ValueError, match="count"):
        DataSource(PROMPTS).refill(-1)
    with pytest.raises(ValueError, match="beyond this dataset of 20"):
        DataSource(PROMPTS).reset(Cursor(sample_offset=21))


def test_filter_applies_once():
    src = DataSource(PROMPTS, keep=lambda p: p.endswith("1"))
    assert len(src) == 2
    refill = src.refill(8)
    assert {g.prompt for g in refill.groups} == {"prompt-1", "prompt-11"}


@pytest.mark.parametrize("count, size", [(0, 8), (1, 8), (8, 8), (30, 30), (64, 64),
                                         (65, 64), (10**6, 64)])
def test_refill_size_is_clamped(count, size):
    assert refill_size(count) == size
    assert len(DataSource(PROMPTS).refill(count).groups) == size
    assert (MIN_REFILL, MAX_REFILL) == (8, 64)


def test_groups_and_indices():
    src = DataSource(PROMPTS, n_samples_per_prompt=2)
    refill = src.refill(8)
    for g, group in enumerate(refill.groups):
        assert group.group_index == g
        assert [s.index for s in group.samples] == [2 * g, 2 * g + 1]
        assert group.metadata == {"epoch_id": 0, "dataset_index": g}
        assert classify(group) is Stage.FRESH
    assert refill.task_ids == tuple(task_id(g) for g in range(8)) == tuple(
        f"prompt:{g}" for g in range(8))
    assert refill.request_id == f"{PRODUCER_ID}:0"
    assert refill.cursor == Cursor(8, 0, 8, 16)


def test_prompts_are_copied_per_sample():
    src = DataSource([{"messages": ["hi"]}], n_samples_per_prompt=2)
    group = src.refill(8).groups[0]
    assert group.samples[0].prompt == group.samples[1].prompt
    assert group.samples[0].prompt is not group.samples[1].prompt


def test_refill_moves_nothing_until_commit():
    src = DataSource(PROMPTS)
    first = src.refill(8)
    assert src.cursor == Cursor()
    again = src.refill(8)  # a failed refill retried: the same groups
    assert again == first
    src.commit(first)
    assert src.cursor == first.cursor
    second = src.refill(8)
    assert second.start == first.cursor
    assert second.groups[0].metadata["dataset_index"] == 8
    with pytest.raises(ValueError, match="commit only the refill made from the committed"):
        src.commit(first)  # stale: committing it again would repeat prompts
    assert src.cursor == first.cursor


def test_epoch_wrap_and_seeded_shuffle_leave_global_rng_alone():
    random.seed(1234)
    before = random.getstate()
    src = DataSource(PROMPTS[:5], seed=7, shuffle=True)
    refill = src.refill(8)
    assert random.getstate() == before
    epoch0, epoch1 = list(range(5)), list(range(5))
    random.Random(7).shuffle(epoch0)
    random.Random(8).shuffle(epoch1)
    assert refill.positions == tuple([(0, i) for i in epoch0] + [(1, i) for i in epoch1[:3]])
    assert refill.cursor == Cursor(3, 1, 8, 8)
    assert random.getstate() == before
    assert DataSource(PROMPTS[:5]).order(3) == list(range(5))  # no shuffle: in order


def test_cursor_is_plain_json_and_producer_state_round_trips():
    c = Cursor(3, 1, 8, 16, {"note": [1, "x"]})
    text = json.dumps(producer_state(c))
    assert cursor_from_producer_state(json.loads(text)) == c
    assert cursor_from_producer_state(None) is None
    with pytest.raises(ValueError, match="not version 1"):
        cursor_from_producer_state({"version": 2, "cursor": c.to_dict()})
    with pytest.raises(ValueError, match="keys"):
        Cursor.from_dict({"sample_offset": 1})
    with pytest.raises(TypeError):
        Cursor(sample_offset="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Cursor(epoch_id=-1)
    with pytest.raises(ValueError):
        Cursor(metadata={"x": float("nan")})
    src = DataSource(PROMPTS, cursor=Cursor(metadata={"note": 1}))
    assert src.refill(8).cursor.metadata == {"note": 1}  # carried along


class Queue:
    """The queue's part in admission: one transaction holds a refill's tasks and its
    cursor; a retried request id is applied once (D7)."""

    def __init__(self):
        self.tasks: list[tuple[str, tuple[int, int]]] = []
        self.state = None
        self.requests: dict[str, tuple] = {}

    def submit(self, refill: Refill):
        content = (refill.task_ids, refill.positions, json.dumps(refill.producer_state))
        known = self.requests.get(refill.request_id)
        if known is not None:
            assert known == content, "a retried request must carry the same content"
            return
        self.requests[refill.request_id] = content
        self.tasks.extend(zip(refill.task_ids, refill.positions, strict=True))
        self.state = json.loads(content[2])


# where a controller may die during one take: before publishing, after publishing (the
# groups are in the pool, unreferenced), after the transaction but before commit(), after
# the transaction with its reply lost (the same request is retried), or not at all; and
# "publish_fails": a refill whose publication fails while the controller lives on and
# takes again without reading the queue's cursor back
CRASH_POINTS = ["before_publish", "after_publish", "after_submit", "lost_reply",
                "publish_fails", "none"]


@given(size=st.integers(1, 12), n=st.integers(1, 3), seed=st.integers(0, 5),
       shuffle=st.booleans(),
       steps=st.lists(st.tuples(st.integers(0, 70), st.sampled_from(CRASH_POINTS)),
                      min_size=1, max_size=25))
def test_every_dataset_index_enters_the_queue_exactly_once_per_epoch(size, n, seed, shuffle,
                                                                     steps):
    prompts = [f"p{i}" for i in range(size)]

    def start() -> DataSource:  # a (re)started controller resumes from the queue's cursor
        src = DataSource(prompts, n_samples_per_prompt=n, seed=seed, shuffle=shuffle)
        src.reset(cursor_from_producer_state(queue.state))
        return src

    queue = Queue()
    src = start()
    for count, crash in steps:
        refill = src.refill(count)
        if crash == "publish_fails":
            continue
        if crash in ("before_publish", "after_publish"):
            src = start()
            continue
        queue.submit(refill)
        if crash == "after_submit":
            src = start()
            continue
        if crash == "lost_reply":
            queue.submit(refill)  # the retry is the same request: applied once
        src.commit(refill)

    positions = [p for _, p in queue.tasks]
    ids = [t for t, _ in queue.tasks]
    assert len(set(ids)) == len(ids)  # every group index once
    assert ids == [task_id(g) for g in range(len(ids))]
    by_epoch: dict[int, list[int]] = {}
    for epoch, index in positions:
        by_epoch.setdefault(epoch, []).append(index)
    order = DataSource(prompts, seed=seed, shuffle=shuffle)
    epochs = sorted(by_epoch)
    assert epochs == list(range(len(epochs)))
    for epoch in epochs:
        seen = by_epoch[epoch]
        assert len(seen) == len(set(seen))  # no index twice in an epoch
        if epoch < epochs[-1]:
            assert sorted(seen) == list(range(size))  # a finished epoch: every index once
        assert seen == order.order(epoch)[:len(seen)]  # in the epoch's order
    # the committed cursor names exactly what the queue holds
    cursor = cursor_from_producer_state(queue.state) if queue.state else Cursor()
    assert cursor.sample_group_index == len(ids)
    assert cursor.sample_index == len(ids) * n


def test_a_refill_builds_each_group_from_one_checked_sample(monkeypatch):
    # the n samples of a prompt group differ only in their index: the first is built
    # (and checked) by Sample, the others are its siblings, equal to what Sample builds
    # and each with its own prompt copy when the prompt is mutable
    from straw.rollout import samples as samples_module
    from straw.rollout.samples import Sample

    built = []
    real = samples_module.Sample.__post_init__

    def counting(self):
        built.append(self.index)
        real(self)

    monkeypatch.setattr(samples_module.Sample, "__post_init__", counting)
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    for prompts in ([f"p{i}" for i in range(3)], chats):
        built.clear()
        source = DataSource(prompts, n_samples_per_prompt=4)
        refill = source.refill(8)
        assert len(built) == 8  # one checked construction per group, not one per sample
        for g, group in enumerate(refill.groups):
            want = [Sample(prompts[g % 3], group_index=g, index=4 * g + k) for k in range(4)]
            assert list(group.samples) == want
            assert all(s.metadata == {} for s in group.samples)
            assert len({id(s.metadata) for s in group.samples}) == 4
            if prompts is chats:  # a mutable prompt: each sample its own copy
                assert len({id(s.prompt) for s in group.samples}) == 4
                assert all(s.prompt is not prompts[g % 3] for s in group.samples)
