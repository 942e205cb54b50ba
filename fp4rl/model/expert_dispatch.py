"""The dropless dispatch of the MoE's (token, choice) pairs: where each goes in the expert-sorted
buffer whose groups are padded to `group_align` rows, and the row gathers in and out of it.

Shared by the one-device MoE (`fp4rl.model.moe`) and its expert-parallel form
(`fp4rl.model.expert_parallel`, which groups the rows each device receives the same way), which the MoE
calls on a mesh: a module below both.

No scatter anywhere, forward or backward. XLA:GPU makes a scatter deterministic
(`--xla_gpu_deterministic_ops`, which the warm-ups need to be recreated bit for bit) by sorting its
updates, and the MoE's scatters (the index maps, and the gathers' transposes, scatter-adds of
[rows, D]) made a warm-up step of the h200 model 10.8x slower than without the flag
(benchmarks/README.md, "Warm-up step time"). Here the maps come from sorts and gathers, and each
row gather has a custom VJP whose transpose is another gather through the inverse map (every
source row feeds a fixed number of output rows), summed in a fixed order: deterministic by
construction on every backend.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def padded_rows(num_tokens: int, top_k: int, num_experts: int, align: int) -> int:
    """R: the static row bound of the sorted buffer. Each group wastes at most align - 1 rows."""
    rows = num_tokens * top_k + num_experts * (align - 1)
    return -(-rows // align) * align


class Dispatch(NamedTuple):
    """row_of_pair [T*k]: the buffer row of pair p = t * k + j; token_of_row [R]: the token of each
    row (T for padding rows); pair_of_row [R]: the pair of each row (T*k for padding rows);
    group_sizes [E]: each expert's count rounded up to `align` (their sum <= R, and qdot's ragged
    GEMM, told that rows past the sum are padding, leaves them at zero)."""

    row_of_pair: jax.Array
    token_of_row: jax.Array
    pair_of_row: jax.Array
    group_sizes: jax.Array


def dispatch(expert_TxK, num_experts: int, align: int) -> Dispatch:
    """Where each (token, choice) pair goes in the padded, expert-sorted buffer (see `Dispatch`)."""
    T, k = expert_TxK.shape
    P, R = T * k, padded_rows(T, k, num_experts, align)
    expert_P = expert_TxK.reshape(-1).astype(jnp.int32)  # pair p = t * k + j
    # Stable: pairs of one expert keep token order, so a token's row never depends on later tokens
    # of its own group (it can still shift by whole `align` blocks when earlier groups grow).
    order_P = jnp.argsort(expert_P, stable=True)
    counts_E = jnp.sum(expert_P[:, None] == jnp.arange(num_experts, dtype=jnp.int32), axis=0, dtype=jnp.int32)
    sizes_E = (counts_E + align - 1) // align * align
    start_E = jnp.cumsum(counts_E) - counts_E  # exclusive prefix sums
    padded_start_E = jnp.cumsum(sizes_E) - sizes_E
    sorted_expert_P = expert_P[order_P]
    rank_P = jnp.arange(P, dtype=jnp.int32) - start_E[sorted_expert_P]  # rank inside its group
    row_of_sorted_P = padded_start_E[sorted_expert_P] + rank_P
    row_of_pair_P = row_of_sorted_P[jnp.argsort(order_P)]  # the inverse permutation, by a sort
    # Row r belongs to the group whose padded range holds it (E: past the last group); it holds a
    # pair when its rank in the group is below the group's count.
    row_R = jnp.arange(R, dtype=jnp.int32)
    group_R = jnp.sum(row_R[:, None] >= (padded_start_E + sizes_E)[None, :], axis=1, dtype=jnp.int32)
    group_c_R = jnp.minimum(group_R, num_experts - 1)
    rank_R = row_R - padded_start_E[group_c_R]
    real_R = (group_R < num_experts) & (rank_R < counts_E[group_c_R])
    pair_of_row_R = jnp.where(real_R, order_P[jnp.clip(start_E[group_c_R] + rank_R, 0, P - 1)], P)
    token_of_row_R = jnp.where(real_R, pair_of_row_R // k, T)
    return Dispatch(row_of_pair_P, token_of_row_R, pair_of_row_R, sizes_E)


@jax.custom_vjp
def take_rows(src_SxD, index_O, inverse_SxM):
    """out[o] = src[index[o]], zero where index[o] == S. `inverse` lists, for each source row, the M
    output rows that read it (O where fewer do): the gradient is d_src[s] = sum_m g[inverse[s, m]],
    a gather summed over m in order (f32), where autodiff would transpose the gather to a scatter-add."""
    return jnp.take(src_SxD, index_O, axis=0, mode="fill", fill_value=0)


def _take_rows_fwd(src_SxD, index_O, inverse_SxM):
    return take_rows(src_SxD, index_O, inverse_SxM), inverse_SxM


def _take_rows_bwd(inverse_SxM, g_OxD):
    reads_SxMxD = jnp.take(g_OxD, inverse_SxM, axis=0, mode="fill", fill_value=0).astype(jnp.float32)
    d_src = reads_SxMxD[:, 0]
    for m in range(1, inverse_SxM.shape[1]):  # a fixed order, whatever the reduction's lowering
        d_src = d_src + reads_SxMxD[:, m]
    return d_src.astype(g_OxD.dtype), None, None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def rows_of_tokens(x_TxD, d: Dispatch):
    """The buffer [R, D]: each row the token it holds, padding rows zero."""
    T = x_TxD.shape[0]
    return take_rows(x_TxD, d.token_of_row, d.row_of_pair.reshape(T, -1))


def pairs_of_rows(y_RxD, d: Dispatch):
    """Each pair's buffer row, [T*k, D] (the inverse of `rows_of_tokens`' layout)."""
    return take_rows(y_RxD, d.row_of_pair, d.pair_of_row[:, None])
