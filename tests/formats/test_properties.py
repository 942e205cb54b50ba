"""Properties of NVFP4 quantization, checked with hypothesis on each implementation.

Inputs are [32, 64] matrices drawn from a few generators (normal, heavy-tailed, uniform, values
on the E2M1 grid and its ties, LLM-like outliers; random scale 2^-24..2^24, zero blocks, an
optional amax of 6E * 2^j that makes S_enc a power of two). Each example runs through the
precompiled jit(vmap(quantize)) of tests/formats/harness.py (padded to a batch of 8), so no
example triggers a compile.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fp4rl.formats import nvfp4
from tests.formats import cases, oracle
from tests.formats.conftest import tensor_bytes
from tests.formats.harness import VALID, batched, single, unbatch

PROPERTY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # the same examples on every run (CI), still shrinking on failure
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
U32 = 2.0**-24  # float32 unit roundoff

KINDS = ("normal", "t2", "uniform", "grid", "llm")


@st.composite
def matrices(draw, e: int | None = None):
    """A float32 [32, 64] input; with `e`, optionally pin the amax to 6E * 2^j."""
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(KINDS))
    log2_scale = draw(st.integers(-24, 24))
    zero_frac = draw(st.sampled_from([0.0, 0.0, 0.3]))
    r = np.random.default_rng(seed)
    shape = (cases.ROWS, cases.COLS)
    if kind == "normal":
        x = r.standard_normal(shape)
    elif kind == "t2":
        x = r.standard_t(2, shape)
    elif kind == "uniform":
        x = r.uniform(-1, 1, shape)
    elif kind == "grid":
        vals = np.array(cases.E2M1_VALUES + cases.E2M1_TIES + (0.0,))
        x = r.choice(vals, shape) * np.exp2(r.integers(-3, 4, shape)) * r.choice([-1, 1], shape)
    else:
        x = cases.llm_activations(shape, seed_name=f"h{seed}")
    x = (x * 2.0**log2_scale).astype(np.float32)
    blocks = x.reshape(cases.ROWS, cases.COLS // 16, 16)
    blocks[r.random(blocks.shape[:2]) < zero_frac] = 0
    if e is not None and draw(st.booleans()):
        amax = np.float32(6 * e * 2.0 ** round(np.log2(max(np.abs(x).max(), 1e-30) / (6 * e))))
        x = np.clip(x, -amax, amax)
        x[r.integers(32), r.integers(64)] = amax * r.choice([-1, 1])
    return x


def _run(impl, kw, x):
    """Quantize one [32, 64] through the precompiled batch of 8 (x in slot 0, zeros elsewhere)."""
    xb = np.zeros((cases.CASES_PER_FAMILY, cases.ROWS, cases.COLS), np.float32)
    xb[0] = x
    return unbatch(batched(impl, nvfp4.NVFP4Config(**kw))(xb), 0)


def _dequant(b, e):
    return oracle.dequantize_nvfp4(b["codes"], b["scales"], b["amax"].view(np.float32), e)


def _per_block(a, block_2d):
    """Sum |.| over each 1x16 block ([32, 4]) or 16x16 tile ([2, 4])."""
    if block_2d:
        return a.reshape(2, 16, 4, 16).sum(axis=(1, 3))
    return a.reshape(32, 4, 16).sum(axis=-1)


FOUR_SIX = [kw for kw in VALID if kw["four_over_six"] is not None]


@PROPERTY_SETTINGS
@given(data=st.data())
def test_four_over_six_is_never_worse_than_map6(impl, data):
    """Per block (tile in 2D), the error of what 4/6 chose, in the metric it optimizes, is at
    most that of the map-6 candidate (the oracle's), up to float32 rounding of the error
    computation: d carries <= 3 roundings (4 with the f32 dequantization measured here), the
    sum of 16 (256 for a tile: 15 sequential + 4 tree levels) adds <= 19 more, so
    |err_f32 - err| <= 32 u sum(|x| + |x_hat|) for MAE and <= 64 u sum((|x| + |x_hat|)^2) for
    MSE, per candidate; the bound below is their sum."""
    kw = data.draw(st.sampled_from(FOUR_SIX), label="config")
    e = nvfp4.NVFP4Config(**kw).e4m3_bound
    x = data.draw(matrices(e), label="x")
    b = tensor_bytes(_run(impl, kw, x))
    x_hat = _dequant(b, e).astype(np.float64)
    r = oracle.quantize_nvfp4(x, **kw)
    _, s_dec = oracle.global_scales(r.amax, e)
    x6 = oracle.e2m1_decode(r.codes6).astype(np.float64) * np.repeat(r.sf6, 16, -1) * np.float64(s_dec)
    x64 = x.astype(np.float64)
    p = 1 if kw["four_over_six"] == "mae" else 2
    err_chosen = _per_block(np.abs(x_hat - x64) ** p, kw["block_2d"])
    err_map6 = _per_block(np.abs(x6 - x64) ** p, kw["block_2d"])
    c = 32 if p == 1 else 64
    mag = _per_block((np.abs(x64) + np.abs(x_hat)) ** p, kw["block_2d"]) + _per_block(
        (np.abs(x64) + np.abs(x6)) ** p, kw["block_2d"]
    )
    tol = c * U32 * mag
    worse = err_chosen > err_map6 + tol
    assert not worse.any(), (np.argwhere(worse)[:3], err_chosen[worse][:3], err_map6[worse][:3])


TWO_D = [
    dict(block_2d=True, scale="tensor", four_over_six=None, e4m3_max=None, fast_error=False),
    dict(block_2d=True, scale="tensor", four_over_six="mae", e4m3_max=None, fast_error=False),
    dict(block_2d=True, scale="tensor", four_over_six="mse", e4m3_max=448, fast_error=True),
]


@PROPERTY_SETTINGS
@given(data=st.data())
def test_2d_quantization_of_w_and_w_transpose_correspond(impl, data):
    """With 16x16 tiles the same tile max, scale and codes serve both GEMM orientations
    (§2): quantize(W.T) is quantize(W) transposed, codes, scales, map4 and amax. Under 4/6 the
    tile error is a sum over rows in a fixed order (§3), so the two orientations add the same
    256 element errors in different orders and may decide a near-tie differently: tiles where
    the oracle's two decisions differ are left out (the contract allows them to differ)."""
    kw = data.draw(st.sampled_from(TWO_D), label="config")
    w = data.draw(matrices(), label="w")
    a = tensor_bytes(_run(impl, kw, w))
    bt = tensor_bytes(single(impl, nvfp4.NVFP4Config(**kw))(np.ascontiguousarray(w.T)))
    assert a["amax"] == bt["amax"]
    tile_a = a["scales"][::16]  # [2, 4]: tile (i, j) of W
    tile_b = bt["scales"][::16].T  # tile (j, i) of W.T, transposed to [2, 4]
    m_a, m_b = a["map4"][::16], bt["map4"][::16].T
    keep = np.ones((2, 4), bool)
    if kw["four_over_six"] is not None:
        keep = oracle.quantize_nvfp4(w, **kw).map4[::16] == oracle.quantize_nvfp4(np.ascontiguousarray(w.T), **kw).map4[::16].T
    np.testing.assert_array_equal(tile_a[keep], tile_b[keep])
    np.testing.assert_array_equal(m_a[keep], m_b[keep])
    codes_a = oracle.unpack(a["codes"])  # [32, 64]
    codes_b = oracle.unpack(bt["codes"]).T  # [32, 64]
    el_keep = np.repeat(np.repeat(keep, 16, 0), 16, 1)
    np.testing.assert_array_equal(codes_a[el_keep], codes_b[el_keep])


TOKEN = [kw for kw in VALID if kw["scale"] == "token"]


@PROPERTY_SETTINGS
@given(data=st.data())
def test_per_token_rows_are_independent_bitwise(impl, data):
    """§4: a token's quantized bytes (codes, scales, map4, amax) depend on that token alone:
    replacing any other rows (here with rows of another distribution and scale) leaves it
    bitwise unchanged."""
    kw = data.draw(st.sampled_from(TOKEN), label="config")
    x = data.draw(matrices(), label="x")
    other = data.draw(matrices(), label="other")
    replaced = np.array(data.draw(st.lists(st.booleans(), min_size=32, max_size=32), label="rows"))
    y = np.where(replaced[:, None], other, x).astype(np.float32)
    a, b = tensor_bytes(_run(impl, kw, x)), tensor_bytes(_run(impl, kw, y))
    for f in ("codes", "scales", "map4", "amax"):
        np.testing.assert_array_equal(a[f][~replaced], b[f][~replaced], err_msg=f)


TENSOR = [kw for kw in VALID if kw["scale"] == "tensor"]


def _normal_scale(scale_bytes):
    """E4M3 scale bytes with a non-zero exponent field (normal values, >= 2^-6)."""
    return ((scale_bytes >> 3) & 0xF) != 0


@PROPERTY_SETTINGS
@given(data=st.data())
def test_fixed_point_requantizing_the_dequantized_tensor(impl, data):
    """The §3 reference vectors are fixed points ([6, 5] -> map-4 [6, 4.5] -> the same bytes);
    broadly, x_hat = dequantize(quantize(x)) requantizes to the same bytes, per tensor, when
    the amax is preserved, on every block whose scale is a normal E4M3 value:
    - the block max lands on code 6 (map-6) or 4 (map-4) because a normal scale is within
      2^-4 of its target, and requantizing x_hat reproduces sf and the codes exactly;
    - blocks with a subnormal or zero scale are excluded: a subnormal sf can put the max on
      code 4 or 5 (e.g. b * k = 1.5 * 2^-9 rounds to 2^-8, max -> 4.5 -> 4), and a zero sf
      keeps arbitrary codes that dequantize to 0.
    Under 4/6 a map-4 block may come back as map-6 when the map-6 grid also holds every value
    of x_hat: both candidates then reproduce x_hat exactly, the errors tie and ties go to
    map-6 (§3). So under 4/6: the values are a fixed point (dequantize again gives x_hat
    bitwise), map-4 may only flip to map-6, and the bytes are equal wherever map4 agrees."""
    kw = data.draw(st.sampled_from(TENSOR), label="config")
    e = nvfp4.NVFP4Config(**kw).e4m3_bound
    x = data.draw(matrices(e), label="x")
    a = tensor_bytes(_run(impl, kw, x))
    x_hat = _dequant(a, e)
    assume(np.isfinite(x_hat).all())
    b = tensor_bytes(_run(impl, kw, x_hat))
    assume(a["amax"] == b["amax"])
    normal = _normal_scale(a["scales"])  # [32, 4]
    el = np.repeat(normal, 16, axis=-1)
    codes_a, codes_b = oracle.unpack(a["codes"]), oracle.unpack(b["codes"])
    if kw["four_over_six"] is None:
        np.testing.assert_array_equal(a["scales"][normal], b["scales"][normal])
        np.testing.assert_array_equal(codes_a[el], codes_b[el])
    else:
        x_hat2 = _dequant(b, e)
        np.testing.assert_array_equal(x_hat2[el].view(np.uint32), x_hat[el].view(np.uint32))
        flipped = a["map4"] != b["map4"]
        assert (a["map4"][flipped & normal]).all(), "only map-4 -> map-6 flips"
        same = normal & ~flipped
        np.testing.assert_array_equal(a["scales"][same], b["scales"][same])
        same_el = np.repeat(same, 16, axis=-1)
        np.testing.assert_array_equal(codes_a[same_el], codes_b[same_el])


def test_fixed_point_of_the_s3_vectors(impl):
    """[6, 5] -> map-4 codes (4, 3) * 1.5 = [6, 4.5]; [6, 4.5] quantizes to the same bytes."""
    kw = dict(block_2d=False, scale="tensor", four_over_six="mae", e4m3_max=None, fast_error=False)
    x = np.zeros((cases.ROWS, cases.COLS), np.float32)
    x[0, 0] = 1536
    x[0, 16:18] = [6, 5]
    x[0, 32:34] = [6, 4]
    a = tensor_bytes(_run(impl, kw, x))
    x_hat = _dequant(a, 256)
    np.testing.assert_array_equal(x_hat[0, 16:18], [6, 4.5])
    b = tensor_bytes(_run(impl, kw, x_hat))
    for f in ("codes", "scales", "map4", "amax"):
        np.testing.assert_array_equal(a[f], b[f], err_msg=f)
