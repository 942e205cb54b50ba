"""DAPO/GRPO objectives against NumPy float64 oracles and behavioural invariants
(docs/design.md practice 11: advantages sum to zero per group, importance ratio exactly 1 on-policy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.rl import dapo

def _rng(seed=0):
    # A fresh generator per test: values do not depend on test order or selection.
    return np.random.default_rng(seed)


def _np_clip_loss(lp_new, lp_old, adv_N, mask, eps_low, eps_high):
    ratio = np.exp(lp_new - lp_old)
    a = adv_N[:, None]
    tok = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps_low, 1 + eps_high))
    return tok, ratio


# One compiled program per use (eager op-by-op dispatch of a grad is slow on a busy CPU).
_dapo_value_and_grad = jax.jit(jax.value_and_grad(dapo.token_level_dapo_loss, has_aux=True))


def _inputs(N=6, T=9, seed=0):
    RNG = _rng(seed)
    lp_old = np.log(RNG.uniform(0.05, 1.0, (N, T)))
    lp_new = lp_old + RNG.normal(0, 0.3, (N, T))
    lengths = RNG.integers(1, T + 1, N)
    mask = np.arange(T)[None, :] < lengths[:, None]
    adv = RNG.normal(size=N)
    return lp_new, lp_old, adv, mask


def test_group_advantages_oracle_and_zero_sum():
    RNG = _rng(1)
    r = RNG.normal(size=(5, 8)).astype(np.float32)
    r[1] = 1.0  # an all-equal group
    r[3] = 0.1  # all equal, but 0.1 is inexact in float32: the mean is not exactly 0.1
    adv = np.asarray(dapo.group_advantages(jnp.asarray(r)))
    r64 = r.astype(np.float64)
    expected = (r64 - r64.mean(1, keepdims=True)) / (r64.std(1, ddof=1, keepdims=True) + 1e-6)
    expected[[1, 3]] = 0.0
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)  # float32 arithmetic
    np.testing.assert_allclose(adv.sum(1), 0.0, atol=1e-5)  # zero-sum per group
    np.testing.assert_array_equal(adv[[1, 3]], 0.0)  # exactly zero, not ~1e-2


def test_group_advantages_binary_rewards():
    # G = 4 with one success: mean -0.5, sample std 1, so advantages 1.5 and -0.5 (/(1+eps)).
    adv = dapo.group_advantages(jnp.array([[1.0, -1.0, -1.0, -1.0]]))
    np.testing.assert_allclose(np.asarray(adv), [[1.5, -0.5, -0.5, -0.5]], rtol=1e-5)
    with pytest.raises(ValueError, match="G >= 2"):
        dapo.group_advantages(jnp.ones((3, 1)))


def test_dynamic_sampling_keep():
    r = jnp.array([[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, -1, -1], [-1, -1, -1, 1],
                   [0.5, 0.5, 0.5, 0.25]])
    np.testing.assert_array_equal(np.asarray(dapo.dynamic_sampling_keep(r)),
                                  [False, False, True, True, True])


def test_token_level_loss_matches_oracle():
    lp_new, lp_old, adv, mask = _inputs()
    loss, stats = jax.jit(dapo.token_level_dapo_loss)(lp_new, lp_old, adv, mask)
    tok, ratio = _np_clip_loss(lp_new, lp_old, adv, mask, 0.2, 0.28)
    # Token-level: one mean over all response tokens of the batch, not per sequence.
    np.testing.assert_allclose(float(loss), tok[mask].mean(), rtol=1e-5)
    a = np.broadcast_to(adv[:, None], mask.shape)
    up = ((a > 0) & (ratio > 1.28))[mask].mean()
    lo = ((a < 0) & (ratio < 0.8))[mask].mean()
    assert 0 < up and 0 < lo  # the inputs exercise both sides
    np.testing.assert_allclose(float(stats["clip_frac_upper"]), up, rtol=1e-6)
    np.testing.assert_allclose(float(stats["clip_frac_lower"]), lo, rtol=1e-6)
    np.testing.assert_allclose(float(stats["ratio_mean"]), ratio[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(stats["ratio_max"]), ratio[mask].max(), rtol=1e-5)
    k3 = (ratio - 1 - np.log(ratio))[mask].mean()
    np.testing.assert_allclose(float(stats["approx_kl"]), k3, rtol=1e-4)


def test_clip_higher_is_asymmetric_and_clipped_tokens_get_no_gradient():
    # One token per case: (advantage, ratio).
    cases = [(1.0, 1.25), (1.0, 1.3), (-1.0, 0.85), (-1.0, 0.75), (1.0, 0.5), (-1.0, 1.5)]
    adv = jnp.array([a for a, _ in cases])
    lp_old = jnp.zeros((len(cases), 1))
    lp_new = jnp.log(jnp.array([[r] for _, r in cases]))
    mask = jnp.ones((len(cases), 1), bool)
    (_, stats), g = _dapo_value_and_grad(lp_new, lp_old, adv, mask)
    nonzero = np.asarray(g[:, 0]) != 0
    # 1.25 < 1+0.28 not clipped; 1.3 clipped; 0.85 > 0.8 not clipped; 0.75 clipped;
    # the pessimistic side (A>0 with r<1, A<0 with r>1) is never clipped.
    np.testing.assert_array_equal(nonzero, [True, False, True, False, True, True])
    assert float(stats["clip_frac_upper"]) == pytest.approx(1 / 6)
    assert float(stats["clip_frac_lower"]) == pytest.approx(1 / 6)


def test_on_policy_ratio_is_one_and_gradient_is_policy_gradient():
    """With logp_new == logp_old the ratio is exactly 1 and the loss gradient equals
    -(1/#tokens) * sum_tokens A * grad logp (the REINFORCE gradient)."""
    RNG = _rng(1)
    N, T, V, D = 4, 5, 7, 3
    feats = jnp.asarray(RNG.normal(size=(N, T, D)), jnp.float32)
    tokens = jnp.asarray(RNG.integers(0, V, (N, T)))
    mask = jnp.asarray(np.arange(T)[None, :] < np.array([5, 3, 1, 4])[:, None])
    adv = jnp.asarray(RNG.normal(size=N), jnp.float32)
    theta = jnp.asarray(RNG.normal(size=(D, V)), jnp.float32)

    def logp(th):
        lp = jax.nn.log_softmax(feats @ th, axis=-1)
        return jnp.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]

    def reinforce(th):
        return -jnp.sum(jnp.where(mask, adv[:, None] * logp(th), 0)) / mask.sum()

    @jax.jit
    def run(th):
        lp_old = jax.lax.stop_gradient(logp(th))
        (_, stats), g = jax.value_and_grad(
            lambda t: dapo.token_level_dapo_loss(logp(t), lp_old, adv, mask), has_aux=True)(th)
        return stats, g, jax.grad(reinforce)(th), lp_old

    stats, g, pg, lp = run(theta)
    assert float(stats["ratio_mean"]) == 1.0 and float(stats["ratio_max"]) == 1.0
    assert float(stats["clip_frac_upper"]) == 0.0 and float(stats["clip_frac_lower"]) == 0.0
    assert float(stats["approx_kl"]) == 0.0
    np.testing.assert_allclose(np.asarray(g), np.asarray(pg), rtol=1e-5, atol=1e-7)
    # At the logp level the gradient is exactly -A/#tokens on response tokens, 0 elsewhere.
    _, g_lp = _dapo_value_and_grad(lp, lp, adv, mask)
    expected = np.where(np.asarray(mask), -np.asarray(adv)[:, None] / float(mask.sum()), 0)
    np.testing.assert_allclose(np.asarray(g_lp), expected, rtol=1e-6)


def test_padding_garbage_does_not_leak():
    lp_new, lp_old, adv, mask = _inputs()
    lp_new = np.where(mask, lp_new, np.inf)
    lp_old = np.where(mask, lp_old, -np.inf)
    (loss, _), g = _dapo_value_and_grad(lp_new, lp_old, adv, mask)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_array_equal(np.asarray(g)[~mask], 0.0)
    loss, g = jax.jit(jax.value_and_grad(
        lambda x: dapo.grpo_loss(x, lp_old, lp_old, adv, mask, kl_coef=0.1)[0]))(lp_new)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
    assert float(dapo.masked_mean(jnp.ones(3), jnp.zeros(3, bool))) == 0.0


def test_grpo_loss_matches_oracle():
    RNG = _rng(1)
    lp_new, lp_old, adv, mask = _inputs()
    lp_ref = lp_old + RNG.normal(0, 0.2, lp_old.shape)
    grpo = jax.jit(lambda *a: dapo.grpo_loss(*a, kl_coef=0.05))
    loss, stats = grpo(lp_new, lp_old, lp_ref, adv, mask)
    tok, _ = _np_clip_loss(lp_new, lp_old, adv, mask, 0.2, 0.2)
    kl = np.exp(lp_ref - lp_new) - (lp_ref - lp_new) - 1  # DeepSeekMath eq. 4
    per_seq = [(tok + 0.05 * kl)[n][mask[n]].mean() for n in range(len(adv))]
    np.testing.assert_allclose(float(loss), np.mean(per_seq), rtol=1e-5)
    np.testing.assert_allclose(float(stats["kl_ref"]), kl[mask].mean(), rtol=1e-4)


def test_tis_weights_truncate_and_stop_gradient():
    lt = jnp.array([0.0, 0.0, -1.0, 0.5])
    ls = jnp.array([0.0, 1.0, 0.0, -1.0])  # ratios 1, e^-1, e^-1, e^1.5 -> capped at 2
    expected = [1, np.exp(-1), np.exp(-1), 2]
    np.testing.assert_allclose(np.asarray(dapo.tis_weights(lt, ls)), expected, rtol=1e-6)
    grad = jax.jit(jax.grad(lambda x: dapo.tis_weights(x, ls).sum()))(lt)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)
    # In the loss the weight scales each token's term.
    lp_new, lp_old, adv, mask = _inputs()
    base, _ = _np_clip_loss(lp_new, lp_old, adv, mask, 0.2, 0.28)
    w = _rng(2).uniform(0.0, 2.0, lp_old.shape)  # per-token weights
    loss, _ = jax.jit(dapo.token_level_dapo_loss)(lp_new, lp_old, adv, mask, tis_weight_NxT=w)
    np.testing.assert_allclose(float(loss), (base * w)[mask].mean(), rtol=1e-5)


def test_kl_estimators_expectation_is_exact_kl():
    RNG = _rng(1)
    # E_{x~p}[k1] = E_{x~p}[k3] = KL(p||q): sum over a small vocabulary, no sampling noise.
    p = RNG.dirichlet(np.ones(6))
    q = RNG.dirichlet(np.ones(6))
    kl = float(np.sum(p * np.log(p / q)))
    lp, lq = jnp.log(jnp.asarray(p, jnp.float32)), jnp.log(jnp.asarray(q, jnp.float32))
    assert float(jnp.sum(p * dapo.kl_k1(lp, lq))) == pytest.approx(kl, rel=1e-4)
    assert float(jnp.sum(p * dapo.kl_k3(lp, lq))) == pytest.approx(kl, rel=1e-4)
    assert float(jnp.min(dapo.kl_k3(lp, lq))) >= 0.0


def test_mismatch_stats():
    lt = jnp.array([[0.0, -1.0, -2.0, 7.0]])
    ls = jnp.array([[0.0, -1.5, -1.0, -9.0]])
    mask = jnp.array([[True, True, True, False]])
    s = dapo.mismatch_stats(lt, ls, mask)
    d = np.array([0.0, 0.5, -1.0])  # trainer - sampler on the 3 response tokens
    assert float(s["mismatch_k1"]) == pytest.approx(np.mean(-d), abs=1e-6)
    assert float(s["mismatch_k3"]) == pytest.approx(np.mean(np.expm1(d) - d), rel=1e-5)
    assert float(s["mismatch_abs_max"]) == 1.0
    assert float(s["mismatch_abs_mean"]) == pytest.approx(0.5)
    assert float(s["mismatch_exp_abs_mean"]) == pytest.approx(np.mean(np.exp(np.abs(d))), rel=1e-6)


def test_token_entropy():
    logits = jnp.array([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    entropy = np.asarray(dapo.token_entropy(logits))
    np.testing.assert_allclose(entropy, [[np.log(4), 0.0]], atol=1e-6)
