"""Gradients flow through every quantized site under `full` (dequantized backward) and
`nvfp4-pt` (the pretraining recipe's quantized backward: stochastic rounding + RHT, needs a key)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import flat_params, forward, init
from fp4rl.recipe import PrecisionRecipe
from tests.model.common import KEY, TINY, tokens

# `full` on 2 layers quantizes layer 0 (shared expert BF16) and keeps layer 1 BF16; `nvfp4-pt` on
# 1 layer quantizes every expert and shared-expert linear of it (one layer keeps the backward
# program, the most expensive compile here, small).
CASES = {"full": TINY, "nvfp4-pt": dataclasses.replace(TINY, num_layers=1)}


def _loss(params, graphdef, seqs, recipe, key, config):
    logits, aux = forward(graphdef, params, seqs[:, :-1], recipe, key=key)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.mean(jnp.take_along_axis(logp, seqs[:, 1:, None], axis=-1))
    return nll + config.aux_loss_coef * aux["aux_loss"]


@pytest.mark.parametrize("name", list(CASES))
def test_grads_are_finite_and_nonzero(name):
    config, recipe = CASES[name], PrecisionRecipe.from_name(name)
    graphdef, params = init(config, 0)
    seqs = jnp.asarray(tokens(6, batch=2, length=17))
    grad_fn = jax.jit(jax.grad(_loss), static_argnums=(1, 3, 5))
    grads = flat_params(grad_fn(params, graphdef, seqs, recipe, KEY, config))
    for path, g in grads.items():
        assert np.isfinite(np.asarray(g)).all(), path
    must_move = ["layers/0/attn/qkv", "layers/0/attn/o", "layers/0/mlp/router",
                 "layers/0/mlp/gate_up", "layers/0/mlp/down",  # routed experts (stacks)
                 "layers/0/mlp/shared/gate_up", "layers/0/mlp/shared/down", "embed", "head"]
    for path in must_move:
        assert np.abs(np.asarray(grads[path])).max() > 0, path
    # Every expert receives tokens here (40 tokens, top-2 of 4): no expert's stack is all zero.
    experts = np.asarray(grads["layers/0/mlp/gate_up"])
    assert (np.abs(experts).reshape(experts.shape[0], -1).max(axis=1) > 0).all()
    if name == "nvfp4-pt":  # stochastic rounding follows the key: another key, another gradient
        other = flat_params(grad_fn(params, graphdef, seqs, recipe, jax.random.key(1), config))
        assert not np.array_equal(np.asarray(other["layers/0/mlp/down"]), np.asarray(grads["layers/0/mlp/down"]))
