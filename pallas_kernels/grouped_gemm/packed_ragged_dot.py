"""Grouped GEMM of training sizes with the weight read packed NVFP4, decoded into shared memory (Mosaic GPU).

    weight = wgmma_nvfp4.pack_for_wgmma(codes_ExNxK2, scales_ExNxK16)
    y = grouped_matmul_packed(x_RxK, weight, sizes_E)               # f32 [R, N]: x @ DQ(W_e)^T, the forward
    dx = grouped_matmul_packed(g_RxN, weight, sizes_E, dgrad=True)  # f32 [R, K]: g @ DQ(W_e), its dgrad

W_e = dec(codes_e) * sf_e is the bf16 operand of an NVFP4 weight w^T [E, N, K] (`qlinear.quantize_weight`);
the global decode scale stays the caller's epilogue. Rows past sum(sizes) are 0.

Why: at training sizes (hundreds of rows per expert) the emulated forward and dgrad write W's bf16
copy to HBM and read it back in every step; the decode kernel (`wgmma_nvfp4`, the weight as
WGMMA's register operand, 8-64 rows per tile) would read the weight once per 64 rows. Here the
schedule is the Mosaic grouped GEMM's (`ragged_dot`: a persistent loop over row tile x column tile,
x as WGMMA's A operand from shared memory, TMA pipelines), with the weight side changed: each
pipeline step loads the packed codes (int4) and scale bytes of its weight tile, decodes them in
registers (`wgmma_nvfp4.decoded_column_blocks`) and writes the 16-bit tile to a shared-memory
buffer (8x16 tiles, 32-byte swizzle, so each 16-column block is stored whole) that WGMMA reads as
its B operand: transposed for the forward (contraction over K), as it is for the dgrad
(contraction over N). The weight keeps one layout for both (`pack_for_wgmma`: codes [E, N, K],
scales [E, K/16, N]); a weight tile is decoded once per row tile, so 128-row tiles pay a decode
per 128 rows, against a bf16 copy written and read per step.

Operands: x (or g) float16 or bfloat16. f16: the tile is dec(q) sf 2^-7 and the result is scaled
by 2^7 (exact), for NVFP4-quantized activations (exact in f16). bf16: the tile is dec(q) sf (a
cotangent has no exact f16 form). x may also come packed (`PackedRows`: an NVFP4 activation's
codes and scales), its tile decoded into shared memory like the weight's as WGMMA's A operand, so
no 16-bit copy of it is written to HBM either. Every tile is exact, products are exact in f32:
the result is the emulated GEMM up to the order of the f32 sums.

Two buffers for the decoded tile: a step decodes into one while the previous step's WGMMA reads
the other, so the decode overlaps the tensor cores (and the TMA pipeline runs
`max_concurrent_steps` ahead). Interpret mode (`interpret=True`) runs the
Mosaic GPU interpreter on the CPU; compiled it needs a Hopper GPU (no XLA fallback).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.grouped_gemm.packed_weight import F16_TILE_SHIFT, check_group_sizes
from pallas_kernels.grouped_gemm.ragged_dot import (GroupInfo, check_blocks, persistent_kernel, store_group_rows,
                                                    store_tile)
from pallas_kernels.grouped_gemm.tunables import FORWARD_TILES, INTERPRET_PROGRAMS, GroupedGemmTiles
from pallas_kernels.grouped_gemm.wgmma_nvfp4 import (BLOCK_TILE_TRANSFORMS, WgmmaNvfp4Weight, check_weight,
                                                     decoded_column_blocks)
from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant.wrappers import require_gpu

KERNEL_NAME = "fp4rl_grouped_packed_ragged_dot"
DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedRows:
    """NVFP4 rows (an activation quantized along K, 1x16 blocks) laid out for the kernel: codes
    int4 [R, K] (the packed bytes), E4M3 scale bytes uint8 [K/16, R] (a K block's scales for a
    row tile are one contiguous row). Its per-row global decode scale stays the caller's epilogue."""

    codes: jax.Array
    scales: jax.Array


def pack_rows(codes_RxK2, scales_RxK16) -> PackedRows:
    """`PackedRows` of an NVFP4 tensor's codes uint8 [R, K/2] and scales [R, K/16] (bytes moved)."""
    rows, half = codes_RxK2.shape
    codes = jax.lax.bitcast_convert_type(codes_RxK2, jnp.int4).reshape(rows, 2 * half)
    return PackedRows(codes=codes, scales=jax.lax.bitcast_convert_type(scales_RxK16, jnp.uint8).T)


def _packed_ragged_dot(lhs, weight: WgmmaNvfp4Weight, group_sizes, *, dgrad: bool, tiles: GroupedGemmTiles,
                       num_programs: int, interpret):
    """lhs [M, C] (C the contraction; or `PackedRows`, decoded as f16 like the weight) per row group
    times the group's decoded weight -> f32 [M, O]. group_sizes [G + 1]: the last entry is the zero
    group (rows of no group: 0), summing to M."""
    packed_lhs = isinstance(lhs, PackedRows)
    m = lhs.codes.shape[0] if packed_lhs else lhs.shape[0]
    dtype = jnp.float16 if packed_lhs else lhs.dtype
    g, n_w, k_w = weight.shape
    contraction, out = (n_w, k_w) if dgrad else (k_w, n_w)
    block_m, block_n, block_k = tiles.block_m, tiles.block_n, tiles.block_k
    # the decoded tile [rows, columns] as stored: rows along N, columns along K (16-column scale blocks)
    tile_rows, tile_cols = (block_k, block_n) if dgrad else (block_n, block_k)
    # each f16 tile carries 2^-F16_TILE_SHIFT; the f32 result gets it back (a power of two: exact)
    f16_tiles = (dtype == jnp.float16) + packed_lhs

    def body(rows_per_group_gmem, *refs, w_smem, a_smem=None):
        *lhs_gmem, codes_gmem, scales_gmem, o_gmem = refs
        grid_m = pl.cdiv(m, block_m) + g  # each of the G + 1 groups may add one shared row tile
        grid_n = pl.cdiv(out, block_n)

        @plgpu.nd_loop((grid_m * grid_n,), collective_axes="sm")
        def mn_loop(loop_info: plgpu.NDLoopInfo):
            mi, ni = plgpu.planar_snake(loop_info.index[0], (grid_m, grid_n), 1, tiles.grid_block_n)
            group_info = GroupInfo.create(rows_per_group_gmem, block_m, mi)
            expert = jnp.minimum(group_info.group_id, g - 1)

            def step(index, *smem, acc_ref):
                *lhs_smem, codes_smem, scales_smem = smem
                # two buffers: this step decodes into one while the previous step's WGMMA may still
                # read the other (waited for below, before the step after this one reuses it)
                slot = index[0] % 2
                w_tile = w_smem.at[slot]
                _decode_into(w_tile, codes_smem, scales_smem, dtype)
                if packed_lhs:
                    _decode_into(a_smem.at[slot], *lhs_smem, dtype)
                plgpu.commit_smem()  # the tiles visible to WGMMA (fence + warpgroup barrier)
                plgpu.wgmma(acc_ref, a_smem.at[slot] if packed_lhs else lhs_smem[0], w_tile if dgrad else w_tile.T)
                # at most this step's WGMMA in flight: the previous one (its buffers, its pipeline
                # stage, released one step late: delay_release=1) is done
                plgpu.wgmma_wait(1)

            def acc_scope(acc_ref):
                @pl.when(group_info.group_id < g)  # the zero group keeps its zero accumulator
                def _():
                    # weight tiles: codes [tile_rows, tile_cols] of [N, K], scales [tile_cols/16, tile_rows] of [K/16, N]
                    if dgrad:
                        codes_spec = plgpu.BlockSpec((tile_rows, tile_cols), lambda ki: (ki, ni))
                        scales_spec = plgpu.BlockSpec((tile_cols // bm.BLOCK, tile_rows), lambda ki: (ni, ki))
                    else:
                        codes_spec = plgpu.BlockSpec((tile_rows, tile_cols), lambda ki: (ni, ki))
                        scales_spec = plgpu.BlockSpec((tile_cols // bm.BLOCK, tile_rows), lambda ki: (ki, ni))
                    lhs_specs = [plgpu.BlockSpec((block_m, block_k), lambda ki: (group_info.block, ki), delay_release=1)]
                    if packed_lhs:  # scales [K/16, M]: the row tile's K block is [block_k / 16, block_m]
                        lhs_specs.append(plgpu.BlockSpec((block_k // bm.BLOCK, block_m), lambda ki: (ki, group_info.block),
                                                         delay_release=1))
                    plgpu.emit_pipeline(
                        functools.partial(step, acc_ref=acc_ref),
                        grid=(contraction // block_k,),
                        in_specs=[*lhs_specs, codes_spec, scales_spec],
                        max_concurrent_steps=tiles.max_concurrent_steps,
                    )(*lhs_gmem, codes_gmem.at[expert], scales_gmem.at[expert])
                    plgpu.wgmma_wait(0)

                return acc_ref[...] * jnp.float32(2.0 ** (F16_TILE_SHIFT * f16_tiles)) if f16_tiles else acc_ref[...]

            store_tile(pl.run_scoped(acc_scope, plgpu.ACC((block_m, block_n))), o_gmem.dtype,
                       functools.partial(store_group_rows, o_gmem=o_gmem, group_info=group_info,
                                         columns=pl.ds(ni * block_n, block_n), rows=min(block_m, m)))

    scratch = {"w_smem": plgpu.SMEM((2, tile_rows, tile_cols), dtype, transforms=BLOCK_TILE_TRANSFORMS)}
    if packed_lhs:
        scratch["a_smem"] = plgpu.SMEM((2, block_m, block_k), dtype, transforms=BLOCK_TILE_TRANSFORMS)
    kernel = persistent_kernel(body, (m, out), num_programs, KERNEL_NAME, interpret, scratch_types=scratch)
    lhs_operands = (lhs.codes, lhs.scales) if packed_lhs else (lhs,)
    return kernel(group_sizes, *lhs_operands, weight.codes, weight.scales)


def _decode_into(tile_smem, codes_smem, scales_smem, dtype) -> None:
    """A tile's codes and scale bytes (shared memory) -> its 16-bit values in `tile_smem`, block by block."""
    for b, block in enumerate(decoded_column_blocks(codes_smem, scales_smem, dtype)):
        tile_smem.at[:, pl.ds(b * bm.BLOCK, bm.BLOCK)][...] = block


def grouped_matmul_packed(a_RxC, weight: WgmmaNvfp4Weight, group_sizes_E, *, dgrad: bool = False,
                          tiles: GroupedGemmTiles | None = None, interpret=False):
    """f32: rows of group e times DQ(W_e)^T ([R, N], the forward: a is x [R, K]) or DQ(W_e) ([R, K],
    `dgrad`: a is g [R, N]); rows past sum(group_sizes) are 0. a: float16 or bfloat16, or an NVFP4
    operand's `PackedRows` (its dec(q) * sf, decoded in the kernel like the weight, as f16); weight:
    `wgmma_nvfp4.pack_for_wgmma(codes, scales)`. `interpret`: the Mosaic GPU interpreter (CPU)."""
    what = "grouped_matmul_packed"
    e, n_w, k_w = check_weight(what, weight)
    packed_a = isinstance(a_RxC, PackedRows)
    if packed_a:
        rows, columns = a_RxC.codes.shape
        if a_RxC.codes.dtype != jnp.int4 or a_RxC.scales.shape != (columns // bm.BLOCK, rows) or columns % bm.BLOCK:
            raise ValueError(f"{what}: PackedRows must hold int4 codes [R, C] and scale bytes [C/16, R] (pack_rows), got "
                             f"{a_RxC.codes.dtype} {a_RxC.codes.shape} and {a_RxC.scales.shape}")
    elif jnp.ndim(a_RxC) != 2 or jnp.result_type(a_RxC) not in DTYPES:
        raise TypeError(f"{what}: a must be float16 or bfloat16 [R, C] (or PackedRows), got {jnp.result_type(a_RxC)} "
                        f"{jnp.shape(a_RxC)}")
    else:
        rows, columns = a_RxC.shape
    contraction, out = (n_w, k_w) if dgrad else (k_w, n_w)
    if columns != contraction:
        raise ValueError(f"{what}: a has {columns} columns but the {'dgrad' if dgrad else 'forward'} contracts "
                         f"over the weight's {'N' if dgrad else 'K'}={contraction}")
    check_group_sizes(what, group_sizes_E, e)
    tiles = (tiles or FORWARD_TILES).fit(block_n=out, block_k=contraction)
    check_blocks("the output width", out, tiles.block_n)
    check_blocks("the contraction", contraction, tiles.block_k)
    tile_rows, tile_cols = (tiles.block_k, tiles.block_n) if dgrad else (tiles.block_n, tiles.block_k)
    if tile_rows % 64 or tile_cols % 32:
        raise ValueError(f"{what}: the weight tile [{tile_rows}, {tile_cols}] (rows along N, columns along K) must have "
                         "a multiple of 64 rows (WGMMA's layout) and of 32 columns (the 4-bit loads' tile)")
    if tiles.max_concurrent_steps < 2:
        raise ValueError(f"{what}: max_concurrent_steps={tiles.max_concurrent_steps} must be >= 2")
    require_gpu(interpret, what)
    pad = -rows % tiles.block_m
    if packed_a:  # zero codes and scales: zero rows
        a = PackedRows(jnp.pad(a_RxC.codes, ((0, pad), (0, 0))), jnp.pad(a_RxC.scales, ((0, 0), (0, pad))))
    else:
        a = jnp.pad(a_RxC, ((0, pad), (0, 0)))
    sizes = jnp.asarray(group_sizes_E, jnp.int32)
    sizes = jnp.concatenate([sizes, (rows + pad - jnp.sum(sizes))[None]])  # the zero group
    num_programs = INTERPRET_PROGRAMS if interpret else jax.local_devices(backend="gpu")[0].core_count
    return _packed_ragged_dot(a, weight, sizes, dgrad=dgrad, tiles=tiles, num_programs=num_programs,
                              interpret=interpret)[:rows]


__all__ = ["KERNEL_NAME", "PackedRows", "grouped_matmul_packed", "pack_rows"]
