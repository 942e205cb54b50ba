"""Write a model imported from a Hugging Face Qwen-MoE folder (or an RL run of one) back as such a
folder: safetensors shards and their index (`fp4rl.model.hf_export`).

    python -m experiments.hf_export MODEL HF_SOURCE OUT
"""

from __future__ import annotations

import argparse

from fp4rl.model import hf_export
from fp4rl.serving import checkpoints


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.hf_export", description=hf_export.__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="the model to export: a Hugging Face folder, or a run directory "
                                           "(`fp4rl.serving.checkpoints`) of a model imported from SOURCE")
    parser.add_argument("source", help="the Hugging Face folder the model was imported from (its config.json)")
    parser.add_argument("out", help="a new folder")
    parser.add_argument("--seed_index", type=int, default=0, help="which seed of an RL run (default 0)")
    parser.add_argument("--shard_bytes", type=int, default=hf_export.SHARD_BYTES, help="the largest safetensors file")
    args = parser.parse_args(argv)
    model = checkpoints.load(args.checkpoint, args.seed_index)
    files = hf_export.save_pretrained(args.out, model.graphdef, model.params, args.source, args.shard_bytes)
    print(f"{model.path} -> {args.out}: {', '.join(files)}")


if __name__ == "__main__":
    main()
