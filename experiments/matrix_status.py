"""Where an RL matrix stands (`fp4rl.analysis.matrix_status`): per arm, the seeds run against the
plan, its learning, stability and cost, and the device runs still to do, read from the committed
metrics.

    python -m experiments.matrix_status results/long_h200/chain/paired [--window=150:300]
        [--reward_cap=0.8@150] [--preset=h200-chain] [--write=STATUS.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4rl.analysis import learning, matrix_status


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(prog="python -m experiments.matrix_status",
                                     description=matrix_status.__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the matrix directory: ARM/seedK/metrics.jsonl")
    parser.add_argument("--window", type=learning.parse_window, default=(150, 300),
                        help="the long-horizon window, START:END (steps; default 150:300)")
    parser.add_argument("--reward_cap", type=learning.parse_reward_cap, default=(0.8, 150),
                        help="CAP@STEP: the early-saturation cap (default 0.8@150)")
    parser.add_argument("--preset", default="h200-chain", help="the preset in the next run's command")
    parser.add_argument("--warmup_sha", default="", help="the warm-up digest the next run's command holds it to")
    parser.add_argument("--gpus", type=int, default=1, choices=(1, 2, 4, 8),
                        help="GPUs of the machine the next call gets: its command holds that many runs (default 1)")
    parser.add_argument("--write", default="", help="also write the status here (markdown)")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        parser.error(f"{args.run_dir} is not a directory")
    text = matrix_status.status_markdown(args.run_dir, args.window, *args.reward_cap, args.preset, args.warmup_sha,
                                         args.gpus)
    if args.write:
        Path(args.write).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
