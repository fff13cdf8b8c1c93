"""straw.rollout.scheduling: stage priority, oldest-version key, FIFO ties; staleness and its
metrics; the optional staleness bound and its explicit policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from straw.checks import INT64_MAX, INT64_MIN
from straw.rollout.samples import Sample, SampleGroup, Stage, Status, VersionSpan, classify
from straw.rollout.scheduling import (
    NO_VERSION_KEY,
    SUBMITTED_PROMPT_KEY,
    Decision,
    StalenessBound,
    StalenessPolicy,
    acquisition_order,
    decide,
    group_staleness,
    numeric_version,
    priority,
    queue_order,
    restart_from_prompt,
    scheduling_key,
    staleness,
    staleness_metrics,
    staleness_of_span,
    version_span,
)


def gen(versions, status=Status.ABORTED, reward=None, index=0, gid=0, prompt_len=2):
    """A sample with one generated token per version (None: one token, no version)."""
    versions = [] if versions is None else list(versions)
    n = max(1, len(versions))
    spans = tuple(VersionSpan(i, i + 1, v) for i, v in enumerate(versions))
    return Sample("p", tuple(range(prompt_len + n)), n, status, reward, spans, gid, index)


def fresh(index=0, gid=0):
    return Sample("p", (1, 2), 0, Status.PENDING, group_index=gid, index=index)


def test_vime_order_stage_then_oldest_version_then_fifo():
    # six returned partial groups with versions [8, 2, 2, None, 9, 1]; group 4 completed
    # with a reward; group 5's sample carries versions ["1", "12"]
    versions = [[8], [2], [2], None, [9], ["1", "12"]]
    groups = []
    for g, v in enumerate(versions):
        if g == 4:
            s = gen(v, Status.COMPLETED, 1.0, gid=g)
        else:
            s = gen(v, gid=g)
        groups.append(SampleGroup((s,)))
    entries = [queue_order(g) for g in groups]
    assert [classify(g) for g in groups] == [Stage.PARTIAL] * 4 + [Stage.READY, Stage.PARTIAL]
    assert entries[3] == (1, NO_VERSION_KEY) and entries[5] == (1, 1)
    # then a prompt the data source submitted, and a returned group with no tokens yet
    entries.append((0, SUBMITTED_PROMPT_KEY))
    entries.append(queue_order(SampleGroup((fresh(gid=7),))))
    assert entries[7] == (0, NO_VERSION_KEY)
    assert acquisition_order(entries) == [4, 5, 1, 2, 0, 3, 6, 7]


@pytest.mark.parametrize("value, expected", [
    (7, 7), ("7", 7), ("-3", -3), (-3, -3), ("007", 7), ("0", 0),
    ("v7", None), ("7.0", None), (7.0, None), ("+7", None), ("-", None), ("", None),
    ("--7", None), ("\u0663", None), (" 7", None), (None, None), (True, None),
    (np.int64(5), 5),
])
def test_numeric_version(value, expected):
    assert numeric_version(value) == expected


def test_key_skips_non_numeric_versions_one_by_one_and_clamps():
    g = SampleGroup((gen(["abc", 5]), gen(["9", "x"], index=1)))
    assert scheduling_key(g) == 5
    assert scheduling_key(SampleGroup((gen(["abc"]),))) == NO_VERSION_KEY
    assert scheduling_key(SampleGroup((gen([2**70]),))) == INT64_MAX
    assert scheduling_key(SampleGroup((gen([-(2**70)]),))) == INT64_MIN
    assert scheduling_key(SampleGroup((fresh(),))) == NO_VERSION_KEY


@given(st.lists(st.lists(st.one_of(st.integers(-2**70, 2**70), st.text(max_size=3)),
                         max_size=4), min_size=1, max_size=4))
def test_key_is_the_clamped_minimum_numeric_version(per_sample):
    group = SampleGroup(tuple(gen(v or None, index=i) if v else fresh(i)
                              for i, v in enumerate(per_sample)))
    numeric = [numeric_version(v) for vs in per_sample for v in vs]
    numeric = [v for v in numeric if v is not None]
    expected = max(INT64_MIN, min(INT64_MAX, min(numeric))) if numeric else NO_VERSION_KEY
    assert scheduling_key(group) == expected
    assert INT64_MIN <= scheduling_key(group) <= INT64_MAX
    assert priority(group) == int(classify(group))


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-5, 5)), max_size=12))
def test_acquisition_order_is_priority_desc_key_asc_fifo(entries):
    order = acquisition_order(entries)
    assert sorted(order) == list(range(len(entries)))
    for a, b in zip(order, order[1:], strict=False):
        (pa, ka), (pb, kb) = entries[a], entries[b]
        assert pa > pb or (pa == pb and (ka < kb or (ka == kb and a < b)))


def test_staleness_of_samples():
    assert staleness(gen([3, 5]), 7) == 4  # oldest generated token: version 3
    assert staleness(gen([7]), 7) == 0
    assert staleness(gen(["3"]), "7") == 4
    assert staleness(fresh(), 7) == 0  # nothing generated: 0, even without versions
    assert staleness(gen(None), 7) is None  # tokens without a version
    assert staleness(gen([3, "x"]), 7) is None  # any non-numeric version
    assert staleness(gen([3, 8]), 7) is None  # a version newer than the serving one
    assert staleness(gen([3]), "latest") is None  # serving version not numeric
    assert staleness(fresh(), None) == 0


def test_version_span_is_what_staleness_is_measured_from():
    # a client without a bound sends the span; the controller measures it later against
    # the version it serves then: the same answer as staleness() at that version
    assert version_span(gen([3, 5])) == [3, 5]
    assert version_span(gen(["3", 4])) == [3, 4]
    assert version_span(fresh()) == []
    assert version_span(gen(None)) is None and version_span(gen([3, "x"])) is None
    assert staleness_of_span([3, 5], 7) == 4 and staleness_of_span([3, 8], 7) is None
    assert staleness_of_span([], "latest") == 0 and staleness_of_span(None, 7) is None
    assert staleness_of_span([3, 3], "latest") is None


def test_staleness_metrics():
    samples = [gen([3]), gen([5], index=1), fresh(2), gen(None, index=3), gen(["x"], index=4)]
    m = staleness_metrics(samples, 7)
    assert m == {"staleness/mean": (4 + 2 + 0) / 3, "staleness/max": 4.0,
                 "staleness/unknown_count": 2.0}
    assert staleness_metrics([gen(None)], 7) == {
        "staleness/mean": 0.0, "staleness/max": 0.0, "staleness/unknown_count": 1.0}
    assert staleness_metrics([], 7)["staleness/unknown_count"] == 0.0


def test_bound_is_off_by_default_and_ordering_never_drops():
    old = SampleGroup((gen([1]),))
    assert decide(old, 1000).decision is Decision.KEEP
    assert decide(old, 1000).staleness == 999


@pytest.mark.parametrize("policy, expected", [
    (StalenessPolicy.REQUEUE, Decision.REQUEUE), ("reject", Decision.REJECT)])
def test_bound_policy(policy, expected):
    bound = StalenessBound(2, policy)
    within = SampleGroup((gen([5]), gen([6], index=1)))
    beyond = SampleGroup((gen([4]), gen([6], index=1)))
    assert decide(within, 7, bound).decision is Decision.KEEP
    verdict = decide(beyond, 7, bound)
    assert verdict.decision is expected and verdict.staleness == 3
    assert "staleness 3 exceeds the bound of 2" in verdict.reason
    # fresh groups and groups of unknown staleness are never acted on
    assert decide(SampleGroup((fresh(),)), 7, bound).decision is Decision.KEEP
    assert decide(SampleGroup((gen(None),)), 7, bound).decision is Decision.KEEP
    assert decide(SampleGroup((gen([9]),)), 7, bound).decision is Decision.KEEP


def test_bound_needs_an_explicit_valid_policy():
    with pytest.raises(TypeError):
        StalenessBound(3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="requeue"):
        StalenessBound(3, "drop")
    with pytest.raises(ValueError):
        StalenessBound(-1, "reject")


@given(st.lists(st.lists(st.integers(0, 20), max_size=3), min_size=1, max_size=4),
       st.integers(0, 20), st.integers(0, 10))
def test_bound_acts_exactly_on_known_staleness_beyond_it(per_sample, current, limit):
    group = SampleGroup(tuple(gen(v, index=i) if v else fresh(i)
                              for i, v in enumerate(per_sample)))
    verdict = decide(group, current, StalenessBound(limit, "requeue"))
    # a fresh sample's staleness is 0; one with a version newer than current is unknown
    known = [current - min(v) if v else 0 for v in per_sample if not v or max(v) <= current]
    worst = max(known) if known else None
    assert group_staleness(group, current) == worst
    stale = worst is not None and worst > limit
    assert verdict.decision is (Decision.REQUEUE if stale else Decision.KEEP)


def test_restart_from_prompt_drops_the_response():
    s = Sample("p", (1, 2, 3, 4), 2, Status.COMPLETED, 1.0, (VersionSpan(0, 2, 3),), 5, 9,
               {"m": 1}, routes=np.zeros((3, 1, 1)), topk_ids=np.zeros((2, 1)),
               topk_logprobs=np.zeros((2, 1)))
    g = restart_from_prompt(SampleGroup((s,), "env", {"k": 1}))
    r = g.samples[0]
    assert (r.tokens, r.response_length, r.status, r.reward, r.versions) == \
        ((1, 2), 0, Status.PENDING, None, ())
    assert (r.routes, r.topk_ids, r.topk_logprobs) == (None, None, None)
    assert (r.group_index, r.index, r.metadata, g.environment, g.metadata) == \
        (5, 9, {"m": 1}, "env", {"k": 1})
    assert classify(g) is Stage.FRESH
