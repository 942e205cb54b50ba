"""`UpdateMemory(micro_batches=k)`: a mini-batch's rows in k chunks, gradients summed, one step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp4rl.model import ModelConfig, init
from fp4rl.rl import micro_batch, policy

CFG = ModelConfig.from_name("tiny")
GRAPHDEF, PARAMS = init(CFG, 0)
N, P, Tr = 8, 6, 6  # rows, prompt and response lengths


def _batch():
    rng = np.random.default_rng(0)
    valid = np.ones((N, P + Tr), bool)
    valid[::3, :2] = False  # left padding
    return policy.Batch(
        jnp.asarray(rng.integers(3, CFG.vocab_size, (N, P + Tr)), jnp.int32), jnp.asarray(valid),
        jnp.asarray(rng.random((N, Tr)) < 0.8), jnp.asarray(rng.normal(-3.0, 0.5, (N, Tr)), jnp.float32),
        jnp.asarray(rng.normal(-3.0, 0.5, (N, Tr)), jnp.float32), jnp.asarray(rng.normal(-3.0, 0.5, (N, Tr)), jnp.float32),
        jnp.asarray(rng.normal(size=(N,)), jnp.float32))


def _update(micro_batches: int):
    # SGD at LR 1: the step moves each parameter by exactly its gradient, so comparing parameters
    # compares gradients (AdamW's first step, g / (|g| + eps), would turn the rounding of a nearly
    # cancelling gradient entry into a change of order LR).
    optimizer = optax.sgd(1.0)
    masks = policy.grad_group_masks(PARAMS, CFG.num_layers)
    fns = policy.make_functions(GRAPHDEF, policy.PrecisionRecipe.from_name("bf16"), optimizer, policy.LossConfig(),
                                0.0, P, masks, "reference", memory=policy.UpdateMemory(micro_batches=micro_batches))
    update = jax.jit(lambda p, o, b: fns["update"](p, o, b, jax.random.key(1), jnp.asarray(True), True))
    return update(PARAMS, optimizer.init(PARAMS), _batch())


def test_two_micro_batches_take_the_step_of_one():
    one, two = _update(1), _update(2)
    # A row's forward is the same computation in a chunk of 4 rows as in all 8 (this recipe has no
    # per-tensor scale over rows), but XLA:CPU may block a GEMM of 4 rows differently from one of 8:
    # log-probs agree to a few f32 ulp (ulp(5) = 4.8e-7), and the statistics computed from them
    # (masked means of elementwise functions) to the same relative order. Routing is equal.
    np.testing.assert_allclose(np.asarray(two[2]["logp"]), np.asarray(one[2]["logp"]), rtol=0, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(two[2]["router_topk"]), np.asarray(one[2]["router_topk"]))
    for name in ("loss/policy", "clip_frac_upper", "clip_frac_lower", "clip_frac_dual", "approx_kl", "ratio_mean",
                 "ratio_max", "ratio_min", "entropy"):
        np.testing.assert_allclose(np.asarray(two[2][name]), np.asarray(one[2][name]), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    # Gradients: each token's cotangent is the same; the two chunks' parameter gradients add in
    # another f32 order than one backward over 8 rows (a few hundred terms per entry): the error is
    # a few ulp of the largest terms, bounded here by 1e-6 absolute (gradients are O(1e-2)) and
    # 1e-5 relative on the norms.
    grad_scale = float(one[2]["grad_norm/global"])
    assert grad_scale > 1e-3
    for a, b in zip(jax.tree.leaves(two[0]), jax.tree.leaves(one[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    for name in ["grad_norm/global"] + [f"grad_norm/{g}" for g in policy.GRAD_GROUPS]:
        np.testing.assert_allclose(np.asarray(two[2][name]), np.asarray(one[2][name]), rtol=1e-5, err_msg=name)
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(two[0]), jax.tree.leaves(PARAMS)))
    assert moved > 1e-4  # the step was taken


def test_chunks_hold_strided_rows_and_reassemble():
    x = jnp.arange(12).reshape(6, 2)
    chunks = micro_batch.to_chunks(x, 3)
    np.testing.assert_array_equal(np.asarray(chunks[1]), np.asarray(x[1::3]))
    np.testing.assert_array_equal(np.asarray(micro_batch.from_chunks(chunks)), np.asarray(x))
    with pytest.raises(ValueError, match="micro_batches=3 must be >= 1 and divide the 8 rows"):
        micro_batch.check_micro_batches(3, 8)
    with pytest.raises(ValueError, match="micro_batches=0 must be >= 1"):
        policy.UpdateMemory(micro_batches=0)
