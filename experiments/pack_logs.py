"""Gzip the per-seed JSONL logs of run directories in place (`fp4rl.analysis.pack_logs`), so
committed results stay small; pack only finished runs.

    python -m experiments.pack_logs results/long_h200/chain/matrix
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fp4rl.analysis import pack_logs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.pack_logs",
                                     description=pack_logs.__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="run directories (every seed<k>/ log below them is packed)")
    args = parser.parse_args(argv)
    for root in args.run_dirs:
        if not Path(root).is_dir():
            parser.error(f"{root} is not a directory")
    for root in args.run_dirs:
        before = sum(p.stat().st_size for p in pack_logs.plain_logs(root))
        packed = pack_logs.pack_tree(root)
        after = sum(p.stat().st_size for p in packed)
        print(f"{root}: {len(packed)} log(s) packed, {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
