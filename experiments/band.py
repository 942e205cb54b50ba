"""Which warm-up starts RL inside its difficulty band (`fp4rl.analysis.band`, `BAND_RULE`): the
table of the candidates' band accuracies, then the directories inside the band.

    python -m experiments.band runs/h200-long-x4/sft runs/h200-chain/sft --table=band.md
    # prints the table, then the directories inside the band one per line; exit status 1 if none is
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4rl.analysis import band


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.band", description=band.__doc__.split("\n")[0])
    parser.add_argument("warmups", nargs="+", help="finished warm-up directories")
    parser.add_argument("--table", default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    finished = [d for d in args.warmups if (Path(d) / "sft_meta.json").is_file()]
    for d in sorted(set(args.warmups) - set(finished)):
        print(f"warning: {d} holds no finished warm-up (no sft_meta.json); left out", file=sys.stderr)
    if not finished:
        sys.exit("error: none of the warm-ups finished")
    accuracies = {d: band.band_accuracy(d) for d in finished}
    chosen = band.inside(accuracies)
    text = band.table_markdown(accuracies, chosen)
    print(text, file=sys.stderr)
    if args.table:
        Path(args.table).write_text(text)
    print("\n".join(chosen))
    if not chosen:
        sys.exit(1)


if __name__ == "__main__":
    main()
