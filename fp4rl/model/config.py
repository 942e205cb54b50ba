"""`ModelConfig`: the shape of the MoE transformer, frozen, validated, JSON-serialisable.

Letters used for shapes in fp4rl.model: B batch, L sequence (new tokens), S cache slots,
D d_model, H query heads, G query heads per KV head, K KV heads (in attention only), Dh head_dim,
F feed-forward width, E experts, k top-k, T = B*L flattened tokens, R padded expert rows,
V vocab, N layers.

Presets: `tiny` (tests), `cpu` (the CPU experiments), `small` (~5M parameters), `h200` (~65M,
GPU ablations).
Every dimension a quantized site contracts over is a multiple of 16 in the presets (NVFP4
blocks are 16 wide along K; 2D weight tiles are 16x16), so any recipe applies to them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

from fp4rl.grouped import AUTO, check_gemm, resolve_gemm

DTYPES = ("float32", "bfloat16")
# Expert groups are padded to a multiple of this many rows; qlinear's quantized backward needs
# every ragged group to be a multiple of its TOKEN_ALIGN (32) rows so that the Hadamard and scale
# blocks along tokens never straddle two experts (qlinear module docstring).
_GROUP_ALIGN_UNIT = 32


class ParamCount(NamedTuple):
    """Parameters in total and touched per token (all non-expert weights + top_k of E experts)."""

    total: int
    active: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Qwen2-MoE / Qwen3-MoE style decoder (pre-norm, GQA + RoPE, SwiGLU, top-k MoE).

    vocab_size, d_model, num_layers: V, D, N.
    num_heads, num_kv_heads, head_dim: H, K, Dh (GQA: H % K == 0; Dh need not be D / H).
    dense_d_ff: F of the dense SwiGLU MLP of the layers listed in `dense_layers`.
    moe_d_ff: F of each routed expert; num_experts, top_k: E, k.
    norm_topk_prob: renormalise the top-k router probabilities to sum to 1 (Qwen3: True).
    shared_expert_d_ff: F of the always-on shared expert of MoE layers (0: none).
    shared_expert_gate: scale the shared expert by sigmoid(x @ w_g) per token (Qwen2-MoE).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3). qkv_bias: biases on q/k/v (Qwen2).
    dense_layers: indices of the layers with a dense MLP; every other layer is MoE.
    tie_embeddings: the LM head is the transposed embedding.
    rope_theta, rms_eps, max_seq_len: RoPE base, RMSNorm epsilon, longest sequence (cache size bound).
    aux_loss_coef: weight of the Switch load-balancing loss; `forward` returns the loss
      unscaled and the trainer adds aux_loss_coef * aux["aux_loss"].
    param_dtype / dtype: storage dtype of the parameters / compute dtype ("float32" | "bfloat16").
    group_align: the row block each expert's token group is padded to (a multiple of 32).
    expert_gemm: the routed experts' grouped-GEMM backend, forward and backward (`fp4rl.grouped`:
      "xla" portable, "mosaic" Pallas Mosaic GPU kernels on a Hopper GPU, "packed" the same plus the
      NVFP4 weights' forward read packed (dequantized in the kernel), "packed_dgrad" also their
      dgrad, "packed_wgmma" that forward and dgrad on the Mosaic packed kernels, "mosaic_interpret" /
      "packed_interpret" / "packed_dgrad_interpret" / "packed_wgmma_interpret" the kernels
      interpreted on the CPU, tests only), or "auto" (the default):
      the fastest backend the tests hold to the reference on this platform, "packed" on a Hopper GPU
      where the kernels take the model (bf16 compute, widths on their tiles), else "xla"
      (`fp4rl.grouped.resolve_gemm`). "auto" is resolved where a model is built (`resolved`,
      called by `Transformer` and `MoE` and by the trainers before they record a config), so
      stored configs and a model's own config name the backend. Not part of the numerics
      contract: the backends differ only in f32 accumulation order. Stored configs saved before
      the field load "xla" (`from_dict`).
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dense_d_ff: int
    moe_d_ff: int
    num_experts: int
    top_k: int
    norm_topk_prob: bool = True
    shared_expert_d_ff: int = 0
    shared_expert_gate: bool = False
    qk_norm: bool = False
    qkv_bias: bool = False
    dense_layers: tuple[int, ...] = ()
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_seq_len: int = 512
    aux_loss_coef: float = 1e-3
    param_dtype: str = "float32"
    dtype: str = "float32"
    group_align: int = 32
    expert_gemm: str = AUTO

    def __post_init__(self):
        # A list from JSON becomes a tuple, so the config stays hashable (a static jit argument).
        object.__setattr__(self, "dense_layers", tuple(int(i) for i in self.dense_layers))
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "num_experts", "top_k", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("dense_d_ff", "moe_d_ff", "shared_expert_d_ff"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs of dimensions)")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, num_experts={self.num_experts}]")
        if list(self.dense_layers) != sorted(set(self.dense_layers)):
            raise ValueError(f"dense_layers={self.dense_layers} must be sorted and unique")
        if any(not 0 <= i < self.num_layers for i in self.dense_layers):
            raise ValueError(f"dense_layers={self.dense_layers} must lie in [0, num_layers={self.num_layers})")
        if self.dense_layers and self.dense_d_ff == 0:
            raise ValueError(f"dense_layers={self.dense_layers} needs dense_d_ff > 0")
        if self.num_moe_layers and self.moe_d_ff == 0:
            raise ValueError("MoE layers need moe_d_ff > 0")
        if self.shared_expert_gate and self.shared_expert_d_ff == 0:
            raise ValueError("shared_expert_gate=True needs a shared expert (shared_expert_d_ff > 0)")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; valid options: {DTYPES}")
        if self.group_align < 1 or self.group_align % _GROUP_ALIGN_UNIT:
            raise ValueError(f"group_align={self.group_align} must be a positive multiple of {_GROUP_ALIGN_UNIT}")
        check_gemm(self.expert_gemm, auto=True)  # raises, naming the valid options
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            raise ValueError(f"rope_theta={self.rope_theta} and rms_eps={self.rms_eps} must be > 0")
        if self.aux_loss_coef < 0:
            raise ValueError(f"aux_loss_coef={self.aux_loss_coef} must be >= 0")

    # ------------------------------------------------------------------ structure
    def is_moe(self, layer: int) -> bool:
        return layer not in self.dense_layers

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the MoE layers; router top-k outputs are stacked in this order."""
        return tuple(i for i in range(self.num_layers) if self.is_moe(i))

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def expert_weight_shapes(self) -> tuple[tuple[int, int], ...]:
        """(K, N) of each routed-expert stack [E, K, N] (gate|up [D, 2F], down [F, D]); none
        without MoE layers."""
        if not self.num_moe_layers:
            return ()
        return (self.d_model, 2 * self.moe_d_ff), (self.moe_d_ff, self.d_model)

    def resolved(self) -> "ModelConfig":
        """This config with expert_gemm "auto" replaced by the backend it resolves to on this
        platform (`fp4rl.grouped.resolve_gemm`): what a model is built with and a run records.
        A config that names a backend is returned as it is."""
        if self.expert_gemm != AUTO:
            return self
        gemm = resolve_gemm(AUTO, dtype=self.dtype, weights=self.expert_weight_shapes)
        return dataclasses.replace(self, expert_gemm=gemm)

    # ------------------------------------------------------------------ sizes
    def param_count(self) -> ParamCount:
        """Exact parameter counts of `init(config)` (tests compare with the real tree).

        Active per token: embedding + attention + norms + router + shared expert + dense MLPs +
        top_k / E of the routed experts + the head (the embedding row gather counts in full,
        as is customary).
        """
        D, Dh = self.d_model, self.head_dim
        q_out, kv_out = self.num_heads * Dh, self.num_kv_heads * Dh
        attn = D * (q_out + 2 * kv_out) + q_out * D  # fused q|k|v, then o
        attn += (q_out + 2 * kv_out) if self.qkv_bias else 0
        attn += 2 * Dh if self.qk_norm else 0
        norms = 2 * D  # pre-attention and pre-MLP RMSNorm weights
        swiglu = lambda f: 3 * D * f  # noqa: E731  gate|up [D, 2F] and down [F, D]
        expert = swiglu(self.moe_d_ff)
        shared = swiglu(self.shared_expert_d_ff) + (D if self.shared_expert_gate else 0)
        router = D * self.num_experts
        total = active = 0
        for layer in range(self.num_layers):
            common = attn + norms
            if self.is_moe(layer):
                total += common + router + shared + self.num_experts * expert
                active += common + router + shared + self.top_k * expert
            else:
                total += common + swiglu(self.dense_d_ff)
                active += common + swiglu(self.dense_d_ff)
        embed_head = self.vocab_size * D * (1 if self.tie_embeddings else 2) + D  # + final norm
        return ParamCount(total=total + embed_head, active=active + embed_head)

    def flops_per_token(self, seq_len: int | None = None, training: bool = True) -> int:
        """Matmul FLOPs per token: 2 per multiply-add of every active linear (head included,
        embedding gather excluded), plus causal attention at sequence length `seq_len`
        (default max_seq_len): QK^T and PV over seq_len/2 keys on average, i.e.
        2 * 2 * (seq_len/2) * H * Dh per layer. Training (forward + backward) is 3x forward.
        """
        seq_len = self.max_seq_len if seq_len is None else seq_len
        D, Dh = self.d_model, self.head_dim
        q_out, kv_out = self.num_heads * Dh, self.num_kv_heads * Dh
        attn_macs = D * q_out + 2 * D * kv_out + q_out * D
        macs = self.vocab_size * D  # the LM head
        for layer in range(self.num_layers):
            macs += attn_macs
            if self.is_moe(layer):
                macs += D * self.num_experts + self.top_k * 3 * D * self.moe_d_ff
                macs += 3 * D * self.shared_expert_d_ff + (D if self.shared_expert_gate else 0)
            else:
                macs += 3 * D * self.dense_d_ff
        forward = 2 * macs + self.num_layers * 2 * seq_len * self.num_heads * Dh
        return 3 * forward if training else forward

    # ------------------------------------------------------------------ (de)serialisation
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, fields: dict) -> "ModelConfig":
        """A stored config (sft_meta.json's and config.json's "model_config"). One saved before the
        expert_gemm field ran on "xla", the only backend then, and loads so, not as "auto"."""
        return cls(**{"expert_gemm": "xla", **fields})

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        """A preset, optionally with fields replaced (e.g. vocab_size=99 for the RL tokenizer)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid names: {tuple(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(PRESETS)


PRESETS: dict[str, ModelConfig] = {
    # Tests: every code path (GQA, shared expert, MoE in both layers) at toy size; 2 layers so
    # the `full` recipe keeps layer 1 in BF16 and quantizes layer 0.
    "tiny": ModelConfig(
        vocab_size=64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        dense_d_ff=128, moe_d_ff=32, num_experts=4, top_k=2, shared_expert_d_ff=64,
        max_seq_len=64,
    ),
    # The CPU experiments: tiny's widths at a depth where selective precision keeps 1 of 7 layers
    # (14%, docs/rl.md's "last ~15%").
    "cpu": ModelConfig(
        vocab_size=64, d_model=64, num_layers=7, num_heads=4, num_kv_heads=2, head_dim=16,
        dense_d_ff=128, moe_d_ff=32, num_experts=4, top_k=2, shared_expert_d_ff=64,
        max_seq_len=64,
    ),
    # CPU runs (~4.8M parameters, ~2.4M active). Vocab 128 holds the 99-token character vocab.
    "small": ModelConfig(
        vocab_size=128, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
        dense_d_ff=768, moe_d_ff=128, num_experts=8, top_k=2, shared_expert_d_ff=256,
        max_seq_len=512,
    ),
    # GPU ablations on one H200 (~65M parameters, ~19M active), bf16 compute.
    "h200": ModelConfig(
        vocab_size=128, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64,
        dense_d_ff=1536, moe_d_ff=128, num_experts=32, top_k=4, shared_expert_d_ff=512,
        max_seq_len=1024, dtype="bfloat16",
    ),
    # The model-size ladder (`experiments.scaling`; its plan computes sizes, FLOPs and memory, and
    # names the factor each rung moves from its parent, `fp4rl.configs.SCALING_LADDER`): in depth,
    # h200's layer at 6, 8 (h200 itself), 16 and 32 layers; in width, at 6 layers, a path of layers
    # from h200's to the paper's; one rung off both axes (d_model 1024 at 16 layers); and single
    # factors of that path varied alone at h200's layer (the h200-layer rungs are made after the dict).
    # Every depth keeps 12-19% of its layers in BF16 under selective precision (1 of 6, 1 of 8, 2 of
    # 16, 5 of 32).
    # Halfway (geometrically) from h200's layer to the paper's: 64 experts, their width and top-k
    # between 128 / 4 and 768 / 8 (the width 384, not the geometric 313: the grouped-GEMM kernels
    # tile by 128, and `auto` must not fall back to XLA on one rung), attention between 8 x 64 and
    # 32 x 128.
    "ladder-w1024-l6": ModelConfig(
        vocab_size=128, d_model=1024, num_layers=6, num_heads=16, num_kv_heads=4, head_dim=96,
        dense_d_ff=3072, moe_d_ff=384, num_experts=64, top_k=6, shared_expert_d_ff=1024,
        max_seq_len=1024, dtype="bfloat16",
    ),
    # The paper's layer: Qwen3-30B-A3B's (d_model 2048, 32 query and 4 KV heads of 128, 128 experts x
    # 768, top-8, no shared expert; tests/fixtures/hf/qwen3_30b_a3b/config.json): ~3.7B parameters,
    # ~0.34B active. 6 layers, so that its BF16 warm-up fits one H200 (the plan's estimate; 8 layers
    # would not: the warm-up step holds the parameters and the AdamW state twice, 24 bytes per
    # parameter, before any activation).
    "ladder-w2048-l6": ModelConfig(
        vocab_size=128, d_model=2048, num_layers=6, num_heads=32, num_kv_heads=4, head_dim=128,
        dense_d_ff=6144, moe_d_ff=768, num_experts=128, top_k=8, shared_expert_d_ff=0,
        max_seq_len=1024, dtype="bfloat16",
    ),
}
PRESETS.update({f"ladder-w512-l{layers}": dataclasses.replace(PRESETS["h200"], num_layers=layers) for layers in (6, 16, 32)})
PRESETS["ladder-w1024-l16"] = dataclasses.replace(PRESETS["ladder-w1024-l6"], num_layers=16)
# One factor of the width path at a time, from ladder-w512-l6 (h200's layer at 6 layers): the shared
# expert removed (the paper's model has none); the paper's routing (128 experts, top-8) at h200's expert
# width; the paper's expert width (768); the paper's attention (32 x 128, 4 KV); the paper's d_model
# (2048) with h200's experts, attention and shared expert.
PRESETS.update({
    "ladder-w512-l6-noshared": dataclasses.replace(PRESETS["ladder-w512-l6"], shared_expert_d_ff=0),
    "ladder-w512-l6-e128k8": dataclasses.replace(PRESETS["ladder-w512-l6"], num_experts=128, top_k=8),
    "ladder-w512-l6-f768": dataclasses.replace(PRESETS["ladder-w512-l6"], moe_d_ff=768),
    "ladder-w512-l6-h32": dataclasses.replace(PRESETS["ladder-w512-l6"], num_heads=32, head_dim=128),
    "ladder-d2048-l6": dataclasses.replace(PRESETS["ladder-w512-l6"], d_model=2048, dense_d_ff=6144),
})
