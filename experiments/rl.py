"""DAPO RL of one arm: `python -m experiments.rl --preset {smoke,cpu,h200} --arm NAME --seeds N`.

Runs (or reuses) the BF16 warm-up of the same --preset into --init first, then the arm's seeds in
one program. Rerunning the same command resumes an interrupted run; rerunning it with other
settings is refused unless `--resume=force` (`fp4rl.rl.resume`). Progress goes to
<out>/<arm>/train.log too.
"""

from __future__ import annotations

import dataclasses
import sys

import jax

from experiments import sft as sft_experiment
from fp4rl import xla_flags
from fp4rl.config_cli import cli, preset_of
from fp4rl.rl import sft, trainer
from fp4rl.rl.run_dir import prepare_out

PRESETS = {
    "smoke": trainer.RLConfig(steps=2, task=sft_experiment.SMOKE_TASK, group_size=4, prompts_per_step=2, max_gen_batches=2,
                              mini_batches=2, max_new_tokens=48, overlong_buffer=8, prompt_len=32, eval_every=2, eval_prompts=8,
                              init="runs/smoke/sft", out="runs/smoke/rl"),
    "cpu": trainer.RLConfig(steps=12, task=sft_experiment.CPU_TASK, group_size=8, prompts_per_step=8, mini_batches=2,
                            max_new_tokens=48, overlong_buffer=4, prompt_len=32, eval_every=6, eval_prompts=128,
                            optim=trainer.OptimConfig(lr=1e-4, warmup_steps=2), init="runs/cpu/sft", out="runs/cpu/rl"),
    "h200": trainer.RLConfig(steps=100, task=sft_experiment.RL_TASK, group_size=8, prompts_per_step=32,
                             max_gen_batches=3, mini_batches=2, max_new_tokens=72, overlong_buffer=8, prompt_len=40,
                             optim=trainer.OptimConfig(lr=3e-5, warmup_steps=3), eval_every=20, eval_prompts=512,
                             checkpoint_every=50, init="runs/h200/sft", out="runs/h200/rl"),
}


def warmup_config(preset: str | None, init: str) -> sft.SFTConfig:
    """The warm-up `--preset NAME` trains into `init` when none is there: experiments.sft's preset
    of the same name (no --preset: SFTConfig's defaults, as the RL settings are then RLConfig's)."""
    return dataclasses.replace(sft.SFTConfig() if preset is None else sft_experiment.PRESETS[preset], out=init)


def ensure_warmup(preset: str | None, init: str) -> None:
    """Run the warm-up of `preset` into `init` unless one is already there (then it is used as given)."""
    if sft.is_finished(init):
        print(f"reusing warm-up checkpoint {init}")
        return
    print(f"no warm-up at {init}: running experiments.sft {'--preset ' + preset if preset else '(defaults)'} --out={init}")
    sft.train(warmup_config(preset, init))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = cli(trainer.RLConfig, PRESETS, argv)
    if not sft.is_finished(config.init):  # it trains the warm-up: reproducibly (before the backend starts)
        xla_flags.add(xla_flags.DETERMINISTIC_GPU)
    print(f"devices: {jax.devices()}")
    prepare_out(config.out)  # before the warm-up trains, not after
    ensure_warmup(preset_of(argv), config.init)
    history = trainer.train(config)
    last = [h[-1] for h in history if h]
    for seed, record in enumerate(last):
        print(f"seed {seed}: step {record['step']} reward {record['reward/mean']:.3f} grad_norm {record['grad_norm/global']:.3g}")
    print(f"metrics: {trainer.arm_dir(config)}/seed*/metrics.jsonl")


if __name__ == "__main__":
    main()
