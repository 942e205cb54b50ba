"""The Triton quantize kernel of an expert stack read K-major, and the loop and element helpers it
shares with the kernels of `triton.py` (which see that module's docstring: layout, grid, the
bit-exactness rules on the GPU)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant import triton_planar as planar
from pallas_kernels.nvfp4_quant.triton_arith import RoundedArith


def arith(interpret: bool):
    return bm.PlainArith if interpret else RoundedArith


def as_f32(x):
    if x.dtype == jnp.bfloat16:
        return bm.bf16_to_f32(x)  # on the bits: exact, subnormals kept whatever the FTZ mode
    return x.astype(jnp.float32)


def chunk_loop(n_chunks, load, process, prefetch, first_index):
    """process(i, load(i)) for each chunk i. With `prefetch`, chunk i + 1's loads are issued before
    chunk i is processed and carried by the loop (software pipelining in registers: the compiler
    does not move loads across loop iterations), so memory latency overlaps the arithmetic."""
    if n_chunks == 1:
        process(first_index, load(first_index))
    elif prefetch:
        def body(i, item):
            following = load(jnp.minimum(i + 1, n_chunks - 1))
            process(i, item)
            return following

        lax.fori_loop(0, n_chunks, body, load(first_index))
    else:
        lax.fori_loop(0, n_chunks, lambda i, carry: (process(i, load(i)), carry)[1], 0)


def kmajor_planar_kernel(x_ref, amax_ref, codes_ref, scales_ref, map4_ref, *, m, k, rows, nbc, config, prefetch,
                         interpret):
    """An expert stack read K-major ([G, K, M], blocks along K), as element planes (`triton_planar`).

    Plane j of a chunk holds element j of each of its blocks: K row 16 b + j of the program's `rows`
    stored columns. The chunk is loaded as one [16 nbc, rows] tile (runs of `rows` contiguous
    elements) laid out so that a thread holds a block's 16 elements of one column, then split into
    planes inside the thread (size-2 unstacks, as `unstack_quad`). Each column is a row of the quantized
    [M, K] matrix, so the planes give each thread whole blocks as in the row-major planar kernel:
    no transpose of the input, and a 16x16 tile (16 consecutive columns) reduces its max and error
    across threads (`triton_planar.quantize_planes`). The amax is given (per tensor).
    """
    ar = arith(interpret)
    g = pl.program_id(0)
    r0 = pl.program_id(1) * rows
    nblocks = k // bm.BLOCK
    n_chunks = pl.cdiv(nblocks, nbc)
    row_ok = (r0 + jnp.arange(rows)) < m
    amax = plgpu_triton.load(amax_ref.at[g, pl.ds(r0, rows)], mask=row_ok, other=0.0)[:, None]

    def mask(b0):  # [rows, nbc]
        return row_ok[:, None] & ((b0 + jnp.arange(nbc)) < nblocks)[None, :]

    def load_planes(i):  # [rows, nbc, 16]: a block's 16 elements in its thread (split into planes later)
        b0 = i * nbc
        k_ok = (b0 * bm.BLOCK + jnp.arange(nbc * bm.BLOCK)) < k
        tile = plgpu_triton.load(x_ref.at[g, pl.ds(b0 * bm.BLOCK, nbc * bm.BLOCK), pl.ds(r0, rows)],
                                 mask=k_ok[:, None] & row_ok[None, :], other=0)
        return jnp.transpose(tile.reshape(nbc, bm.BLOCK, rows), (2, 0, 1))

    def quantize_chunk(i, blocks):
        b0 = i * nbc
        xs = [as_f32(p) for p in planar.unstack_last(blocks)]  # 16 planes [rows, nbc]
        codes, scale_bytes, map4 = planar.quantize_planes(ar, xs, amax, config)
        pair_ok = jnp.broadcast_to(mask(b0)[:, :, None], (rows, nbc, 2))
        plgpu_triton.store(codes_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc), pl.ds(0, 2)],
                           jnp.stack(codes, axis=-1), mask=pair_ok)
        plgpu_triton.store(scales_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc)], scale_bytes.astype(jnp.uint8),
                           mask=mask(b0))
        plgpu_triton.store(map4_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc)], map4, mask=mask(b0))

    zero = pl.program_id(0) * 0  # a traced index: the masked tail of a chunk is not bounds-checked
    chunk_loop(n_chunks, load_planes, quantize_chunk, prefetch, zero)
