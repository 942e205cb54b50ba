"""Grouped GEMM whose weight stays packed NVFP4 in HBM, dequantized in the kernel (Pallas Triton).

    y = grouped_matmul_nvfp4(x_RxK, codes_ExNxK2, scales_ExNxK16, sizes_E)  # f32 [R, N]
    y = grouped_matmul_bf16(x_RxK, w_ExNxK, sizes_E)                        # the same kernel, bf16 weight

Rows of group e (x sorted by group, dropless) times W_e^T, where W_e = dec(codes_e) * sf_e is the
exact bf16 operand of an NVFP4 weight quantized along K (`fp4rl.qlinear.quantize_weight` gives
w^T: codes [E, N, K/2], E4M3 scales [E, N, K/16]; docs/numerics.md §2). The global decode scale
stays an epilogue of the caller, as in `fp4rl.qlinear`. Rows past sum(sizes) are 0.

Why: on Hopper (no FP4 tensor cores) the emulated forward writes W's bf16 copy to HBM and reads
it back at every call. A decode step reads each expert's weight once for a handful of rows, so
that copy, not the FLOPs, is the step's cost. Here each program loads its [block_n, block_k]
tile of packed codes (half a byte per element, read as 32-bit words of 8 codes) and E4M3 scales
(1/16 byte), decodes it in registers and feeds the tensor cores in bf16: 3.6x fewer weight bytes
than bf16 and nothing written back. The bf16-weight form shares the kernel, so the benchmark compares like with like.

Schedule: rows are cut into `block_m` tiles that never straddle two groups (a group of s rows
has ceil(s / block_m) tiles); the tile list, computed with XLA ops (`tile_schedule`), has the
static length ceil(R / block_m) + E, and programs past the real tiles exit at once. The grid is
(tile, column block); every program walks K in `block_k` steps with an f32 accumulator.

Numerics: the dequantized tile equals `nvfp4.scaled_operand` bit for bit (codes by moving their
bits into an f16, `_codes_times_2_pow_minus_14`; scales by `block_math.e4m3_decode`; products of
at most 6 significant bits: exact in bf16; checked for every code and scale byte); products of
two bf16 are exact in f32, so the result differs from the XLA reference only by the order of
the f32 sums (tests compare inputs whose sums are exact bit for bit, others to f32 tolerance).

Backend: Pallas Triton, which JAX deprecates (docs/numerics.md §10); a float4 conversion does
not compile in Triton 3.6, so codes are decoded with integer ops. Compiled it needs a CUDA GPU
(no XLA fallback); `interpret=True` runs it on the CPU for the tests.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant.tunables import is_power_of_two
from pallas_kernels.nvfp4_quant.wrappers import require_gpu

KERNEL_NAME = "fp4rl_grouped_packed_weight_gemm"
DGRAD_KERNEL_NAME = "fp4rl_grouped_packed_weight_dgrad"
_DOT_NT = (((1,), (1,)), ((), ()))  # x [M, K] . w [N, K] -> [M, N]
_DOT_NN = (((1,), (0,)), ((), ()))  # g [M, N] . w [N, K] -> [M, K]


@dataclasses.dataclass(frozen=True)
class PackedGemmTiles:
    """Launch shape: block_m x block_n output tiles, K in block_k steps (Triton needs powers of
    two, and 16 or more for a tensor-core dot), `num_warps` per program, `num_stages` of
    software pipelining. The defaults are a starting point for decode batches (1-64 rows per
    expert), not tuned on a GPU yet; `experiments.bench_weight_gemm` times the alternatives."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or not is_power_of_two(value):
                raise ValueError(f"{name}={value} must be a power of two >= 16 (Triton tensor-core dot tiles)")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"num_warps={self.num_warps} and num_stages={self.num_stages} must be >= 1")

    def fit(self, n: int, k: int) -> "PackedGemmTiles":
        """These tiles with block_n / block_k shrunk, where needed, to the largest power of two
        that divides N / K (the caller checks the least block each kernel form needs)."""
        return dataclasses.replace(self, block_n=min(self.block_n, _pow2_divisor(n)),
                                   block_k=min(self.block_k, _pow2_divisor(k)))


def _pow2_divisor(size: int) -> int:
    return size & -size


DEFAULT_TILES = PackedGemmTiles()


def tile_schedule(group_sizes_E, num_rows: int, block_m: int):
    """Per row tile t (static count ceil(R / block_m) + E): (group, first row, the group's end
    row) int32; the tile covers rows [first, min(first + block_m, end)).

    Group g's rows [start_g, start_g + s_g) are cut into ceil(s_g / block_m) tiles; tiles past
    the last real one get end == first (no rows), so their programs do nothing.
    """
    sizes = jnp.asarray(group_sizes_E, jnp.int32)
    num_groups = sizes.shape[0]
    tiles = (sizes + block_m - 1) // block_m
    tile_end = jnp.cumsum(tiles)
    row_end = jnp.cumsum(sizes)
    row_start = row_end - sizes
    t = jnp.arange(pl.cdiv(num_rows, block_m) + num_groups, dtype=jnp.int32)
    # compare_all: one fused op, not a binary-search while loop (a host round trip per iteration)
    group = jnp.minimum(jnp.searchsorted(tile_end, t, side="right", method="compare_all"),
                        num_groups - 1).astype(jnp.int32)
    first = row_start[group] + (t - (tile_end - tiles)[group]) * block_m
    valid = t < tile_end[-1]
    first = jnp.where(valid, first, 0)
    end = jnp.where(valid, jnp.minimum(row_end[group], num_rows), 0)
    return group, first, end


F16_CODE_FACTOR = 2.0**14  # an E2M1 code's 4 bits placed in f16 bits [15] and [11:9] read as value * 2^-14
# The f16 form's weight tile is (dec(q) 2^-14) (sf 2^(14 - F16_TILE_SHIFT)) = dec(q) sf 2^-7:
# sf 2^7 <= 448 * 128 = 57344 fits f16, and dec(q) * sf is a multiple of 2^-10 (dec: of 0.5, sf: of 2^-9) of at most 6 significant bits
# and at most 6 * 448, so the tile, a multiple of 2^-17 below 21, is exact in f16 (step 2^-24).
F16_TILE_SHIFT = 7


def _shift(x, bits: int):
    """x << bits for bits >= 0, x >> -bits (logical) otherwise."""
    if bits >= 0:
        return lax.shift_left(x, np.uint32(bits))
    return lax.shift_right_logical(x, np.uint32(-bits))


def _f16_to_f32(bits_u32):
    return lax.bitcast_convert_type(bits_u32.astype(jnp.uint16), jnp.float16).astype(jnp.float32)


def _f16_halves(pair):
    """uint32 holding two f16 -> (low half, high half) as f16, by truncation (no conversion)."""
    as_f16 = lambda bits: lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.float16)  # noqa: E731
    return as_f16(pair & np.uint32(0xFFFF)), as_f16(lax.shift_right_logical(pair, np.uint32(16)))


def _codes_times_2_pow_minus_14(words, dtype=jnp.float32):
    """uint32 [n, w] of packed E2M1 codes -> `dtype` (float32 or float16) [n, 8 w]: dec(q) * 2^-14
    in element order (nibble i of a little-endian word is element 8 j + i), exactly.

    Each code becomes an f16 by moving bits: the sign to f16 bit 15, the 3 magnitude bits to
    bits [11:9] (f16's low exponent bits and top mantissa bit). E2M1 has exponent bias 1 and
    f16 bias 15, and both formats' subnormals (exponent field 0) scale alike, so every code, 0.5
    included (an f16 subnormal, converted exactly), reads as its value times 2^-14. Codes i and
    i + 4 of a word sit 16 bits apart, so one pair of shifts and masks makes both halves of a
    32-bit word at once (two f16); pairwise stacks (Triton's `join`) then interleave the 8 code
    planes back into element order."""
    lo, hi = [], []
    for i in range(4):
        pair = (_shift(words, 9 - 4 * i) & np.uint32(0x0E000E00)) | (_shift(words, 12 - 4 * i) & np.uint32(0x80008000))
        if dtype == jnp.float16:
            code_i, code_i4 = _f16_halves(pair)
        else:
            code_i, code_i4 = _f16_to_f32(pair), _f16_to_f32(lax.shift_right_logical(pair, np.uint32(16)))
        lo.append(code_i)
        hi.append(code_i4)

    def interleave(planes):  # planes in element order -> [n, w, len(planes)], flattened
        if len(planes) == 1:
            return planes[0][..., None]
        even, odd = interleave(planes[0::2]), interleave(planes[1::2])
        return jnp.stack([even, odd], axis=-1).reshape(*even.shape[:-1], 2 * even.shape[-1])

    return interleave(lo + hi).reshape(words.shape[0], 8 * words.shape[1])


def dequantized_tile(code_words, scale_bytes, dtype=jnp.bfloat16):
    """Codes as uint32 words [n, k/8] (8 codes each, `codes_as_words`) and E4M3 scale bytes
    uint8 [n, k/16] -> [n, k] of `dtype`, exactly:
    - bfloat16: dec(q) * sf, the bytes of `nvfp4.scaled_operand` (a NaN scale gives NaN for its 16
      elements). (dec(q) 2^-14) (sf 2^14) is exact in f32: both factors are, and the product has
      at most 6 significant bits.
    - float16: dec(q) * sf * 2^-F16_TILE_SHIFT, formed in f16 from the f16 bits of the codes
      without a conversion (one f16 multiply per element; exact, see F16_TILE_SHIFT)."""
    n, words = code_words.shape
    sf = bm.e4m3_decode(scale_bytes.astype(jnp.int32))
    if dtype == jnp.float16:
        dec = _codes_times_2_pow_minus_14(code_words, jnp.float16).reshape(n, words // 2, bm.BLOCK)
        sf16 = (sf * np.float32(F16_CODE_FACTOR * 2.0**-F16_TILE_SHIFT)).astype(jnp.float16)  # sf 2^7: exact
        return (dec * sf16[..., None]).reshape(n, 8 * words)
    dec = _codes_times_2_pow_minus_14(code_words).reshape(n, words // 2, bm.BLOCK)
    return (dec * (sf * np.float32(F16_CODE_FACTOR))[..., None]).reshape(n, 8 * words).astype(jnp.bfloat16)


def codes_as_words(codes):
    """uint8 [..., K/2] -> uint32 [..., K/8], the same bytes: the kernel loads 8 codes per word
    (byte loads would take one load instruction per 2 codes)."""
    *lead, half = codes.shape
    return lax.bitcast_convert_type(codes.reshape(*lead, half // 4, 4), jnp.uint32)


def _row_tile(group_ref, first_ref, end_ref, block_m: int):
    """This program's row tile (`tile_schedule`): its group, first and end row, and which of its
    block_m rows are real."""
    t = pl.program_id(0)
    group, first, end = group_ref[t], first_ref[t], end_ref[t]
    return group, first, end, (first + jnp.arange(block_m)) < end


def _kernel(group_ref, first_ref, end_ref, x_ref, *refs, packed: bool, tiles: PackedGemmTiles, k: int):
    out_ref = refs[-1]
    bm_, bn, bk = tiles.block_m, tiles.block_n, tiles.block_k
    group, first, end, row_ok = _row_tile(group_ref, first_ref, end_ref, bm_)
    n0 = pl.program_id(1) * bn

    @pl.when(first < end)
    def _():
        def load_x(k0):
            return plgpu_triton.load(x_ref.at[pl.ds(first, bm_), pl.ds(k0, bk)], mask=row_ok[:, None], other=0.0)

        def body(i, acc):
            k0 = i * bk
            if packed:
                w = _weight_tile(refs, group, n0, bn, k0, bk, x_ref.dtype)
            else:
                w = refs[0][group, pl.ds(n0, bn), pl.ds(k0, bk)]
            return acc + lax.dot_general(load_x(k0), w, _DOT_NT, preferred_element_type=jnp.float32)

        acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm_, bn), jnp.float32))
        if packed and x_ref.dtype == jnp.float16:
            acc = acc * np.float32(2.0**F16_TILE_SHIFT)  # the f16 tile's 2^-7 back out (a power of two: exact)
        plgpu_triton.store(out_ref.at[pl.ds(first, bm_), pl.ds(n0, bn)], acc, mask=row_ok[:, None])


def _weight_tile(refs, group, n0: int, bn: int, k0: int, bk: int, dtype):
    """Rows [n0, n0 + bn), columns [k0, k0 + bk) of expert `group`'s dequantized weight [N, K]."""
    return dequantized_tile(refs[0][group, pl.ds(n0, bn), pl.ds(k0 // 8, bk // 8)],
                            refs[1][group, pl.ds(n0, bn), pl.ds(k0 // bm.BLOCK, bk // bm.BLOCK)], dtype)


def _dgrad_kernel(group_ref, first_ref, end_ref, g_ref, codes_ref, scales_ref, out_ref, *, tiles: PackedGemmTiles,
                  n: int):
    """The transposed product g [rows, N] @ W_e [N, K]: program (tile, j) owns output columns
    [j block_k, (j + 1) block_k) and walks N in block_n steps over the same dequantized tiles as
    the forward (the weight stays laid out along K: only the dot's contraction changes)."""
    bm_, bn, bk = tiles.block_m, tiles.block_n, tiles.block_k
    group, first, end, row_ok = _row_tile(group_ref, first_ref, end_ref, bm_)
    k0 = pl.program_id(1) * bk

    @pl.when(first < end)
    def _():
        def body(i, acc):
            n0 = i * bn
            g = plgpu_triton.load(g_ref.at[pl.ds(first, bm_), pl.ds(n0, bn)], mask=row_ok[:, None], other=0.0)
            w = _weight_tile((codes_ref, scales_ref), group, n0, bn, k0, bk, g_ref.dtype)
            return acc + lax.dot_general(g, w, _DOT_NN, preferred_element_type=jnp.float32)

        acc = lax.fori_loop(0, n // bn, body, jnp.zeros((bm_, bk), jnp.float32))
        plgpu_triton.store(out_ref.at[pl.ds(first, bm_), pl.ds(k0, bk)], acc, mask=row_ok[:, None])


@functools.partial(jax.jit, static_argnames=("tiles", "interpret", "dgrad"))
def _grouped_call(x_RxK, weights, group_sizes_E, *, tiles: PackedGemmTiles, interpret, dgrad: bool = False):
    """The forward x [R, K] -> [R, N], or with `dgrad` (packed weights only) g [R, N] -> [R, K]."""
    rows, inner = x_RxK.shape
    n = weights[0].shape[1]
    packed = len(weights) == 2
    group, first, end = tile_schedule(group_sizes_E, rows, tiles.block_m)
    # block_m padding rows: a tile's window may run past the last row (masked in the kernel; the
    # interpreter's dynamic slices would clamp instead, so the window must lie inside the array)
    x = jnp.pad(x_RxK, ((0, tiles.block_m), (0, 0)))
    if dgrad:
        k = 8 * weights[0].shape[2]
        kernel, columns, blocks = functools.partial(_dgrad_kernel, tiles=tiles, n=n), k, k // tiles.block_k
    else:
        kernel, columns, blocks = functools.partial(_kernel, packed=packed, tiles=tiles, k=inner), n, n // tiles.block_n
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows + tiles.block_m, columns), jnp.float32),
        grid=(group.shape[0], blocks),
        compiler_params=plgpu_triton.CompilerParams(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
        interpret=interpret,
        name=DGRAD_KERNEL_NAME if dgrad else KERNEL_NAME,
    )(group, first, end, x, *weights)[:rows]
    # rows no tile wrote (past sum(sizes)) hold whatever the buffer held: zero them
    covered = jnp.arange(rows) < jnp.sum(jnp.asarray(group_sizes_E, jnp.int32))
    return jnp.where(covered[:, None], out, jnp.float32(0))


def check_group_sizes(what: str, group_sizes_E, num_groups: int):
    """Raise, naming the valid form, unless `group_sizes_E` are integers of shape (num_groups,)."""
    if jnp.shape(group_sizes_E) != (num_groups,) or not jnp.issubdtype(jnp.result_type(group_sizes_E), jnp.integer):
        raise ValueError(f"{what}: group_sizes must be integers of shape ({num_groups},), got "
                         f"{jnp.result_type(group_sizes_E)} {jnp.shape(group_sizes_E)}")


def _check(what: str, x_RxK, weight_shape, group_sizes_E, tiles: PackedGemmTiles, k: int, least_k: int,
           x_dtypes=(jnp.bfloat16,)):
    if jnp.ndim(x_RxK) != 2 or jnp.result_type(x_RxK) not in tuple(map(jnp.dtype, x_dtypes)):
        names = " or ".join(jnp.dtype(d).name for d in x_dtypes)
        raise TypeError(f"{what}: x must be {names} [R, K], got {jnp.result_type(x_RxK)} {jnp.shape(x_RxK)}")
    if x_RxK.shape[1] != k:
        raise ValueError(f"{what}: x has K={x_RxK.shape[1]} but the weight has K={k}")
    num_groups, n = weight_shape[0], weight_shape[1]
    check_group_sizes(what, group_sizes_E, num_groups)
    return _fitted_tiles(what, tiles, n, k, least_k)


def _fitted_tiles(what: str, tiles: PackedGemmTiles, n: int, k: int, least_k: int) -> PackedGemmTiles:
    """`tiles` fitted to a weight [N, K], after checking the widths the kernels' tiles need."""
    for dim, size, least in (("N", n, 16), ("K", k, least_k)):
        if _pow2_divisor(size) < least:
            raise ValueError(f"{what}: {dim}={size} must be a multiple of {least} (Triton dot tiles are powers of two "
                             f">= 16{'; K holds whole 16-element NVFP4 blocks in whole 32-bit words' if least == 32 else ''})")
    if tiles.block_k < least_k:
        raise ValueError(f"{what}: block_k={tiles.block_k} must be >= {least_k}")
    return tiles.fit(n, k)


def check_packed_weight(what: str, codes_ExNxK2, scales_ExNxK16) -> tuple[int, int, int]:
    """(E, N, K) of an NVFP4 expert stack w^T given as codes uint8 [E, N, K/2] and E4M3 scales
    (float8_e4m3fn or their bytes) [E, N, K/16]; raises, naming the valid form, otherwise."""
    if jnp.result_type(codes_ExNxK2) != jnp.uint8 or jnp.ndim(codes_ExNxK2) != 3:
        raise TypeError(f"{what}: codes must be uint8 [E, N, K/2], got {jnp.result_type(codes_ExNxK2)} "
                        f"{jnp.shape(codes_ExNxK2)}")
    e, n, half = codes_ExNxK2.shape
    if jnp.shape(scales_ExNxK16) != (e, n, 2 * half // bm.BLOCK):
        raise ValueError(f"{what}: scales must have shape {(e, n, 2 * half // bm.BLOCK)}, got {jnp.shape(scales_ExNxK16)}")
    if jnp.result_type(scales_ExNxK16) not in (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.uint8)):
        raise TypeError(f"{what}: scales must be float8_e4m3fn or uint8, got {jnp.result_type(scales_ExNxK16)}")
    return e, n, 2 * half


def _packed_weight_bytes(what: str, codes_ExNxK2, scales_ExNxK16):
    """Checked codes and scale bytes -> (E, N, K, codes as uint32 words, scales as uint8)."""
    e, n, k = check_packed_weight(what, codes_ExNxK2, scales_ExNxK16)
    return e, n, k, codes_as_words(codes_ExNxK2), lax.bitcast_convert_type(scales_ExNxK16, jnp.uint8)


def grouped_matmul_nvfp4(x_RxK, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, tiles: PackedGemmTiles | None = None,
                         interpret: bool = False):
    """f32 [R, N]: rows of group e times (dec(codes[e]) * scales[e])^T; rows past the groups 0.

    codes: uint8 [E, N, K/2] (even element in the low nibble); scales: float8_e4m3fn (or its
    bytes, uint8) [E, N, K/16]. sum(group_sizes) <= R is the caller's contract.
    x: bfloat16, or float16: then the weight tile is formed in f16 (no f16 -> f32 -> bf16
    conversions: 17% fewer instructions in the K loop) and the tensor cores multiply f16. The
    products are the same, so is the result (up to the f32 sums' order), wherever x is exact in
    f16, as the bf16 values of an NVFP4-quantized activation are (`fp4rl.grouped.ragged_matmul_nvfp4`)."""
    e, n, k, words, scale_bytes = _packed_weight_bytes("grouped_matmul_nvfp4", codes_ExNxK2, scales_ExNxK16)
    fitted = _check("grouped_matmul_nvfp4", x_RxK, (e, n), group_sizes_E, tiles or DEFAULT_TILES, k, 32,
                    x_dtypes=(jnp.bfloat16, jnp.float16))
    require_gpu(interpret, "grouped_matmul_nvfp4")
    return _grouped_call(x_RxK, (words, scale_bytes), group_sizes_E, tiles=fitted, interpret=interpret)


def grouped_dgrad_nvfp4(g_RxN, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, tiles: PackedGemmTiles | None = None,
                        interpret: bool = False):
    """f32 [R, K]: rows of group e times dec(codes[e]) * scales[e] (the dgrad of the forward above:
    g @ W_e with W_e [N, K] as stored); rows past the groups 0.

    The weight is read packed as in the forward (its codes and scales laid out along K), so the
    backward of an NVFP4 site forms no bf16 copy of it either. g: bfloat16 (a cotangent has no
    exact f16 form); the weight tile is formed in bf16, exactly, and the products are exact in f32:
    the result is `g @ DQ(W)` up to the order of the f32 sums."""
    e, n, k, words, scale_bytes = _packed_weight_bytes("grouped_dgrad_nvfp4", codes_ExNxK2, scales_ExNxK16)
    if jnp.ndim(g_RxN) != 2 or jnp.result_type(g_RxN) != jnp.bfloat16:
        raise TypeError(f"grouped_dgrad_nvfp4: g must be bfloat16 [R, N], got {jnp.result_type(g_RxN)} {jnp.shape(g_RxN)}")
    if g_RxN.shape[1] != n:
        raise ValueError(f"grouped_dgrad_nvfp4: g has N={g_RxN.shape[1]} but the weight has N={n}")
    check_group_sizes("grouped_dgrad_nvfp4", group_sizes_E, e)
    fitted = _fitted_tiles("grouped_dgrad_nvfp4", tiles or DEFAULT_TILES, n, k, 32)
    require_gpu(interpret, "grouped_dgrad_nvfp4")
    return _grouped_call(g_RxN, (words, scale_bytes), group_sizes_E, tiles=fitted, interpret=interpret, dgrad=True)


def grouped_matmul_bf16(x_RxK, w_ExNxK, group_sizes_E, *, tiles: PackedGemmTiles | None = None,
                        interpret: bool = False):
    """f32 [R, N]: rows of group e times w[e]^T (w bf16 [E, N, K]); the same kernel as
    `grouped_matmul_nvfp4` with the weight read as bf16 (its baseline)."""
    if jnp.result_type(w_ExNxK) != jnp.bfloat16 or jnp.ndim(w_ExNxK) != 3:
        raise TypeError(f"grouped_matmul_bf16: w must be bfloat16 [E, N, K], got {jnp.result_type(w_ExNxK)} "
                        f"{jnp.shape(w_ExNxK)}")
    e, n, k = w_ExNxK.shape
    fitted = _check("grouped_matmul_bf16", x_RxK, (e, n), group_sizes_E, tiles or DEFAULT_TILES, k, 16)
    require_gpu(interpret, "grouped_matmul_bf16")
    return _grouped_call(x_RxK, (w_ExNxK,), group_sizes_E, tiles=fitted, interpret=interpret)


__all__ = ["DEFAULT_TILES", "DGRAD_KERNEL_NAME", "KERNEL_NAME", "PackedGemmTiles", "codes_as_words", "dequantized_tile",
           "grouped_dgrad_nvfp4", "grouped_matmul_bf16", "grouped_matmul_nvfp4", "tile_schedule"]
