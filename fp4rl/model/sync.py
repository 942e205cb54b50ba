"""Weight sync: quantize the trainer's master weights once, in the exact bytes the forward uses.

At each weight sync the trainer's master weights are quantized once under the recipe, and the
sampler uses those exact bytes (docs/rl.md "Sampler and trainer"). `sync_weights` replaces every
quantized site's weight by `qlinear.quantize_weight(w, site, impl)`, the same call `qdot` makes
inside the trainer's forward, so `forward(qparams)` is bitwise `forward(params)` and the
trainer/sampler mismatch measures the runtime difference only (KV cache, batch shape), never a
different weight. An amplified site (the dose-response arms `nvfp4@A`, `+dq@A`) gets w_a in bf16
(a `ScaledWeight`, `qlinear.quantize_weight`), which its forward consumes in the trainer too: the
sampler's forward stays the trainer's, and the backward is the only mismatch.
BF16 sites, norms, biases and the embedding keep their raw values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fp4rl import qlinear
from fp4rl.formats import nvfp4
from fp4rl.model.config import ModelConfig
from fp4rl.model.transformer import Transformer, resolve_recipe

F32 = jnp.float32


def _abstract_model(config: ModelConfig) -> Transformer:
    return nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(params=0)))


def sync_weights(params, config: ModelConfig, recipe, impl: str = "auto"):
    """(qparams, metrics): quantized-site weights pre-quantized; metrics["quant/map4_frac"] is the
    fraction of NVFP4 weight blocks (1x16 block rows of the stored `map4`) that chose map-4
    under 4/6: 0.0 without 4/6 or without packed NVFP4 weights (amplified sites have none).
    Jittable with config, recipe, impl static.

    A tied LM head is not pre-quantized (the embedding gather needs the raw rows); its qdot
    quantizes embed^T itself, with identical bytes.
    """
    recipe = resolve_recipe(recipe)
    model = _abstract_model(config)
    nnx.update(model, params)
    map4_blocks, total_blocks = jnp.zeros((), F32), 0
    for _, module in nnx.iter_graph(model):
        if not hasattr(module, "site_kinds"):
            continue
        layer = None if isinstance(module, Transformer) else module.layer
        for attr, kind in module.site_kinds().items():
            site = recipe.site(kind, layer, config.num_layers)
            if not site.quantized:
                continue
            variable = getattr(module, attr)
            wq = qlinear.quantize_weight(variable.get_value(), site, impl)
            variable.set_value(wq)
            if isinstance(wq, nvfp4.NVFP4Tensor):
                map4_blocks = map4_blocks + jnp.sum(wq.map4, dtype=F32)
                total_blocks += wq.map4.size
    qparams = nnx.state(model, nnx.Param)
    map4_frac = map4_blocks / total_blocks if total_blocks else jnp.zeros((), F32)
    return qparams, {"quant/map4_frac": map4_frac}


sync_weights_jit = jax.jit(sync_weights, static_argnums=(1, 2, 3))
