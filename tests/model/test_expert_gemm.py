"""`ModelConfig.expert_gemm="auto"` (the default): which backend it resolves to, where, and that
models and stored configs name the backend, never "auto".

The GPU cases run on the CPU with the platform faked (`jax.default_backend`, the device's compute
capability): the resolution reads nothing else of the device, and the kernels' argument checks it
asks run abstractly (`fp4rl.grouped.kernels_refuse`).
"""

from __future__ import annotations

import dataclasses
import types

import jax
import numpy as np
import pytest
from flax import nnx

from fp4rl import grouped
from fp4rl.model import init
from fp4rl.model.config import ModelConfig
from fp4rl.model.moe import MoE
from fp4rl.model.sites import Ctx
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import trainer

H200 = ModelConfig.from_name("h200")


@pytest.fixture
def platform(monkeypatch):
    """Fake the platform the resolution sees: platform("gpu", "9.0") is a Hopper GPU."""
    def fake(backend: str, compute_capability: str | None = None):
        device = types.SimpleNamespace(platform=backend, compute_capability=compute_capability)
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
        monkeypatch.setattr(jax, "devices", lambda *args, **kwargs: [device])
    return fake


def _backends(model) -> set[str]:
    return {n.expert_gemm for _, n in nnx.graph.iter_graph(model) if isinstance(n, MoE)}


def test_auto_is_the_default_and_resolves_to_xla_on_the_cpu():
    config = ModelConfig.from_name("tiny")
    assert config.expert_gemm == "auto" and H200.expert_gemm == "auto"
    assert jax.default_backend() == "cpu"
    assert config.resolved().expert_gemm == "xla" and H200.resolved().expert_gemm == "xla"
    named = dataclasses.replace(config, expert_gemm="blocked")
    assert named.resolved() is named  # a named backend is kept, on every platform


def test_a_model_is_built_with_the_resolved_backend():
    model = nnx.merge(*init(ModelConfig.from_name("tiny"), 0))
    assert model.config.expert_gemm == "xla"  # the sampler reads this config
    assert _backends(model) == {"xla"}
    moe = MoE(ModelConfig.from_name("tiny"), 0, nnx.Rngs(0))  # an MoE built alone resolves too
    assert moe.expert_gemm == "xla"


def test_on_a_hopper_gpu_auto_is_packed_where_the_kernels_take_the_model(platform):
    platform("gpu", "9.0")
    assert grouped.on_hopper()
    # The RL step's fastest backend (benchmarks/README.md), for every recipe of the h200 preset.
    assert H200.resolved().expert_gemm == "packed"
    # f32 compute: the kernels take bf16/f16 operands only (f32 would run as TF32).
    f32 = dataclasses.replace(H200, dtype="float32")
    assert f32.resolved().expert_gemm == "xla"
    assert "float32" in grouped.kernels_refuse("mosaic", "float32", f32.expert_weight_shapes)
    # Widths off the kernels' tiles: tiny's experts are 32 wide, the wgrad's K must be a multiple of 64.
    tiny_bf16 = dataclasses.replace(ModelConfig.from_name("tiny"), dtype="bfloat16")
    assert tiny_bf16.resolved().expert_gemm == "xla"
    assert "K=32 must be a multiple of 64" in grouped.kernels_refuse("mosaic", "bfloat16", tiny_bf16.expert_weight_shapes)
    # A model the Mosaic kernels take is the packed kernel's too: no recipe needs another backend.
    assert grouped.kernels_refuse("packed", "bfloat16", H200.expert_weight_shapes) is None
    assert grouped.kernels_refuse("packed_wgmma", "bfloat16", H200.expert_weight_shapes) is None  # and the WGMMA one's
    # N=32 experts (gate|up of 128 -> 32) do not fill the wgrad kernel's 64-wide shared-memory tiles:
    # its argument checks say so (before they did not, and Pallas's tracing failed an assertion).
    assert "wgrad [128, 32]: N (rhs columns): block 32 must be a multiple of 64" in grouped.kernels_refuse(
        "mosaic", "bfloat16", ((128, 32),))


def test_where_only_the_packed_kernel_refuses_auto_is_mosaic(platform, monkeypatch):
    platform("gpu", "9.0")
    monkeypatch.setattr(grouped, "kernels_refuse", lambda gemm, dtype, weights: "no" if gemm == "packed" else None)
    assert H200.resolved().expert_gemm == "mosaic"


@pytest.mark.parametrize("backend, capability", [("gpu", "8.0"), ("gpu", "10.0"), ("tpu", None)])
def test_auto_is_xla_where_the_kernels_do_not_run(platform, backend, capability):
    platform(backend, capability)  # the Mosaic GPU kernels use Hopper's WGMMA and TMA
    assert H200.resolved().expert_gemm == "xla"


def test_unknown_names_are_refused_with_the_valid_options():
    options = (r"valid options: \('auto', 'xla', 'blocked', 'mosaic', 'mosaic_interpret', 'packed', 'packed_interpret', "
               r"'packed_dgrad', 'packed_dgrad_interpret', 'packed_wgmma', 'packed_wgmma_interpret'\)")
    with pytest.raises(ValueError, match=options):
        ModelConfig.from_name("tiny", expert_gemm="cutlass")
    with pytest.raises(ValueError, match=options):
        trainer.RLConfig(expert_gemm="cutlass")
    assert trainer.RLConfig(expert_gemm="auto").expert_gemm == "auto" and trainer.RLConfig().expert_gemm == ""
    # The GEMM functions take backends only: "auto" reaching them was never resolved.
    a = jax.numpy.zeros((32, 16), jax.numpy.bfloat16)
    with pytest.raises(ValueError, match="gemm='auto' is no backend"):
        grouped.ragged_matmul(a, jax.numpy.zeros((1, 16, 16), a.dtype), jax.numpy.asarray([32]), gemm="auto")


def test_stored_configs_load_their_backend():
    stored = dataclasses.asdict(dataclasses.replace(ModelConfig.from_name("tiny"), expert_gemm="xla"))
    assert ModelConfig.from_dict(stored).expert_gemm == "xla"
    del stored["expert_gemm"]  # saved before the field: it ran on "xla", the only backend then
    assert ModelConfig.from_dict(stored).expert_gemm == "xla"
    named = dataclasses.replace(H200, expert_gemm="packed")
    assert ModelConfig.from_json(named.to_json()) == named


def test_moe_block_on_packed_wgmma_matches_xla():
    """The MoE block of a `full` model (NVFP4 expert stacks, dequantized backward) on the Mosaic
    packed kernels (interpreted): loss and every gradient as on "xla" up to the f32 sums' order. 128
    rows per expert: the training kernel, with x read packed, and the packed dgrad."""
    config = dataclasses.replace(ModelConfig.from_name("tiny"), d_model=128, moe_d_ff=64, num_experts=4, top_k=2,
                                 dtype="bfloat16")  # widths on the kernels' tiles
    x = jax.random.normal(jax.random.key(0), (1, 256, config.d_model), jax.numpy.bfloat16)
    g = jax.random.normal(jax.random.key(1), x.shape, jax.numpy.float32)
    valid = jax.numpy.ones(x.shape[:2], bool)
    ctx = Ctx(recipe=PrecisionRecipe.from_name("full"), num_layers=config.num_layers, impl="auto")
    outs = {}
    for gemm in ("xla", "packed_wgmma_interpret"):
        graphdef, state = nnx.split(MoE(dataclasses.replace(config, expert_gemm=gemm), 0, nnx.Rngs(0)))

        def loss(state, x, graphdef=graphdef):
            y, _, aux, _ = nnx.merge(graphdef, state)(x, valid, ctx)
            return jax.numpy.sum(y.astype(jax.numpy.float32) * g) + aux

        outs[gemm] = [np.asarray(v, np.float32) for v in jax.tree.leaves(jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(state, x))]
    for ours, ref in zip(outs["packed_wgmma_interpret"], outs["xla"]):
        assert np.linalg.norm(ours - ref) <= 1e-5 * np.linalg.norm(ref)
