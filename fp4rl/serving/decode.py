"""Batched generation for serving: the sampler's KV-cache loop with per-row request parameters.

`fp4rl.model.sampler.generate` draws every row of a batch from one key at one temperature and
top-p, which is what rollouts need. A server batches unrelated requests, so each row here has
its own temperature, top-p, token budget and key: row b's token t is drawn with
`fold_in(fold_in(key(seed_b), choice_b), t)`, a pure function of the request, so a seeded request
gets the same tokens whichever requests share its batch and whichever row it lands in. The
model side is the sampler's: the same left-padded prefill, `forward` on the synced qparams, the
same cache layout, the same `sample_token` per row. With every row greedy, tokens, log-probs and
lengths are bitwise those of `sampler.generate` on the same batch (tests/serving/test_engine.py).

Shapes: B rows, P prompt width (left-padded), T = max_new_tokens (static); V vocabulary.
A row stops at its budget or on any of the stop ids, which are a runtime array `stop_S` (as in the
sampler): a chat checkpoint ends a turn and a text on different tokens, and one compiled program
serves every set of S ids (S = 0: no stop token, every row runs to its budget).

Outputs: tokens [B, T] (`pad_id` after a row's stop, its stop token kept), logprobs [B, T] (log
softmax of logits / temperature at the drawn token, before the top-p truncation, raw logits when
greedy; 0 after the stop), lengths [B] (tokens generated, the stop token included).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fp4rl.model.sampler import is_stop, sample_token
from fp4rl.model.transformer import forward, init_cache

F32 = jnp.float32


class RowParams(NamedTuple):
    """Per-row inputs of one batch (numpy or jax arrays).

    prompt_BxP int32, left-padded; prompt_lengths_B int32 (>= 1); max_tokens_B int32 in [1, T];
    temperature_B f32 (0: greedy); top_p_B f32 in (0, 1]; seed_B uint32; choice_B uint32 (the
    index of a row among a request's n choices, so the n rows of one seed differ).
    """

    prompt_BxP: jax.Array
    prompt_lengths_B: jax.Array
    max_tokens_B: jax.Array
    temperature_B: jax.Array
    top_p_B: jax.Array
    seed_B: jax.Array
    choice_B: jax.Array


class Generated(NamedTuple):
    tokens: jax.Array  # int32 [B, T]
    logprobs: jax.Array  # f32 [B, T]
    lengths: jax.Array  # int32 [B]


def _row_keys(seed_B, choice_B, t):
    return jax.vmap(lambda s, c: jax.random.fold_in(jax.random.fold_in(jax.random.key(s), c), t))(seed_B, choice_B)


def _draw(logits_BxV, keys_B, temperature_B, top_p_B):
    """One token per row with that row's key, temperature and top-p (`sampler.sample_token` on a
    one-row batch), and its log-prob under softmax(logits / temperature)."""
    token_B = jax.vmap(lambda lg, k, t, p: sample_token(lg[None], k, t, p)[0])(logits_BxV, keys_B, temperature_B, top_p_B)
    t_Bx1 = temperature_B.astype(F32)[:, None]
    logp_BxV = jax.nn.log_softmax(logits_BxV.astype(F32) / jnp.where(t_Bx1 > 0, t_Bx1, F32(1)), axis=-1)
    return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def generate_rows(graphdef, recipe, impl: str, T: int, qparams, rows: RowParams, stop_S, pad_id) -> Generated:
    """Generate up to min(T, max_tokens_B[b]) tokens for every row b of `rows`.

    recipe: a PrecisionRecipe (hashable, static); qparams: `sync_weights` under that recipe.
    stop_S: int32 [S], the ids any of which stops a row (S may be 0). Compiled once per
    (graphdef, recipe, impl, T, B, P, S).
    """
    config = nnx.merge(graphdef, qparams).config
    prompt_BxP = jnp.asarray(rows.prompt_BxP, jnp.int32)
    B, P = prompt_BxP.shape
    lengths_in = jnp.asarray(rows.prompt_lengths_B, jnp.int32)
    max_tokens_B = jnp.asarray(rows.max_tokens_B, jnp.int32)
    temperature_B, top_p_B = jnp.asarray(rows.temperature_B, F32), jnp.asarray(rows.top_p_B, F32)
    seed_B, choice_B = jnp.asarray(rows.seed_B, jnp.uint32), jnp.asarray(rows.choice_B, jnp.uint32)
    stop_S = jnp.asarray(stop_S, jnp.int32)
    prompt_valid_BxP = jnp.arange(P)[None, :] >= (P - lengths_in[:, None])
    cache = init_cache(config, B, P + T - 1)  # the prompt, then new tokens 0..T-2 fed back
    fwd_key = jax.random.key(0)  # feeds only a quantized backward, which a forward never runs

    def step_model(tokens_BxL, valid_BxL, cache):
        logits, aux = forward(graphdef, qparams, tokens_BxL, recipe, key=fwd_key, impl=impl, cache=cache,
                              valid=valid_BxL)
        return logits[:, -1], aux["cache"]

    def emit(t, logits_BxV, done_B, out):
        tokens, logprobs, lengths = out
        token_B, logp_B = _draw(logits_BxV, _row_keys(seed_B, choice_B, t), temperature_B, top_p_B)
        token_B = jnp.where(done_B, pad_id, token_B)
        logp_B = jnp.where(done_B, 0.0, logp_B)
        lengths = lengths + (~done_B).astype(jnp.int32)
        out = (tokens.at[:, t].set(token_B), logprobs.at[:, t].set(logp_B), lengths)
        return token_B, done_B | is_stop(token_B, stop_S) | (lengths >= max_tokens_B), out

    out = (jnp.full((B, T), pad_id, jnp.int32), jnp.zeros((B, T), F32), jnp.zeros((B,), jnp.int32))
    logits_BxV, cache = step_model(prompt_BxP, prompt_valid_BxP, cache)
    token_B, done_B, out = emit(0, logits_BxV, jnp.zeros((B,), bool), out)

    def cond(carry):
        t, _, _, done_B, _ = carry
        return (t < T) & ~jnp.all(done_B)

    def body(carry):
        t, cache, token_B, done_B, out = carry
        # A stopped row runs on a padding token that nothing attends to; per-token activation
        # scales and dropless routing keep it out of the other rows' results.
        logits_BxV, cache = step_model(token_B[:, None], ~done_B[:, None], cache)
        token_B, done_B, out = emit(t, logits_BxV, done_B, out)
        return t + 1, cache, token_B, done_B, out

    *_, out = lax.while_loop(cond, body, (jnp.ones((), jnp.int32), cache, token_B, done_B, out))
    return Generated(*out)
