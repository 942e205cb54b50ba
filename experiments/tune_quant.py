"""Launch-shape sweep of the Triton quantize kernel on the GPU (which tunables are fastest).

    python -m experiments.tune_quant [--iters=10] [--out=benchmarks]

For each activation shape (bf16, per-token amax; `pallas_kernels.nvfp4_quant.shapes`) and
variant, every candidate `TritonQuantTunables` is checked byte for byte against the CPU reference
and timed on the model's layout (`bench_quant.quantizer`); the expert stack (16x16 blocks) sweeps
`rows_2d`, `block_k_2d` and `num_warps`. Writes `<out>/tune_quant.{json,md}`: ms and % of the copy bandwidth
per candidate, best marked. The kernel's default tunables are chosen from this table.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from experiments.bench_quant import VARIANTS, check_then_time, copy_bandwidth, cpu_reference, quantizer
from experiments.gpu_bench import bench_main
from fp4rl.analysis import trace_summary
from fp4rl.formats import nvfp4
from pallas_kernels.nvfp4_quant import shapes
from pallas_kernels.nvfp4_quant.tunables import TritonQuantTunables

# (rows_1d, block_k, num_warps, prefetch, row_groups) of the planar kernel: K in chunks, two
# passes over each row (the default shape and the fastest shapes of a wider sweep), and a whole row
# per chunk (K <= 8192: one HBM read, the amax from registers), one row group per program or
# several (the next group's loads issued while a group is processed), 1-2 rows, 4-8 warps.
ACT_CANDIDATES = ((4, 512, 4, True, 1), (2, 1024, 4, True, 1), (1, 2048, 4, True, 1),
                  (1, 8192, 8, True, 1), (1, 8192, 8, True, 4), (1, 8192, 8, True, 16),
                  (1, 8192, 8, False, 4), (1, 8192, 4, True, 4), (2, 8192, 8, True, 4))
# (rows_2d, block_k_2d, num_warps, prefetch) of the expert stack read K-major: one or several 16-row
# tile rows per program (contiguous runs of rows_2d elements per K row), K in chunks of block_k_2d,
# the next chunk loaded before the current one is quantized or not
EXPERT_CANDIDATES = ((16, 128, 4, True), (32, 64, 4, True), (32, 64, 4, False), (64, 32, 4, True), (64, 64, 8, True),
                     (128, 32, 4, True))


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    activation_shapes: tuple[str, ...] = shapes.TUNE_ACTIVATIONS
    variants: tuple[str, ...] = ("nvfp4", "4/6 fast", "4/6 exact")
    experts: int = shapes.EXPERTS  # 0: skip the expert-stack sweep
    expert_shape: str = shapes.EXPERT_MATRIX
    iters: int = 10
    check_rows: int = 256
    out: str = "benchmarks"
    profile: str = ""  # a directory: profile one call of each variant's fastest expert-stack shape (kernel split)


def _measure(x, qconfig, experts, tunables, reference, n, iters, copy_bw):
    tunables = TritonQuantTunables(**tunables)
    fn = quantizer("triton", qconfig, experts, tunables=tunables)
    return {"tunables": dataclasses.asdict(tunables), **check_then_time(fn, x, reference, n, iters, copy_bw)}


def run(config: TuneConfig) -> dict:
    key = jax.random.key(0)
    results = []
    for shape in config.activation_shapes:
        x = jax.random.normal(key, shapes.parse(shape), jnp.bfloat16)
        copy_bw = copy_bandwidth(x, config.iters)
        for variant in config.variants:
            qconfig = nvfp4.NVFP4Config(scale="token", **VARIANTS[variant])
            reference = cpu_reference(x, qconfig, False, config.check_rows)
            for rows_1d, block_k, num_warps, prefetch, row_groups in ACT_CANDIDATES:
                tunables = dict(rows_1d=rows_1d, block_k=block_k, num_warps=num_warps, prefetch=prefetch,
                                row_groups=row_groups)
                row = {"case": f"act {shape}", "variant": variant,
                       **_measure(x, qconfig, False, tunables, reference, config.check_rows, config.iters, copy_bw)}
                print(row, flush=True)
                results.append(row)
    if not config.experts:
        return {"device": str(jax.devices()[0].device_kind), "rows": results}
    k, n = shapes.parse(config.expert_shape)
    w = (jax.random.normal(key, (config.experts, k, n), jnp.float32) * 0.02).astype(jnp.bfloat16)
    copy_bw = copy_bandwidth(w, config.iters)
    for variant in config.variants:
        qconfig = nvfp4.NVFP4Config(block_2d=True, **VARIANTS[variant])
        reference = cpu_reference(w, qconfig, True, 4)
        for rows_2d, block_k_2d, num_warps, prefetch in EXPERT_CANDIDATES:
            tunables = dict(rows_2d=rows_2d, block_k_2d=block_k_2d, num_warps=num_warps, prefetch=prefetch)
            row = {"case": f"weights {config.experts}x{config.expert_shape}", "variant": variant,
                   **_measure(w, qconfig, True, tunables, reference, 4, config.iters, copy_bw)}
            print(row, flush=True)
            results.append(row)
        timed = [r for r in results if r["variant"] == variant and r["case"].startswith("weights") and "ms" in r]
        if config.profile and timed:  # where the fastest shape's time goes: the amax pass vs the quantize kernel
            best = min(timed, key=lambda r: r["ms"])
            fn = quantizer("triton", qconfig, True, tunables=TritonQuantTunables(**best["tunables"]))
            best["trace"] = trace_summary.profile_call(
                fn, (w,), f"{config.profile}/{variant.replace(' ', '_').replace('/', '')}", top=6,
                title=f"Where one call's time goes: weights, {variant}, the fastest shape")
            print(best["trace"], flush=True)
    return {"device": str(jax.devices()[0].device_kind), "rows": results}


def to_markdown(result: dict) -> str:
    lines = ["# Triton quantize launch-shape sweep", "",
             f"Device: {result['device']}. Command: `python -m experiments.tune_quant`. Every timed candidate "
             "matched the CPU reference byte for byte; **bold** = fastest of its case and variant.", "",
             "| case | variant | rows_1d | block_k | rows_2d | block_k_2d | num_warps | prefetch | row_groups | ms | copy % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    best = {}
    for r in result["rows"]:
        if "ms" in r and r["ms"] < best.get((r["case"], r["variant"]), float("inf")):
            best[(r["case"], r["variant"])] = r["ms"]
    for r in result["rows"]:
        t = r["tunables"]
        shape = (f"| {r['case']} | {r['variant']} | {t['rows_1d']} | {t['block_k']} | {t.get('rows_2d', 16)} | "
                 f"{t['block_k_2d']} | {t['num_warps']} | {t['prefetch']} | {t.get('row_groups', 1)} |")
        if "error" in r:
            lines.append(f"{shape} error: {r['error']} | |")
        elif not r["bit_exact"]:
            lines.append(f"{shape} **NOT bit-exact** | |")
        else:
            mark = "**" if r["ms"] == best[(r["case"], r["variant"])] else ""
            lines.append(f"{shape} {mark}{r['ms']:.3f}{mark} | {100 * r['copy_frac']:.0f}% |")
    lines += [f"\n{r['trace']}" for r in result["rows"] if "trace" in r]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    bench_main("tune_quant", TuneConfig, run, to_markdown, argv)


if __name__ == "__main__":
    main()
