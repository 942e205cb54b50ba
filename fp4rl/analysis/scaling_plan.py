"""The model-size ladder's plan: per rung, what it moves, its sizes, and its estimated memory and time.

`python -m experiments.scaling plan` writes one row per ladder rung (`fp4rl.configs.SCALING_LADDER`, in
device order): its role (the base where the two axes meet, the depth axis, the width path, the off-axis
rung, or a single factor of the width path), the factor it moves from its parent rung (`moves`: the
ModelConfig fields that differ, grouped as depth, d_model, routing, expert width, attention, shared
expert, dense MLP, attention norms and biases), parameter counts (`ModelConfig.param_count`: total,
active per token), FLOPs per token (`ModelConfig.flops_per_token`), the kept BF16 layers of selective
precision, and, for the BF16 warm-up and for each part of the gradient measurement
(`fp4rl.configs.LADDER_PARTS`), the estimated peak device memory and time, calibrated on the measured
rungs (`fp4rl.analysis.scaling_usage`), the device runs it takes, and whether it needs an H200 (a
calibrated estimate over one H100's memory).

Memory (bytes), stated here so that the estimate can be checked against a run (P: parameters):

  warm-up     = 24 P + C_P P + OVERHEAD T_w a(S_w)
                24 P: the warm-up step (`sft.train`) donates nothing, so its inputs (f32 parameters and
                AdamW's two f32 moments, 12 P) and its outputs (the same, 12 P) are live together;
                C_P P: the step's other parameter-sized temporaries (f32 gradients, the bf16 weights).
  measurement = (4 + 4 R + 8 W) P + max(gradient, compare, policy change), the phases of one source:
                gradient = O + C_P P + 4 (K - 1) P + OVERHEAD T_g a(S_g)
                compare  = O + 4 P,   policy change = O + 8 P,   O = 4 P (K = 1) or 8 P (K > 1)
                f32 parameters (4); R reference mean gradients held while a batch's later sources are
                compared with them (BF16 and each distinct straight-through view of the part's
                recipes); W warmed AdamW states (`adam_warmup_batches` > 0: one per recipe of the
                part, BF16 included, two f32 moments each); the
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
  experts and would not fit the wide presets). Budgets: one H100's 80 GB (H100_BYTES) and one H200's
  141 GB (H200_BYTES); a rung whose calibrated estimate exceeds the H100's needs an H200 (the device
  call passes needs_h200), and one over the H200's still runs: its measured peak is reported.

Time: an estimate from FLOPs, not a measurement, compiling excluded (the h200 measurement's parts
compiled ~5 min of wall time each on 4 threads, ahead of and overlapping their first batches):
FLOPs / rate at two effective rates, FAST (25% of the H200's 989 TFLOP/s dense BF16: large,
well-shaped GEMMs) and SLOW, what the h200 preset achieved (its warm-up loop ~4 TFLOP/s: 6.7e14 FLOPs
in 173 s, the first step's compile included; its gradient measurement ~8 TFLOP/s: its `nvfp4` part,
2.6e15 FLOPs by the formula below, in 312 s; small GEMMs and emulated NVFP4 cost more than their
FLOPs). The larger rungs should lie nearer FAST. FLOPs: warm-up steps x T_w x training FLOPs per
token; the measurement's rollouts (forward FLOPs of prompts and answers; decoding is bound by
memory, so the FLOPs understate it), its gradients (every source x its keys x a training pass of
T_g tokens, plus one forward per forward class) and its policy-change forwards; the rollouts are
drawn by the first part (later parts read them from the rung's rollouts file).

Device runs: one machine is held for at most RUN_SECONDS of work, and a fresh machine keeps nothing,
so every run of a rung trains its (deterministic) warm-up again. The parts are dealt to runs in order,
each run its warm-up plus as many parts as fit RUN_SECONDS by the calibrated slow estimates (the slow
rates include compiling: the h200 parts' times do); a run over it (a part alone too long) is flagged.

Calibration (`fp4rl.analysis.scaling_usage`): each estimate is multiplied by the factor measured on
the nearest smaller measured rung (its peak or its seconds over its own estimate), or by the prior
before any rung is measured.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fp4rl.model.config import ModelConfig
from fp4rl.recipe import PrecisionRecipe, draws_keys, is_straight_through, straight_through

H100_BYTES, H200_BYTES = 80e9, 141e9
C_P = 8
OVERHEAD = 2.1
FAST_FLOPS = 0.25 * 989e12
SLOW_WARMUP_FLOPS, SLOW_MEASUREMENT_FLOPS = 4e12, 8e12
KEPT_SHARE_BAND = (0.12, 0.19)  # docs/rl.md "Precision recipes": "last ~15%" means 12-19% of the layers
# Generation batches per rollout batch: dynamic sampling refills groups whose rewards are all equal
# (the h200 measurement drew 1.66 on average).
GEN_BATCHES = 1.7
# The default part (one recipe and BF16) of `measurement_memory`: 2 references held.
HELD_REFERENCES = 2
# A machine is held for 30 minutes, its start and the transfers included: 25 of them for work.
RUN_SECONDS = 25 * 60
ROLES = ("base", "depth axis", "width path", "off-axis", "factor")
# The factors a rung can move, as groups of ModelConfig fields (dense_d_ff: only with dense layers).
FACTORS = {"depth": ("num_layers",), "d_model": ("d_model",), "routing": ("num_experts", "top_k"),
           "expert width": ("moe_d_ff",), "attention": ("num_heads", "num_kv_heads", "head_dim"),
           "shared expert": ("shared_expert_d_ff", "shared_expert_gate"), "dense MLP": ("dense_d_ff", "dense_layers"),
           "attention norms and biases": ("qk_norm", "qkv_bias")}


@dataclasses.dataclass(frozen=True)
class Ladder:
    """The rungs in device order and what the plan needs beside their presets. parents: rung -> the
    rung it differs from ("" for the base, where the depth axis and the width path meet); factors: the
    rungs that move one factor of the width path alone (reported against their parent, not fitted);
    parts: rung -> the recipes of each measurement part (BF16 is in every part)."""

    rungs: tuple[str, ...]
    parents: Mapping[str, str]
    factors: tuple[str, ...] = ()
    parts: Mapping[str, tuple[tuple[str, ...], ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        unknown = [n for n in (*self.parents, *self.factors, *self.parts) if n not in self.rungs]
        bases = [n for n in self.rungs if not self.parents.get(n)]
        if unknown or len(bases) != 1:
            raise ValueError(f"a ladder needs exactly one base (a rung without a parent; got {bases}) and only its own "
                             f"rungs in parents, factors and parts (unknown: {unknown}); rungs: {self.rungs}")

    @property
    def base(self) -> str:
        return next(n for n in self.rungs if not self.parents.get(n))


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


def gradient_sources(recipe_names: Sequence[str]) -> tuple[list[int], int]:
    """(key draws per batch of each gradient source `fp4rl.studies.gradients.Session` computes for these
    recipes, the references it holds): the sources are BF16, each distinct straight-through view, and
    every recipe whose backward is not BF16; the references BF16 and the views."""
    recipes = [PrecisionRecipe.from_name(n) for n in ("bf16", *[r for r in recipe_names if r != "bf16"])]
    sources = {}
    for recipe in recipes:
        sources.setdefault(straight_through(recipe), 1)
    held = len(sources)
    for recipe in recipes:
        if not is_straight_through(recipe):
            sources.setdefault(recipe, 2 if draws_keys(recipe) else 1)
    return list(sources.values()), held


def moves(parent: ModelConfig | None, mc: ModelConfig) -> str:
    """What `mc` changes from `parent`, factor by factor (FACTORS), e.g. "depth 8 -> 16"."""
    if parent is None:
        return "base"
    changed = []
    for factor, fields in FACTORS.items():
        if factor == "dense MLP" and not (mc.dense_layers or parent.dense_layers):
            continue  # the dense width of a model without dense layers is no factor
        diffs = [(f, getattr(parent, f), getattr(mc, f)) for f in fields if getattr(parent, f) != getattr(mc, f)]
        if len(diffs) == 1 and len(fields) == 1:
            changed.append(f"{factor} {diffs[0][1]} -> {diffs[0][2]}")
        elif diffs:
            changed.append(f"{factor} ({', '.join(f'{f} {a} -> {b}' for f, a, b in diffs)})")
    return "; ".join(changed) or "nothing"


def role(name: str, ladder: Ladder, coords: Mapping[str, tuple[int, int]]) -> str:
    """ROLES: a factor rung, the base, or where (L, d_model) lies against the base's two axes."""
    if name in ladder.factors:
        return "factor"
    (layers, width), (l0, d0) = coords[name], coords[ladder.base]
    if name == ladder.base:
        return "base"
    return "depth axis" if width == d0 else "width path" if layers == l0 else "off-axis"


def part_estimate(mc: ModelConfig, measurement, recipes: Sequence[str], draws_rollouts: bool) -> dict:
    """Memory and FLOPs of one measurement process of `recipes` (+ BF16)."""
    r = measurement.rollout
    rows, seq = r.prompts_per_step * r.group_size, r.prompt_len + r.max_new_tokens
    tokens = rows * seq
    train_flops, fwd_flops = mc.flops_per_token(seq, training=True), mc.flops_per_token(seq, training=False)
    draws, held = gradient_sources(recipes)
    keys = [measurement.sr_keys if n > 1 else 1 for n in draws]
    names = ("bf16", *[n for n in recipes if n != "bf16"])
    classes = len({PrecisionRecipe.from_name(n).forward_only() for n in names})
    after = measurement.batches - measurement.adam_warmup_batches
    kl_batches = after if measurement.kl_batches is None else measurement.kl_batches
    flops = measurement.batches * tokens * ((GEN_BATCHES * fwd_flops if draws_rollouts else 0)
                                            + sum(keys) * train_flops + classes * fwd_flops)
    flops += kl_batches * len(names) * len(measurement.optim.lrs) * tokens * fwd_flops
    states = len(names) if measurement.adam_warmup_batches else 0
    return {"recipes": list(names[1:]), "sources": len(keys), "held_references": held, "warm_states": states,
            "key_draws": max(keys), "flops": flops, "memory_bytes": measurement_memory(mc, rows, seq, max(keys), states, held),
            "seconds_fast": flops / FAST_FLOPS, "seconds_slow": flops / SLOW_MEASUREMENT_FLOPS}


def plan_row(name: str, mc: ModelConfig, warmup, measurement, parts: Sequence[Sequence[str]] = ()) -> dict:
    """One preset's row. warmup: its `sft.SFTConfig`; measurement: its `fp4rl.studies.gradients_config.GradientsConfig`;
    parts: the recipes of each measurement process (default: all of the measurement's in one)."""
    mc = dataclasses.replace(mc, max_seq_len=max(mc.max_seq_len, warmup.max_len + warmup.max_new_tokens))
    counts = mc.param_count()
    k, share = kept_layers(mc.num_layers)
    r = measurement.rollout
    rows, seq = r.prompts_per_step * r.group_size, r.prompt_len + r.max_new_tokens
    train_flops, fwd_flops = mc.flops_per_token(seq, training=True), mc.flops_per_token(seq, training=False)
    parts = [list(p) for p in parts] or [[n for n in measurement.recipe_names if n != "bf16"]]
    estimates = [part_estimate(mc, measurement, p, i == 0) for i, p in enumerate(parts)]
    warm_flops = warmup.steps * warmup.batch_size * warmup.max_len * mc.flops_per_token(warmup.max_len)
    warm_mem = warmup_memory(mc, warmup.batch_size, warmup.max_len)
    meas_mem = max(e["memory_bytes"] for e in estimates)
    meas_flops = sum(e["flops"] for e in estimates)
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
        "measurement": {"batches": measurement.batches, "rows": rows, "tokens_per_batch": rows * seq,
                        "recipes": [n for n in measurement.recipe_names if n != "bf16"],
                        "sources": sum(e["sources"] for e in estimates), "flops": meas_flops, "memory_bytes": meas_mem,
                        "memory_assumes": "; ".join(f"part {i + 1} ({', '.join(e['recipes'])}): {e['held_references']} held "
                                                    f"references, {e['warm_states']} warmed AdamW states, {e['key_draws']} key "
                                                    "draws" for i, e in enumerate(estimates)),
                        "fits_h200": meas_mem <= H200_BYTES, "seconds_fast": meas_flops / FAST_FLOPS,
                        "seconds_slow": meas_flops / SLOW_MEASUREMENT_FLOPS,
                        "adam_warmup_batches": measurement.adam_warmup_batches, "parts": estimates},
    }


def calibrate(row: dict, factors: Mapping[str, Mapping[str, float]], source: str) -> dict:
    """The row with its estimates multiplied by `factors` ({"warmup"|"measurement": {"memory"|"time": f}},
    measured on rung `source`, or the priors), the device it needs and its device runs."""
    row = json.loads(json.dumps(row))  # a copy
    w, m = row["warmup"], row["measurement"]
    fw, fm = factors["warmup"], factors["measurement"]
    w["memory_calibrated"], w["seconds_calibrated"] = w["memory_bytes"] * fw["memory"], w["seconds_slow"] * fw["time"]
    for part in m["parts"]:
        part["memory_calibrated"] = part["memory_bytes"] * fm["memory"]
        part["seconds_calibrated"] = part["seconds_slow"] * fm["time"]
    m["memory_calibrated"] = max(p["memory_calibrated"] for p in m["parts"])
    peak = max(w["memory_calibrated"], m["memory_calibrated"])
    row["calibration"] = {"source": source, "factors": {k: dict(v) for k, v in factors.items()}}
    row["needs_h200"] = peak > H100_BYTES
    row["fits_h200_calibrated"] = peak <= H200_BYTES
    row["runs"] = device_runs(w["seconds_calibrated"], [p["seconds_calibrated"] for p in m["parts"]])
    return row


def device_runs(warmup_seconds: float, part_seconds: Sequence[float]) -> list[dict]:
    """The parts (1-based) dealt in order to device runs of at most RUN_SECONDS (module docstring):
    each run its warm-up's seconds plus its parts'."""
    runs, current = [], None
    for i, seconds in enumerate(part_seconds, 1):
        if current is None or current["seconds"] + seconds > RUN_SECONDS:
            current = {"parts": [], "seconds": warmup_seconds}
            runs.append(current)
        current["parts"].append(i)
        current["seconds"] += seconds
    for run in runs:
        run["over_one_machine"] = run["seconds"] > RUN_SECONDS
    return runs


def plan(ladder: Ladder, sft_presets: Mapping, gradients_presets: Mapping,
         calibration: Callable[[str, int], tuple[dict, str]] | None = None, only: Sequence[str] = ()) -> list[dict]:
    """The rows of the rungs `only` (default: every rung of `ladder`), in the ladder's order; a name
    missing from a preset dict or from the ladder is an error naming the valid ones.
    calibration(rung, params_total) -> (factors, where they were measured) (default: the priors of
    `scaling_usage`)."""
    from fp4rl.analysis import scaling_usage

    unknown = [n for n in only if n not in ladder.rungs]
    if unknown:
        raise ValueError(f"unknown rungs {unknown}; valid names: {ladder.rungs}")
    models = {}
    for name in ladder.rungs:
        for kind, presets in (("warm-up", sft_presets), ("gradients", gradients_presets)):
            if name not in presets:
                raise ValueError(f"ladder preset {name!r} has no {kind} preset; valid names: {tuple(presets)}")
        models[name] = ModelConfig.from_name(sft_presets[name].model)
    parents = {n: ladder.parents.get(n, "") for n in ladder.rungs}
    missing = sorted({p for p in parents.values() if p and p not in sft_presets})
    if missing:
        raise ValueError(f"parents {missing} have no warm-up preset; valid names: {tuple(sft_presets)}")
    coords = {n: (m.num_layers, m.d_model) for n, m in models.items()}
    calibration = calibration or (lambda rung, params: (scaling_usage.PRIOR, "prior"))
    rows = []
    for name in (n for n in ladder.rungs if not only or n in only):
        row = plan_row(name, models[name], sft_presets[name], gradients_presets[name], ladder.parts.get(name, ()))
        parent = parents[name]
        row.update(parent=parent, role=role(name, ladder, coords),
                   moves=moves(ModelConfig.from_name(sft_presets[parent].model) if parent else None, models[name]))
        rows.append(calibrate(row, *calibration(name, row["params_total"])))
    return rows


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def plan_markdown(rows: Sequence[Mapping]) -> str:
    lines = ["# The model-size ladder: what each rung moves, sizes, FLOPs, estimated memory and time", "",
             "Rungs in device order. Memory and time are estimates (formulas: `fp4rl/analysis/scaling_plan.py`), "
             "calibrated on the measured rungs (`fp4rl/analysis/scaling_usage.py`; the factor applied and the rung it was "
             f"measured on are in the last column): memory against one H100's {H100_BYTES / 1e9:.0f} GB and one H200's "
             f"{H200_BYTES / 1e9:.0f} GB; time in minutes at the rates the h200 preset achieved "
             f"({SLOW_WARMUP_FLOPS / 1e12:.0f} TFLOP/s warm-up, {SLOW_MEASUREMENT_FLOPS / 1e12:.0f} TFLOP/s measurement, "
             f"compiling included), in device runs of at most {RUN_SECONDS // 60} minutes, each with its warm-up.", "",
             "| rung | role | moves (from parent) | layers | d_model | attention | experts | shared F | kept BF16 layers | "
             "params (total) | active | train GFLOP/token | warm-up GB | measurement GB (largest part) | device | "
             "warm-up min | measurement min (parts) | device runs (min) | calibration |",
             "|" + "---|" * 19]
    for r in rows:
        w, m = r["warmup"], r["measurement"]
        device = "H100" if not r["needs_h200"] else "**H200**" if r["fits_h200_calibrated"] else "**over an H200**"
        runs = ", ".join(f"{_minutes(x['seconds'])}{' (over one machine)' if x['over_one_machine'] else ''}" for x in r["runs"])
        f = r["calibration"]["factors"]
        lines.append(f"| {r['preset']} | {r['role']} | {r['moves']} | {r['layers']} | {r['d_model']} | {r['heads']} | "
                     f"{r['experts']} | {r['shared_expert_d_ff'] or 'none'} | "
                     f"{r['kept_layers']} of {r['layers']} ({100 * r['kept_share']:.1f}%) | {r['params_total'] / 1e6:,.1f}M | "
                     f"{r['params_active'] / 1e6:,.1f}M | {r['flops_per_token_train'] / 1e9:.3f} | "
                     f"{_gb(w['memory_calibrated'])} | {_gb(m['memory_calibrated'])} | {device} | "
                     f"{_minutes(w['seconds_calibrated'])} | "
                     f"{' + '.join(_minutes(p['seconds_calibrated']) for p in m['parts'])} ({len(m['parts'])}) | {runs} | "
                     f"memory x{f['warmup']['memory']:.2f} / x{f['measurement']['memory']:.2f}, time "
                     f"x{f['warmup']['time']:.2f} / x{f['measurement']['time']:.2f} ({r['calibration']['source']}) |")
    assumes = "; ".join(f"{r['preset']}: {r['measurement']['memory_assumes']}" for r in rows)
    lines += ["", f"Measurement parts: {assumes}.",
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
