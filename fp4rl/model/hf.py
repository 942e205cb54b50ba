"""Import a local Hugging Face Qwen3-MoE / Qwen2-MoE checkpoint (config.json + *.safetensors).

No network and no torch: tensors are read with `safetensors.numpy`. The forward semantics and
the config spellings of transformers 4.x (Hub) and 5.x are those of
tests/fixtures/hf/README.md; the tests pin the logits of both fixtures.

    model = from_pretrained("tests/fixtures/hf/qwen3_moe_tiny")
    logits_BxLxV = model(tokens_BxL)          # float32

Weight layout: HF stores every linear [out, in]; ours is [in, out], with q|k|v fused along the
output axis (biases likewise) and each expert's gate|up fused, stacked over experts.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from fp4rl.model.config import ModelConfig
from fp4rl.model.layers import dtype_of
from fp4rl.model.transformer import Transformer, resolve_recipe, forward
from fp4rl.recipe import PrecisionRecipe

SUPPORTED_MODEL_TYPES = ("qwen3_moe", "qwen2_moe")
# Buffers some older checkpoints carry; recomputed from the config, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _first(cfg: dict, *names, default=None):
    """The first of `names` present and not null in an HF config.json (spellings vary)."""
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def config_from_hf(cfg: dict, dtype: str = "float32") -> ModelConfig:
    """ModelConfig of an HF config.json dict; unsupported features raise ValueError."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}")
    if _first(cfg, "hidden_act", default="silu") != "silu":
        raise ValueError(f"hidden_act={cfg['hidden_act']!r}: only 'silu' (SwiGLU) is supported")
    if cfg.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported (full causal attention only)")
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    rope_type = rope.get("rope_type", "default")
    if scaling or rope_type != "default":
        raise ValueError(f"RoPE scaling ({scaling or rope_type!r}) is not supported; only the default RoPE")
    theta = _first(cfg, "rope_theta", default=None)
    theta = rope.get("rope_theta", theta) if theta is None else theta
    if theta is None:
        raise ValueError("config.json has neither rope_theta nor rope_parameters.rope_theta")

    num_layers, hidden, heads = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    num_experts = _first(cfg, "num_experts", "num_local_experts", default=0)
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = _first(cfg, "decoder_sparse_step", default=1)
    # HF: layer i is sparse iff i not in mlp_only_layers and E > 0 and (i + 1) % step == 0.
    dense = tuple(i for i in range(num_layers) if not (i not in mlp_only and num_experts > 0 and (i + 1) % step == 0))
    if num_experts == 0:
        raise ValueError("a checkpoint without experts (num_experts == 0) is not an MoE model")

    if model_type == "qwen3_moe":
        if cfg.get("attention_bias"):
            raise ValueError("qwen3_moe with attention_bias=true (o_proj bias) is not supported")
        family = dict(qk_norm=True, qkv_bias=False, shared_expert_d_ff=0, shared_expert_gate=False)
    else:  # qwen2_moe: q/k/v biases (always, in 4.x; `qkv_bias` in 5.x), gated shared expert
        shared = _first(cfg, "shared_expert_intermediate_size", default=0)
        family = dict(qk_norm=False, qkv_bias=bool(_first(cfg, "qkv_bias", default=True)),
                      shared_expert_d_ff=shared, shared_expert_gate=shared > 0)
    return ModelConfig(
        vocab_size=cfg["vocab_size"], d_model=hidden, num_layers=num_layers, num_heads=heads,
        num_kv_heads=_first(cfg, "num_key_value_heads", default=heads),
        head_dim=_first(cfg, "head_dim", default=hidden // heads),
        dense_d_ff=cfg["intermediate_size"] if dense else 0, moe_d_ff=cfg["moe_intermediate_size"],
        num_experts=num_experts, top_k=cfg["num_experts_per_tok"], norm_topk_prob=bool(cfg["norm_topk_prob"]),
        dense_layers=dense, tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=float(theta), rms_eps=float(cfg["rms_norm_eps"]),
        max_seq_len=_first(cfg, "max_position_embeddings", default=4096),
        aux_loss_coef=float(_first(cfg, "router_aux_loss_coef", default=1e-3)),
        param_dtype="float32", dtype=dtype, **family,
    )


class _Tensors:
    """The checkpoint's tensors; remembers what was asked for, so missing and unused names can
    be reported all at once."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors, self.used, self.missing = tensors, set(), []

    def __call__(self, name: str, transpose: bool = False):
        if name not in self.tensors:
            self.missing.append(name)
            return None
        self.used.add(name)
        array = np.asarray(self.tensors[name], np.float32)
        return array.T if transpose else array

    def check(self, path: str):
        if self.missing:
            more = f", ... ({len(self.missing)} in all)" if len(self.missing) > 12 else ""
            shown = ", ".join(self.missing[:12]) + more
            raise ValueError(f"checkpoint {path} lacks tensors: {shown}")
        unused = sorted(n for n in self.tensors if n not in self.used and not n.endswith(_IGNORED_SUFFIXES))
        if unused:
            raise ValueError(f"checkpoint {path} has tensors this model does not use: {unused[:12]}")


def _cat(*arrays):
    return None if any(a is None for a in arrays) else np.concatenate(arrays, axis=-1)


def _load_params(config: ModelConfig, W: _Tensors):
    """Fill an abstract Transformer with the checkpoint's tensors; returns its Param state."""
    model = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(params=0)))
    pd = dtype_of(config.param_dtype)

    def put(variable, array):
        if array is None:  # missing: reported by W.check after every name was tried
            return
        if array.shape != variable.shape:
            raise ValueError(f"tensor shape {array.shape} does not fit parameter shape {variable.shape}")
        variable.set_value(jnp.asarray(array, pd))

    put(model.embed, W("model.embed_tokens.weight"))
    put(model.final_norm.w, W("model.norm.weight"))
    if not config.tie_embeddings:
        put(model.head, W("lm_head.weight", transpose=True))
    elif "lm_head.weight" in W.tensors:
        W.used.add("lm_head.weight")  # HF ignores a stored head when the embeddings are tied
    for i, block in enumerate(model.layers):
        p = f"model.layers.{i}."
        put(block.attn_norm.w, W(p + "input_layernorm.weight"))
        put(block.mlp_norm.w, W(p + "post_attention_layernorm.weight"))
        a = p + "self_attn."
        put(block.attn.qkv, _cat(*(W(f"{a}{n}_proj.weight", transpose=True) for n in "qkv")))
        put(block.attn.o, W(a + "o_proj.weight", transpose=True))
        if config.qkv_bias:
            put(block.attn.qkv_bias, _cat(*(W(f"{a}{n}_proj.bias") for n in "qkv")))
        if config.qk_norm:
            put(block.attn.q_norm.w, W(a + "q_norm.weight"))
            put(block.attn.k_norm.w, W(a + "k_norm.weight"))
        m = p + "mlp."
        if not config.is_moe(i):
            put(block.mlp.gate_up, _cat(W(m + "gate_proj.weight", True), W(m + "up_proj.weight", True)))
            put(block.mlp.down, W(m + "down_proj.weight", transpose=True))
            continue
        put(block.mlp.router, W(m + "gate.weight", transpose=True))
        gate_up = [_cat(W(f"{m}experts.{e}.gate_proj.weight", True), W(f"{m}experts.{e}.up_proj.weight", True))
                   for e in range(config.num_experts)]
        down = [W(f"{m}experts.{e}.down_proj.weight", transpose=True) for e in range(config.num_experts)]
        put(block.mlp.gate_up, None if any(g is None for g in gate_up) else np.stack(gate_up))
        put(block.mlp.down, None if any(d is None for d in down) else np.stack(down))
        if config.shared_expert_d_ff:
            s = m + "shared_expert."
            put(block.mlp.shared.gate_up, _cat(W(s + "gate_proj.weight", True), W(s + "up_proj.weight", True)))
            put(block.mlp.shared.down, W(s + "down_proj.weight", transpose=True))
        if config.shared_expert_gate:
            put(block.mlp.shared_gate, W(m + "shared_expert_gate.weight", transpose=True))
    return model


_forward_jit = jax.jit(forward, static_argnums=(0, 3), static_argnames=("impl",))


@dataclasses.dataclass(frozen=True)
class HFModel:
    """An imported checkpoint: `model(tokens_BxL)` -> logits_BxLxV float32 (jitted forward)."""

    config: ModelConfig
    graphdef: object
    params: object
    recipe: PrecisionRecipe
    model_type: str

    def forward(self, tokens_BxL, **kwargs):
        """(logits, aux) of `fp4rl.model.forward`. The key only feeds a quantized backward, which
        a forward never runs; a fixed one is passed so that any recipe works."""
        kwargs.setdefault("key", jax.random.key(0))
        return _forward_jit(self.graphdef, self.params, jnp.asarray(tokens_BxL, jnp.int32), self.recipe, **kwargs)

    def __call__(self, tokens_BxL):
        return self.forward(tokens_BxL)[0]


INDEX_FILE = "model.safetensors.index.json"


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by name. With model.safetensors.index.json (a sharded checkpoint),
    exactly the files its weight_map lists, each tensor from its listed file: another
    *.safetensors in the folder (an older export, a stray copy) is not read. Without an index,
    every *.safetensors, and a tensor name in two files is an error naming both: which one HF
    would load depends on the loader, not on the folder."""
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            try:
                weight_map = json.load(f).get("weight_map")
            except json.JSONDecodeError as err:
                raise ValueError(f"{index_path}: unreadable JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_path} has no weight_map (tensor name -> file)")
        tensors = {}
        for file in sorted(set(weight_map.values())):
            full = os.path.join(path, file)
            if not os.path.isfile(full):
                raise FileNotFoundError(f"{full}, listed in {index_path}, does not exist")
            loaded = load_file(full)
            for name in (n for n, f in weight_map.items() if f == file):
                if name not in loaded:
                    raise ValueError(f"{index_path} places tensor {name} in {file}, which does not hold it")
                tensors[name] = loaded[name]
        return tensors
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    tensors, source = {}, {}
    for file in files:
        for name, array in load_file(file).items():
            if name in source:
                raise ValueError(f"tensor {name} is in both {source[name]} and {file}; remove the stale file "
                                 f"or add a {INDEX_FILE} naming each tensor's file")
            tensors[name], source[name] = array, file
    return tensors


def from_pretrained(path: str, recipe="bf16", dtype: str = "float32") -> HFModel:
    """Load `path` (a local directory: config.json + one or more *.safetensors, with
    model.safetensors.index.json when sharded; see `read_tensors`) for `recipe`."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} not found (from_pretrained reads local directories only)")
    with open(config_path) as f:
        hf_config = json.load(f)
    config = config_from_hf(hf_config, dtype).resolved()  # the model's own config names its backend
    W = _Tensors(read_tensors(path))
    model = _load_params(config, W)
    W.check(path)
    graphdef, params = nnx.split(model, nnx.Param)
    return HFModel(config=config, graphdef=graphdef, params=params, recipe=resolve_recipe(recipe),
                   model_type=hf_config["model_type"])
