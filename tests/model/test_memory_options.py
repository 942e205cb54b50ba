"""`forward(remat=..., attention_query_chunk=...)`: the memory options leave values and gradients
as they are (remat bit for bit; query chunks up to the f32 order of the key/value gradients) and
remat shrinks the compiled program's temporaries."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import forward, init
from tests.model.common import KEY, TINY, model, tokens


def _loss_and_grads(graphdef, params, tokens_BxL, recipe, **options):
    def loss(p):
        logits, aux = forward(graphdef, p, tokens_BxL, recipe, key=KEY, impl="reference", **options)
        # A random linear functional of the logits reaches every logit's cotangent.
        weights = jax.random.normal(jax.random.key(7), logits.shape)
        return jnp.sum(logits * weights) + aux["aux_loss"], logits

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.mark.parametrize("recipe", ["bf16", "full"])
def test_remat_leaves_loss_logits_and_gradients_bit_identical(recipe):
    graphdef, params = model()
    t = jnp.asarray(tokens(0))
    (loss, logits), grads = _loss_and_grads(graphdef, params, t, recipe)
    (loss_r, logits_r), grads_r = _loss_and_grads(graphdef, params, t, recipe, remat=True)
    np.testing.assert_array_equal(np.asarray(loss_r), np.asarray(loss))
    np.testing.assert_array_equal(np.asarray(logits_r), np.asarray(logits))
    for a, b in zip(jax.tree.leaves(grads_r), jax.tree.leaves(grads)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads))


def test_query_chunks_give_the_same_logits_and_gradients():
    # Dense layers (the attention is what changes; the MoE would only add compile time).
    graphdef, params = init(dataclasses.replace(TINY, dense_layers=tuple(range(TINY.num_layers))), 0)
    t = jnp.asarray(tokens(1))  # 16 tokens: chunks of 5 are three full chunks and a rest of 1
    (loss, logits), grads = _loss_and_grads(graphdef, params, t, "bf16")
    (loss_c, logits_c), grads_c = _loss_and_grads(graphdef, params, t, "bf16", attention_query_chunk=5)
    # Each query's scores, softmax and weighted values are the same row computation, but XLA:CPU
    # blocks a GEMM of 5 query rows differently from one of 16, so the f32 accumulations may round
    # differently: logits agree to a few ulp of their O(1) scale. The key and value gradients also
    # sum every query's contribution, by chunk in another order.
    np.testing.assert_allclose(np.asarray(logits_c), np.asarray(logits), rtol=0, atol=4e-6)
    np.testing.assert_allclose(np.asarray(loss_c), np.asarray(loss), rtol=1e-5)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
    for a, b in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5 * scale)
    with pytest.raises(ValueError, match="attention_query_chunk=-1 must be >= 0"):
        forward(graphdef, params, t, "bf16", attention_query_chunk=-1)


def test_remat_and_query_chunks_shrink_the_compiled_temporaries():
    # Deeper and longer than `tiny`, dense layers only (the MoE adds compile time, not a different
    # answer): the saved activations grow with layers x tokens, the scores with tokens^2.
    config = dataclasses.replace(TINY, num_layers=6, dense_layers=tuple(range(6)), max_seq_len=256)
    graphdef, params = init(config, 0)
    t = jnp.zeros((2, 256), jnp.int32)

    def temp_bytes(**options):
        def loss(p):
            return jnp.sum(forward(graphdef, p, t, "bf16", impl="reference", **options)[0])
        return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

    plain, remat = temp_bytes(), temp_bytes(remat=True)
    chunked = temp_bytes(remat=True, attention_query_chunk=32)
    assert remat < 0.6 * plain, (plain, remat)
    assert chunked < 0.8 * remat, (remat, chunked)
