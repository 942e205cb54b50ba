"""BF16 warm-up: `python -m experiments.sft --preset {smoke,cpu,h200} [--dotted.overrides]`."""

from __future__ import annotations

import dataclasses

import jax

from fp4rl import configs, xla_flags
from fp4rl.config_cli import cli
from fp4rl.rl import evaluation, sft


def main(argv=None) -> None:
    config = cli(sft.SFTConfig, configs.SFT_PRESETS, argv)
    xla_flags.add(xla_flags.DETERMINISTIC_GPU)  # before the first jax.devices() starts the backend
    print(f"devices: {jax.devices()}")
    print(f"config: {dataclasses.asdict(config)}")
    meta = sft.train(config)
    steps = (f" (first step {meta['first_step_seconds']:.1f}s, then {meta['seconds_per_step']:.3f}s per step)"
             if "seconds_per_step" in meta else "")  # a warm-up recorded before these were
    print(f"params: {meta['param_count']}, trained in {meta['train_seconds']:.1f}s{steps}")
    print(evaluation.accuracy_table_markdown(meta["accuracy"]))
    print(f"checkpoint: {sft.checkpoint_dir(config.out)}")


if __name__ == "__main__":
    main()
