"""Every experiment's presets, in one place (docs/design.md practices 8 and 9).

One dict of named, complete configs per entry point (`python -m experiments.NAME --preset KEY`):
`SFT_PRESETS` (experiments.sft), `RL_PRESETS` (experiments.rl), `GRADIENTS_PRESETS`,
`ABLATION_PRESETS`, `SERVE_PRESETS`, `SERVE_EVAL_PRESETS` and `NUMERICS_PRESETS`. Each config's
field defaults live on its dataclass (e.g. `fp4rl.rl.sft.SFTConfig`); a preset only names the
fields it changes. The later dicts are built from the earlier ones (the RL presets train on the
warm-up's task constants, the gradient measurements start from the RL presets, the ablation
combines all three), so a value changed here changes every experiment that follows it.

The entry points import this module, never each other; the library does not import it.
"""

from __future__ import annotations

import dataclasses

from fp4rl.numerics_study import NumericsConfig
from fp4rl.recipe import ABLATION_ARMS
from fp4rl.rl import policy, sft, trainer
from fp4rl.studies import gradients_config
from fp4rl.studies.ablation import RUNNER_SET, AblationConfig, field_default
from fp4rl.rl.task import TaskConfig
from fp4rl.serving.deployment_eval import ServeEvalConfig
from fp4rl.serving.engine import EngineConfig
from fp4rl.serving.serve_config import ServeConfig
from fp4rl.serving.ttft import TTFTConfig

# ------------------------------------------------------------------------------------------ tasks

# The RL band (docs/rl.md's difficulty knobs): two or three operations on one-digit literals, two
# operands per step; the warm-up trains on one to three. Short problems keep CPU runs fast and let
# a short warm-up get the scratchpad mostly right.
SMOKE_TASK = TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2)
WARMUP_TASK = TaskConfig(min_ops=1, max_ops=3, digits=1, max_operands=2)
RL_TASK = TaskConfig(min_ops=2, max_ops=3, digits=1, max_operands=2)
# CPU scale: the warm-up trains on one or two operations; the RL band is one operation. There the
# scratchpad is right in most samples of the short CPU warm-up, so most wrong samples are the noisy
# teacher's miscopied box (`fp4rl.rl.failures`), the deficit RL repairs; on two operations most are
# arithmetic slips, which 48 RL steps of a 7-layer model do not repair, and the gain stays small.
CPU_TASK = TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2)
CPU_RL_TASK = TaskConfig(min_ops=1, max_ops=1, digits=1, max_operands=2)
# The noisy teacher (`task.noisy_solution`): half of the training solutions box a wrong answer, so
# the warm-up samples the right answer about half as often as its scratchpad gets it right, and RL
# has something to learn.
ANSWER_NOISE = 0.5
# The long-horizon band (`h200-long`): two-digit literals, +, - and *, two to five operations of two
# operands each, a clean teacher. The noisy teacher's deficit is one behaviour (box the value the
# scratchpad computed), which RL learns in ~20 steps and then saturates; here the deficit is the
# arithmetic of each scratchpad line, spread over many facts (carries and borrows of two- and
# three-digit values and negatives; a product survives the bound of 999 in about one line of ten),
# and a level of n operations is right only if all n lines are, so per-line gains compound over the
# levels: the long chains stay unsolved long after the short ones are, and the band keeps a learning
# signal for hundreds of steps. The warm-up trains on one to five operations (no level of the band is
# longer than any it has seen).
LONG_WARMUP_TASK = TaskConfig(min_ops=1, max_ops=5, digits=2, operators="+-*", max_operands=2)
LONG_TASK = TaskConfig(min_ops=2, max_ops=5, digits=2, operators="+-*", max_operands=2)
# The same deficit one size down (`h200-chain`): one-digit literals with +, - and * (values within
# 99) in chains of up to six operations; a line is easier (a product in one line of four), so the
# warm-up gets most lines right and the chain's length sets the difficulty. Its warm-up (400 steps
# on 1-6 operations) sampled 0.65/0.46/0.26 at 4-6 operations (results/long_h200/README.md,
# "Candidate bands"): the band is the levels whose mean lies in 0.2-0.45, five and six (0.36).
CHAIN_WARMUP_TASK = TaskConfig(min_ops=1, max_ops=6, digits=1, operators="+-*", max_operands=2)
CHAIN_TASK = TaskConfig(min_ops=5, max_ops=6, digits=1, operators="+-*", max_operands=2)

# ------------------------------------------------------------------------ BF16 warm-up (experiments.sft)

SFT_PRESETS = {
    "smoke": sft.SFTConfig(model="tiny", task=SMOKE_TASK, eval_task=SMOKE_TASK, steps=20, warmup_steps=5, batch_size=8,
                           max_len=80, eval_problems=4, max_new_tokens=48, out="runs/smoke/sft"),
    "cpu": sft.SFTConfig(model="cpu", task=CPU_TASK, eval_task=CPU_RL_TASK, steps=300, warmup_steps=30, batch_size=64,
                         max_len=80, lr=5e-3, eval_problems=64, max_new_tokens=48, answer_noise=ANSWER_NOISE,
                         out="runs/cpu/sft"),
    "h200": sft.SFTConfig(model="h200", task=WARMUP_TASK, eval_task=RL_TASK, steps=400, batch_size=128, max_len=112,
                          lr=1e-3, warmup_steps=40, eval_problems=512, max_new_tokens=72, answer_noise=ANSWER_NOISE,
                          out="runs/h200/sft"),
    # Prompts up to 58 tokens and solutions up to 104 (BOS and EOS included): 168 holds both.
    "h200-long": sft.SFTConfig(model="h200", task=LONG_WARMUP_TASK, eval_task=LONG_TASK, steps=400, batch_size=128,
                               max_len=168, lr=1e-3, warmup_steps=40, eval_problems=512, max_new_tokens=120,
                               out="runs/h200-long/sft"),
}
# The long-horizon bands' other warm-ups (`LONG_BANDS`): h200-long's with 4x the data (2x the steps at
# 2x the batch; its 400 steps left the loss falling and the band under its floor), and h200-chain's.
SFT_PRESETS["h200-long-x4"] = dataclasses.replace(SFT_PRESETS["h200-long"], steps=800, batch_size=256, warmup_steps=80,
                                                  out="runs/h200-long-x4/sft")
SFT_PRESETS["h200-chain"] = dataclasses.replace(SFT_PRESETS["h200-long"], task=CHAIN_WARMUP_TASK, eval_task=CHAIN_TASK,
                                                out="runs/h200-chain/sft")
# The long-horizon bands: h200-long and its candidates, each judged by its warm-up alone (`fp4rl.analysis.band`).
LONG_BANDS = ("h200-long-x4", "h200-chain", "h200-long")

# The model-size ladder (`experiments.scaling`; docs/rl.md "Model-size ladder"), the `ladder-*` model presets
# (fp4rl/model/config.py): in depth, h200's layer at 6, 8, 16 and 32 layers; in width, at 6 layers, a path of
# layers from h200's (d_model 512) to the paper's (2048: Qwen3-30B-A3B's layer, no shared expert); one rung off
# both axes (d_model 1024 at 16 layers), which the fit predicts before it uses it; and single factors of the
# width path, each varied alone from ladder-w512-l6. Each rung's warm-up, RL and gradient presets are h200's
# with the learning rates scaled and, for the widest, smaller batches; ladder-w512-l8 is h200 itself (its
# warm-up is h200's, in runs/h200/sft) measured with the ladder's settings. The warm-up must land in the RL
# band (sampled accuracy 0.2-0.45 on RL_TASK: `fp4rl.analysis.band`), checked before the measurement.
# SCALING_LADDER is the device order: the depth axis from its base, the shared expert removed at the base
# (the paper's model has none, and the widest rung drops it), the width path, the off-axis rung, the widest
# (an H200), then the other single factors, cheapest first.
# name -> (parent, lr factor, warm-up batch size, prompts per gradient batch, AdamW warm-up batches). The
# parent is the rung this one differs from (the plan names what it moves). The factor multiplies h200's
# warm-up and RL learning rates: 512 / d_model (Adam's hidden-matrix updates grow with the width they sum
# over) times sqrt(8 / layers) for the deeper rungs (more residual branches add up), rounded. Every warm-up
# sees h200's 51,200 sequences; ladder-w2048-l6's in batches of 32 x 1600 steps (the plan: 128 would not fit
# one H200), at sqrt(32 / 128) of its learning rate. The measurements of ladder-w1024-l16 and ladder-w2048-l6
# take 16 prompts per batch (half the activations: the plan's estimate of 32 is over one H200), and
# ladder-w2048-l6's no warmed AdamW state (two states, the recipe's and BF16's, would hold 60 GB more).
_LADDER = {
    "ladder-w512-l6": ("", 1.0, 128, 32, 16),
    "ladder-w512-l6-noshared": ("ladder-w512-l6", 1.0, 128, 32, 16),
    "ladder-w512-l8": ("ladder-w512-l6", 1.0, 128, 32, 16),
    "ladder-w512-l16": ("ladder-w512-l8", 0.7, 128, 32, 16),
    "ladder-w512-l32": ("ladder-w512-l16", 0.5, 128, 32, 16),
    "ladder-w1024-l6": ("ladder-w512-l6", 0.5, 128, 32, 16),
    "ladder-w1024-l16": ("ladder-w1024-l6", 0.35, 128, 16, 16),
    "ladder-w2048-l6": ("ladder-w1024-l6", 0.25, 32, 16, 0),
    "ladder-w512-l6-h32": ("ladder-w512-l6", 1.0, 128, 32, 16),
    "ladder-w512-l6-e128k8": ("ladder-w512-l6", 1.0, 128, 32, 16),
    "ladder-d2048-l6": ("ladder-w512-l6", 0.25, 128, 32, 16),
    "ladder-w512-l6-f768": ("ladder-w512-l6", 1.0, 128, 32, 16),
}
SCALING_LADDER = tuple(_LADDER)
LADDER_PARENTS = {name: parent for name, (parent, *_) in _LADDER.items()}
# The rungs that vary one factor of the width path away from it: reported against their parent, not fitted
# (the fit's coordinates are depth and d_model along the path; ladder-d2048-l6 has the widest rung's d_model
# with h200's layer).
SCALING_FACTOR_RUNGS = ("ladder-w512-l6-noshared", "ladder-w512-l6-h32", "ladder-w512-l6-e128k8", "ladder-d2048-l6",
                        "ladder-w512-l6-f768")
# What every rung measures (docs/rl.md "Model-size ladder"): BF16, the paper's no-intervention arms (BF16 and
# quantized backward), the dequantized backward, Four-Over-Six, all three, and all but selective precision.
LADDER_RECIPES = ("bf16", "nvfp4", "nvfp4-pt", "+dq", "+46", "full", "full-hp")
# The measurement of a rung whose recipes do not fit one process or one device run (the plan's estimates)
# runs in parts (`--recipes` per part, the rung's stored rollouts shared), merged with
# `experiments.gradients --merge`: LADDER_SPLIT groups the recipes that share a straight-through view (nvfp4
# for +dq; +46 for full-hp; full's own full-dq) and puts nvfp4-pt alone (its two key draws hold two more
# parameter-sized buffers); ladder-w1024-l16 measures one recipe per part (one warmed AdamW state less).
LADDER_SPLIT = (("nvfp4", "+dq"), ("nvfp4-pt",), ("+46", "full-hp"), ("full",))
_ONE_PART = ("ladder-w512-l6", "ladder-w512-l6-noshared", "ladder-w512-l8", "ladder-w512-l6-e128k8")
LADDER_PARTS = {name: (LADDER_RECIPES[1:],) if name in _ONE_PART else LADDER_SPLIT for name in _LADDER}
LADDER_PARTS["ladder-w1024-l16"] = tuple((recipe,) for recipe in LADDER_RECIPES[1:])
# Where each rung's small results are committed (`python -m experiments.scaling collect` writes
# LADDER_RESULTS/RUNG; `status` writes LADDER_RESULTS/status.md).
LADDER_RESULTS = "results/scaling_h200"


def _ladder_warmup(name: str) -> sft.SFTConfig:
    h200 = SFT_PRESETS["h200"]
    if name == "ladder-w512-l8":
        return h200
    _, factor, batch, _, _ = _LADDER[name]
    steps = h200.steps * h200.batch_size // batch
    return dataclasses.replace(h200, model=name, lr=h200.lr * factor * (batch / h200.batch_size) ** 0.5, batch_size=batch,
                               steps=steps, warmup_steps=steps // 10, out=f"runs/{name}/sft")


SFT_PRESETS.update({name: _ladder_warmup(name) for name in _LADDER})


def warmup_config(preset: str | None, init: str) -> sft.SFTConfig:
    """The warm-up `--preset NAME` trains into `init` when none is there: the SFT preset of the
    same name (no --preset: SFTConfig's defaults, as the RL settings are then RLConfig's)."""
    return dataclasses.replace(sft.SFTConfig() if preset is None else SFT_PRESETS[preset], out=init)


# --------------------------------------------------------------------------- DAPO RL (experiments.rl)

RL_PRESETS = {
    "smoke": trainer.RLConfig(steps=2, task=SMOKE_TASK, group_size=4, prompts_per_step=2, max_gen_batches=2,
                              mini_batches=2, max_new_tokens=48, overlong_buffer=8, prompt_len=32, eval_every=2, eval_prompts=8,
                              init="runs/smoke/sft", out="runs/smoke/rl"),
    # One generation batch per step (dynamic sampling drops the groups without a learning signal and
    # masks their slots instead of refilling them): on two CPU cores a refill costs half an update.
    "cpu": trainer.RLConfig(steps=48, task=CPU_RL_TASK, group_size=8, prompts_per_step=8, max_gen_batches=1,
                            mini_batches=2, max_new_tokens=48, overlong_buffer=4, prompt_len=32, eval_every=24,
                            eval_prompts=256, optim=trainer.OptimConfig(lr=1e-4, warmup_steps=2), init="runs/cpu/sft",
                            out="runs/cpu/rl"),
    "h200": trainer.RLConfig(steps=100, task=RL_TASK, group_size=8, prompts_per_step=32,
                             max_gen_batches=3, mini_batches=2, max_new_tokens=72, overlong_buffer=8, prompt_len=40,
                             optim=trainer.OptimConfig(lr=3e-5, warmup_steps=3), eval_every=20, eval_prompts=512,
                             checkpoint_every=50, init="runs/h200/sft", out="runs/h200/rl"),
    # The long-horizon task: 300 steps, answers up to 104 tokens (the overlong buffer starts past
    # them), held-out evaluations every 25 steps, a checkpoint every 25 (a lent machine can be taken
    # back mid-call; a rerun resumes).
    "h200-long": trainer.RLConfig(steps=300, task=LONG_TASK, group_size=8, prompts_per_step=32,
                                  max_gen_batches=3, mini_batches=2, max_new_tokens=120, overlong_buffer=8, prompt_len=64,
                                  optim=trainer.OptimConfig(lr=3e-5, warmup_steps=3), eval_every=25, eval_prompts=512,
                                  checkpoint_every=25, init="runs/h200-long/sft", out="runs/h200-long/rl"),
}
RL_PRESETS.update({name: dataclasses.replace(RL_PRESETS["h200-long"], task=SFT_PRESETS[name].eval_task,
                                           init=SFT_PRESETS[name].out, out=f"runs/{name}/rl")
                   for name in LONG_BANDS if name != "h200-long"})



def _ladder_rl(name: str) -> trainer.RLConfig:
    h200 = RL_PRESETS["h200"]
    return dataclasses.replace(h200, optim=dataclasses.replace(h200.optim, lr=h200.optim.lr * _LADDER[name][1]),
                               init=SFT_PRESETS[name].out, out=f"runs/{name}/rl")


RL_PRESETS.update({name: _ladder_rl(name) for name in _LADDER})

# The paper's setting: a Hugging Face Qwen-MoE checkpoint as the initial policy (--model.hf=DIR, no
# warm-up) on DAPO-Math-17k (--rl.data_file=FILE). Sequences of 8k tokens (1k of prompt: DAPO-Math
# prompts with a chat template are a few hundred tokens), DAPO's group of 16 and learning rate 1e-6,
# its overlong buffer scaled to the shorter limit; 32 prompts x 16 in 4 mini-batches of 128 rows,
# which split evenly over 8 devices. No held-out evaluation by default: it needs held-out rows of the
# data set's format (--rl.eval_every=N --rl.eval_file=FILE: greedy and sampled accuracy on its first
# eval_prompts usable rows).
# The update rematerialises each layer, attends in chunks of 1,024 queries, applies the LM head to
# 1,024 positions at a time and runs each mini-batch as 16 micro-batches of 8 rows (one row per
# device on 8 devices): without these its activations alone need terabytes per device; the rollout
# samples each generation batch in 4 calls of 128 rows, so the KV cache holds 16 rows per device
# (docs/parallel.md "Memory per device"), and prefills on the prompt's slots only. The update runs on
# the columns a step uses (a step's longest prompt and response, rounded up to powers of two), and
# without the initial policy's log-probs (DAPO has no KL term: they would only be logged).
RL_PRESETS["hf"] = trainer.RLConfig(steps=200, group_size=16, prompts_per_step=32, max_gen_batches=3, mini_batches=4,
                                    generation_chunks=4, prompt_prefill=True, trim_padding=True,
                                    reference_logprobs=False,
                                    prompt_len=1024, max_new_tokens=7168, overlong_buffer=1024,
                                    optim=trainer.OptimConfig(lr=1e-6, warmup_steps=10), eval_every=0,
                                    checkpoint_every=10, init="", model=trainer.ModelSource(dtype="bfloat16"),
                                    memory=policy.UpdateMemory(remat=True, attention_query_chunk=1024, micro_batches=16,
                                                               logit_chunk=1024),
                                    out="runs/hf/rl")

# -------------------------------------------------------- gradient measurements (experiments.gradients)


def _gradients_preset(name: str, prompts_per_step: int | None = None, max_gen_batches: int | None = None,
                      **overrides) -> gradients_config.GradientsConfig:
    """The RL preset's measurement (rollout, loss, optimizer, warm-up), optionally with another
    number of prompts per batch or of generation batches to fill one."""
    config = gradients_config.from_rl_config(RL_PRESETS[name], out=f"runs/{name}/gradients", **overrides)
    rollout = {k: v for k, v in (("prompts_per_step", prompts_per_step), ("max_gen_batches", max_gen_batches)) if v is not None}
    return dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, **rollout)) if rollout else config


GRADIENTS_PRESETS = {
    "smoke": _gradients_preset("smoke", batches=3, sr_keys=2, recipes=("bf16", "nvfp4"), mismatch_batches=1,
                               impls=("reference",), dtypes=("float32",), bootstrap=200, compile_workers=2),
    # CPU: the nine arms (about 2 min on 2 cores, compiling most of it), batches of 2 prompts x 8 filled
    # by dynamic sampling (up to 3 generation batches: the RL preset's one would leave some half
    # masked), and no sampler check (on XLA:CPU its k3 KL measured below 1e-8 in either compute dtype;
    # the RL runs log it every step).
    "cpu": _gradients_preset("cpu", prompts_per_step=2, max_gen_batches=3, batches=8, sr_keys=2, recipes=ABLATION_ARMS,
                             dtypes=(), compile_workers=2),
    # H200: every recipe, 128 batches of 32 prompts x 8; large groups through a CountSketch (the Gram
    # matrices of 16 gradient sources x 128 batches stay a few GB on the host); 4 threads compile ahead.
    # Two SR keys and the policy change on 16 batches keep a recipe's gradients near 0.3 s per batch.
    "h200": _gradients_preset("h200", prompts_per_step=32, batches=128, sr_keys=2, mismatch_batches=4, kl_batches=16,
                              sketch_dim=1 << 15, compile_workers=4),
    **{name: _gradients_preset(name, prompts_per_step=32, batches=128, sr_keys=2, mismatch_batches=4,
                               kl_batches=16, sketch_dim=1 << 15, compile_workers=4) for name in LONG_BANDS},
}
# The ladder: h200's measurement of LADDER_RECIPES, with each recipe's AdamW state warmed on 16 batches before
# the policy change is measured on the next 16 (a fresh state's first update is ~ -lr sign(g) in every recipe).
GRADIENTS_PRESETS.update({
    name: _gradients_preset(name, prompts_per_step=prompts, batches=128, sr_keys=2, mismatch_batches=4, kl_batches=16,
                            adam_warmup_batches=warm, sketch_dim=1 << 15, compile_workers=4, recipes=LADDER_RECIPES)
    for name, (_, _, _, prompts, warm) in _LADDER.items()})

# ------------------------------------------------------------------ the main job (experiments.ablation)


def _ablation_preset(name: str, seeds: int, compile_workers: int, measure_gradients: bool = False,
                     learning_steps: int = 0, arm_steps: int | None = None, arm_eval_every: int | None = None,
                     arm_seeds: int | None = None, sft_steps: int | None = None,
                     arms: tuple[str, ...] = ABLATION_ARMS) -> AblationConfig:
    """The experiments' presets of `name`, with the fields the runner sets itself (`RUNNER_SET`:
    directories, arm, seeds) left at their defaults, as AblationConfig requires; `sft_steps`: a
    shorter warm-up than the SFT preset's; `arms`: the matrix arms it runs by default."""
    def runner_fields_unset(config, sub: str):
        fields = [dotted.split(".")[1] for dotted in RUNNER_SET if dotted.startswith(sub + ".")]
        return dataclasses.replace(config, **{f: field_default(type(config), f) for f in fields})

    rl = RL_PRESETS[name] if arm_steps is None else dataclasses.replace(RL_PRESETS[name], steps=arm_steps)
    warmup = SFT_PRESETS[name] if sft_steps is None else dataclasses.replace(SFT_PRESETS[name], steps=sft_steps)
    measurement = GRADIENTS_PRESETS[name]
    return AblationConfig(sft=runner_fields_unset(warmup, "sft"), rl=runner_fields_unset(rl, "rl"),
                          gradients=runner_fields_unset(measurement, "gradients"),
                          measure_gradients=measure_gradients, learning_steps=learning_steps,
                          arm_eval_every=arm_eval_every, arm_seeds=arm_seeds, seeds=seeds,
                          arms=arms, compile_workers=compile_workers, out=f"runs/{name}/ablation")


# The CPU presets compile later arms on 2 threads while an arm trains (AblationConfig.compile_workers).
# The default main job (cpu), sized for under 10 minutes on 2 cores with the install (README.md): a 200-step
# warm-up, the gradient measurements of the nine arms at it, and a bf16 run long enough to show
# learning with margin (48 steps, 2 seeds, 256 held-out problems before and after).
# No arm of the RL matrix by default: at the 1 step of 1 seed that fits, the nine arms would be a
# machinery check (every arm's programs compile and run once: ~5 min more, mostly compiling),
# not a stability result; `--arms=all` adds it with the settings below (1 step, 1 seed, no
# evaluations). On the H200 the gradient measurements are their own command
# (`python -m experiments.gradients --preset h200`).
ABLATION_PRESETS = {
    "smoke": _ablation_preset("smoke", 1, 2),
    "cpu": _ablation_preset("cpu", 2, 2, measure_gradients=True, learning_steps=48, arm_steps=1, arm_eval_every=0,
                            arm_seeds=1, sft_steps=200, arms=()),
    "h200": _ablation_preset("h200", 2, 0),
    **{name: _ablation_preset(name, 2, 0) for name in LONG_BANDS},
}

# ---------------------------------------------------------------------------- serving (experiments.serve)

SERVE_PRESETS = {
    "cpu": ServeConfig(),
    # The h200 warm-up's prompts and answers (RL_PRESETS["h200"]: prompt_len 40, max_new_tokens 72) with
    # room for longer prompts; 64 rows per batch.
    "h200": ServeConfig(checkpoint="runs/h200/sft", engine=EngineConfig(max_batch=64, prompt_buckets=(64, 128),
                                                                          max_new_tokens=128)),
}

# Time to first token of a long streamed answer (experiments.bench_ttft): the smoke warm-up on CPU (it
# answers to its whole budget), and the h200 server's shapes.
SERVE_TTFT_PRESETS = {
    "smoke": TTFTConfig(serve=ServeConfig(checkpoint="runs/smoke/sft",
                                          engine=EngineConfig(max_batch=8, prompt_buckets=(32,), max_new_tokens=48))),
    "h200": TTFTConfig(serve=SERVE_PRESETS["h200"], repeats=10),
}

# ------------------------------------------------------- deployment correlation (experiments.serve_eval)

SERVE_EVAL_PRESETS = {
    # Seconds on CPU: the tiny warm-up, 2 levels x 8 prompts, 2 samples each.
    "smoke": ServeEvalConfig(checkpoint="runs/smoke/sft", task=SMOKE_TASK, per_level=8, samples=2,
                             engine=EngineConfig(max_batch=32, prompt_buckets=(48,), max_new_tokens=48), bootstrap=200,
                             out="runs/smoke/serve_eval"),
    # The cpu warm-up (7 layers) on its RL band (1-2 operations): 2 x 64 prompts, 4 samples each.
    "cpu": ServeEvalConfig(checkpoint="runs/cpu/sft", task=CPU_TASK, per_level=64, samples=4,
                           engine=EngineConfig(max_batch=64, prompt_buckets=(48,), max_new_tokens=48),
                           out="runs/cpu/serve_eval"),
    # The h200 warm-up on every level it was trained on (1-3 operations), 256 prompts each, 4 samples at
    # T=1; plain NVFP4 beside the `full` forward. 256 rows per batch, answers up to 72 tokens (the RL
    # preset's budget).
    "h200": ServeEvalConfig(checkpoint="runs/h200/sft", task=WARMUP_TASK, per_level=256, samples=4,
                            deployments=("bf16", "mxfp8", "nvfp4_online", "nvfp4_online:nvfp4"),
                            engine=EngineConfig(max_batch=256, prompt_buckets=(48,), max_new_tokens=72),
                            out="runs/h200/serve_eval"),
}

# ----------------------------------------------------------- quantization error (experiments.numerics)

NUMERICS_PRESETS = {
    "default": NumericsConfig(),
    "smoke": NumericsConfig(rows=64, cols=256),  # seconds on CPU
}
