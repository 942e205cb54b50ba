#!/usr/bin/env python3
"""Pure-numpy re-implementation of HF Qwen3-MoE / Qwen2-MoE forward (no torch).

It is the executable form of the semantics documented in tests/fixtures/hf/README.md:
it reads a checkpoint directory (config.json + model.safetensors, HF names), runs the
forward pass and compares with the directory's reference_logits.npz.

    python tools/hf_moe_numpy_reference.py tests/fixtures/hf/qwen3_moe_tiny tests/fixtures/hf/qwen2_moe_tiny

Needs only numpy + safetensors (both fp4rl dependencies). Handles both config styles:
transformers 5.x (``num_local_experts`` for qwen3_moe, ``rope_parameters``) and the
transformers 4.x style found on the Hub (``num_experts``, ``rope_theta``).
Only what the fixtures use is implemented: default RoPE, no sliding window, no padding.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def cfg_get(cfg: dict, *names, default=None):
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def rms_norm(x, w, eps):
    # HF: x * rsqrt(mean(x^2, -1) + eps), computed in fp32, THEN multiplied by w (plain w, not 1 + w)
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def linear(x, w, b=None):
    # HF nn.Linear weight is stored [out_features, in_features]: y = x @ W.T + b
    y = x @ w.T
    return y if b is None else y + b


def silu(x):
    return x / (1.0 + np.exp(-x))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def forward(ckpt_dir: str, input_ids: np.ndarray, dtype=np.float64):
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        cfg = json.load(f)
    W = {k: v.astype(dtype) for k, v in load_file(os.path.join(ckpt_dir, "model.safetensors")).items()}
    H = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg_get(cfg, "head_dim", default=H // nh)
    eps = cfg["rms_norm_eps"]
    theta = cfg_get(cfg.get("rope_parameters") or {}, "rope_theta", default=None) or cfg_get(cfg, "rope_theta")
    E = cfg_get(cfg, "num_experts", "num_local_experts")
    k = cfg["num_experts_per_tok"]
    norm_topk = cfg["norm_topk_prob"]
    mlp_only = cfg.get("mlp_only_layers") or []
    step = cfg.get("decoder_sparse_step", 1)

    B, L = input_ids.shape
    x = W["model.embed_tokens.weight"][input_ids]  # [B, L, H]
    pos = np.arange(L, dtype=dtype)
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=dtype) / hd))  # [hd/2]
    freqs = pos[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [L, hd]  (halves layout, NOT interleaved)
    cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]
    causal = np.triu(np.full((L, L), -np.inf, dtype=dtype), 1)

    hidden = [x]
    routers = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        # ---- attention ----
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(h, W[p + "self_attn.q_proj.weight"], W.get(p + "self_attn.q_proj.bias"))
        kk = linear(h, W[p + "self_attn.k_proj.weight"], W.get(p + "self_attn.k_proj.bias"))
        v = linear(h, W[p + "self_attn.v_proj.weight"], W.get(p + "self_attn.v_proj.bias"))
        q = q.reshape(B, L, nh, hd)
        kk = kk.reshape(B, L, nkv, hd)
        v = v.reshape(B, L, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            kk = rms_norm(kk, W[p + "self_attn.k_norm.weight"], eps)
        q, kk, v = (t.transpose(0, 2, 1, 3) for t in (q, kk, v))  # [B, heads, L, hd]
        q = q * cos + rotate_half(q) * sin
        kk = kk * cos + rotate_half(kk) * sin
        rep = nh // nkv  # GQA: query head j uses kv head j // rep
        kk, v = np.repeat(kk, rep, axis=1), np.repeat(v, rep, axis=1)
        s = q @ kk.transpose(0, 1, 3, 2) * hd**-0.5 + causal
        a = softmax(s) @ v  # [B, nh, L, hd]
        a = a.transpose(0, 2, 1, 3).reshape(B, L, nh * hd)
        x = x + linear(a, W[p + "self_attn.o_proj.weight"])
        # ---- MLP / MoE ----
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        sparse = i not in mlp_only and E > 0 and (i + 1) % step == 0
        if not sparse:
            m = p + "mlp."
            y = linear(silu(linear(h, W[m + "gate_proj.weight"])) * linear(h, W[m + "up_proj.weight"]),
                       W[m + "down_proj.weight"])
        else:
            t = h.reshape(B * L, H)
            logits = linear(t, W[p + "mlp.gate.weight"])  # [T, E]
            probs = softmax(logits)
            idx = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # top-k, descending
            wts = np.take_along_axis(probs, idx, axis=-1)
            if norm_topk:
                wts = wts / wts.sum(-1, keepdims=True)
            routers[i] = (logits.reshape(B, L, E), idx.reshape(B, L, k), wts.reshape(B, L, k))
            y = np.zeros_like(t)
            for e in range(E):
                m = f"{p}mlp.experts.{e}."
                ye = linear(silu(linear(t, W[m + "gate_proj.weight"])) * linear(t, W[m + "up_proj.weight"]),
                            W[m + "down_proj.weight"])
                coef = (wts * (idx == e)).sum(-1, keepdims=True)  # 0 for tokens not routed to e
                y = y + coef * ye
            if p + "mlp.shared_expert.gate_proj.weight" in W:  # Qwen2-MoE shared expert
                m = p + "mlp.shared_expert."
                ys = linear(silu(linear(t, W[m + "gate_proj.weight"])) * linear(t, W[m + "up_proj.weight"]),
                            W[m + "down_proj.weight"])
                g = 1.0 / (1.0 + np.exp(-linear(t, W[p + "mlp.shared_expert_gate.weight"])))  # [T, 1]
                y = y + g * ys
            y = y.reshape(B, L, H)
        x = x + y
        hidden.append(x)
    final = rms_norm(x, W["model.norm.weight"], eps)
    lm = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return linear(final, lm), np.stack(hidden), final, routers


def check(ckpt_dir: str) -> None:
    ref = np.load(os.path.join(ckpt_dir, "reference_logits.npz"))
    logits, hidden, final, routers = forward(ckpt_dir, ref["input_ids"].astype(np.int64))
    err = np.abs(logits - ref["logits"]).max()
    herr = np.abs(hidden - ref["hidden_states"]).max()
    ferr = np.abs(final - ref["final_hidden"]).max()
    print(f"{ckpt_dir}: max|logits diff| {err:.2e}  hidden {herr:.2e}  final {ferr:.2e}  ({ref['versions']})")
    assert err < 1e-4 and herr < 1e-4 and ferr < 1e-4
    for i, (rl, idx, wts) in routers.items():
        np.testing.assert_array_equal(idx, ref[f"router_topk_layer{i}"])
        np.testing.assert_allclose(rl, ref[f"router_logits_layer{i}"], atol=1e-5)
        np.testing.assert_allclose(wts, ref[f"router_weights_layer{i}"], atol=1e-5)
        print(f"  layer {i}: router top-k indices identical, weights/logits match")
    extra = sorted(set(f for f in ref.files if f.startswith("router_topk")) - {f"router_topk_layer{i}" for i in routers})
    assert not extra, extra


if __name__ == "__main__":
    for d in sys.argv[1:] or [os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf", n)
                              for n in ("qwen3_moe_tiny", "qwen2_moe_tiny")]:
        check(os.path.normpath(d))
