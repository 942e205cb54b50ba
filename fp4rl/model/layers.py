"""RMSNorm, RoPE, GQA attention with a KV-cache path, and the SwiGLU MLP (Flax NNX).

Conventions follow Hugging Face Qwen2-MoE / Qwen3-MoE (tests/fixtures/hf/README.md), so a
checkpoint imported by `fp4rl.model.hf` reproduces transformers' logits:
- RMSNorm: x * rsqrt(mean(x^2) + eps) in f32, cast to the compute dtype, times plain `w`
  (not 1 + w).
- RoPE: half-split (GPT-NeoX) layout, dim i pairs with i + Dh/2; q/k RMSNorm (Qwen3) before it.
- Weights are stored [in, out] (HF stores [out, in]); q|k|v and gate|up are fused column-wise;
  biases are added after the matmul.
Every matmul with a weight goes through `sites.site_dot`; norms are never quantized.

Stored values. In bf16 compute, every op that widens a bf16 activation to f32 (RMSNorm, RoPE,
the SwiGLU activation, the router input, the MoE combine and the shared-expert gate) reads it
through `widen`. XLA allows excess precision by default (`xla_allow_excess_precision`): it may
hand a widening op the producer's unrounded f32 value instead of the stored bf16 one (XLA:CPU
does so for the residual add that feeds RMSNorm). That is a compiler decision which depends on
the program, so the rounding, and the NVFP4 codes downstream, could differ between the sampler's
decode, the trainer's forward and two fusions of one program. `widen` puts `ieee.as_stored`, the
barrier the quantizers put on their input, before the cast; RMSNorm's output is stored too, since
the LM head widens it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fp4rl.formats import ieee
from fp4rl.model.config import ModelConfig
from fp4rl.model.sites import Ctx, site_dot

F32 = jnp.float32


def widen(x):
    """`x` in f32 from its stored value (never the producer's unrounded f32; module docstring)."""
    return ieee.as_stored(x).astype(F32)


def dtype_of(name: str):
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def normal_init(rngs: nnx.Rngs, shape, fan_in: int, dtype, scale: float = 1.0):
    """N(0, scale^2 / fan_in): unit-variance outputs for unit-variance inputs (LeCun)."""
    return (jax.random.normal(rngs.params(), shape, F32) * (scale * fan_in**-0.5)).astype(dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, param_dtype):
        self.w = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x):
        # HF order: normalise in f32, cast to the input dtype, then multiply by w (stored: the LM
        # head widens it to f32).
        x32 = widen(x)
        y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return ieee.as_stored(y.astype(x.dtype) * self.w.get_value().astype(x.dtype))


def rope(x_BxLxHxDh, positions_BxL, theta: float):
    """Rotary embedding, half-split layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in f32."""
    dh = x_BxLxHxDh.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=F32) / dh))  # [Dh/2], as HF computes it
    angle_BxLx1xDh2 = (positions_BxL.astype(F32)[..., None] * inv_freq)[:, :, None, :]
    cos, sin = jnp.cos(angle_BxLx1xDh2), jnp.sin(angle_BxLx1xDh2)
    x1, x2 = jnp.split(widen(x_BxLxHxDh), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxLxHxDh.dtype)


class Attention(nnx.Module):
    """Causal GQA attention; query head h uses KV head h // (H / K) (HF `repeat_kv`).

    q, k and v are one fused weight [D, (H + 2K) * Dh], columns q | k | v, head-major inside
    each (as Megatron/TransformerEngine fuse QKV): one activation quantization and one GEMM per
    input, and one NVFP4 weight tensor (one global scale) for the three projections.
    """

    def __init__(self, config: ModelConfig, layer: int, rngs: nnx.Rngs):
        D, Dh, pd = config.d_model, config.head_dim, dtype_of(config.param_dtype)
        H, K = config.num_heads, config.num_kv_heads
        out_scale = (2 * config.num_layers) ** -0.5  # residual branches sum over 2N layers (GPT-2)
        self.qkv = nnx.Param(normal_init(rngs, (D, (H + 2 * K) * Dh), D, pd))
        self.o = nnx.Param(normal_init(rngs, (H * Dh, D), H * Dh, pd, out_scale))
        if config.qkv_bias:
            self.qkv_bias = nnx.Param(jnp.zeros(((H + 2 * K) * Dh,), pd))
        if config.qk_norm:
            self.q_norm = RMSNorm(Dh, config.rms_eps, pd)
            self.k_norm = RMSNorm(Dh, config.rms_eps, pd)
        self.layer, self.num_heads, self.num_kv_heads, self.head_dim = layer, H, K, Dh
        self.has_bias, self.qk_norm, self.rope_theta = config.qkv_bias, config.qk_norm, config.rope_theta

    def site_kinds(self) -> dict[str, str]:
        """Weight attribute -> recipe site kind (read by the forward and by `sync_weights`)."""
        return {"qkv": "attention", "o": "attention"}

    def __call__(self, x_BxLxD, positions_BxL, mask_BxLxS, ctx: Ctx, kv_cache=None, index=None):
        """mask_BxLxS: True where query l may attend key slot s. Without a cache S == L and the
        keys are this call's tokens; with `kv_cache` = (k, v) of this layer ([B, K, S, Dh], one
        entry of `KVCache`) the new keys are written into slots index..index+L-1 first, in place,
        and the attention reads the updated buffer where it lies.
        Returns (y_BxLxD, the updated (k, v) or None).
        """
        B, L, _ = x_BxLxD.shape
        H, K, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = site_dot(x_BxLxD, self.qkv.get_value(), ctx, self.site_kinds()["qkv"], self.layer, "qkv")
        if self.has_bias:  # Qwen2: biases on q, k, v (never on o), added after the GEMM
            qkv = qkv + self.qkv_bias.get_value().astype(qkv.dtype)
        q_BxLxHxDh = qkv[..., : H * Dh].reshape(B, L, H, Dh)
        k_BxLxKxDh = qkv[..., H * Dh : (H + K) * Dh].reshape(B, L, K, Dh)
        v_BxLxKxDh = qkv[..., (H + K) * Dh :].reshape(B, L, K, Dh)
        if self.qk_norm:  # Qwen3: per-head RMSNorm over Dh, before RoPE
            q_BxLxHxDh, k_BxLxKxDh = self.q_norm(q_BxLxHxDh), self.k_norm(k_BxLxKxDh)
        q_BxLxHxDh = rope(q_BxLxHxDh, positions_BxL, self.rope_theta)
        k_BxLxKxDh = rope(k_BxLxKxDh, positions_BxL, self.rope_theta)

        G = H // K
        q_BxLxKxGxDh = q_BxLxHxDh.reshape(B, L, K, G, Dh)
        dtype = x_BxLxD.dtype
        new_cache = None
        if kv_cache is not None:
            new_BxKxLxDh = [jnp.swapaxes(t, 1, 2).astype(kv_cache[0].dtype) for t in (k_BxLxKxDh, v_BxLxKxDh)]
            # Written in place (XLA aliases a dynamic_update_slice's operand with its result in the
            # decode loop's carry), then read by the GEMMs as it lies: no per-token copy of the cache.
            new_cache = keys, values = tuple(lax.dynamic_update_slice_in_dim(c, new, jnp.asarray(index, jnp.int32), axis=2)
                                             for c, new in zip(kv_cache, new_BxKxLxDh))
            probs = attention_probs(q_BxLxKxGxDh, keys.astype(dtype), mask_BxLxS, "bksd").astype(dtype)
            # The batched matmul [B, K] x ([G L, S] @ [S, Dh]) as it lies, then the small output transposed.
            out_BxKxGxLxDh = jnp.einsum("bkgls,bksd->bkgld", probs, values.astype(dtype), preferred_element_type=F32)
            out_BxLxKxGxDh = jnp.transpose(out_BxKxGxLxDh, (0, 3, 1, 2, 4))
        elif ctx.attention_query_chunk:
            out_BxLxKxGxDh = attend_by_query_chunks(q_BxLxKxGxDh, k_BxLxKxDh.astype(dtype), v_BxLxKxDh.astype(dtype),
                                                    mask_BxLxS, ctx.attention_query_chunk)
        else:
            out_BxLxKxGxDh = attend(q_BxLxKxGxDh, k_BxLxKxDh.astype(dtype), v_BxLxKxDh.astype(dtype), mask_BxLxS)
        out_BxLxKxGxDh = out_BxLxKxGxDh.astype(dtype)
        out_BxLxHDh = out_BxLxKxGxDh.reshape(B, L, H * Dh)
        y = site_dot(out_BxLxHDh, self.o.get_value(), ctx, self.site_kinds()["o"], self.layer, "o")
        return y, new_cache


def attention_probs(q_BxLxKxGxDh, keys, mask_BxLxS, k_spec: str):
    """softmax(q k^T / sqrt(Dh)) over the keys, in f32 (HF: dtype=float32), [B, K, G, L, S];
    `keys` laid out as `k_spec` ("bskd" this call's keys, "bksd" a cache buffer)."""
    Dh = q_BxLxKxGxDh.shape[-1]
    scores = jnp.einsum(f"blkgd,{k_spec}->bkgls", q_BxLxKxGxDh, keys, preferred_element_type=F32) * F32(Dh**-0.5)
    # Masked scores are -inf, so their probabilities are exactly 0: keys a query may not see
    # (later tokens, padding) cannot change its output by a single bit.
    scores = jnp.where(mask_BxLxS[:, None, None], scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1)


def attend(q_BxLxKxGxDh, k_BxSxKxDh, v_BxSxKxDh, mask_BxLxS):
    """Cache-free attention of every query over this call's keys: out [B, L, K, G, Dh] in f32
    (probabilities rounded to the compute dtype, that of `v`, before the second GEMM)."""
    probs = attention_probs(q_BxLxKxGxDh, k_BxSxKxDh, mask_BxLxS, "bskd").astype(v_BxSxKxDh.dtype)
    return jnp.einsum("bkgls,bskd->blkgd", probs, v_BxSxKxDh, preferred_element_type=F32)


def attend_by_query_chunks(q_BxLxKxGxDh, k_BxSxKxDh, v_BxSxKxDh, mask_BxLxS, chunk: int):
    """`attend` for `chunk` queries at a time (a `lax.scan` over the full chunks, then the rest).

    A query's softmax runs over its own row of scores only, so a chunk of queries against all keys
    is the same per-row computation as all queries at once. Each chunk is under `jax.checkpoint`:
    the backward recomputes its scores instead of storing them, so the live score tensor is
    [B, H, chunk, S], not [B, H, L, S].
    """
    B, L = q_BxLxKxGxDh.shape[:2]
    attend_chunk = jax.checkpoint(attend, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)
    full = L // chunk
    outs = []
    if full:
        def to_chunks(x):  # [B, full * chunk, ...] -> [full, B, chunk, ...]
            return jnp.swapaxes(x[:, : full * chunk].reshape(B, full, chunk, *x.shape[2:]), 0, 1)

        def step(_, q_and_mask):
            q_c, mask_c = q_and_mask
            return None, attend_chunk(q_c, k_BxSxKxDh, v_BxSxKxDh, mask_c)

        _, out = lax.scan(step, None, (to_chunks(q_BxLxKxGxDh), to_chunks(mask_BxLxS)))
        outs.append(jnp.swapaxes(out, 0, 1).reshape(B, full * chunk, *out.shape[3:]))
    if full * chunk < L:
        rest = slice(full * chunk, L)
        outs.append(attend_chunk(q_BxLxKxGxDh[:, rest], k_BxSxKxDh, v_BxSxKxDh, mask_BxLxS[:, rest]))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


class SwiGLU(nnx.Module):
    """down(silu(x @ gate) * (x @ up)): the dense MLP ("mlp.*") or the shared expert ("shared.*").

    gate and up are one fused weight [D, 2F] (gate first, like HF 5.x's fused experts and TE's
    fc1): one activation quantization and one GEMM for both.
    """

    def __init__(self, config: ModelConfig, layer: int, d_ff: int, kind: str, rngs: nnx.Rngs):
        D, pd = config.d_model, dtype_of(config.param_dtype)
        self.gate_up = nnx.Param(normal_init(rngs, (D, 2 * d_ff), D, pd))
        self.down = nnx.Param(normal_init(rngs, (d_ff, D), d_ff, pd, (2 * config.num_layers) ** -0.5))
        self.layer, self.kind = layer, kind
        self.prefix = {"dense_mlp": "mlp", "shared_expert": "shared"}[kind]

    def site_kinds(self) -> dict[str, str]:
        return {"gate_up": self.kind, "down": self.kind}

    def __call__(self, x, ctx: Ctx):
        kinds = self.site_kinds()
        gu = site_dot(x, self.gate_up.get_value(), ctx, kinds["gate_up"], self.layer, f"{self.prefix}.gate_up")
        return site_dot(swiglu_act(gu), self.down.get_value(), ctx, kinds["down"], self.layer, f"{self.prefix}.down")


def swiglu_act(gate_up):
    """silu(gate) * up of a fused [..., 2F] projection, in f32, rounded once to its dtype."""
    g32, u32 = jnp.split(widen(gate_up), 2, axis=-1)
    return (g32 * jax.nn.sigmoid(g32) * u32).astype(gate_up.dtype)
