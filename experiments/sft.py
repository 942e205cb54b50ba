"""BF16 warm-up: `python -m experiments.sft --preset {smoke,cpu,h200} [--dotted.overrides]`."""

from __future__ import annotations

import dataclasses

import jax

from fp4rl.config_cli import cli
from fp4rl.rl import evaluation, sft
from fp4rl.rl.task import TaskConfig

# Short problems keep CPU runs fast: one-digit literals and two operands per step (smoke),
# two-digit literals (cpu). The RL band is the harder end of the warm-up mix (RL.md).
SMOKE_TASK = TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2)
CPU_RL_TASK = TaskConfig(min_ops=2, max_ops=3, max_operands=2)

PRESETS = {
    "smoke": sft.SFTConfig(model="tiny", task=SMOKE_TASK, eval_task=SMOKE_TASK, steps=20, warmup_steps=5, batch_size=8,
                           max_len=80, eval_problems=4, max_new_tokens=48, out="runs/smoke/sft"),
    "cpu": sft.SFTConfig(model="tiny", task=TaskConfig(min_ops=1, max_ops=3, max_operands=2), eval_task=CPU_RL_TASK,
                         steps=400, warmup_steps=40, batch_size=32, max_len=112, eval_problems=32, max_new_tokens=72,
                         out="runs/cpu/sft"),
    "h200": sft.SFTConfig(model="h200", task=TaskConfig(min_ops=1, max_ops=3, max_operands=2), eval_task=CPU_RL_TASK,
                          steps=500, batch_size=128, max_len=112, lr=1e-3, warmup_steps=50, eval_problems=128,
                          max_new_tokens=72, out="runs/h200/sft"),
}


def main(argv=None) -> None:
    config = cli(sft.SFTConfig, PRESETS, argv)
    print(f"devices: {jax.devices()}")
    print(f"config: {dataclasses.asdict(config)}")
    meta = sft.train(config)
    print(f"params: {meta['param_count']}, trained in {meta['train_seconds']:.1f}s")
    print(evaluation.accuracy_table_markdown(meta["accuracy"]))
    print(f"checkpoint: {sft.checkpoint_dir(config.out)}")


if __name__ == "__main__":
    main()
