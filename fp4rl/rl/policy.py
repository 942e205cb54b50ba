"""The policy side of RL: log-probs under the trainer's quantized forward, and the update step.

Everything here is per seed; the trainer vmaps it over a leading seed axis so that N seeds of
one arm run in one compiled program. Sequences are laid out as
`[left-padded prompt (Tp) | response (Tr)]`; the log-prob of token t comes from the logits at
t - 1, so the response log-probs are `logp_NxLm1[:, Tp-1:]`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fp4rl.model import transformer
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import chunked_head, dapo, micro_batch
from fp4rl.rl.token_logprobs import next_token_logprobs

GRAD_GROUPS = ("shared_expert", "routed_experts", "router", "attention", "last_layers", "embed_head")


def grad_group_of(path: str, ndim: int, num_layers: int, last_layers: int) -> tuple[str, ...]:
    """The grad-norm groups of docs/rl.md a parameter belongs to (the last-layers group overlaps).

    Routed experts are the [E, K, N] stacks of an MoE block (a dense MLP has 2D weights).
    """
    groups = []
    parts = path.split("/")
    if parts[0] in ("embed", "head", "final_norm"):
        groups.append("embed_head")
    if "router" in parts:
        groups.append("router")
    elif "shared" in parts or "shared_gate" in parts:
        groups.append("shared_expert")
    elif "mlp" in parts and ndim == 3:
        groups.append("routed_experts")
    if "attn" in parts:
        groups.append("attention")
    if parts[0] == "layers" and int(parts[1]) >= num_layers - last_layers:
        groups.append("last_layers")
    return tuple(groups)


def grad_group_masks(params, num_layers: int) -> dict[str, object]:
    """Per group, a pytree of bools over `params` (True where the leaf is in the group).

    The last-layers group is the last 15% (at least one) whatever the arm, so the metric
    covers the same parameters in every arm (docs/rl.md).
    """
    last = PrecisionRecipe.from_name("full").num_high_precision_layers(num_layers)
    flat = transformer.flat_params(params)
    leaves, treedef = jax.tree.flatten(params)
    assert len(flat) == len(leaves)
    groups = [grad_group_of(path, leaf.ndim, num_layers, last) for path, leaf in flat.items()]
    masks = {}
    for group in GRAD_GROUPS:
        masks[group] = jax.tree.unflatten(treedef, [group in g for g in groups])
    return masks


def group_norms(grads, masks) -> dict[str, jax.Array]:
    out = {}
    for group, mask in masks.items():
        sq = [jnp.sum(jnp.square(g.astype(jnp.float32))) for g, m in zip(jax.tree.leaves(grads), jax.tree.leaves(mask)) if m]
        out[f"grad_norm/{group}"] = jnp.sqrt(sum(sq)) if sq else jnp.float32(0)
    return out


@dataclasses.dataclass(frozen=True)
class Batch:
    """One mini-batch of rollouts (per seed). Tp = prompt length, Tr = response length.

    tokens_NxL, valid_NxL: the full sequences and their real-token mask (L = Tp + Tr).
    response_mask_NxTr: the response tokens that count in the loss (up to and incl. EOS).
    logp_old_NxTr: trainer log-probs before the update; logp_sampler_NxTr: the sampler's.
    logp_ref_NxTr: the reference (warm-up) policy's; advantages_N: group-normalised.
    """

    tokens_NxL: jax.Array
    valid_NxL: jax.Array
    response_mask_NxTr: jax.Array
    logp_old_NxTr: jax.Array
    logp_sampler_NxTr: jax.Array
    logp_ref_NxTr: jax.Array
    advantages_N: jax.Array


jax.tree_util.register_dataclass(
    Batch,
    data_fields=["tokens_NxL", "valid_NxL", "response_mask_NxTr", "logp_old_NxTr", "logp_sampler_NxTr", "logp_ref_NxTr", "advantages_N"],
    meta_fields=[],
)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """kind: "dapo" (token-level clip-higher) or "grpo" (diagnostic arm).

    dual_clip: cap on the ratio term of negative-advantage tokens (Ye et al. 2020, "dual-clip
      PPO"; verl's clip_ratio_c, default 3): with A < 0 a token's loss is at most -A * dual_clip,
      so a token the new policy likes far more than the old one cannot dominate the update.
      None disables it.
    tis / tis_cap: token-level truncated importance sampling against the sampler's log-probs.
    kl_coef: GRPO's k3 KL to the reference (GRPO only).
    """

    kind: str = "dapo"  # "dapo" | "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float | None = 3.0
    tis: bool = False
    tis_cap: float = 2.0
    kl_coef: float = 0.0  # GRPO only

    def __post_init__(self):
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss.kind={self.kind!r}; valid options: {LOSS_KINDS}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"loss.dual_clip={self.dual_clip} must be > 1 (or none to disable it)")


LOSS_KINDS = ("dapo", "grpo")


@dataclasses.dataclass(frozen=True)
class UpdateMemory:
    """How the update trades compute for activation memory; the defaults change nothing.

    remat: rematerialise each layer in the backward (`transformer.forward(remat=True)`); values
      and gradients are unchanged.
    attention_query_chunk: queries per chunk of the attention (`transformer.forward`), 0: all at
      once; values unchanged, key and value gradients summed over chunks in another f32 order.
    micro_batches: forward and backward a mini-batch in this many chunks of rows, gradients summed,
      one optimizer step (`fp4rl.rl.micro_batch`, which says what stays the same).
    logit_chunk: > 0 applies the LM head to this many response positions at a time, each chunk's
      logits reduced to log-probs and entropies and recomputed in the backward
      (`fp4rl.rl.chunked_head`), so no [rows, tokens, V] logits are held; values the same up to the
      order of f32 sums. 0: the whole response at once.
    """

    remat: bool = False
    attention_query_chunk: int = 0
    micro_batches: int = 1
    logit_chunk: int = 0

    def __post_init__(self):
        if self.attention_query_chunk < 0:
            raise ValueError(f"attention_query_chunk={self.attention_query_chunk} must be >= 0 (0: all queries at once)")
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches={self.micro_batches} must be >= 1 (1: the whole mini-batch at once)")
        if self.logit_chunk < 0:
            raise ValueError(f"logit_chunk={self.logit_chunk} must be >= 0 (0: the whole response at once)")


def _response_forward(graphdef, recipe: PrecisionRecipe, prompt_len: int, impl: str, temperature: float,
                      memory: UpdateMemory = UpdateMemory()):
    """Per seed: `(params, tokens, valid, key) -> ((logp_NxTr, aux_loss), (logits_NxTrxV, router_topk))`,
    the one forward that both the update and every log-prob the trainer uses go through. With
    `memory.logit_chunk` the logits are never formed whole and the per-token entropy [N, Tr] takes
    their place (`entropy_fn` reads either)."""

    def run(params, tokens_NxL, valid_NxL, key):
        logits, aux = transformer.forward(graphdef, params, tokens_NxL, recipe, key=key, impl=impl, valid=valid_NxL,
                                          remat=memory.remat, attention_query_chunk=memory.attention_query_chunk,
                                          hidden=bool(memory.logit_chunk))
        if memory.logit_chunk:  # `logits` is (final-norm output, head)
            logp, entropy = chunked_head.response_stats(*logits, tokens_NxL, prompt_len, temperature, memory.logit_chunk)
            return (logp, aux["aux_loss"]), (entropy, aux["router_topk"][:, :, prompt_len - 1 : -1])
        logp = next_token_logprobs(logits, tokens_NxL, temperature)[:, prompt_len - 1 :]
        # The router's top-k at the positions that predicted the response tokens (the sampler
        # records the choices of the token it feeds, t - 1).
        return (logp, aux["aux_loss"]), (logits[:, prompt_len - 1 : -1], aux["router_topk"][:, :, prompt_len - 1 : -1])

    return run


def entropy_fn(temperature: float, memory: UpdateMemory) -> Callable:
    """The per-token entropy [N, Tr] from `_response_forward`'s second output: computed from the
    logits, or as it is where `memory.logit_chunk` made the forward return it."""
    if memory.logit_chunk:
        return lambda entropy_NxTr: entropy_NxTr
    return lambda logits_NxTrxV: dapo.token_entropy(logits_NxTrxV, temperature)


def response_logprobs_fn(graphdef, recipe: PrecisionRecipe, prompt_len: int, impl: str = "auto",
                         temperature: float = 1.0) -> Callable:
    """Per seed: `response_logprobs(params, tokens, valid) -> (logp_NxTr, router_topk)`, the
    forward only (under `recipe.forward_only()`: the backward mode cannot change the values, and
    without it the program is the same for arms that differ only in their backward). For tests
    and measurements; the trainer's own log-probs come from its update program (`make_functions`)."""
    forward = _response_forward(graphdef, recipe.forward_only(), prompt_len, impl, temperature)

    def response_logprobs(params, tokens_NxL, valid_NxL):
        (logp, _), (_, topk) = forward(params, tokens_NxL, valid_NxL, None)
        return logp, topk

    return response_logprobs


def objective(loss: LossConfig, aux_loss_coef: float):
    """`(logp_NxTr, aux_loss, batch) -> (total, stats)`: the policy loss of `loss` on the
    response log-probs plus the weighted load-balancing loss."""

    def total_loss(logp, aux_loss, batch: Batch):
        mask = batch.response_mask_NxTr
        if loss.kind == "dapo":
            tis = dapo.tis_weights(batch.logp_old_NxTr, batch.logp_sampler_NxTr, loss.tis_cap) if loss.tis else None
            pg, stats = dapo.token_level_dapo_loss(logp, batch.logp_old_NxTr, batch.advantages_N, mask, loss.eps_low,
                                                   loss.eps_high, tis, dual_clip=loss.dual_clip)
        else:
            pg, stats = dapo.grpo_loss(logp, batch.logp_old_NxTr, batch.logp_ref_NxTr, batch.advantages_N, mask,
                                       kl_coef=loss.kl_coef, eps=loss.eps_low, dual_clip=loss.dual_clip)
        return pg + aux_loss_coef * aux_loss, {**stats, "loss/policy": pg, "loss/aux": aux_loss}

    return total_loss


def make_loss_fn(graphdef, recipe: PrecisionRecipe, loss: LossConfig, aux_loss_coef: float, prompt_len: int,
                 impl: str = "auto", temperature: float = 1.0, on_policy: bool = False) -> Callable:
    """Per seed: `loss_fn(params, batch, key) -> (total, stats)`, differentiable in params (the
    update's loss; `jax.grad` of it is the recipe's gradient, e.g. for `fp4rl.studies.gradients`).

    on_policy: the old and reference log-probs are this very forward's, stop-gradient (the batch's
    are ignored), so the importance ratio is exactly 1 in any compute dtype: the gradient of the
    first update of a step, without the rounding differences of a separately compiled forward.
    """
    forward = _response_forward(graphdef, recipe, prompt_len, impl, temperature)
    total_loss = objective(loss, aux_loss_coef)

    def loss_fn(params, batch: Batch, key):
        (logp, aux_loss), _ = forward(params, batch.tokens_NxL, batch.valid_NxL, key)
        if on_policy:
            fixed = jax.lax.stop_gradient(logp)
            batch = dataclasses.replace(batch, logp_old_NxTr=fixed, logp_ref_NxTr=fixed)
        return total_loss(logp, aux_loss, batch)

    return loss_fn


def make_functions(graphdef, recipe: PrecisionRecipe, optimizer: optax.GradientTransformation, loss: LossConfig,
                   aux_loss_coef: float, prompt_len: int, masks, impl: str = "auto",
                   temperature: float = 1.0, memory: UpdateMemory = UpdateMemory()) -> dict[str, Callable]:
    """Per-seed pure functions: `response_logprobs` (see `response_logprobs_fn`) and
    `update(params, opt_state, batch, key, apply, skip_nonfinite) -> (params, opt_state, metrics)`.

    One program serves two passes. With `apply` False (a runtime bool) it only runs the forward
    and returns `metrics["logp"]` and `metrics["router_topk"]`, leaving params and optimizer state
    as they were: the trainer takes the old (and reference) log-probs of every mini-batch this way,
    so the first update of a step recomputes them bit for bit (importance ratio exactly 1) in any
    compute dtype. With `apply` True it also runs the backward and the AdamW step. The update is
    skipped (state kept, `metrics["skipped"]`) when the mini-batch has no loss token (dynamic
    sampling left it empty: Adam would otherwise step on its momentum alone) or, with
    `skip_nonfinite`, when the loss, gradient or update is not finite.
    memory: how the update trades compute for activation memory (`UpdateMemory`).
    """
    forward = _response_forward(graphdef, recipe, prompt_len, impl, temperature, memory)
    total_loss = objective(loss, aux_loss_coef)
    token_entropy = entropy_fn(temperature, memory)

    def update_all_rows(params, opt_state, batch: Batch, key, apply, skip_nonfinite: bool):
        (logp, aux_loss), backward, (logits, router_topk) = jax.vjp(
            lambda p: forward(p, batch.tokens_NxL, batch.valid_NxL, key), params, has_aux=True)
        (total, stats), (dlogp, daux) = jax.value_and_grad(
            lambda lp, al: total_loss(lp, al, batch), argnums=(0, 1), has_aux=True)(logp, aux_loss)
        # The backward runs only in the update pass; the forward above is shared by both passes.
        grads = jax.lax.cond(apply, lambda: backward((dlogp, daux))[0], lambda: jax.tree.map(jnp.zeros_like, params))
        new_params, new_opt_state, flags = optimizer_step(optimizer, params, opt_state, grads, total, batch, apply,
                                                          skip_nonfinite)
        entropy = dapo.masked_mean(token_entropy(logits), batch.response_mask_NxTr)
        metrics = {"loss/total": total, **flags, "entropy": entropy, "logp": logp, "router_topk": router_topk,
                   **stats, **group_norms(grads, masks)}
        return new_params, new_opt_state, metrics

    update = update_all_rows if memory.micro_batches == 1 else micro_batch.make_micro_batched_update(
        forward, total_loss, functools.partial(optimizer_step, optimizer), masks, token_entropy, memory.micro_batches,
        group_norms)
    return {"response_logprobs": response_logprobs_fn(graphdef, recipe, prompt_len, impl, temperature), "update": update}


def optimizer_step(optimizer, params, opt_state, grads, total, batch, apply, skip_nonfinite: bool):
    """(new params, new optimizer state, {grad_norm/global, nonfinite, empty, skipped}): the step
    of `grads`, kept only when `apply` and not skipped (no loss token, or not finite with
    `skip_nonfinite`: `make_functions`); the unchunked and the micro-batched update share it."""
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    nonfinite = ~(jnp.isfinite(total) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.tree.norm(updates)))
    empty = ~jnp.any(batch.response_mask_NxTr)
    skipped = empty | (nonfinite if skip_nonfinite else False)
    keep = ~jnp.asarray(apply) | skipped
    new_params = jax.tree.map(lambda new, old: jnp.where(keep, old, new), new_params, params)
    new_opt_state = jax.tree.map(lambda new, old: jnp.where(keep, old, new), new_opt_state, opt_state)
    return new_params, new_opt_state, {"grad_norm/global": grad_norm, "nonfinite": nonfinite, "empty": empty,
                                       "skipped": skipped}


def make_optimizer(lr: float, warmup_steps: int, weight_decay: float, b1: float, b2: float, clip_norm: float) -> optax.GradientTransformation:
    """AdamW after clipping the global norm (docs/rl.md), with a linear warm-up to `lr` over the first
    `warmup_steps` updates that starts at lr / warmup_steps, not at 0 (a first update at LR 0
    would move nothing while still advancing Adam's moments), then a constant LR."""
    warmup = max(warmup_steps, 1)

    def schedule(count):
        return lr * jnp.minimum(1.0, (count + 1) / warmup)

    return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
