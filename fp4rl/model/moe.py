"""The MoE block: router, dropless routed experts, optional (gated) shared expert, Switch aux loss.

Router (Qwen2/3-MoE): logits in f32, softmax over all E experts, top-k, optionally renormalised.
Routed experts are weight stacks (gate|up fused [E, D, 2F], down [E, F, D]) applied **dropless**: the
T*k (token, expert) pairs are sorted by expert, every expert's group is padded with zero rows
up to a multiple of `group_align`, and one ragged `qdot` per projection runs all experts. No
capacity factor: no token is ever dropped, whatever the routing, so a token's output depends
on that token alone (with per-token activation scales), which batch invariance and causality
need (docs/numerics.md §4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fp4rl.model.config import ModelConfig
from fp4rl.model.expert_dispatch import dispatch, pairs_of_rows, rows_of_tokens
from fp4rl.model.layers import SwiGLU, dtype_of, normal_init, swiglu_act, widen
from fp4rl.model.sites import Ctx, site_dot
from fp4rl.model import expert_parallel
from fp4rl.parallel.mesh import active_mesh

F32 = jnp.float32


class MoE(nnx.Module):
    def __init__(self, config: ModelConfig, layer: int, rngs: nnx.Rngs):
        D, F, E, pd = config.d_model, config.moe_d_ff, config.num_experts, dtype_of(config.param_dtype)
        down_scale = (2 * config.num_layers) ** -0.5
        self.router = nnx.Param(normal_init(rngs, (D, E), D, pd))
        self.gate_up = nnx.Param(normal_init(rngs, (E, D, 2 * F), D, pd))  # gate | up per expert
        self.down = nnx.Param(normal_init(rngs, (E, F, D), F, pd, down_scale))
        if config.shared_expert_d_ff:
            self.shared = SwiGLU(config, layer, config.shared_expert_d_ff, "shared_expert", rngs)
        if config.shared_expert_gate:
            self.shared_gate = nnx.Param(normal_init(rngs, (D, 1), D, pd))
        self.layer, self.num_experts, self.top_k = layer, E, config.top_k
        self.norm_topk_prob, self.group_align = config.norm_topk_prob, config.group_align
        self.expert_gemm = config.resolved().expert_gemm  # a backend, also for an MoE built alone
        self.has_shared, self.has_shared_gate = bool(config.shared_expert_d_ff), config.shared_expert_gate

    def site_kinds(self) -> dict[str, str]:
        """Weight attribute -> recipe site kind. The shared expert's scalar gate is a router-like
        site ([D, 1]: too narrow for 16x16 weight tiles; BF16 with the router in every preset)."""
        kinds = {"router": "router", "gate_up": "routed_experts", "down": "routed_experts"}
        if self.has_shared_gate:
            kinds["shared_gate"] = "router"
        return kinds

    def route(self, x_TxD, ctx: Ctx):
        """(probs_TxE f32, weight_TxK f32, expert_TxK int32), top-k in descending probability."""
        # f32 logits: near-ties between experts decide routing, and bf16 logits would flip them.
        logits_TxE = site_dot(widen(x_TxD), self.router.get_value(), ctx, self.site_kinds()["router"],
                              self.layer, "router")
        probs_TxE = jax.nn.softmax(logits_TxE.astype(F32), axis=-1)
        _, expert_TxK = jax.lax.top_k(jax.lax.stop_gradient(probs_TxE), self.top_k)
        # The top-k probabilities as a one-hot product (exact: one nonzero term per sum), whose
        # gradient is a product too; top_k's own is a scatter (see `expert_dispatch`).
        weight_TxK = jnp.einsum("tke,te->tk", jax.nn.one_hot(expert_TxK, self.num_experts, dtype=F32), probs_TxE,
                                precision=jax.lax.Precision.HIGHEST)
        if self.norm_topk_prob:
            weight_TxK = weight_TxK / jnp.sum(weight_TxK, axis=-1, keepdims=True)
        return probs_TxE, weight_TxK, expert_TxK.astype(jnp.int32)

    def experts(self, x_TxD, weight_TxK, expert_TxK, ctx: Ctx):
        """sum_j weight[t, j] * expert_{expert[t, j]}(x[t]) for every token, dropless. Under a
        `jax.set_mesh` of a (data, expert) mesh the experts run sharded (`fp4rl.model.expert_parallel`)."""
        mesh = active_mesh()
        if mesh is not None:
            return expert_parallel.experts(self, x_TxD, weight_TxK, expert_TxK, ctx, mesh)
        T, D = x_TxD.shape
        d = dispatch(expert_TxK, self.num_experts, self.group_align)
        # Padding rows are zero: they quantize to zeros and cost no accuracy.
        x_RxD = rows_of_tokens(x_TxD, d)
        dot = lambda h, name: site_dot(h, getattr(self, name).get_value(), ctx, self.site_kinds()[name],  # noqa: E731
                                       self.layer, f"experts.{name}", group_sizes=d.group_sizes, padding_rows=True,
                                       gemm=self.expert_gemm)
        h_RxF = swiglu_act(dot(x_RxD, "gate_up"))
        y_RxD = dot(h_RxF, "down")
        y_TxKxD = pairs_of_rows(y_RxD, d).reshape(T, self.top_k, D)
        y_TxD = jnp.einsum("tk,tkd->td", weight_TxK, widen(y_TxKxD))  # combine in f32
        return y_TxD.astype(x_TxD.dtype)

    def __call__(self, x_BxLxD, valid_BxL, ctx: Ctx):
        """Returns (y_BxLxD, expert_BxLxK, aux_loss (), load_E): load_E is each expert's share of
        the valid tokens' k assignments; aux_loss = E * sum_e load_e * mean_prob_e (Switch)."""
        B, L, D = x_BxLxD.shape
        x_TxD = x_BxLxD.reshape(B * L, D)
        probs_TxE, weight_TxK, expert_TxK = self.route(x_TxD, ctx)
        y_TxD = self.experts(x_TxD, weight_TxK, expert_TxK, ctx)
        if self.has_shared:
            shared_TxD = self.shared(x_TxD, ctx)
            if self.has_shared_gate:  # Qwen2-MoE: a per-token scalar gate; a router-like site
                g_Tx1 = site_dot(x_TxD, self.shared_gate.get_value(), ctx, self.site_kinds()["shared_gate"], self.layer,
                                 "shared_gate")
                shared_TxD = (jax.nn.sigmoid(widen(g_Tx1)) * widen(shared_TxD)).astype(x_TxD.dtype)
            y_TxD = y_TxD + shared_TxD

        valid_T = valid_BxL.reshape(-1).astype(F32)
        n_valid = jnp.maximum(jnp.sum(valid_T), 1.0)
        onehot_TxE = jnp.sum(jax.nn.one_hot(expert_TxK, self.num_experts, dtype=F32), axis=1)
        load_E = jnp.sum(onehot_TxE * valid_T[:, None], axis=0) / (n_valid * self.top_k)
        mean_prob_E = jnp.sum(probs_TxE * valid_T[:, None], axis=0) / n_valid
        aux_loss = self.num_experts * jnp.sum(load_E * mean_prob_E)
        return y_TxD.reshape(B, L, D), expert_TxK.reshape(B, L, self.top_k), aux_loss, load_E
