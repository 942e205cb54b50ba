"""Data parallelism on 8 CPU devices: the one-device programs (forward, sampler, the RL update),
run under `jax.set_mesh` with their rows split over the mesh, equal the one-device results."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import ModelConfig, init
from fp4rl.model import sampler as model_sampler
from fp4rl.model.transformer import forward
from fp4rl.parallel import placement
from fp4rl.parallel.mesh import MeshConfig, make_mesh
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import policy

CFG = dataclasses.replace(ModelConfig.from_name("tiny"), num_experts=8)
GRAPHDEF, PARAMS = init(CFG, 0)
BF16 = PrecisionRecipe.from_name("bf16")
MESHES = [(8, 1), (2, 4)]
# f32 compute throughout. Rows are independent in every layer (per-token scales, dropless MoE),
# so a row's logits see the same operations on other devices; XLA may accumulate the GEMMs in
# another order for other row counts: sums of at most 128 (dense_d_ff) terms of O(1) products per
# layer, 2 layers, then the head over 64: |error| <~ 128 * 2^-24 * O(10) ~ 1e-4 on logits of O(10).
LOGIT_TOL = 1e-4


def _tokens(rows, length, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(3, CFG.vocab_size, (rows, length)), jnp.int32)


@pytest.mark.parametrize("shape", MESHES)
def test_forward_rows_split_equal_one_device(shape):
    tokens = _tokens(16, 12)
    fwd = lambda: jax.jit(lambda p, t: forward(GRAPHDEF, p, t, BF16, impl="reference")[0])  # noqa: E731
    ref = np.asarray(fwd()(PARAMS, tokens))
    mesh = make_mesh(MeshConfig(*shape))
    with jax.set_mesh(mesh):
        out = np.asarray(fwd()(placement.place_state(PARAMS, mesh), placement.place_rows(tokens, mesh, row_axis=0)))
    np.testing.assert_allclose(out, ref, rtol=LOGIT_TOL, atol=LOGIT_TOL)


@pytest.mark.parametrize("shape", MESHES)
def test_sampler_rows_split_equal_one_device(shape):
    sampler = model_sampler.SamplerConfig(max_new_tokens=8, temperature=1.0, top_p=1.0, eos_id=2, pad_id=0)
    prompts = np.array(_tokens(16, 6, seed=1))
    prompts[::3, :2] = 0  # left padding on some rows
    key = jax.random.key(3)
    ref = model_sampler.generate(GRAPHDEF, PARAMS, jnp.asarray(prompts), BF16, sampler, key=key, impl="reference")
    mesh = make_mesh(MeshConfig(*shape))
    with jax.set_mesh(mesh):
        out = model_sampler.generate(GRAPHDEF, placement.place_state(PARAMS, mesh),
                                     placement.place_rows(jnp.asarray(prompts), mesh, row_axis=0), BF16, sampler,
                                     key=key, impl="reference")
    assert len(out.tokens.sharding.device_set) == 8  # the rows really ran split over the mesh
    # The same keys draw the same tokens unless two logits sit within LOGIT_TOL of a sampling
    # threshold (probability ~1e-4 per draw at these logits): tokens, lengths and routing exactly.
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_array_equal(np.asarray(out.router_topk), np.asarray(ref.router_topk))
    # log-softmax of logits within LOGIT_TOL: within 2 * LOGIT_TOL.
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), rtol=0, atol=2 * LOGIT_TOL)


def _update_program(lr):
    optimizer = policy.make_optimizer(lr, 1, 0.0, 0.9, 0.99, 1.0)
    masks = policy.grad_group_masks(PARAMS, CFG.num_layers)
    fns = policy.make_functions(GRAPHDEF, BF16, optimizer, policy.LossConfig(), CFG.aux_loss_coef, 8, masks, "reference")
    update = jax.jit(jax.vmap(lambda p, o, b, k, a: fns["update"](p, o, b, k, a, True), in_axes=(0, 0, 0, 0, None)))
    return optimizer, update


@pytest.mark.parametrize("shape", MESHES)
def test_rl_update_rows_split_equal_one_device(shape):
    S, N, P, Tr = 2, 16, 8, 8  # seeds, rows, prompt and response lengths
    rng = np.random.default_rng(4)
    params_S = jax.tree.map(lambda x: jnp.stack([x, x]), PARAMS)
    lr = 1e-3
    optimizer, _ = _update_program(lr)
    opt_S = jax.vmap(optimizer.init)(params_S)
    valid = np.ones((S, N, P + Tr), bool)
    valid[:, ::4, :3] = False  # left padding
    response_mask = rng.random((S, N, Tr)) < 0.8
    batch = policy.Batch(
        jnp.asarray(rng.integers(3, CFG.vocab_size, (S, N, P + Tr)), jnp.int32), jnp.asarray(valid),
        jnp.asarray(response_mask), jnp.asarray(rng.normal(-2.0, 0.3, (S, N, Tr)), jnp.float32),
        jnp.asarray(rng.normal(-2.0, 0.3, (S, N, Tr)), jnp.float32), jnp.asarray(rng.normal(-2.0, 0.3, (S, N, Tr)), jnp.float32),
        jnp.asarray(rng.normal(size=(S, N)), jnp.float32))
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    ref = _update_program(lr)[1](params_S, opt_S, batch, keys, jnp.asarray(True))
    mesh = make_mesh(MeshConfig(*shape))
    with jax.set_mesh(mesh):
        out = _update_program(lr)[1](placement.place_state(params_S, mesh, lead=1),
                                     placement.place_state(opt_S, mesh, lead=1),
                                     placement.place_rows(batch, mesh, row_axis=1), keys, jnp.asarray(True))
    assert any(len(leaf.sharding.device_set) == 8 for leaf in jax.tree.leaves(out[2]))
    ref_m, out_m = ref[2], out[2]
    # Log-probs: log-softmax of logits within LOGIT_TOL. Loss and gradient norms: sums over all
    # rows' tokens (~250 response tokens, ~10^4 gradient terms per entry at most) now split over
    # devices and re-added: relative error <~ 1e4 * 2^-24 ~ 6e-4 bound; 1e-4 relative in practice.
    np.testing.assert_allclose(np.asarray(out_m["logp"]), np.asarray(ref_m["logp"]), rtol=0, atol=2 * LOGIT_TOL)
    for name in ["loss/total", "grad_norm/global"] + [f"grad_norm/{g}" for g in policy.GRAD_GROUPS]:
        np.testing.assert_allclose(np.asarray(out_m[name]), np.asarray(ref_m[name]), rtol=1e-4, err_msg=name)
    assert float(np.min(np.asarray(ref_m["grad_norm/global"]))) > 0
    assert not np.asarray(out_m["skipped"]).any() and not np.asarray(ref_m["skipped"]).any()
    # The new parameters are not compared entry by entry: AdamW's first step moves an entry by
    # lr * g / (|g| + 1e-8), which turns the absolute rounding error of a nearly cancelling
    # gradient entry (|g| ~ 1e-8) into a change of order lr. The gradients themselves are compared
    # in test_rl_gradient_rows_split_equal_one_device.


@pytest.mark.parametrize("shape", MESHES)
def test_rl_gradient_rows_split_equal_one_device(shape):
    N, P, Tr = 16, 8, 8
    rng = np.random.default_rng(5)
    valid = np.ones((N, P + Tr), bool)
    valid[::4, :3] = False
    batch = policy.Batch(
        jnp.asarray(rng.integers(3, CFG.vocab_size, (N, P + Tr)), jnp.int32), jnp.asarray(valid),
        jnp.asarray(rng.random((N, Tr)) < 0.8), jnp.asarray(rng.normal(-2.0, 0.3, (N, Tr)), jnp.float32),
        jnp.asarray(rng.normal(-2.0, 0.3, (N, Tr)), jnp.float32), jnp.asarray(rng.normal(-2.0, 0.3, (N, Tr)), jnp.float32),
        jnp.asarray(rng.normal(size=(N,)), jnp.float32))
    loss_fn = policy.make_loss_fn(GRAPHDEF, BF16, policy.LossConfig(), CFG.aux_loss_coef, P, "reference")
    grad = lambda: jax.jit(jax.grad(lambda p, b: loss_fn(p, b, None)[0]))  # noqa: E731
    ref = grad()(PARAMS, batch)
    mesh = make_mesh(MeshConfig(*shape))
    with jax.set_mesh(mesh):
        out = grad()(placement.place_state(PARAMS, mesh), placement.place_rows(batch, mesh, row_axis=0))
    # Every gradient entry is a sum over the batch's tokens (N * (P + Tr) = 256 rows, times the
    # contraction inside each layer), now per device and all-reduced: absolute error
    # <~ 256 * 2^-24 * sum|terms| ~ 1.5e-5 * sum|terms|, and sum|terms| stays within a few times the
    # largest entry of the leaf for these inputs: atol = 1e-4 * max|g| per leaf.
    for (path, new), old in zip(jax.tree_util.tree_leaves_with_path(out), jax.tree.leaves(ref), strict=True):
        old = np.asarray(old)
        np.testing.assert_allclose(np.asarray(new), old, rtol=0, atol=1e-4 * np.abs(old).max(),
                                   err_msg=jax.tree_util.keystr(path))
