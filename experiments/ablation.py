"""The main job: `python -m experiments.ablation [--preset {smoke,cpu,h200}] [--arms a,b] [--seeds N] [--out DIR]`.

Runs (or reuses) the warm-up, every arm of RL.md's ablation matrix with N seeds (the seeds of
an arm in one program), then the stability analysis and the report (report.md + 3 PNGs).
Resumable: rerun the same command after an interruption. Default preset: `cpu`.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import jax

from experiments import rl as rl_experiment
from experiments import sft as sft_experiment
from fp4rl.config_cli import cli
from fp4rl.rl.ablation import AblationConfig, run


def _preset(name: str, seeds: int) -> AblationConfig:
    return AblationConfig(sft=sft_experiment.PRESETS[name], rl=rl_experiment.PRESETS[name], seeds=seeds,
                          out=f"runs/{name}/ablation")


PRESETS = {"smoke": _preset("smoke", 1), "cpu": _preset("cpu", 1), "h200": _preset("h200", 2)}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(AblationConfig, PRESETS, argv)
    # Arms that differ only in their backward mode (nvfp4/+dq, +46/full-hp, +hp/full-46,
    # full/full-dq) lower identical forward programs (sync, sampler, log-probs): a persistent
    # compilation cache compiles those once, and a resumed run recompiles nothing it has seen.
    # JAX_COMPILATION_CACHE_DIR, when set, wins (e.g. one cache shared by an LR sweep's runs).
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(Path(config.out) / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    print(f"devices: {jax.devices()}")
    print(f"arms: {', '.join(config.arms)}; seeds per arm: {config.seeds}; out: {config.out}")
    command = "python -m experiments.ablation " + " ".join(shlex.quote(a) for a in argv)
    result = run(config, commands=(command,))
    print(f"status: {result['status']}")


if __name__ == "__main__":
    main()
