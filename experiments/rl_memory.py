"""Memory per device of RL on a Qwen3-MoE model (`fp4rl.analysis.rl_memory`), at the `hf` preset's
settings unless told otherwise: the table of docs/parallel.md ("Memory per device").

    python -m experiments.rl_memory [--hf_config=config.json] [--meshes=1x1,1x8] ...
"""

from __future__ import annotations

import argparse
import json

from fp4rl import configs
from fp4rl.analysis import rl_memory
from fp4rl.model.hf import config_from_hf


def _true_or_false(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{value!r}: valid options: true, false")
    return value.lower() == "true"


def main(argv=None) -> None:
    preset = configs.RL_PRESETS["hf"]
    parser = argparse.ArgumentParser(prog="python -m experiments.rl_memory", description=rl_memory.__doc__.split("\n")[0])
    parser.add_argument("--seq_len", type=int, default=preset.prompt_len + preset.max_new_tokens)
    parser.add_argument("--prompts", type=int, default=preset.prompts_per_step)
    parser.add_argument("--group_size", type=int, default=preset.group_size)
    parser.add_argument("--mini_batches", type=int, default=preset.mini_batches)
    parser.add_argument("--micro_rows", type=int, default=1, help="rows per device per micro-batch of the update")
    parser.add_argument("--query_chunk", type=int, default=preset.memory.attention_query_chunk or 1024,
                        help="queries per attention chunk (0: all at once)")
    parser.add_argument("--logit_chunk", type=int, default=preset.memory.logit_chunk,
                        help="positions per LM-head chunk (0: all at once)")
    parser.add_argument("--generation_chunks", type=int, default=preset.generation_chunks,
                        help="sampler calls per generation batch")
    parser.add_argument("--reference_logprobs", type=_true_or_false,
                        default=preset.reference_logprobs,
                        help="true: the initial weights stay on the devices for the reference log-probs")
    parser.add_argument("--hf_config", default="", help="a Hugging Face config.json in place of Qwen3-30B-A3B's")
    parser.add_argument("--meshes", default=",".join(f"{d}x{e}" for d, e in rl_memory.MESHES),
                        help="data x expert meshes, e.g. 1x1,1x8")
    args = parser.parse_args(argv)
    try:
        meshes = tuple(tuple(int(n) for n in mesh.split("x")) for mesh in args.meshes.split(","))
    except ValueError:
        meshes = ()
    if not meshes or any(len(mesh) != 2 or min(mesh) < 1 for mesh in meshes):
        parser.error(f"--meshes={args.meshes!r}: a comma-separated list of DATAxEXPERT, e.g. 1x1,1x8")
    mc, name = rl_memory.qwen3_30b_a3b(), "Qwen3-30B-A3B"
    if args.hf_config:
        with open(args.hf_config) as f:
            mc, name = config_from_hf(json.load(f), dtype="bfloat16"), args.hf_config
    print(rl_memory.table(mc, args.seq_len, args.prompts, args.group_size, args.mini_batches, args.micro_rows,
                args.query_chunk, args.logit_chunk, args.generation_chunks, name, meshes, args.reference_logprobs), end="")


if __name__ == "__main__":
    main()
