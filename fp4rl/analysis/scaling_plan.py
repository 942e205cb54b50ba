"""The model-size ladder's plan: parameters, FLOPs, estimated peak memory and time per preset.

`python -m experiments.scaling plan` writes one row per ladder preset (`fp4rl.configs.SCALING_LADDER`):
parameter counts (`ModelConfig.param_count`: total, active per token), FLOPs per token
(`ModelConfig.flops_per_token`), the kept BF16 layers of selective precision, and, for the BF16
warm-up and for one part of the gradient measurement, the estimated peak device memory and time.

Memory (bytes), stated here so that the estimate can be checked against a run (P: parameters):

  warm-up     = 24 P + C_P P + OVERHEAD T_w a(S_w)
                24 P: the warm-up step (`sft.train`) donates nothing, so its inputs (f32 parameters and
                AdamW's two f32 moments, 12 P) and its outputs (the same, 12 P) are live together;
                C_P P: the step's other parameter-sized temporaries (f32 gradients, the bf16 weights).
  measurement = (4 + 4 R + 8 W) P + max(gradient, compare, policy change), the phases of one source:
                gradient = O + C_P P + 4 (K - 1) P + OVERHEAD T_g a(S_g)
                compare  = O + 4 P,   policy change = O + 8 P,   O = 4 P (K = 1) or 8 P (K > 1)
                f32 parameters (4); R reference mean gradients held while a batch's later sources are
                compared with them (BF16 and a straight-through view: 2); W warmed AdamW states
                (`adam_warmup_batches` > 0: one per recipe of the part, two f32 moments each); the
                gradient program's output O (its one draw, or its first draw and the mean over its K
                draws), its temporaries and its further draws; the comparison's difference (4 P); one
                AdamW step's update and stepped parameters (8 P).
  a(S) per token = L [2 (6 D + 3 q + 3 kv + 3 F_s + k (2 D + 3 F)) + 8 E + 6 H S] + 12 V
                the tensors one layer saves for its backward, per token: residual stream, norms and
                the o projection's output (6 D), fused q|k|v, RoPE'd q and k and the attention context
                (3 q + 3 kv, q = H Dh, kv = K Dh), the shared expert's gate|up, activation and output
                (3 F_s), and per routed copy (k of them) its gathered input, gate|up, activation and
                output (2 D + 3 F), all in bf16 (2 bytes); the router's logits and probabilities in
                f32 (8 E); the materialised attention scores in f32 and probabilities in bf16 over
                the S keys of every head (6 H S); plus the LM head's f32 logits, log-softmax and their
                gradient (12 V).
  T_w = batch_size x max_len tokens of a warm-up step; T_g = rows x (prompt_len + max_new_tokens) of
  a measurement batch. C_P = 8 and OVERHEAD = 2.1 come from XLA:CPU's compiled memory analysis of
  the warm-up step at two batch sizes (`compile().memory_analysis()`, expert GEMM `blocked`):
  temporaries = 3.4 P + 2.1 T a(S) for h200, 7.1 P + 1.02 T a(S) for ladder-w1024-l6 and
  8.2 P + 1.38 T a(S) for ladder-w2048-l6; the largest of each is taken. XLA:GPU assigns buffers differently: a GPU run's peak
  (`jax.devices()[0].memory_stats()["peak_bytes_in_use"]`) is the check. The grouped GEMMs are
  taken linear in rows (`blocked` and the Mosaic kernels; `xla`'s ragged dot expands over rows x
  experts and would not fit the wide presets). Budget: one H200's 141 GB (H200_BYTES).

Time: an estimate from FLOPs, not a measurement, compiling excluded (the h200 measurement's parts
compiled ~5 min of wall time each on 4 threads, ahead of and overlapping their first batches):
FLOPs / rate at two effective rates, FAST (25% of the H200's 989 TFLOP/s dense BF16: large,
well-shaped GEMMs) and SLOW, what the h200 preset achieved (its warm-up loop ~4 TFLOP/s: 6.7e14 FLOPs
in 173 s, the first step's compile included; its gradient measurement ~8 TFLOP/s: its `nvfp4` part,
2.6e15 FLOPs by the formula below, in 312 s; small GEMMs and emulated NVFP4 cost more than their
FLOPs). The larger rungs should lie nearer FAST. FLOPs: warm-up steps x T_w x training FLOPs per
token; the measurement's rollouts (forward FLOPs of prompts and answers; decoding is bound by
memory, so the FLOPs understate it), its gradients (every source x its keys x a training pass of
T_g tokens, plus one forward per forward class) and its policy-change forwards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fp4rl.model.config import ModelConfig
from fp4rl.recipe import PrecisionRecipe

H200_BYTES = 141e9
C_P = 8
OVERHEAD = 2.1
FAST_FLOPS = 0.25 * 989e12
SLOW_WARMUP_FLOPS, SLOW_MEASUREMENT_FLOPS = 4e12, 8e12
KEPT_SHARE_BAND = (0.12, 0.19)  # docs/rl.md "Precision recipes": "last ~15%" means 12-19% of the layers
# Generation batches per rollout batch: dynamic sampling refills groups whose rewards are all equal
# (the h200 measurement drew 1.66 on average).
GEN_BATCHES = 1.7
# The parts a measurement of a large model is split into (`--recipes` per device call): the recipe
# plus BF16, so 2 references are held and 2 AdamW states warmed.
HELD_REFERENCES = 2
RECIPES_PER_PART = 2


def kept_layers(num_layers: int) -> tuple[int, float]:
    """(k, k / L): the layers selective precision keeps in BF16 (the `full` recipe's rule)."""
    k = PrecisionRecipe.from_name("full").num_high_precision_layers(num_layers)
    return k, k / num_layers


def activation_bytes_per_token(mc: ModelConfig, seq_len: int) -> float:
    """a(S) of the module docstring: bytes saved for the backward per token of a sequence of seq_len."""
    D, q, kv = mc.d_model, mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    per_layer = 2 * (6 * D + 3 * q + 3 * kv + 3 * mc.shared_expert_d_ff + mc.top_k * (2 * D + 3 * mc.moe_d_ff))
    per_layer += 8 * mc.num_experts + 6 * mc.num_heads * seq_len
    return mc.num_layers * per_layer + 12 * mc.vocab_size


def warmup_memory(mc: ModelConfig, batch_size: int, max_len: int) -> float:
    p = mc.param_count().total
    return (24 + C_P) * p + OVERHEAD * batch_size * max_len * activation_bytes_per_token(mc, max_len)


def measurement_memory(mc: ModelConfig, rows: int, seq_len: int, keys: int, warm_states: int,
                       held: int = HELD_REFERENCES) -> float:
    p = mc.param_count().total
    output = (4 if keys == 1 else 8) * p
    gradient = output + (C_P + 4 * (keys - 1)) * p + OVERHEAD * rows * seq_len * activation_bytes_per_token(mc, seq_len)
    return (4 + 4 * held + 8 * warm_states) * p + max(gradient, output + 4 * p, output + 8 * p)


def gradient_sources(recipe_names: Sequence[str]) -> list[int]:
    """Key draws per batch of each gradient source `fp4rl.rl.gradients.Session` computes for these
    recipes: BF16, each distinct straight-through view, and every recipe whose backward is not BF16."""
    from fp4rl.rl import gradients  # the measurement's own rules (imports JAX)

    recipes = [PrecisionRecipe.from_name(n) for n in ("bf16", *[r for r in recipe_names if r != "bf16"])]
    sources = {}
    for recipe in recipes:
        sources.setdefault(gradients.straight_through(recipe), 1)
    for recipe in recipes:
        if not gradients.is_straight_through(recipe):
            sources.setdefault(recipe, 2 if gradients.draws_keys(recipe) else 1)
    return list(sources.values())


def plan_row(name: str, mc: ModelConfig, warmup, measurement) -> dict:
    """One preset's row. warmup: its `sft.SFTConfig`; measurement: its `fp4rl.rl.gradients_config.GradientsConfig`."""
    mc = dataclasses.replace(mc, max_seq_len=max(mc.max_seq_len, warmup.max_len + warmup.max_new_tokens))
    counts = mc.param_count()
    k, share = kept_layers(mc.num_layers)
    r = measurement.rollout
    rows, seq = r.prompts_per_step * r.group_size, r.prompt_len + r.max_new_tokens
    train_flops, fwd_flops = mc.flops_per_token(seq, training=True), mc.flops_per_token(seq, training=False)
    keys = [measurement.sr_keys if n > 1 else 1 for n in gradient_sources(measurement.recipes)]
    recipes = len(measurement.recipe_names)
    classes = len({PrecisionRecipe.from_name(n).forward_only() for n in measurement.recipe_names})
    after = measurement.batches - measurement.adam_warmup_batches
    kl_batches = after if measurement.kl_batches is None else measurement.kl_batches
    tokens = rows * seq
    warm_flops = warmup.steps * warmup.batch_size * warmup.max_len * mc.flops_per_token(warmup.max_len)
    meas_flops = measurement.batches * tokens * (GEN_BATCHES * fwd_flops + sum(keys) * train_flops
                                                 + classes * fwd_flops)
    meas_flops += kl_batches * recipes * len(measurement.optim.lrs) * tokens * fwd_flops
    warm_mem = warmup_memory(mc, warmup.batch_size, warmup.max_len)
    states = RECIPES_PER_PART if measurement.adam_warmup_batches else 0
    meas_mem = measurement_memory(mc, rows, seq, max(keys), states)
    return {
        "preset": name, "layers": mc.num_layers, "d_model": mc.d_model,
        "heads": f"{mc.num_heads}x{mc.head_dim} ({mc.num_kv_heads} kv)",
        "experts": f"{mc.num_experts}x{mc.moe_d_ff} top-{mc.top_k}", "shared_expert_d_ff": mc.shared_expert_d_ff,
        "kept_layers": k, "kept_share": share, "kept_share_in_band": KEPT_SHARE_BAND[0] <= share <= KEPT_SHARE_BAND[1],
        "params_total": counts.total, "params_active": counts.active,
        "flops_per_token_train": train_flops, "flops_per_token_forward": fwd_flops, "seq_len": seq,
        "warmup": {"tokens": warmup.steps * warmup.batch_size * warmup.max_len, "flops": warm_flops, "memory_bytes": warm_mem,
                   "fits_h200": warm_mem <= H200_BYTES, "seconds_fast": warm_flops / FAST_FLOPS,
                   "seconds_slow": warm_flops / SLOW_WARMUP_FLOPS, "lr": warmup.lr, "steps": warmup.steps,
                   "batch_size": warmup.batch_size},
        "measurement": {"batches": measurement.batches, "rows": rows, "tokens_per_batch": tokens,
                        "sources": len(keys), "flops": meas_flops, "memory_bytes": meas_mem,
                        "memory_assumes": f"a part of {RECIPES_PER_PART - 1} recipe + bf16, {HELD_REFERENCES} held references, "
                                          f"{states} warmed AdamW states, {max(keys)} key draws",
                        "fits_h200": meas_mem <= H200_BYTES, "seconds_fast": meas_flops / FAST_FLOPS,
                        "seconds_slow": meas_flops / SLOW_MEASUREMENT_FLOPS,
                        "adam_warmup_batches": measurement.adam_warmup_batches},
    }


def plan(ladder: Sequence[str], sft_presets: Mapping, gradients_presets: Mapping) -> list[dict]:
    """The rows of every preset of `ladder`; a name missing from a preset dict is an error naming the valid ones."""
    rows = []
    for name in ladder:
        for kind, presets in (("warm-up", sft_presets), ("gradients", gradients_presets)):
            if name not in presets:
                raise ValueError(f"ladder preset {name!r} has no {kind} preset; valid names: {tuple(presets)}")
        warmup = sft_presets[name]
        rows.append(plan_row(name, ModelConfig.from_name(warmup.model), warmup, gradients_presets[name]))
    return rows


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def _minutes(fast: float, slow: float) -> str:
    return f"{fast / 60:.1f}-{slow / 60:.0f}"


def plan_markdown(rows: Sequence[Mapping]) -> str:
    lines = ["# The model-size ladder: sizes, FLOPs, estimated memory and time", "",
             "Memory and time are estimates (formulas: `fp4rl/analysis/scaling_plan.py`), not measurements: memory "
             f"against one H200's {H200_BYTES / 1e9:.0f} GB; time in minutes from FLOPs at {FAST_FLOPS / 1e12:.0f} TFLOP/s "
             f"(fast) to the rates the h200 preset achieved ({SLOW_WARMUP_FLOPS / 1e12:.0f} TFLOP/s warm-up, "
             f"{SLOW_MEASUREMENT_FLOPS / 1e12:.0f} TFLOP/s measurement: slow), compiling excluded.", "",
             "| preset | layers | d_model | attention | experts | shared F | kept BF16 layers | params (total) | active | "
             "train GFLOP/token | warm-up memory GB | fits | warm-up min | measurement memory GB | fits | measurement min |",
             "|" + "---|" * 16]
    for r in rows:
        w, m = r["warmup"], r["measurement"]
        lines.append(f"| {r['preset']} | {r['layers']} | {r['d_model']} | {r['heads']} | {r['experts']} | "
                     f"{r['shared_expert_d_ff']} | "
                     f"{r['kept_layers']} of {r['layers']} ({100 * r['kept_share']:.1f}%) | {r['params_total'] / 1e6:,.1f}M | "
                     f"{r['params_active'] / 1e6:,.1f}M | {r['flops_per_token_train'] / 1e9:.3f} | {_gb(w['memory_bytes'])} | "
                     f"{'yes' if w['fits_h200'] else 'NO'} | {_minutes(w['seconds_fast'], w['seconds_slow'])} | "
                     f"{_gb(m['memory_bytes'])} | {'yes' if m['fits_h200'] else 'NO'} | "
                     f"{_minutes(m['seconds_fast'], m['seconds_slow'])} |")
    assumes = "; ".join(f"{r['preset']}: {r['measurement']['memory_assumes']}" for r in rows)
    lines += ["", f"Measurement memory assumes: {assumes}.",
              "A kept share outside 12-19% would not be docs/rl.md's \"last ~15%\": "
              + (", ".join(r["preset"] for r in rows if not r["kept_share_in_band"]) or "none is") + ".", ""]
    return "\n".join(lines)


def write_plan(rows: Sequence[Mapping], out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "plan.json", "report": out / "plan.md"}
    paths["json"].write_text(json.dumps(list(rows), indent=1))
    paths["report"].write_text(plan_markdown(rows))
    return paths
