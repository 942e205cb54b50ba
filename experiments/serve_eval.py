"""Deployment correlation: `python -m experiments.serve_eval [--preset {smoke,cpu,h200}] [--checkpoint DIR]`.

Serves one trained checkpoint as bf16, mxfp8 (the FP8 deployment) and nvfp4_online (quantized at load
time with the trainer's weight sync), answers the same held-out RL-task prompts (single turn and a
follow-up that feeds the first answer back) and reports how the deployments' per-prompt scores
correlate (Pearson and Spearman with bootstrap CIs), each one's accuracy with a CI and its tokens/s:
serve_eval.json, report.md and serve_eval.png under --out (fp4rl/serving/deployment_eval.py).
The default checkpoint is the preset's warm-up, trained first when missing. Default preset: `cpu`.
Rerunning the same command reuses the deployments it finished (<out>/deployments/).
"""

from __future__ import annotations

import dataclasses
import sys

import jax

from experiments import rl as rl_experiment
from experiments import sft as sft_experiment
from fp4rl import xla_flags
from fp4rl.config_cli import cli
from fp4rl.rl import sft
from fp4rl.serving.deployment_eval import ServeEvalConfig, run
from fp4rl.serving.engine import EngineConfig

PRESETS = {
    # Seconds on CPU: the tiny warm-up, 2 levels x 8 prompts, 2 samples each.
    "smoke": ServeEvalConfig(checkpoint="runs/smoke/sft", task=sft_experiment.SMOKE_TASK, per_level=8, samples=2,
                             engine=EngineConfig(max_batch=32, prompt_buckets=(48,), max_new_tokens=48), bootstrap=200,
                             out="runs/smoke/serve_eval"),
    # The cpu warm-up (7 layers) on its RL band (1-2 operations): 2 x 64 prompts, 4 samples each.
    "cpu": ServeEvalConfig(checkpoint="runs/cpu/sft", task=sft_experiment.CPU_TASK, per_level=64, samples=4,
                           engine=EngineConfig(max_batch=64, prompt_buckets=(48,), max_new_tokens=48),
                           out="runs/cpu/serve_eval"),
    # The h200 warm-up on every level it was trained on (1-3 operations), 256 prompts each, 4 samples at
    # T=1; plain NVFP4 beside the `full` forward. 256 rows per batch, answers up to 72 tokens (the RL
    # preset's budget).
    "h200": ServeEvalConfig(checkpoint="runs/h200/sft", task=sft_experiment.WARMUP_TASK, per_level=256, samples=4,
                            deployments=("bf16", "mxfp8", "nvfp4_online", "nvfp4_online:nvfp4"),
                            engine=EngineConfig(max_batch=256, prompt_buckets=(48,), max_new_tokens=72),
                            out="runs/h200/serve_eval"),
}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv) and not {"-h", "--help"} & set(argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(ServeEvalConfig, PRESETS, argv)
    if not sft.is_finished(config.checkpoint):  # it trains the warm-up: reproducibly (before the backend starts)
        xla_flags.add(xla_flags.DETERMINISTIC_GPU)
    print(f"devices: {jax.devices()}")
    preset = next((name for name, p in PRESETS.items() if p.checkpoint == config.checkpoint), None)
    if preset is not None:
        rl_experiment.ensure_warmup(preset, config.checkpoint)
    print(f"config: {dataclasses.asdict(config)}")
    result = run(config)
    print(result["headline"])
    print(f"report: {config.out}/report.md ({result['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
