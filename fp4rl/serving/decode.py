"""Batched generation for serving: the sampler's KV-cache loop with per-row request parameters,
run whole (`generate_rows`) or cut into programs whose outputs are the same bytes (`prefill_rows`,
then `decode_chunk` until every row has stopped), and the prompt's own log-probs (`score_prompts`).

`fp4rl.model.sampler.generate` draws every row of a batch from one key at one temperature and
top-p, which is what rollouts need. A server batches unrelated requests, so each row here has
its own temperature, top-p, token budget and key: row b's token t is drawn with
`fold_in(fold_in(key(seed_b), choice_b), t)`, a pure function of the request, so a seeded request
gets the same tokens whichever requests share its batch and whichever row it lands in. The
model side is the sampler's: the same left-padded prefill, `forward` on the synced qparams, the
same cache layout, the same `sample_token` per row. With every row greedy, tokens, log-probs and
lengths are bitwise those of `sampler.generate` on the same batch (tests/serving/test_engine.py).

Why cut the loop: one program per batch returns every token when the last is decoded, so a
streamed answer's first token would arrive with its last. `prefill_rows` returns the state after
the prompt (token 0 drawn), and each `decode_chunk` call advances it by at most C tokens; the host
reads the new tokens between calls. Both trace the same prefill and the same loop body as
`generate_rows`, whose loop is the chunks' loop with the end at T, so the tokens, log-probs and
lengths are the same bytes (tests/serving/test_engine.py compares them).

Shapes: B rows, P prompt width (left-padded), T = max_new_tokens (static); V vocabulary; K = TOP_K.
A row stops at its budget or on any of the stop ids, which are a runtime array `stop_S` (as in the
sampler): a chat checkpoint ends a turn and a text on different tokens, and one compiled program
serves every set of S ids (S = 0: no stop token, every row runs to its budget).

Outputs: tokens [B, T] (`pad_id` after a row's stop, its stop token kept), logprobs [B, T] (log
softmax of logits / temperature at the drawn token, before the top-p truncation, raw logits when
greedy; 0 after the stop), top_ids / top_logprobs [B, T, K] (the K likeliest tokens of that same
distribution and their log-probs, likeliest first: the values are elements of the array the drawn
token's log-prob is read from, so a greedy token's log-prob equals its top-1 exactly; pad_id / 0
after the stop), lengths [B] (tokens generated, the stop token included).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fp4rl.model.sampler import is_stop, sample_token
from fp4rl.model.transformer import forward, init_cache
from fp4rl.rl.token_logprobs import pick_last_axis, sampling_logprobs

F32 = jnp.float32
TOP_K = 5  # alternatives kept per position: the completions API's largest `logprobs`


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
    top_ids: jax.Array  # int32 [B, T, K]
    top_logprobs: jax.Array  # f32 [B, T, K]
    lengths: jax.Array  # int32 [B]


class Decoding(NamedTuple):
    """The loop's state between two programs: t, the index of the next token to draw; the KV
    cache; the last token drawn (fed next); which rows have stopped; the outputs so far."""

    t: jax.Array
    cache: Any
    token_B: jax.Array
    done_B: jax.Array
    out: Generated


class Scored(NamedTuple):
    """The prompt scored by one forward: position p (of P - 1) holds the log-prob of prompt token
    p + 1 and the K likeliest tokens there, under softmax(logits / temperature) of the row."""

    logprobs: jax.Array  # f32 [B, P - 1]
    top_ids: jax.Array  # int32 [B, P - 1, K]
    top_logprobs: jax.Array  # f32 [B, P - 1, K]


def _row_keys(seed_B, choice_B, t):
    return jax.vmap(lambda s, c: jax.random.fold_in(jax.random.fold_in(jax.random.key(s), c), t))(seed_B, choice_B)


def _draw(logits_BxV, keys_B, temperature_B, top_p_B):
    """One token per row with that row's key, temperature and top-p (`sampler.sample_token` on a
    one-row batch); its log-prob under softmax(logits / temperature) and that distribution's top K."""
    token_B = jax.vmap(lambda lg, k, t, p: sample_token(lg[None], k, t, p)[0])(logits_BxV, keys_B, temperature_B, top_p_B)
    logp_BxV = sampling_logprobs(logits_BxV, temperature_B.astype(F32)[:, None])
    top_logp_BxK, top_ids_BxK = lax.top_k(logp_BxV, TOP_K)
    return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0], top_ids_BxK, top_logp_BxK


def _loop(graphdef, recipe, impl: str, T: int, qparams, rows: RowParams, stop_S, pad_id):
    """(prefill, advance) of one batch: prefill() -> the state after the prompt; advance(state,
    t_end) -> the state once t reaches t_end or every row has stopped. The traced functions that
    the whole program and the chunked programs share."""
    config = nnx.merge(graphdef, qparams).config
    prompt_BxP = jnp.asarray(rows.prompt_BxP, jnp.int32)
    B, P = prompt_BxP.shape
    lengths_in = jnp.asarray(rows.prompt_lengths_B, jnp.int32)
    max_tokens_B = jnp.asarray(rows.max_tokens_B, jnp.int32)
    temperature_B, top_p_B = jnp.asarray(rows.temperature_B, F32), jnp.asarray(rows.top_p_B, F32)
    seed_B, choice_B = jnp.asarray(rows.seed_B, jnp.uint32), jnp.asarray(rows.choice_B, jnp.uint32)
    stop_S = jnp.asarray(stop_S, jnp.int32)
    fwd_key = jax.random.key(0)  # feeds only a quantized backward, which a forward never runs

    def step_model(tokens_BxL, valid_BxL, cache):
        logits, aux = forward(graphdef, qparams, tokens_BxL, recipe, key=fwd_key, impl=impl, cache=cache,
                              valid=valid_BxL)
        return logits[:, -1], aux["cache"]

    def emit(t, logits_BxV, done_B, out: Generated):
        token_B, logp_B, top_ids_BxK, top_logp_BxK = _draw(logits_BxV, _row_keys(seed_B, choice_B, t), temperature_B,
                                                          top_p_B)
        token_B = jnp.where(done_B, pad_id, token_B)
        logp_B = jnp.where(done_B, 0.0, logp_B)
        top_ids_BxK = jnp.where(done_B[:, None], pad_id, top_ids_BxK)
        top_logp_BxK = jnp.where(done_B[:, None], 0.0, top_logp_BxK)
        lengths = out.lengths + (~done_B).astype(jnp.int32)
        out = Generated(out.tokens.at[:, t].set(token_B), out.logprobs.at[:, t].set(logp_B),
                        out.top_ids.at[:, t].set(top_ids_BxK), out.top_logprobs.at[:, t].set(top_logp_BxK), lengths)
        return token_B, done_B | is_stop(token_B, stop_S) | (lengths >= max_tokens_B), out

    def prefill() -> Decoding:
        prompt_valid_BxP = jnp.arange(P)[None, :] >= (P - lengths_in[:, None])
        cache = init_cache(config, B, P + T - 1)  # the prompt, then new tokens 0..T-2 fed back
        out = Generated(jnp.full((B, T), pad_id, jnp.int32), jnp.zeros((B, T), F32),
                        jnp.full((B, T, TOP_K), pad_id, jnp.int32), jnp.zeros((B, T, TOP_K), F32),
                        jnp.zeros((B,), jnp.int32))
        logits_BxV, cache = step_model(prompt_BxP, prompt_valid_BxP, cache)
        token_B, done_B, out = emit(0, logits_BxV, jnp.zeros((B,), bool), out)
        return Decoding(jnp.ones((), jnp.int32), cache, token_B, done_B, out)

    def advance(state: Decoding, t_end) -> Decoding:
        def cond(s: Decoding):
            return (s.t < t_end) & ~jnp.all(s.done_B)

        def body(s: Decoding):
            # A stopped row runs on a padding token that nothing attends to; per-token activation
            # scales and dropless routing keep it out of the other rows' results.
            logits_BxV, cache = step_model(s.token_B[:, None], ~s.done_B[:, None], s.cache)
            token_B, done_B, out = emit(s.t, logits_BxV, s.done_B, s.out)
            return Decoding(s.t + 1, cache, token_B, done_B, out)

        return lax.while_loop(cond, body, state)

    return prefill, advance


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def generate_rows(graphdef, recipe, impl: str, T: int, qparams, rows: RowParams, stop_S, pad_id) -> Generated:
    """Generate up to min(T, max_tokens_B[b]) tokens for every row b of `rows`, in one program.

    recipe: a PrecisionRecipe (hashable, static); qparams: `sync_weights` under that recipe.
    stop_S: int32 [S], the ids any of which stops a row (S may be 0). Compiled once per
    (graphdef, recipe, impl, T, B, P, S).
    """
    prefill, advance = _loop(graphdef, recipe, impl, T, qparams, rows, stop_S, pad_id)
    return advance(prefill(), T).out


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def prefill_rows(graphdef, recipe, impl: str, T: int, qparams, rows: RowParams, stop_S, pad_id) -> Decoding:
    """`generate_rows` up to its loop: the prompts' forward and token 0 of every row."""
    prefill, _ = _loop(graphdef, recipe, impl, T, qparams, rows, stop_S, pad_id)
    return prefill()


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4), donate_argnums=(9,))
def decode_chunk(graphdef, recipe, impl: str, T: int, C: int, qparams, rows: RowParams, stop_S, pad_id,
                 state: Decoding) -> Decoding:
    """`generate_rows`' loop for at most C more tokens: until t reaches min(t + C, T) or every row
    has stopped. `state` (the KV cache with it) is donated: the result reuses its buffers."""
    _, advance = _loop(graphdef, recipe, impl, T, qparams, rows, stop_S, pad_id)
    return advance(state, jnp.minimum(state.t + C, T))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def score_prompts(graphdef, recipe, impl: str, qparams, rows: RowParams) -> Scored:
    """The prompts' token log-probs and top K under the served forward: the trainer's computation
    (`fp4rl.rl.policy`'s forward over the whole sequence, no cache, then `next_token_logprobs`)
    with each row's temperature, so a prompt scored here is what the trainer scores."""
    prompt_BxP = jnp.asarray(rows.prompt_BxP, jnp.int32)
    P = prompt_BxP.shape[1]
    valid_BxP = jnp.arange(P)[None, :] >= (P - jnp.asarray(rows.prompt_lengths_B, jnp.int32)[:, None])
    logits, _ = forward(graphdef, qparams, prompt_BxP, recipe, key=jax.random.key(0), impl=impl, valid=valid_BxP)
    temperature_Bx1x1 = jnp.asarray(rows.temperature_B, F32)[:, None, None]
    logp_BxPxV = sampling_logprobs(logits[:, :-1], temperature_Bx1x1)
    top_logp, top_ids = lax.top_k(logp_BxPxV, TOP_K)
    return Scored(pick_last_axis(logp_BxPxV, prompt_BxP[:, 1:]), top_ids, top_logp)
