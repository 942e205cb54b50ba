"""Does RL learn? One arm's held-out accuracy over its steps with the decision rule applied
(`fp4rl.analysis.learning`), and with `--window` the long-horizon bar; writes ARM_DIR/learning.md
and learning.png.

    python -m experiments.learning runs/h200/rl/bf16      # prints the table, writes learning.md/png
    python -m experiments.learning runs/h200-long/rl/bf16 --window=150:300 --reward_cap=0.8@150
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4rl.analysis import learning


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.learning", description=learning.__doc__.split("\n")[0])
    parser.add_argument("arm_dir", help="a directory holding seed*/metrics.jsonl")
    parser.add_argument("--window", type=learning.parse_window,
                        help="START:END: also judge the long-horizon bar on this window")
    parser.add_argument("--reward_cap", type=learning.parse_reward_cap, default=(0.8, 150),
                        help="CAP@STEP for the long-horizon bar (default 0.8@150)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    result = learning.summarize(args.arm_dir)
    text = learning.markdown(result)
    if args.window is not None:
        text += "\n" + learning.window_markdown(learning.long_horizon_bar(args.arm_dir, args.window, *args.reward_cap))
    (Path(args.arm_dir) / "learning.md").write_text(text)
    learning.plot(result, Path(args.arm_dir) / "learning.png")
    print(text)


if __name__ == "__main__":
    main()
