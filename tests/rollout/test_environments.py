"""straw.rollout.environments: per-batch quotas keep the configured proportions; a backlog
drains at its environment's share while that environment admits nothing fresh; a single
environment needs no id."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from straw.rollout.environments import EnvironmentMix, MixState
from straw.rollout.samples import Sample, SampleGroup

weights = st.dictionaries(st.sampled_from("abcdefg"),
                          st.one_of(st.integers(1, 30), st.floats(0.01, 10.0)),
                          min_size=1, max_size=7)


@given(weights, st.integers(1, 64), st.integers(1, 60))
def test_every_batch_keeps_the_proportions(w, batch_size, batches):
    mix = EnvironmentMix(w, batch_size)
    state, totals = MixState(), dict.fromkeys(w, 0)
    for b in range(1, batches + 1):
        quota = mix.quota(state)
        assert sum(quota.values()) == batch_size
        for env in w:
            share = mix.share[env]
            assert quota[env] in (math.floor(share), math.ceil(share))  # floor or ceiling
            totals[env] += quota[env]
            # and the ceilings rotate: no environment drifts from its exact share
            assert abs(totals[env] - b * share) < 2
        composition, state = mix.compose(state, {})
        assert dict(composition.fresh) == quota
        assert mix.quota(MixState.from_dict(state.to_dict())) == mix.quota(state)


def test_ceilings_rotate_between_equal_environments():
    mix = EnvironmentMix({"a": 1, "b": 1}, 3)
    state, seen = MixState(), []
    for _ in range(4):
        seen.append(mix.quota(state))
        _, state = mix.compose(state, {})
    assert seen == [{"a": 2, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 1}, {"a": 1, "b": 2}]


def test_backlog_drains_at_its_share_while_fresh_admission_is_off():
    # the Megatron case: 50/50, after a restart 100 A groups and 2 B groups come back
    mix = EnvironmentMix({"A": 1, "B": 1}, 8)
    state, backlog = MixState(), {"A": 100, "B": 2}
    first, state = mix.compose(state, backlog)
    assert dict(first.from_backlog) == {"A": 4, "B": 2}
    assert dict(first.fresh) == {"A": 0, "B": 2}
    backlog = {e: backlog[e] - first.from_backlog[e] for e in backlog}
    assert not mix.admits_fresh("A", backlog) and mix.admits_fresh("B", backlog)
    batches = 1
    while backlog["A"]:
        c, state = mix.compose(state, backlog)
        assert c.from_backlog["A"] == min(4, backlog["A"]) and c.fresh["B"] == 4
        assert c.total("A") == c.total("B") == 4  # proportions kept in every batch
        if c.from_backlog["A"] == 4:
            assert c.fresh["A"] == 0  # A generates nothing new while its backlog lasts
        backlog["A"] -= c.from_backlog["A"]
        batches += 1
    assert batches == 25  # 100 groups at A's share of 4 per batch
    assert mix.admits_fresh("A", backlog)


@given(weights, st.integers(1, 32), st.dictionaries(st.sampled_from("abcdefg"),
                                                    st.integers(0, 50)))
def test_compose_fills_each_quota_from_its_backlog_first(w, batch_size, backlog):
    mix = EnvironmentMix(w, batch_size)
    backlog = {e: n for e, n in backlog.items() if e in w}
    c, state = mix.compose(MixState(), backlog)
    quota = mix.quota(MixState())
    for env in w:
        assert c.total(env) == quota[env]
        assert c.from_backlog[env] == min(quota[env], backlog.get(env, 0))
        assert c.fresh[env] == 0 or c.from_backlog[env] == backlog.get(env, 0)
    assert state.batches == 1
    assert mix.compose(MixState(), backlog) == (c, state)  # deterministic


def test_single_environment_needs_no_id():
    mix = EnvironmentMix.single(16)
    group = SampleGroup((Sample("p"),))
    assert mix.environment_of(group) == ""
    assert mix.quota(MixState()) == {"": 16}


def test_bad_configuration_and_unknown_environments():
    with pytest.raises(ValueError, match="non-empty id"):
        EnvironmentMix({"": 1, "b": 1}, 8)
    with pytest.raises(ValueError, match="> 0"):
        EnvironmentMix({"a": 0, "b": 1}, 8)
    with pytest.raises(ValueError, match="> 0"):
        EnvironmentMix({"a": math.nan}, 8)
    with pytest.raises(TypeError):
        EnvironmentMix({"a": "1"}, 8)
    with pytest.raises(ValueError, match="non-empty mapping"):
        EnvironmentMix({}, 8)
    with pytest.raises(ValueError, match="batch_size"):
        EnvironmentMix({"a": 1}, 0)
    mix = EnvironmentMix({"a": 1, "b": 3}, 8)
    with pytest.raises(ValueError, match="needs its environment id"):
        mix.environment_of(SampleGroup((Sample("p"),)))
    with pytest.raises(ValueError, match="'c' is not configured"):
        mix.environment_of(SampleGroup((Sample("p"),), "c"))
    with pytest.raises(ValueError, match="backlog names environment 'c'"):
        mix.compose(MixState(), {"c": 1})
    with pytest.raises(ValueError, match="environment set changed"):
        mix.quota(MixState(3, {"c": 1}))
    with pytest.raises(ValueError):
        MixState.from_dict({"batches": 1})


def test_a_backlog_short_of_its_quota_admits_fresh_work():
    # issue 39: with a per-batch quota of 2 and a backlog of 1, no environment admitted
    # fresh work and no batch could ever be composed (next_batch returned None for ever)
    mix = EnvironmentMix({"A": 1, "B": 1}, 4)
    state = MixState()
    assert mix.quota(state) == {"A": 2, "B": 2}
    backlog = {"A": 1, "B": 0}
    assert mix.admits_fresh("A", backlog, state) and mix.admits_fresh("B", backlog, state)
    assert not mix.admits_fresh("A", {"A": 2}, state)  # a full quota drains first
    c, _ = mix.compose(state, backlog)
    assert dict(c.from_backlog) == {"A": 1, "B": 0} and dict(c.fresh) == {"A": 1, "B": 2}
    # an environment whose next quota is 0 still admits while its backlog is empty
    odd = EnvironmentMix({"A": 1, "B": 7}, 2)
    assert odd.quota(MixState())["A"] == 0 and odd.admits_fresh("A", {}, MixState())
