"""The precision recipe: presets of docs/rl.md's ablation matrix, JSON round trip, resolution."""

import pytest

import json

from fp4rl.recipe import (ABLATION_ARMS, BASELINE_ARMS, BF16, DOSE_RESPONSE_DOSES, POSITIVE_CONTROL_ARMS, PrecisionRecipe,
                          SiteConfig, dose_arm, dose_response_arms)

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
    assert site.backward == ("dequantized" if dq else "bf16")  # the paper's baseline: quantized forward, BF16 backward
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


# docs/rl.md "The ablation matrix", per named recipe and site kind: "bf16" for a BF16 site, else
# "<format>[+46] <backward>". Columns: routed experts, shared expert, dense MLP, attention (layer 0 of
# 20) and the routed experts of the last layer (BF16 where selective high precision keeps it).
ARM_SITES = {
    "bf16": ("bf16", "bf16", "bf16", "bf16", "bf16"),
    "nvfp4": ("nvfp4 bf16", "nvfp4 bf16", "bf16", "bf16", "nvfp4 bf16"),
    "+dq": ("nvfp4 dequantized", "nvfp4 dequantized", "bf16", "bf16", "nvfp4 dequantized"),
    "+46": ("nvfp4+46 bf16", "nvfp4+46 bf16", "bf16", "bf16", "nvfp4+46 bf16"),
    "+hp": ("nvfp4 bf16", "bf16", "bf16", "bf16", "bf16"),
    "full": ("nvfp4+46 dequantized", "bf16", "bf16", "bf16", "bf16"),
    "full-dq": ("nvfp4+46 bf16", "bf16", "bf16", "bf16", "bf16"),
    "full-46": ("nvfp4 dequantized", "bf16", "bf16", "bf16", "bf16"),
    "full-hp": ("nvfp4+46 dequantized", "nvfp4+46 dequantized", "bf16", "bf16", "nvfp4+46 dequantized"),
    "nvfp4-pt": ("nvfp4 quantized", "nvfp4 quantized", "bf16", "bf16", "nvfp4 quantized"),
    "mxfp8-q": ("mxfp8 quantized", "mxfp8 quantized", "bf16", "bf16", "mxfp8 quantized"),
    "mxfp8": ("mxfp8 bf16", "mxfp8 bf16", "bf16", "bf16", "mxfp8 bf16"),
    "mxfp8+dq": ("mxfp8 dequantized", "mxfp8 dequantized", "bf16", "bf16", "mxfp8 dequantized"),
    "nvfp4+attn": ("nvfp4 bf16", "nvfp4 bf16", "nvfp4 bf16", "nvfp4 bf16", "nvfp4 bf16"),
    "full+attn": ("nvfp4+46 dequantized", "bf16", "nvfp4+46 dequantized", "nvfp4+46 dequantized", "bf16"),
    "nvfp4-tensor": ("nvfp4 bf16", "nvfp4 bf16", "bf16", "bf16", "nvfp4 bf16"),  # per-tensor activation scales
    **{f"{base}@{a}": (f"nvfp4@{a} {backward}",) * 2 + ("bf16", "bf16", f"nvfp4@{a} {backward}")
       for a in (4, 16, 64) for base, backward in (("nvfp4", "bf16"), ("+dq", "dequantized"))},
}


def _describe(site: SiteConfig) -> str:
    if not site.quantized:
        return "bf16"
    assert site.weight_46 == site.act_46  # 4/6 on both operands or on neither
    dose = "" if site.amplification == 1 else f"@{site.amplification:g}"
    return f"{site.format}{'+46' if site.weight_46 else ''}{dose} {site.backward}"


def test_every_named_recipe_is_pinned():
    assert set(ARM_SITES) == set(PrecisionRecipe.names())


@pytest.mark.parametrize("name", sorted(ARM_SITES))
def test_each_arm_states_its_backward_per_site_kind(name):
    recipe, n = PrecisionRecipe.from_name(name), 20
    kinds = ("routed_experts", "shared_expert", "dense_mlp", "attention")
    got = (*(_describe(recipe.site(kind, 0, n)) for kind in kinds), _describe(recipe.site("routed_experts", n - 1, n)))
    assert got == ARM_SITES[name]
    for kind in ("router", "embed", "lm_head"):
        assert recipe.site(kind, None if kind != "router" else 0, n) == BF16
    for kind in ("routed_experts", "shared_expert", "dense_mlp", "attention"):
        site = recipe.site(kind, 0, n)
        if site.format == "nvfp4":  # every NVFP4 arm but the positive control: per-token activation scales,
            # 16x16 weight tiles, 4/6 MAE
            assert site.act_scale == ("tensor" if name == "nvfp4-tensor" else "token"), site
            assert site.weight_block == "2d" and site.weight_46 in (None, "mae"), site


def test_pretraining_recipe_and_mxfp8_validation_arms():
    """nvfp4-pt: NVFP4 forward as nvfp4's, quantized backward (SR, RHT) with 16x16 weight blocks;
    the MXFP8 validation has the paper's three backwards."""
    pt, nvfp4 = (PrecisionRecipe.from_name(n).site("routed_experts", 0, 8) for n in ("nvfp4-pt", "nvfp4"))
    assert (pt.format, pt.backward, pt.weight_block, pt.weight_46) == ("nvfp4", "quantized", "2d", None)
    assert pt == SiteConfig(format="nvfp4", backward="quantized")
    assert nvfp4 == SiteConfig(format="nvfp4", backward="bf16")
    backwards = {n: PrecisionRecipe.from_name(n).site("routed_experts", 0, 8) for n in ("mxfp8-q", "mxfp8", "mxfp8+dq")}
    assert {n: (s.format, s.backward) for n, s in backwards.items()} == {
        "mxfp8-q": ("mxfp8", "quantized"), "mxfp8": ("mxfp8", "bf16"), "mxfp8+dq": ("mxfp8", "dequantized")}
    assert BASELINE_ARMS == ("nvfp4-pt", "mxfp8-q", "mxfp8", "mxfp8+dq")
    assert set(BASELINE_ARMS) <= set(PrecisionRecipe.names()) and not set(BASELINE_ARMS) & set(ABLATION_ARMS)


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


@pytest.mark.parametrize("pair", [("nvfp4", "+dq"), ("nvfp4", "nvfp4-pt"), ("+46", "full-hp"), ("+hp", "full-46"),
                                  ("full", "full-dq"), ("mxfp8", "mxfp8-q"), ("mxfp8", "mxfp8+dq"),
                                  ("nvfp4@4", "+dq@4")])
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
    recipe = PrecisionRecipe.from_name("nvfp4-pt")  # the quantized backward: its forward derives per-site keys
    run = jax.jit(lambda r, k: forward(graphdef, params, tokens, r, key=k)[0], static_argnums=0)
    np.testing.assert_array_equal(np.asarray(run(recipe, jax.random.key(0))), np.asarray(run(recipe.forward_only(), None)))


def test_nvfp4_arm_is_a_quantized_forward_with_the_bf16_backward():
    """The paper's baseline at the site level (`fp4rl.model.sites.site_dot`): under `nvfp4` the
    forward is the emulated NVFP4 GEMM, the gradient that of x @ w on the raw operands
    (dx = g @ w^T, dw = x^T @ g), and no key is drawn; `+dq`'s gradient differs from it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fp4rl import qlinear
    from fp4rl.model.sites import Ctx, site_dot

    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x, w, g = jax.random.normal(kx, (32, 64)), jax.random.normal(kw, (64, 32)) * 0.1, jax.random.normal(kg, (32, 32))

    def vjp(name):
        ctx = Ctx(recipe=PrecisionRecipe.from_name(name), num_layers=2, impl="reference")  # key None
        y, pull = jax.vjp(lambda x, w: site_dot(x, w, ctx, "shared_expert", 0, "shared.gate_up"), x, w)
        return (y, *pull(g))

    y, dx, dw = vjp("nvfp4")
    np.testing.assert_array_equal(np.asarray(y), np.asarray(qlinear.qdot(x, w, SiteConfig(format="nvfp4"))))
    exact = jnp.matmul(x, w, preferred_element_type=jnp.float32)
    assert float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact)) > 1e-2  # the forward is quantized
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(g @ w.T))
    x_t_g = jax.lax.dot_general(x, g, (([0], [0]), ([], [])), preferred_element_type=jnp.float32)  # x^T @ g
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(x_t_g))
    _, dx_dq, dw_dq = vjp("+dq")  # the dequantized backward: DQ(Q(w)) and DQ(Q(x)) instead
    assert float(jnp.linalg.norm(dx_dq - dx) / jnp.linalg.norm(dx)) > 1e-2
    assert float(jnp.linalg.norm(dw_dq - dw) / jnp.linalg.norm(dw)) > 1e-2


# ---------------------------------------------------------------- dose-response and positive controls
def test_dose_response_and_positive_control_arms_are_extra_variants():
    assert DOSE_RESPONSE_DOSES == (1, 4, 16, 64)
    assert dose_response_arms() == ("nvfp4", "+dq", "nvfp4@4", "+dq@4", "nvfp4@16", "+dq@16", "nvfp4@64", "+dq@64")
    assert dose_response_arms((0.5, 1)) == ("nvfp4@0.5", "+dq@0.5", "nvfp4", "+dq")
    assert POSITIVE_CONTROL_ARMS == ("nvfp4+attn", "nvfp4-tensor")
    extra = set(dose_response_arms()[2:]) | set(POSITIVE_CONTROL_ARMS)
    assert extra <= set(PrecisionRecipe.names()) and not extra & set(ABLATION_ARMS + BASELINE_ARMS)
    tensor, nvfp4 = PrecisionRecipe.from_name("nvfp4-tensor"), PrecisionRecipe.from_name("nvfp4")
    assert tensor.routed_experts == SiteConfig(format="nvfp4", act_scale="tensor")
    assert tensor.shared_expert == tensor.routed_experts and tensor.keep_last_fraction == nvfp4.keep_last_fraction


@pytest.mark.parametrize("base", ["nvfp4", "+dq"])
def test_a_dose_amplifies_every_quantized_site_of_its_base(base):
    plain = PrecisionRecipe.from_name(base)
    for a, name in ((2.5, f"{base}@2.5"), (0.5, f"{base}@0.5"), (1000.0, f"{base}@1000")):
        recipe = PrecisionRecipe.from_name(name)
        assert recipe.name == name and recipe == dose_arm(base, a)
        for kind in ("routed_experts", "shared_expert", "dense_mlp", "attention", "router", "embed", "lm_head"):
            site, base_site = getattr(recipe, kind), getattr(plain, kind)
            assert site == (SiteConfig(**{**base_site.__dict__, "amplification": a}) if base_site.quantized else BF16)
    at_one = PrecisionRecipe.from_name(f"{base}@1")  # the recipe under another name (same programs: test_program_digest)
    assert at_one.name == f"{base}@1" and at_one.routed_experts == plain.routed_experts
    assert at_one.to_json() == plain.to_json().replace(f'"name": "{base}"', f'"name": "{base}@1"')


@pytest.mark.parametrize("name, match", [
    ("nvfp4@0", "finite number > 0"), ("+dq@-4", "finite number > 0"), ("nvfp4@inf", "finite number > 0"),
    ("nvfp4@nan", "finite number > 0"), ("nvfp4@four", "not a number"), ("nvfp4@", "not a number"),
    ("full@4", r"a dose applies to \('nvfp4', '\+dq'\)"), ("nvfp4@4.0", "write it 'nvfp4@4'"),
    ("nvfp4@04", "write it 'nvfp4@4'"), ("nvfp4", None), ("nvfp5", r"valid names.*nvfp4-tensor.*nvfp4@A or \+dq@A"),
])
def test_dose_names_are_checked(name, match):
    if match is None:
        PrecisionRecipe.from_name(name)
        return
    with pytest.raises(ValueError, match=match):
        PrecisionRecipe.from_name(name)


def test_recipe_json_names_the_amplification_of_doses_only():
    """A recipe without a dose keeps its JSON (a resume compares it as text, and checkpoints written
    before the field existed load); a dose's JSON carries it and round-trips."""
    for name in PrecisionRecipe.names():
        data = json.loads(PrecisionRecipe.from_name(name).to_json())
        amplified = [k for k, v in data.items() if isinstance(v, dict) and "amplification" in v]
        assert amplified == ([] if "@" not in name else ["routed_experts", "shared_expert"]), name
    recipe = PrecisionRecipe.from_name("+dq@16")
    assert PrecisionRecipe.from_json(recipe.to_json()) == recipe
    assert json.loads(recipe.to_json())["routed_experts"]["amplification"] == 16.0

