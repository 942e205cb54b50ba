"""The policy side of RL: log-probs under the trainer's quantized forward, and the update step.

Everything here is per seed; the trainer vmaps it over a leading seed axis so that N seeds of
one arm run in one compiled program. Sequences are laid out as
`[left-padded prompt (Tp) | response (Tr)]`; the log-prob of token t comes from the logits at
t - 1, so the response log-probs are `logp_NxLm1[:, Tp-1:]`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fp4rl.model import transformer
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import dapo

GRAD_GROUPS = ("shared_expert", "routed_experts", "router", "attention", "last_layers", "embed_head")


def grad_group_of(path: str, ndim: int, num_layers: int, last_layers: int) -> tuple[str, ...]:
    """The grad-norm groups of RL.md a parameter belongs to (the last-layers group overlaps).

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
    covers the same parameters in every arm (RL.md).
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


def next_token_logprobs(logits_NxLxV, tokens_NxL):
    """log p(token_t | tokens_<t) for t = 1..L-1: [N, L-1], in float32."""
    logp = jax.nn.log_softmax(logits_NxLxV[:, :-1].astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens_NxL[:, 1:, None], axis=-1)[..., 0]


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
    kind: str = "dapo"  # "dapo" | "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    tis: bool = False
    tis_cap: float = 2.0
    kl_coef: float = 0.0  # GRPO only


def response_logprobs_fn(graphdef, recipe: PrecisionRecipe, prompt_len: int, impl: str = "auto") -> Callable:
    """Per seed: `response_logprobs(params, tokens, valid) -> (logp_NxTr, router_topk)`, the
    forward only (under `recipe.forward_only()`: the backward mode cannot change the values, and
    without it the program is the same for arms that differ only in their backward)."""
    forward_recipe = recipe.forward_only()

    def response_logprobs(params, tokens_NxL, valid_NxL):
        """Log-probs of the response tokens, and the router's top-k at the positions that
        predicted them (the sampler records the choices of the token it feeds, t - 1)."""
        logits, aux = transformer.forward(graphdef, params, tokens_NxL, forward_recipe, impl=impl, valid=valid_NxL)
        return next_token_logprobs(logits, tokens_NxL)[:, prompt_len - 1 :], aux["router_topk"][:, :, prompt_len - 1 : -1]

    return response_logprobs


def make_functions(graphdef, recipe: PrecisionRecipe, optimizer: optax.GradientTransformation, loss: LossConfig,
                   aux_loss_coef: float, prompt_len: int, masks, impl: str = "auto") -> dict[str, Callable]:
    """Per-seed pure functions: `response_logprobs(params, tokens, valid) -> (logp_NxTr, router_topk)`
    (see `response_logprobs_fn`) and `update(params, opt_state, batch, key, skip_nonfinite) ->
    (params, opt_state, metrics)`."""
    response_logprobs = response_logprobs_fn(graphdef, recipe, prompt_len, impl)

    def loss_fn(params, batch: Batch, key):
        logits, aux = transformer.forward(graphdef, params, batch.tokens_NxL, recipe, key=key, impl=impl, valid=batch.valid_NxL)
        logp = next_token_logprobs(logits, batch.tokens_NxL)[:, prompt_len - 1 :]
        mask = batch.response_mask_NxTr
        if loss.kind == "dapo":
            tis = dapo.tis_weights(batch.logp_old_NxTr, batch.logp_sampler_NxTr, loss.tis_cap) if loss.tis else None
            pg, stats = dapo.token_level_dapo_loss(logp, batch.logp_old_NxTr, batch.advantages_N, mask, loss.eps_low, loss.eps_high, tis)
        else:
            pg, stats = dapo.grpo_loss(logp, batch.logp_old_NxTr, batch.logp_ref_NxTr, batch.advantages_N, mask, kl_coef=loss.kl_coef, eps=loss.eps_low)
        entropy = dapo.masked_mean(dapo.token_entropy(logits[:, prompt_len - 1 : -1]), mask)
        total = pg + aux_loss_coef * aux["aux_loss"]
        stats = {**stats, "entropy": entropy, "loss/policy": pg, "loss/aux": aux["aux_loss"]}
        return total, stats

    def update(params, opt_state, batch: Batch, key, skip_nonfinite: bool):
        (total, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
        grad_norm = optax.tree.norm(grads)
        nonfinite = ~(jnp.isfinite(total) & jnp.isfinite(grad_norm))
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if skip_nonfinite:  # keep the old state: the step is skipped and logged as such
            keep = lambda new, old: jnp.where(nonfinite, old, new)  # noqa: E731
            new_params = jax.tree.map(keep, new_params, params)
            new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
        metrics = {"loss/total": total, "grad_norm/global": grad_norm, "nonfinite": nonfinite, **stats, **group_norms(grads, masks)}
        return new_params, new_opt_state, metrics

    return {"response_logprobs": response_logprobs, "update": update}


def make_optimizer(lr: float, warmup_steps: int, weight_decay: float, b1: float, b2: float, clip_norm: float) -> optax.GradientTransformation:
    """AdamW with linear warm-up then constant LR, after clipping the global norm (RL.md)."""
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)), optax.constant_schedule(lr)], [max(warmup_steps, 1)]
    )
    return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
