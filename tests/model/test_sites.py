"""Recipe resolution inside the model: which SiteConfig each linear of each layer receives.

`full` (docs/rl.md intervention 3) keeps the shared expert and the last round(0.15 N) layers
(half up, at least one) in BF16 and quantizes the rest; router, embedding gather and LM head are
BF16 in every preset. The check records the SiteConfigs that actually reach `qlinear.qdot`
(monkeypatched), traced only.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from fp4rl import qlinear
from fp4rl.model import forward, init, record_sites, site_map, sync_weights
from fp4rl.recipe import BF16, PrecisionRecipe
from tests.model.common import TINY

# 3 layers, layer 0 dense: the 15% rule keeps layer 2 only (ceil(0.45) = 1).
CONFIG = dataclasses.replace(TINY, num_layers=3, dense_layers=(0,), shared_expert_gate=True)
TOKENS = jnp.zeros((1, 32), jnp.int32)


def _qdot_calls(monkeypatch, recipe):
    """(SiteConfigs received by qdot, the model's SiteRecords) of one traced forward."""
    graphdef, params = init(CONFIG, 0)
    calls = []
    real_qdot = qlinear.qdot

    def recording_qdot(x, w, site, **kwargs):
        calls.append(site)
        return real_qdot(x, w, site, **kwargs)

    monkeypatch.setattr(qlinear, "qdot", recording_qdot)
    with record_sites() as records:
        jax.eval_shape(lambda p: forward(graphdef, p, TOKENS, recipe, key=jax.random.key(0)), params)
    return calls, records


def test_full_recipe_sites(monkeypatch):
    full = PrecisionRecipe.from_name("full")
    calls, records = _qdot_calls(monkeypatch, full)
    # The log names each call; qdot received exactly the logged SiteConfigs, in order.
    assert calls == [r.site for r in records]
    where = {(r.layer, r.name): (r.kind, r.site) for r in records}
    quantized = full.routed_experts
    assert quantized.format == "nvfp4" and quantized.weight_46 == "mae" and quantized.backward == "dequantized"
    # Only the MoE linears are NVFP4 (docs/rl.md): attention and the dense MLP stay BF16.
    expected = {
        (0, "qkv"): ("attention", BF16), (0, "o"): ("attention", BF16),
        (0, "mlp.gate_up"): ("dense_mlp", BF16), (0, "mlp.down"): ("dense_mlp", BF16),
        (1, "qkv"): ("attention", BF16), (1, "o"): ("attention", BF16),
        (1, "router"): ("router", BF16),
        (1, "experts.gate_up"): ("routed_experts", quantized), (1, "experts.down"): ("routed_experts", quantized),
        (1, "shared.gate_up"): ("shared_expert", BF16), (1, "shared.down"): ("shared_expert", BF16),
        (1, "shared_gate"): ("router", BF16),
        (None, "lm_head"): ("lm_head", BF16),
    }
    for name in ("qkv", "o", "router", "experts.gate_up", "experts.down", "shared.gate_up",
                 "shared.down", "shared_gate"):  # the last layer: everything BF16
        expected[(2, name)] = (where[(2, name)][0], BF16)
    assert where == expected
    assert len(records) == len(expected)  # every linear appears once


@pytest.mark.parametrize("name, backward", [("nvfp4", "bf16"), ("nvfp4-pt", "quantized")])
def test_nvfp4_recipe_quantizes_shared_expert_and_last_layer(monkeypatch, name, backward):
    # nvfp4: the paper's baseline (BF16 backward); nvfp4-pt: the pretraining recipe's quantized backward
    calls, records = _qdot_calls(monkeypatch, PrecisionRecipe.from_name(name))
    assert calls == [r.site for r in records]
    for r in records:
        expect_quantized = r.kind in ("routed_experts", "shared_expert")
        assert r.site.quantized == expect_quantized, r
        if expect_quantized:
            assert r.site.backward == backward and r.site.weight_46 is None and r.site.weight_block == "2d"


def test_attention_variant_quantizes_attention_and_dense_mlp(monkeypatch):
    """The named extra variant `full+attn` adds attention and dense MLPs to `full`'s sites."""
    variant = PrecisionRecipe.from_name("full+attn")
    _, records = _qdot_calls(monkeypatch, variant)
    quantized = {(r.layer, r.name) for r in records if r.site.quantized}
    assert {(0, "qkv"), (0, "o"), (0, "mlp.gate_up"), (1, "qkv"), (1, "experts.down")} <= quantized
    assert not any(layer == 2 for layer, _ in quantized)  # the BF16 tail is unchanged


def test_quantized_backward_needs_a_key():
    graphdef, params = init(CONFIG, 0)
    for name in ("nvfp4-pt", "mxfp8-q"):
        with pytest.raises(ValueError, match="backward='quantized'.*key="):
            jax.eval_shape(lambda p: forward(graphdef, p, TOKENS, name), params)
    # BF16, BF16-backward and dequantized-backward recipes need none; nor do synced (pre-quantized)
    # weights, which are forward-only (the sampler).
    for name in ("bf16", "nvfp4", "+46", "mxfp8", "full"):
        jax.eval_shape(lambda p: forward(graphdef, p, TOKENS, name), params)
    pt = PrecisionRecipe.from_name("nvfp4-pt")
    qparams = jax.eval_shape(lambda p: sync_weights(p, CONFIG, pt)[0], params)
    jax.eval_shape(lambda p: forward(graphdef, p, TOKENS, pt), qparams)


def test_synced_weights_are_quantized_exactly_where_the_recipe_says(monkeypatch):
    full = PrecisionRecipe.from_name("full")
    graphdef, params = init(CONFIG, 0)
    qparams = jax.eval_shape(lambda p: sync_weights(p, CONFIG, full)[0], params)
    records = site_map(graphdef, qparams, full)
    assert all(r.prequantized == r.site.quantized for r in records)
    assert any(r.prequantized for r in records)
