"""Weight sync: forward(qparams) is bitwise forward(params); the map-4 metric."""

import jax
import numpy as np
import pytest

from fp4rl.formats import nvfp4
from fp4rl.model import sync_weights_jit
from fp4rl.recipe import PrecisionRecipe, SiteConfig
from tests.model.common import TINY, fwd, model, tokens


@pytest.mark.parametrize("name", ["full", "nvfp4"])
def test_forward_of_synced_weights_is_bitwise_equal(name):
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = model()
    qparams, metrics = sync_weights_jit(params, TINY, recipe, "reference")
    quantized = [x for x in jax.tree.leaves(qparams, is_leaf=lambda x: isinstance(x, nvfp4.NVFP4Tensor))
                 if isinstance(x, nvfp4.NVFP4Tensor)]
    assert quantized  # the sync did replace weights
    seqs = tokens(2)
    from_params = fwd(graphdef, params, seqs, recipe)
    from_synced = fwd(graphdef, qparams, seqs, recipe)
    for a, b in zip(jax.tree.leaves(from_params), jax.tree.leaves(from_synced)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    expected = np.mean(np.concatenate([np.asarray(t.map4).reshape(-1) for t in quantized]))
    np.testing.assert_array_equal(np.asarray(metrics["quant/map4_frac"]), np.float32(expected))


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
