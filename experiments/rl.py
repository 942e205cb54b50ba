"""DAPO RL of one arm: `python -m experiments.rl --preset {smoke,cpu,h200} --arm NAME --seeds N`.

Runs (or reuses) the BF16 warm-up of the same --preset into --init first, then the arm's seeds in
one program. Rerunning the same command resumes an interrupted run; rerunning it with other
settings is refused unless `--resume=force` (`fp4rl.rl.resume`). Progress goes to
<out>/<arm>/train.log too.
"""

from __future__ import annotations

import sys

import jax

from fp4rl import configs, xla_flags
from fp4rl.config_cli import cli, preset_of
from fp4rl.rl import sft, trainer
from fp4rl.rl.run_dir import prepare_out


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = cli(trainer.RLConfig, configs.RL_PRESETS, argv)
    if not sft.is_finished(config.init):  # it trains the warm-up: reproducibly (before the backend starts)
        xla_flags.add(xla_flags.DETERMINISTIC_GPU)
    print(f"devices: {jax.devices()}")
    prepare_out(config.out)  # before the warm-up trains, not after
    preset = preset_of(argv)
    sft.ensure_warmup(configs.warmup_config(preset, config.init), preset)
    history = trainer.train(config)
    last = [h[-1] for h in history if h]
    for seed, record in enumerate(last):
        print(f"seed {seed}: step {record['step']} reward {record['reward/mean']:.3f} grad_norm {record['grad_norm/global']:.3g}")
    print(f"metrics: {trainer.arm_dir(config)}/seed*/metrics.jsonl")


if __name__ == "__main__":
    main()
