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

from fp4rl import configs, xla_flags
from fp4rl.config_cli import cli
from fp4rl.rl import sft
from fp4rl.serving.deployment_eval import ServeEvalConfig, run


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(ServeEvalConfig, configs.SERVE_EVAL_PRESETS, argv)
    if not sft.is_finished(config.checkpoint):  # it trains the warm-up: reproducibly (before the backend starts)
        xla_flags.add(xla_flags.DETERMINISTIC_GPU)
    print(f"devices: {jax.devices()}")
    preset = next((name for name, p in configs.SERVE_EVAL_PRESETS.items() if p.checkpoint == config.checkpoint), None)
    if preset is not None:
        sft.ensure_warmup(configs.warmup_config(preset, config.checkpoint), preset)
    print(f"config: {dataclasses.asdict(config)}")
    result = run(config)
    print(result["headline"])
    print(f"report: {config.out}/report.md ({result['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
