"""The planar layout's E2M1 encoder and packing against the compare-based encoder.

`triton_planar.e2m1_magnitude` replaces `block_math.e2m1_encode`'s seven compares with one rounding add
(`fl(a + C)`); here both run on every rounding boundary of the E2M1 grid (each threshold, its
two f32 neighbours, the ties), the clamp region, zeros, subnormals, infinities and random
magnitudes, and must give the same code, nibble for nibble, and the exact |dec(q)| * sf.
The whole kernel is covered byte for byte by the shared suite (`test_triton.py`).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant import triton_planar as planar

THRESHOLDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def boundary_values() -> np.ndarray:
    points = np.array(THRESHOLDS + GRID + [6.5, 7.0, 8.0, 1e6, 3.4e38], np.float32)
    near = np.concatenate([points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(0))])
    rng = np.random.default_rng(0)
    random = np.concatenate([rng.uniform(0, 7, 20000), np.exp2(rng.uniform(-40, 10, 5000))]).astype(np.float32)
    tiny = np.array([1e-45, 1e-40, 1.2e-38, np.inf], np.float32)
    magnitudes = np.concatenate([near, random, tiny]).astype(np.float32)
    return np.concatenate([magnitudes, -magnitudes, np.array([0.0, -0.0], np.float32)])


def test_magnitude_matches_compare_encoder():
    v = jnp.asarray(boundary_values())
    mag, dec = planar.e2m1_magnitude(bm.PlainArith, v, with_value=True)
    expected = np.asarray(bm.e2m1_encode(v)) & 7
    np.testing.assert_array_equal(np.asarray(mag) & 7, expected)
    np.testing.assert_array_equal(np.asarray(dec), np.asarray(GRID, np.float32)[expected])


@pytest.mark.parametrize("sf", [2.0**-9, 0.375, 1.0, 448.0])
def test_fast_error_fma_is_the_two_roundings(sf):
    """fl(y - dec*sf) as one FMA equals -fl(fl(dec*sf) - y), the contract's fast error, since
    dec*sf is exact (what `candidate_error` relies on)."""
    v = jnp.asarray(boundary_values())
    _, dec = planar.e2m1_magnitude(bm.PlainArith, v, with_value=True)
    y = jnp.asarray(np.random.default_rng(2).uniform(0, 7 * sf, v.shape).astype(np.float32))
    fused = bm.PlainArith.fma(dec, bm.f32(-sf), y)
    two_roundings = bm.PlainArith.sub(bm.PlainArith.mul(dec, bm.f32(sf)), y)
    np.testing.assert_array_equal(np.asarray(fused), -np.asarray(two_roundings))


def test_packed_words_match_code_bytes():
    """magnitudes | signs, packed two words per block, are the tiled kernel's code bytes."""
    rng = np.random.default_rng(1)
    v = jnp.asarray((rng.standard_normal((3, 5, 16)) * 3).astype(np.float32))
    planes = [v[..., i] for i in range(16)]
    mags = [planar.e2m1_magnitude(bm.PlainArith, p)[0] for p in planes]
    inv = jnp.ones((3, 5), jnp.float32)
    words = planar.combine_words(planar.pack_magnitudes(mags), planar.pack_signs(planes), inv)
    got = np.stack([np.asarray(w) for w in words], axis=-1).view(np.uint8).reshape(3, 5 * 8)
    expected = np.asarray(bm.pack_codes(bm.e2m1_encode(v).reshape(3, 80)))
    np.testing.assert_array_equal(got, expected)


def test_nan_blocks_keep_only_signs():
    words = [jnp.asarray(np.array([0xFFFFFFFF, 0x12345678], np.uint32))] * 2
    signs = [jnp.asarray(np.array([0x80000008, 0x0], np.uint32))] * 2
    inv = jnp.asarray(np.array([np.nan, 1.0], np.float32))
    out = planar.combine_words(words, signs, inv)
    np.testing.assert_array_equal(np.asarray(out[0]), np.array([0x80000008, 0x12345678 & 0x77777777], np.uint32))
