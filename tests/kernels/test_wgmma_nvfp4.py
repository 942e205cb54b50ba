"""The weight-only NVFP4 grouped GEMM on WGMMA (`pallas_kernels.grouped_gemm.wgmma_nvfp4`).

On the CPU the kernel runs in the Mosaic GPU interpreter (whose wgmma reads shared memory only:
the decoded tile goes through a shared-memory scratch there) and is lowered for sm_90 with the
tile in registers; the `gpu`-marked variants run it compiled in both operand forms
(`pytest -m gpu tests/kernels/test_wgmma_nvfp4.py`). References: the decode against
`nvfp4.scaled_operand` for every code and scale byte; the GEMM against the emulated forward
(`scaled_operand` then the XLA grouped GEMM) bit for bit where the f32 sums are exact, and the
float64 oracle under the f32 accumulation bound otherwise.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import grouped
from pallas_kernels.grouped_gemm import e2m1_registers as er
from pallas_kernels.grouped_gemm import packed_weight as pw
from pallas_kernels.grouped_gemm import wgmma_nvfp4 as wn
from tests.grouped_oracle import accumulation_bound, assert_within, exact_matmul
from tests.kernels.test_packed_weight_gemm import _activations, _operand, _weight

# (rows R, K, N, group sizes): an empty group first and in the middle, groups not a multiple of the
# row tile, rows past the groups, two column blocks of 64 and several K steps
CASES = {
    "empty-middle-past-the-groups": (40, 128, 128, (9, 0, 20, 3)),  # rows 32..39 past the groups
    "empty-first-full-cover": (24, 256, 64, (0, 17, 7)),
}
SMALL_TILES = wn.WgmmaDecodeTiles(rows=8, block_k=64, max_concurrent_steps=2)
TALL_TILES = wn.WgmmaDecodeTiles(rows=16, block_k=128, max_concurrent_steps=3)
WIDE_TILES = wn.WgmmaDecodeTiles(rows=8, block_k=64, max_concurrent_steps=2, block_n=128)  # two WGMMA M tiles a program


# (a_operand, decode): the warpgroup-semantics kernel in both operand forms, the lane-semantics "asm" decode
FORMS = [pytest.param("registers", "bits", id="registers"), pytest.param("smem", "bits", id="smem"),
         pytest.param("registers", "asm", id="registers-asm")]


def _tiles(base: wn.WgmmaDecodeTiles, a_operand: str, decode: str = "bits") -> wn.WgmmaDecodeTiles:
    return dataclasses.replace(base, a_operand=a_operand, decode=decode)


def test_asm_pair_decode_is_the_bits_decode_for_every_byte_in_every_position():
    """`e2m1_registers.pair_asm`'s Python model: byte p of a 32-bit word (the other bytes random)
    gives the f16 pair codes_times_2_pow_minus_14 gives its low and high nibble, for all 256 bytes
    and p = 0..3."""
    want = np.asarray(wn.codes_times_2_pow_minus_14(jnp.arange(16, dtype=jnp.int8).astype(jnp.int4))).view(np.uint16)
    rng = np.random.default_rng(3)
    for part in range(4):
        for byte in range(256):
            other = int(rng.integers(0, 2**32)) & ~(0xFF << (8 * part)) & 0xFFFFFFFF
            assert er.pair_reference(other | (byte << (8 * part)), part) == (want[byte & 0xF], want[byte >> 4]), (part, byte)
    assert "prmt.b32 t, $1, $2, 0xF6F2;" in er.pair_asm(2)
    with pytest.raises(ValueError, match="part=4 must be a byte index 0..3"):
        er.pair_asm(4)


def test_decoded_tile_is_scaled_operand_for_every_code_and_scale_byte():
    """All 256 code bytes x all 256 scale bytes: the kernel's decode (as XLA ops, the same
    functions the kernel traces) is dec(q) sf 2^-7 in f16, exactly; NaN scale bytes give NaN."""
    codes = jnp.tile(jnp.arange(256, dtype=jnp.uint8).reshape(1, 256), (256, 1))  # [N=256, K/2=256]
    scale_bytes = jnp.tile(jnp.arange(256, dtype=jnp.uint8)[:, None], (1, 32))  # row r: scale byte r
    weight = wn.pack_for_wgmma(codes[None], scale_bytes[None])
    got = np.asarray(wn.decoded_tile(weight.codes[0], weight.scales[0]))
    want = np.asarray(_operand(codes[None], jax.lax.bitcast_convert_type(scale_bytes, jnp.float8_e4m3fn)[None])[0],
                      np.float32)
    nan = np.isnan(want)
    assert got.dtype == np.float16 and np.array_equal(np.isnan(got), nan) and nan.sum() == 2 * 512  # 0x7F, 0xFF
    want_f16 = want[~nan] * np.float32(2.0**-pw.F16_TILE_SHIFT)
    assert np.array_equal(got[~nan].astype(np.float32), want_f16)
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want_f16))  # -0 codes stay -0


def test_the_layout_moves_bytes_and_gives_them_back():
    codes, scales = _weight(3, 64, 96, exact_sums=True)
    weight = wn.pack_for_wgmma(codes, scales)
    assert weight.codes.dtype == jnp.int4 and weight.codes.shape == (3, 64, 96)
    assert weight.scales.dtype == jnp.uint8 and weight.scales.shape == (3, 6, 64)
    # element 2j is byte j's low nibble, as stored
    lo = np.asarray(codes) & 0xF
    assert np.array_equal(np.asarray(weight.codes[..., 0::2].astype(jnp.int8)) & 0xF, lo)
    back_codes, back_scales = wn.unpack_wgmma_weight(weight)
    assert np.asarray(back_codes).tobytes() == np.asarray(codes).tobytes()
    assert np.asarray(back_scales).tobytes() == np.asarray(jax.lax.bitcast_convert_type(scales, jnp.uint8)).tobytes()


BACKENDS = [pytest.param(True, id="interpret"), pytest.param(False, id="compiled", marks=pytest.mark.gpu)]


@pytest.mark.parametrize(("a_operand", "decode"), FORMS)
@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_wgmma_weight_gemm_is_the_emulated_forward_bit_for_bit(case, interpret, a_operand, decode):
    if interpret and a_operand == "registers":
        pytest.skip("the interpreter's wgmma reads shared memory only (interpret mode runs a_operand='smem')")
    rows, k, n, sizes = CASES[case]
    codes, scales = _weight(len(sizes), n, k, exact_sums=True)
    x = _activations(rows, k, exact_sums=True)  # multiples of 1/8: exact in f16
    group_sizes = jnp.asarray(sizes, jnp.int32)
    want = grouped.ragged_matmul(x, _operand(codes, scales), group_sizes, gemm="xla", transpose_rhs=True)
    weight = wn.pack_for_wgmma(codes, scales)
    for tiles in (SMALL_TILES, TALL_TILES) + ((WIDE_TILES,) if n % WIDE_TILES.block_n == 0 else ()):
        got = wn.grouped_matmul_nvfp4_wgmma(x.astype(jnp.float16), weight, group_sizes, tiles=_tiles(tiles, a_operand, decode),
                                            interpret=interpret)
        assert got.dtype == jnp.float32 and got.shape == want.shape
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), tiles
    assert not np.asarray(got[sum(sizes):]).any() and np.asarray(got[:sum(sizes)]).any()


@pytest.mark.parametrize("interpret", BACKENDS)
def test_within_the_f32_accumulation_bound(interpret):
    rows, k, n, sizes = CASES["empty-middle-past-the-groups"]
    codes, scales = _weight(len(sizes), n, k)
    w = _operand(codes, scales)  # [E, N, K] bf16
    x16 = _activations(rows, k).astype(jnp.float16)  # standard normal bf16 values: exact in f16
    exact, magnitude = exact_matmul(x16, jnp.swapaxes(w, 1, 2), sizes)
    got = wn.grouped_matmul_nvfp4_wgmma(x16, wn.pack_for_wgmma(codes, scales), jnp.asarray(sizes, jnp.int32),
                                        tiles=SMALL_TILES, interpret=interpret)
    assert_within(got, exact, accumulation_bound(magnitude, k), "wgmma nvfp4 weight")


def test_a_nan_scale_makes_nan_only_its_experts_rows():
    rows, k, n, sizes = CASES["empty-middle-past-the-groups"]
    codes, scales = _weight(len(sizes), n, k, exact_sums=True)
    scale_bytes = np.array(jax.lax.bitcast_convert_type(scales, jnp.uint8))
    scale_bytes[2, 70, 3] = 0xFF  # expert 2, output column 70 (second column block), K block 3
    x = _activations(rows, k, exact_sums=True).astype(jnp.float16)
    got = np.asarray(wn.grouped_matmul_nvfp4_wgmma(x, wn.pack_for_wgmma(codes, jnp.asarray(scale_bytes)),
                                                   jnp.asarray(sizes, jnp.int32), tiles=SMALL_TILES, interpret=True))
    nan = np.zeros(got.shape, bool)
    nan[9:29, 70] = True  # expert 2's rows
    assert np.array_equal(np.isnan(got), nan)


def test_bad_operands_are_refused_with_what_is_valid():
    codes, scales = _weight(2, 64, 128, exact_sums=True)
    weight = wn.pack_for_wgmma(codes, scales)
    x = _activations(8, 128).astype(jnp.float16)
    sizes = jnp.asarray([4, 4], jnp.int32)
    with pytest.raises(TypeError, match="x must be float16"):
        wn.grouped_matmul_nvfp4_wgmma(x.astype(jnp.bfloat16), weight, sizes, interpret=True)
    with pytest.raises(ValueError, match="x has K=64 but the weight has K=128"):
        wn.grouped_matmul_nvfp4_wgmma(x[:, :64], weight, sizes, interpret=True)
    with pytest.raises(ValueError, match=r"group_sizes must be integers of shape \(2,\)"):
        wn.grouped_matmul_nvfp4_wgmma(x, weight, sizes[:1], interpret=True)
    with pytest.raises(TypeError, match="must be a WgmmaNvfp4Weight"):
        wn.grouped_matmul_nvfp4_wgmma(x, (codes, scales), sizes, interpret=True)
    narrow = wn.pack_for_wgmma(*_weight(2, 32, 128, exact_sums=True))
    with pytest.raises(ValueError, match="N=32 must be a multiple of block_n=64"):
        wn.grouped_matmul_nvfp4_wgmma(x, narrow, sizes, interpret=True)
    with pytest.raises(ValueError, match="N=64 must be a multiple of block_n=128"):
        wn.grouped_matmul_nvfp4_wgmma(x, weight, sizes, tiles=WIDE_TILES, interpret=True)
    for block_n in (32, 96, 320):
        with pytest.raises(ValueError, match=rf"block_n={block_n} must be a multiple of 64 in \[64, 256\]"):
            wn.WgmmaDecodeTiles(block_n=block_n)
    with pytest.raises(ValueError, match="K=128 must be a multiple of block_k=256"):
        wn.grouped_matmul_nvfp4_wgmma(x, weight, sizes, tiles=wn.WgmmaDecodeTiles(block_k=256), interpret=True)
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 64, 8\)"):
        wn.pack_for_wgmma(codes, scales[:, :, :2])
    with pytest.raises(TypeError, match="codes must be uint8"):
        wn.pack_for_wgmma(codes.astype(jnp.int8), scales)
    with pytest.raises(ValueError, match=r"rows=12 must be a multiple of 8"):
        wn.WgmmaDecodeTiles(rows=12)
    with pytest.raises(ValueError, match="block_k=48 must be a positive multiple of 32"):
        wn.WgmmaDecodeTiles(block_k=48)
    with pytest.raises(ValueError, match=r"a_operand='tmem'; valid options: \('registers', 'smem'\)"):
        wn.WgmmaDecodeTiles(a_operand="tmem")
    with pytest.raises(ValueError, match=r"decode='lut'; valid options: \('bits', 'asm'\)"):
        wn.WgmmaDecodeTiles(decode="lut")
    with pytest.raises(ValueError, match="a_operand must be 'registers'"):
        wn.WgmmaDecodeTiles(decode="asm", a_operand="smem")
    with pytest.raises(ValueError, match="decode='asm' runs compiled only"):
        wn.grouped_matmul_nvfp4_wgmma(x, weight, sizes, tiles=wn.WgmmaDecodeTiles(decode="asm"), interpret=True)
    if jax.default_backend() != "gpu":
        with pytest.raises(RuntimeError, match="no silent XLA fallback"):
            wn.grouped_matmul_nvfp4_wgmma(x, weight, sizes)


@pytest.mark.parametrize(("a_operand", "decode"), FORMS)
def test_lowers_to_mosaic_gpu_for_sm90(a_operand, decode):
    """On CPU CI: the compiled kernel (both operand forms, the "asm" decode in lane semantics, three
    launch shapes, the decode benchmark's 128-expert shape) goes through Mosaic GPU's layout inference and lowering for sm_90 (the arch
    Mosaic assumes without a device). It does not run ptxas; the `gpu` tests above do."""
    x = jax.ShapeDtypeStruct((128, 2048), jnp.float16)
    weight = wn.WgmmaNvfp4Weight(codes=jax.ShapeDtypeStruct((128, 768, 2048), jnp.int4),
                                 scales=jax.ShapeDtypeStruct((128, 128, 768), jnp.uint8))
    sizes = jax.ShapeDtypeStruct((128,), jnp.int32)
    for base in (wn.DEFAULT_TILES, wn.WgmmaDecodeTiles(rows=64, block_k=256, max_concurrent_steps=3),
                 wn.WgmmaDecodeTiles(block_n=128)):
        tiles = _tiles(base, a_operand, decode)
        text = jax.jit(lambda x, w, s: wn._grouped_call(x, w, s, tiles=tiles, interpret=False)).trace(
            x, weight, sizes).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text and wn.KERNEL_NAME in text, tiles
