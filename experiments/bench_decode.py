"""Decode throughput of the KV-cache sampler on the GPU, per recipe.

    python -m experiments.bench_decode [--model=h200 --batch=256 --prompt_len=64 --new_tokens=128]
    python -m experiments.bench_decode --recipes=bf16,full --profile=runs/decode_trace   # + where the time goes
    python -m experiments.bench_decode --expert_gemms=xla,mosaic,packed                  # per expert-GEMM backend

Random weights: throughput does not depend on what the model says. A row stops at EOS like in
RL, so tokens/s counts the tokens actually generated (`lengths`), not batch x new_tokens.
Weights are synced once per recipe, as in RL; the timed call is one compiled prefill + decode
loop. `--profile DIR`: one more call per recipe under the JAX profiler (traces in DIR/<recipe>),
summarized per kernel and per decode step (`fp4rl.analysis.trace_summary`) in the markdown.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from experiments.gpu_bench import bench_main
from fp4rl.analysis import trace_summary
from fp4rl.grouped import check_gemm
from fp4rl.model import sampler, sync, transformer
from fp4rl.model.config import ModelConfig
from fp4rl.recipe import PrecisionRecipe


@dataclasses.dataclass(frozen=True)
class DecodeBenchConfig:
    model: str = "h200"
    recipes: tuple[str, ...] = ("bf16", "full", "nvfp4")
    expert_gemms: tuple[str, ...] = ("xla",)  # the routed experts' GEMM backends to compare (`fp4rl.grouped.GEMMS`)
    batch: int = 256
    prompt_len: int = 64
    new_tokens: int = 128
    iters: int = 3
    profile: str = ""  # a directory: profile one more call per recipe there ("" : no profile)
    out: str = "benchmarks"


def run(config: DecodeBenchConfig) -> dict:
    for gemm in config.expert_gemms:
        check_gemm(gemm, auto=True)  # names the valid backends before anything compiles
    rows = []
    for gemm in config.expert_gemms:
        mc = dataclasses.replace(ModelConfig.from_name(config.model), expert_gemm=gemm).resolved()  # rows name the backend
        rows += _rows_of_backend(config, mc)
    return {"device": str(jax.devices()[0].device_kind), "model": config.model, "params": mc.param_count()._asdict(),
            "config": dataclasses.asdict(config), "rows": rows}


def _rows_of_backend(config: DecodeBenchConfig, mc: ModelConfig) -> list[dict]:
    graphdef, params = transformer.init(mc, 0)  # the same weights for every backend (seed 0)
    prompts = jax.random.randint(jax.random.key(1), (config.batch, config.prompt_len), 3, mc.vocab_size)
    scfg = sampler.SamplerConfig(max_new_tokens=config.new_tokens, temperature=1.0, top_p=1.0, eos_id=1, pad_id=0)
    rows = []
    for name in config.recipes:
        recipe = PrecisionRecipe.from_name(name)
        qparams, _ = sync.sync_weights_jit(params, mc, recipe, "reference")
        gen = jax.jit(lambda q, p, k: sampler.generate(graphdef, q, p, recipe, scfg, key=k))
        out = jax.block_until_ready(gen(qparams, prompts, jax.random.key(0)))
        times, tokens = [], []
        for i in range(config.iters):
            t0 = time.perf_counter()
            out = jax.block_until_ready(gen(qparams, prompts, jax.random.key(i + 1)))
            times.append(time.perf_counter() - t0)
            tokens.append(int(np.sum(np.asarray(out.lengths))))
        t = float(np.median(times))
        row = {"recipe": name, "expert_gemm": mc.expert_gemm, "seconds": t, "generated_tokens": int(np.median(tokens)),
               "tok_s": float(np.median(tokens)) / t, "batch": config.batch}
        if config.profile:
            label = f"{name}, expert_gemm={mc.expert_gemm}"
            log_dir = f"{config.profile}/{name}-{mc.expert_gemm}"
            row["trace"] = trace_summary.profile_call(
                gen, (qparams, prompts, jax.random.key(0)), log_dir, steps=config.new_tokens,
                title=f"Where a `{label}` decode call's time goes (the prefill's share included; trace: {log_dir})")
        rows.append(row)
        print(row, flush=True)
    return rows


def to_markdown(result) -> str:
    c = result["config"]
    lines = [f"# Decode throughput, model `{result['model']}` ({result['params']['total'] / 1e6:.1f}M params, "
             f"{result['params']['active'] / 1e6:.1f}M active)", "",
             f"Device: {result['device']}. Command: `python -m experiments.bench_decode`. Batch {c['batch']}, "
             f"prompt {c['prompt_len']}, up to {c['new_tokens']} new tokens, KV cache, one compiled program per recipe. "
             "NVFP4 recipes are emulated on Hopper (bf16 GEMMs on exact dequantized operands + the quantizers).", "",
             "| recipe | expert GEMM | generated tokens | seconds | tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['recipe']} | {r.get('expert_gemm', 'xla')} | {r['generated_tokens']} | {r['seconds']:.3f} | "
              f"{r['tok_s']:.0f} |" for r in result["rows"]]
    lines += ["\n" + r["trace"] for r in result["rows"] if "trace" in r]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    bench_main("bench_decode", DecodeBenchConfig, run, to_markdown, argv)


if __name__ == "__main__":
    main()
