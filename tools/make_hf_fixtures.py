#!/usr/bin/env python3
"""Build tiny random Hugging Face Qwen3-MoE / Qwen2-MoE checkpoints + reference logits.

These are parity fixtures for fp4rl's JAX ``from_pretrained``: CI loads the
safetensors checkpoints and compares against the stored torch logits, so CI
never needs torch or transformers.

Run (from the repo root) in a SEPARATE venv -- never the project/CI env:

    python3 -m venv /work/hfvenv
    /work/hfvenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors numpy
    /work/hfvenv/bin/python tools/make_hf_fixtures.py            # writes tests/fixtures/hf/
    /work/hfvenv/bin/python tools/make_hf_fixtures.py --print-layout   # + tensor list

Versions used to produce the committed fixtures:
    transformers 5.24.0, torch 2.13.0+cpu, safetensors 0.8.0, numpy 2.4.6, Python 3.11.7

Output (per model directory ``tests/fixtures/hf/<name>/``):
    config.json, generation_config.json, model.safetensors  (HF ``save_pretrained``)
    reference_logits.npz with
        input_ids               int32   [B, L]
        logits                  float32 [B, L, V]   (eager attention, eval mode, fp32, no mask/padding)
        hidden_states           float32 [n_layers + 1, B, L, H]   residual stream, all BEFORE the final norm:
                                 [0] = token embeddings, [i] = output of decoder layer i-1
        final_hidden            float32 [B, L, H]   model.norm(hidden_states[-1]) (what lm_head sees)
        router_logits_layer{i}  float32 [B, L, E]   (only for sparse-MoE layers i)
        router_topk_layer{i}    int32   [B, L, k]   expert ids, descending probability
        router_weights_layer{i} float32 [B, L, k]   combine weights (renormalised iff norm_topk_prob)
        router_margin_min       float32 []          min over tokens/layers of p_(k) - p_(k+1)
        versions                str                 library versions

The script is deterministic (fixed seeds, CPU fp32); re-running it reproduces the
committed files bit-for-bit on the same library versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import safetensors
import torch
import transformers
from safetensors import safe_open
from transformers import (
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "fixtures", "hf")

BATCH, SEQ = 2, 12
INIT_STD = 0.1  # initializer_range: big enough that logits / router choices are non-trivial


def versions_string() -> str:
    return (
        f"transformers={transformers.__version__} torch={torch.__version__} "
        f"safetensors={safetensors.__version__} numpy={np.__version__} "
        f"python={sys.version.split()[0]}"
    )


def qwen3_moe_config() -> Qwen3MoeConfig:
    # head_dim=32 != hidden_size / num_attention_heads (=16) on purpose: the real
    # Qwen3-30B-A3B also has head_dim (128) != hidden/heads (64), so q_proj/o_proj
    # are not square and a loader that derives head_dim from hidden/heads breaks.
    return Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        attention_bias=False,
        initializer_range=INIT_STD,
        attn_implementation="eager",
        experts_implementation="eager",
    )


def qwen2_moe_config() -> Qwen2MoeConfig:
    # Layer 0 is a dense MLP (mlp_only_layers=[0], uses intermediate_size),
    # layer 1 is sparse MoE with a sigmoid-gated shared expert.
    return Qwen2MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        qkv_bias=True,
        use_sliding_window=False,
        initializer_range=INIT_STD,
        attn_implementation="eager",
        experts_implementation="eager",
    )


@torch.no_grad()
def perturb_default_params(model: torch.nn.Module, seed: int) -> None:
    """HF init leaves RMSNorm weights == 1 and Linear biases == 0. Randomise them so a
    loader that forgets to load them (or uses a (1 + w) norm convention) is caught."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name and name.endswith(".weight"):  # all RMSNorms incl. q_norm/k_norm
            p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=g))
        elif name.endswith(".bias"):  # Qwen2-MoE q/k/v biases
            p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)


@torch.no_grad()
def run_reference(model, input_ids: torch.Tensor) -> dict[str, np.ndarray]:
    cfg = model.config
    captured: dict[int, tuple] = {}
    layer_out: dict[int, torch.Tensor] = {}
    hooks = []
    # NB: transformers 5.x's output_hidden_states replaces the last entry by the
    # post-final-norm state, so capture the raw decoder-layer outputs with hooks.
    for i, layer in enumerate(model.model.layers):
        def lhook(_mod, _inp, out, i=i):
            layer_out[i] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        hooks.append(layer.register_forward_hook(lhook))
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and gate.__class__.__name__.endswith("TopKRouter"):
            def hook(_mod, _inp, out, i=i):
                captured[i] = tuple(t.detach().clone() for t in out)
            hooks.append(gate.register_forward_hook(hook))
    norm_out: list[torch.Tensor] = []
    hooks.append(model.model.norm.register_forward_hook(lambda _m, _i, o: norm_out.append(o.detach().clone())))
    emb = model.model.embed_tokens(input_ids)
    out = model(input_ids=input_ids, use_cache=False)
    for h in hooks:
        h.remove()

    B, L = input_ids.shape
    k = cfg.num_experts_per_tok
    res: dict[str, np.ndarray] = {
        "input_ids": input_ids.numpy().astype(np.int32),
        "logits": out.logits.float().numpy(),
        "hidden_states": torch.stack([emb] + [layer_out[i] for i in range(cfg.num_hidden_layers)]).float().numpy(),
        "final_hidden": norm_out[-1].float().numpy(),
    }
    margins = []
    for i, (logits, weights, idx) in sorted(captured.items()):
        res[f"router_logits_layer{i}"] = logits.reshape(B, L, -1).float().numpy()
        res[f"router_topk_layer{i}"] = idx.reshape(B, L, k).numpy().astype(np.int32)
        res[f"router_weights_layer{i}"] = weights.reshape(B, L, k).float().numpy()
        probs = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(probs, k + 1, dim=-1).values
        margins.append((top[:, k - 1] - top[:, k]).min().item())
        # sanity: the router must make non-trivial, varied choices
        n_used = len(np.unique(res[f"router_topk_layer{i}"]))
        assert n_used >= 4, f"layer {i}: only {n_used} experts used"
    res["router_margin_min"] = np.asarray(min(margins), dtype=np.float32)
    res["versions"] = np.asarray(versions_string())
    return res


def print_layout(path: str, layers=(0,)) -> None:
    with safe_open(path, "pt") as f:
        keys = sorted(f.keys())
        for key in keys:
            parts = key.split(".")
            if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) not in layers:
                continue
            print(f"  {key:55s} {f.get_slice(key).get_dtype():4s} {list(f.get_slice(key).get_shape())}")
        print(f"  ({len(keys)} tensors in total)")


def build(name: str, cls, config, seed: int, print_tensors: bool, layout_layers=(0,)) -> None:
    out_dir = os.path.join(OUT_ROOT, name)
    os.makedirs(out_dir, exist_ok=True)

    torch.manual_seed(seed)
    model = cls(config).eval()
    perturb_default_params(model, seed + 1)
    model.save_pretrained(out_dir, safe_serialization=True)

    # Reload from disk (exercises HF's own safetensors -> module conversion) and use
    # the reloaded model for the reference, so the fixture is self-consistent.
    reloaded = cls.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    sd0, sd1 = model.state_dict(), reloaded.state_dict()
    assert sd0.keys() == sd1.keys()
    for key in sd0:
        assert torch.equal(sd0[key], sd1[key]), key

    rng = np.random.RandomState(1234)
    input_ids = torch.from_numpy(rng.randint(0, config.vocab_size, size=(BATCH, SEQ)).astype(np.int64))
    ref = run_reference(reloaded, input_ids)
    ref_orig = run_reference(model, input_ids)
    np.testing.assert_array_equal(ref["logits"], ref_orig["logits"])
    np.savez(os.path.join(out_dir, "reference_logits.npz"), **ref)

    lg = ref["logits"]
    print(f"== {name}: {out_dir}")
    print(f"   logits shape {lg.shape} std {lg.std():.4f} absmax {np.abs(lg).max():.4f}; "
          f"router_margin_min {float(ref['router_margin_min']):.4g}")
    for key in sorted(ref):
        if key.startswith("router_topk"):
            print(f"   {key}: experts used {np.unique(ref[key]).tolist()}")
    for fn in sorted(os.listdir(out_dir)):
        print(f"   {fn:28s} {os.path.getsize(os.path.join(out_dir, fn)):>9d} bytes")
    if print_tensors:
        print_layout(os.path.join(out_dir, "model.safetensors"), layout_layers)
        with open(os.path.join(out_dir, "config.json")) as f:
            print(json.dumps(json.load(f), indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print-layout", action="store_true", help="print per-layer tensor names/shapes (layer 0; Qwen2-MoE layers 0 and 1)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    build("qwen3_moe_tiny", Qwen3MoeForCausalLM, qwen3_moe_config(), seed=0, print_tensors=args.print_layout)
    build("qwen2_moe_tiny", Qwen2MoeForCausalLM, qwen2_moe_config(), seed=1, print_tensors=args.print_layout,
          layout_layers=(0, 1))  # layer 0 dense, layer 1 MoE
    print(versions_string())


if __name__ == "__main__":
    main()
