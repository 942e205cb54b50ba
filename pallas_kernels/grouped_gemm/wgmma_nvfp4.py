"""Weight-only NVFP4 grouped GEMM for decode on Hopper: the weight as WGMMA's register operand (Mosaic GPU).

    weight = pack_for_wgmma(codes_ExNxK2, scales_ExNxK16)        # the layout: a transpose of the scale bytes
    y = grouped_matmul_nvfp4_wgmma(x_RxK_f16, weight, sizes_E)   # f32 [R, N]

Rows of group e (x sorted by group, dropless) times W_e^T with W_e = dec(codes_e) * sf_e, the
semantics of `packed_weight.grouped_matmul_nvfp4` (its f16 form; rows past sum(sizes) are 0).

Why another kernel: the Triton packed kernel reads 3.6x fewer weight bytes than bf16 yet runs at
half the best bf16 kernel's speed at decode sizes (`benchmarks/bench_weight_gemm.md`): its
dequantization is a dependent chain between the loads and the MMA that Triton's pipeliner does
not overlap. Here the schedule is explicit:
- swap A and B: y^T = W^T x^T. A program's output features (64 or a multiple: one warpgroup,
  block_n / 64 WGMMAs per K block) are WGMMA's M (the weight is
  the A operand, which WGMMA may read from registers), the row tile (8-64 rows of one expert) is
  its N, so a decode batch of a few rows per expert wastes no tensor-core rows;
- a TMA pipeline (`max_concurrent_steps` stages) streams the packed codes, the scale bytes and
  the x tile into shared memory ahead of the math;
- the codes are read as 4-bit integers, 8 per 32-bit shared-memory load
  (`Layout.WGMMA_UPCAST_4X`), moved into WGMMA's operand layout while still 4-bit (two warp
  shuffles per 8 codes, Mosaic's relayout), and decoded in registers by moving bits: an E2M1
  code's sign to f16 bit 15 and its 3 magnitude bits to bits [11:9] reads as dec(q) 2^-14
  (E2M1's exponent bias 1 against f16's 15; both formats' subnormals scale alike, so 0.5 is
  exact too). Each 16-column block is then multiplied by its row vector of scales,
  sf 2^7 in f16 (the E4M3 byte's bits moved into an f16 the same way), and goes to WGMMA with
  no shared-memory round trip.

Two decodes of the same tile (`WgmmaDecodeTiles.decode`): "bits" as above, in Mosaic's warpgroup
semantics, where the bit moves are 16-bit integer operations on each element; "asm" in lane
semantics, five 32-bit instructions per pair of codes written as inline PTX (`e2m1_registers`:
Marlin's approach within the relayout Mosaic already does), compiled only.

Layout (`pack_for_wgmma`, part of the packed weight, not of the numerics): the codes are the
packed bytes read as int4 [E, N, K] (element 2j in the low nibble of byte j, as stored); the scales
are transposed to [E, K/16, N] so that a K block's scales for a program's features are one contiguous row.
`unpack_wgmma_weight` gives back the original bytes.

Numerics: the operand tile is dec(q) sf 2^-7 in f16, exact for every code and finite scale byte
(at most 6 significant bits, a multiple of 2^-17 below 21; `packed_weight.F16_TILE_SHIFT`); a NaN
scale byte (0x7F, 0xFF) gives NaN for its 16 elements, as `nvfp4.scaled_operand`. x must be f16:
the model's form, where x is an NVFP4-quantized activation's operand (exact in f16). The products
of two f16 are exact in f32, the accumulator is scaled back by 2^7 (exact), so the result differs
from the XLA reference only by the order of the f32 sums.

Rows: each row tile holds rows of one expert only. The caller's rows are gathered into a padded
array of ceil(R / rows) + E tiles (`packed_weight.tile_schedule`, padding rows 0) and the result
gathered back (XLA gathers, small at decode sizes), so the kernel never stores a partial tile.
Its output is y^T per tile ([N, padded rows]), the accumulator as WGMMA leaves it.

Interpret mode (CPU): the Mosaic GPU interpreter's wgmma reads its operands from shared memory
only, so there the decoded tile is stored to a shared-memory scratch and WGMMA reads it back
(`a_operand="smem"`; the decode math is the same code). Compiled, `a_operand` selects either
form (the registers by default). No XLA fallback: compiled it needs a CUDA GPU (sm_90).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.grouped_gemm import e2m1_registers
from pallas_kernels.grouped_gemm.packed_weight import F16_TILE_SHIFT, check_group_sizes, check_packed_weight, tile_schedule
from pallas_kernels.grouped_gemm.ragged_dot import interpret_params, store_tile
from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant.wrappers import require_gpu

KERNEL_NAME = "fp4rl_grouped_nvfp4_wgmma"
WARPGROUP_ROWS = 64  # WGMMA's M: a program's output features are a multiple of it (`WgmmaDecodeTiles.block_n`)
A_OPERANDS = ("registers", "smem")
# How the codes become f16 (the same tile either way): "bits" with 16-bit integer operations per
# element (warpgroup semantics); "asm" five 32-bit instructions per pair of codes (`e2m1_registers`,
# lane semantics, compiled only: the interpreter does not run inline Mosaic GPU code).
DECODES = ("bits", "asm")
# A shared-memory tile of 16-bit values stored or read 16 columns (one NVFP4 block) at a time: 8x16
# tiles with a 32-byte swizzle, so that each 16-column block is a whole number of tiles.
BLOCK_TILE_TRANSFORMS = (plgpu.TilingTransform((8, bm.BLOCK)), plgpu.SwizzleTransform(32))


@dataclasses.dataclass(frozen=True)
class WgmmaDecodeTiles:
    """`rows`: rows of one expert per tile (WGMMA's N: a multiple of 8, at most 256); `block_k`:
    the contraction per pipeline step (a multiple of 32: the 4-bit loads' tile); `block_n`: output
    features per program (a multiple of 64, WGMMA's M: its one warpgroup issues block_n / 64 WGMMAs
    per 16-column block, so each pipeline step moves and decodes block_n / 64 times the bytes, with
    independent decode chains, in block_n / 64 times fewer programs); `max_concurrent_steps`:
    TMA pipeline stages; `a_operand`: where WGMMA reads the decoded weight tile ("registers" or
    "smem"; interpret mode always uses "smem"); `decode`: how the codes become f16 (`DECODES`;
    "asm" with the registers form only). The defaults are a starting point for 1-8 rows per expert
    (`experiments.bench_weight_gemm` times the alternatives)."""

    rows: int = 8
    block_k: int = 128
    max_concurrent_steps: int = 4
    block_n: int = WARPGROUP_ROWS
    a_operand: str = "registers"
    decode: str = "bits"

    def __post_init__(self):
        if self.rows < 8 or self.rows % 8 or self.rows > 256:
            raise ValueError(f"rows={self.rows} must be a multiple of 8 in [8, 256] (WGMMA's N)")
        if self.block_k < 32 or self.block_k % 32:
            raise ValueError(f"block_k={self.block_k} must be a positive multiple of 32 (the 4-bit loads' tile)")
        if self.block_n < WARPGROUP_ROWS or self.block_n % WARPGROUP_ROWS or self.block_n > 256:
            raise ValueError(f"block_n={self.block_n} must be a multiple of {WARPGROUP_ROWS} in [64, 256] (WGMMA's M)")
        if self.max_concurrent_steps < 1:
            raise ValueError(f"max_concurrent_steps={self.max_concurrent_steps} must be >= 1")
        if self.a_operand not in A_OPERANDS:
            raise ValueError(f"a_operand={self.a_operand!r}; valid options: {A_OPERANDS}")
        if self.decode not in DECODES:
            raise ValueError(f"decode={self.decode!r}; valid options: {DECODES}")
        if self.decode == "asm" and self.a_operand != "registers":
            raise ValueError("decode='asm' hands the tile to WGMMA from registers: a_operand must be 'registers'")


DEFAULT_TILES = WgmmaDecodeTiles()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WgmmaNvfp4Weight:
    """An NVFP4 expert stack laid out for this kernel: codes int4 [E, N, K] (the packed bytes),
    E4M3 scale bytes uint8 [E, K/16, N]."""

    codes: jax.Array
    scales: jax.Array

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K) of the weight W^T it holds."""
        return tuple(self.codes.shape)


def pack_for_wgmma(codes_ExNxK2, scales_ExNxK16) -> WgmmaNvfp4Weight:
    """The kernel's layout of `qlinear.quantize_weight`'s w^T: codes uint8 [E, N, K/2] (even element
    in the low nibble) and scales float8_e4m3fn (or their bytes) [E, N, K/16]. Bytes are moved, not
    changed (`unpack_wgmma_weight` inverts it)."""
    e, n, k = check_packed_weight("pack_for_wgmma", codes_ExNxK2, scales_ExNxK16)
    if k % bm.BLOCK:
        raise ValueError(f"pack_for_wgmma: K={k} must be whole 16-element NVFP4 blocks")
    codes = lax.bitcast_convert_type(codes_ExNxK2, jnp.int4).reshape(e, n, k)
    scales = jnp.swapaxes(lax.bitcast_convert_type(scales_ExNxK16, jnp.uint8), 1, 2)
    return WgmmaNvfp4Weight(codes=codes, scales=scales)


def check_weight(what: str, weight) -> tuple[int, int, int]:
    """(E, N, K) of a `WgmmaNvfp4Weight`; a TypeError naming `pack_for_wgmma` for anything else."""
    if not isinstance(weight, WgmmaNvfp4Weight):
        raise TypeError(f"{what}: weight must be a WgmmaNvfp4Weight (pack_for_wgmma), got {type(weight).__name__}")
    return weight.shape


def unpack_wgmma_weight(weight: WgmmaNvfp4Weight):
    """(codes uint8 [E, N, K/2], scale bytes uint8 [E, N, K/16]): the bytes `pack_for_wgmma` was given."""
    e, n, k = weight.codes.shape
    codes = lax.bitcast_convert_type(weight.codes.reshape(e, n, k // 2, 2), jnp.uint8)
    return codes, jnp.swapaxes(weight.scales, 1, 2)


def codes_times_2_pow_minus_14(codes_i4):
    """int4 E2M1 codes -> f16 dec(q) 2^-14, exactly, by moving bits (no conversion instruction):
    the sign (bit 3, sign-extended to bit 15) stays, the 3 magnitude bits go to f16 bits [11:9]."""
    n = codes_i4.astype(jnp.int16)
    bits = (n & jnp.int16(-0x8000)) | lax.shift_left(n & jnp.int16(7), jnp.int16(9))
    return lax.bitcast_convert_type(bits, jnp.float16)


def scales_times_2_pow_7(scale_bytes):
    """E4M3 scale bytes (uint8) -> f16 sf 2^F16_TILE_SHIFT, exactly; NaN for the NaN bytes 0x7F/0xFF.

    The byte's sign goes to f16 bit 15 and its 7 other bits to bits [13:7]: E4M3's exponent bias
    7 against f16's 15 makes that sf 2^-8 (subnormals included), and 2^15 more is sf 2^7 <= 57344."""
    s = scale_bytes.astype(jnp.uint16)
    magnitude = s & jnp.uint16(0x7F)
    bits = lax.shift_left(s & jnp.uint16(0x80), jnp.uint16(8)) | lax.shift_left(magnitude, jnp.uint16(7))
    sf = lax.bitcast_convert_type(bits, jnp.float16) * jnp.float16(2.0 ** (8 + F16_TILE_SHIFT))
    return jnp.where(magnitude == jnp.uint16(0x7F), jnp.float16(jnp.nan), sf)


def decoded_tile(codes_i4, scale_bytes_T):
    """The operand tile the kernel forms, as XLA ops (its reference): codes int4 [n, k] and scale
    bytes [k/16, n] -> f16 [n, k] = dec(q) sf 2^-7."""
    n, k = codes_i4.shape
    dec = codes_times_2_pow_minus_14(codes_i4).reshape(n, k // bm.BLOCK, bm.BLOCK)
    return (dec * scales_times_2_pow_7(scale_bytes_T).T[..., None]).reshape(n, k)


def decoded_column_blocks(codes_smem, scales_smem, dtype, decode: str = "bits") -> list:
    """In a Mosaic GPU kernel: a weight tile's codes (int4 [r, c] in shared memory, r a multiple of
    64, c of 32) and scale bytes ([c/16, r]) -> its c/16 blocks of 16 columns, [r, 16] each, in
    registers (WGMMA's layout):
    - float16: dec(q) sf 2^-F16_TILE_SHIFT (the caller scales its f32 result by 2^F16_TILE_SHIFT);
    - bfloat16: dec(q) sf. dec(q) 2^-14 goes from f16 to bf16 (exact: at most 2 significant bits, no
      bf16 subnormal) and meets sf 2^14 in bf16, so no operand or product is subnormal.
    8 codes per 32-bit shared-memory load, moved into WGMMA's layout while 4-bit. `decode="asm"`
    (`DECODES`; float16, in a lane-semantics kernel) decodes by `e2m1_registers`."""
    # "asm" runs in lane semantics, which infers no layouts: plain scale loads (the transfer planner
    # finds no conflict-free pattern for these untransformed tiles) and an explicit broadcast
    lane = decode == "asm"
    if lane and dtype != jnp.float16:
        raise ValueError(f"decode='asm' forms a float16 tile, not {jnp.dtype(dtype).name}")
    if lane:
        dec = e2m1_registers.load_and_decode(codes_smem, tuple(codes_smem.shape))  # = codes_times_2_pow_minus_14
    else:
        codes = plgpu.layout_cast(plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_UPCAST_4X), plgpu.Layout.WGMMA)
        dec = codes_times_2_pow_minus_14(codes)  # f16 [r, c]
    blocks = []
    for b in range(codes_smem.shape[1] // bm.BLOCK):
        sf = scales_times_2_pow_7(plgpu.load(scales_smem.at[b], layout=plgpu.Layout.WGMMA.reduce(1), optimized=not lane))
        block = dec[:, b * bm.BLOCK:(b + 1) * bm.BLOCK]
        if dtype == jnp.bfloat16:
            sf = (sf.astype(jnp.float32) * jnp.float32(2.0 ** (14 - F16_TILE_SHIFT))).astype(jnp.bfloat16)
            block = block.astype(jnp.bfloat16)
        blocks.append(block * (lax.broadcast_in_dim(sf, block.shape, (0,)) if lane else sf[:, None]))
    return blocks


def _kernel(group_gmem, live_gmem, codes_gmem, scales_gmem, x_gmem, out_gmem, a_smem=None, *, k: int,
            tiles: WgmmaDecodeTiles):
    rows, bk, bn = tiles.rows, tiles.block_k, tiles.block_n
    t, nb = lax.axis_index("tile"), lax.axis_index("col")
    group = group_gmem[t]

    def step(_, codes_smem, scales_smem, x_smem, acc_ref):
        for b, a in enumerate(decoded_column_blocks(codes_smem, scales_smem, jnp.float16, tiles.decode)):
            if a_smem is not None:  # interpret mode, or a_operand="smem"
                a_smem[b] = a
                plgpu.commit_smem()
                a = a_smem.at[b]
            plgpu.wgmma(acc_ref, a, x_smem.at[:, pl.ds(b * bm.BLOCK, bm.BLOCK)].T)
        plgpu.wgmma_wait(0)  # the registers (or the scratch) of this step's tile are free again

    @pl.when(live_gmem[t] != 0)  # padding tiles (no rows) do nothing: their output is never read
    def _():
        def acc_scope(acc_ref):
            plgpu.emit_pipeline(
                functools.partial(step, acc_ref=acc_ref),
                grid=(k // bk,),
                in_specs=[plgpu.BlockSpec((bn, bk), lambda ki: (nb, ki)),
                          plgpu.BlockSpec((bk // bm.BLOCK, bn), lambda ki: (ki, nb)),
                          plgpu.BlockSpec((rows, bk), lambda ki: (t, ki), transforms=_x_transforms(tiles))],
                max_concurrent_steps=tiles.max_concurrent_steps,
            )(codes_gmem.at[group], scales_gmem.at[group], x_gmem)
            return acc_ref[...]

        acc = pl.run_scoped(acc_scope, plgpu.ACC((bn, rows)))
        acc = acc * jnp.float32(2.0**F16_TILE_SHIFT)  # the tile's 2^-7 back out (a power of two: exact)
        store_tile(acc, jnp.float32, lambda o_smem: plgpu.copy_smem_to_gmem(
            o_smem, out_gmem.at[pl.ds(nb * bn, bn), pl.ds(t * rows, rows)]))


def _x_transforms(tiles: WgmmaDecodeTiles) -> tuple:
    """The x tile's shared-memory transforms: inferred in warpgroup semantics; in lane semantics
    ("asm") WGMMA's B operand needs them stated, and each 16-wide K block is a slice of it."""
    return BLOCK_TILE_TRANSFORMS if tiles.decode == "asm" else ()


def _padded_rows(x_RxK, group_sizes_E, rows: int):
    """x gathered into tiles of one group each (`tile_schedule`; padding rows 0), each tile's group
    and whether it holds rows, and for every row of x its padded position (and whether it is in a group)."""
    num_rows = x_RxK.shape[0]
    group, first, end = tile_schedule(group_sizes_E, num_rows, rows)
    src = first[:, None] + jnp.arange(rows, dtype=jnp.int32)  # [T, rows]
    real = src < end[:, None]
    x_pad = jnp.where(real[..., None], x_RxK[jnp.minimum(src, num_rows - 1)], jnp.zeros((), x_RxK.dtype))
    sizes = jnp.asarray(group_sizes_E, jnp.int32)
    row_end = jnp.cumsum(sizes)
    tile_start = jnp.cumsum((sizes + rows - 1) // rows) - (sizes + rows - 1) // rows
    r = jnp.arange(num_rows, dtype=jnp.int32)
    g = jnp.minimum(jnp.searchsorted(row_end, r, side="right", method="compare_all"), sizes.shape[0] - 1)
    within = r - (row_end - sizes)[g]
    position = (tile_start[g] + within // rows) * rows + within % rows
    return x_pad.reshape(-1, x_RxK.shape[1]), group, (end > first).astype(jnp.int32), position, r < row_end[-1]


@functools.partial(jax.jit, static_argnames=("tiles", "interpret"))
def _grouped_call(x_RxK, weight: WgmmaNvfp4Weight, group_sizes_E, *, tiles: WgmmaDecodeTiles, interpret):
    e, n, k = weight.shape
    x_pad, group, live, position, in_group = _padded_rows(x_RxK, group_sizes_E, tiles.rows)
    num_tiles = group.shape[0]
    a_in_smem = bool(interpret) or tiles.a_operand == "smem"
    scratch = {"a_smem": plgpu.SMEM((tiles.block_k // bm.BLOCK, tiles.block_n, bm.BLOCK), jnp.float16)} if a_in_smem else {}
    out_T = plgpu.kernel(
        functools.partial(_kernel, k=k, tiles=tiles),
        out_type=jax.ShapeDtypeStruct((n, num_tiles * tiles.rows), jnp.float32),
        grid=(num_tiles, n // tiles.block_n),
        grid_names=("tile", "col"),
        scratch_types=scratch,
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane if tiles.decode == "asm"
                                             else plgpu.LoweringSemantics.Warpgroup),
        kernel_name=KERNEL_NAME if tiles.decode == "bits" else f"{KERNEL_NAME}_{tiles.decode}",  # told apart in profiles
        interpret=interpret_params(interpret),
    )(group, live, weight.codes, weight.scales, x_pad)
    return jnp.where(in_group[:, None], out_T.T[position], jnp.float32(0))


def grouped_matmul_nvfp4_wgmma(x_RxK, weight: WgmmaNvfp4Weight, group_sizes_E, *, tiles: WgmmaDecodeTiles | None = None,
                               interpret=False):
    """f32 [R, N]: rows of group e times (dec(codes[e]) * scales[e])^T; rows past the groups 0.

    x: float16 [R, K] (exact NVFP4 operand values, as `grouped.ragged_matmul_nvfp4` forms them);
    weight: `pack_for_wgmma(codes, scales)`. sum(group_sizes) <= R is the caller's contract.
    `interpret`: True (or a `plgpu.InterpretGPUParams`) runs the Mosaic GPU interpreter."""
    tiles = tiles or DEFAULT_TILES
    e, n, k = check_weight("grouped_matmul_nvfp4_wgmma", weight)
    if jnp.ndim(x_RxK) != 2 or jnp.result_type(x_RxK) != jnp.float16:
        raise TypeError(f"grouped_matmul_nvfp4_wgmma: x must be float16 [R, K], got {jnp.result_type(x_RxK)} "
                        f"{jnp.shape(x_RxK)}")
    if x_RxK.shape[1] != k:
        raise ValueError(f"grouped_matmul_nvfp4_wgmma: x has K={x_RxK.shape[1]} but the weight has K={k}")
    check_group_sizes("grouped_matmul_nvfp4_wgmma", group_sizes_E, e)
    if n % tiles.block_n:
        raise ValueError(f"grouped_matmul_nvfp4_wgmma: N={n} must be a multiple of block_n={tiles.block_n} (the output "
                         f"features of a program; block_n is a multiple of {WARPGROUP_ROWS}, WGMMA's M)")
    if k % tiles.block_k:
        raise ValueError(f"grouped_matmul_nvfp4_wgmma: K={k} must be a multiple of block_k={tiles.block_k}")
    if interpret and tiles.decode == "asm":
        raise ValueError("grouped_matmul_nvfp4_wgmma: decode='asm' runs compiled only (the Mosaic GPU interpreter does "
                         "not run inline Mosaic GPU code); interpret mode takes decode='bits'")
    require_gpu(interpret, "grouped_matmul_nvfp4_wgmma")
    return _grouped_call(x_RxK, weight, group_sizes_E, tiles=tiles, interpret=interpret)


__all__ = ["A_OPERANDS", "DECODES", "DEFAULT_TILES", "BLOCK_TILE_TRANSFORMS", "KERNEL_NAME", "WgmmaDecodeTiles", "WgmmaNvfp4Weight", "codes_times_2_pow_minus_14",
           "decoded_tile", "grouped_matmul_nvfp4_wgmma", "pack_for_wgmma", "scales_times_2_pow_7", "unpack_wgmma_weight"]
