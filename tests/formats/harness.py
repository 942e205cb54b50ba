"""Shared helpers: compiled quantizers with one compile per (impl, config), batching, chunking."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.formats import nvfp4
from tests.formats import cases, oracle

VALID = cases.valid_config_kwargs()

BATCH_SHAPE = (cases.CASES_PER_FAMILY, cases.ROWS, cases.COLS)


@functools.lru_cache(maxsize=None)
def _jit_batched(impl, config):
    return jax.jit(jax.vmap(lambda x: impl(x, config)))


@functools.lru_cache(maxsize=None)
def _precompiled(impl):
    """Ahead-of-time compiles of jit(vmap(quantize)) for every valid config on float32
    [8, 32, 64], two at a time: XLA compiles outside the GIL, and these ~45 compiles are
    most of the suite's compile time on a 2-core CPU."""
    spec = jax.ShapeDtypeStruct(BATCH_SHAPE, jnp.float32)

    def build(kw):
        config = nvfp4.NVFP4Config(**kw)
        return config, _jit_batched(impl, config).lower(spec).compile()

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(build, VALID))


def batched(impl, config):
    """jit(vmap(quantize)): one compile per (impl, config) serves every [C, 32, 64] family;
    under vmap each case has its own per-tensor amax."""
    compiled = _precompiled(impl).get(config)
    jitted = _jit_batched(impl, config)

    def run(x):
        if compiled is not None and np.shape(x) == BATCH_SHAPE and np.asarray(x).dtype == np.float32:
            return compiled(np.asarray(x))
        return jitted(x)

    return run


@functools.lru_cache(maxsize=None)
def single(impl, config):
    return jax.jit(lambda x: impl(x, config))


def unbatch(t, i):
    return jax.tree_util.tree_map(lambda a: a[i], t)


def oracle_for(x, kw, batch_dims=0):
    return oracle.quantize_nvfp4(np.asarray(x, np.float32), batch_dims=batch_dims, **kw)


def chunks(x):
    """[C, 32, 64] -> pieces of [CASES_PER_FAMILY, 32, 64], so one compile serves them all."""
    n = cases.CASES_PER_FAMILY
    assert x.shape[0] % n == 0
    return [x[i : i + n] for i in range(0, x.shape[0], n)]
