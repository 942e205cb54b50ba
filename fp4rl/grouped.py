"""Grouped (ragged) matmuls that survive any number of `vmap`s.

`lax.ragged_dot` only batches when every operand carries its batch axis at 0, so vmapping a
MoE over seeds (or over anything that leaves the weights unbatched) fails. Here a batch of B
ragged problems is folded into ONE ragged problem: the rows of problem b are followed by a
dummy group that absorbs its padding rows, so group g of problem b becomes group
b * (E + 1) + g of the folded problem, with a zero weight for every dummy group. The rule
calls the same custom-vmapped function again, so nested vmaps fold level by level.

Both functions take and return arrays whose per-problem shapes are:
- `ragged_matmul(a_RxK, b_ExKxN, group_sizes_E) -> [R, N]` (rows of group e use b[e]; rows
  past sum(group_sizes) give zeros, as `lax.ragged_dot` does);
- `ragged_wgrad(a_RxK, g_RxN, group_sizes_E) -> [E, K, N]` (per group: a_e^T @ g_e).
Accumulation is float32 (`preferred_element_type`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32
_WGRAD_DIMS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[]
)


def _batched(x, is_batched: bool, n: int):
    return x if is_batched else jnp.broadcast_to(x, (n, *x.shape))


def _folded_group_sizes(group_sizes_BxE, num_rows: int):
    """[B, E] -> [B * (E + 1)]: each problem's groups plus a dummy group for its remaining rows."""
    rest = num_rows - jnp.sum(group_sizes_BxE, axis=1, keepdims=True)
    return jnp.concatenate([group_sizes_BxE, rest], axis=1).reshape(-1).astype(jnp.int32)


@jax.custom_batching.custom_vmap
def ragged_matmul(a_RxK, b_ExKxN, group_sizes_E):
    return lax.ragged_dot(a_RxK, b_ExKxN, group_sizes_E, preferred_element_type=F32)


@ragged_matmul.def_vmap
def _ragged_matmul_vmap(n, in_batched, a, b, group_sizes):
    a, b, group_sizes = (_batched(x, flag, n) for x, flag in zip((a, b, group_sizes), in_batched))
    _, rows, k = a.shape
    _, e, _, cols = b.shape
    b_padded = jnp.concatenate([b, jnp.zeros((n, 1, k, cols), b.dtype)], axis=1)  # the dummy groups
    out = ragged_matmul(a.reshape(n * rows, k), b_padded.reshape(n * (e + 1), k, cols), _folded_group_sizes(group_sizes, rows))
    return out.reshape(n, rows, cols), True


@jax.custom_batching.custom_vmap
def ragged_wgrad(a_RxK, g_RxN, group_sizes_E):
    return lax.ragged_dot_general(a_RxK, g_RxN, group_sizes_E, _WGRAD_DIMS, preferred_element_type=F32)


@ragged_wgrad.def_vmap
def _ragged_wgrad_vmap(n, in_batched, a, g, group_sizes):
    a, g, group_sizes = (_batched(x, flag, n) for x, flag in zip((a, g, group_sizes), in_batched))
    _, rows, k = a.shape
    e = group_sizes.shape[1]
    out = ragged_wgrad(a.reshape(n * rows, k), g.reshape(n * rows, -1), _folded_group_sizes(group_sizes, rows))
    return out.reshape(n, e + 1, k, -1)[:, :e], True
