"""Token log-probs under the sampling distribution, shared by the update's forward
(`fp4rl.rl.policy`), its chunked LM head (`fp4rl.rl.chunked_head`) and the warm-up loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def next_token_logprobs(logits_NxLxV, tokens_NxL, temperature=1.0):
    """log p(token_t | tokens_<t) for t = 1..L-1: [N, L-1], in float32, under the sampling
    distribution softmax(logits / temperature) (temperature 0, greedy, scores the raw logits)."""
    return pick_last_axis(sampling_logprobs(logits_NxLxV[:, :-1], temperature), tokens_NxL[:, 1:])


def pick_last_axis(x_NxTxV, index_NxT):
    """x[n, t, index[n, t]] as a one-hot sum (exact: one nonzero term), whose gradient is a product
    where take_along_axis's is a scatter, which XLA:GPU's deterministic mode sorts (`expert_dispatch`)."""
    return jnp.sum(x_NxTxV * jax.nn.one_hot(index_NxT, x_NxTxV.shape[-1], dtype=x_NxTxV.dtype), axis=-1)


def entropy(logp_xV):
    """-sum p log p over the last axis of log-probs (`sampling_logprobs`' output)."""
    return -jnp.sum(jnp.exp(logp_xV) * logp_xV, axis=-1)


def sampling_logprobs(logits, temperature):
    """log softmax of logits / temperature in float32 (temperature <= 0: the raw logits)."""
    t = jnp.asarray(temperature, jnp.float32)
    return jax.nn.log_softmax(logits.astype(jnp.float32) / jnp.where(t > 0, t, 1.0), axis=-1)
