"""Compile the Triton quantize kernel for sm_90 on a machine WITHOUT a GPU and count its SASS.

Why: the instruction count of the compiled loop (and its registers, spills, layout conversions)
is a free proxy for the kernel's arithmetic cost without a GPU; it says nothing about memory
traffic (what bounds plain NVFP4, see benchmarks/README.md). JAX
lowers the Pallas kernel to Triton IR (targeting an H200 through a private hook, as the CPU
lowering test does); the pip `triton` package compiles that IR to PTX and cubin with its own
ptxas, and its cuobjdump lists the SASS.

    pip install triton==3.6.0          # once, into the same environment (not a dependency)
    JAX_PLATFORMS=cpu python tools/triton_sass.py --variant 4/6-fast [--layout planar] [--out DIR]
    JAX_PLATFORMS=cpu python tools/triton_sass.py --kernel packed-nvfp4 --tiles 16x64x128 --num-warps 4
    JAX_PLATFORMS=cpu python tools/triton_sass.py --kernel quantize-experts --variant nvfp4 --rows-2d 128 --block-k-2d 32

Prints the number of convert_layout ops in the TTGIR, shared memory, and SASS instruction
counts (total, up to the first EXIT, and the most frequent opcodes). With a whole row in one chunk
(`--rows 1 --block-k K --num-warps 8` for K = 4096) the kernel has no loop, so the count up to the
first EXIT is what a thread executes for its 16 elements (the division slow paths lie after it):
the basis of the issue-rate floor in benchmarks/README.md. `loop_body` is the instruction count of
the largest loop (a GEMM's K step). Files (ttir, ttgir, ptx, sass) go to --out.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

VARIANTS = {
    "nvfp4": {},
    "4/6-fast": {"four_over_six": "mae", "fast_error": True},
    "4/6-exact": {"four_over_six": "mae"},
    "4/6-mse-fast": {"four_over_six": "mse", "fast_error": True},
}


def _capture_ttir(lower) -> list[str]:
    """The Triton IR (text) of every pallas_call that `lower()` lowers, targeting an H200."""
    from jax._src.pallas.triton import gpu_info, lowering, pallas_call_registration

    pallas_call_registration.gpu_info_lib.get_gpu_info = (
        lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200))
    texts = []
    original = lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = original(*args, **kwargs)
        texts.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        lower()
    finally:
        pallas_call_registration.lowering.lower_jaxpr_to_triton_module = original
    return texts


def lower_to_ttir(variant: str, tunables, shape: tuple[int, int]) -> list[str]:
    """The Triton IR (text) of every pallas_call in the per-token quantizer, lowered for an H200."""
    import jax
    import jax.numpy as jnp

    from fp4rl.formats import nvfp4 as ref
    from pallas_kernels.nvfp4_quant import triton as tq

    config = ref.NVFP4Config(scale="token", **VARIANTS[variant])
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    return _capture_ttir(lambda: jax.jit(lambda x: tq._quantize_jit(x, None, None, config, False, tunables)).trace(x).lower(
        lowering_platforms=("cuda",)))


def lower_experts_to_ttir(variant: str, tunables, experts: int, k: int, n: int) -> list[str]:
    """The Triton IR of the expert-stack quantizer (16x16 blocks, per-expert amax) on w [E, K, N] read
    K-major, as the weight sync runs it (`operands.nvfp4_quantize_experts`), lowered for an H200."""
    import jax
    import jax.numpy as jnp

    from fp4rl.formats import nvfp4 as ref
    from pallas_kernels.nvfp4_quant import triton as tq

    config = ref.NVFP4Config(block_2d=True, **VARIANTS[variant])
    w = jax.ShapeDtypeStruct((experts, k, n), jnp.bfloat16)
    return _capture_ttir(lambda: jax.jit(lambda w: tq._quantize_experts_jit(w, None, config, True, False, tunables)).trace(
        w).lower(lowering_platforms=("cuda",)))


def lower_packed_gemm_to_ttir(form: str, tiles, experts: int, k: int, n: int, rows: int) -> list[str]:
    """The Triton IR of the grouped GEMM of `pallas_kernels.grouped_gemm.packed_weight`, weight
    read packed (form "nvfp4": x bf16; "nvfp4-f16": x f16, the f16 tile) or bf16, for x [rows, k] and
    `experts` weights [n, k]."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.grouped_gemm import packed_weight as pw

    x = jax.ShapeDtypeStruct((rows, k), jnp.float16 if form == "nvfp4-f16" else jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    if form.startswith("nvfp4"):
        weights = (jax.ShapeDtypeStruct((experts, n, k // 8), jnp.uint32), jax.ShapeDtypeStruct((experts, n, k // 16), jnp.uint8))
    else:
        weights = (jax.ShapeDtypeStruct((experts, n, k), jnp.bfloat16),)
    return _capture_ttir(lambda: jax.jit(lambda x, w, s: pw._grouped_call(x, w, s, tiles=tiles, interpret=False)).trace(
        x, weights, sizes).lower(lowering_platforms=("cuda",)))


def compile_and_count(ttir_path: str, num_warps: int, num_stages: int) -> dict:
    try:
        import triton
        from triton.backends.compiler import GPUTarget
    except ImportError as e:
        raise SystemExit(f"this tool needs the pip `triton` package (pip install triton==3.6.0): {e}") from e
    kernel = triton.compile(ttir_path, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})
    stem = ttir_path[: -len(".ttir")]
    for kind in ("ttgir", "ptx"):
        with open(f"{stem}.{kind}", "w") as f:
            f.write(kernel.asm[kind])
    with open(f"{stem}.cubin", "wb") as f:
        f.write(kernel.asm["cubin"])
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([cuobjdump, "-sass", f"{stem}.cubin"], capture_output=True, text=True, check=True).stdout
    with open(f"{stem}.sass", "w") as f:
        f.write(sass)
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", f"{stem}.cubin"], capture_output=True, text=True,
                           check=True).stdout
    registers, local = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "LOCAL"))
    return {"registers": registers, "spill_bytes": local,  # LOCAL > 0: registers spilled to local memory
            "convert_layout": kernel.asm["ttgir"].count("convert_layout"), "shared_bytes": kernel.metadata.shared,
            **count_sass(sass)}


def count_sass(sass: str) -> dict:
    """Instruction counts of one kernel's SASS listing (cuobjdump / nvdisasm text): the total, up to
    the first EXIT, the largest loop's body, the most frequent opcodes overall and in that loop."""
    ops = collections.Counter()
    to_exit = None  # instructions up to the first EXIT: a loop-free kernel's main path (slow paths after it)
    for line in sass.splitlines():
        match = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if match:
            ops[match.group(1)] += 1
            if to_exit is None and match.group(1) == "EXIT":
                to_exit = sum(ops.values())
    loop = _largest_loop_opcodes(sass)
    return {"loop_body": len(loop), "sass_total": sum(ops.values()), "to_first_exit": to_exit,
            "top": dict(ops.most_common(12)),
            "loop_top": dict(collections.Counter(op.split(".")[0] for op in loop).most_common(12))}


def _largest_loop_opcodes(sass: str) -> list[str]:
    """Opcodes of the largest loop body (from a backward branch's target to the branch): what a
    thread executes per iteration of a kernel's main loop (none for a loop-free kernel)."""
    address, opcodes = [], []
    for line in sass.splitlines():
        match = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line)
        if match:
            address.append(int(match.group(1), 16))
            opcodes.append((match.group(2), match.group(3)))
    best: list[str] = []
    for i, (opcode, rest) in enumerate(opcodes):
        target = re.search(r"0x([0-9a-f]+)", rest) if opcode.startswith("BRA") else None
        if target and int(target.group(1), 16) < address[i] and int(target.group(1), 16) in address:
            start = address.index(int(target.group(1), 16))
            if i - start + 1 > len(best):
                best = [op for op, _ in opcodes[start:i + 1]]
    return best


def main(argv=None) -> None:
    import dataclasses

    from pallas_kernels.nvfp4_quant import shapes
    from pallas_kernels.nvfp4_quant.tunables import DEFAULT_TUNABLES, LAYOUTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="4/6-fast")
    parser.add_argument("--layout", choices=LAYOUTS, default=DEFAULT_TUNABLES.layout)
    parser.add_argument("--rows", type=int, default=DEFAULT_TUNABLES.rows_1d, help="rows_1d")
    parser.add_argument("--block-k", type=int, default=DEFAULT_TUNABLES.block_k)
    parser.add_argument("--num-warps", type=int, default=DEFAULT_TUNABLES.num_warps)
    parser.add_argument("--num-stages", type=int, default=DEFAULT_TUNABLES.num_stages)
    parser.add_argument("--no-prefetch", action="store_true", help="no software prefetch of chunk i+1")
    parser.add_argument("--rows-2d", type=int, default=DEFAULT_TUNABLES.rows_2d, help="quantize-experts: rows_2d")
    parser.add_argument("--block-k-2d", type=int, default=DEFAULT_TUNABLES.block_k_2d, help="quantize-experts: block_k_2d")
    parser.add_argument("--shape", default=shapes.ACTIVATIONS[0], help="MxK of the bf16 activation")
    parser.add_argument("--out", default=None, help="folder for ttir/ttgir/ptx/sass (default: a temp folder)")
    parser.add_argument("--kernel", choices=("quantize", "quantize-experts", "packed-nvfp4", "packed-nvfp4-f16", "packed-bf16"),
                        default="quantize", help="the quantizer (activations, or an expert stack read K-major), or the "
                        "grouped GEMM of grouped_gemm.packed_weight (weight packed or bf16)")
    parser.add_argument("--gemm", default="128x2048x768", help="packed-*, quantize-experts: ExKxN of the expert weights")
    parser.add_argument("--gemm-rows", type=int, default=1024, help="packed-*: rows of x")
    parser.add_argument("--tiles", default="16x64x128", help="packed-*: block_m x block_n x block_k")
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="triton_sass_")
    os.makedirs(out, exist_ok=True)
    if args.kernel.startswith("packed-"):
        _packed_gemm_main(args, out)
        return
    tunables = dataclasses.replace(DEFAULT_TUNABLES, layout=args.layout, rows_1d=args.rows, block_k=args.block_k,
                                   num_warps=args.num_warps, num_stages=args.num_stages, prefetch=not args.no_prefetch,
                                   rows_2d=args.rows_2d, block_k_2d=args.block_k_2d)
    if args.kernel == "quantize-experts":
        texts = lower_experts_to_ttir(args.variant, tunables, *(int(v) for v in args.gemm.split("x")))
    else:
        texts = lower_to_ttir(args.variant, tunables, shapes.parse(args.shape))
    for i, text in enumerate(texts):
        path = os.path.join(out, f"kernel{i}.ttir")
        with open(path, "w") as f:
            f.write(text)
        print(f"{args.variant} {args.layout} kernel{i}:", compile_and_count(path, tunables.num_warps, tunables.num_stages))
    print("files:", out)


def _packed_gemm_main(args, out: str) -> None:
    from pallas_kernels.grouped_gemm.packed_weight import PackedGemmTiles

    experts, k, n = (int(v) for v in args.gemm.split("x"))
    block_m, block_n, block_k = (int(v) for v in args.tiles.split("x"))
    tiles = PackedGemmTiles(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=args.num_warps,
                            num_stages=args.num_stages)
    form = args.kernel.removeprefix("packed-")
    for i, text in enumerate(lower_packed_gemm_to_ttir(form, tiles, experts, k, n, args.gemm_rows)):
        path = os.path.join(out, f"{args.kernel}{i}.ttir")
        with open(path, "w") as f:
            f.write(text)
        print(f"{args.kernel} {args.tiles} kernel{i}:", compile_and_count(path, tiles.num_warps, tiles.num_stages))
    print("files:", out)


if __name__ == "__main__":
    main()
