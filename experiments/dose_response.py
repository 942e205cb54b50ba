"""The dose-response of the forward/backward mismatch (`fp4rl.analysis.dose_response`): per
amplification a and backward, the arm's spikes and reward against BF16, and the smallest a at which
each backward first fails.

    python -m experiments.dose_response RUN_DIR   # writes RUN_DIR/dose_response.md and .png
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fp4rl.analysis import dose_response


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.dose_response",
                                     description=dose_response.__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a matrix directory holding bf16 and the nvfp4@A / +dq@A arms")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        parser.error(f"{args.run_dir} is not a directory")
    try:
        table, figure = dose_response.write(args.run_dir)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    print(table.read_text())
    print(f"[dose_response] {table}, {figure}")


if __name__ == "__main__":
    main()
