"""Weight sync: forward(qparams) is bitwise forward(params); the map-4 metric."""

import dataclasses

import jax
import numpy as np
import pytest

from fp4rl.formats import nvfp4
from fp4rl.model import sync_weights_jit
from fp4rl.model.sampler import operands_ahead
from fp4rl.operands import ScaledWeight
from fp4rl.qlinear import is_quantized_weight
from fp4rl.recipe import PrecisionRecipe, SiteConfig
from tests.model.common import TINY, fwd, model, tokens


@pytest.mark.parametrize("name", ["full", "nvfp4", "nvfp4@4"])
def test_forward_of_synced_weights_is_bitwise_equal(name):
    """nvfp4@4: the synced weight is w_a in bf16 (no packed form, no map-4 blocks), and the
    sampler's forward on it is the trainer's on the raw weight."""
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = model()
    qparams, metrics = sync_weights_jit(params, TINY, recipe, "reference")
    formed = [x for x in jax.tree.leaves(qparams, is_leaf=is_quantized_weight) if is_quantized_weight(x)]
    assert formed  # the sync did replace weights
    if name == "nvfp4@4":
        assert all(isinstance(x, ScaledWeight) and x.amplification == 4.0 for x in formed)
    else:
        assert all(isinstance(x, nvfp4.NVFP4Tensor) for x in formed)
    seqs = tokens(2)
    from_params = fwd(graphdef, params, seqs, recipe)
    from_synced = fwd(graphdef, qparams, seqs, recipe)
    for a, b in zip(jax.tree.leaves(from_params), jax.tree.leaves(from_synced)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    map4 = [np.asarray(t.map4).reshape(-1) for t in formed if isinstance(t, nvfp4.NVFP4Tensor)]
    expected = np.mean(np.concatenate(map4)) if map4 else 0.0
    np.testing.assert_array_equal(np.asarray(metrics["quant/map4_frac"]), np.float32(expected))


@pytest.mark.parametrize("name", ["full", "mxfp8", "nvfp4@4"])
def test_operands_formed_ahead_give_the_same_forward(name):
    """The sampler forms every synced weight's GEMM operand once, before its decode loop
    (`sampler.operands_ahead`): the forward is bitwise the forward of the synced weights."""
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = model()
    qparams, _ = sync_weights_jit(params, TINY, recipe, "reference")
    ahead = operands_ahead(qparams, TINY)
    kinds = {type(x) for x in jax.tree.leaves(ahead, is_leaf=is_quantized_weight) if is_quantized_weight(x)}
    assert kinds == {ScaledWeight}
    seqs = tokens(2)
    synced, formed_ahead = (jax.tree.leaves(fwd(graphdef, p, seqs, recipe)) for p in (qparams, ahead))
    for a, b in zip(synced, formed_ahead):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    packed = operands_ahead(qparams, dataclasses.replace(TINY, expert_gemm="packed_interpret"))
    stacks = [x for x in jax.tree.leaves(packed, is_leaf=is_quantized_weight) if isinstance(x, nvfp4.NVFP4Tensor)]
    assert (len(stacks) > 0) == (name == "full") and all(t.codes.ndim == 3 for t in stacks)  # packed expert stacks stay


def test_map4_fraction_counts_the_chosen_blocks():
    # 16x16 tiles of Gaussian weights never prefer map-4 (the tile max sits far above its typical
    # value); 1x16 blocks often do. A 1D-weight 4/6 recipe must report a fraction in (0, 1).
    site = SiteConfig(format="nvfp4", weight_46="mae", act_46="mae", weight_block="1d", backward="dequantized")
    recipe = PrecisionRecipe(name="46-1d-attention", attention=site)  # one kind: a small program
    _, params = model()
    qparams, metrics = sync_weights_jit(params, TINY, recipe, "reference")
    frac = float(metrics["quant/map4_frac"])
    assert 0.05 < frac < 0.95
    leaves = [x for x in jax.tree.leaves(qparams, is_leaf=lambda x: isinstance(x, nvfp4.NVFP4Tensor))
              if isinstance(x, nvfp4.NVFP4Tensor)]
    total = sum(int(np.asarray(t.map4).sum()) for t in leaves)
    assert frac == pytest.approx(total / sum(t.map4.size for t in leaves), rel=1e-6)
    bf16 = PrecisionRecipe.from_name("bf16")
    same, metrics = sync_weights_jit(params, TINY, bf16, "reference")
    assert float(metrics["quant/map4_frac"]) == 0.0
    for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(params)):  # BF16: nothing replaced
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
