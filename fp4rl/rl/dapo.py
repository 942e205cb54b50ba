"""DAPO / GRPO objectives as pure jnp functions (docs/rl.md, "Algorithm: DAPO").

Shape letters: P prompts, G responses per prompt (the group), N = P*G responses,
T response tokens. Log-probs are those of the sampled tokens, `logp_NxT`; `mask_NxT` is
True on response tokens (False on padding and after EOS). Every function is jit-safe and
takes no Python control flow on values.

References: DAPO (Yu et al. 2025, arXiv:2503.14476) for clip-higher, the token-level loss
and dynamic sampling; GRPO (Shao et al. 2024, DeepSeekMath) for the group advantage, the
sequence-mean loss and the k3 KL to the reference; Schulman, "Approximating KL
Divergence" (2020) for the k1/k3 estimators; Yao et al. 2025 ("Your efficient RL framework
secretly brings you off-policy RL training") for truncated importance sampling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.rl.token_logprobs import entropy, sampling_logprobs


def masked_mean(x, mask, axis=None):
    """Mean of `x` over `mask`; 0 where the mask is empty (not NaN).

    Uses `where`, not `x * mask`, so garbage (inf/NaN) at masked positions cannot leak.
    """
    x = jnp.asarray(x)
    x = x.astype(jnp.float32) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    total = jnp.sum(jnp.where(mask, x, 0), axis=axis)
    return total / jnp.maximum(jnp.sum(mask, axis=axis), 1).astype(total.dtype)


def kl_k1(logp_p, logp_q):
    """Per-token k1 estimate of KL(p || q) from tokens sampled from p: log p - log q.

    Unbiased but high variance and can be negative per token."""
    return logp_p - logp_q


def kl_k3(logp_p, logp_q):
    """Per-token k3 estimate of KL(p || q) from tokens sampled from p:
    q/p - 1 - log(q/p). Unbiased, always >= 0, low variance (Schulman 2020)."""
    log_r = logp_q - logp_p
    return jnp.expm1(log_r) - log_r


def group_advantages(rewards_PxG, eps: float = 1e-6) -> np.ndarray:
    """GRPO/DAPO advantage (r - mean_group) / (std_group + eps), one per response, in float32
    NumPy: rewards come from the host's verifier, and the advantages go into the batch the host
    assembles (eager device ops here would cost a dispatch and a round trip per call).

    std is the sample std (ddof=1), as in the DAPO reference implementation (verl's
    `compute_grpo_outcome_advantage` uses torch.std, which is unbiased); hence G >= 2.
    Groups whose rewards are all equal get exactly 0: computed naively, float rounding of
    the mean leaves (r - mean) ~ 1e-8 which eps=1e-6 would blow up to ~1e-2.
    """
    if rewards_PxG.ndim != 2 or rewards_PxG.shape[1] < 2:
        raise ValueError(f"{rewards_PxG.shape=} must be [P, G] with G >= 2")
    r = np.asarray(rewards_PxG, np.float32)
    mean = r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, ddof=1, keepdims=True)
    adv = (r - mean) / (std + np.float32(eps))
    return np.where(dynamic_sampling_keep(r)[:, None], adv, np.float32(0))


def dynamic_sampling_keep(rewards_PxG) -> np.ndarray:
    """bool [P] (NumPy, host side): True for groups whose rewards are not all equal (DAPO dynamic sampling).

    All-equal groups have zero advantage and so contribute no gradient; DAPO drops them and
    keeps sampling until the batch is full. Note DAPO's recipe filters on accuracy (the
    correctness reward), not on the overlong-shaped score: pass whichever is intended.
    """
    r = np.asarray(rewards_PxG)
    return np.any(r != r[:, :1], axis=1)


def _adv_NxT(advantages):
    # A per-sequence advantage [N] is broadcast over its tokens; [N, T] is used as is.
    return advantages[:, None] if advantages.ndim == 1 else advantages


def _clipped_surrogate(logp_new_NxT, logp_old_NxT, adv_NxT, mask_NxT, eps_low, eps_high, dual_clip=None):
    """PPO token terms -min(r*A, clip(r)*A) and the clip/ratio statistics.

    dual_clip c (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", eq. 5;
    verl's clip_ratio_c): a negative-advantage token's term is capped at -A * c, so its ratio
    counts at most c and, past it, the token gets no gradient."""
    # Zero the log-ratio on padding: exp(garbage) = inf there would make the backward
    # pass NaN even through a `where` (0 * inf).
    log_ratio = jnp.where(mask_NxT, logp_new_NxT - logp_old_NxT, 0.0)
    ratio = jnp.exp(log_ratio)
    pg_NxT = jnp.maximum(-adv_NxT * ratio, -adv_NxT * jnp.clip(ratio, 1 - eps_low, 1 + eps_high))
    dual = jnp.zeros_like(pg_NxT, bool)
    if dual_clip is not None:
        dual = (adv_NxT < 0) & (pg_NxT > -adv_NxT * dual_clip)
        pg_NxT = jnp.where(dual, -adv_NxT * dual_clip, pg_NxT)
    stats = {
        # The clip is active (the token gets no gradient) when the clipped branch wins:
        # A > 0 with r > 1+eps_high (upper) or A < 0 with r < 1-eps_low (lower).
        "clip_frac_upper": masked_mean((adv_NxT > 0) & (ratio > 1 + eps_high), mask_NxT),
        "clip_frac_lower": masked_mean((adv_NxT < 0) & (ratio < 1 - eps_low), mask_NxT),
        "clip_frac_dual": masked_mean(dual, mask_NxT),
        # KL(old || new), tokens sampled from old: k3 with p = old, q = new.
        "approx_kl": masked_mean(kl_k3(jnp.zeros_like(log_ratio), log_ratio), mask_NxT),
        "ratio_mean": masked_mean(ratio, mask_NxT),
        "ratio_max": jnp.max(jnp.where(mask_NxT, ratio, 0.0)),
        "ratio_min": jnp.where(jnp.any(mask_NxT), jnp.min(jnp.where(mask_NxT, ratio, jnp.inf)), 0.0),
    }
    return pg_NxT, stats


def token_level_dapo_loss(
    logp_new_NxT,
    logp_old_NxT,
    advantages,
    mask_NxT,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    tis_weight_NxT=None,
    *,
    dual_clip: float | None = None,
):
    """DAPO policy loss: clip-higher PPO surrogate, mean over ALL response tokens.

    Token-level mean (DAPO's fix): every token of the mini-batch weighs the same, so long
    responses are not down-weighted as in GRPO's per-sequence mean. No KL, no entropy
    term. `advantages` is [N] (broadcast over tokens) or [N, T]. `tis_weight_NxT`
    (optional, see `tis_weights`) multiplies each token's term; it is stop-gradiented.
    dual_clip: see `_clipped_surrogate` (None: off).
    Returns (loss, stats) with stats clip_frac_upper/lower/dual, approx_kl, ratio_mean/max/min.
    """
    adv_NxT = _adv_NxT(advantages)
    pg_NxT, stats = _clipped_surrogate(
        logp_new_NxT, logp_old_NxT, adv_NxT, mask_NxT, eps_low, eps_high, dual_clip
    )
    if tis_weight_NxT is not None:
        pg_NxT = pg_NxT * jax.lax.stop_gradient(tis_weight_NxT)
    return masked_mean(pg_NxT, mask_NxT), stats


def grpo_loss(
    logp_new_NxT,
    logp_old_NxT,
    logp_ref_NxT,
    advantages,
    mask_NxT,
    *,
    kl_coef: float,
    eps: float = 0.2,
    dual_clip: float | None = None,
):
    """GRPO loss (diagnostic arm): symmetric clip, k3 KL to the reference, sequence mean.

    Per token: PPO term + kl_coef * k3 estimate of KL(new || ref) (DeepSeekMath eq. 4:
    ref/new - log(ref/new) - 1). Averaged over each sequence's tokens, then over
    sequences that have at least one token.
    Returns (loss, stats): the `token_level_dapo_loss` stats plus kl_ref (token mean).
    """
    adv_NxT = _adv_NxT(advantages)
    pg_NxT, stats = _clipped_surrogate(logp_new_NxT, logp_old_NxT, adv_NxT, mask_NxT, eps, eps, dual_clip)
    # k3 depends on log q - log p only; zero it on padding (as in _clipped_surrogate).
    log_r = jnp.where(mask_NxT, logp_ref_NxT - logp_new_NxT, 0.0)
    kl_NxT = kl_k3(jnp.zeros_like(log_r), log_r)
    seq_N = masked_mean(pg_NxT + kl_coef * kl_NxT, mask_NxT, axis=1)
    stats["kl_ref"] = masked_mean(kl_NxT, mask_NxT)
    return masked_mean(seq_N, jnp.any(mask_NxT, axis=1)), stats


def tis_weights(logp_old_trainer_NxT, logp_sampler_NxT, cap: float = 2.0):
    """Token-level truncated importance weight min(pi_trainer / pi_sampler, cap).

    Corrects for the sampler's numerics differing from the trainer's (the rollout tokens
    come from the sampler's distribution, the loss assumes the trainer's). Truncation at
    `cap` bounds the variance. Stop-gradient: it is a weight, not part of the policy.
    """
    w = jnp.minimum(jnp.exp(logp_old_trainer_NxT - logp_sampler_NxT), cap)
    return jax.lax.stop_gradient(w)


def mismatch_stats(logp_trainer_NxT, logp_sampler_NxT, mask_NxT):
    """Trainer/sampler mismatch metrics of docs/rl.md (tokens were sampled by the sampler):
    k1 and k3 KL(sampler || trainer), max and mean |delta logp|, mean exp(|delta|)."""
    # delta = log q - log p with p = sampler, q = trainer; zeroed on padding.
    delta = jnp.where(mask_NxT, logp_trainer_NxT - logp_sampler_NxT, 0.0)
    return {
        "mismatch_k1": masked_mean(-delta, mask_NxT),
        "mismatch_k3": masked_mean(kl_k3(jnp.zeros_like(delta), delta), mask_NxT),
        "mismatch_abs_max": jnp.max(jnp.abs(delta)),
        "mismatch_abs_mean": masked_mean(jnp.abs(delta), mask_NxT),
        "mismatch_exp_abs_mean": masked_mean(jnp.exp(jnp.abs(delta)), mask_NxT),
    }


@jax.jit
def step_stats(logp_old, logp_ref, logp_sampler, response_mask, response_valid):
    """An RL step's logged statistics per seed (leading axis), in one program: `mismatch_stats`
    and the k3 KL to the reference (`kl_ref_k3`, absent when `logp_ref` is None). The log-probs
    and masks come as mini-batch lists (rows on axis 1), `response_valid` whole."""
    logp_old, logp_sampler, response_mask = (jnp.concatenate(x, 1) for x in (logp_old, logp_sampler, response_mask))
    out = jax.vmap(mismatch_stats)(logp_old, logp_sampler, response_valid)
    if logp_ref is not None:
        kl = lambda a, b, m: masked_mean(kl_k3(a, b), m)  # noqa: E731
        out["kl_ref_k3"] = jax.vmap(kl)(logp_old, jnp.concatenate(logp_ref, 1), response_mask)
    return out


def token_entropy(logits_NxTxV, temperature=1.0):
    """Per-token entropy of softmax(logits / temperature), [N, T] (logged, never in the DAPO loss);
    temperature <= 0 (greedy) measures the raw logits."""
    return entropy(sampling_logprobs(logits_NxTxV, temperature))
