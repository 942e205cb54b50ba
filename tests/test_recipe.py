"""The precision recipe: presets of docs/rl.md's ablation matrix, JSON round trip, resolution."""

import pytest

from fp4rl.recipe import ABLATION_ARMS, BF16, PrecisionRecipe, SiteConfig

# docs/rl.md's table: arm -> (dequantized bwd, 4/6 on W and A, BF16 shared expert + last 15%)
TABLE = {
    "nvfp4": (False, False, False),
    "+dq": (True, False, False),
    "+46": (False, True, False),
    "+hp": (False, False, True),
    "full": (True, True, True),
    "full-dq": (False, True, True),
    "full-46": (True, False, True),
    "full-hp": (True, True, False),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_presets_follow_the_ablation_table(name):
    dq, four_over_six, high_precision = TABLE[name]
    recipe = PrecisionRecipe.from_name(name)
    num_layers = 20  # 15% of 20 = 3 layers kept in BF16
    site = recipe.site("routed_experts", 0, num_layers)
    assert site.format == "nvfp4" and site.act_scale == "token"
    assert site.backward == ("dequantized" if dq else "quantized")
    assert (site.weight_46, site.act_46) == (("mae", "mae") if four_over_six else (None, None))
    for kind in ("attention", "dense_mlp"):  # only the MoE linears are NVFP4 (docs/rl.md)
        assert recipe.site(kind, 0, num_layers) == BF16
    assert (recipe.site("shared_expert", 0, num_layers) == BF16) == high_precision
    last = [recipe.site("routed_experts", layer, num_layers) == BF16 for layer in range(num_layers)]
    assert last == [False] * 17 + [high_precision] * 3
    for kind in ("router", "embed", "lm_head"):
        assert recipe.site(kind, None if kind != "router" else 0, num_layers) == BF16


def test_bf16_arm_is_bf16_everywhere():
    recipe = PrecisionRecipe.from_name("bf16")
    for kind in ("routed_experts", "shared_expert", "dense_mlp", "attention", "router"):
        assert recipe.site(kind, 0, 4) == BF16


@pytest.mark.parametrize("num_layers, kept", [(1, 1), (2, 1), (4, 1), (7, 1), (8, 1), (10, 2), (13, 2), (20, 3), (48, 7)])
def test_selective_precision_rounds_to_nearest_and_keeps_at_least_one_layer(num_layers, kept):
    assert PrecisionRecipe.from_name("full").num_high_precision_layers(num_layers) == kept


@pytest.mark.parametrize("num_layers", range(1, 65))
def test_kept_fraction_is_12_to_19_percent_wherever_a_depth_allows_it(num_layers):
    """docs/rl.md: "last ~15%" means a kept share of 12-19% of the layers. Depths 1-5, 9 and 10 have
    no such share (1 of 9 is 11%, 2 of 10 is 20%); at every other depth the rule lands in it."""
    possible = any(0.12 <= k / num_layers <= 0.19 for k in range(1, num_layers))
    assert possible == (num_layers not in (1, 2, 3, 4, 5, 9, 10))
    kept = PrecisionRecipe.from_name("full").num_high_precision_layers(num_layers)
    assert (0.12 <= kept / num_layers <= 0.19) == possible, (num_layers, kept)


def test_high_precision_summary_states_k_of_l():
    assert PrecisionRecipe.from_name("full").high_precision_summary(8) == "1 of 8 layers kept in BF16 (12.5%)"
    assert PrecisionRecipe.from_name("nvfp4").high_precision_summary(8) == "0 of 8 layers kept in BF16 (0.0%)"


def test_mxfp8_validation_presets():
    assert PrecisionRecipe.from_name("mxfp8").site("routed_experts", 0, 8).format == "mxfp8"
    assert PrecisionRecipe.from_name("mxfp8+dq").site("routed_experts", 0, 8).backward == "dequantized"


@pytest.mark.parametrize("name", PrecisionRecipe.names())
def test_json_round_trip(name):
    recipe = PrecisionRecipe.from_name(name)
    assert PrecisionRecipe.from_json(recipe.to_json()) == recipe


def test_every_ablation_arm_is_a_preset():
    assert set(ABLATION_ARMS) <= set(PrecisionRecipe.names())


def test_errors_name_the_valid_options():
    with pytest.raises(ValueError, match="valid names.*full-hp"):
        PrecisionRecipe.from_name("fp4")
    with pytest.raises(ValueError, match="valid options"):
        SiteConfig(format="fp4")
    with pytest.raises(ValueError, match="valid options"):
        SiteConfig(format="nvfp4", backward="straight")
    with pytest.raises(ValueError, match="Four-Over-Six"):
        SiteConfig(format="mxfp8", weight_46="mae")
    with pytest.raises(ValueError, match="site kind"):
        PrecisionRecipe.from_name("full").site("mlp", 0, 4)
    with pytest.raises(ValueError, match="out of range"):
        PrecisionRecipe.from_name("full").site("attention", 4, 4)


@pytest.mark.parametrize("pair", [("nvfp4", "+dq"), ("+46", "full-hp"), ("+hp", "full-46"), ("full", "full-dq")])
def test_forward_only_view_is_shared_by_arms_differing_in_backward(pair):
    a, b = (PrecisionRecipe.from_name(n).forward_only() for n in pair)
    assert a == b and hash(a) == hash(b)  # equal static jit arguments: one program for both arms
    assert a.forward_only() == a
    assert PrecisionRecipe.from_name("bf16").forward_only().routed_experts == BF16


def test_forward_only_view_gives_the_same_forward():
    """No key needed, and the logits are bitwise those of the recipe itself (the backward mode
    only changes what the custom_vjp saves and how it differentiates)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fp4rl.model import ModelConfig, forward, init

    graphdef, params = init(ModelConfig.from_name("tiny"), 0)
    tokens = jnp.asarray(np.arange(2 * 12).reshape(2, 12) % 60 + 3, jnp.int32)
    recipe = PrecisionRecipe.from_name("nvfp4")
    run = jax.jit(lambda r, k: forward(graphdef, params, tokens, r, key=k)[0], static_argnums=0)
    np.testing.assert_array_equal(np.asarray(run(recipe, jax.random.key(0))), np.asarray(run(recipe.forward_only(), None)))
