"""Grouped (dropless ragged) GEMMs of the MoE layers as Pallas Mosaic GPU kernels (Hopper).

    from pallas_kernels.grouped_gemm import grouped_matmul, grouped_wgrad
    y = grouped_matmul(x_RxK, w_ExKxN, sizes_E)                         # f32 [R, N], GPU, compiled
    dx = grouped_matmul(g_RxN, w_ExKxN, sizes_E, transpose_rhs=True)    # f32 [R, K]: g @ w[e]^T
    dw = grouped_wgrad(x_RxK, g_RxN, sizes_E, interpret=True)           # f32 [E, K, N], CPU interpreter
    y = grouped_matmul_nvfp4(x_RxK, codes_ExNxK2, scales_ExNxK16, sizes_E)  # f32 [R, N], packed NVFP4 weight
    dx = grouped_dgrad_nvfp4(g_RxN, codes_ExNxK2, scales_ExNxK16, sizes_E)  # f32 [R, K], its dgrad, packed too

Why: `lax.ragged_dot` lowers on the GPU to a loop that reached 5.4 TFLOP/s on a 128-expert
layer of the H200 (`benchmarks/bench_experts.md`), so the expert GEMMs dominated the RL step.
JAX ships Mosaic GPU grouped-GEMM kernels (WGMMA, a TMA pipeline, one persistent program per
SM); they are vendored here (Apache-2.0, attribution in each file) and adapted to our callers:
f32 output, rows past the groups set to zero, interpret mode for the CPU tests, validation.
The semantics are those of `fp4rl.grouped` (the XLA reference, compared in
`tests/kernels/test_grouped_gemm.py`); the model selects a backend with
`ModelConfig.expert_gemm` (docs/design.md, "Grouped-GEMM backends").

    ops.py                     entry points: validation, row padding, zero group, program count
    ragged_dot.py              forward / dgrad kernel (vendored `ragged_dot_mgpu.py`)
    transposed_ragged_dot.py   wgrad kernel (vendored `transposed_ragged_dot_mgpu.py`)
    tunables.py                `GroupedGemmTiles` and the H200 defaults
    packed_weight.py           a grouped GEMM that reads the weight as packed NVFP4 and dequantizes it
                               in the kernel (Pallas Triton; the decode path on Hopper), with its
                               bf16-weight twin; `PackedGemmTiles`
    wgmma_nvfp4.py             the weight-only NVFP4 grouped GEMM for decode on Mosaic GPU: the weight as
                               WGMMA's A operand, decoded in registers (`pack_for_wgmma` lays it out once)
    packed_ragged_dot.py       the training-size grouped GEMM (forward and dgrad) on a packed NVFP4 weight:
                               `ragged_dot`'s schedule, each weight tile decoded into shared memory
"""

from __future__ import annotations

from pallas_kernels.grouped_gemm.ops import grouped_matmul, grouped_wgrad
from pallas_kernels.grouped_gemm.packed_weight import (PackedGemmTiles, grouped_dgrad_nvfp4, grouped_matmul_bf16,
                                                      grouped_matmul_nvfp4)
from pallas_kernels.grouped_gemm.tunables import FORWARD_TILES, WGRAD_TILES, GroupedGemmTiles

__all__ = ["FORWARD_TILES", "WGRAD_TILES", "GroupedGemmTiles", "PackedGemmTiles", "grouped_dgrad_nvfp4", "grouped_matmul",
           "grouped_matmul_bf16", "grouped_matmul_nvfp4", "grouped_wgrad"]
