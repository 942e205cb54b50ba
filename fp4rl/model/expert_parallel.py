"""The MoE's routed experts on a (data, expert) mesh: dropless, inside `jax.shard_map`.

Layout. Tokens are split over both mesh axes (each device holds T / (data * expert) rows);
the expert stacks ([E, D, 2F] and [E, F, D], raw or pre-quantized by the weight sync) are split
along E over "expert" (E / expert experts per device) and replicated over "data". A quantized
stack is quantized one expert at a time (`qlinear.quantize_weight`: per-expert amax), so the
shard of a device is byte for byte the slice of the one-device stack: nothing about the
numerics changes, only where each expert lives.

Per device, with M = |expert| and E_l = E / M local experts:
1. (token, choice) pairs go to device `expert // E_l` of the expert axis. The send buffer has,
   for every destination, C = T_local * k slots (the dropless bound: every pair of this device
   may choose experts of one device); slot (d, r) holds the r-th pair for d in (expert, token)
   order, unused slots are zero rows carrying the local-expert id E_l ("none").
2. `lax.all_to_all` over "expert" exchanges the [M, C, D] rows and the [M, C] local-expert ids.
3. The received rows are grouped by local expert exactly as the one-device MoE groups its
   tokens (`expert_dispatch.dispatch`, padded to `group_align`; the "none" rows form a last group that the
   ragged GEMM is told is padding), run through the same `site_dot`s, and
4. a second `all_to_all` returns each result to the slot it came from; the k results of a
   token are combined in f32 with its router weights, as on one device.
Within an expert's group the rows keep global token order (sources in mesh order hold
consecutive token chunks, and every sort is stable), so per row the GEMMs see the same operands
as on one device. With M = 1 (pure data parallelism) steps 1, 2 and 4 vanish: each device runs
the one-device dispatch on its own tokens.

The backward is JAX's: all_to_all transposes to all_to_all, and the weights, replicated over
"data", enter through `lax.pcast(..., to="varying")`, whose transpose sums their cotangents over
"data" (the data-parallel all-reduce of the expert gradients).

Communication (docs/parallel.md): the dense all_to_all moves M * C = M * T_local * k rows per
device per direction, M times the rows really routed. `lax.ragged_all_to_all` would move only
the routed rows, but XLA:CPU cannot run it (UNIMPLEMENTED in jaxlib 0.11.2), so the tested
exchange is the dense one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fp4rl.model.expert_dispatch import dispatch, pairs_of_rows, rows_of_tokens
from fp4rl.model.layers import swiglu_act, widen
from fp4rl.model.sites import site_dot
from fp4rl.parallel.mesh import DATA, EXPERT

TOKENS = P((DATA, EXPERT))  # rows split over every device
EXPERTS = P(EXPERT)  # leading E axis split over the expert axis (every leaf of a quantized stack too)


def _ffn(moe, x_RxD, gate_up, down, sizes_E, ctx):
    """The routed experts' SwiGLU on expert-sorted rows: the one-device MoE's two site_dots."""
    kinds = moe.site_kinds()

    def dot(h, w, name):
        return site_dot(h, w, ctx, kinds[name], moe.layer, f"experts.{name}", group_sizes=sizes_E, padding_rows=True,
                        gemm=moe.expert_gemm)

    return dot(swiglu_act(dot(x_RxD, gate_up, "gate_up")), down, "down")


def _local(moe, x_TxD, expert_TxK, gate_up, down, ctx):
    """[T, k, D] expert outputs, every expert on this device (pure data parallelism)."""
    T, D = x_TxD.shape
    d = dispatch(expert_TxK, moe.num_experts, moe.group_align)
    y_RxD = _ffn(moe, rows_of_tokens(x_TxD, d), gate_up, down, d.group_sizes, ctx)
    return pairs_of_rows(y_RxD, d).reshape(T, moe.top_k, D)


def _exchanged(moe, x_TxD, expert_TxK, gate_up, down, ctx, M: int):
    """[T, k, D] expert outputs with E / M experts per device, pairs routed by all_to_all."""
    T, D = x_TxD.shape
    k = moe.top_k
    E_l = moe.num_experts // M
    C = T * k  # slots per destination: the dropless bound
    expert_P = expert_TxK.reshape(-1)
    dest_P = expert_P // E_l
    order_P = jnp.argsort(expert_P, stable=True)  # by expert, hence by destination; token order kept
    counts_M = jnp.bincount(dest_P, length=M).astype(jnp.int32)
    start_M = jnp.cumsum(counts_M) - counts_M
    sorted_dest_P = dest_P[order_P]
    rank_P = jnp.arange(T * k, dtype=jnp.int32) - start_M[sorted_dest_P]
    slot_of_pair_P = jnp.zeros(T * k, jnp.int32).at[order_P].set(sorted_dest_P * C + rank_P)
    token_of_slot = jnp.full(M * C, T, jnp.int32).at[slot_of_pair_P].set(jnp.arange(T * k, dtype=jnp.int32) // k)
    local_expert_of_slot = jnp.full(M * C, E_l, jnp.int32).at[slot_of_pair_P].set(expert_P % E_l)

    send_MxCxD = jnp.concatenate([x_TxD, jnp.zeros((1, D), x_TxD.dtype)], axis=0)[token_of_slot].reshape(M, C, D)
    recv_MxCxD = jax.lax.all_to_all(send_MxCxD, EXPERT, 0, 0)
    recv_expert_MxC = jax.lax.all_to_all(local_expert_of_slot.reshape(M, C), EXPERT, 0, 0)

    # Group the received rows by local expert like the one-device dispatch; "none" (E_l) is last.
    d = dispatch(recv_expert_MxC.reshape(-1, 1), E_l + 1, moe.group_align)
    y_RxD = _ffn(moe, rows_of_tokens(recv_MxCxD.reshape(M * C, D), d), gate_up, down, d.group_sizes[:E_l], ctx)
    back_MxCxD = jax.lax.all_to_all(pairs_of_rows(y_RxD, d).reshape(M, C, D), EXPERT, 0, 0)
    return back_MxCxD.reshape(M * C, D)[slot_of_pair_P].reshape(T, k, D)


def experts(moe, x_TxD, weight_TxK, expert_TxK, ctx, mesh):
    """`MoE.experts` on `mesh` (see the module docstring); the same values as on one device up to
    the GEMMs' accumulation order."""
    T = x_TxD.shape[0]
    M, n = mesh.shape[EXPERT], mesh.shape[DATA] * mesh.shape[EXPERT]
    if T % n:
        raise ValueError(f"the MoE got {T} tokens, not a multiple of the mesh's {n} devices (data x expert): "
                         "make the batch rows a multiple of mesh.data * mesh.expert")
    if moe.num_experts % M:
        raise ValueError(f"num_experts={moe.num_experts} must be a multiple of mesh.expert={M}")

    def per_device(x, e, gate_up, down):
        # The weights are replicated over "data" but meet rows that vary over it: cast them to
        # varying first, so qdot's custom_vjp returns a cotangent of the type it was given; the
        # transpose of this cast is the psum over "data" (the data-parallel all-reduce).
        gate_up, down = jax.lax.pcast((gate_up, down), DATA, to="varying")
        if M == 1:
            return _local(moe, x, e, gate_up, down, ctx)
        return _exchanged(moe, x, e, gate_up, down, ctx, M)

    y_TxKxD = jax.shard_map(per_device, mesh=mesh, in_specs=(TOKENS, TOKENS, EXPERTS, EXPERTS), out_specs=TOKENS)(
        x_TxD, expert_TxK, moe.gate_up.get_value(), moe.down.get_value())
    y_TxD = jnp.einsum("tk,tkd->td", weight_TxK, widen(y_TxKxD))  # combine in f32, as on one device
    return y_TxD.astype(x_TxD.dtype)
