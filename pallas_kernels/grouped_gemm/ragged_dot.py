# Copyright 2025 The JAX Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""Grouped (ragged) matmul forward as a Pallas Mosaic GPU kernel: out[r] = lhs[r] @ rhs[group(r)].

Vendored from jax 0.11.2, `jax/experimental/pallas/ops/gpu/ragged_dot_mgpu.py` (Apache-2.0,
header above). Changes made here, and why:
* `interpret`: the kernel runs in the Mosaic GPU interpreter (`plgpu.InterpretGPUParams`) so the
  CPU test suite checks the same kernel body that the GPU compiles (True: default parameters;
  an `InterpretGPUParams` is used as given, e.g. with `detect_races=True`);
* float32 output: the WGMMA accumulator is f32 and our callers want `preferred_element_type=f32`
  (the epilogue scales of the emulated NVFP4 GEMM multiply the f32 result, docs/numerics.md §2);
* rows past the last group: the caller appends one *zero group* covering them; its tiles skip
  the K pipeline and store the zero accumulator, so those rows are 0 as in `lax.ragged_dot`
  (the upstream kernel never writes them: they held whatever the buffer held);
* the number of persistent programs (`num_programs`) is a parameter, the device's SM count when
  compiled (upstream hard-codes 132);
* validation raises before tracing; the benchmark `main` and the unused
  `load_group_sizes_to_register` flag are removed.
The tile walk is upstream's: a persistent loop over (row tile of a group, column tile), where a
row tile shared by two groups is computed once per group and each stores only its own rows (a
ladder of power-of-two TMA stores, since TMA boxes are static).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
from jax import lax
from jax import numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

KERNEL_NAME = "fp4rl_grouped_matmul"


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """Which group and which row block the persistent loop's tile `tid` works on."""

    group_id: jax.Array
    block: jax.Array
    block_start: jax.Array
    actual_start: jax.Array
    actual_end: jax.Array
    start_within_block: jax.Array
    actual_size: jax.Array

    @classmethod
    def create(cls, group_lengths, tile, tid):
        tile = jnp.int32(tile)
        # Few groups: the loop is unrolled, and selects replace an early exit.
        group_end = group_start = block = group = end = jnp.array(0, dtype=jnp.int32)
        for i in range(len(group_lengths)):
            start = end  # start/end are inclusive
            end = start + group_lengths[i]
            final = end - 1
            start_block = lax.div(start, tile)
            final_block = lax.div(final, tile)
            tid_begin = start_block + i
            tid_end = final_block + 1 + i
            this_is_group = (tid_begin <= tid) & (tid < tid_end)
            block = lax.select(this_is_group, tid - tid_begin + start_block, block)
            group = lax.select(this_is_group, jnp.int32(i), group)
            group_start = lax.select(this_is_group, start, group_start)
            group_end = lax.select(this_is_group, end, group_end)
        block_start = block * tile
        actual_start = jnp.maximum(group_start, block_start)
        actual_end = jnp.minimum(group_end, block_start + tile)
        return cls(group_id=group, block=block, block_start=block_start, actual_start=actual_start,
                   actual_end=actual_end, start_within_block=actual_start - block_start,
                   actual_size=actual_end - actual_start)


def check_blocks(name: str, size: int, block: int) -> None:
    if block < 1 or size % block:
        raise ValueError(f"{name}={size} must be a positive multiple of its block size {block} "
                         "(pick GroupedGemmTunables whose blocks divide the GEMM's dimensions)")


def interpret_params(interpret):
    """None (compiled), or the interpreter's parameters: given, or the defaults for True."""
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    return plgpu.InterpretGPUParams() if interpret else None


def store_tile(acc, dtype, store) -> None:
    """The accumulator tile -> SMEM (`dtype`) -> GMEM through `store(o_smem)`'s TMA copies, awaited."""

    @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM(acc.shape, dtype=dtype))
    def _(o_smem):
        o_smem[...] = acc.astype(dtype)
        plgpu.commit_smem()
        store(o_smem)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def store_group_rows(o_smem, *, o_gmem, group_info: GroupInfo, columns, rows: int) -> None:
    """The rows of `o_smem` (a row tile) that belong to `group_info`'s group -> their rows of
    `o_gmem` in `columns`. TMA boxes are static: the tile's actual_size rows (only known at run
    time) go as a ladder of power-of-two stores, e.g. 5 rows = 4 + 1 (`rows`: the tile's height)."""
    smem_start = group_info.start_within_block
    remaining_rows = rows
    while remaining_rows > 0:
        const_rows_len = 1 << int(math.log2(remaining_rows))
        remaining_rows //= 2

        @pl.when(group_info.actual_size & const_rows_len != 0)
        def _():
            plgpu.copy_smem_to_gmem(o_smem.at[pl.ds(smem_start, const_rows_len)],
                                    o_gmem.at[pl.ds(group_info.block_start + smem_start, const_rows_len), columns])

        smem_start += group_info.actual_size & const_rows_len


def persistent_kernel(body, out_shape, num_programs: int, name: str, interpret, scratch_types=None):
    """`body` as a kernel of `num_programs` persistent programs (axis "sm") with an f32 output
    (and the shared-memory `scratch_types`, passed to `body` by name after the operands)."""
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct(out_shape, jnp.float32),
        grid=(num_programs,),
        grid_names=("sm",),
        scratch_types=scratch_types or {},
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        kernel_name=name,
        interpret=interpret_params(interpret),
    )


def ragged_dot(lhs, rhs, group_sizes, *, block_m: int, block_n: int, block_k: int, max_concurrent_steps: int,
               grid_block_n: int, num_programs: int, transpose_rhs: bool = False, interpret=False):
    """lhs [M, K] @ rhs [G, K, N] (or [G, N, K] with transpose_rhs) per row group -> f32 [M, N].

    `group_sizes` [G + 1] int32: the last entry is the zero group (rows that belong to no rhs
    group: their output rows are 0); the sizes must sum to exactly M, a multiple of block_m.
    """
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"lhs and rhs must have the same dtype, got {lhs.dtype} and {rhs.dtype}")
    m, k = lhs.shape
    g, k2, n = rhs.shape
    if transpose_rhs:
        k2, n = n, k2
    if group_sizes.shape != (g + 1,):
        raise ValueError(f"group_sizes must have shape ({g + 1},) (G groups + the zero group), got {group_sizes.shape}")
    if k != k2:
        raise ValueError(f"contraction sizes differ: lhs has K={k}, rhs has K={k2}")
    check_blocks("M (rows)", m, block_m)
    check_blocks("N", n, block_n)
    check_blocks("K", k, block_k)
    if max_concurrent_steps < 2:
        raise ValueError(f"max_concurrent_steps={max_concurrent_steps} must be >= 2 (the pipeline releases "
                         "each SMEM buffer one step late, after the WGMMA that reads it)")

    def body(rows_per_group_gmem, lhs_gmem, rhs_gmem, o_gmem):
        grid_m = pl.cdiv(m, block_m) + g  # each of the G + 1 groups may add one shared row tile
        grid_n = pl.cdiv(n, block_n)

        @plgpu.nd_loop((grid_m * grid_n,), collective_axes="sm")
        def mn_loop(loop_info: plgpu.NDLoopInfo):
            mi, ni = plgpu.planar_snake(loop_info.index[0], (grid_m, grid_n), 1, grid_block_n)
            group_info = GroupInfo.create(rows_per_group_gmem, block_m, mi)
            rhs_group = rhs_gmem.at[jnp.minimum(group_info.group_id, g - 1)]

            def acc_scope(acc_ref):
                @pl.when(group_info.group_id < g)  # the zero group keeps its zero accumulator
                def _():
                    plgpu.emit_pipeline(
                        lambda _, lhs_smem, rhs_smem: plgpu.wgmma(
                            acc_ref, lhs_smem, rhs_smem.transpose((1, 0)) if transpose_rhs else rhs_smem),
                        grid=(k // block_k,),
                        in_specs=[
                            plgpu.BlockSpec((block_m, block_k), lambda ki: (group_info.block, ki), delay_release=1),
                            plgpu.BlockSpec((block_n, block_k) if transpose_rhs else (block_k, block_n),
                                            lambda ki: (ni, ki) if transpose_rhs else (ki, ni), delay_release=1),
                        ],
                        max_concurrent_steps=max_concurrent_steps,
                    )(lhs_gmem, rhs_group)

                return acc_ref[...]

            store_tile(pl.run_scoped(acc_scope, plgpu.ACC((block_m, block_n))), o_gmem.dtype,
                       functools.partial(store_group_rows, o_gmem=o_gmem, group_info=group_info,
                                         columns=pl.ds(ni * block_n, block_n), rows=min(block_m, m)))

    return persistent_kernel(body, (m, n), num_programs, KERNEL_NAME, interpret)(group_sizes, lhs, rhs)
