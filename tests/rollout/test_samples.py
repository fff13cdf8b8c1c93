"""straw.rollout.samples: validation of samples and groups, stage classification, capture
coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from straw.rollout.samples import (
    Sample,
    SampleGroup,
    Stage,
    Status,
    VersionSpan,
    captures_cover,
    captures_cover_group,
    classify,
)


def sample(response=0, status=Status.PENDING, reward=None, prompt="p", gid=0, index=0,
           **kw):
    tokens = tuple(range(3 + response))
    return Sample(prompt, tokens, response, status, reward, group_index=gid, index=index, **kw)


def test_group_of_different_prompts_is_an_error():
    with pytest.raises(ValueError, match="one prompt"):
        SampleGroup((sample(prompt="a"), sample(prompt="b", index=1)))
    with pytest.raises(ValueError, match="group index 1"):
        SampleGroup((sample(gid=0), sample(gid=1, index=1)))


def test_prompts_that_cannot_be_compared_are_a_clear_error():
    a, b = np.zeros(3), np.zeros(3)
    with pytest.raises(TypeError, match="cannot be compared"):
        SampleGroup((Sample(a, group_index=0, index=0), Sample(b, group_index=0, index=1)))
    assert SampleGroup((Sample(a, index=0), Sample(a, index=1))).prompt is a  # same object


def test_group_repeating_a_sample_index_is_an_error():
    with pytest.raises(ValueError, match="repeats sample index 0"):
        SampleGroup((sample(), sample()))


def test_empty_group_is_an_error():
    with pytest.raises(ValueError, match="at least one sample"):
        SampleGroup(())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"acc": math.nan}, 10**400])
def test_non_finite_reward_is_an_error(bad):
    with pytest.raises(ValueError, match="finite"):
        sample(2, Status.COMPLETED, bad)


@pytest.mark.parametrize("bad", ["1.0", True, np.float32(1.0), {1: 1.0}])
def test_reward_of_wrong_type_is_an_error(bad):
    with pytest.raises(TypeError):
        sample(2, Status.COMPLETED, bad)


def test_reward_mapping_and_int_are_normalised_to_floats():
    assert sample(1, Status.COMPLETED, 1).reward == 1.0
    assert isinstance(sample(1, Status.COMPLETED, 1).reward, float)
    assert sample(1, Status.COMPLETED, {"acc": 1}).reward == {"acc": 1.0}


def test_response_longer_than_tokens_is_an_error():
    with pytest.raises(ValueError, match="exceeds its 2 tokens"):
        Sample("p", (1, 2), 3)


def test_version_spans_must_lie_in_the_response_in_order():
    with pytest.raises(ValueError, match="beyond its response of 2"):
        sample(2, versions=(VersionSpan(0, 3, 1),))
    with pytest.raises(ValueError, match="do not overlap"):
        sample(4, versions=(VersionSpan(0, 2, 1), VersionSpan(1, 3, 2)))
    with pytest.raises(ValueError, match="stop > start"):
        VersionSpan(2, 2, 1)
    with pytest.raises(TypeError, match="int or a str"):
        VersionSpan(0, 1, 1.5)
    s = sample(4, versions=(VersionSpan(0, 2, 1), VersionSpan(2, 4, "x")))
    assert s.weight_versions == (1, "x")


def test_tokens_must_be_ints_and_status_known():
    with pytest.raises(TypeError, match=r"tokens\[1\]"):
        Sample("p", (1, "2"))
    with pytest.raises(ValueError):
        Sample("p", status="done")


def test_stage_ready_partial_fresh():
    done = sample(2, Status.COMPLETED, 1.0)
    trunc = sample(2, Status.TRUNCATED, 0.0, index=1)
    assert classify(SampleGroup((done, trunc))) is Stage.READY
    # finished without a reward: partial, not ready
    unscored = sample(2, Status.COMPLETED, None, index=1)
    assert classify(SampleGroup((done, unscored))) is Stage.PARTIAL
    aborted = sample(1, Status.ABORTED, index=1)
    assert classify(SampleGroup((done, aborted))) is Stage.PARTIAL
    assert classify(SampleGroup((sample(), sample(index=1)))) is Stage.FRESH
    # an aborted sample with a reward is not finished
    assert classify(SampleGroup((sample(0, Status.ABORTED, 1.0),))) is Stage.FRESH
    assert [int(s) for s in Stage] == [0, 1, 2]


statuses = st.sampled_from(list(Status))


@given(st.lists(st.tuples(st.integers(0, 3), statuses, st.booleans()), min_size=1, max_size=6))
def test_stage_property(specs):
    group = SampleGroup(tuple(sample(r, s, 1.0 if rewarded else None, index=i)
                              for i, (r, s, rewarded) in enumerate(specs)))
    stage = classify(group)
    ready = all(s in (Status.COMPLETED, Status.TRUNCATED) and rewarded
                for _, s, rewarded in specs)
    partial = any(r > 0 for r, _, _ in specs)
    assert stage is (Stage.READY if ready else Stage.PARTIAL if partial else Stage.FRESH)


def test_captures_cover_tokens():
    ok = sample(4, routes=np.zeros((6, 2, 2)), topk_ids=np.zeros((4, 3)),
                topk_logprobs=np.zeros((4, 3)))
    assert captures_cover(ok)
    assert not captures_cover(sample(4, routes=np.zeros((5, 2, 2))))
    assert not captures_cover(sample(4, topk_ids=np.zeros((3, 3)),
                                     topk_logprobs=np.zeros((3, 3))))
    assert not captures_cover(sample(4, topk_ids=np.zeros((4, 3))))  # half of SC
    assert captures_cover(sample(0, routes=np.zeros((1, 2, 2))))  # nothing generated yet
    assert captures_cover(sample(2))  # no captures at all
    group = SampleGroup((ok, sample(4, index=1, routes=np.zeros((2, 1, 1)))))
    assert not captures_cover_group(group)
    with pytest.raises(TypeError, match="at least one dimension"):
        sample(1, routes=np.float32(1))


def test_group_properties():
    g = SampleGroup((sample(2), sample(1, index=1)), "math", {"k": 1})
    assert (g.prompt, g.group_index, g.tokens, len(g), g.environment) == ("p", 0, 9, 2, "math")
    assert list(g) == list(g.samples)


@pytest.mark.parametrize("given, field, want", [
    ({"reward": 1}, "reward", 1.0),  # an int reward is stored as a float
    ({"reward": np.float64(2.5)}, "reward", 2.5),  # a float subclass as a plain float
    ({"tokens": [1, 2]}, "tokens", (1, 2)),
    ({"versions": [VersionSpan(0, 1, 3)]}, "versions", (VersionSpan(0, 1, 3),)),
    ({"status": "completed"}, "status", Status.COMPLETED),
])
def test_common_values_take_the_short_checks_and_come_out_as_the_full_ones(given, field, want):
    # Sample's checks have a short path for the values engines give (exact ints, a
    # Status, a float reward): whatever path a value takes, the stored field is the same
    s = Sample("p", **{"tokens": (1, 2), "response_length": 1, **given})
    assert getattr(s, field) == want and type(getattr(s, field)) is type(want)


@pytest.mark.parametrize("given, error", [
    ({"reward": float("nan")}, ValueError), ({"reward": True}, TypeError),
    ({"response_length": True}, TypeError), ({"response_length": -1}, ValueError),
    ({"index": 2**63}, ValueError), ({"group_index": 1.0}, TypeError),
    ({"tokens": (1, True)}, TypeError), ({"tokens": (2**63,)}, ValueError),
])
def test_values_off_the_short_path_get_the_full_checks(given, error):
    with pytest.raises(error):
        Sample("p", **{"tokens": (1, 2), "response_length": 1, **given})
