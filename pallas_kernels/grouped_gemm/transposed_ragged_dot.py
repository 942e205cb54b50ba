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
"""Grouped weight gradient as a Pallas Mosaic GPU kernel: out[e] = lhs[rows of e]^T @ rhs[rows of e].

Vendored from jax 0.11.2, `jax/experimental/pallas/ops/gpu/transposed_ragged_dot_mgpu.py`
(Apache-2.0, header above). Changes made here, and why:
* `interpret`: the kernel runs in the Mosaic GPU interpreter (as in `ragged_dot`);
* float32 output (the WGMMA accumulator; our callers want `preferred_element_type=f32`), stored
  from an SMEM tile without explicit transforms, as the forward kernel stores its output;
* the number of persistent programs (`num_programs`) is a parameter, the device's SM count when
  compiled;
* validation raises before tracing (the token count must be a multiple of block_k: the last
  group's last block would otherwise read past the arrays); the benchmark `main` is removed;
  the launch and the tile store are shared with the forward kernel (`persistent_kernel`,
  `store_tile`).
The contraction runs over the tokens (rows) of one group: each group's rows are walked in
block_k blocks aligned to the global row grid, and the first and last blocks, which may hold rows
of the neighbouring groups (or rows past the last group), have those lhs rows zeroed in SMEM
before the WGMMA. Zeroing is a multiply by a 0/1 mask, as upstream: a
non-finite value in a neighbouring group's row of a boundary block still gives NaN there.
"""

from __future__ import annotations

from jax import lax
from jax import numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.grouped_gemm.ragged_dot import check_blocks, persistent_kernel, store_tile

KERNEL_NAME = "fp4rl_grouped_wgrad"


def transposed_ragged_dot(lhs, rhs, group_sizes, *, block_m: int, block_n: int, block_k: int,
                          max_concurrent_steps: int, grid_block_n: int, num_programs: int, interpret=False):
    """lhs [T, M]^T @ rhs [T, N] per group of rows (tokens) -> f32 [G, M, N].

    `group_sizes` [G] int32 sums to at most T, a multiple of block_k; rows past the sum are ignored.
    """
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"lhs and rhs must have the same dtype, got {lhs.dtype} and {rhs.dtype}")
    t, m = lhs.shape
    t2, n = rhs.shape
    g = group_sizes.shape[0]
    if t != t2:
        raise ValueError(f"row (token) counts differ: lhs has {t}, rhs has {t2}")
    check_blocks("rows (tokens)", t, block_k)
    check_blocks("M (lhs columns)", m, block_m)
    check_blocks("N (rhs columns)", n, block_n)

    group_sizes = group_sizes.astype(jnp.int32)
    group_ends = jnp.cumsum(group_sizes)
    group_starts = group_ends - group_sizes
    group_block_starts = group_starts // block_k * block_k
    group_block_ends = -(group_ends // -block_k) * block_k
    group_num_blocks = (group_block_ends - group_block_starts) // block_k

    swizzle = plgpu.find_swizzle(block_k * jnp.dtype(lhs.dtype).itemsize * 8)
    swizzle_elems = swizzle // jnp.dtype(lhs.dtype).itemsize
    transforms = (plgpu.TilingTransform((8, swizzle_elems)), plgpu.SwizzleTransform(swizzle))
    # both operands' SMEM blocks are tiled swizzle_elems wide along their minor (output) dimension
    for name, block in (("M (lhs columns)", block_m), ("N (rhs columns)", block_n)):
        if block % swizzle_elems:
            raise ValueError(f"{name}: block {block} must be a multiple of {swizzle_elems} (the shared-memory tiles of "
                             f"a {swizzle}-byte swizzle)")
    delay_release = 1 if max_concurrent_steps > 1 else 0

    def body(group_sizes_gmem, group_starts_gmem, group_ends_gmem, group_num_blocks_gmem, group_block_starts_gmem,
             lhs_gmem, rhs_gmem, o_gmem):
        grid_m = pl.cdiv(m, block_m)
        grid_n = pl.cdiv(n, block_n)

        @plgpu.nd_loop((g, grid_m * grid_n), collective_axes="sm")
        def mn_loop(loop_info: plgpu.NDLoopInfo):
            g_i = loop_info.index[0]
            m_i, n_i = plgpu.planar_snake(loop_info.index[1], (grid_m, grid_n), 1, grid_block_n)
            # This slice may extend past the arrays; emit_pipeline never touches that part.
            group_block_start = pl.multiple_of(group_block_starts_gmem[g_i], block_k)
            gmem_slice = pl.ds(group_block_start, t)

            def mask_rows(lhs_smem, keep):
                indices = plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (block_k, block_m), 0), plgpu.Layout.WGMMA)
                lhs_smem[...] = lhs_smem[...] * keep(indices).astype(lhs_smem.dtype)
                plgpu.commit_smem()

            def acc_scope(acc_ref):
                def block_matmul(block_idx, lhs_smem, rhs_smem):
                    block_idx = block_idx[0]

                    @pl.when(block_idx == 0)  # the first block may start with the previous group's rows
                    def _():
                        start_index = lax.rem(group_starts_gmem[g_i], block_k)
                        mask_rows(lhs_smem, lambda i: i >= start_index)

                    @pl.when(block_idx == group_num_blocks_gmem[g_i] - 1)  # the last may end with the next's
                    def _():
                        last_index = lax.rem(group_ends_gmem[g_i] - 1, block_k)
                        mask_rows(lhs_smem, lambda i: i <= last_index)

                    plgpu.wgmma(acc_ref, lhs_smem.transpose((1, 0)), rhs_smem)
                    if max_concurrent_steps == 1:
                        # No delayed release: only wgmma's completion makes the SMEM block reusable.
                        plgpu.wgmma_wait(0)

                @pl.when(group_sizes_gmem[g_i] > 0)  # an empty group keeps its zero accumulator
                def _():
                    plgpu.emit_pipeline(
                        block_matmul,
                        grid=(group_num_blocks_gmem[g_i],),
                        in_specs=[
                            plgpu.BlockSpec((block_k, block_m), lambda k_i: (k_i, m_i), delay_release=delay_release,
                                            transforms=transforms),
                            plgpu.BlockSpec((block_k, block_n), lambda k_i: (k_i, n_i), delay_release=delay_release,
                                            transforms=transforms),
                        ],
                        max_concurrent_steps=max_concurrent_steps,
                    )(lhs_gmem.at[gmem_slice, :], rhs_gmem.at[gmem_slice, :])

                return acc_ref[...]

            out_tile = o_gmem.at[g_i, pl.ds(m_i * block_m, block_m), pl.ds(n_i * block_n, block_n)]
            store_tile(pl.run_scoped(acc_scope, plgpu.ACC((block_m, block_n))), o_gmem.dtype,
                       lambda o_smem: plgpu.copy_smem_to_gmem(o_smem, out_tile))

    kernel = persistent_kernel(body, (g, m, n), num_programs, KERNEL_NAME, interpret)
    return kernel(group_sizes, group_starts, group_ends, group_num_blocks, group_block_starts, lhs, rhs)
