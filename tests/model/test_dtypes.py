"""Compute and storage dtypes: bf16 compute (the h200 preset) tracks f32; presets trace."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4rl.model import ModelConfig, forward, init
from fp4rl.model.transformer import Transformer
from fp4rl.recipe import PrecisionRecipe
from tests.model.common import TINY, fwd, model, tokens


def test_bf16_compute_tracks_f32():
    # Same parameters (f32 masters), BF16 recipe, compute in bf16 vs f32. bf16 keeps 8
    # significant bits: each rounding is <= 2^-9 relative, ~20 roundings in sequence on a
    # residual stream of O(1) and logits up to ~4 give an expected error of ~0.02 (measured
    # 0.021); bound 0.08. Logits stay f32 (the head reads the final norm in f32).
    bf16 = PrecisionRecipe.from_name("bf16")
    graphdef, params = model()
    graphdef16, _ = init(dataclasses.replace(TINY, dtype="bfloat16"), 0)
    seqs = tokens(0)
    ref = np.asarray(fwd(graphdef, params, seqs, bf16)[0])
    logits = jax.jit(forward, static_argnums=(0, 3))(graphdef16, params, jnp.asarray(seqs), bf16)[0]
    assert logits.dtype == jnp.float32
    err = np.abs(np.asarray(logits) - ref).max()
    assert 0 < err < 0.08, err


@pytest.mark.parametrize("name", ["small", "h200"])
def test_presets_trace_with_every_kind_quantized(name):
    # nvfp4 quantizes attention, dense MLP, routed and shared experts: every such K and N of
    # the preset must fit 16-wide blocks and 16x16 tiles. Traced only (h200 is ~65M params).
    config = ModelConfig.from_name(name)
    abstract = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(params=0)))
    graphdef, params = nnx.split(abstract, nnx.Param)
    logits, aux = jax.eval_shape(
        lambda p: forward(graphdef, p, jnp.zeros((1, 32), jnp.int32), "nvfp4", key=jax.random.key(0)), params)
    assert logits.shape == (1, 32, config.vocab_size) and logits.dtype == jnp.float32
    assert aux["router_topk"].shape == (config.num_moe_layers, 1, 32, config.top_k)
