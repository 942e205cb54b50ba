"""Element rounding and packing (docs/numerics.md §1) against the oracle (ml_dtypes + clamping)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import elements
from tests.formats import cases, oracle


def _e2m1_probe_values():
    vals = []
    for t in cases.E2M1_TIES + cases.E2M1_VALUES + (0.0, 6.5, 7.0, 8.0, 1e30, 3.4e38):
        vals += cases._neighbours(t, 3)
    rng = np.random.default_rng(3)
    vals += list(rng.uniform(-8, 8, 4000).astype(np.float32))
    vals += list((rng.standard_normal(2000) * 1e-3).astype(np.float32))  # tiny: -> codes 0 / 8
    v = np.array(vals, np.float32)
    v = v[v != 0]  # +-0.0 handled in their own test
    return np.concatenate([v, -v, np.float32([np.inf, -np.inf])])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_e2m1_encode_matches_oracle_on_ties_neighbours_and_random(jit):
    v = _e2m1_probe_values()
    f = jax.jit(elements.e2m1_encode) if jit else elements.e2m1_encode
    got = np.asarray(f(v))
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, oracle.e2m1_codes(v))


def test_e2m1_zero_codes():
    # +0 -> code 0. The sign of v decides the sign bit (§1), so -0.0 -> code 8 under the
    # contract's wording; TE's reference (x >= 0.0 -> 0) gives 0 for -0.0. Only +0.0 is pinned.
    assert int(elements.e2m1_encode(jnp.float32(0.0))) == 0


def test_e2m1_decode_table():
    codes = np.arange(16, dtype=np.uint8)
    got = np.asarray(elements.e2m1_decode(codes))
    want = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # code 8 is -0.0
    np.testing.assert_array_equal(np.asarray(elements.E2M1_GRID), oracle.E2M1_GRID)


def test_pack_even_element_in_low_nibble():
    packed = np.asarray(elements.pack_e2m1(np.array([[1, 2, 15, 0, 7, 8]], np.uint8)))
    np.testing.assert_array_equal(packed, [[0x21, 0x0F, 0x87]])
    np.testing.assert_array_equal(packed, oracle.pack(np.array([[1, 2, 15, 0, 7, 8]], np.uint8)))


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, (3, 5, 64)).astype(np.uint8)
    packed = np.asarray(jax.jit(elements.pack_e2m1)(codes))
    assert packed.shape == (3, 5, 32) and packed.dtype == np.uint8
    np.testing.assert_array_equal(packed, oracle.pack(codes))
    np.testing.assert_array_equal(np.asarray(jax.jit(elements.unpack_e2m1)(packed)), codes)
    every_byte = np.arange(256, dtype=np.uint8)[None]
    np.testing.assert_array_equal(np.asarray(elements.pack_e2m1(elements.unpack_e2m1(every_byte))), every_byte)


def test_pack_odd_length_raises():
    with pytest.raises(ValueError):
        elements.pack_e2m1(np.zeros((4, 3), np.uint8))


def _e4m3_probe_values():
    vals = []
    for m in np.concatenate([cases.e4m3_values(), cases.e4m3_midpoints(), np.float32([464, 480, 500, 1e9, 3e38])]):
        vals += cases._neighbours(m, 2)
    rng = np.random.default_rng(9)
    vals += list(np.exp2(rng.uniform(-14, 10, 4000)).astype(np.float32))
    v = np.array(vals, np.float32)
    v = v[np.abs(v) >= np.float32(2.0**-126)]  # no float32 subnormals: XLA on CPU flushes them
    return np.concatenate([v, -v, np.float32([0.0, np.inf, -np.inf])])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_e4m3_round_matches_oracle_saturating_with_subnormals(jit):
    v = _e4m3_probe_values()
    f = jax.jit(elements.e4m3_round) if jit else elements.e4m3_round
    got = f(v)
    assert got.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), oracle.e4m3(v).view(np.uint8))
    assert np.isnan(np.asarray(elements.e4m3_round(np.float32([np.nan]))).astype(np.float32)).all()
