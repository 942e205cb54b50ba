"""Causality and batch invariance, bitwise, under BF16 and the NVFP4 arms (docs/numerics.md §4).

With per-token activation scales a token's quantization depends on that token alone, so
perturbing token t+1 leaves every logit at positions <= t bitwise unchanged, and a sequence's
logits do not depend on the other rows of its batch. A per-tensor activation scale breaks both;
the last test shows the leak. All runs share one shape, so each recipe compiles once.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.recipe import ABLATION_ARMS, SITE_KINDS, PrecisionRecipe, SiteConfig
from tests.model.common import TINY, fwd, model, tokens

# The forward of an NVFP4 arm depends on its sites' forward fields only (qdot's forward never
# reads `backward`), so these four arms cover every distinct forward among the eight NVFP4
# arms: {4/6 off, on} x {selective high precision off, on}; `test_every_arm_is_covered` checks
# that each arm resolves, site by site, to one of them.
FORWARD_CLASSES = ("nvfp4", "+46", "+hp", "full")
SPIKE = 5  # token whose embedding is one-hot: its normalised activation (8 = sqrt(D)) is the amax
T_PERTURB = 9  # the token changed; positions 0..8 must not move


def _spiky_params():
    graphdef, params = model()
    params = jax.tree.map(lambda a: a, params)  # a copy: new Variables, same arrays
    embed = params["embed"].get_value()
    params["embed"].set_value(embed.at[SPIKE].set(jnp.zeros_like(embed[SPIKE]).at[0].set(1.0)))
    return graphdef, params


def _forward_signature(recipe):
    # What the model's forward reads from the recipe: each (kind, layer) site's forward fields
    # (test_sites.py checks that the model resolves exactly recipe.site(kind, layer, N)).
    N = TINY.num_layers
    return [(kind, layer, dataclasses.replace(recipe.site(kind, layer, N), backward="bf16"))
            for kind in SITE_KINDS for layer in (*range(N), None)]


def test_every_arm_is_covered():
    signatures = {name: _forward_signature(PrecisionRecipe.from_name(name)) for name in FORWARD_CLASSES}
    assert len({str(s) for s in signatures.values()}) == len(FORWARD_CLASSES)  # all distinct
    for arm in ABLATION_ARMS:
        if arm != "bf16":
            assert _forward_signature(PrecisionRecipe.from_name(arm)) in signatures.values(), arm


def _perturbed(seqs):
    out = seqs.copy()
    out[:, T_PERTURB] = SPIKE
    assert (out != seqs).any(axis=1).all()
    return out


@pytest.mark.parametrize("name", ("bf16",) + FORWARD_CLASSES)
def test_causal_and_batch_invariant_bitwise(name):
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = _spiky_params()
    seqs = tokens(0)
    base = np.asarray(fwd(graphdef, params, seqs, recipe)[0])

    changed = np.asarray(fwd(graphdef, params, _perturbed(seqs), recipe)[0])
    np.testing.assert_array_equal(changed[:, :T_PERTURB], base[:, :T_PERTURB])
    assert (changed[:, T_PERTURB:] != base[:, T_PERTURB:]).any()  # the perturbation is seen

    other_row = seqs.copy()
    other_row[1] = tokens(1)[1]  # a different sequence beside row 0
    neighbour = np.asarray(fwd(graphdef, params, other_row, recipe)[0])
    np.testing.assert_array_equal(neighbour[0], base[0])
    assert (neighbour[1] != base[1]).any()


def test_per_tensor_activation_scale_leaks():
    # The same perturbation under per-tensor activation amax: the spike raises the amax of the
    # q|k|v input, which re-scales every token of the batch, so earlier positions (and the other
    # row) move. Attention alone is quantized: one leaking site suffices (and compiles fast).
    leaky = SiteConfig(format="nvfp4", act_scale="tensor")
    recipe = PrecisionRecipe(name="nvfp4-tensor-act-attention", attention=leaky)
    graphdef, params = _spiky_params()
    seqs = tokens(0)
    seqs[1, T_PERTURB] = seqs[1, T_PERTURB - 1]  # row 1 is unchanged by the perturbation below
    base = np.asarray(fwd(graphdef, params, seqs, recipe)[0])
    perturbed = seqs.copy()
    perturbed[0, T_PERTURB] = SPIKE
    changed = np.asarray(fwd(graphdef, params, perturbed, recipe)[0])
    assert (changed[0, :T_PERTURB] != base[0, :T_PERTURB]).any(), "no causality leak under per-tensor scales"
    assert (changed[1] != base[1]).any(), "no batch leak under per-tensor scales"
