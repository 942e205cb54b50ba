"""Stochastic rounding onto the E2M1 grid (docs/numerics.md §6)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fp4rl.formats import nvfp4, stochastic
from tests.formats import cases, oracle
from tests.kernels.quant_suite import gpu_present

GRID = np.concatenate([oracle.E2M1_GRID, -oracle.E2M1_GRID[1:]]).astype(np.float32)


def _sr(v, key):
    return np.asarray(jax.jit(stochastic.stochastic_round_e2m1)(v, key))


def test_grid_values_are_unchanged_exactly():
    v = np.tile(GRID, 64)
    for seed in range(8):
        np.testing.assert_array_equal(_sr(v, jax.random.key(seed)).view(np.uint32), v.view(np.uint32))


def _interval(v):
    a = np.abs(v)
    g = oracle.E2M1_GRID
    i = np.clip(np.searchsorted(g, a, side="right") - 1, 0, 6)
    return g[i], g[i + 1]


def test_unbiased_and_only_the_two_neighbours():
    """Each value v (|v| <= 6) is drawn N = 512 keys x 64 copies = 32768 times. A draw is hi
    with probability p = (|v| - lo)/(hi - lo), else lo, so the sample mean has standard
    deviation sigma = (hi - lo) * sqrt(p (1 - p) / N). Over 300 values a 6-sigma bound fails
    by chance with probability < 300 * 2e-9."""
    rng = np.random.default_rng(11)
    vals = np.concatenate(
        [
            rng.uniform(-6, 6, 256),
            np.array(cases.E2M1_TIES) * np.array([1, -1, 1, -1, 1, -1, 1]),
            [0.01, -0.01, 5.99, -5.99, 0.26, 4.5, -3.2],
        ]
    ).astype(np.float32)
    copies, n_keys = 64, 512
    v = np.repeat(vals, copies)
    keys = jax.random.split(jax.random.key(2024), n_keys)
    draws = np.asarray(jax.jit(jax.vmap(stochastic.stochastic_round_e2m1, in_axes=(None, 0)))(v, keys))
    draws = draws.reshape(n_keys, len(vals), copies).transpose(1, 0, 2).reshape(len(vals), -1)
    lo, hi = _interval(vals)
    sign = np.where(np.signbit(vals), -1.0, 1.0).astype(np.float32)
    ok = (draws == (sign * lo)[:, None]) | (draws == (sign * hi)[:, None])
    assert ok.all(), "every draw is one of the two grid neighbours, with the sign of v"
    n = draws.shape[1]
    p = (np.abs(vals).astype(np.float64) - lo) / (hi - lo)
    sigma = (hi - lo) * np.sqrt(p * (1 - p) / n)
    err = np.abs(draws.astype(np.float64).mean(axis=1) - vals)
    assert (err <= 6 * sigma + 1e-7).all(), (vals[err > 6 * sigma + 1e-7], err.max())


def _normal_and_special_values():
    """Every 1009th float32 in [0, 6.5] by bit pattern from the smallest normal up (every exponent), each
    grid point with its two float neighbours, +-Inf, NaN, zeros, both signs (f32 subnormals aside:
    XLA:CPU flushes them)."""
    bits = np.arange(np.float32(2.0**-126).view(np.int32), np.float32(6.5).view(np.int32), 1009, dtype=np.int32)
    grid = oracle.E2M1_GRID[1:]
    edges = np.concatenate([grid, np.nextafter(grid, np.float32(0)), np.nextafter(grid, np.float32(7))])
    v = np.concatenate([bits.view(np.float32), edges, np.float32([0.0, np.inf, np.nan])]).astype(np.float32)
    return np.concatenate([v, -v])


def test_round_up_probability_is_the_exact_quotient():
    """(|v| - lo) / (hi - lo) as a product with 1 / (hi - lo), a power of two: bit for bit the
    float64 quotient (exact in float32) on every sampled value of every interval."""
    a = np.abs(_normal_and_special_values())
    a = a[np.isfinite(a) & (a <= 6)]
    index = jax.jit(stochastic.interval_index)(a)
    p = np.asarray(jax.jit(stochastic.round_up_probability)(a, index))
    exact_index, exact = oracle.round_up_probability(a)
    np.testing.assert_array_equal(np.asarray(index), exact_index)
    assert (exact.astype(np.float32).astype(np.float64) == exact).all()  # representable: the claim's premise
    np.testing.assert_array_equal(p.view(np.uint32), exact.astype(np.float32).view(np.uint32))


def test_codes_equal_the_oracle_given_the_same_draws():
    """The codes of `stochastic_encode_e2m1(v, key)` are the NumPy oracle's for the draws
    `jax.random.uniform(key, v.shape)` (the bits the reference and the kernels consume)."""
    v = _normal_and_special_values()
    for seed in range(2):
        key = jax.random.key(seed)
        codes = np.asarray(jax.jit(stochastic.stochastic_encode_e2m1)(v, key))
        u = np.asarray(jax.random.uniform(key, v.shape, np.float32))
        np.testing.assert_array_equal(codes, oracle.stochastic_e2m1_codes(v, u))


@pytest.mark.parametrize("kw", [dict(scale="tensor"), dict(scale="token"), dict(scale="tensor", block_2d=True)],
                         ids=["tensor", "token", "2d"])
def test_nvfp4_sr_equals_the_oracle_given_the_same_draws(kw):
    """`nvfp4.quantize(x, config, sr_key=key)`: every byte the NumPy oracle's for the draws
    `jax.random.uniform(key, x.shape)` (whatever the blocked view the reference draws them in)."""
    x = (np.random.default_rng(5).standard_normal((32, 64)) * np.random.default_rng(6).lognormal(0, 2, (32, 64)))
    x = x.astype(np.float32)
    key = jax.random.key(9)
    t = jax.jit(lambda v: nvfp4.quantize(v, nvfp4.NVFP4Config(**kw), sr_key=key))(x)
    ref = oracle.quantize_nvfp4(x, **kw, uniform=np.asarray(jax.random.uniform(key, x.shape, np.float32)))
    np.testing.assert_array_equal(np.asarray(t.codes), ref.codes)
    np.testing.assert_array_equal(np.asarray(t.scales).view(np.uint8), ref.scales)


def test_keys_make_it_reproducible_and_different():
    v = np.random.default_rng(1).uniform(-6, 6, 4096).astype(np.float32)
    a = _sr(v, jax.random.key(1))
    np.testing.assert_array_equal(a, _sr(v, jax.random.key(1)))
    assert (a != _sr(v, jax.random.key(2))).mean() > 0.1


def test_saturates_above_6():
    np.testing.assert_array_equal(_sr(np.float32([6.5, -100.0]), jax.random.key(0)), [6.0, -6.0])


def test_nan_stays_nan():
    out = _sr(np.float32([np.nan, 1.3]), jax.random.key(0))
    assert np.isnan(out[0])


def test_nvfp4_sr_keeps_scales_and_rounds_to_a_neighbour():
    """quantize(..., sr_key=k): scale selection unchanged (§6 only changes element rounding);
    each code is the nearest-even code or its grid neighbour toward x."""
    x = cases.student_t()[0]
    c = nvfp4.NVFP4Config(scale="token")
    rne = jax.jit(lambda u: nvfp4.quantize(u, c))(x)
    sr = jax.jit(lambda u, k: nvfp4.quantize(u, c, sr_key=k))(x, jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(sr.scales).view(np.uint8), np.asarray(rne.scales).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(sr.amax), np.asarray(rne.amax))
    c_sr = oracle.unpack(np.asarray(sr.codes))
    c_rne = oracle.unpack(np.asarray(rne.codes))
    assert (c_sr != c_rne).any()
    mag_sr, mag_rne = c_sr & 7, c_rne & 7
    assert (np.abs(mag_sr.astype(int) - mag_rne) <= 1).all(), "SR picks a grid neighbour"
    nonzero = (mag_sr > 0) & (mag_rne > 0)
    np.testing.assert_array_equal((c_sr >> 3)[nonzero], (c_rne >> 3)[nonzero])  # same sign
    with pytest.raises(ValueError):
        nvfp4.quantize(x, nvfp4.NVFP4Config(four_over_six="mae"), sr_key=jax.random.key(0))


@pytest.fixture
def threefry_lowering():
    """Restores JAX's threefry lowering flag after a test sets it."""
    before = jax.config.jax_threefry_gpu_kernel_lowering
    yield
    jax.config.update("jax_threefry_gpu_kernel_lowering", before)


def _cuda_lowering(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_draws_lower_to_the_threefry_kernel_on_gpu(threefry_lowering, monkeypatch):
    """The entry points' setting: each draw becomes one call of JAX's threefry CUDA kernel instead
    of XLA's unrolled rounds (the compile-time cost of a quantized backward); a value the user set
    in the environment wins."""
    v, key = np.ones((64, 64), np.float32), jax.random.key(0)
    jax.config.update("jax_threefry_gpu_kernel_lowering", False)
    monkeypatch.setenv(stochastic.GPU_KERNEL_ENV, "0")
    stochastic.lower_draws_as_gpu_kernel()
    unrolled = _cuda_lowering(stochastic.stochastic_encode_e2m1, v, key)
    assert "threefry2x32_ffi" not in unrolled and unrolled.count("shift_left") >= 20  # 20 rounds
    monkeypatch.delenv(stochastic.GPU_KERNEL_ENV)
    stochastic.lower_draws_as_gpu_kernel()
    kernel = _cuda_lowering(stochastic.stochastic_encode_e2m1, v, key)
    assert "threefry2x32_ffi" in kernel and kernel.count("shift_left") < 20


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU")
def test_threefry_kernel_draws_the_same_bits_compiled(threefry_lowering):
    """Compiled on the GPU, SR codes of a gradient-sized array (one key, and keys vmapped as the
    trainer's seeds are) are the same bytes whichever way the draws are lowered."""
    v = np.random.default_rng(5).standard_normal((3, 1000, 384)).astype(np.float32) * 3
    keys = jax.random.split(jax.random.key(9), 3)
    one = lambda u, k: stochastic.stochastic_encode_e2m1(u, k)  # noqa: E731
    seeds = jax.vmap(one)
    out = {}
    for flag in (False, True):
        jax.config.update("jax_threefry_gpu_kernel_lowering", flag)
        out[flag] = (np.asarray(jax.jit(one)(v[0], keys[0])), np.asarray(jax.jit(seeds)(v, keys)))
    for unrolled, kernel in zip(out[False], out[True]):
        np.testing.assert_array_equal(kernel.view(np.uint8), unrolled.view(np.uint8))
