"""Named shapes of the NVFP4 quantizer, one list for the tests, the benchmark and the tuner.

The model's operand shapes are what `experiments/bench_quant.py` times and
`experiments/tune_quant.py` sweeps launch shapes on (written "MxK", as their command lines take
them). The test shapes are interpret-mode sizes chosen so that every masked tail and loop of
the kernels runs (the shared suite, `tests/kernels/quant_cases.py`, and the Mosaic tests).
"""

from __future__ import annotations

# ---------------------------------------------------------------- the model's operands (GPU)

# Activations, tokens x hidden: bf16, per-token amax, 1x16 blocks along hidden.
ACTIVATIONS = ("8192x2048", "16384x4096", "32768x7168")
# The tuner sweeps the two large ones, where the launch shape decides the bandwidth.
TUNE_ACTIVATIONS = ACTIVATIONS[1:]
# One MoE layer's expert weights, E x [K x N] (Qwen3-30B-A3B): per-expert amax, 16x16 blocks along K.
EXPERTS = 128
EXPERT_MATRIX = "2048x768"


def parse(shape: str) -> tuple[int, ...]:
    """"MxK" -> (M, K)."""
    return tuple(int(d) for d in shape.split("x"))


# ---------------------------------------------------------------- test sizes (interpret mode)

# The config sweep: odd M for 1x16 blocks (a masked row tail); 16x16 tiles need M % 16 == 0.
# K = 48 = 3 blocks: with a small chunk option (e.g. Triton block_k=32) it spans two chunks, the
# second one masked, so the chunk loop and the column masks run at tiny sizes.
SWEEP_1D = (19, 48)
SWEEP_2D = (32, 48)
# K of the shape sweep: one block, two, three, an odd block count, and large rows (8192).
SWEEP_K = (16, 32, 48, 272, 1024, 8192)
# An expert stack [E, K, N]: three experts of very different magnitudes.
EXPERT_STACK = (3, 48, 32)
# More rows than one Mosaic GPU program (block_m = 128): the last program overlaps the one before.
MOSAIC_OVERLAP = ((300, 32), (129, 272), (257, 1024))
