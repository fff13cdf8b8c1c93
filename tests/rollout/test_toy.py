"""The toy policy of the demo (straw.rollout.toy): it learns its task, deterministically,
implements the generate-function protocol (version tagging, abort -> a partial group that
a later call continues) and refuses what it cannot do."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from straw.rollout import Sample, SampleGroup, Stage, Status
from straw.rollout.generate import check_generated
from straw.rollout.samples import VersionSpan, classify
from straw.rollout.toy import ToyPolicy, ToyTask, grpo_advantages

TASK = ToyTask(length=4, vocab=8)


def group(prompt, gi=0, n=4):
    return SampleGroup(tuple(Sample(prompt, group_index=gi, index=gi * n + i)
                             for i in range(n)))


def generate(policy, g, abort=None, version=None):
    ev = abort if abort is not None else asyncio.Event()
    v = policy.version if version is None else version
    return asyncio.run(policy.generate(g, weight_version=v, abort=ev))


def train(seed, steps=30, groups=8, lr=8.0):
    """The demo's loop without the queue: rollouts, GRPO advantages, one update each."""
    policy = ToyPolicy(TASK, seed=seed, lr=lr)
    prompts = TASK.prompts(64, seed=seed)
    rewards = []
    gi = 0
    for _ in range(steps):
        batch = []
        for _ in range(groups):
            batch.append(generate(policy, group(prompts[gi % len(prompts)], gi)))
            gi += 1
        raw = [[s.reward for s in g] for g in batch]
        rewards.append(float(np.mean(raw)))
        adv = grpo_advantages(raw)
        version = policy.update((s.prompt, s.tokens[-s.response_length:], a)
                                for g, row in zip(batch, adv, strict=True)
                                for s, a in zip(g, row, strict=True))
        assert version == policy.version
    return policy, rewards, prompts


def test_the_policy_learns_the_task_and_its_run_is_deterministic():
    policy, rewards, prompts = train(seed=3)
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert first < 0.25  # about 1 / vocab: a uniform policy
    assert last > first + 0.3, rewards
    assert policy.greedy_reward(prompts) > 0.7
    assert policy.version == 30
    again, rewards2, _ = train(seed=3)
    assert rewards2 == rewards
    assert np.array_equal(again.weights, policy.weights)
    _, rewards3, _ = train(seed=4, steps=3)
    assert rewards3 != rewards[:3]


def test_generate_completes_every_sample_with_its_reward_and_version():
    policy = ToyPolicy(TASK, seed=1)
    w = np.random.default_rng(0).normal(size=policy.weights.shape)
    policy.load(w, 5)
    g = generate(policy, group((1, 2, 3, 4), gi=7))
    assert classify(g) is Stage.READY
    for s in g:
        assert s.status is Status.COMPLETED
        # the response only is appended (the protocol's rule: check_generated passes)
        assert len(s.tokens) == 4 and s.response_length == 4
        assert s.versions == (VersionSpan(0, 4, 5),)
        assert s.reward == TASK.reward((1, 2, 3, 4), s.tokens)
        assert 0.0 <= s.reward <= 1.0
    assert check_generated(group((1, 2, 3, 4), gi=7), g, 5) == g
    # deterministic given seed, version and the group's indices; another version differs
    assert generate(policy, group((1, 2, 3, 4), gi=7)) == g
    policy.load(w, 6)
    other = generate(policy, group((1, 2, 3, 4), gi=7))
    assert [s.tokens for s in other] != [s.tokens for s in g]
    assert other.samples[0].versions == (VersionSpan(0, 4, 6),)


def test_abort_returns_a_partial_group_that_a_later_version_continues():
    policy = ToyPolicy(TASK, seed=2)
    w = policy.weights

    async def aborted_after(n, g):
        abort = asyncio.Event()

        async def watch():
            while policy.tokens_generated < n:
                await asyncio.sleep(0)
            abort.set()
        watcher = asyncio.create_task(watch())
        out = await policy.generate(g, weight_version=policy.version, abort=abort)
        await watcher
        return out

    g = asyncio.run(aborted_after(6, group((5, 6, 7, 0), gi=3)))
    assert classify(g) is Stage.PARTIAL
    first, second, *rest = g.samples
    assert first.status is Status.COMPLETED and first.reward is not None
    assert second.status is Status.ABORTED and second.reward is None  # mid-sample
    assert second.response_length == 2 and second.versions == (VersionSpan(0, 2, 0),)
    assert all(s.response_length == 0 and s.status is Status.PENDING for s in rest)
    # the same version continues it exactly as an uninterrupted generation would
    whole = generate(policy, group((5, 6, 7, 0), gi=3))
    assert generate(policy, g) == whole
    # a new version continues it, tagging only the new tokens with the new version
    policy.load(w, 1)
    done = generate(policy, g)
    assert classify(done) is Stage.READY
    assert done.samples[0] == first  # finished samples are left alone
    assert done.samples[1].tokens[:2] == second.tokens
    assert done.samples[1].versions == (VersionSpan(0, 2, 0), VersionSpan(2, 4, 1))
    assert done.samples[2].versions == (VersionSpan(0, 4, 1),)
    # an abort set before the call returns the group as it is
    ev = asyncio.Event()
    ev.set()
    assert generate(policy, g, abort=ev) == g


def test_the_task_reward_and_grpo_advantages():
    assert TASK.reward((1, 2, 3, 4), (4, 3, 2, 1)) == 1.0
    assert TASK.reward((1, 2, 3, 4), (4, 3, 0, 0)) == 0.5
    assert TASK.reward((1, 2, 3, 4), (1, 2, 3, 4)) == 0.0
    assert TASK.prompts(5, seed=1) == TASK.prompts(5, seed=1) != TASK.prompts(5, seed=2)
    adv = grpo_advantages([[1.0, 0.0, 0.5, 0.5], [0.25, 0.25]])
    assert abs(sum(adv[0])) < 1e-9 and adv[0][0] > 0 > adv[0][1]
    assert np.isclose(np.std(adv[0]), 1.0)
    assert adv[1] == [0.0, 0.0]  # equal rewards teach nothing


def test_bad_input_is_refused_with_what_to_do():
    policy = ToyPolicy(TASK)
    with pytest.raises(ValueError, match="load those weights first"):
        generate(policy, group((1, 2, 3, 4)), version=3)
    with pytest.raises(ValueError, match="4 token ids in 0..7"):
        generate(policy, group((1, 2, 9, 4)))
    with pytest.raises(TypeError, match="SampleGroup"):
        generate(policy, [Sample((1, 2, 3, 4))])
    with pytest.raises(ValueError, match="another ToyTask"):
        policy.load(np.zeros((3, 3, 8, 8)), 1)
    with pytest.raises(ValueError, match="NaN"):
        policy.load(np.full(policy.weights.shape, np.nan), 1)
    with pytest.raises(ValueError, match="4-token prompt"):
        policy.update([((1, 2, 3), (4, 3, 2, 1), 1.0)])
    with pytest.raises(ValueError, match="not finite"):
        policy.update([((1, 2, 3, 4), (4, 3, 2, 1), float("nan"))])
    with pytest.raises(ValueError, match="at least one sample"):
        policy.update([])
    assert policy.version == 0  # nothing refused changed the policy
    with pytest.raises(ValueError, match="ToyTask.vocab"):
        ToyTask(vocab=1)
