"""NVFP4 quantization pinned bit for bit against the independent oracle (docs/numerics.md §1-§4, §8).

Every test that takes `impl` runs on each registered implementation (conftest.IMPLS). Bytes
are compared raw (codes, E4M3 scale bytes, amax bits, map4) with assert_array_equal.

Longer than ~400 lines because tests mirror packages and `fp4rl.formats.nvfp4` is the core of
the contract: one module holds every NVFP4 case against the oracle.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import elements, nvfp4
from tests.formats import cases, oracle
from tests.formats.conftest import assert_same_bytes, known_failure, ref_bytes, tensor_bytes
from tests.formats.harness import batched, chunks, oracle_for, single, unbatch

VALID = cases.valid_config_kwargs()
INVALID = cases.invalid_config_kwargs()
FAMILIES = cases.all_families()


# ------------------------------------------------------------------------------------------
# docs/numerics.md reference vectors


def _s3_vector():
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = 1536  # A = 1536 with E = 256: S_enc = fl(1536 / 1536) = 1
    x[0, 16:18] = [6, 5]
    x[0, 32:34] = [6, 4]
    return x  # blocks [1536], [6, 5], [6, 4], zeros


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_s3_reference_vectors(impl, jit):
    config = nvfp4.NVFP4Config(four_over_six="mae")
    assert config.e4m3_bound == 256
    f = single(impl, config) if jit else functools.partial(impl, config=config)
    b = tensor_bytes(f(_s3_vector()))
    np.testing.assert_array_equal(b["scales"][0], [0x78, 0x3C, 0x38, 0x00])
    np.testing.assert_array_equal(b["map4"][0], [False, True, False, False])  # choices 6, 4, 6, 6
    assert b["codes"][0, 8] == 0x56  # block [6, 5] under map-4: codes 6 (4.0) | 5 (3.0) << 4
    assert b["codes"][0, 0] == 0x07 and b["codes"][0, 16] == 0x67  # 1536 -> 6 (code 7); [6, 4] -> codes 7, 6
    assert b["amax"] == np.float32(1536).view(np.uint32)


@pytest.mark.parametrize("metric,map4", [("mae", False), ("mse", True)])
def test_s3_tie_block_6_5_1_2(impl, metric, map4):
    # MAE: map-6 errors |5-4| = 1, map-4 errors |5-4.5| + |1-1.5| = 1: a tie, so map-6.
    # MSE: map-6 1, map-4 0.25 + 0.25 = 0.5 < 1: map-4.
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1536
    x[0, 16:20] = [6, 5, 1, 2]
    t = single(impl, nvfp4.NVFP4Config(four_over_six=metric))(x)
    np.testing.assert_array_equal(np.asarray(t.map4)[0], [False, map4])
    assert np.asarray(t.scales).view(np.uint8)[0, 1] == (0x3C if map4 else 0x38)


def test_s1_e2m1_tie_table_through_quantize(impl):
    """A = 2688 (E = 448): S_enc = 1, block max 6 -> sf = 1, inv = 1: codes are E2M1(x)."""
    x = np.zeros((1, 48), np.float32)
    x[0, 0] = 2688
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    x[0, 16] = 6
    x[0, 17:24] = ties
    x[0, 24:31] = [-t for t in ties]
    x[0, 31] = -1e-3  # a tiny negative -> code 8 (-0)
    x[0, 32] = 6
    x[0, 33:40] = [np.nextafter(np.float32(t), np.float32(9)) for t in ties]
    t = single(impl, nvfp4.NVFP4Config())(x)
    assert np.asarray(t.scales).view(np.uint8)[0, 1] == 0x38  # E4M3 1.0
    codes = np.asarray(elements.unpack_e2m1(t.codes))[0]
    # ties: 0.25->0, 0.75->1 (code 2), 1.25->1 (2), 1.75->2 (4), 2.5->2 (4), 3.5->4 (6), 5->4 (6)
    np.testing.assert_array_equal(codes[16:24], [7, 0, 2, 2, 4, 4, 6, 6])
    np.testing.assert_array_equal(codes[24:32], [8, 10, 10, 12, 12, 14, 14, 8])
    # just above each tie rounds up: 0.5 (1), 1 (2), 1.5 (3), 2 (4), 3 (5), 4 (6), 6 (7)
    np.testing.assert_array_equal(codes[33:40], [1, 2, 3, 4, 5, 6, 7])


# ------------------------------------------------------------------------------------------
# Oracle vs implementation, byte for byte, every valid config x every family
# (the division and FMA repros below pin the XLA rewrites that fp4rl.formats.ieee defeats)


def _compare_params():
    return [
        pytest.param(kw, fam, id=f"{cases.config_id(kw)}-{fam}") for kw in VALID for fam in FAMILIES
    ]


@pytest.mark.parametrize("kw,family", _compare_params())
def test_matches_oracle(impl, kw, family, request):
    f = batched(impl, nvfp4.NVFP4Config(**kw))
    for j, x in enumerate(chunks(FAMILIES[family])):
        got = tensor_bytes(f(x))
        want = ref_bytes(oracle_for(x, kw, batch_dims=1))
        assert_same_bytes(got, want, what=f"chunk {j} of {family} under {cases.config_id(kw)}:")


def _one_block(a, block):
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = a
    x[0, 16 : 16 + len(block)] = block
    return x


def test_division_repro_base_b_over_6(impl, request):
    """A = 1536, E = 256 (S_enc = 1), MAE, block [0.042968746] (one ulp below 11 * 2^-8).
    By hand: fl(b/6) = 15379113 * 2^-31; fl(1.5 * that) = 5.4999995 * 2^-9 -> sf4 = 5 * 2^-9
    (byte 0x05); sf6 = E4M3(3.67 * 2^-9) = 4 * 2^-9. map-6: b*128 = 5.4999995 -> 6, |d| =
    0.003906254; map-4: b * fl(1/sf4) = 4.3999996 -> 4, |d| = 0.003906246 < err6: map-4, byte
    0x05. With b * fl(1/6) instead, 1.5*base is exactly 5.5 * 2^-9, a tie -> 6 * 2^-9, whose
    candidate equals map-6's: a tie -> map-6, byte 0x04."""
    x = _one_block(1536, [np.float32(0.042968746)])
    t = single(impl, nvfp4.NVFP4Config(four_over_six="mae"))(x)
    np.testing.assert_array_equal(np.asarray(t.scales).view(np.uint8)[0], [0x78, 0x05])
    np.testing.assert_array_equal(np.asarray(t.map4)[0], [False, True])


def test_division_repro_base_times_s_enc(impl, request):
    """A = 1536, E = 448 (S_enc = 1.75, S_dec = fl(1/1.75)), MAE, block [0.375, 0.3].
    By hand: base = fl(fl(0.375/6) * 1.75) = 0.109375 (exact) = sf6 (byte 0x1E);
    1.5*base = 0.1640625 = 10.5 * 2^-6, an E4M3 tie -> sf4 = 0.15625 (even mantissa).
    map-6: 0.375 -> 6 (v = 1008/2688 = 0.375), 0.3 -> 4 (v = 672/2688 = 0.25): err6 = fl(0.05...)
    map-4: 0.375 -> 4 (v = 960/2688), 0.3 -> 3 (v = 720/2688): err4 == err6 in float32 (both
    0.050000012): a tie, so map-6, byte 0x1E. With b * fl(S_enc * fl(1/6)) = 0.109375005
    instead, 1.5*base lands above the tie, sf4 = 0.171875 (0x23), and map-4 wins."""
    x = _one_block(1536, [0.375, 0.3])
    t = single(impl, nvfp4.NVFP4Config(four_over_six="mae", e4m3_max=448))(x)
    np.testing.assert_array_equal(np.asarray(t.scales).view(np.uint8)[0], [0x7E, 0x1E])
    np.testing.assert_array_equal(np.asarray(t.map4)[0], [False, False])


def test_fma_repro_exact_error(impl, request):
    """A = 1536, E = 256 (S_enc = S_dec = 1), MSE, exact error, block [3.999956, 4.5000443, 6].
    By hand: sf6 = 1, sf4 = 1.5; v = fl(fl(dq * 1536) / 1536) = dq exactly, so every d is an
    exact difference: map-6 dq = [4, 4, 6], map-4 dq = [4.5, 4.5, 6];
    err6 = fl(fl(4.4e-5^2) + fl(0.5000443^2)) = 0.25004435, err4 = 0.2500441 < err6: map-4,
    byte 0x3C. With d = fma(fl(dq * 1536), fl(1/1536), -x), dq = 6 no longer gives d = 0 and
    the near-tie goes the other way (map-6, byte 0x38)."""
    x = _one_block(1536, [np.float32(3.999956), np.float32(4.5000443), 6.0])
    t = single(impl, nvfp4.NVFP4Config(four_over_six="mse"))(x)
    np.testing.assert_array_equal(np.asarray(t.scales).view(np.uint8)[0], [0x78, 0x3C])
    np.testing.assert_array_equal(np.asarray(t.map4)[0], [False, True])


def test_nan_repro_per_token(impl, request):
    """§8, per token, no vmap: x = normal [256, 64] with one NaN -> its row must dequantize
    to NaN."""
    x = cases.normal().reshape(256, 64).copy()
    x[5, 17] = np.nan
    t = single(impl, nvfp4.NVFP4Config(scale="token"))(x)
    assert np.isnan(np.asarray(nvfp4.dequantize(t))[5]).all()


_FTZ_REASON = (
    "XLA:CPU flushes float32 subnormals to zero (inputs and results); the contract's fl(.) is "
    "IEEE float32 with subnormals. For A < 6E / FLT_MAX (~7.9e-36 at E = 448) S_enc is capped "
    "at FLT_MAX and S_dec = fl(1/FLT_MAX) = 2.9e-39 is subnormal: flushed, inv becomes "
    "FLT_MAX and the codes differ (about 1000 of 2048 here). The integer division keeps S_dec "
    "subnormal, but the product fl(f32(sf) * S_dec) that consumes it flushes all the same."
)


@pytest.mark.parametrize("kw", [dict(), dict(four_over_six="mae")], ids=["map6", "mae"])
def test_global_scale_with_subnormal_s_dec(impl, kw, request):
    """Tiny tensors (amax ~3e-36; every input a normal float32) whose S_dec is a float32
    subnormal, byte for byte against the oracle."""
    if jax.default_backend() == "cpu":
        known_failure(request, impl, {"reference", "reference_integer_division"}, _FTZ_REASON)
    r = np.random.default_rng(17)
    x = (r.uniform(2.0**-120, 3e-36, (32, 64)) * r.choice([-1, 1], (32, 64))).astype(np.float32)
    got = tensor_bytes(single(impl, nvfp4.NVFP4Config(**kw))(x))
    assert_same_bytes(got, ref_bytes(oracle_for(x, kw)))


@pytest.mark.parametrize("kw", INVALID, ids=[cases.config_id(k) for k in INVALID])
def test_invalid_config_raises_naming_valid_options(impl, kw):
    with pytest.raises(ValueError, match="valid options"):
        impl(np.ones((16, 16), np.float32), nvfp4.NVFP4Config(**kw))


@pytest.mark.parametrize(
    "bad", [dict(scale="row"), dict(four_over_six="l1"), dict(e4m3_max=300), dict(four_over_six=True)]
)
def test_out_of_range_option_raises_naming_valid_options(bad):
    with pytest.raises(ValueError, match="valid options"):
        nvfp4.NVFP4Config(**bad)


def test_config_is_frozen_hashable_and_resolves_e():
    c = nvfp4.NVFP4Config(four_over_six="mse")
    assert hash(c) == hash(nvfp4.NVFP4Config(four_over_six="mse"))
    with pytest.raises(Exception):
        c.scale = "token"  # frozen
    assert nvfp4.NVFP4Config().e4m3_bound == 448
    assert nvfp4.NVFP4Config(four_over_six="mae").e4m3_bound == 256
    assert nvfp4.NVFP4Config(four_over_six="mae", e4m3_max=448).e4m3_bound == 448
    assert nvfp4.NVFP4Config(e4m3_max=256).e4m3_bound == 256


# ------------------------------------------------------------------------------------------
# Output layout, dequantize and the emulated-GEMM operand

LAYOUT_KWS = [dict(), dict(scale="token"), dict(block_2d=True, four_over_six="mae")]


@pytest.mark.parametrize("kw", LAYOUT_KWS, ids=[cases.config_id({**VALID[0], **k}) for k in LAYOUT_KWS])
def test_output_shapes_and_dtypes(impl, kw):
    x = cases.normal()[:2]  # [2, 32, 64]: a leading batch dim
    t = single(impl, nvfp4.NVFP4Config(**kw))(x)
    assert t.codes.shape == (2, 32, 32) and t.codes.dtype == jnp.uint8
    assert t.scales.shape == (2, 32, 4) and t.scales.dtype == jnp.float8_e4m3fn
    assert t.map4.shape == (2, 32, 4) and t.map4.dtype == jnp.bool_
    assert t.amax.dtype == jnp.float32
    assert t.amax.shape == ((2, 32, 1) if kw.get("scale") == "token" else ())
    if kw.get("block_2d"):  # each tile's scale on all its 16 rows
        s = np.asarray(t.scales).view(np.uint8)
        np.testing.assert_array_equal(s, np.repeat(s[:, ::16], 16, axis=1))


# dequantize depends on the config only through E and the amax layout
DEQ_KWS = [
    dict(block_2d=False, scale="tensor", four_over_six=None, e4m3_max=None, fast_error=False),
    dict(block_2d=False, scale="token", four_over_six="mse", e4m3_max=None, fast_error=False),
    dict(block_2d=True, scale="tensor", four_over_six="mae", e4m3_max=448, fast_error=True),
    dict(block_2d=False, scale="token", four_over_six=None, e4m3_max=256, fast_error=False),
]


@pytest.mark.parametrize("kw", DEQ_KWS, ids=[cases.config_id(k) for k in DEQ_KWS])
def test_dequantize_and_scaled_operand_match_oracle(impl, kw):
    """Dequantize of the implementation's own bytes, evaluated as fl(fl(dec*sf)*S_dec) (§2),
    and the emulated-GEMM operand dec(q)*sf, exact in bf16, with its S_dec."""
    config = nvfp4.NVFP4Config(**kw)
    e = config.e4m3_bound
    for family in ("normal", "student_t2", "tiny_1e-6", "huge_1e30", "mixed_zero_blocks", "e4m3_ties_A1536"):
        x = chunks(FAMILIES[family])[0]
        t = batched(impl, config)(x)
        for i in (0, 3, 7):
            ti = unbatch(t, i)
            b = tensor_bytes(ti)
            amax = b["amax"].view(np.float32)
            want = oracle.dequantize_nvfp4(b["codes"], b["scales"], amax, e)
            got = np.asarray(nvfp4.dequantize(ti))
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=family)
            op, s_dec = nvfp4.scaled_operand(ti, jnp.bfloat16)
            assert op.dtype == jnp.bfloat16
            dec_sf = oracle.e2m1_decode(oracle.unpack(b["codes"])) * np.repeat(
                b["scales"].view(oracle.ml_dtypes.float8_e4m3fn).astype(np.float32), 16, axis=-1
            )
            # bf16 holds dec(q)*sf exactly (<= 6 significant bits, 2^-10 .. 2688)
            np.testing.assert_array_equal(np.asarray(op).astype(np.float32), dec_sf, err_msg=family)
            np.testing.assert_array_equal(np.asarray(s_dec), oracle.global_scales(amax, e)[1])
            assert np.shape(s_dec) == np.shape(amax)


# ------------------------------------------------------------------------------------------
# Bad input


def test_k_not_multiple_of_16_names_shape_and_block(impl):
    with pytest.raises(ValueError, match=r"\(4, 40\).*16|16.*\(4, 40\)"):
        impl(np.ones((4, 40), np.float32), nvfp4.NVFP4Config())


def test_2d_rows_not_multiple_of_16_names_shape_and_block(impl):
    with pytest.raises(ValueError, match=r"\(24, 32\).*16|16.*\(24, 32\)"):
        impl(np.ones((24, 32), np.float32), nvfp4.NVFP4Config(block_2d=True))


def test_empty_contraction_is_a_clear_error(impl):
    with pytest.raises(ValueError, match=r"K=0 of shape \(4, 0\): quantize needs at least one block of 16"):
        impl(np.ones((4, 0), np.float32), nvfp4.NVFP4Config())


@pytest.mark.parametrize("scale, amax, match", [
    ("tensor", np.ones(3, np.float32), r"amax of shape \(3,\) does not fit scale='tensor'.*expected \(\)"),
    ("token", np.float32(1), r"amax of shape \(\) does not fit scale='token'.*expected \(4, 1\)"),
    ("token", np.ones(4, np.float32), r"amax of shape \(4,\) does not fit scale='token'.*expected \(4, 1\)"),
    ("tensor", np.float32(-2), "amax must be >= 0"),
    ("token", -np.ones((4, 1), np.float32), "amax must be >= 0"),
    ("tensor", np.float32(0), "amax is 0 where x has nonzero values"),
    ("token", np.array([[1], [0], [1], [1]], np.float32), "amax is 0 where x has nonzero values"),
])
def test_a_given_amax_of_the_wrong_shape_or_sign_is_refused(scale, amax, match):
    with pytest.raises(ValueError, match=match):
        nvfp4.quantize(np.ones((4, 32), np.float32), nvfp4.NVFP4Config(scale=scale), amax=amax)


def test_a_given_amax_is_shape_checked_under_jit_and_allowed_where_it_is_meaningful():
    x = np.ones((4, 32), np.float32)
    with pytest.raises(ValueError, match="amax of shape"):
        jax.jit(lambda a: nvfp4.quantize(x, nvfp4.NVFP4Config(), amax=a))(np.ones(3, np.float32))
    # Zero where x is zero, and a clipped amax (below max|x|: the block scales saturate) are meaningful.
    zero_row = x.copy()
    zero_row[1] = 0
    nvfp4.quantize(zero_row, nvfp4.NVFP4Config(scale="token"), amax=np.array([[1], [0], [1], [1]], np.float32))
    nvfp4.quantize(4 * x, nvfp4.NVFP4Config(), amax=np.float32(2))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.complex64])
def test_integer_or_complex_input_raises_type_error(impl, dtype):
    with pytest.raises(TypeError):
        impl(np.ones((16, 32), dtype), nvfp4.NVFP4Config())


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_input_equals_its_float32_value(impl, dtype):
    x = jnp.asarray(cases.student_t(), dtype)  # [8, 32, 64]
    for kw in (dict(), dict(scale="token", four_over_six="mse")):
        f = batched(impl, nvfp4.NVFP4Config(**kw))
        assert_same_bytes(tensor_bytes(f(x)), tensor_bytes(f(x.astype(jnp.float32))))


def _nonfinite_family(bad):
    x = cases.normal().copy()  # [8, 32, 64]
    x[0, 5, 17] = bad  # one element
    x[1, 0, 0] = bad
    x[2, 31, 63] = bad
    x[3, 16:32, 16:32] = bad  # a whole 16x16 tile
    x[4, 9, :] = bad  # a whole row
    x[5, 2, 3] = bad
    x[5, 20, 40] = -bad if not np.isnan(bad) else bad
    # cases 6, 7 stay finite
    return x




def _nonfinite_params():
    params = []
    for bad, name in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
        for kw in VALID:
            params.append(pytest.param(kw, bad, id=f"{cases.config_id(kw)}-{name}"))
    return params


@pytest.mark.parametrize("kw,bad", _nonfinite_params())
def test_nonfinite_input_dequantizes_to_nan(impl, kw, bad, request):
    """§8: a block with a non-finite value dequantizes to NaN; a non-finite amax makes the
    output it governs NaN (the whole tensor per tensor, the row per token). Never finite
    garbage. Per token, rows without a non-finite value are those of the finite input (§4)."""
    x = _nonfinite_family(np.float32(bad))
    config = nvfp4.NVFP4Config(**kw)
    t = batched(impl, config)(x)
    clean = batched(impl, config)(np.where(np.isfinite(x), x, 0).astype(np.float32))
    for i in range(x.shape[0]):
        ti = unbatch(t, i)
        deq = np.asarray(nvfp4.dequantize(ti))
        bad_el = ~np.isfinite(x[i])
        if not bad_el.any():
            assert np.isfinite(deq).all()
            continue
        bad_blk = np.repeat(bad_el.reshape(32, 4, 16).any(-1), 16, axis=-1)
        assert np.isnan(deq[bad_blk]).all(), f"case {i}: a block holding {bad} must dequantize to NaN"
        if kw["scale"] == "tensor":
            assert np.isnan(deq).all(), f"case {i}: the per-tensor amax is non-finite: all NaN"
        else:
            bad_rows = bad_el.any(-1)
            assert np.isnan(deq[bad_rows]).all(), f"case {i}: a row's amax is non-finite: row NaN"
            got, ref = tensor_bytes(ti), tensor_bytes(unbatch(clean, i))
            for f in ("codes", "scales", "map4", "amax"):
                np.testing.assert_array_equal(got[f][~bad_rows], ref[f][~bad_rows], err_msg=f)
            assert np.isfinite(deq[~bad_rows]).all()


# ------------------------------------------------------------------------------------------
# jit, vmap, batch dims


JIT_KWS = [dict(), dict(scale="token", four_over_six="mse"), dict(block_2d=True, four_over_six="mae", fast_error=True)]


@pytest.mark.parametrize("kw", JIT_KWS, ids=[cases.config_id({**VALID[0], **k}) for k in JIT_KWS])
def test_jit_vmap_eager_and_batch_dims_agree(impl, kw):
    config = nvfp4.NVFP4Config(**kw)
    x = cases.student_t()  # [8, 32, 64]
    vmapped = batched(impl, config)(x)
    jitted = tensor_bytes(single(impl, config)(x[5]))
    assert_same_bytes(tensor_bytes(unbatch(vmapped, 5)), jitted, "vmap vs jit")
    if not kw:  # eager (op by op) once: it is slow on CPU, and the §3 vectors run eager too
        assert_same_bytes(tensor_bytes(impl(x[5], config)), jitted, "eager vs jit")
    # leading batch dims: [8, 32, 64] is the same tensor as [256, 64] (per tensor: one amax
    # over everything; per token: one per row; 2D: tiles never straddle the 32-row slices)
    lead = tensor_bytes(single(impl, config)(x))
    flat = tensor_bytes(single(impl, config)(x.reshape(256, 64)))
    for f in ("codes", "scales", "map4"):
        np.testing.assert_array_equal(lead[f].reshape(flat[f].shape), flat[f], err_msg=f)
    np.testing.assert_array_equal(lead["amax"].reshape(-1), flat["amax"].reshape(-1))
    assert_same_bytes(lead, ref_bytes(oracle_for(x, kw)), "batch dims vs oracle")


# ------------------------------------------------------------------------------------------
# Per-token causality (§4)


def test_per_token_later_token_cannot_move_earlier_ones_but_per_tensor_does(impl):
    x = cases.llm_activations((32, 64), "causality")
    y = x.copy()
    y[12] *= 1000.0  # a later token with a much larger amax
    tok = single(impl, nvfp4.NVFP4Config(scale="token", four_over_six="mae"))
    a, b = tensor_bytes(tok(x)), tensor_bytes(tok(y))
    for f in ("codes", "scales", "map4", "amax"):
        np.testing.assert_array_equal(a[f][:12], b[f][:12], err_msg=f)
    ten = single(impl, nvfp4.NVFP4Config(scale="tensor", four_over_six="mae"))
    a, b = tensor_bytes(ten(x)), tensor_bytes(ten(y))
    assert not np.array_equal(a["scales"][:12], b["scales"][:12]), "per-tensor scale must see token 12"
