"""MXFP8 / MXFP4 (docs/numerics.md §5) against the oracle: element bytes and E8M0 scale bytes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import mx
from tests.formats import cases, oracle

FMTS = ["mxfp8", "mxfp4"]
FAMILIES = cases.mx_families()


@functools.lru_cache(maxsize=None)
def _jq(fmt):
    return jax.jit(lambda x: mx.quantize(x, fmt))


def _element_bytes(t):
    return np.asarray(t.elements).view(np.uint8)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("fmt", FMTS)
def test_mx_matches_oracle(fmt, family):
    x = FAMILIES[family]
    t = _jq(fmt)(x)
    r = oracle.quantize_mx(x, fmt)
    assert t.scales.dtype == jnp.uint8 and t.scales.shape == x.shape[:-1] + (x.shape[-1] // 32,)
    if fmt == "mxfp8":
        assert t.elements.dtype == jnp.float8_e4m3fn and t.elements.shape == x.shape
    else:
        assert t.elements.dtype == jnp.uint8 and t.elements.shape == x.shape[:-1] + (x.shape[-1] // 2,)
    np.testing.assert_array_equal(np.asarray(t.scales), r.scales_e8m0, err_msg="E8M0 scale bytes")
    np.testing.assert_array_equal(_element_bytes(t), r.elements, err_msg="element bytes")
    # dequantize: element * 2^(s-127), exact
    deq = np.asarray(jax.jit(mx.dequantize)(t))
    np.testing.assert_array_equal(deq, oracle.dequantize_mx(r.elements, r.scales_e8m0, fmt))


def test_mxfp4_clip_between_6_and_8():
    """amax in [4, 8) * 2^k has floor(log2) = k + 2, so the scaled max is in [4, 8): values
    in (6, 8) clip to code 7 (6.0)."""
    x = np.zeros((4, 32), np.float32)
    x[0, :3] = [7.9, -6.5, 6.0]
    x[1, :3] = [np.float32(7.9) * 2.0**10, 5.0 * 2.0**10, -1.0 * 2.0**10]
    x[2, 0] = 4.0
    t = _jq("mxfp4")(x)
    # amax 0 -> byte 0: the contract is silent for MXFP4; mx.py documents "same as MXFP8"
    np.testing.assert_array_equal(np.asarray(t.scales)[:, 0], [127, 137, 127, 0])
    codes = oracle.unpack(np.asarray(t.elements))
    np.testing.assert_array_equal(codes[0, :3], [7, 15, 7])
    np.testing.assert_array_equal(codes[1, :3], [7, 6, 10])  # 5 is a tie between 4 and 6 -> 4
    np.testing.assert_array_equal(codes[3], 0)


@pytest.mark.parametrize("fmt", FMTS)
def test_amax_zero_block(fmt):
    x = np.zeros((2, 64), np.float32)
    x[1, 40] = 3.0
    t = _jq(fmt)(x)
    s = np.asarray(t.scales)
    if fmt == "mxfp8":
        assert s[0, 0] == 0 and s[0, 1] == 0 and s[1, 0] == 0  # §5: amax 0 gives byte 0
    else:
        assert s[0, 0] != 0xFF  # contract silent on the byte; it must not read as NaN
    np.testing.assert_array_equal(np.asarray(jax.jit(mx.dequantize)(t))[0], 0.0)
    assert np.asarray(jax.jit(mx.dequantize)(t))[1, 40] == 3.0


@pytest.mark.parametrize("fmt", FMTS)
def test_mxfp8_rceil_powers_of_two_by_hand(fmt):
    # MXFP8 amax 448 * 2^k: t = fl(amax * fl(1/448)) = 2^k exactly -> byte 127 + k; one ulp
    # above -> 2^(k+1). MXFP4 amax 2^k -> byte 127 + k - 2.
    ks = [-20, -3, 0, 5, 30]
    x = np.zeros((2 * len(ks), 32), np.float32)
    for i, k in enumerate(ks):
        base = np.float32(448.0 if fmt == "mxfp8" else 1.0) * np.float32(2.0**k)
        x[2 * i, 0] = base
        x[2 * i + 1, 0] = np.nextafter(base, np.float32(np.inf))
    s = np.asarray(_jq(fmt)(x).scales)[:, 0].astype(int)
    if fmt == "mxfp8":
        want = [v for k in ks for v in (127 + k, 128 + k)]
    else:
        want = [v for k in ks for v in (125 + k, 125 + k)]
    np.testing.assert_array_equal(s, want)




@pytest.mark.parametrize(
    "bad",
    [np.nan, np.inf, -np.inf],
    ids=["nan", "inf", "-inf"],
)
@pytest.mark.parametrize("fmt", FMTS)
def test_mx_nonfinite_block_dequantizes_to_nan(fmt, bad):
    """§8: a block holding NaN or Inf gets the NaN scale byte 0xFF and dequantizes to NaN;
    the other blocks are those of the finite input."""
    x = FAMILIES["normal"].copy()  # [64, 128]
    x[5, 17] = bad
    x[2, 70] = bad
    x[40, 0] = bad
    x[63, 127] = bad
    t = _jq(fmt)(x)
    deq = np.asarray(jax.jit(mx.dequantize)(t))
    bad_blk = (~np.isfinite(x)).reshape(64, 4, 32).any(-1)
    np.testing.assert_array_equal(np.asarray(t.scales)[bad_blk], 0xFF)
    bad_el = np.repeat(bad_blk, 32, axis=-1)
    assert np.isnan(deq[bad_el]).all()
    assert np.isfinite(deq[~bad_el]).all()
    r = oracle.quantize_mx(np.where(np.isfinite(x), x, 0).astype(np.float32), fmt)
    np.testing.assert_array_equal(np.asarray(t.scales)[~bad_blk], r.scales_e8m0[~bad_blk])


def test_mx_bad_input():
    with pytest.raises(ValueError, match=r"\(4, 48\).*32|32.*\(4, 48\)"):
        mx.quantize(np.ones((4, 48), np.float32), "mxfp8")
    with pytest.raises(ValueError, match="valid options"):
        mx.quantize(np.ones((4, 32), np.float32), "mxfp6")
    with pytest.raises(TypeError):
        mx.quantize(np.ones((4, 32), np.int32), "mxfp4")
    with pytest.raises(TypeError):
        mx.quantize(np.ones((4, 32), np.complex64), "mxfp8")


@pytest.mark.parametrize("fmt", FMTS)
def test_mx_vmap_and_batch_dims(fmt):
    x = FAMILIES["student_t2"].reshape(4, 16, 128)
    lead = _jq(fmt)(x)
    flat = _jq(fmt)(x.reshape(64, 128))
    vm = jax.jit(jax.vmap(lambda u: mx.quantize(u, fmt)))(x)
    for t in (lead, vm):
        np.testing.assert_array_equal(_element_bytes(t).reshape(64, -1), _element_bytes(flat))
        np.testing.assert_array_equal(np.asarray(t.scales).reshape(64, -1), np.asarray(flat.scales))
