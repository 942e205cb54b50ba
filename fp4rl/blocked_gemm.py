"""Grouped (ragged) GEMMs from plain XLA ops, with memory and work linear in the rows.

XLA lowers `lax.ragged_dot` by expanding it over its groups (every row against every group's
weight, masked), so its temporaries and FLOPs grow with rows x groups. Here each group's rows
are gathered into a padded layout in which every block of `t` rows belongs to one group (a
group starts a new block; at most one partial block per group), so the GEMM is one batched
dense `dot_general` over the blocks, each against its group's weight (gathered per block):

    rows R, groups E, blocks NB = ceil(R / t) + E (a static bound), padded rows NB * t.

`t` is the smallest power of two in [8, 128] with t * E >= R: wide blocks for the training
shapes (h200 update: 57k rows, 32 experts -> 128), narrow ones at decode, where the padding
(up to E * (t - 1) rows) would otherwise dominate. The weight gather costs NB x K x N bytes.

Semantics are those of `fp4rl.grouped` (rows past sum(group_sizes) give zeros; f32
accumulation; operands of two dtypes widened exactly; f32 dots at HIGHEST precision). Every
output element is one dot product over K (matmul) or a sum over the group's blocks of dot
products over their rows (wgrad): the f32 accumulation order differs from other backends, so
results agree within the accumulation bound, not bitwise. Only standard ops: `vmap` batches it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fp4rl.exact_dot import exact_precision, promoted

F32 = jnp.float32
MIN_BLOCK, MAX_BLOCK = 8, 128


def block_rows(rows: int, groups: int) -> int:
    t = MIN_BLOCK
    while t < MAX_BLOCK and t * groups < rows:
        t *= 2
    return t


def _layout(group_sizes_E, rows: int, t: int):
    """(src, block_group, dst, NB): for each padded row the source row (`rows`, out of bounds, for
    padding), each block's group, for each row its padded row (NB * t past the groups), and the
    number of blocks."""
    groups = group_sizes_E.shape[0]
    nb = -(-rows // t) + groups
    sizes = group_sizes_E.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    padded = (sizes + t - 1) // t * t
    padded_ends = jnp.cumsum(padded)
    padded_starts = padded_ends - padded
    q = jnp.arange(nb * t, dtype=jnp.int32)
    # past the last group's blocks: the last group, at an offset past its size (padding)
    q_group = jnp.minimum(jnp.searchsorted(padded_ends, q, side="right", method="compare_all"), groups - 1)
    offset = q - padded_starts[q_group]
    src = jnp.where(offset < sizes[q_group], starts[q_group] + offset, rows)
    r = jnp.arange(rows, dtype=jnp.int32)
    r_group = jnp.searchsorted(ends, r, side="right")  # `groups` past the groups
    g = jnp.minimum(r_group, groups - 1)
    dst = jnp.where(r_group < groups, padded_starts[g] + r - starts[g], nb * t)
    return src, q_group[::t], dst, nb


def _blocks(x_RxC, src, nb: int, t: int):
    return jnp.take(x_RxC, src, axis=0, mode="fill", fill_value=0).reshape(nb, t, x_RxC.shape[1])


def matmul(a_RxK, b_ExKxN, group_sizes_E, *, transpose_rhs: bool = False):
    """f32 [R, N]: rows of group e times b[e] ([E, N, K] and b[e]^T with transpose_rhs)."""
    rows = a_RxK.shape[0]
    t = block_rows(rows, group_sizes_E.shape[0])
    src, block_group, dst, nb = _layout(group_sizes_E, rows, t)
    a, b = promoted(a_RxK, b_ExKxN)
    w = jnp.take(b, block_group, axis=0)  # [NB, K, N] (or [NB, N, K])
    out = lax.dot_general(_blocks(a, src, nb, t), w, (([2], [2 if transpose_rhs else 1]), ([0], [0])),
                          preferred_element_type=F32, precision=exact_precision(a.dtype))
    return jnp.take(out.reshape(nb * t, -1), dst, axis=0, mode="fill", fill_value=0)


def wgrad(a_RxK, g_RxN, group_sizes_E):
    """f32 [E, K, N]: per group e, a[rows of e]^T @ g[rows of e] (empty groups: 0)."""
    rows, groups = a_RxK.shape[0], group_sizes_E.shape[0]
    t = block_rows(rows, groups)
    src, block_group, _, nb = _layout(group_sizes_E, rows, t)
    a, g = promoted(a_RxK, g_RxN)
    partial = lax.dot_general(_blocks(a, src, nb, t), _blocks(g, src, nb, t), (([1], [1]), ([0], [0])),
                              preferred_element_type=F32, precision=exact_precision(a.dtype))  # [NB, K, N]
    return jax.ops.segment_sum(partial, block_group, num_segments=groups, indices_are_sorted=True)
