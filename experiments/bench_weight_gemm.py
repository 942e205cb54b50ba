"""Benchmark of the grouped GEMM at decode sizes, with the weight read packed (NVFP4) or bf16.

    python -m experiments.bench_weight_gemm [--rows_per_expert=1,8,16,32,64 --shapes=experts128,h200_up,h200_down]
    python -m experiments.bench_weight_gemm --shapes=experts128 --profile=runs/weight_gemm_trace  # + device time per kernel

At decode a MoE layer multiplies a few rows per expert by every expert's weight: the time is
the weight's HBM read. For each shape and rows per expert (equal groups), compared in one run,
each output checked against an f32 einsum before it is timed:
- `xla bf16`: `lax.ragged_dot` (the model's `expert_gemm="xla"`), bf16 weight;
- `mosaic bf16`: the Mosaic GPU grouped GEMM (`expert_gemm="mosaic"`), bf16 weight;
- `triton bf16`: `pallas_kernels.grouped_gemm.grouped_matmul_bf16`, the packed kernel's twin;
- `emulated nvfp4 (xla)`: what a quantized site computes today from a synced weight:
  `nvfp4.scaled_operand` (the bf16 copy of the weight, written to HBM) then `lax.ragged_dot`;
- `triton nvfp4 packed bf16` / `f16`: `grouped_matmul_nvfp4`, dequantization fused (3.6x fewer weight
  bytes), with x in bf16 (the weight tile formed in f32, rounded to bf16) or in f16 (the tile formed
  in f16, the model's form: `fp4rl.grouped.ragged_matmul_nvfp4`);
- `wgmma nvfp4 packed f16 registers` / `smem`: `grouped_matmul_nvfp4_wgmma` (Mosaic GPU), the weight
  as WGMMA's A operand decoded in registers (or through shared memory), x in f16, the weight laid
  out once beforehand (`pack_for_wgmma`, not timed; the model's `packed_wgmma` transposes the scale
  bytes, 1/8 of the codes' bytes, at every call); `registers asm`: the same with the codes decoded
  by five 32-bit instructions per pair (`decode="asm"`, compiled only). Shapes whose N is
  not a multiple of 64 have no such rows.
The Triton and WGMMA rows take the fastest of a few launch shapes (`--block_m`, `--block_n`, `--block_k`;
WGMMA: `--wgmma_rows` x `--wgmma_block_n` (output features a program, 64 a WGMMA) x `--block_k`,
`--wgmma_stages`; no row tile taller than the rows per
expert need), named in the table; a launch shape the device cannot run (e.g. too much shared
memory) is listed as such, not timed. "best bf16" is the fastest row with a bf16 weight. The roofline
column is the weight bytes over the copy bandwidth measured in the same run (a jitted elementwise
pass over a tensor of the bf16 weight's size, reading and writing it once). `--profile DIR`: one
more call of each kernel's fastest form under the JAX profiler (traces in DIR), summarized per
device kernel (`fp4rl.analysis.trace_summary`): whether a row's time is its GEMM kernel or the
XLA ops around it.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp

from experiments.gpu_bench import bench_main, median_seconds
from fp4rl import grouped
from fp4rl.analysis import trace_summary
from fp4rl.formats import nvfp4
from pallas_kernels.grouped_gemm import PackedGemmTiles, grouped_matmul, grouped_matmul_bf16, grouped_matmul_nvfp4
from pallas_kernels.grouped_gemm.wgmma_nvfp4 import (A_OPERANDS, WARPGROUP_ROWS, WgmmaDecodeTiles, grouped_matmul_nvfp4_wgmma,
                                                     pack_for_wgmma)

SHAPES = {  # name: (experts, K, N) of x [R, K] @ w[e] [K, N]
    "experts128": (128, 2048, 768),  # a 128-expert layer (bench_experts' shape)
    "h200_up": (32, 512, 256),  # the h200 model's gate|up experts
    "h200_down": (32, 128, 512),  # the h200 model's down experts
}


@dataclasses.dataclass(frozen=True)
class WeightGemmBenchConfig:
    shapes: tuple[str, ...] = ("experts128", "h200_up", "h200_down")
    rows_per_expert: tuple[int, ...] = (1, 8, 16, 32, 64)
    block_m: tuple[int, ...] = (16, 32)  # Triton launch shapes tried (block_m up to the rows per expert)
    block_n: tuple[int, ...] = (32, 64, 128)
    block_k: tuple[int, ...] = (128, 256)
    num_warps: int = 4
    wgmma_rows: tuple[int, ...] = (8, 16, 32, 64)  # WGMMA row tiles tried (up to the rows per expert)
    wgmma_stages: tuple[int, ...] = (4,)  # TMA pipeline stages tried
    wgmma_block_n: tuple[int, ...] = (64,)  # output features a WGMMA program computes (multiples of 64; N must hold them)
    iters: int = 20
    interpret: bool = False  # kernels in their CPU interpreters: the tests' plumbing check, not a benchmark
    out: str = "benchmarks"
    profile: str = ""  # a directory: profile one more call of each kernel's fastest form there ("": no profile)

    def __post_init__(self):
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown:
            raise ValueError(f"unknown shapes {unknown}; valid options: {sorted(SHAPES)}")
        if not self.rows_per_expert or min(self.rows_per_expert) < 1:
            raise ValueError(f"rows_per_expert must be >= 1, got {self.rows_per_expert}")


def _row_tiles(tried: tuple[int, ...], rows_per_expert: int, least: int) -> list[int]:
    """The row tiles worth trying: none taller than the rows per expert rounded up to `least` or a
    power of two (taller ones only compute padding rows)."""
    tallest = max(least, 1 << (rows_per_expert - 1).bit_length())
    return [m for m in tried if m <= tallest] or [min(tried)]


def _wgmma_forms(interpret: bool) -> list[tuple[str, str]]:
    """(a_operand, decode) of the WGMMA rows: both operand forms with the "bits" decode, and the
    registers form with the "asm" decode (compiled only: the interpreter does not run it)."""
    return [(a_operand, "bits") for a_operand in A_OPERANDS] + ([] if interpret else [("registers", "asm")])


def _wgmma_candidates(config: WeightGemmBenchConfig, k: int, n: int, rows_per_expert: int, x, wq, sizes, weight_bytes):
    """The WGMMA kernel's launch shapes for this case (none where N is not a multiple of 64; block_n
    only where N is a multiple of it)."""
    if n % WARPGROUP_ROWS:
        return []
    weight = pack_for_wgmma(wq.codes, wq.scales)
    x16 = x.astype(jnp.float16)
    candidates = []
    for rows in _row_tiles(config.wgmma_rows, rows_per_expert, 8):
        for block_k in sorted({b for b in config.block_k if k % b == 0}):
            for stages, block_n in itertools.product(config.wgmma_stages, [b for b in config.wgmma_block_n if n % b == 0]):
                for a_operand, decode in _wgmma_forms(config.interpret):
                    tiles = WgmmaDecodeTiles(rows=rows, block_k=block_k, max_concurrent_steps=stages, block_n=block_n,
                                             a_operand=a_operand, decode=decode)
                    form = a_operand if decode == "bits" else f"{a_operand} {decode}"
                    candidates.append((f"wgmma nvfp4 packed f16 {form} [{rows}x{block_n}x{block_k} s{stages}]",
                                       jax.jit(lambda x, w, s, tiles=tiles: grouped_matmul_nvfp4_wgmma(
                                           x, w, s, tiles=tiles, interpret=config.interpret)),
                                       (x16, weight, sizes), weight_bytes, "nvfp4"))
    return candidates


def _copy_bandwidth(nbytes: int, iters: int) -> float:
    """Bytes/s of a jitted elementwise pass reading and writing `nbytes` of bf16 once."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    seconds = median_seconds(jax.jit(lambda v: v * jnp.bfloat16(1.5)), x, iters=iters)
    return 2 * nbytes / seconds


def _operands(experts: int, k: int, n: int, rows_per_expert: int):
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (experts * rows_per_expert, k), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (experts, k, n), jnp.float32)
    wq = jax.vmap(lambda m: nvfp4.quantize(m.T, nvfp4.NVFP4Config(block_2d=True)))(w)  # w^T [E, N, K], as synced
    wv = jax.vmap(lambda t: nvfp4.scaled_operand(t)[0])(wq)  # exact bf16 [E, N, K]
    sizes = jnp.full((experts,), rows_per_expert, jnp.int32)
    return x, wq, wv, sizes


def _case(config: WeightGemmBenchConfig, shape: str, rows_per_expert: int, bandwidth: float) -> list[dict]:
    experts, k, n = SHAPES[shape]
    x, wq, wv, sizes = _operands(experts, k, n, rows_per_expert)
    w_kn = jnp.swapaxes(wv, 1, 2)  # [E, K, N] for the K-major kernels
    rows = x.shape[0]
    exact = jnp.einsum("erk,enk->ern", x.reshape(experts, rows_per_expert, k).astype(jnp.float32),
                       wv.astype(jnp.float32), precision="highest").reshape(rows, n)
    flops = 2.0 * rows * k * n
    bf16_bytes = experts * k * n * 2
    packed_bytes = experts * n * (k // 2 + k // 16)
    interpret = config.interpret
    candidates = [  # (name, function, arguments, weight bytes read, weight format)
        ("xla bf16", jax.jit(lambda x, w, s: grouped.ragged_matmul(x, w, s, gemm="xla")), (x, w_kn, sizes), bf16_bytes,
         "bf16"),
        ("mosaic bf16", jax.jit(lambda x, w, s: grouped_matmul(x, w, s, interpret=interpret)), (x, w_kn, sizes),
         bf16_bytes, "bf16"),
        ("emulated nvfp4 (xla)", jax.jit(lambda x, t, s: grouped.ragged_matmul(
            x, jax.vmap(lambda u: nvfp4.scaled_operand(u)[0])(t), s, gemm="xla", transpose_rhs=True)),
         (x, wq, sizes), packed_bytes, "nvfp4"),
    ]
    for tiles in sorted({PackedGemmTiles(block_m=block_m, block_n=min(block_n, n), block_k=min(block_k, k),
                                         num_warps=config.num_warps)
                         for block_m in _row_tiles(config.block_m, rows_per_expert, 16) for block_n in config.block_n
                         for block_k in config.block_k}, key=_tiles_name):
        candidates.append((f"triton bf16 {_tiles_name(tiles)}", jax.jit(
            lambda x, w, s, tiles=tiles: grouped_matmul_bf16(x, w, s, tiles=tiles, interpret=interpret)),
            (x, wv, sizes), bf16_bytes, "bf16"))
        for form, x_form in (("bf16", x), ("f16", x.astype(jnp.float16))):  # x f16: the tile formed in f16 (the model's form)
            candidates.append((f"triton nvfp4 packed {form} {_tiles_name(tiles)}", jax.jit(
                lambda x, c, sc, s, tiles=tiles: grouped_matmul_nvfp4(x, c, sc, s, tiles=tiles, interpret=interpret)),
                (x_form, wq.codes, wq.scales, sizes), packed_bytes, "nvfp4"))
    candidates += _wgmma_candidates(config, k, n, rows_per_expert, x, wq, sizes, packed_bytes)
    results, failures = [], []
    for name, fn, args, weight_bytes, weight_format in candidates:
        try:
            out = fn(*args)
        except Exception as err:  # a launch shape the device cannot run (e.g. shared memory): reported, not timed
            failures.append({"shape": shape, "rows_per_expert": rows_per_expert, "name": name,
                             "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"})
            continue
        rel = float(jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact))
        if not rel < 1e-5:  # bf16 x bf16 products are exact in f32; only the f32 sums differ
            raise AssertionError(f"{shape} {rows_per_expert} rows/expert, {name}: relative error {rel:.3g} vs f32 einsum")
        seconds = median_seconds(fn, *args, iters=config.iters)
        results.append({"shape": shape, "rows_per_expert": rows_per_expert, "name": name, "weight": weight_format,
                        "us": seconds * 1e6,
                        "tflops": flops / seconds / 1e12, "weight_gbs": weight_bytes / seconds / 1e9,
                        "roofline_us": weight_bytes / bandwidth * 1e6, "rel_error": rel})
    best = _best_per_kernel(results)
    if config.profile:
        calls = {name: (fn, args) for name, fn, args, *_ in candidates}
        for row in best:
            fn, args = calls[row["name"]]
            log_dir = f"{config.profile}/{shape}-{rows_per_expert}-{row['name'].split(' [')[0]}".replace(" ", "_")
            row["trace"] = trace_summary.profile_call(
                fn, args, log_dir, top=8, title=f"Where one call's time goes: {shape}, {rows_per_expert} rows/expert, {row['name']}")
    return best, failures


def _tiles_name(tiles: PackedGemmTiles) -> str:
    return f"[{tiles.block_m}x{tiles.block_n}x{tiles.block_k}]"


def _best_per_kernel(results: list[dict]) -> list[dict]:
    """Each Triton and WGMMA kernel's fastest launch shape (with how many it was chosen from); the other rows as they are."""
    best: dict[str, dict] = {}
    tried: dict[str, int] = {}
    for row in results:
        kernel = row["name"].split(" [")[0]
        tried[kernel] = tried.get(kernel, 0) + 1
        if kernel not in best or row["us"] < best[kernel]["us"]:
            best[kernel] = row
    return [dict(row, launch_shapes=tried[kernel]) for kernel, row in best.items()]


def run(config: WeightGemmBenchConfig) -> dict:
    biggest = max(SHAPES[s][0] * SHAPES[s][1] * SHAPES[s][2] * 2 for s in config.shapes)
    bandwidth = _copy_bandwidth(biggest, config.iters)
    rows, failures = [], []
    for shape in config.shapes:
        for rows_per_expert in config.rows_per_expert:
            best, failed = _case(config, shape, rows_per_expert, bandwidth)
            rows += best
            failures += failed
            print(*best, *failed, sep="\n", flush=True)
    return {"config": dataclasses.asdict(config), "copy_bandwidth_gbs": bandwidth / 1e9,
            "device": str(jax.devices()[0].device_kind), "rows": rows, "failures": failures}


def to_markdown(result) -> str:
    lines = [f"# Grouped GEMM at decode sizes: packed NVFP4 vs bf16 weight ({result['device']})", "",
             f"Copy bandwidth measured in this run: {result['copy_bandwidth_gbs']:.0f} GB/s. The roofline is the "
             "weight bytes the row must read (bf16: 2 per element; packed NVFP4: 0.5625, also for the emulated "
             "row, which writes and reads a bf16 copy besides) at that bandwidth. A Triton row is the fastest of "
             "the launch shapes tried (block_m x block_n x block_k, how many in brackets), a WGMMA row likewise "
             "(rows x 64 x block_k, pipeline stages). 'vs best bf16': against the fastest row with a bf16 weight.", "",
             "| shape | rows/expert | kernel | us | roofline us | weight GB/s | TFLOP/s | vs xla bf16 | vs best bf16 |",
             "|---|---|---|---|---|---|---|---|---|"]
    cases = {}
    for row in result["rows"]:
        cases.setdefault((row["shape"], row["rows_per_expert"]), []).append(row)
    for (shape, rpe), rows in cases.items():
        xla = next((r["us"] for r in rows if r["name"] == "xla bf16"), float("nan"))
        best_bf16 = min((r["us"] for r in rows if r.get("weight") == "bf16"), default=float("nan"))
        for r in rows:
            name = r["name"] + (f" (of {r['launch_shapes']})" if r.get("launch_shapes", 1) > 1 else "")
            lines.append(f"| {shape} | {rpe} | {name} | {r['us']:.1f} | {r['roofline_us']:.1f} | "
                         f"{r['weight_gbs']:.0f} | {r['tflops']:.2f} | {xla / r['us']:.2f}x | {best_bf16 / r['us']:.2f}x |")
    for row in result["rows"]:
        if row.get("trace"):
            lines += ["", row["trace"]]
    if result.get("failures"):
        lines += ["", "Candidates that did not run (not timed):", ""]
        lines += [f"- {f['shape']}, {f['rows_per_expert']} rows/expert, {f['name']}: {f['error']}" for f in result["failures"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    bench_main("bench_weight_gemm", WeightGemmBenchConfig, run, to_markdown, argv)


if __name__ == "__main__":
    main()
