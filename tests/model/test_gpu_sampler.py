"""On a GPU the decode loop's structure does not change a single output byte: the trainer's
vmapped rollout program (h200 model, its RL shapes) with one token per loop iteration and a
per-seed stop test equals the default (`SamplerConfig.decode_chunk` tokens per iteration, the stop
test shared over the seed axis) in tokens, log-probs, lengths and routing
(`pytest -m gpu tests/model/test_gpu_sampler.py`; CPU tests: tests/model/test_sampler.py).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import init, sync
from fp4rl.model.config import PRESETS
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import evaluation
from tests.kernels.quant_suite import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU")]

SEEDS, ROWS, PROMPT, NEW = 2, 256, 40, 72  # the h200 RL preset: 32 prompts x 8 samples per seed


@pytest.mark.parametrize("name", ["bf16", "full"])
def test_decode_chunk_and_shared_stop_test_keep_every_byte(name):
    config = PRESETS["h200"]
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = init(config, 0)
    qparams = jax.vmap(lambda p: sync.sync_weights(p, config, recipe, "auto")[0])(
        jax.tree.map(lambda a, b: jnp.stack([a, b]), params, init(config, 1)[1]))
    rng = np.random.default_rng(0)
    ids = rng.integers(3, config.vocab_size, (SEEDS, ROWS, PROMPT)).astype(np.int32)
    mask = np.ones_like(ids, bool)
    keys = jax.random.split(jax.random.key(0), SEEDS)
    outs = {}
    for chunk, axis in ((1, None), (evaluation.sampler_config(NEW).decode_chunk, "seed")):
        sampler = dataclasses.replace(evaluation.sampler_config(NEW), decode_chunk=chunk)
        sample = evaluation.sample_fn(graphdef, recipe, sampler, "auto", seed_axis=axis)
        program = jax.jit(jax.vmap(sample, in_axes=(0, 0, 0, 0, None), axis_name="seed"))
        outs[chunk] = jax.device_get(program(qparams, ids, mask, keys, jnp.float32(1)))
    one, default = outs.values()
    lengths = np.asarray(one.lengths)
    print(f"[{name}] lengths: min {lengths.min()}, mean {lengths.mean():.1f}, max {lengths.max()}")
    for field in one._fields:
        np.testing.assert_array_equal(np.asarray(getattr(default, field)), np.asarray(getattr(one, field)),
                                      err_msg=field)
