"""Launch shapes of the grouped-GEMM kernels, with defaults for the H200 shapes we run.

One `GroupedGemmTiles` per kernel. Defaults:
* forward / dgrad (`ragged_dot`): 128x128 output tiles, K in blocks of 64, a 4-stage TMA
  pipeline, pairs of column tiles walked together (`grid_block_n=2`): the configuration with
  which upstream's kernel ran the benchmark shape (16384 rows x [2048 -> 768], 128 experts) at
  116 TFLOP/s against lax.ragged_dot's 5.4 (`benchmarks/bench_experts.md`). SMEM: 4 x (128x64 + 64x128) bf16 + a 128x128 f32
  output tile = 192 KiB of the H200's 227 KiB. The model's h200 preset (d_model 512, expert
  width 128, 32 experts) has every column dimension a multiple of 128 (gate|up 256, down 512,
  dgrad 512 / 128).
* wgrad (`transposed_ragged_dot`): 128x128 output tiles of [K, N] per expert, tokens in blocks
  of 64 (group boundaries fall on multiples of the model's `group_align` = 32, so at most one
  partial block at each end of a group), a 4-stage pipeline.
Dimensions smaller than a block use the dimension itself (`fit`), so tiny test shapes run with
the defaults; every dimension must then be a multiple of its block (the kernels check).
"""

from __future__ import annotations

import dataclasses

# Persistent programs in interpret mode: more than one, so the loop that hands tiles to programs
# ("sm" in the kernels) is exercised; more would only slow the CPU interpreter down.
INTERPRET_PROGRAMS = 2


@dataclasses.dataclass(frozen=True)
class GroupedGemmTiles:
    """block_m x block_n output tiles, block_k along the contraction, `max_concurrent_steps`
    pipeline stages, `grid_block_n` column tiles walked together (L2 reuse of the row tiles)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    max_concurrent_steps: int = 4
    grid_block_n: int = 2

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value % 16:
                raise ValueError(f"{name}={value} must be a positive multiple of 16 (WGMMA tiles)")
        if self.block_m % 64:
            raise ValueError(f"block_m={self.block_m} must be a multiple of 64 (a warpgroup's WGMMA rows)")
        if self.max_concurrent_steps < 1 or self.grid_block_n < 1:
            raise ValueError(f"max_concurrent_steps={self.max_concurrent_steps} and grid_block_n={self.grid_block_n} must be >= 1")

    def fit(self, **dims: int) -> "GroupedGemmTiles":
        """These tiles with each named block (block_m=..., block_n=..., block_k=...) shrunk to its
        dimension where the dimension is smaller."""
        return dataclasses.replace(self, **{name: min(getattr(self, name), size) for name, size in dims.items()})


FORWARD_TILES = GroupedGemmTiles()
WGRAD_TILES = GroupedGemmTiles(grid_block_n=1)
