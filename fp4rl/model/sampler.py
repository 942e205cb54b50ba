"""Batched generation with a KV cache, at the arm's precision, from the synced qparams.

Layout: prompts are **left-padded** to a common width P (pads only on the left, marked by
`prompt_lengths_B` or, by default, by `pad_id`), so every row writes the same cache slot at
every step (slot P + t for new token t); RoPE positions count real tokens only, so a prompt's
positions do not depend on its padding. The prefill runs the prompts in one forward, then
`lax.while_loop` decodes `SamplerConfig.decode_chunk` tokens per iteration for all rows and exits
after the first chunk at whose end every row has stopped. `generate` compiles itself (once per model,
recipe, max_new_tokens and shapes); it may also be called inside a caller's jit.

Outputs, for new-token index t < T_new = max_new_tokens:
- tokens [B, T_new]: sampled ids, `pad_id` after a row's stop (its EOS is kept);
- logprobs [B, T_new]: log softmax of logits / temperature (the distribution the token was
  drawn from, before the top-p truncation; the raw logits for greedy decoding) at the sampled
  token, i.e. the policy's log-prob that the trainer recomputes at the same temperature; 0 after
  the stop.
- lengths [B]: generated tokens per row, EOS included;
- router_topk [L_moe, B, T_new, k]: the experts of the position whose logits produced token t
  (the last prompt token for t = 0, new token t - 1 after), i.e. the same positions at which the
  trainer's forward over prompt + response scores token t; -1 after the stop.
The trainer's forward reproduces these log-probs on `concat(prompt, tokens)` with
`valid = concat(prompt_valid, arange(T_new) < lengths)`, scoring token t at column P - 1 + t.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fp4rl import qlinear
from fp4rl.formats import nvfp4
from fp4rl.grouped import PACKED_GEMMS
from fp4rl.model.transformer import resolve_recipe, forward, grow_cache, init_cache

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """max_new_tokens: T_new. temperature: 0 means greedy (argmax); > 0 scales the logits.
    top_p: nucleus sampling mass in (0, 1] (1 disables it). eos_id stops a row, and so does
    each of stop_ids (a chat checkpoint ends a turn and a text on different tokens); pad_id fills
    the tokens after the stop (and marks left padding in prompts by default).
    prompt_prefill: the prefill runs on a cache of the prompt's P slots (grown to P + T_new - 1
    after it) and applies the LM head to the last position only, so its attention scores are
    [B, H, P, P] and its logits [B, V] where they would be [B, H, P, P + T_new - 1] and [B, P, V]:
    at thousands of new tokens (the `hf` preset: 1k prompt + 7k new, 128 rows) the full-width
    prefill's f32 scores alone need 64 GiB. The same values up to the order of additions over the
    empty slots and rows; off by default so that the programs of the short-sequence presets (and
    the digests their measurements were taken under, results/long_h200/chain) stay as they are.
    decode_chunk: new tokens per iteration of the decode's `while` loop. Each iteration runs an
    inner loop of exactly `decode_chunk` tokens (a known trip count, which XLA's GPU runtime runs
    without reading anything back) and only then tests whether every row has stopped, a test whose
    result the host must read: one round trip per chunk instead of per token. Tokens decoded
    past a row's stop or past max_new_tokens are never emitted, so every value gives the same
    outputs; a larger chunk decodes up to decode_chunk - 1 tokens more after the last row stops."""

    max_new_tokens: int
    temperature: float
    top_p: float
    eos_id: int
    pad_id: int
    stop_ids: tuple[int, ...] = ()
    prompt_prefill: bool = False
    decode_chunk: int = 8

    def __post_init__(self):
        if self.decode_chunk < 1:
            raise ValueError(f"decode_chunk={self.decode_chunk} must be >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0: greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.eos_id == self.pad_id:
            raise ValueError(f"eos_id and pad_id must differ, both are {self.eos_id}")
        if not isinstance(self.stop_ids, tuple):
            raise ValueError(f"stop_ids={self.stop_ids!r} must be a tuple of token ids")


class SampleOutput(NamedTuple):
    tokens: jax.Array  # int32 [B, T_new]
    logprobs: jax.Array  # f32 [B, T_new]
    lengths: jax.Array  # int32 [B]
    router_topk: jax.Array  # int32 [L_moe, B, T_new, k]


def sample_token(logits_BxV, key, temperature, top_p):
    """One token per row from softmax(logits / temperature) restricted to the top-p nucleus.

    temperature == 0 is greedy (argmax); top_p >= 1 disables the nucleus. Both may be traced
    values, so one compiled sampler serves every temperature and top-p.
    """
    logits_BxV = logits_BxV.astype(F32)
    temperature, top_p = jnp.asarray(temperature, F32), jnp.asarray(top_p, F32)
    scaled = logits_BxV / jnp.where(temperature > 0, temperature, F32(1))
    # Nucleus: keep the smallest prefix of the sorted distribution whose mass reaches top_p (the
    # top token always stays): a token is dropped when the mass before it already reaches top_p.
    sorted_desc = jnp.sort(scaled, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = (mass_before < top_p) | (top_p >= 1)
    threshold = jnp.min(jnp.where(kept, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    scaled = jnp.where(scaled >= threshold, scaled, -jnp.inf)
    sampled = jax.random.categorical(key, scaled, axis=-1)
    return jnp.where(temperature > 0, sampled, jnp.argmax(logits_BxV, axis=-1)).astype(jnp.int32)


def _token_logprob(logits_BxV, token_B, temperature):
    t = jnp.asarray(temperature, F32)
    logp_BxV = jax.nn.log_softmax(logits_BxV.astype(F32) / jnp.where(t > 0, t, F32(1)), axis=-1)
    return jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]


def generate(graphdef, qparams, prompt_BxP, recipe, sampler: SamplerConfig, *, key,
             impl: str = "auto", prompt_lengths_B=None, temperature=None, seed_axis: str | None = None) -> SampleOutput:
    """Sample up to `sampler.max_new_tokens` tokens after each left-padded prompt.

    qparams: `sync_weights(params, ...)[0]` (raw params give identical results, quantizing the
    weights inside every step instead of once). Compiled once per (graphdef, recipe, impl,
    max_new_tokens, shapes): temperature, top_p, eos_id and pad_id are runtime values.
    temperature: overrides `sampler.temperature`; may be a traced value (e.g. 0 for greedy
    evaluation through the same compiled rollout program).
    seed_axis: the name of a `jax.vmap` axis this call runs under (e.g. the trainer's seeds). The
    loop then stops when every row of every mapped instance has stopped, a test the instances
    share: a per-instance test would make vmap run the loop until all have stopped anyway, and
    `select` each instance's whole loop state (the KV cache included) between its old and new
    value at every iteration. An instance whose rows have all stopped emits nothing more, so the
    outputs are the same.
    """
    recipe = resolve_recipe(recipe)
    prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
    if prompt_lengths_B is None:
        prompt_lengths_B = jnp.sum(prompt_BxP != sampler.pad_id, axis=1, dtype=jnp.int32)
    return _generate(graphdef, recipe, impl, sampler.max_new_tokens, qparams, prompt_BxP,
                     jnp.asarray(prompt_lengths_B, jnp.int32), key,
                     sampler.temperature if temperature is None else temperature, sampler.top_p,
                     jnp.asarray((sampler.eos_id, *sampler.stop_ids), jnp.int32), sampler.pad_id,
                     sampler.prompt_prefill, sampler.decode_chunk, seed_axis)


def operands_ahead(qparams, config):
    """Every synced weight's GEMM operand formed once per call, before the decode loop
    (`qlinear.operand_ahead`): XLA does not hoist the 4-bit -> 16-bit expansion out of a `while`,
    so the emulated forward would form it again at every step. The same values, so the same
    tokens and log-probs. With a packed-weight expert GEMM (`expert_gemm="packed"`) the expert
    stacks stay packed: its kernel reads them so."""
    keep_packed = config.resolved().expert_gemm in PACKED_GEMMS

    def ahead(w):
        if keep_packed and isinstance(w, nvfp4.NVFP4Tensor) and w.codes.ndim == 3:
            return w
        return qlinear.operand_ahead(w)

    return jax.tree.map(ahead, qparams, is_leaf=qlinear.is_quantized_weight)


def is_stop(token_B, stop_S):
    """bool [B]: the row's token is one of the stop ids `stop_S` (int32 [S], S may be 0)."""
    return jnp.any(token_B[:, None] == stop_S[None, :], axis=1)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 12, 13, 14))
def _generate(graphdef, recipe, impl, T, qparams, prompt_BxP, prompt_lengths_B, key, temperature, top_p,
              stop_S, pad_id, prompt_prefill=False, chunk=1, seed_axis=None) -> SampleOutput:
    config = nnx.merge(graphdef, qparams).config
    qparams = operands_ahead(qparams, config)
    B, P = prompt_BxP.shape
    prompt_valid_BxP = jnp.arange(P)[None, :] >= (P - prompt_lengths_B[:, None])
    # Slots: the prompt, then new tokens 0..T-2 fed back (the last sampled token is never fed).
    cache = init_cache(config, B, P if prompt_prefill else P + T - 1)
    # The forward's key feeds only a quantized backward, which sampling never runs; it is passed
    # so that raw (unsynced) params under such a recipe are accepted too.
    key, fwd_key = jax.random.split(key)

    def step_model(tokens_BxL, valid_BxL, cache, last_only=False):
        out, aux = forward(graphdef, qparams, tokens_BxL, recipe, key=fwd_key, impl=impl, cache=cache,
                           valid=valid_BxL, hidden=last_only)
        if last_only:  # `out` is (final-norm output, head): the LM head on the last position alone
            h_BxLxD, head = out
            return head(h_BxLxD[:, -1]), aux["router_topk"][:, :, -1], aux["cache"]
        return out[:, -1], aux["router_topk"][:, :, -1], aux["cache"]

    def emit(t, logits_BxV, topk_MxBxK, done_B, key, out):
        tokens, logprobs, lengths, topk = out
        key, sample_key = jax.random.split(key)
        token_B = sample_token(logits_BxV, sample_key, temperature, top_p)
        token_B = jnp.where(done_B, pad_id, token_B)
        logp_B = jnp.where(done_B, 0.0, _token_logprob(logits_BxV, token_B, temperature))
        topk_MxBxK = jnp.where(done_B[None, :, None], -1, topk_MxBxK)
        out = (tokens.at[:, t].set(token_B), logprobs.at[:, t].set(logp_B),
               lengths + (~done_B).astype(jnp.int32), topk.at[:, :, t].set(topk_MxBxK))
        return token_B, done_B | is_stop(token_B, stop_S), key, out

    M, k = config.num_moe_layers, config.top_k
    # A chunk's last iterations may run past T: their (empty) columns are written, then sliced off.
    width = T + chunk - 1
    out = (jnp.full((B, width), pad_id, jnp.int32), jnp.zeros((B, width), F32),
           jnp.zeros((B,), jnp.int32), jnp.full((M, B, width, k), -1, jnp.int32))
    logits_BxV, topk_MxBxK, cache = step_model(prompt_BxP, prompt_valid_BxP, cache, last_only=prompt_prefill)
    if prompt_prefill:
        cache = grow_cache(cache, P + T - 1)
    token_B, done_B, key, out = emit(0, logits_BxV, topk_MxBxK, jnp.zeros((B,), bool), key, out)

    def cond(carry):
        t, _, _, done_B, _, _ = carry
        running = ~jnp.all(done_B)
        if seed_axis is not None:  # one test for every mapped instance (see `generate`)
            running = lax.psum(running.astype(jnp.int32), seed_axis) > 0
        return (t < T) & running

    def decode(t, state):
        cache, token_B, done_B, key, out = state
        # A stopped row keeps running on a padding token (never attended to); per-token scales
        # and dropless routing keep it from touching the other rows' results. Past T every row
        # counts as stopped, so a chunk's extra iterations emit nothing (their cache writes land
        # on the clamped last slot, which nothing emitted reads afterwards).
        logits_BxV, topk_MxBxK, cache = step_model(token_B[:, None], ~done_B[:, None], cache)
        token_B, done_B, key, out = emit(t, logits_BxV, topk_MxBxK, done_B | (t >= T), key, out)
        return cache, token_B, done_B, key, out

    def body(carry):
        t, *state = carry
        # a known trip count: no host round trip inside the chunk
        state = lax.fori_loop(0, chunk, lambda i, s: decode(t + i, s), tuple(state))
        return t + chunk, *state

    carry = (jnp.ones((), jnp.int32), cache, token_B, done_B, key, out)
    *_, out = lax.while_loop(cond, body, carry)
    tokens, logprobs, lengths, topk = out
    tokens, logprobs, topk = tokens[:, :T], logprobs[:, :T], topk[:, :, :T]
    return SampleOutput(tokens=tokens, logprobs=logprobs, lengths=lengths, router_topk=topk)
