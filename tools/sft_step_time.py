"""Warm-up (SFT) step time: where a BF16 training step's time goes on the device.

    python tools/sft_step_time.py --preset h200-long --gemm packed --steps 20 [--batch_size 256] [--profile DIR]
    XLA_FLAGS=--xla_gpu_deterministic_ops=true python tools/sft_step_time.py ...   (as the warm-ups run)

Builds the preset's warm-up step (`fp4rl.rl.sft.build`) on the expert-GEMM backend `--gemm`, runs it
once (compiling), then times `--steps` steps on batches drawn ahead (host data work excluded), with
one device sync at the end, and prints one JSON line: seconds per step, sequences and tokens per
second. `--profile DIR` traces 3 more steps and prints the per-kernel summary
(`fp4rl.analysis.trace_summary`). XLA reads XLA_FLAGS at start: one process per flag setting.
Times from a CPU are not performance numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp4rl import configs  # noqa: E402
from fp4rl.analysis import trace_summary  # noqa: E402
from fp4rl.rl import sft  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="h200-long", choices=sorted(configs.SFT_PRESETS))
    parser.add_argument("--gemm", default=None, help="expert-GEMM backend (default: the platform's `auto`)")
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profile", default=None, help="trace 3 steps into this directory and summarize them")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps={args.steps} must be >= 1")
    config = configs.SFT_PRESETS[args.preset]
    if args.batch_size is not None:
        config = dataclasses.replace(config, batch_size=args.batch_size)
    mc, _, params, opt_state, step, batches, mesh = sft.build(config, args.gemm)
    ahead = [sft.device_batch(next(batches), mesh) for _ in range(args.steps + 1)]
    t0 = time.perf_counter()
    params, opt_state, loss, _ = step(params, opt_state, ahead[0])
    float(loss)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for batch in ahead[1:]:
        params, opt_state, loss, _ = step(params, opt_state, batch)
    float(loss)
    per_step = (time.perf_counter() - t0) / args.steps
    tokens = config.batch_size * config.max_len
    print(json.dumps({"preset": args.preset, "gemm": mc.expert_gemm, "batch_size": config.batch_size,
                      "max_len": config.max_len, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                      "device": str(jax.devices()[0]), "first_step_s": round(first, 2),
                      "step_s": round(per_step, 4), "sequences_per_s": round(config.batch_size / per_step, 1),
                      "tokens_per_s": round(tokens / per_step), "loss": float(loss)}))
    if args.profile:
        with jax.profiler.trace(args.profile, create_perfetto_trace=True):
            for batch in ahead[1:4]:
                params, opt_state, loss, _ = step(params, opt_state, batch)
            float(loss)
        device = "/host:" if jax.default_backend() == "cpu" else "/device:"  # a CPU trace has no device process
        summary = trace_summary.summarize(trace_summary.find_trace(args.profile), process_prefix=device)
        print(trace_summary.markdown(summary, steps=3))


if __name__ == "__main__":
    main()
