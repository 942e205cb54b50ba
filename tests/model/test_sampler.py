"""KV-cache decoding against the full forward, and the sampler against the trainer's forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import SamplerConfig, forward, generate, init_cache, sync_weights_jit
from fp4rl.model.sampler import sample_token
from fp4rl.recipe import PrecisionRecipe
from tests.model.common import B, KEY, L, TINY, fwd, model, tokens

PAD, EOS = 0, 2
P = 8  # prompt width; P + T_new == L so the trainer side reuses the shared [2, 16] program
T_NEW = L - P
BF16 = PrecisionRecipe.from_name("bf16")
FULL = PrecisionRecipe.from_name("full")
_prefill = jax.jit(forward, static_argnums=(0, 3), static_argnames=("impl",))
_decode = jax.jit(forward, static_argnums=(0, 3), static_argnames=("impl",))


def _left_padded(seqs, lengths):
    """Prompts of `lengths` real tokens, right-aligned in width P (left padding)."""
    prompt = np.full((len(seqs), P), PAD, np.int32)
    for b, n in enumerate(lengths):
        prompt[b, P - n:] = seqs[b, :n]
    return prompt


def test_decode_matches_full_forward():
    # f32 compute, BF16 recipe: the cached path sums attention over S slots (masked ones are exact
    # zeros) instead of L keys, so only the f32 summation order differs: logits |x| ~ 3, 1e-5.
    graphdef, params = model()
    seqs = tokens(3)
    lengths = [P, P - 3]  # row 1 is left-padded by 3
    prompt = _left_padded(seqs, lengths)
    full_logits, full_aux = fwd(graphdef, params, seqs, BF16)  # unpadded reference, positions 0..15
    cache = init_cache(TINY, B, L)
    logits, aux = _prefill(graphdef, params, prompt, BF16, cache=cache, valid=prompt != PAD)
    cache = aux["cache"]
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(logits[b, -1], full_logits[b, n - 1], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(aux["router_topk"][:, b, -1], full_aux["router_topk"][:, b, n - 1])
    for step in range(L - P):
        # Row b feeds its own next true token: position lengths[b] + step.
        feed = np.array([[seqs[b, n + step]] for b, n in enumerate(lengths)], np.int32)
        logits, aux = _decode(graphdef, params, feed, BF16, cache=cache, valid=np.ones((B, 1), bool))
        cache = aux["cache"]
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(logits[b, 0], full_logits[b, n + step], rtol=0, atol=1e-5)
            np.testing.assert_array_equal(aux["router_topk"][:, b, 0], full_aux["router_topk"][:, b, n + step])
    assert int(cache.index) == L and list(np.asarray(cache.lengths_B)) == [L, L - 3]


def _trainer_logprobs(graphdef, params, prompt, out, recipe):
    """Log-probs of the sampled tokens under the trainer's forward over prompt + response."""
    seq = np.concatenate([prompt, np.asarray(out.tokens)], axis=1)
    valid = np.concatenate([prompt != PAD, np.arange(T_NEW)[None] < np.asarray(out.lengths)[:, None]], axis=1)
    logits, aux = fwd(graphdef, params, seq, recipe, valid)
    logp = jax.nn.log_softmax(np.asarray(logits)[:, P - 1 : P - 1 + T_NEW], axis=-1)
    lp = np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], -1)[..., 0]
    return lp, np.asarray(aux["router_topk"])[:, :, P - 1 : P - 1 + T_NEW], valid[:, P:]


# Tolerance on |logp_sampler - logp_trainer| over generated tokens, f32 compute. The sampler
# (synced qparams, KV cache) and the trainer (raw params, full sequence) quantize identical
# bytes; only the f32 summation order of attention differs (S cache slots vs L keys), measured
# <= 1e-6 under bf16, full, nvfp4 and +46 here: bound 1e-5. Under an NVFP4 recipe such an ulp
# could in principle push one activation across an E2M1 rounding boundary (|delta| ~1e-3); with
# these fixed seeds none does, so a failure means the two paths' inputs diverged by more than
# rounding order. Routing must agree exactly (flip rate 0). A prompt-width prefill (its
# attention over the P prompt slots, the head on the last position) changes only that order too.
@pytest.mark.parametrize("name,prompt_prefill", [("bf16", False), ("full", False), ("full", True), ("nvfp4@4", False)])
def test_sampler_logprobs_match_trainer(name, prompt_prefill):
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = model()
    qparams, _ = sync_weights_jit(params, TINY, recipe, "reference")
    prompt = _left_padded(tokens(4), [P, 5])
    sampler = SamplerConfig(max_new_tokens=T_NEW, temperature=1.0, top_p=0.95, eos_id=EOS, pad_id=PAD,
                            prompt_prefill=prompt_prefill)
    out = generate(graphdef, qparams, jnp.asarray(prompt), recipe, sampler, key=jax.random.key(7))
    assert out.tokens.shape == (B, T_NEW) and out.router_topk.shape == (TINY.num_moe_layers, B, T_NEW, TINY.top_k)
    lp, topk, mask = _trainer_logprobs(graphdef, params, prompt, out, recipe)
    got = np.asarray(out.logprobs)
    assert mask.any()
    np.testing.assert_allclose(got[mask], lp[mask], rtol=0, atol=1e-5)
    same_experts = (np.sort(topk, -1) == np.sort(np.asarray(out.router_topk), -1)).all(-1)  # [M, B, T]
    assert same_experts[:, mask].all(), "routing flips between sampler and trainer"
    assert (got[~mask] == 0).all() and (np.asarray(out.router_topk)[:, ~mask] == -1).all()


def test_per_tensor_activation_scales_make_sampler_and_trainer_disagree():
    """The positive control `nvfp4-tensor`: one activation amax per call spans the sampler's batch
    at each decode step and the trainer's whole [B, L] forward, so the same token quantizes
    differently in each. Measured here: mean |logp_sampler - logp_trainer| 0.07 (nvfp4: 2e-7)."""
    recipe = PrecisionRecipe.from_name("nvfp4-tensor")
    graphdef, params = model()
    qparams, _ = sync_weights_jit(params, TINY, recipe, "reference")
    prompt = _left_padded(tokens(4), [P, 5])
    sampler = SamplerConfig(max_new_tokens=T_NEW, temperature=1.0, top_p=0.95, eos_id=EOS, pad_id=PAD)
    out = generate(graphdef, qparams, jnp.asarray(prompt), recipe, sampler, key=jax.random.key(7))
    lp, _, mask = _trainer_logprobs(graphdef, params, prompt, out, recipe)
    assert np.mean(np.abs(np.asarray(out.logprobs)[mask] - lp[mask])) > 1e-2


def test_greedy_stops_at_eos_per_sequence():
    graphdef, params = model()
    prompt = jnp.asarray(_left_padded(tokens(5), [P, 6]))
    greedy = SamplerConfig(max_new_tokens=T_NEW, temperature=0.0, top_p=1.0, eos_id=EOS, pad_id=PAD)
    free = generate(graphdef, params, prompt, BF16, greedy, key=KEY)
    # temperature is a runtime value: overriding a T=1 config with 0 gives the same greedy tokens
    hot = SamplerConfig(max_new_tokens=T_NEW, temperature=1.0, top_p=1.0, eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(generate(graphdef, params, prompt, BF16, hot, key=KEY, temperature=0.0).tokens,
                                  free.tokens)
    free_tokens = np.asarray(free.tokens)
    # Make row 0's third greedy token the EOS: row 0 must stop right there, row 1 (if it never
    # produces that token) must run to the end unchanged.
    stop_token = int(free_tokens[0, 2])
    first = int(np.argmax(free_tokens[0] == stop_token))
    stopping = SamplerConfig(max_new_tokens=T_NEW, temperature=0.0, top_p=1.0, eos_id=stop_token, pad_id=PAD)
    out = generate(graphdef, params, prompt, BF16, stopping, key=KEY)
    tokens_out = np.asarray(out.tokens)
    assert int(out.lengths[0]) == first + 1
    np.testing.assert_array_equal(tokens_out[0, : first + 1], free_tokens[0, : first + 1])
    assert (tokens_out[0, first + 1 :] == PAD).all() and (np.asarray(out.logprobs)[0, first + 1 :] == 0).all()
    if stop_token not in free_tokens[1]:
        assert int(out.lengths[1]) == T_NEW
        np.testing.assert_array_equal(tokens_out[1], free_tokens[1])
    assert int(free.lengths[0]) == T_NEW or EOS in free_tokens[0]
    # Greedy log-probs are the raw log-softmax maxima.
    assert (np.asarray(free.logprobs)[:, 0] <= 0).all()


def test_top_p_keeps_the_nucleus_only():
    # probs 0.4, 0.3, 0.2, 0.1 with top_p = 0.5: mass before is 0, 0.4, 0.7, 0.9, so tokens 0 and
    # 1 form the nucleus, drawn 4:3. 4000 draws: the share of token 0 is 4/7 +- 0.03 (4 sigma).
    logits = jnp.log(jnp.array([[0.4, 0.3, 0.2, 0.1]], jnp.float32))
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: sample_token(logits, k, 1.0, 0.5)[0]))(keys))
    assert set(np.unique(draws)) == {0, 1}
    assert abs((draws == 0).mean() - 4 / 7) < 0.03
    hot = np.asarray(jax.jit(jax.vmap(lambda k: sample_token(logits, k, 1.0, 1.0)[0]))(keys))
    assert set(np.unique(hot)) == {0, 1, 2, 3}


def test_sampler_config_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplerConfig(max_new_tokens=4, temperature=1.0, top_p=0.0, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError, match="temperature"):
        SamplerConfig(max_new_tokens=4, temperature=-1.0, top_p=1.0, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplerConfig(max_new_tokens=0, temperature=1.0, top_p=1.0, eos_id=EOS, pad_id=PAD)


def _stop_token(graphdef, params, prompt, key=KEY):
    """The token a free T=1 run with `key` draws at row 0's third position: as the stop id, row 0
    stops there (the same draws up to it) while the other rows run on."""
    free = SamplerConfig(max_new_tokens=T_NEW, temperature=1.0, top_p=1.0, eos_id=EOS, pad_id=PAD)
    return int(np.asarray(generate(graphdef, params, prompt, BF16, free, key=key).tokens)[0, 2])


@pytest.mark.parametrize("name", ["bf16", "full"])
def test_decode_chunk_does_not_change_outputs(name):
    # A chunk of 5 runs its second chunk 2 steps past T_NEW = 8: the extra steps emit nothing.
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = model()
    qparams, _ = sync_weights_jit(params, TINY, recipe, "reference")
    prompt = jnp.asarray(_left_padded(tokens(4), [P, 5]))
    stop = _stop_token(graphdef, params, prompt)
    outs = {chunk: generate(graphdef, qparams, prompt, recipe, SamplerConfig(
        max_new_tokens=T_NEW, temperature=1.0, top_p=1.0, eos_id=stop, pad_id=PAD, decode_chunk=chunk), key=KEY)
        for chunk in (1, 5)}
    assert int(outs[1].lengths[0]) <= 3 < T_NEW  # row 0 stops early, the loop runs on for the others
    for chunk, out in outs.items():
        for field in out._fields:
            np.testing.assert_array_equal(np.asarray(getattr(out, field)), np.asarray(getattr(outs[1], field)),
                                          err_msg=f"decode_chunk={chunk}: {field}")


def _loop_predicate_shapes(jaxpr) -> list:
    """The output shape of every `while` condition in `jaxpr` and the jaxprs it calls. Under vmap a
    per-instance condition is a vector, and the lowering then selects every element of the loop
    state (the KV cache included) between its old and new value at every iteration."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            shapes.append(eqn.params["cond_jaxpr"].jaxpr.outvars[0].aval.shape)
        for value in eqn.params.values():
            if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
                shapes += _loop_predicate_shapes(value.jaxpr)
    return shapes


def test_vmapped_seeds_share_the_stop_test():
    # Two instances (seeds: own keys and prompts) whose rows stop at different steps: under
    # vmap with the seed axis named, each equals its own unmapped run, and the decode loop's
    # condition is one scalar for both (no per-instance select of the loop state at every step).
    graphdef, params = model()
    prompts = jnp.stack([jnp.asarray(_left_padded(tokens(4), [P, 5])), jnp.asarray(_left_padded(tokens(6), [6, P]))])
    keys = jax.random.split(KEY, 2)
    stop = _stop_token(graphdef, params, prompts[0], keys[0])
    sampler = SamplerConfig(max_new_tokens=T_NEW, temperature=1.0, top_p=1.0, eos_id=stop, pad_id=PAD, decode_chunk=2)

    def run(seed_axis):
        return jax.vmap(lambda p, k: generate(graphdef, params, p, BF16, sampler, key=k, seed_axis=seed_axis),
                        axis_name="seed")

    mapped = run("seed")(prompts, keys)
    for i in range(2):
        alone = generate(graphdef, params, prompts[i], BF16, sampler, key=keys[i])
        for field in alone._fields:
            np.testing.assert_array_equal(np.asarray(getattr(mapped, field))[i], np.asarray(getattr(alone, field)),
                                          err_msg=f"instance {i}: {field}")
    assert (2,) in _loop_predicate_shapes(jax.make_jaxpr(run(None))(prompts, keys).jaxpr)  # a test per seed
    shapes = _loop_predicate_shapes(jax.make_jaxpr(run("seed"))(prompts, keys).jaxpr)
    assert shapes and all(shape == () for shape in shapes), shapes
