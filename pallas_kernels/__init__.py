"""Pallas GPU kernels of fp4rl: one package per op.

    nvfp4_quant/   NVFP4 (+ Four-Over-Six) quantize / dequantize: Triton and Mosaic GPU backends,
                   byte for byte equal to `fp4rl.formats.nvfp4`

The op's entry points are re-exported here (`pallas_kernels.quantize(x, config, backend=...)`),
as `fp4rl.operands` calls them.
"""

from pallas_kernels.nvfp4_quant import (
    BACKENDS,
    STOCHASTIC_BACKENDS,
    BackendUnavailableError,
    backend_module,
    dequantize,
    quantize,
    quantize_experts,
)

__all__ = ["BACKENDS", "STOCHASTIC_BACKENDS", "BackendUnavailableError", "backend_module", "dequantize", "quantize",
           "quantize_experts"]
