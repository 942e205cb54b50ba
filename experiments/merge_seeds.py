"""More seeds for finished arms: merge the seed directories of one ablation run into another
(`fp4rl.rl.merge_seeds`, whose docstring says what must match; a refused merge leaves DST as it was).

    python -m experiments.merge_seeds SRC DST [--arms a,b] [--warmup_sha256 DIGEST]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fp4rl.rl import merge_seeds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.merge_seeds",
                                     description=merge_seeds.__doc__.split("\n\n")[0])
    parser.add_argument("src", help="the ablation run directory with the new seeds")
    parser.add_argument("dst", help="the ablation run directory they join")
    parser.add_argument("--arms", default="", help="comma-separated arms (default: every finished arm of SRC)")
    parser.add_argument("--warmup_sha256", default="", help="the warm-up digest the runs' calls checked: lets `init` "
                        "differ for records without their own warmup_sha256")
    args = parser.parse_args(argv)
    for path in (args.src, args.dst):
        if not Path(path).is_dir():
            parser.error(f"{path} is not a directory")
    added = merge_seeds.merge(args.src, args.dst, [a for a in args.arms.split(",") if a] or None, args.warmup_sha256)
    for arm, seeds in added.items():
        print(f"{arm}: seeds {seeds} -> {Path(args.dst) / arm}")


if __name__ == "__main__":
    main()
