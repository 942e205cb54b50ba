"""The element helpers of `pallas_kernels.nvfp4_quant.block_math` (shared by the kernel backends)
against ml_dtypes and the oracle, exhaustively where the domain is small. Run as jitted jnp on the CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from pallas_kernels.nvfp4_quant import block_math as bm
from tests.formats import oracle


def test_e4m3_round_matches_ml_dtypes():
    rng = np.random.default_rng(0)
    v = np.concatenate([
        rng.uniform(0, 448, 100_000), np.exp2(rng.uniform(-30, 9, 100_000)),
        np.arange(0, 1024) * 2.0**-13,  # every subnormal quantum and the ties between them
        np.arange(0, 4096) * 2.0**-3,   # ties of the normal range
        [0, 448, 2**-6, 2**-10, 3 * 2**-11, 1e-45],
    ]).astype(np.float32)
    v = np.minimum(v, np.float32(448))
    value, byte = jax.jit(lambda t: bm.e4m3_round(bm.PlainArith, t))(v)
    expected = v.astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(np.asarray(byte).astype(np.uint8), expected.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(value), expected.astype(np.float32))
    _, nan_byte = jax.jit(lambda t: bm.e4m3_round(bm.PlainArith, t))(np.float32(np.nan))
    assert int(nan_byte) == 0x7F


def test_e4m3_decode_all_bytes():
    got = np.asarray(jax.jit(bm.e4m3_decode)(jnp.arange(256, dtype=jnp.int32)))
    expected = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(got, expected)  # NaN positions compare equal


def test_e2m1_encode_decode():
    rng = np.random.default_rng(1)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    v = np.concatenate([rng.uniform(-8, 8, 100_000), ties, -ties, np.nextafter(ties, 0), np.nextafter(ties, 9),
                        [0.0, -0.0, -1e-30, 6.0, -6.0, 1e30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    codes = np.asarray(jax.jit(bm.e2m1_encode)(v))
    np.testing.assert_array_equal(codes.astype(np.uint8), oracle.e2m1_codes(v))
    dec = np.asarray(jax.jit(bm.e2m1_decode)(jnp.arange(16, dtype=jnp.int32)))
    np.testing.assert_array_equal(dec.view(np.uint32), oracle.E2M1_DECODE.view(np.uint32))  # -0 for code 8


def test_bf16_conversions_on_bits():
    rng = np.random.default_rng(2)
    bits = np.concatenate([rng.integers(0, 2**16, 50_000), [0x0001, 0x8001, 0x7F80, 0xFF80, 0x7FC0]]).astype(np.uint16)
    x = bits.view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(jax.jit(bm.bf16_to_f32)(x)), x.astype(np.float32))
    v = np.concatenate([rng.standard_normal(50_000) * np.exp2(rng.integers(-140, 120, 50_000)),
                        [3.4028235e38, 1e-45, -1e-40]]).astype(np.float32)
    got = np.asarray(jax.jit(bm.f32_to_bf16)(v))
    np.testing.assert_array_equal(got.view(np.uint16), v.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.isnan(np.asarray(jax.jit(bm.f32_to_bf16)(np.float32(np.nan)), np.float32))
