"""The grouped GEMM with packed NVFP4 weights (`pallas_kernels.grouped_gemm.packed_weight`).

On the CPU the kernel runs in the Pallas interpreter; the `gpu`-marked variants run the same
checks compiled (`pytest -m gpu tests/kernels/test_packed_weight_gemm.py`). References:
- the XLA grouped GEMM of the model's emulated forward (`nvfp4.scaled_operand` then
  `fp4rl.grouped.ragged_matmul`), bit for bit on operands whose f32 sums are exact in any order;
- the float64 oracle under the f32 accumulation bound (`tests.grouped_oracle`) on random ones.
Shapes cover an empty group (first and in the middle), groups that are not a multiple of the row
tile, rows past sum(group_sizes), several column tiles and several K steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import grouped
from fp4rl.formats import nvfp4
from pallas_kernels.grouped_gemm import packed_weight as pw
from tests.grouped_oracle import accumulation_bound, assert_within, exact_matmul

SMALL_TILES = pw.PackedGemmTiles(block_m=16, block_n=16, block_k=32)  # several column tiles and K steps
CASES = {  # (rows R, K, N, group sizes)
    "empty-middle-past-the-groups": (72, 64, 32, (17, 0, 40, 5)),  # rows 62..71 past the groups
    "empty-first-full-cover": (48, 96, 48, (0, 33, 15)),
}
BACKENDS = [pytest.param(True, id="interpret"), pytest.param(False, id="compiled", marks=pytest.mark.gpu)]


def _weight(e, n, k, seed=0, exact_sums=False):
    """An NVFP4 expert stack as `qlinear.quantize_weight` makes it: w^T [E, N, K], 16x16 blocks.
    exact_sums: codes random, E4M3 scales powers of two in [1/4, 4] (products then lie on a grid
    coarse enough for every partial sum of the tests to be exact in f32)."""
    rng = np.random.default_rng(seed)
    if exact_sums:
        codes = rng.integers(0, 256, (e, n, k // 2), dtype=np.uint8)
        scales = (2.0 ** rng.integers(-2, 3, (e, n, k // 16))).astype(jnp.float8_e4m3fn)
        return jnp.asarray(codes), jnp.asarray(scales)
    w = jnp.asarray(rng.standard_normal((e, n, k)), jnp.float32)
    t = jax.vmap(lambda m: nvfp4.quantize(m, nvfp4.NVFP4Config(block_2d=True)))(w)
    return t.codes, t.scales


def _operand(codes, scales):
    """The reference's bf16 operand dec(q) * sf (what `qlinear` feeds the GEMM)."""
    amax = jnp.ones(codes.shape[:1], jnp.float32)
    return jax.vmap(lambda c, s, a: nvfp4.scaled_operand(nvfp4.NVFP4Tensor(
        codes=c, scales=s, amax=a, map4=jnp.zeros(s.shape, bool), config=nvfp4.NVFP4Config(block_2d=True)))[0])(
        codes, scales, amax)


def _activations(rows, k, seed=1, exact_sums=False):
    rng = np.random.default_rng(seed)
    if exact_sums:  # multiples of 1/8 in [-4, 4]
        return jnp.asarray(rng.integers(-32, 33, (rows, k)) / 8.0, jnp.bfloat16)
    return jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)


def test_dequantized_tile_is_scaled_operand_for_every_code_and_scale_byte():
    """All 256 code bytes x all 256 scale bytes (NaN scales included): the kernel's decode gives
    the bf16 bytes of `nvfp4.scaled_operand`."""
    codes = jnp.tile(jnp.arange(256, dtype=jnp.uint8).reshape(1, 256), (256, 1))  # [256, 256]: K = 512
    scale_bytes = jnp.tile(jnp.arange(256, dtype=jnp.uint8)[:, None], (1, 32))  # row r: scale byte r
    got = pw.dequantized_tile(pw.codes_as_words(codes), scale_bytes)
    want = _operand(codes[None], jax.lax.bitcast_convert_type(scale_bytes, jnp.float8_e4m3fn)[None])[0]
    got_bits, want_bits = (np.asarray(jax.lax.bitcast_convert_type(v, jnp.uint16)) for v in (got, want))
    nan = np.isnan(np.asarray(want, np.float32))
    assert np.array_equal(np.isnan(np.asarray(got, np.float32)), nan) and nan.sum() == 2 * 512  # bytes 0x7F, 0xFF
    assert np.array_equal(got_bits[~nan], want_bits[~nan])
    # the f16 form: dec(q) sf 2^-7, exact in f16 for every code and finite scale byte
    got16 = np.asarray(pw.dequantized_tile(pw.codes_as_words(codes), scale_bytes, jnp.float16))
    assert got16.dtype == np.float16 and np.array_equal(np.isnan(got16), nan)
    want32 = np.asarray(want, np.float32)[~nan] * np.float32(2.0**-pw.F16_TILE_SHIFT)
    assert np.array_equal(got16[~nan].astype(np.float32), want32)
    assert np.array_equal(np.signbit(got16[~nan]), np.signbit(want32))  # -0 codes stay -0


def test_tile_schedule_cuts_each_group_into_its_own_tiles():
    group, first, end = (np.asarray(v) for v in pw.tile_schedule(jnp.asarray([0, 5, 0, 20, 16]), 41, 8))
    assert len(group) == 6 + 5  # ceil(41 / 8) + E
    real = end > first
    # a tile covers rows [first, min(first + block_m, end)): end is its group's end row
    assert list(zip(group[real], first[real], end[real])) == [(1, 0, 5), (3, 5, 25), (3, 13, 25), (3, 21, 25),
                                                             (4, 25, 41), (4, 33, 41)]
    assert (first[~real] == end[~real]).all()


X_FORMS = [pytest.param(jnp.bfloat16, id="x-bf16"), pytest.param(jnp.float16, id="x-f16")]


def _assert_same_bits_with_each_tiles(kernel, want, sizes):
    """`kernel(tiles)` gives `want`'s f32 bytes with small and default tiles; rows past the groups 0."""
    for tiles in (SMALL_TILES, pw.DEFAULT_TILES):
        got = kernel(tiles)
        assert got.dtype == jnp.float32 and got.shape == want.shape
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), tiles
    assert not np.asarray(got[sum(sizes):]).any()  # rows past the groups
    assert np.asarray(got[:sum(sizes)]).any()


@pytest.mark.parametrize("x_dtype", X_FORMS)
@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_nvfp4_weight_gemm_is_the_emulated_forward_bit_for_bit(case, interpret, x_dtype):
    """x in bf16 (the tile formed in bf16) or f16 (the tile formed in f16, scaled by 2^-7 and the
    accumulator by 2^7): the same bits as the emulated forward where the f32 sums are exact."""
    rows, k, n, sizes = CASES[case]
    codes, scales = _weight(len(sizes), n, k, exact_sums=True)
    x = _activations(rows, k, exact_sums=True)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    want = grouped.ragged_matmul(x, _operand(codes, scales), group_sizes, gemm="xla", transpose_rhs=True)
    assert want.shape == (rows, n)
    _assert_same_bits_with_each_tiles(
        lambda tiles: pw.grouped_matmul_nvfp4(x.astype(x_dtype), codes, scales, group_sizes, tiles=tiles,
                                              interpret=interpret), want, sizes)


@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_both_weight_forms_within_the_f32_accumulation_bound(case, interpret):
    rows, k, n, sizes = CASES[case]
    codes, scales = _weight(len(sizes), n, k)
    w = _operand(codes, scales)  # [E, N, K] bf16
    x = _activations(rows, k)
    exact, magnitude = exact_matmul(x, jnp.swapaxes(w, 1, 2), sizes)
    bound = accumulation_bound(magnitude, k)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    packed = pw.grouped_matmul_nvfp4(x, codes, scales, group_sizes, tiles=SMALL_TILES, interpret=interpret)
    assert_within(packed, exact, bound, f"nvfp4 weight {case}")
    x16 = x.astype(jnp.float16)  # x's standard normal bf16 values: exact in f16 (checked)
    assert np.array_equal(np.asarray(x16, np.float32), np.asarray(x, np.float32))
    packed16 = pw.grouped_matmul_nvfp4(x16, codes, scales, group_sizes, tiles=SMALL_TILES, interpret=interpret)
    assert_within(packed16, exact, bound, f"nvfp4 weight, x f16 {case}")
    plain = pw.grouped_matmul_bf16(x, w, group_sizes, tiles=SMALL_TILES, interpret=interpret)
    assert_within(plain, exact, bound, f"bf16 weight {case}")


@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_nvfp4_weight_dgrad_is_the_emulated_dgrad_bit_for_bit(case, interpret):
    """g [R, N] @ W_e [N, K], the weight read packed (`grouped_dgrad_nvfp4`): the same bits as the
    emulated dequantized backward's GEMM (`nvfp4.scaled_operand`, then XLA) where the f32 sums
    are exact, with tiles that walk N in several steps and K in several column blocks."""
    rows, k, n, sizes = CASES[case]
    codes, scales = _weight(len(sizes), n, k, exact_sums=True)
    g = _activations(rows, n, seed=2, exact_sums=True)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    want = grouped.ragged_matmul(g, _operand(codes, scales), group_sizes, gemm="xla")
    assert want.shape == (rows, k)
    _assert_same_bits_with_each_tiles(
        lambda tiles: pw.grouped_dgrad_nvfp4(g, codes, scales, group_sizes, tiles=tiles, interpret=interpret),
        want, sizes)


@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_nvfp4_weight_dgrad_within_the_f32_accumulation_bound(case, interpret):
    rows, k, n, sizes = CASES[case]
    codes, scales = _weight(len(sizes), n, k, seed=3)
    g = _activations(rows, n, seed=4)
    exact, magnitude = exact_matmul(g, _operand(codes, scales), sizes)
    got = pw.grouped_dgrad_nvfp4(g, codes, scales, jnp.asarray(sizes, jnp.int32), tiles=SMALL_TILES, interpret=interpret)
    assert_within(got, exact, accumulation_bound(magnitude, n), f"nvfp4 weight dgrad {case}")


def test_f32_dgrad_runs_as_three_exact_bf16_parts():
    """`fp4rl.grouped.ragged_dgrad_nvfp4` on an f32 cotangent (f32 compute): its three bf16 parts'
    products are exact, so the result is the f32 GEMM's within the accumulation bound (three f32
    results summed: two more roundings), where one bf16 cast of g would be ~2^-9 off."""
    rows, k, n, sizes = CASES["empty-middle-past-the-groups"]
    codes, scales = _weight(len(sizes), n, k, seed=5)
    g = jnp.asarray(np.random.default_rng(6).standard_normal((rows, n)), jnp.float32)
    exact, magnitude = exact_matmul(g, _operand(codes, scales), sizes)
    got = grouped.ragged_dgrad_nvfp4(g, codes, scales, jnp.asarray(sizes, jnp.int32), gemm="packed_dgrad_interpret")
    assert_within(got, exact, accumulation_bound(magnitude, n) + 3 * 2.0**-24 * np.abs(exact), "f32 dgrad")
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        grouped.ragged_dgrad_nvfp4(g.astype(jnp.float16), codes, scales, jnp.asarray(sizes, jnp.int32),
                                   gemm="packed_dgrad_interpret")
    with pytest.raises(ValueError, match="runs on gemm in"):
        grouped.ragged_dgrad_nvfp4(g, codes, scales, jnp.asarray(sizes, jnp.int32), gemm="packed_interpret")


def test_a_nan_scale_makes_nan_only_its_experts_rows():
    """A NaN block scale (the quantizer's mark of a non-finite block) poisons the output column
    of its expert's rows, nothing else. (XLA's CPU ragged_dot spreads it over the whole column:
    it expands the groups with masks, and NaN * 0 is NaN; elsewhere the bits agree.)"""
    rows, k, n, sizes = CASES["empty-middle-past-the-groups"]
    codes, scales = _weight(len(sizes), n, k, exact_sums=True)
    scale_bytes = np.array(jax.lax.bitcast_convert_type(scales, jnp.uint8))
    scale_bytes[2, 5, 1] = 0x7F  # expert 2, output column 5, K block 1
    scales = jax.lax.bitcast_convert_type(jnp.asarray(scale_bytes), jnp.float8_e4m3fn)
    x = _activations(rows, k, exact_sums=True)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    got = np.asarray(pw.grouped_matmul_nvfp4(x, codes, scales, group_sizes, tiles=SMALL_TILES, interpret=True))
    want = np.asarray(grouped.ragged_matmul(x, _operand(codes, scales), group_sizes, gemm="xla", transpose_rhs=True))
    nan = np.zeros(got.shape, bool)
    nan[17:57, 5] = True  # expert 2's rows
    assert np.array_equal(np.isnan(got), nan) and np.isnan(want[nan]).all()
    assert np.array_equal(got[:, :5], want[:, :5]) and np.array_equal(got[:, 6:], want[:, 6:])


def test_bad_operands_are_refused_with_what_is_valid():
    codes, scales = _weight(2, 32, 128, exact_sums=True)
    x = _activations(8, 128)
    sizes = jnp.asarray([4, 4], jnp.int32)
    with pytest.raises(TypeError, match="x must be bfloat16 or float16"):
        pw.grouped_matmul_nvfp4(x.astype(jnp.float32), codes, scales, sizes, interpret=True)
    with pytest.raises(ValueError, match="x has K=32 but the weight has K=128"):
        pw.grouped_matmul_nvfp4(x[:, :32], codes, scales, sizes, interpret=True)
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 32, 8\)"):
        pw.grouped_matmul_nvfp4(x, codes, scales[:, :, :2], sizes, interpret=True)
    with pytest.raises(ValueError, match=r"group_sizes must be integers of shape \(2,\)"):
        pw.grouped_matmul_nvfp4(x, codes, scales, sizes[:1], interpret=True)
    with pytest.raises(ValueError, match="N=40 must be a multiple of 16"):
        pw.grouped_matmul_bf16(x, jnp.zeros((2, 40, 128), jnp.bfloat16), sizes, interpret=True)
    with pytest.raises(ValueError, match="K=48 must be a multiple of 32"):
        pw.grouped_matmul_nvfp4(x[:, :48], *_weight(2, 32, 48, exact_sums=True), sizes, interpret=True)
    with pytest.raises(ValueError, match="K=40 must be a multiple of 16"):
        pw.grouped_matmul_bf16(x[:, :40], jnp.zeros((2, 32, 40), jnp.bfloat16), sizes, interpret=True)
    with pytest.raises(ValueError, match="must be a power of two >= 16"):
        pw.PackedGemmTiles(block_m=24)
    g = _activations(8, 32)
    with pytest.raises(TypeError, match="g must be bfloat16"):
        pw.grouped_dgrad_nvfp4(g.astype(jnp.float16), codes, scales, sizes, interpret=True)
    with pytest.raises(ValueError, match="g has N=16 but the weight has N=32"):
        pw.grouped_dgrad_nvfp4(g[:, :16], codes, scales, sizes, interpret=True)
    with pytest.raises(ValueError, match="K=48 must be a multiple of 32"):
        pw.grouped_dgrad_nvfp4(g, *_weight(2, 32, 48, exact_sums=True), sizes, interpret=True)
    with pytest.raises(ValueError, match=r"group_sizes must be integers of shape \(2,\)"):
        pw.grouped_dgrad_nvfp4(g, codes, scales, sizes[:1], interpret=True)
    if jax.default_backend() != "gpu":
        with pytest.raises(RuntimeError, match="no silent XLA fallback"):
            pw.grouped_matmul_nvfp4(x, codes, scales, sizes)
        with pytest.raises(RuntimeError, match="no silent XLA fallback"):
            pw.grouped_dgrad_nvfp4(g, codes, scales, sizes)


def test_lowers_to_triton_ir_for_h200(monkeypatch):
    """On CPU CI: the compiled kernels (the forward's both weight forms, the packed dgrad; two launch
    shapes) build as Triton IR for sm_90. It does not run ptxas; the `gpu` tests above do."""
    try:
        from jax._src.pallas.triton import gpu_info, pallas_call_registration
    except ImportError as e:  # pragma: no cover - depends on jax internals
        pytest.skip(f"jax internals for cross-lowering moved: {e}")
    monkeypatch.setattr(pallas_call_registration.gpu_info_lib, "get_gpu_info",
                        lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200))
    x = jax.ShapeDtypeStruct((70, 512), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((4,), jnp.int32)
    weights = {"nvfp4": (jax.ShapeDtypeStruct((4, 256, 64), jnp.uint32), jax.ShapeDtypeStruct((4, 256, 32), jnp.uint8)),
               "bf16": (jax.ShapeDtypeStruct((4, 256, 512), jnp.bfloat16),)}
    # JAX deprecates its Pallas Triton backend (docs/numerics.md §10): asserted, so that its removal shows here.
    with pytest.warns(DeprecationWarning, match="Pallas Triton backend is deprecated"):
        for tiles in (pw.DEFAULT_TILES, pw.PackedGemmTiles(block_m=64, block_n=128, block_k=256, num_warps=8)):
            for form, w in weights.items():
                text = jax.jit(lambda x, w, s: pw._grouped_call(x, w, s, tiles=tiles, interpret=False)).trace(
                    x, w, sizes).lower(lowering_platforms=("cuda",)).as_text()
                assert f'name = "{pw.KERNEL_NAME}"' in text, (form, tiles)
            g = jax.ShapeDtypeStruct((70, 256), jnp.bfloat16)  # the dgrad: g [R, N] against the packed [E, N, K]
            text = jax.jit(lambda g, w, s: pw._grouped_call(g, w, s, tiles=tiles, interpret=False, dgrad=True)).trace(
                g, weights["nvfp4"], sizes).lower(lowering_platforms=("cuda",)).as_text()
            assert f'name = "{pw.DGRAD_KERNEL_NAME}"' in text, tiles


def test_tile_schedule_has_no_while_loop():
    """A GPU while loop returns its condition to the host at every iteration: the schedule, run at
    every call of the kernel, must be straight-line device code (searchsorted compare_all)."""
    text = jax.jit(pw.tile_schedule, static_argnums=(1, 2)).lower(jnp.asarray([0, 5, 0, 20, 16]), 41, 8).as_text()
    assert "while" not in text
