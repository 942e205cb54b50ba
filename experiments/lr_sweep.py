"""docs/rl.md "Learning-rate pilot", step one: print the run directory of the largest learning rate at
which the BF16 arm is stable (`fp4rl.analysis.lr_sweep`); every run's row goes to stderr.

    python -m experiments.lr_sweep runs/pilot/lr1e-4 runs/pilot/lr3e-4   # prints the chosen run dir
"""

from __future__ import annotations

import argparse
import sys

from fp4rl.analysis import lr_sweep

USAGE = "python -m experiments.lr_sweep RUN_DIR [RUN_DIR ...]  (names ending in lr<value>)"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.lr_sweep", usage=USAGE,
                                     description=lr_sweep.__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="*",
                        help="ablation runs (<dir>/bf16/seed<k>/metrics.jsonl), names ending in lr<value>")
    dirs = parser.parse_args(sys.argv[1:] if argv is None else list(argv)).run_dirs
    if not dirs:
        raise SystemExit(f"usage: {USAGE}")
    chosen, rows = lr_sweep.largest_stable_lr(dirs)
    for row in rows:
        print(row, file=sys.stderr)
    if chosen is None:
        raise SystemExit("no learning rate gave a stable bf16 arm")
    print(chosen["dir"])


if __name__ == "__main__":
    main()
