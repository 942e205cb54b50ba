"""The model-size ladder: `python -m experiments.scaling plan` and `python -m experiments.scaling fit`.

plan: per rung of `fp4rl.configs.SCALING_LADDER` (or --ladder=A,B,...): parameters (total, active),
  FLOPs per token, the layers selective precision keeps in BF16, and the estimated peak memory and
  time of its warm-up and gradient measurement (`fp4rl.analysis.scaling_plan`); writes
  <out>/plan.md and plan.json.
fit: reads the scaling point every rung's gradient measurement wrote (runs/RUNG/gradients, or
  --points=DIR,DIR,...), fits the rule's quantities against depth and width with tokens per update
  entering exactly, checks the fit on the largest rung, extrapolates to the paper's setting
  (--paper.num_layers, --paper.d_model, --paper.tokens_per_update) and says where the rule flips
  (`fp4rl.analysis.scaling`); writes <out>/report.md, scaling_fit.json and scaling_fit.png.

A rung is measured with `python -m experiments.gradients --preset RUNG` (its warm-up is trained first).
"""

from __future__ import annotations

import dataclasses
import sys

from fp4rl import configs
from fp4rl.analysis import scaling, scaling_plan
from fp4rl.config_cli import cli

COMMANDS = ("plan", "fit")


def main(argv=None) -> dict | list:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        cli(scaling.ScalingConfig, None, ["--help"])  # the options, then exits
    commands = [a for a in argv if a.lstrip("-") in COMMANDS]  # `plan` or `--plan`
    if len(commands) != 1:
        raise SystemExit(f"usage: python -m experiments.scaling {{{','.join(COMMANDS)}}} [--option=value ...]; "
                         f"got {argv or 'no command'} (valid commands: {', '.join(COMMANDS)})")
    command = commands[0].lstrip("-")
    config = cli(scaling.ScalingConfig, None, [a for a in argv if a is not commands[0]])
    ladder = config.ladder or configs.SCALING_LADDER
    if command == "plan":
        rows = scaling_plan.plan(ladder, configs.SFT_PRESETS, configs.GRADIENTS_PRESETS)
        paths = scaling_plan.write_plan(rows, config.out)
        print(paths["report"].read_text())
        print(f"wrote {paths['report']} and {paths['json']}")
        return rows
    unknown = [n for n in ladder if n not in configs.GRADIENTS_PRESETS]
    if unknown and not config.points:
        raise SystemExit(f"unknown rungs {unknown}; valid gradient presets: {', '.join(configs.GRADIENTS_PRESETS)}")
    directories = config.points or tuple(configs.GRADIENTS_PRESETS[n].out for n in ladder)
    results = scaling.run(dataclasses.replace(config, ladder=tuple(ladder)), directories)
    print(f"report: {config.out}/{scaling.REPORT_FILE}")
    return results


if __name__ == "__main__":
    main()
