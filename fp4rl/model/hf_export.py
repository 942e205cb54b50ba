"""Write a model imported from a Hugging Face Qwen3-MoE / Qwen2-MoE checkpoint (and trained here)
back as a Hugging Face folder that other servers load: config.json, safetensors shards with their
index, and the source folder's tokenizer and generation files.

    model = hf.from_pretrained("ckpt")                     # or a policy trained from it
    save_pretrained("out", model.graphdef, params, "ckpt")

The inverse of `hf._load_params`: our linears are [in, out] with q|k|v and each expert's gate|up
fused; HF stores every linear [out, in], one tensor per projection and per expert. Tensors are
written in float32, the parameters' dtype, so `hf.from_pretrained(out)` gives the same parameters
bit for bit, and the same logits. The architecture is the source's config.json, written unchanged
after a check that it maps to the model's config: a model this module cannot describe in that file
(one not imported from it) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from fp4rl.model import hf
from fp4rl.model.config import ModelConfig

# Files of the source folder that describe the model's text interface, copied when present.
COPIED_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
SHARD_BYTES = 2 << 30  # HF's default max_shard_size ("2GB" there is 2 * 10**9; any size loads)
# ModelConfig fields that describe how this code runs a model, not the model.
_RUNTIME_FIELDS = ("param_dtype", "dtype", "expert_gemm", "group_align")


def _value(variable) -> np.ndarray:
    return np.asarray(variable.get_value(), np.float32)


def _split(array: np.ndarray, *widths: int) -> list[np.ndarray]:
    """`array` split along its last axis into pieces of `widths`, each transposed to HF's [out, in]."""
    bounds = np.cumsum(widths)[:-1]
    return [np.ascontiguousarray(piece.T) for piece in np.split(array, bounds, axis=-1)]


def hf_tensors(graphdef, params) -> dict[str, np.ndarray]:
    """The model's parameters under Hugging Face's tensor names and layouts (float32)."""
    model = nnx.merge(graphdef, params)
    config: ModelConfig = model.config
    H, K, Dh = config.num_heads, config.num_kv_heads, config.head_dim
    out = {"model.embed_tokens.weight": _value(model.embed), "model.norm.weight": _value(model.final_norm.w)}
    if not config.tie_embeddings:
        out["lm_head.weight"] = np.ascontiguousarray(_value(model.head).T)
    for i, block in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = _value(block.attn_norm.w)
        out[p + "post_attention_layernorm.weight"] = _value(block.mlp_norm.w)
        a = p + "self_attn."
        for name, w in zip("qkv", _split(_value(block.attn.qkv), H * Dh, K * Dh, K * Dh)):
            out[f"{a}{name}_proj.weight"] = w
        out[a + "o_proj.weight"] = np.ascontiguousarray(_value(block.attn.o).T)
        if config.qkv_bias:
            bias = _value(block.attn.qkv_bias)
            for name, b in zip("qkv", np.split(bias, [H * Dh, (H + K) * Dh], axis=-1)):
                out[f"{a}{name}_proj.bias"] = np.ascontiguousarray(b)
        if config.qk_norm:
            out[a + "q_norm.weight"] = _value(block.attn.q_norm.w)
            out[a + "k_norm.weight"] = _value(block.attn.k_norm.w)
        m = p + "mlp."
        if not config.is_moe(i):
            d_ff = config.dense_d_ff
            out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = _split(_value(block.mlp.gate_up), d_ff, d_ff)
            out[m + "down_proj.weight"] = np.ascontiguousarray(_value(block.mlp.down).T)
            continue
        out[m + "gate.weight"] = np.ascontiguousarray(_value(block.mlp.router).T)
        gate_up, down = _value(block.mlp.gate_up), _value(block.mlp.down)
        for e in range(config.num_experts):
            x = f"{m}experts.{e}."
            out[x + "gate_proj.weight"], out[x + "up_proj.weight"] = _split(gate_up[e], config.moe_d_ff, config.moe_d_ff)
            out[x + "down_proj.weight"] = np.ascontiguousarray(down[e].T)
        if config.shared_expert_d_ff:
            s, d_ff = m + "shared_expert.", config.shared_expert_d_ff
            out[s + "gate_proj.weight"], out[s + "up_proj.weight"] = _split(_value(block.mlp.shared.gate_up), d_ff, d_ff)
            out[s + "down_proj.weight"] = np.ascontiguousarray(_value(block.mlp.shared.down).T)
        if config.shared_expert_gate:
            out[m + "shared_expert_gate.weight"] = np.ascontiguousarray(_value(block.mlp.shared_gate).T)
    return out


def _architecture(config: ModelConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _RUNTIME_FIELDS}


def _shards(tensors: dict[str, np.ndarray], shard_bytes: int) -> list[list[str]]:
    """Tensor names in files of at most `shard_bytes` each (a larger tensor gets a file alone), in name order."""
    shards, size = [[]], 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def save_pretrained(path: str, graphdef, params, source: str, shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write the model to the new folder `path` as a Hugging Face checkpoint whose config.json is
    the one of `source` (the folder it was imported from); returns the files written. Refuses an
    existing non-empty `path`, and a model whose config is not the one `source` describes."""
    if os.path.isdir(path) and os.listdir(path):
        raise FileExistsError(f"{path} exists and is not empty: export into a new folder")
    config_path = os.path.join(source, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} not found: export needs the folder the model was imported from")
    with open(config_path) as f:
        hf_config = json.load(f)
    model_config = nnx.merge(graphdef, params).config
    described, have = _architecture(hf.config_from_hf(hf_config)), _architecture(model_config)
    if described != have:
        differ = sorted(k for k in have if described.get(k) != have[k])
        raise ValueError(f"{config_path} does not describe this model (fields that differ: {', '.join(differ)}): "
                         "only a model imported from that folder, and trained here, can be exported with it")
    tensors = hf_tensors(graphdef, params)
    os.makedirs(path, exist_ok=True)
    shards = _shards(tensors, shard_bytes)
    written = []
    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
                 "weight_map": {name: file for file, names in zip(files, shards) for name in names}}
        with open(os.path.join(path, hf.INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2)
        written.append(hf.INDEX_FILE)
    for file, names in zip(files, shards):
        # "pt": the format tag transformers' safetensors loader accepts (the bytes are the same)
        save_file({n: tensors[n] for n in names}, os.path.join(path, file), metadata={"format": "pt"})
        written.append(file)
    with open(os.path.join(path, "config.json"), "w") as f:
        # the tensors' dtype, under the key the source spells it with (transformers 5.x: "dtype")
        dtype_key = "dtype" if "dtype" in hf_config else "torch_dtype"
        json.dump({**hf_config, dtype_key: "float32"}, f, indent=2)
    written.append("config.json")
    for name in COPIED_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(path, name))
            written.append(name)
    return written
