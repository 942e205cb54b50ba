"""DAPO RL of one arm: `python -m experiments.rl --preset {smoke,cpu,h200,...} --arm NAME --seeds N`.

Runs (or reuses) the BF16 warm-up of the same --preset into --init first, then the arm's seeds in
one program. From a Hugging Face Qwen-MoE checkpoint instead (no warm-up: the checkpoint is the
initial policy; its tokenizer, chat template and stop tokens are used), on DAPO-Math-17k rows:

    python -m experiments.rl --preset hf --model.hf=DIR --rl.data_file=FILE [--mesh.data=N --mesh.expert=M]
        [--rl.eval_every=N --rl.eval_file=HELD_OUT_FILE]

Every setting is spelled `--key` or `--rl.key`. Rerunning the same command resumes an interrupted
run; rerunning it with other settings is refused unless `--resume=force` (`fp4rl.rl.resume`).
Progress goes to <out>/<arm>/train.log too.
"""

from __future__ import annotations

import sys

import jax

from fp4rl import configs, xla_flags
from fp4rl.config_cli import cli, preset_of
from fp4rl.formats import stochastic
from fp4rl.rl import rl_config, run_inputs, sft, trainer
from fp4rl.rl.run_dir import prepare_out


def _fail(err: Exception):
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(2) from None


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = cli(trainer.RLConfig, configs.RL_PRESETS, argv, root="rl")
    stochastic.lower_draws_as_gpu_kernel()
    try:
        rl_config.check_source(config)
    except ValueError as err:
        _fail(err)
    from_checkpoint = bool(config.model.hf)  # the checkpoint is the initial policy: no warm-up to train
    if not from_checkpoint and not sft.is_finished(config.init):  # it trains the warm-up: reproducibly (before the backend starts)
        xla_flags.add(xla_flags.DETERMINISTIC_GPU)
    print(f"devices: {jax.devices()}")
    prepare_out(config.out)  # before the warm-up trains, not after
    if not from_checkpoint:
        preset = preset_of(argv)
        sft.ensure_warmup(configs.warmup_config(preset, config.init), preset)
    try:
        inputs = run_inputs.load(config)
    except run_inputs.InputError as err:
        _fail(err)
    for path, rows in ((config.data_file, inputs.rows), (config.eval_file, inputs.eval_rows)):
        if rows is not None:
            print(f"{path}: {len(rows.prompts)} of {rows.num_read} rows usable (dropped: {run_inputs.dropped_summary(rows)})")
    history = trainer.train(config, inputs=inputs)
    last = [h[-1] for h in history if h]
    for seed, record in enumerate(last):
        print(f"seed {seed}: step {record['step']} reward {record['reward/mean']:.3f} grad_norm {record['grad_norm/global']:.3g}")
    print(f"metrics: {trainer.arm_dir(config)}/seed*/metrics.jsonl")


if __name__ == "__main__":
    main()
