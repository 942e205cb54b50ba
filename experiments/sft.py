"""BF16 warm-up: `python -m experiments.sft --preset {smoke,cpu,h200} [--dotted.overrides]`."""

from __future__ import annotations

import dataclasses

import jax

from fp4rl import xla_flags
from fp4rl.config_cli import cli
from fp4rl.rl import evaluation, sft
from fp4rl.rl.task import TaskConfig

# The RL band (docs/rl.md's difficulty knobs): two or three operations on one-digit literals, two
# operands per step; the warm-up trains on one to three. Short problems keep CPU runs fast and let
# a short warm-up get the scratchpad mostly right.
SMOKE_TASK = TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2)
WARMUP_TASK = TaskConfig(min_ops=1, max_ops=3, digits=1, max_operands=2)
RL_TASK = TaskConfig(min_ops=2, max_ops=3, digits=1, max_operands=2)
# CPU scale: one or two operations, for the warm-up and the RL band alike.
CPU_TASK = TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2)
# The noisy teacher (`task.noisy_solution`): half of the training solutions box a wrong answer, so
# the warm-up samples the right answer about half as often as its scratchpad gets it right, and RL
# has something to learn.
ANSWER_NOISE = 0.5

PRESETS = {
    "smoke": sft.SFTConfig(model="tiny", task=SMOKE_TASK, eval_task=SMOKE_TASK, steps=20, warmup_steps=5, batch_size=8,
                           max_len=80, eval_problems=4, max_new_tokens=48, out="runs/smoke/sft"),
    "cpu": sft.SFTConfig(model="cpu", task=CPU_TASK, eval_task=CPU_TASK, steps=300, warmup_steps=30, batch_size=64,
                         max_len=80, lr=5e-3, eval_problems=64, max_new_tokens=48, answer_noise=ANSWER_NOISE,
                         out="runs/cpu/sft"),
    "h200": sft.SFTConfig(model="h200", task=WARMUP_TASK, eval_task=RL_TASK, steps=400, batch_size=128, max_len=112,
                          lr=1e-3, warmup_steps=40, eval_problems=512, max_new_tokens=72, answer_noise=ANSWER_NOISE,
                          out="runs/h200/sft"),
}


def main(argv=None) -> None:
    config = cli(sft.SFTConfig, PRESETS, argv)
    xla_flags.add(xla_flags.DETERMINISTIC_GPU)  # before the first jax.devices() starts the backend
    print(f"devices: {jax.devices()}")
    print(f"config: {dataclasses.asdict(config)}")
    meta = sft.train(config)
    print(f"params: {meta['param_count']}, trained in {meta['train_seconds']:.1f}s")
    print(evaluation.accuracy_table_markdown(meta["accuracy"]))
    print(f"checkpoint: {sft.checkpoint_dir(config.out)}")


if __name__ == "__main__":
    main()
