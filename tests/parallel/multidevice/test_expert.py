"""Expert parallelism of the MoE on 8 CPU devices: the sharded experts equal the one-device MoE
(forward and gradient), and the expert shards of a quantized stack are the one-device bytes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from fp4rl import qlinear
from fp4rl.model import ModelConfig, init
from fp4rl.model.sites import Ctx
from fp4rl.model.expert_parallel import EXPERTS
from fp4rl.parallel.mesh import MeshConfig, make_mesh
from fp4rl.recipe import PrecisionRecipe

# tiny, with 8 experts so that every mesh of 8 devices can split them (1 expert per device at 1 x 8).
CFG = dataclasses.replace(ModelConfig.from_name("tiny"), num_experts=8)
GRAPHDEF, PARAMS = init(CFG, 0)
T = 64  # tokens: 8 per device on 8 devices
KEY = jax.random.key(0)
MESHES = [(1, 8), (2, 4), (8, 1)]  # (data, expert): pure EP, both, pure DP
# f32 compute. The sharded program runs the same per-row operations as the one-device MoE on the
# same operands; only the GEMMs' accumulation order may differ (other row counts per call). Forward:
# sums of K = 64 (gate_up) and 32 (down) terms of O(1) products, |error| <= K * u * sum|terms|
# with u = 2^-24 (f32): about 64 * 6e-8 * 4 ~ 1.5e-5 at most, far less in practice.
FWD_TOL = 1.5e-5


def _experts_program(recipe):
    """A fresh jit per call site, so a program traced without a mesh is never reused with one."""
    @jax.jit
    def run(params, x_TxD, weight_TxK, expert_TxK):
        moe = nnx.merge(GRAPHDEF, params).layers[0].mlp
        ctx = Ctx(recipe=recipe, num_layers=CFG.num_layers, impl="reference", key=KEY)
        return moe.experts(x_TxD, weight_TxK, expert_TxK, ctx)

    return run


def _inputs(routing: str):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(T, CFG.d_model)).astype(np.float32)
    if routing == "random":
        expert = np.stack([rng.permutation(CFG.num_experts)[: CFG.top_k] for _ in range(T)]).astype(np.int32)
    else:  # every pair to experts 7 and 6: all routed rows land on the last device of the expert axis
        expert = np.tile(np.array([[7, 6]], np.int32), (T, 1))
    weight = rng.uniform(0.1, 1.0, size=(T, CFG.top_k)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(weight), jnp.asarray(expert)


def _mesh(shape):
    return make_mesh(MeshConfig(*shape))


@pytest.mark.parametrize("recipe_name", ["bf16", "nvfp4"])
@pytest.mark.parametrize("routing", ["random", "all_to_one_device"])
@pytest.mark.parametrize("shape", MESHES)
def test_sharded_experts_forward_equal_one_device(shape, routing, recipe_name):
    recipe = PrecisionRecipe.from_name(recipe_name)
    x, weight, expert = _inputs(routing)
    ref = np.asarray(_experts_program(recipe)(PARAMS, x, weight, expert))
    mesh = _mesh(shape)
    program = _experts_program(recipe)
    with jax.set_mesh(mesh):
        text = program.lower(PARAMS, x, weight, expert).as_text()
        out = np.asarray(program(PARAMS, x, weight, expert))
    assert ("all_to_all" in text) == (shape[1] > 1), "the expert-parallel exchange must run exactly when expert > 1"
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0.1  # a real signal, not zeros
    # nvfp4: per-token activation scales and per-expert weight amax, so each row quantizes to the
    # same bytes wherever it runs; the GEMMs then see identical operands (same tolerance as f32).
    np.testing.assert_allclose(out, ref, rtol=FWD_TOL, atol=FWD_TOL)


@pytest.mark.parametrize("recipe_name", ["bf16", "+dq"])
@pytest.mark.parametrize("shape", MESHES)
def test_sharded_experts_gradient_equal_one_device(shape, recipe_name):
    recipe = PrecisionRecipe.from_name(recipe_name)
    x, weight, expert = _inputs("random")
    cot = jnp.asarray(np.random.default_rng(2).normal(size=(T, CFG.d_model)).astype(np.float32))

    def program():
        def loss(params, x):
            moe = nnx.merge(GRAPHDEF, params).layers[0].mlp
            ctx = Ctx(recipe=recipe, num_layers=CFG.num_layers, impl="reference", key=KEY)
            return jnp.sum(moe.experts(x, weight, expert, ctx) * cot)

        def grads(params, x):
            g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, x)
            mlp = g_params["layers"][0]["mlp"]
            return {"gate_up": mlp["gate_up"].get_value(), "down": mlp["down"].get_value()}, g_x

        return jax.jit(grads)

    ref = jax.tree.map(np.asarray, program()(PARAMS, x))
    with jax.set_mesh(_mesh(shape)):
        out = jax.tree.map(np.asarray, program()(PARAMS, x))
    # Weight gradients sum over the rows of an expert (at most T * k = 128 here), split over devices
    # and re-added: |error| <= 128 * u * sum|terms| ~ 8e-6 * sum|terms|, and sum|terms| stays within
    # a few times the largest gradient entry for these inputs; the input gradient sums 2F = 64 and
    # k = 2 terms per entry, as in the forward.
    for name in ("gate_up", "down"):
        scale = np.abs(ref[0][name]).max()
        np.testing.assert_allclose(out[0][name], ref[0][name], rtol=3e-5, atol=3e-5 * scale, err_msg=name)
    np.testing.assert_allclose(out[1], ref[1], rtol=FWD_TOL, atol=FWD_TOL * np.abs(ref[1]).max())


def _bytes(tree):
    return [np.asarray(leaf).view(np.uint8) if np.asarray(leaf).dtype.itemsize == 1 else np.asarray(leaf)
            for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("recipe_name", ["nvfp4", "+46"])
def test_expert_shards_quantize_to_the_one_device_bytes(recipe_name):
    site = PrecisionRecipe.from_name(recipe_name).site("routed_experts", 0, CFG.num_layers)
    w = PARAMS["layers"][0]["mlp"]["gate_up"].get_value()  # [E, D, 2F]
    ref = jax.jit(lambda w: qlinear.quantize_weight(w, site, "reference"))(w)
    mesh = _mesh((2, 4))
    split = NamedSharding(mesh, EXPERTS)
    # 1. Quantized under jit from a stack split over "expert" (the weight sync of a sharded run).
    sharded = jax.jit(lambda w: qlinear.quantize_weight(w, site, "reference"), out_shardings=split)(jax.device_put(w, split))
    for a, b in zip(_bytes(sharded), _bytes(ref), strict=True):
        np.testing.assert_array_equal(a, b)
    assert ref.amax.shape[0] == CFG.num_experts  # one amax per expert
    # Every device holds exactly the one-device bytes of its experts.
    for leaf, ref_leaf in zip(jax.tree.leaves(sharded), jax.tree.leaves(ref), strict=True):
        for shard in leaf.addressable_shards:
            assert shard.data.shape[0] == CFG.num_experts // 4
            np.testing.assert_array_equal(np.asarray(shard.data).view(np.uint8), np.asarray(ref_leaf[shard.index]).view(np.uint8))
    # 2. Quantized by each device from its own raw shard (what qdot does inside the expert-parallel MoE).
    local = jax.jit(jax.shard_map(lambda w: qlinear.quantize_weight(w, site, "reference"), mesh=mesh,
                                  in_specs=EXPERTS, out_specs=EXPERTS))(jax.device_put(w, split))
    for a, b in zip(_bytes(local), _bytes(ref), strict=True):
        np.testing.assert_array_equal(a, b)


def test_prequantized_experts_forward_equal_one_device():
    """The sampler's path: weights synced (quantized) once, then split over the expert axis."""
    from fp4rl.model.sync import sync_weights_jit

    recipe = PrecisionRecipe.from_name("+46").forward_only()
    qparams, _ = sync_weights_jit(PARAMS, CFG, recipe, "reference")
    x, weight, expert = _inputs("random")
    ref = np.asarray(_experts_program(recipe)(qparams, x, weight, expert))
    program = _experts_program(recipe)
    with jax.set_mesh(_mesh((2, 4))):
        out = np.asarray(program(qparams, x, weight, expert))
    np.testing.assert_allclose(out, ref, rtol=FWD_TOL, atol=FWD_TOL)
