"""The RL update over a mini-batch's rows in `micro_batches` sequential chunks, one optimizer step.

Activations scale with the rows one forward takes; this update runs the forward and backward of
a mini-batch of N rows as k chunks of N / k rows (a `lax.scan`), summing their gradients, then
takes the one AdamW step of the unchunked update (`policy.make_functions`). Chunk c holds rows
c, c + k, c + 2k, ...: a device's contiguous share of the rows (data parallelism splits rows in
blocks) then contributes to every chunk, so no chunk needs rows from another device.

What is the same as unchunked, and what is not:
* The policy loss (DAPO's token mean, GRPO's sequence mean) is separable over rows given the
  mini-batch's counts: a token's cotangent depends on its own log-prob and on how many tokens
  (rows) the whole mini-batch has. Each chunk's cotangent is taken from the mini-batch's objective
  with the chunk's log-probs put into a full-size array (the other rows held constant), so it is
  bit for bit the unchunked cotangent; the chunk gradients then add in a different f32 order
  than one backward over all rows.
* Every logged statistic (loss, clip fractions, ratios, KL, entropy) is computed once, from the
  chunks' log-probs and per-token entropies reassembled in row order: the same quantities.
* The load-balancing (Switch) loss is per forward, a nonlinear function of the routed tokens'
  shares; with k chunks it is the mean of the chunks' losses (as micro-batched MoE training
  computes it), not the loss of all N rows at once. Its weight is `aux_loss_coef` (1e-3).
* A recipe that quantizes activations with a per-tensor scale (NVFP4's global amax) takes that
  amax over the chunk's rows; the old log-probs come from the same chunked program, so the first
  update's importance ratio is still exactly 1.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fp4rl.rl import dapo


def valid_micro_batches(rows: int, devices: int = 1) -> list[int]:
    """The chunk counts that split `rows` rows into equal chunks, each with an equal share on every
    one of `devices` devices (data parallelism splits each chunk's rows over them); the rollout's
    `generation_chunks` follow the same rule."""
    return [k for k in range(1, rows + 1) if rows % k == 0 and (rows // k) % devices == 0]


def check_micro_batches(micro_batches: int, rows: int, devices: int = 1) -> None:
    """A mini-batch of `rows` rows splits into `micro_batches` equal chunks, and on a mesh of
    `devices` devices every chunk splits evenly over them."""
    if micro_batches < 1 or rows % micro_batches:
        raise ValueError(f"memory.micro_batches={micro_batches} must be >= 1 and divide the {rows} rows of a mini-batch "
                         f"(prompts_per_step * group_size / mini_batches); valid options: "
                         f"{', '.join(map(str, valid_micro_batches(rows)))}")
    if (rows // micro_batches) % devices:
        raise ValueError(f"memory.micro_batches={micro_batches} leaves {rows // micro_batches} rows per micro-batch, "
                         f"not a multiple of the mesh's devices (every device takes an equal share of each "
                         f"micro-batch's rows); valid options on mesh.data * mesh.expert = {devices} devices: "
                         f"{', '.join(map(str, valid_micro_batches(rows, devices)))}")


def to_chunks(x, k: int):
    """[N, ...] -> [k, N / k, ...], chunk c holding rows c, c + k, ... (module docstring)."""
    return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)


def from_chunks(x, axis: int = 0):
    """The inverse of `to_chunks` for chunks stacked on axis 0 and rows on `axis` + 1 of a chunk."""
    k = x.shape[0]
    x = jnp.moveaxis(x, 0, axis + 1)  # [..., N / k, k, ...]
    return x.reshape(*x.shape[:axis], x.shape[axis] * k, *x.shape[axis + 2:])


def make_micro_batched_update(forward: Callable, total_loss: Callable, optimizer_step: Callable,
                              masks, token_entropy: Callable, micro_batches: int, group_norms: Callable) -> Callable:
    """`update(params, opt_state, batch, key, apply, skip_nonfinite)` with the contract of the
    unchunked update (`policy.make_functions`), over `micro_batches` chunks of rows.

    forward: `policy._response_forward`'s per-seed function; total_loss: `policy.objective`'s;
    optimizer_step: the unchunked update's step (`policy.optimizer_step` with its optimizer).
    token_entropy: the per-token entropy from the forward's second output (`policy.entropy_fn`).
    """
    k = micro_batches

    def update(params, opt_state, batch, key, apply, skip_nonfinite: bool):
        rows = batch.tokens_NxL.shape[0]
        check_micro_batches(k, rows)
        chunks = jax.tree.map(lambda x: to_chunks(x, k), batch)
        zeros = jax.tree.map(jnp.zeros_like, params)

        def chunk_step(grads, c):
            chunk = jax.tree.map(lambda x: x[c], chunks)
            (logp, aux_loss), backward, (logits, router_topk) = jax.vjp(
                lambda p: forward(p, chunk.tokens_NxL, chunk.valid_NxL, key), params, has_aux=True)

            def loss_of_chunk(logp_c, aux_c):
                # The mini-batch's objective with this chunk's rows in place: its counts are the
                # whole mini-batch's, so the chunk's cotangent is the unchunked one.
                logp_full = from_chunks(to_chunks(batch.logp_old_NxTr, k).at[c].set(logp_c))
                return total_loss(logp_full, aux_c / k, batch)[0]

            dlogp, daux = jax.grad(loss_of_chunk, argnums=(0, 1))(logp, aux_loss)
            # The backward runs only in the update pass (as unchunked).
            grads = jax.lax.cond(apply, lambda: jax.tree.map(jnp.add, grads, backward((dlogp, daux))[0]),
                                 lambda: grads)
            entropy = token_entropy(logits)
            return grads, (logp, aux_loss, entropy, router_topk)

        grads, (logp, aux_losses, entropy, router_topk) = jax.lax.scan(chunk_step, zeros, jnp.arange(k))
        logp, entropy = from_chunks(logp), from_chunks(entropy)
        router_topk = from_chunks(router_topk, axis=1)  # [k, L_moe, N / k, T, top_k]
        total, stats = total_loss(logp, jnp.mean(aux_losses), batch)
        new_params, new_opt_state, flags = optimizer_step(params, opt_state, grads, total, batch, apply, skip_nonfinite)
        metrics = {"loss/total": total, **flags, "entropy": dapo.masked_mean(entropy, batch.response_mask_NxTr),
                   "logp": logp, "router_topk": router_topk, **stats, **group_norms(grads, masks)}
        return new_params, new_opt_state, metrics

    return update
