"""The dropless dispatch of the MoE's (token, choice) pairs: where each goes in the expert-sorted
buffer whose groups are padded to `group_align` rows.

Shared by the one-device MoE (`fp4rl.model.moe`) and its expert-parallel form
(`fp4rl.parallel.expert`, which groups the rows each device receives the same way), which the MoE
calls on a mesh: a module below both.
"""

from __future__ import annotations

import jax.numpy as jnp


def padded_rows(num_tokens: int, top_k: int, num_experts: int, align: int) -> int:
    """R: the static row bound of the sorted buffer. Each group wastes at most align - 1 rows."""
    rows = num_tokens * top_k + num_experts * (align - 1)
    return -(-rows // align) * align


def dispatch(expert_TxK, num_experts: int, align: int):
    """Where each (token, choice) pair goes in the padded, expert-sorted buffer.

    Returns (row_of_pair [T*k] int32, token_of_row [R] int32 (T for padding rows),
    group_sizes [E] int32: each expert's count rounded up to `align`; their sum <= R, and
    qdot's ragged GEMM, told that rows past the sum are padding, leaves them at zero).
    """
    T, k = expert_TxK.shape
    R = padded_rows(T, k, num_experts, align)
    expert_P = expert_TxK.reshape(-1).astype(jnp.int32)  # pair p = t * k + j
    # Stable: pairs of one expert keep token order, so a token's row never depends on later tokens
    # of its own group (it can still shift by whole `align` blocks when earlier groups grow).
    order_P = jnp.argsort(expert_P, stable=True)
    counts_E = jnp.bincount(expert_P, length=num_experts).astype(jnp.int32)
    sizes_E = (counts_E + align - 1) // align * align
    start_E = jnp.cumsum(counts_E) - counts_E  # exclusive prefix sums
    padded_start_E = jnp.cumsum(sizes_E) - sizes_E
    sorted_expert_P = expert_P[order_P]
    rank_P = jnp.arange(T * k, dtype=jnp.int32) - start_E[sorted_expert_P]  # rank inside its group
    row_of_sorted_P = padded_start_E[sorted_expert_P] + rank_P
    row_of_pair_P = jnp.zeros(T * k, jnp.int32).at[order_P].set(row_of_sorted_P)
    token_of_row_R = jnp.full(R, T, jnp.int32).at[row_of_pair_P].set(jnp.arange(T * k, dtype=jnp.int32) // k)
    return row_of_pair_P, token_of_row_R, sizes_E
