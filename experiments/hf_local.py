"""Write a local Hugging Face MoE checkpoint (random weights in the real Qwen3-MoE / Qwen2-MoE formats)
and, with --rows, a DAPO-Math-style data file (`fp4rl.model.hf_local`).

    python -m experiments.hf_local DIR [--size=300m] [--model_type=qwen3_moe] [--rows=FILE --num_rows=N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fp4rl.model import hf_local


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.hf_local",
                                     description=hf_local.__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the checkpoint folder to write")
    parser.add_argument("--size", default="tiny", choices=sorted(hf_local.SIZES))
    parser.add_argument("--model_type", default="qwen3_moe", choices=("qwen3_moe", "qwen2_moe"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", default="", help="also write a DAPO-Math-style file here (.jsonl or .parquet)")
    parser.add_argument("--num_rows", type=int, default=512, help="rows of --rows (answers 4 or 5)")
    args = parser.parse_args(argv)
    directory = hf_local.write_checkpoint(Path(args.directory), args.model_type, args.seed, size=args.size)
    with open(directory / "config.json") as f:
        print(f"wrote {directory} ({args.model_type}, {args.size}: {json.load(f)['num_hidden_layers']} layers)")
    if args.rows:
        rows = hf_local.write_rows(Path(args.rows), hf_local.arithmetic_rows(args.num_rows, args.seed))
        print(f"wrote {rows} ({args.num_rows} rows)")


if __name__ == "__main__":
    main()
