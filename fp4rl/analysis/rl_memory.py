"""Memory per device of an RL run on a data x expert mesh, from the code's own shapes.

`python -m experiments.rl_memory` prints the table of docs/parallel.md ("Memory per device"):
Qwen3-30B-A3B (`QWEN3_30B_A3B`, its config.json as `fp4rl.model.hf.config_from_hf` reads it) under
the `hf` RL preset at the paper's 8k tokens, on 8 x H200 and 8 x B200. Bytes, P_dev the parameters
one device holds (every routed-expert stack split over `expert`, the rest replicated:
docs/parallel.md "Design"):

  weights    = 4 P_dev f32 master weights + 4 P_dev the initial weights (the reference of the KL
               log-probs; none without them, `RLConfig.reference_logprobs`, as in the `hf` preset)
               + 2 P_dev the synced forward weights (bf16: the `bf16` arm; NVFP4 experts take ~0.56
               bytes instead)
  optimizer  = 8 P_dev AdamW's two f32 moments + 4 P_dev the f32 gradient
  KV cache   = rollout rows per device and sampler call (a generation batch's rows / generation_chunks)
               x S x L x 2 (k, v) x kv heads x head_dim x 2 (bf16)
  activations, one update's mini-batch (rows per device x S tokens, T):
    as the code runs = OVERHEAD T a(S), a(S) of `fp4rl.analysis.scaling_plan` (every layer's saved
                       tensors, the materialised attention scores and probabilities among them)
    with the update's memory options (`policy.UpdateMemory`: per-layer remat, micro-batches of R
    rows per device, attention in query chunks of c, the LM head over h positions at a time)
                     = OVERHEAD (R S (2 D L + b) + R h 12 V + R 6 H c S) + 4 P_dev: each layer's bf16
                       input kept (2 D L per token), one layer's tensors other than its scores live
                       at a time (b = (a(S) - 12 V) / L - 6 H S), the LM head's f32 logits and
                       log-softmax of h positions per row (12 V each; h = S without logit chunks),
                       one query chunk's scores and probabilities (6 H c S per row), and the f32
                       gradient sum that the micro-batches accumulate into beside each one's own
                       gradient (4 P_dev)

"Fits" adds the weights and optimizer state to the larger of the rollout's KV cache and the
update's activations with the options. The figures scale with rows per device; XLA:GPU assigns
buffers differently from XLA:CPU, whose memory analysis fixed OVERHEAD: a GPU run's peak is the check.
"""

from __future__ import annotations


from fp4rl.analysis.scaling_plan import OVERHEAD, activation_bytes_per_token
from fp4rl.model.config import ModelConfig

# Qwen3-30B-A3B's config.json (the fields `hf.config_from_hf` reads).
QWEN3_30B_A3B_HF = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48,
                    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
                    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960,
                    "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "router_aux_loss_coef": 0.001}
DEVICES = {"H200": 141e9, "B200": 180e9}
MESHES = ((8, 1), (2, 4), (1, 8))


def qwen3_30b_a3b() -> ModelConfig:
    from fp4rl.model.hf import config_from_hf

    return config_from_hf(QWEN3_30B_A3B_HF, dtype="bfloat16")


def params_per_device(mc: ModelConfig, expert: int) -> float:
    routed = mc.num_moe_layers * mc.num_experts * 3 * mc.d_model * mc.moe_d_ff
    return mc.param_count().total - routed + routed / expert


def memory_per_device(mc: ModelConfig, *, data: int, expert: int, seq_len: int, prompts: int, group_size: int,
                      mini_batches: int, micro_rows: int = 1, query_chunk: int = 1024,
                      logit_chunk: int = 0, generation_chunks: int = 1,
                      reference_copy: bool = True) -> dict[str, float]:
    """Bytes per device of each part (module docstring) for one RL step of this shape; the update's
    options: remat, micro-batches of `micro_rows` rows per device, attention in chunks of
    `query_chunk` queries (0: all at once), the LM head over `logit_chunk` positions at a time (0:
    all at once); the rollout in `generation_chunks` sampler calls per generation batch;
    `reference_copy`: the initial weights stay on the devices (the reference log-probs)."""
    devices = data * expert
    p = params_per_device(mc, expert)
    if generation_chunks < 1 or (prompts * group_size) % (generation_chunks * devices):
        raise ValueError(f"generation_chunks={generation_chunks} must split {prompts * group_size} rows evenly over "
                         f"{devices} devices")
    rollout_rows = prompts * group_size / devices / generation_chunks
    update_rows = prompts * group_size / devices / mini_batches
    if micro_rows < 1 or update_rows % micro_rows:
        raise ValueError(f"micro_rows={micro_rows} must be >= 1 and divide the {update_rows:.0f} update rows per device")
    if query_chunk < 0 or logit_chunk < 0:
        raise ValueError(f"query_chunk={query_chunk} and logit_chunk={logit_chunk} must be >= 0 (0: all at once)")
    a = activation_bytes_per_token(mc, seq_len)
    scores_per_token = 6 * mc.num_heads * seq_len  # f32 scores + bf16 probabilities over S keys, per layer
    layer_rest = (a - 12 * mc.vocab_size) / mc.num_layers - scores_per_token
    chunk = min(query_chunk or seq_len, seq_len)
    head_positions = min(logit_chunk or seq_len, seq_len)
    options = micro_rows * (seq_len * (2 * mc.d_model * mc.num_layers + layer_rest) + head_positions * 12 * mc.vocab_size)
    options += micro_rows * scores_per_token * chunk
    accumulated = 4 * p if micro_rows < update_rows else 0.0
    kv_per_token = mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * 2
    return {"params_per_device": p, "weights": (10 if reference_copy else 6) * p, "optimizer": 12 * p,
            "kv_cache": rollout_rows * seq_len * kv_per_token,
            "activations": OVERHEAD * update_rows * seq_len * a,
            "activations_options": OVERHEAD * options + accumulated,
            "rollout_rows": rollout_rows, "update_rows": update_rows, "micro_rows": micro_rows, "query_chunk": chunk,
            "logit_chunk": head_positions}


def table(mc: ModelConfig, seq_len: int, prompts: int, group_size: int, mini_batches: int, micro_rows: int = 1,
          query_chunk: int = 1024, logit_chunk: int = 0, generation_chunks: int = 1, name: str = "Qwen3-30B-A3B",
          meshes: tuple[tuple[int, int], ...] = MESHES, reference_copy: bool = True) -> str:
    count = mc.param_count()
    lines = [f"{name}: {count.total / 1e9:.2f}B parameters, {count.active / 1e9:.2f}B active; sequences of "
             f"{seq_len} tokens; {prompts} prompts x {group_size} samples, {mini_batches} mini-batches; update options: "
             f"remat, {micro_rows} row(s) per device per micro-batch, attention query chunk {query_chunk or seq_len}, "
             f"LM head over {logit_chunk or seq_len} positions at a time; rollout in {generation_chunks} sampler "
             "call(s) per generation batch", "",
             f"| mesh (data x expert) | params/device | weights (f32 {'+ initial ' if reference_copy else ''}+ bf16) "
             "| AdamW + grads | KV cache (rollout) "
             "| activations as the code runs by default | activations with the options (micro-batch rows) "
             "| fits H200 (141 GB) / B200 (180 GB) with the options |",
             "|---|---|---|---|---|---|---|---|"]
    gb = lambda x: f"{x / 1e9:,.1f} GB"  # noqa: E731
    for data, expert in meshes:
        m = memory_per_device(mc, data=data, expert=expert, seq_len=seq_len, prompts=prompts, group_size=group_size,
                              mini_batches=mini_batches, micro_rows=micro_rows, query_chunk=query_chunk,
                              logit_chunk=logit_chunk, generation_chunks=generation_chunks,
                              reference_copy=reference_copy)
        static = m["weights"] + m["optimizer"]
        need = static + max(m["kv_cache"], m["activations_options"])
        fits = " / ".join("yes" if need <= cap else "no" for cap in DEVICES.values())
        lines.append(f"| {data} x {expert} | {m['params_per_device'] / 1e9:.2f}B | {gb(m['weights'])} | {gb(m['optimizer'])} "
                     f"| {gb(m['kv_cache'])} ({m['rollout_rows']:.0f} rows) | {gb(m['activations'])} ({m['update_rows']:.0f} rows) "
                     f"| {gb(m['activations_options'])} ({m['micro_rows']:.0f} row) | {fits} ({gb(need)}) |")
    return "\n".join(lines) + "\n"
