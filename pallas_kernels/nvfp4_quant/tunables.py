"""Launch shapes of the NVFP4 quantize kernels, validated before tracing: `TritonQuantTunables`
(and the default chosen per variant from the H200 sweep, `experiments/tune_quant.py`) and
`MosaicQuantTiling`. Kept apart from the kernels so that the tuner, the benchmark and the tests
name a launch shape without importing a backend."""

from __future__ import annotations

import dataclasses
import math

from fp4rl.formats import nvfp4 as ref

BLOCK = ref.BLOCK
LAYOUTS = ("planar", "tiled")
WARPGROUP = 128  # CUDA threads of one Mosaic GPU "thread" (a warpgroup) = rows per 128


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def next_power_of_two(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@dataclasses.dataclass(frozen=True)
class TritonQuantTunables:
    """Launch shape of the Triton kernels (`triton.py`).

    rows_1d: rows per program for 1x16 blocks.
    rows_2d: rows per program for 16x16 blocks (tile rows of 16, a power of two >= 16), and for
      any expert stack read K-major: its tiles are `[K chunk, rows_2d]`, whose contiguous runs are
      rows_2d elements long (wider tiles read whole DRAM bursts instead of 32-byte pieces).
    block_k: K columns per inner step for 1x16 blocks (and the amax/dequantize kernels);
      a power of two >= 16, capped at next_pow2(K).
    block_k_2d: the same for 16x16 blocks, whose program holds rows_2d rows (so a smaller chunk
      keeps the per-thread register footprint of the two 4/6 candidates comparable).
    num_warps, num_stages: Triton launch parameters.
    layout: how a program holds the 1x16 blocks of a row-major input. "planar": each thread
      owns whole blocks, loaded as word planes (`triton_planar`); "tiled": a
      `[rows, blocks, 16]` tile spread over threads. 16x16 tiles and K-major expert stacks
      always use the tiled kernel.
    prefetch: K in several chunks (or, planar, several row groups): issue chunk i+1's loads
      before chunk i is processed (software pipelining in registers; the compiler does not
      move loads across loop iterations), so memory latency overlaps the per-block arithmetic.
    row_groups: planar layout, a row in one chunk (K <= block_k): each program quantizes this
      many consecutive groups of rows_1d rows, loading the next group while it processes one
      (with `prefetch`): fewer, longer-lived programs whose loads overlap their arithmetic.
    """

    rows_1d: int = 4
    rows_2d: int = BLOCK
    block_k: int = 512
    block_k_2d: int = 128
    num_warps: int = 4
    num_stages: int = 1
    layout: str = "planar"
    prefetch: bool = True
    row_groups: int = 1

    def __post_init__(self):
        rows_1d, block = self.rows_1d, BLOCK
        if not is_power_of_two(rows_1d):
            raise ValueError(f"{rows_1d=} must be a power of two (Triton tensor sizes)")
        if not is_power_of_two(self.rows_2d) or self.rows_2d < block:
            raise ValueError(f"rows_2d={self.rows_2d} must be a power of two >= {block=} (whole 16x16 tiles)")
        for name, block_k in (("block_k", self.block_k), ("block_k_2d", self.block_k_2d)):
            if not is_power_of_two(block_k) or block_k % block:
                raise ValueError(f"{name}={block_k} must be a power of two and a multiple of {block=}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps={self.num_warps} must be one of 1, 2, 4, 8, 16")
        if self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages} must be >= 1")
        if self.row_groups < 1:
            raise ValueError(f"row_groups={self.row_groups} must be >= 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} must be one of {LAYOUTS}")

    def chunk(self, k: int, config: ref.NVFP4Config | None = None) -> int:
        block_k = self.block_k_2d if config is not None and config.block_2d else self.block_k
        return min(block_k, next_power_of_two(k))

    def rows(self, config: ref.NVFP4Config) -> int:
        return self.rows_2d if config.block_2d else self.rows_1d


DEFAULT_TUNABLES = TritonQuantTunables()
# Plain NVFP4 up to this K: one row per program, walked in one chunk (a power of two >= K).
_WHOLE_ROW_MAX_K = 8192


# An expert stack read K-major (the weight sync's 16x16 quantizer): 64 stored columns per program,
# K in chunks of 64, 8 warps: the fastest or within 6% of it for plain, 4/6 fast and 4/6 exact in
# the H200 sweep (`benchmarks/weight_sync/tune_quant.md`).
K_MAJOR_TUNABLES = TritonQuantTunables(rows_2d=64, block_k_2d=64, num_warps=8)


def default_tunables(config: ref.NVFP4Config, k: int, k_major: bool = False) -> TritonQuantTunables:
    """The launch shape `quantize_triton` (and `quantize_experts_triton`) uses when none is given,
    the fastest of the H200 sweeps (`benchmarks/tune_quant.md`, `benchmarks/weight_sync/`). Plain NVFP4 (1x16 blocks, K <= 8192): one row per program in
    one chunk, so each row is read once and its amax comes from registers, with up to 8 warps
    (one block per thread at K = 4096). 4/6 holds two candidates per block (about twice the
    registers per thread), so a whole row per program would hold several blocks per thread at
    large K; it is fastest with rows of 4 in chunks of 512 (DEFAULT_TUNABLES). A K-major expert
    stack: K_MAJOR_TUNABLES."""
    if k_major:
        return K_MAJOR_TUNABLES
    if config.four_over_six is None and not config.block_2d and k <= _WHOLE_ROW_MAX_K:
        chunk = next_power_of_two(k)
        warps = max(1, min(8, chunk // BLOCK // 32))  # one block per thread up to 8 warps
        return TritonQuantTunables(rows_1d=1, block_k=max(chunk, BLOCK), num_warps=warps)
    return DEFAULT_TUNABLES


@dataclasses.dataclass(frozen=True)
class MosaicQuantTiling:
    """Launch shape of the Mosaic GPU kernels (`mosaic.py`).

    block_m: rows per program (one CUDA thread per row; a multiple of 128).
    block_k: K columns per program when the amax is known before the kernel (per tensor, or
      a given per-token amax); None = all of K. With the amax computed in-kernel (per token)
      a program needs its whole rows, so block_k must be None there.
    """

    block_m: int = 128
    block_k: int | None = None

    def __post_init__(self):
        if self.block_m <= 0 or self.block_m % WARPGROUP:
            raise ValueError(f"block_m={self.block_m} must be a positive multiple of {WARPGROUP} (one thread per row)")
        if self.block_k is not None and (self.block_k <= 0 or self.block_k % BLOCK):
            raise ValueError(f"block_k={self.block_k} must be a positive multiple of block={BLOCK}")
