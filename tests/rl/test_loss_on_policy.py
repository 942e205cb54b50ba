"""`policy.make_loss_fn(on_policy=True)`: the gradient at the first update of a step, with the old
and reference log-probs taken from the loss's own forward (ratio exactly 1 in bf16 compute)."""

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.model import ModelConfig, init
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import policy

CONFIG = ModelConfig.from_name("tiny", dtype="bfloat16", num_layers=2)
N, P, T = 4, 6, 5


def _batch(logp_old):
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(3, CONFIG.vocab_size, (N, P + T)), jnp.int32)
    valid = jnp.ones((N, P + T), bool)
    mask = jnp.ones((N, T), bool)
    return policy.Batch(tokens, valid, mask, logp_old, logp_old, logp_old, jnp.asarray([1.0, -1.0, 0.5, -0.5]))


def test_on_policy_ratio_is_exactly_one_whatever_the_batch_holds():
    graphdef, params = init(CONFIG, 0)
    recipe = PrecisionRecipe.from_name("nvfp4")
    key = jax.random.key(1)
    wrong = jnp.full((N, T), -3.0)  # log-probs of some other policy
    for on_policy, expect_one in ((True, True), (False, False)):
        loss_fn = policy.make_loss_fn(graphdef, recipe, policy.LossConfig(), CONFIG.aux_loss_coef, P, "reference",
                                      on_policy=on_policy)
        (_, stats), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, _batch(wrong), key)
        ones = float(stats["ratio_max"]) == 1.0 and float(stats["ratio_min"]) == 1.0
        assert ones == expect_one, (on_policy, stats["ratio_max"], stats["ratio_min"])
        assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in jax.tree.leaves(grads))
