"""The response tokens' log-probs and entropies with the LM head applied to chunks of positions.

The update's log-probs need every response position's log-softmax over the vocabulary. Computed
at once, the f32 logits of a micro-batch are rows x tokens x V x 4 bytes, and the backward keeps
them: for Qwen3-30B-A3B at 8k tokens (V = 151,936) 5 GB per row, several times over with the
log-softmax's temporaries (docs/parallel.md "Memory per device"). Here the final norm's output is
cut into chunks of `chunk` positions; each chunk's logits are formed, reduced to the picked
token's log-prob and the entropy, and dropped; the backward recomputes them chunk by chunk
(`jax.checkpoint`), so one chunk's logits are live at a time. The values are those of
`token_logprobs.next_token_logprobs` and `dapo.token_entropy` on the full logits, up to the order of
f32 sums (tests compare them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4rl.rl.token_logprobs import entropy, pick_last_axis, sampling_logprobs  # the unchunked path's own ops


def _chunks(x, chunk: int):
    """x [N, T, ...] -> [ceil(T / chunk), N, chunk, ...], the last chunk padded with zeros."""
    n, t = x.shape[:2]
    pad = -t % chunk
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(n, (t + pad) // chunk, chunk, *x.shape[2:]), 1, 0)


def _unchunk(x_KxNxC, t: int):
    k, n, c = x_KxNxC.shape
    return jnp.moveaxis(x_KxNxC, 0, 1).reshape(n, k * c)[:, :t]


def response_stats(h_NxLxD, head, tokens_NxL, prompt_len: int, temperature, chunk: int):
    """(logp_NxTr, entropy_NxTr) of the response tokens tokens[:, prompt_len:], Tr = L - prompt_len,
    under softmax(logits / temperature) (temperature <= 0: the raw logits), from the final norm's
    output h and `head(h_rows) -> f32 logits` (`transformer.forward(hidden=True)`), `chunk`
    positions at a time. The entropy is logged, never differentiated."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1 positions")
    h_NxTrxD = h_NxLxD[:, prompt_len - 1 : -1]  # the positions that predict the response tokens
    targets_NxTr = tokens_NxL[:, prompt_len:]
    tr = targets_NxTr.shape[1]
    chunk = min(chunk, tr)  # a response shorter than a chunk is one chunk, unpadded

    @jax.checkpoint  # the backward recomputes a chunk's logits instead of keeping them
    def one_chunk(h_NxCxD, targets_NxC):
        logp_NxCxV = sampling_logprobs(head(h_NxCxD), temperature)
        return pick_last_axis(logp_NxCxV, targets_NxC), jax.lax.stop_gradient(entropy(logp_NxCxV))

    logp, token_entropy = jax.lax.map(lambda c: one_chunk(*c), (_chunks(h_NxTrxD, chunk), _chunks(targets_NxTr, chunk)))
    return _unchunk(logp, tr), _unchunk(token_entropy, tr)
