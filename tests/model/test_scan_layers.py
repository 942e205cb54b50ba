"""Scanned layer runs (`forward(scan_layers=True)`, the default) equal the unrolled model.

A run of identical layers is traced once and scanned over its stacked parameters; each
iteration folds its own layer index into the site keys, so even the quantized backward's
stochastic rounding matches the unrolled model. Compared bitwise on CPU: logits, router choices,
KV cache (prefill and one decode step) and gradients.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import ModelConfig, flat_params, forward, init
from fp4rl.model.transformer import init_cache, layer_runs
from fp4rl.recipe import PrecisionRecipe
from tests.model.common import KEY, TINY, tokens

# 3 layers: `nvfp4` (and `nvfp4-pt`) is one run of 3; `full` keeps the last layer in BF16 -> runs (0, 2), (2, 3).
THREE = dataclasses.replace(TINY, num_layers=3)


def test_layer_runs_follow_structure_and_precision():
    h200 = ModelConfig.from_name("h200")  # `full` keeps round(0.15 * 8) = 1 of 8 layers in BF16
    assert layer_runs(h200, PrecisionRecipe.from_name("full")) == [(0, 7), (7, 8)]
    assert layer_runs(h200, PrecisionRecipe.from_name("nvfp4")) == [(0, 8)]
    assert layer_runs(h200, PrecisionRecipe.from_name("bf16")) == [(0, 8)]
    dense_first = dataclasses.replace(h200, dense_layers=(0,))
    assert layer_runs(dense_first, PrecisionRecipe.from_name("full")) == [(0, 1), (1, 7), (7, 8)]


def _assert_trees_equal(a, b):
    for path, (x, y) in zip(flat_params(a).keys(), zip(jax.tree.leaves(a), jax.tree.leaves(b))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=path)


@pytest.mark.parametrize("name", ["nvfp4-pt", "full"])  # nvfp4-pt: per-layer keys of the quantized backward
def test_scanned_forward_and_grads_equal_unrolled(name):
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = init(THREE, 0)
    seqs = jnp.asarray(tokens(3, batch=2, length=17))

    def loss(p, scan):
        logits, aux = forward(graphdef, p, seqs[:, :-1], recipe, key=KEY, scan_layers=scan)
        nll = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), seqs[:, 1:, None], axis=-1))
        return nll + aux["aux_loss"], (logits, aux["router_topk"], aux["expert_load"])

    run = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)
    grads_scan, outs_scan = run(params, True)
    grads_unrolled, outs_unrolled = run(params, False)
    for a, b in zip(outs_scan, outs_unrolled):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _assert_trees_equal(grads_scan, grads_unrolled)


def test_cached_forward_runs_unrolled_whatever_scan_layers_says():
    recipe = PrecisionRecipe.from_name("nvfp4")
    graphdef, params = init(THREE, 0)
    prompt, nxt = jnp.asarray(tokens(4, batch=2, length=8)), jnp.asarray(tokens(5, batch=2, length=1))

    @jax.jit
    def prefill_then_decode(p):
        outs = []
        for scan in (True, False):
            logits, aux = forward(graphdef, p, prompt, recipe, key=KEY, cache=init_cache(THREE, 2, 12),
                                   scan_layers=scan)
            step_logits, step_aux = forward(graphdef, p, nxt, recipe, key=KEY, cache=aux["cache"], scan_layers=scan)
            outs.append((logits, step_logits, *step_aux["cache"].k, *step_aux["cache"].v))
        return outs

    scanned, unrolled = prefill_then_decode(params)
    for a, b in zip(scanned, unrolled):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_decode_step_reads_each_layer_cache_where_it_lies():
    """A decode step writes its slot into each layer's buffer and its attention reads that buffer:
    no op of the step slices (copies) a layer's whole cache out of a larger array."""
    recipe = PrecisionRecipe.from_name("bf16")
    graphdef, params = init(THREE, 0)
    cache = init_cache(THREE, 2, 12)
    assert len(cache.k) == len(cache.v) == THREE.num_layers
    layer_size = cache.k[0].size
    step = jax.make_jaxpr(lambda p, c: forward(graphdef, p, jnp.asarray(tokens(5, batch=2, length=1)), recipe,
                                               key=KEY, cache=c))(params, cache)

    def slices(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dynamic_slice", "slice", "gather") and eqn.outvars[0].aval.size == layer_size:
                yield eqn
            for param in eqn.params.values():
                if hasattr(param, "jaxpr"):
                    yield from slices(param.jaxpr)

    assert list(slices(step.jaxpr)) == []
