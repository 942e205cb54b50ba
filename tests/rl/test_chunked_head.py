"""`UpdateMemory(logit_chunk=c)`: the LM head over c response positions at a time (fp4rl.rl.chunked_head)."""

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp4rl.model import init
from fp4rl.rl import policy
from tests.rl.test_micro_batch import CFG as TINY
from tests.rl.test_micro_batch import P, Tr, _batch

# A vocabulary unlike every other width of the model, so that a [rows, tokens, V] value is the logits.
CFG = dataclasses.replace(TINY, vocab_size=96)
GRAPHDEF, PARAMS = init(CFG, 0)


def _functions(memory):
    optimizer = optax.sgd(1.0)  # the step moves each parameter by its gradient (test_micro_batch.py)
    masks = policy.grad_group_masks(PARAMS, CFG.num_layers)
    fns = policy.make_functions(GRAPHDEF, policy.PrecisionRecipe.from_name("bf16"), optimizer, policy.LossConfig(),
                                0.0, P, masks, "reference", memory=memory)
    return optimizer, fns


def _update(memory):
    optimizer, fns = _functions(memory)
    update = jax.jit(lambda p, o, b: fns["update"](p, o, b, jax.random.key(1), jnp.asarray(True), True))
    return update(PARAMS, optimizer.init(PARAMS), _batch())


@pytest.mark.parametrize("memory", [policy.UpdateMemory(logit_chunk=4),  # Tr = 6: a chunk of 4 and a padded one
                                    policy.UpdateMemory(logit_chunk=1, micro_batches=2)], ids=["chunk4", "chunk1+micro2"])
def test_chunked_head_takes_the_step_of_the_whole_head(memory):
    whole, chunked = _update(policy.UpdateMemory()), _update(memory)
    # Each position's logits are the same dot over D; only XLA's blocking of a smaller GEMM and the
    # f32 order of the gradient sums over positions differ (tolerances of test_micro_batch.py).
    np.testing.assert_allclose(np.asarray(chunked[2]["logp"]), np.asarray(whole[2]["logp"]), rtol=0, atol=2e-6)
    for name in ("loss/policy", "entropy", "approx_kl", "ratio_mean", "grad_norm/global"):
        np.testing.assert_allclose(np.asarray(chunked[2][name]), np.asarray(whole[2][name]), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    assert float(whole[2]["grad_norm/global"]) > 1e-3
    for a, b in zip(jax.tree.leaves(chunked[0]), jax.tree.leaves(whole[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def _whole_logits(jaxpr, positions: set[int]) -> list[tuple]:
    """Shapes of the products in the program (sub-jaxprs included) that are the logits of every
    row at once: dot_general results [..., V] over `positions` rows x tokens (the embedding's
    one-hot of the tokens has such a shape too, but is no product)."""
    found = []
    for eqn in jaxpr.eqns:
        for var in eqn.outvars if eqn.primitive.name == "dot_general" else ():
            shape = var.aval.shape
            if shape[-1] == CFG.vocab_size and int(np.prod(shape[:-1])) in positions:
                found.append(shape)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _whole_logits(sub, positions)
    return found


def test_the_chunked_update_never_holds_the_logits_of_the_response():
    batch = _batch()

    def program(memory):
        optimizer, fns = _functions(memory)
        return jax.make_jaxpr(lambda p, o, b: fns["update"](p, o, b, jax.random.key(1), jnp.asarray(True), True))(
            PARAMS, optimizer.init(PARAMS), batch).jaxpr

    rows, length = batch.tokens_NxL.shape
    whole = {rows * length, rows * (length - 1), rows * Tr}  # all positions, those predicting, the response
    assert _whole_logits(program(policy.UpdateMemory()), whole)  # the whole head forms [N, L, V]
    assert not _whole_logits(program(policy.UpdateMemory(logit_chunk=2)), whole)


def test_bad_logit_chunk_is_refused():
    with pytest.raises(ValueError, match="logit_chunk=-1 must be >= 0"):
        policy.UpdateMemory(logit_chunk=-1)
    assert Tr == 6  # the parametrized chunks above assume it
