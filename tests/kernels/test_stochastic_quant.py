"""Stochastic rounding in the Triton quantize kernel (docs/numerics.md §6), against the reference.

The kernel takes the draws `uniform` = `jax.random.uniform(key, x.shape)` (the bits the reference
draws for `nvfp4.quantize(x, config, sr_key=key)`) and must return the reference's bytes: codes,
scale bytes, amax, map4. Interpret mode on the CPU; the same checks compiled on a GPU (`-m gpu`).
`fp4rl.operands` routes the quantized backward's gradients through it: the pretraining recipe's
dgrad and wgrad then equal the reference path's bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from fp4rl import qlinear
from fp4rl.formats import nvfp4
from fp4rl.recipe import SiteConfig
from pallas_kernels.nvfp4_quant import triton as tq
from tests.kernels.quant_suite import assert_tensor_equal

# rows_1d=4 and block_k=32 leave a masked row tail and a masked chunk tail at these sizes; the
# default launch shape runs a row of 2048 in several chunks.
SMALL = tq.TritonQuantTunables(rows_1d=4, block_k=32, block_k_2d=32, rows_2d=32)
CASES = [  # (id, shape, config, tunables)
    ("1d-tensor-tails", (19, 48), nvfp4.NVFP4Config(scale="tensor"), SMALL),
    ("1d-token-tails", (19, 48), nvfp4.NVFP4Config(scale="token"), SMALL),
    ("1d-tensor-chunks", (33, 2048), nvfp4.NVFP4Config(scale="tensor"), None),
    ("2d-tensor", (32, 64), nvfp4.NVFP4Config(scale="tensor", block_2d=True), SMALL),
]


def _inputs(shape, dtype, seed=0):
    """Heavy-tailed values: blocks far apart in scale."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.lognormal(0, 2, shape)).astype(np.float32)
    return jnp.asarray(x, dtype)


def _with_special_blocks(x):
    """A +NaN block and an Inf block (per-token scales: the other rows stay finite). The GPU's NaN
    results are the canonical +NaN: positive NaNs keep every platform's codes equal."""
    x = np.array(x)
    x[1, 3] = np.nan
    x[2, 17] = np.inf
    return jnp.asarray(x)


def _check(shape, config, tunables, dtype, interpret, special=False, seed=0):
    x = _inputs(shape, dtype, seed)
    if special:
        x = _with_special_blocks(x)
    key = jax.random.key(100 + seed)
    expected = jax.jit(functools.partial(nvfp4.quantize, config=config))(x, sr_key=key)
    uniform = jax.random.uniform(key, shape, jnp.float32)
    got = pallas_kernels.quantize(x, config, backend="triton", interpret=interpret, uniform=uniform,
                                  **({} if tunables is None else {"tunables": tunables}))
    assert_tensor_equal(got, expected, f"SR {shape} {config}")
    rounded = nvfp4.quantize(x, config)
    assert (np.asarray(got.codes) != np.asarray(rounded.codes)).any(), "the draws changed no code: not stochastic"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_kernel_equals_the_reference_bytes(case, dtype):
    _, shape, config, tunables = case
    _check(shape, config, tunables, dtype, interpret=True)


def test_nan_and_inf_blocks_equal_the_reference():
    _check((19, 48), nvfp4.NVFP4Config(scale="token"), SMALL, jnp.float32, interpret=True, special=True)


@pytest.mark.gpu  # tests/kernels/conftest.py skips it where there is no GPU
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_compiled_kernel_equals_the_reference_bytes(case):
    _, shape, config, tunables = case
    for seed in range(3):
        _check(shape, config, tunables, jnp.bfloat16, interpret=False, seed=seed)
    if config.scale == "token":
        _check(shape, config, tunables, jnp.float32, interpret=False, special=True)


def test_bad_draws_and_backends_are_refused():
    x = jnp.zeros((16, 32), jnp.float32)
    u = jnp.zeros((16, 32), jnp.float32)
    with pytest.raises(ValueError, match="four_over_six"):
        pallas_kernels.quantize(x, nvfp4.NVFP4Config(four_over_six="mse"), backend="triton", interpret=True, uniform=u)
    with pytest.raises(ValueError, match="float32 draws of x's shape"):
        pallas_kernels.quantize(x, nvfp4.NVFP4Config(), backend="triton", interpret=True, uniform=u[:, :16])
    with pytest.raises(pallas_kernels.BackendUnavailableError, match="backends with it: \\('triton',\\)"):
        pallas_kernels.quantize(x, nvfp4.NVFP4Config(), backend="mosaic", interpret=True, uniform=u)


def test_quantized_backward_on_the_kernel_equals_the_reference_path(monkeypatch):
    """qdot's pretraining-recipe backward with impl="triton" (the kernels run in interpret mode here)
    gives the dgrad and wgrad bytes of impl="reference": the SR gradients quantized in the kernel
    from the draws of each site's keys."""
    calls = []
    quantize, quantize_experts = pallas_kernels.quantize, pallas_kernels.quantize_experts

    def interpreted(x, config, **kw):
        calls.append(kw.get("uniform") is not None)
        return quantize(x, config, **{**kw, "interpret": True})

    monkeypatch.setattr(pallas_kernels, "quantize", interpreted)
    monkeypatch.setattr(pallas_kernels, "quantize_experts", lambda *a, **kw: quantize_experts(*a, **{**kw, "interpret": True}))
    site = SiteConfig(format="nvfp4", backward="quantized")
    kx, kw, kg = jax.random.split(jax.random.key(3), 3)
    x, g = jax.random.normal(kx, (48, 64)), jax.random.normal(kg, (48, 32))
    w = jax.random.normal(kw, (64, 32)) * 0.1
    key = jax.random.key(7)

    def grads(impl):
        _, pull = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, key=key, impl=impl), x, w)
        return pull(g)

    (dx_ref, dw_ref), (dx, dw) = grads("reference"), grads("triton")
    assert calls.count(True) == 2, f"the two SR quantizations (dgrad's g, wgrad's g^T) on the kernel: {calls}"
    np.testing.assert_array_equal(np.asarray(dx).view(np.uint32), np.asarray(dx_ref).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(dw).view(np.uint32), np.asarray(dw_ref).view(np.uint32))
