"""The grouped-GEMM entry points: validation, row padding, the zero group, the program count.

Both functions have the semantics of `fp4rl.grouped`'s XLA reference (`lax.ragged_dot` /
`ragged_dot_general` with f32 accumulation) on one unbatched problem; `fp4rl.grouped` folds
batches (vmap) into one problem before calling them.

Rows: the forward kernel reads whole block_m row tiles and the wgrad kernel whole block_k
token blocks, so the rows are padded with zeros to a multiple of the block when they are not
one already (a copy of the operands; the MoE's row count is a multiple of its group_align). The
padding rows, like every row past sum(group_sizes), belong to no expert: the forward gives 0
there (an extra zero group, see `ragged_dot`), the wgrad ignores them. sum(group_sizes) <= R is
the caller's contract (`qlinear.qdot` checks it); traced sizes cannot be checked here.

Operands: bfloat16 or float16, both the same. float32 is refused rather than run: WGMMA would
take it as TF32 (10 mantissa bits), silently not the f32 GEMM of the reference.
Compiled (interpret=False) the kernels need a CUDA GPU and run one persistent program per SM
of the device; there is no fallback to XLA.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.grouped_gemm.ragged_dot import ragged_dot
from pallas_kernels.grouped_gemm.transposed_ragged_dot import transposed_ragged_dot
from pallas_kernels.grouped_gemm.tunables import FORWARD_TILES, INTERPRET_PROGRAMS, WGRAD_TILES, GroupedGemmTiles
from pallas_kernels.nvfp4_quant.wrappers import require_gpu

DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _check_operands(what: str, a, b, b_ndim: int, group_sizes, num_groups: int | None) -> None:
    for name, x, ndim in (("first operand", a, 2), ("second operand", b, b_ndim)):
        if jnp.ndim(x) != ndim:
            raise ValueError(f"{what}: the {name} must have {ndim} dims, got shape {jnp.shape(x)}")
    dtypes = (jnp.result_type(a), jnp.result_type(b))
    if dtypes[0] != dtypes[1] or dtypes[0] not in DTYPES:
        raise TypeError(f"{what} takes two bfloat16 or two float16 operands, got {dtypes[0]} and {dtypes[1]} "
                        "(float32 would run as TF32 on the tensor cores)")
    if jnp.ndim(group_sizes) != 1 or (num_groups is not None and jnp.shape(group_sizes)[0] != num_groups):
        raise ValueError(f"{what}: group_sizes must have shape ({num_groups or 'E'},), got {jnp.shape(group_sizes)}")
    if not jnp.issubdtype(jnp.result_type(group_sizes), jnp.integer):
        raise TypeError(f"{what}: group_sizes must be integers, got {jnp.result_type(group_sizes)}")


def _num_programs(interpret: bool) -> int:
    if interpret:
        return INTERPRET_PROGRAMS
    return jax.local_devices(backend="gpu")[0].core_count  # one persistent program per SM (H200: 132)


def _pad_rows(x, block: int):
    pad = -x.shape[0] % block
    return jnp.pad(x, ((0, pad), (0, 0))) if pad else x


def grouped_matmul(a_RxK, b_ExKxN, group_sizes_E, *, transpose_rhs: bool = False, tiles: GroupedGemmTiles | None = None,
                   interpret=False):
    """f32 [R, N]: rows of group e times b[e] ([E, K, N]; with transpose_rhs b is [E, N, K] and
    row r times b[e]^T, the dgrad of a forward through b). Rows past sum(group_sizes) are 0.
    `interpret`: True (or a `plgpu.InterpretGPUParams`) runs the Mosaic GPU interpreter."""
    _check_operands("grouped_matmul", a_RxK, b_ExKxN, 3, group_sizes_E, jnp.shape(b_ExKxN)[0] if jnp.ndim(b_ExKxN) == 3 else None)
    require_gpu(interpret, "grouped_matmul")
    rows, k = a_RxK.shape
    n = b_ExKxN.shape[1 if transpose_rhs else 2]
    tiles = (tiles or FORWARD_TILES).fit(block_n=n, block_k=k)
    a = _pad_rows(a_RxK, tiles.block_m)
    sizes = jnp.asarray(group_sizes_E, jnp.int32)
    sizes = jnp.concatenate([sizes, (a.shape[0] - jnp.sum(sizes))[None]])  # the zero group
    out = ragged_dot(a, b_ExKxN, sizes, block_m=tiles.block_m, block_n=tiles.block_n, block_k=tiles.block_k,
                     max_concurrent_steps=tiles.max_concurrent_steps, grid_block_n=tiles.grid_block_n,
                     num_programs=_num_programs(interpret), transpose_rhs=transpose_rhs, interpret=interpret)
    return out[:rows]


def grouped_wgrad(a_RxK, g_RxN, group_sizes_E, *, tiles: GroupedGemmTiles | None = None, interpret=False):
    """f32 [E, K, N]: per group e, a[rows of e]^T @ g[rows of e]; rows past sum(group_sizes) ignored."""
    _check_operands("grouped_wgrad", a_RxK, g_RxN, 2, group_sizes_E, None)
    require_gpu(interpret, "grouped_wgrad")
    if a_RxK.shape[0] != g_RxN.shape[0]:
        raise ValueError(f"grouped_wgrad: row counts differ: {a_RxK.shape[0]} and {g_RxN.shape[0]}")
    if a_RxK.shape[1] % 64:  # the weight gradient's K is the M of its WGMMA tiles
        raise ValueError(f"grouped_wgrad: K={a_RxK.shape[1]} must be a multiple of 64 (a warpgroup's WGMMA rows)")
    tiles = (tiles or WGRAD_TILES).fit(block_m=a_RxK.shape[1], block_n=g_RxN.shape[1])
    return transposed_ragged_dot(_pad_rows(a_RxK, tiles.block_k), _pad_rows(g_RxN, tiles.block_k),
                                 jnp.asarray(group_sizes_E, jnp.int32), block_m=tiles.block_m, block_n=tiles.block_n,
                                 block_k=tiles.block_k, max_concurrent_steps=tiles.max_concurrent_steps,
                                 grid_block_n=tiles.grid_block_n, num_programs=_num_programs(interpret),
                                 interpret=interpret)
