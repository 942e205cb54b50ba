"""Shared configs and compiled programs for tests/model.

One jitted `forward` for the whole directory, always called with the same keyword set
(key and valid), so every test that uses shape [2, 16] under a recipe reuses one compiled
program: XLA compile time dominates these tests on CPU.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.model import ModelConfig, forward, init

TINY = ModelConfig.from_name("tiny")
KEY = jax.random.key(0)  # feeds only the quantized backward; the forward's values ignore it
B, L = 2, 16  # the shared shape: invariance tests, weight sync and the sampler's trainer side
FWD = jax.jit(forward, static_argnums=(0, 3), static_argnames=("impl",))


@functools.cache
def model(config: ModelConfig = TINY, seed: int = 0):
    return init(config, seed)


def fwd(graphdef, params, tokens_BxL, recipe, valid_BxL=None):
    """(logits, aux) through the shared compiled forward (cache omitted from aux)."""
    tokens_BxL = jnp.asarray(tokens_BxL, jnp.int32)
    valid_BxL = jnp.ones(tokens_BxL.shape, bool) if valid_BxL is None else jnp.asarray(valid_BxL, bool)
    return FWD(graphdef, params, tokens_BxL, recipe, key=KEY, valid=valid_BxL)


def tokens(seed: int, batch: int = B, length: int = L, vocab: int = TINY.vocab_size):
    """Random ids in [3, vocab): 0..2 are left to PAD/BOS/EOS, as in the RL tokenizer."""
    return np.random.default_rng(seed).integers(3, vocab, (batch, length)).astype(np.int32)
