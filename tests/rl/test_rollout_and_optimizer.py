"""Rollout bookkeeping and the optimizer schedule: balanced mini-batches, population metrics,
the first update's learning rate, the dual clip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.rl import dapo, policy, rollout
from fp4rl.rl.token_logprobs import next_token_logprobs


def _generation(num_prompts: int, group_size: int, tr: int = 4) -> rollout.Generation:
    n = num_prompts * group_size
    return rollout.Generation(
        prompt_ids_NxTp=np.ones((n, 3), np.int32), prompt_mask_NxTp=np.ones((n, 3), bool),
        response_NxTr=np.ones((n, tr), np.int32), logp_NxTr=np.zeros((n, tr), np.float32),
        lengths_N=np.full(n, tr, np.int32), router_topk=np.zeros((1, n, tr, 2), np.int32),
        answers_P=np.zeros(num_prompts, np.int64))


def _pool_with_kept(kept: int, capacity: int = 4, group_size: int = 2) -> rollout.GroupPool:
    """One generation batch of `capacity` prompts of which the first `kept` have mixed rewards."""
    correct = -np.ones((capacity, group_size), np.float32)
    correct[:kept, 0] = 1.0
    pool = rollout.GroupPool(capacity)
    pool.add(_generation(capacity, group_size), correct, correct - 0.25)
    return pool


@pytest.mark.parametrize("kept", [1, 2, 3])
def test_kept_groups_are_spread_over_the_mini_batches(kept):
    """The kept groups come first in `filled()`; `balanced` deals them out so that no mini-batch
    is left without loss tokens while another has two or more (here: 4 groups, 2 mini-batches)."""
    pool = _pool_with_kept(kept)
    groups = rollout.balanced(pool.filled(), 2)
    arrays = rollout.training_arrays(groups, 2)
    tokens_per_minibatch = arrays["response_mask"].reshape(2, -1).sum(1)
    used_groups = arrays["used"].reshape(2, -1, 2)[:, :, 0].sum(1)
    assert sorted(used_groups.tolist()) == sorted([(kept + 1) // 2, kept // 2])
    assert (tokens_per_minibatch > 0).sum() == min(kept, 2)


def test_balanced_needs_equal_mini_batches():
    with pytest.raises(ValueError, match="equal mini-batches"):
        rollout.balanced(_pool_with_kept(1).filled(), 3)


def test_population_metrics_count_every_sampled_response():
    """Accuracy and reward over all sampled responses, dropped groups included."""
    pool = _pool_with_kept(1)  # 8 responses: 1 right (+1), 7 wrong (-1); shaped = correct - 0.25
    assert pool.accuracy == 1 / 8
    assert pool.reward_mean == pytest.approx((1 - 7) / 8 - 0.25)
    kept = rollout.training_arrays(pool.filled()[:1], 2)["shaped"]
    assert kept.mean() != pytest.approx(pool.reward_mean)  # the kept groups alone are biased upward


def test_first_update_moves_the_weights():
    """The warm-up schedule starts at lr / warmup_steps: a first AdamW step at LR 0 would only
    advance the moments."""
    optimizer = policy.make_optimizer(1e-2, 3, 0.0, 0.9, 0.99, 1.0)
    params = {"w": jnp.ones(4)}
    state = optimizer.init(params)
    updates, _ = optimizer.update({"w": jnp.full(4, 0.5)}, state, params)
    np.testing.assert_allclose(np.asarray(updates["w"]), -1e-2 / 3, rtol=1e-5)


def test_schedule_reaches_lr_after_warmup():
    optimizer = policy.make_optimizer(1e-2, 3, 0.0, 0.9, 0.99, 1.0)
    params = {"w": jnp.ones(1)}
    state = optimizer.init(params)
    sizes = []
    for _ in range(5):
        updates, state = optimizer.update({"w": jnp.ones(1)}, state, params)
        sizes.append(float(-updates["w"][0]))
    np.testing.assert_allclose(sizes, [1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2, 1e-2], rtol=1e-4)


def test_dual_clip_caps_negative_advantage_tokens():
    """Dual-clip (c=3): with A < 0 and ratio 5 the token's loss is -A*3, not -A*5, and it gets no
    gradient; positive-advantage tokens and ratios below c are unchanged."""
    adv = jnp.array([-1.0, -1.0, 1.0])
    lp_old = jnp.zeros((3, 1))
    mask = jnp.ones((3, 1), bool)

    def loss(lp_new, dual_clip):
        return dapo.token_level_dapo_loss(lp_new, lp_old, adv, mask, dual_clip=dual_clip)

    lp_new = jnp.log(jnp.array([[5.0], [2.0], [5.0]]))
    capped, stats = loss(lp_new, 3.0)
    uncapped, _ = loss(lp_new, None)
    # tokens: A=-1, r=5 -> 3 (capped; 5 uncapped); A=-1, r=2 -> 2; A=+1, r=5 -> -1.28 (clip-higher)
    np.testing.assert_allclose(float(capped), (3 + 2 - 1.28) / 3, rtol=1e-6)
    np.testing.assert_allclose(float(uncapped), (5 + 2 - 1.28) / 3, rtol=1e-6)
    assert float(stats["clip_frac_dual"]) == pytest.approx(1 / 3)
    grad = jax.grad(lambda lp: loss(lp, 3.0)[0])(lp_new)
    assert float(grad[0, 0]) == 0.0 and float(grad[1, 0]) != 0.0


def test_loss_config_validates():
    with pytest.raises(ValueError, match="valid options"):
        policy.LossConfig(kind="ppo")
    with pytest.raises(ValueError, match="dual_clip"):
        policy.LossConfig(dual_clip=0.5)
    assert policy.LossConfig().dual_clip == 3.0  # on by default (DAPO/verl's clip_ratio_c)


def test_logprobs_honour_the_temperature():
    logits = jax.random.normal(jax.random.key(0), (2, 5, 7))
    tokens = jax.random.randint(jax.random.key(1), (2, 5), 0, 7)
    got = next_token_logprobs(logits, tokens, 0.5)
    want = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1] / 0.5), tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    raw = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_array_equal(np.asarray(next_token_logprobs(logits, tokens, 0.0)), np.asarray(raw))
