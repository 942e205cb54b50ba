"""Benchmark of the NVFP4 (+4/6) quantizers on the GPU: Triton, Mosaic GPU, XLA reference.

    python -m experiments.bench_quant [--backends=triton,triton-tiled,mosaic,xla] [--iters=20] [--out=benchmarks]

It times the path the model runs: `fp4rl.operands.nvfp4_quantize` with `impl` = the backend
("xla" is the jnp reference) on activations [tokens, hidden], and
`fp4rl.operands.nvfp4_quantize_experts` on the expert stack [E, K, N] as
`fp4rl.qlinear.quantize_weight` calls it (weight sync): each expert quantized along K, the
kernels reading the stack as stored (K-major), the reference each expert's w^T under `jax.vmap`.
"triton-tiled" is the Triton kernel with its tiled layout (a launch option, so it calls the
kernel entry point on the same layout). Shapes (`pallas_kernels.nvfp4_quant.shapes`):
activations tokens x hidden 8192x2048, 16384x4096, 32768x7168 (bf16, per-token amax, 1x16
blocks); weights 128 experts x [2048 x 768] (the Qwen3-30B-A3B expert shape, per-expert amax,
16x16 blocks, quantized along K = 2048). Variants: plain NVFP4, 4/6 exact (MAE), 4/6 fast (MAE). Every implementation (the XLA:GPU reference included) is checked BEFORE it is
timed against the reference run on the CPU (whose f32 ops are IEEE, the docs/numerics.md contract;
tests pin it to the NumPy oracle) on the first `check_rows` rows / `check_experts` experts
(rows and experts are quantized independently); a mismatch is reported and the row not timed.

Achieved bandwidth = (bytes read + bytes written) / time, where bytes written are the codes
(K/2 per row), scale bytes and map4 (K/16 each) and the amax; it is reported against the
same run's measured device copy bandwidth (a jitted elementwise pass that reads and writes
the input once, the roofline of a one-pass quantizer).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from experiments.gpu_bench import bench_main, median_seconds
import pallas_kernels
from fp4rl import operands
from fp4rl.formats import ieee, nvfp4
from pallas_kernels.nvfp4_quant import shapes
from pallas_kernels.nvfp4_quant.tunables import TritonQuantTunables

VARIANTS = {
    "nvfp4": {},
    "4/6 exact": {"four_over_six": "mae"},
    "4/6 fast": {"four_over_six": "mae", "fast_error": True},
}
# Diagnostic rows (activations, not in the targets): plain NVFP4 with the per-token amax given,
# i.e. without the kernel's amax pass over each row (one read of x instead of two), which tells
# how much of the plain kernel's time that pass costs.
AMAX_GIVEN = "nvfp4, amax given"
PLAIN = ("nvfp4", AMAX_GIVEN)  # the plain-NVFP4 rows: the baseline of the targets, not judged by them


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    backends: tuple[str, ...] = ("triton", "triton-tiled", "mosaic", "xla")
    activation_shapes: tuple[str, ...] = shapes.ACTIVATIONS
    experts: int = shapes.EXPERTS
    expert_shape: str = shapes.EXPERT_MATRIX
    iters: int = 20
    check_rows: int = 1024
    check_experts: int = 4
    out: str = "benchmarks"


def bytes_of(t: nvfp4.NVFP4Tensor) -> int:
    return sum(int(a.size) * a.dtype.itemsize for a in (t.codes, t.scales, t.amax, t.map4))


def same_bytes(a: nvfp4.NVFP4Tensor, b: nvfp4.NVFP4Tensor) -> bool:
    pairs = [(a.codes, b.codes), (a.scales, b.scales), (a.amax, b.amax), (a.map4, b.map4)]
    return all(np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8)) for x, y in pairs)


def head(t: nvfp4.NVFP4Tensor, n: int) -> nvfp4.NVFP4Tensor:
    """The first n rows (activations, per-token amax [M, 1]) or experts (weights, amax [E])."""
    return jax.tree.map(lambda a: a[:n], t)


def cpu_reference(x, config: nvfp4.NVFP4Config, experts: bool, n: int, amax=None) -> nvfp4.NVFP4Tensor:
    """The contract's bytes for the first n rows / experts, computed by the reference on the CPU."""
    cpu = jax.devices("cpu")[0]
    amax = None if amax is None else jax.device_put(amax[:n], cpu)
    with ieee.native_division_for_cpu():  # traced here for the CPU, where division is IEEE
        return quantizer("xla", config, experts, amax=amax)(jax.device_put(x[:n], cpu))


def quantizer(backend: str, config: nvfp4.NVFP4Config, experts: bool, amax=None, **options):
    """A jitted quantizer of `backend` on the model's path (see the module docstring).

    options (launch tunables) and amax (a given per-token amax [M, 1], activations only) are not
    arguments of the model's quantizer: with either, the backend's entry point is called instead
    (`pallas_kernels.quantize`, or `nvfp4.quantize` for "xla"), on the same layout."""
    impl = "reference" if backend == "xla" else backend
    if backend == "triton-tiled":  # the Triton kernel with its tiled [rows, blocks, 16] layout
        impl, options = "triton", {**options, "tunables": TritonQuantTunables(layout="tiled")}
    if experts and amax is None:  # [E, K, N]: each expert along K, one tensor per expert
        if not options:
            return jax.jit(lambda w: operands.nvfp4_quantize_experts(w, config, impl, contraction_axis=1))
        if impl != "reference":
            return jax.jit(lambda w: pallas_kernels.quantize_experts(w, config, backend=impl, **options))
    if not options and amax is None:
        def quantize(x):
            return operands.nvfp4_quantize(x, config, impl)
    elif impl == "reference":
        def quantize(x):
            return nvfp4.quantize(x, config, amax=amax)
    else:
        def quantize(x):
            return pallas_kernels.quantize(x, config, backend=impl, amax=amax, **options)
    if experts:  # [E, K, N] -> each expert's w^T [N, K], one tensor per expert
        return jax.jit(jax.vmap(lambda m: quantize(m.T)))
    return jax.jit(quantize)


def copy_bandwidth(x, iters: int) -> float:
    """Bytes/s of one read + one write of `x` (XLA elementwise; the memory roofline here)."""
    fn = jax.jit(lambda v: v * jnp.asarray(1.0001, v.dtype))
    seconds = median_seconds(fn, x, iters=iters)
    return 2 * x.size * x.dtype.itemsize / seconds


def check_then_time(fn, x, reference: nvfp4.NVFP4Tensor, n: int, iters: int, copy_bw: float) -> dict:
    """{bit_exact, ms, gbps, copy_frac} of the quantizer `fn` on `x`: its first n rows/experts are
    compared with `reference` first, and only a bit-exact quantizer is timed. A failure to build or
    run is recorded as {error}, not raised (one table row, whatever happened)."""
    try:
        out = fn(x)
        row = {"bit_exact": same_bytes(head(out, n), reference)}
        if row["bit_exact"]:
            seconds = median_seconds(fn, x, iters=iters)
            moved = x.size * x.dtype.itemsize + bytes_of(out)
            row.update(ms=seconds * 1e3, gbps=moved / seconds / 1e9, copy_frac=moved / seconds / copy_bw)
        return row
    except Exception as e:  # noqa: BLE001  (recorded in the table: what failed and why)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}


def run(config: BenchConfig) -> dict:
    key = jax.random.key(0)
    cases = []
    for shape in config.activation_shapes:
        cases.append((f"act {shape}", jax.random.normal(key, shapes.parse(shape), jnp.bfloat16), False, "token"))
    k, n = shapes.parse(config.expert_shape)
    w = (jax.random.normal(key, (config.experts, k, n), jnp.float32) * 0.02).astype(jnp.bfloat16)
    cases.append((f"weights {config.experts}x{config.expert_shape}", w, True, "tensor"))

    peak_copy = max(copy_bandwidth(x, config.iters) for _, x, _, _ in cases)
    rows = []
    for name, x, experts, scale in cases:
        copy_bw = copy_bandwidth(x, config.iters)
        for variant, options in VARIANTS.items():
            qconfig = nvfp4.NVFP4Config(block_2d=experts, scale=scale, **options)
            n = config.check_experts if experts else config.check_rows
            reference = cpu_reference(x, qconfig, experts, n)
            for backend in config.backends:
                rows.append(bench_row(name, variant, backend, qconfig, experts, x, reference, n, config, copy_bw))
        if not experts:
            qconfig = nvfp4.NVFP4Config(scale=scale)
            amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1, keepdims=True)
            reference = cpu_reference(x, qconfig, False, config.check_rows, amax=amax)
            for backend in ("triton", "mosaic", "xla"):
                if backend in config.backends:
                    rows.append(bench_row(name, AMAX_GIVEN, backend, qconfig, False, x, reference,
                                          config.check_rows, config, copy_bw, amax=amax))
    return {"device": str(jax.devices()[0].device_kind), "copy_gbps_peak": peak_copy / 1e9, "rows": rows}


def bench_row(case, variant, backend, qconfig, experts, x, reference, n, config, copy_bw, amax=None) -> dict:
    row = {"case": case, "variant": variant, "backend": backend}
    try:
        fn = quantizer(backend, qconfig, experts, amax=amax)
    except Exception as e:  # noqa: BLE001  (an unavailable backend is a table row)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    else:
        row.update(check_then_time(fn, x, reference, n, config.iters, copy_bw))
    print(row, flush=True)
    return row


def to_markdown(result: dict) -> str:
    lines = [
        "# NVFP4 quantizer benchmark",
        "",
        f"Device: {result['device']}. Command: `python -m experiments.bench_quant`. Measured copy bandwidth "
        f"(read+write, best case over the shapes): {result['copy_gbps_peak']:.0f} GB/s.",
        "bit-exact: bytes equal to the reference run on the CPU (IEEE f32, the contract) on the first rows/experts.",
        "Bytes moved = input + codes + scales + map4 + amax. `copy %` = achieved / copy bandwidth of the same tensor.",
        "",
        "| case | variant | backend | bit-exact | ms | GB/s | copy % |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['variant']} | {r['backend']} | error | {r['error']} | | |")
        elif not r["bit_exact"]:
            lines.append(f"| {r['case']} | {r['variant']} | {r['backend']} | **NO** (not timed) | | | |")
        else:
            lines.append(f"| {r['case']} | {r['variant']} | {r['backend']} | yes | {r['ms']:.3f} | {r['gbps']:.0f} | {100 * r['copy_frac']:.0f}% |")
    lines += ["", "## Targets", ""]
    lines += targets(result)
    return "\n".join(lines) + "\n"


def targets(result: dict) -> list[str]:
    """The three performance targets (4/6 within 15% of plain, >= 3x the XLA reference, >= 80% of
    copy bandwidth at large shapes), checked on this run's numbers."""
    ms = {(r["case"], r["variant"], r["backend"]): r.get("ms") for r in result["rows"]}
    out = []
    for (case, variant, backend), t in sorted(ms.items(), key=str):
        if backend == "xla" or t is None or variant in PLAIN:
            continue
        plain = ms.get((case, "nvfp4", backend))
        if plain:
            out.append(f"- {backend} {case}: {variant} / plain = {t / plain:.2f} (target <= 1.15)")
        if variant == "4/6 fast":
            for ref_variant in ("4/6 exact", "4/6 fast"):
                ref = ms.get((case, ref_variant, "xla"))
                if ref:
                    out.append(f"- {backend} {case}: XLA reference {ref_variant} / kernel 4/6 fast = {ref / t:.2f}x (target >= 3x)")
    for r in result["rows"]:
        if r.get("copy_frac") and r["case"].startswith("act") and r["variant"] not in PLAIN and r["backend"] != "xla":
            out.append(f"- {r['backend']} {r['case']} {r['variant']}: {100 * r['copy_frac']:.0f}% of copy bandwidth (target >= 80% at large shapes)")
    return out


def main(argv=None) -> None:
    bench_main("bench_quant", BenchConfig, run, to_markdown, argv)


if __name__ == "__main__":
    main()
