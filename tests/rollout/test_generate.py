"""straw.rollout.generate: extend_sample tags each appended token range with its weight
version (merging a continuation of the same version); check_generated accepts a group
that only appends tagged tokens and refuses, naming the sample, one that rewrites tokens,
drops a sample, leaves new tokens untagged or returns something else."""

from __future__ import annotations

import dataclasses

import pytest

from straw.rollout import Sample, SampleGroup, Status
from straw.rollout.generate import check_generated, extend_sample
from straw.rollout.samples import VersionSpan


def group(*samples: Sample) -> SampleGroup:
    return SampleGroup(samples)


def fresh(index: int = 0) -> Sample:
    return Sample(("p",), tokens=(1, 2), group_index=7, index=index)


def test_extend_sample_tags_and_merges_version_spans():
    s = extend_sample(fresh(), [5, 6], weight_version=0)
    assert s.tokens == (1, 2, 5, 6) and s.response_length == 2
    assert s.versions == (VersionSpan(0, 2, 0),)
    s = extend_sample(s, [7], weight_version=0)  # same version, adjacent: one span
    assert s.versions == (VersionSpan(0, 3, 0),)
    s = extend_sample(s, [8, 9], weight_version=1, status=Status.COMPLETED, reward=0.5)
    assert s.versions == (VersionSpan(0, 3, 0), VersionSpan(3, 5, 1))
    assert s.weight_versions == (0, 1) and s.finished
    assert extend_sample(s, [], weight_version=2).versions == s.versions


def test_check_generated_accepts_appended_tagged_tokens():
    before = group(fresh(0), fresh(1))
    after = group(*(extend_sample(s, [3], weight_version=2) for s in before))
    assert check_generated(before, after, 2) is after
    again = group(*(extend_sample(s, [4], weight_version=2) for s in after))
    assert check_generated(after, again, 2) is again  # merged span: still valid
    assert check_generated(before, before, 2) is before  # nothing generated (aborted)


@pytest.mark.parametrize("breaks, message", [
    (lambda s: dataclasses.replace(s, tokens=(9, 9, 3), response_length=1,
                                   versions=(VersionSpan(0, 1, 2),)), "do not extend"),
    (lambda s: dataclasses.replace(s, tokens=s.tokens + (3,), response_length=1),
     "only 0 tagged with weight version 2"),
    (lambda s: extend_sample(s, [3], weight_version=1), "only 0 tagged with weight version 2"),
    (lambda s: dataclasses.replace(s, tokens=s.tokens + (3, 4), response_length=1,
                                   versions=(VersionSpan(0, 1, 2),)),
     "2 tokens appended but response_length grew by 1"),
    (lambda s: dataclasses.replace(s, index=5), "no such sample"),
])
def test_check_generated_refuses_naming_the_sample(breaks, message):
    before = group(fresh(0), fresh(1))
    after = group(before.samples[0], breaks(before.samples[1]))
    with pytest.raises(ValueError, match=message) as exc:
        check_generated(before, after, 2)
    assert "group 7 sample" in str(exc.value)


def test_check_generated_refuses_rewritten_spans_and_other_shapes():
    s = extend_sample(fresh(), [3, 4], weight_version=0)
    before = group(s)
    relabelled = group(extend_sample(dataclasses.replace(
        s, versions=(VersionSpan(0, 2, 5),)), [6], weight_version=1))
    with pytest.raises(ValueError, match="version spans of its earlier tokens changed"):
        check_generated(before, relabelled, 1)
    with pytest.raises(ValueError, match="return the samples it was given"):
        check_generated(group(fresh(0), fresh(1)), before, 0)
    with pytest.raises(TypeError, match="returned list, not a SampleGroup"):
        check_generated(before, [], 0)
