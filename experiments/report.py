"""Rewrite a run directory's ablation report from its metrics (`fp4rl.analysis.report`), with the
settings its runs' config.json record (`fp4rl.rl.run_settings`) and the commands that produced them.

    python -m experiments.report RUN_DIR [--command CMD ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fp4rl.analysis.report import write_report
from fp4rl.rl.run_settings import settings_text


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m experiments.report RUN_DIR [--command CMD ...]`: rewrite a run directory's
    report from its metrics (e.g. after arms of several device calls were gathered into it), with
    the settings its runs' config.json record and the commands that produced them."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report", description=main.__doc__)
    parser.add_argument("run_dir", help="an ablation run directory: <arm>/seed<k>/metrics.jsonl")
    parser.add_argument("--command", action="append", default=[], help="a command that produced the runs (repeatable)")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        parser.error(f"{args.run_dir} is not a directory")
    paths = write_report(args.run_dir, config_text=settings_text(Path(args.run_dir)), commands=args.command)
    print(f"[report] {paths.report_md}")


if __name__ == "__main__":
    main()
