"""The cases of the shared quantizer suite (`tests/kernels/quant_suite.py`): the 45 valid
configs, the five value cases of a shape, the shape / expert-stack / dequantize cases and the
inputs built from them (all host NumPy arrays, deterministic seeds). The shapes are the named
test shapes of `pallas_kernels.nvfp4_quant.shapes`."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import shapes


def _all_configs():
    out = []
    for block_2d, scale, fos, e4m3_max, fast in itertools.product(
        (False, True), ("tensor", "token"), (None, "mae", "mse"), (None, 256, 448), (False, True)
    ):
        try:
            out.append(ref.NVFP4Config(block_2d=block_2d, scale=scale, four_over_six=fos,
                                       e4m3_max=e4m3_max, fast_error=fast))
        except ValueError:  # the invalid combinations (2D per token; fast_error without 4/6)
            continue
    return tuple(out)


ALL_CONFIGS = _all_configs()
assert len(ALL_CONFIGS) == 45, len(ALL_CONFIGS)  # 1D: 2 scales x 15; 2D: tensor only x 15

# The 1D configs a slow interpreter runs (the rest run compiled): each scale with every 4/6 mode
# and every E4M3 maximum, and each 4/6 rule (mae, mse) with every E4M3 maximum
# (tests/kernels/test_quant_cases.py checks that this holds).
COVERING_1D_CONFIGS = (
    "1d-tensor-m6-Edef", "1d-tensor-mae-exact-E256", "1d-tensor-mae-fast-E448", "1d-tensor-mse-exact-Edef",
    "1d-tensor-mse-fast-E256",
    "1d-token-m6-E448", "1d-token-mae-exact-Edef", "1d-token-mae-fast-E256", "1d-token-mse-exact-E448",
    "1d-token-mse-fast-Edef",
)


def config_id(c: ref.NVFP4Config) -> str:
    e = "Edef" if c.e4m3_max is None else f"E{c.e4m3_max}"
    fos = "m6" if c.four_over_six is None else c.four_over_six + ("-fast" if c.fast_error else "-exact")
    return f"{'2d' if c.block_2d else '1d'}-{c.scale}-{fos}-{e}"


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


def value_cases(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Five value cases [5, rows, k] (bf16) for one shape: see CASE_NAMES.

    Per-tensor scaling lets one row move every other row's scale, so the extremes and the
    non-finite values get their own cases (one compile serves all five, through lax.map).
    """
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((rows, k)).astype(np.float32)
    # mixed: rows spanning 2^-30 .. 2^30, a zero row, -0 and tiny negatives, E2M1/E4M3 ties
    mixed = normal * np.exp2(rng.integers(-30, 31, size=(rows, 1))).astype(np.float32)
    mixed[0] = 0.0
    mixed[1, :16] = [6, 5, 1, 2, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -6, -0.0, -1e-30, 4, 3]
    mixed[2] = -np.abs(mixed[2]) * 1e-3
    mixed[2, :16] = -0.0
    if rows > 3:
        mixed[3, :] = np.round(normal[3] * 4) / 4  # quarter steps: many exact ties after scaling
    # huge: near the top of bf16/f32 (saturation, S_enc far below 1)
    huge = normal * np.float32(1e37)
    huge[0, :16] = 3.3e38
    huge[-1] = normal[-1] * 1e-3  # a small row beside huge ones (scales underflow to 0)
    # small: tiny magnitudes that keep every f32 intermediate normal (A ~ 1e-30)
    small = normal * np.float32(1e-30)
    small[0] = normal[0] * np.float32(1e-33)
    # non-finite: NaN, +Inf, -Inf rows (positive NaN: see the module docstring)
    nonfinite = normal.copy()
    nonfinite[1, 5] = np.nan
    if rows > 4:
        nonfinite[3, min(20, k - 1)] = np.inf
        nonfinite[4, k - 1] = -np.inf
    if rows > 6:
        nonfinite[6, 0], nonfinite[6, k // 2] = np.inf, np.nan
    # subnormal: f32/bf16 subnormal inputs and a capped S_enc (S_dec = 1/FLT_MAX is subnormal)
    subnormal = normal * np.float32(1e-38)
    subnormal[0] = normal[0] * np.float32(1e-40)
    if rows > 2:
        subnormal[2, 1:] = 0.0
    return _bf16(np.stack([mixed, huge, small, nonfinite, subnormal]))


CASE_NAMES = ("mixed", "huge", "small", "nonfinite", "subnormal")


SUBNORMAL = CASE_NAMES.index("subnormal")


# The value cases checked by the main tests: all but "subnormal". The contract's fl() is IEEE
# f32, subnormals included. XLA:CPU runs with denormals flushed (DAZ/FTZ: `jit(lambda x: x > 0)(1e-40)`
# is False there), so the reference on the CPU and any interpret-mode kernel cannot produce IEEE
# bytes where an f32 subnormal arises; the "subnormal" case is checked only for compiled kernels,
# against the NumPy oracle (IEEE), in its own test (`test_configs_subnormal_ieee`), never against
# the CPU reference.
COMPARED_CASES = tuple(i for i in range(len(CASE_NAMES)) if i != SUBNORMAL)


SWEEP_SHAPE_1D = shapes.SWEEP_1D
SWEEP_SHAPE_2D = shapes.SWEEP_2D

# (config, rows, K, input dtype) of the shape sweep, run with the backend's default options.
SHAPE_CASES = tuple(
    [(ref.NVFP4Config(scale="token", four_over_six="mse", fast_error=True), 5 if k < 8192 else 3, k,
      np.float32 if k in (48, 1024) else ml_dtypes.bfloat16) for k in shapes.SWEEP_K]
    + [(ref.NVFP4Config(four_over_six="mae", e4m3_max=448), 7 if k < 8192 else 2, k, ml_dtypes.bfloat16)
       for k in (272, 8192)]
    + [(ref.NVFP4Config(block_2d=True, four_over_six="mse"), 16, k, np.float32) for k in (16, 272)]
)


def shape_case_id(case) -> str:
    cfg, rows, k, dtype = case
    return f"{config_id(cfg)}-{rows}x{k}-{np.dtype(dtype).name}"


EXPERT_CASES = (  # (config, contraction_axis)
    (ref.NVFP4Config(), 1),
    (ref.NVFP4Config(block_2d=True, four_over_six="mae"), 1),
    (ref.NVFP4Config(scale="token", four_over_six="mse", fast_error=True), 2),
    (ref.NVFP4Config(four_over_six="mae", e4m3_max=448), 2),
)
EXPERT_SHAPE = shapes.EXPERT_STACK  # [E, K, N]


def expert_case_id(case) -> str:
    cfg, axis = case
    return f"{config_id(cfg)}-{'EKN' if axis == 1 else 'ENK'}"


def expert_stack(seed: int = 1) -> np.ndarray:
    """w [E, K, N] bf16: experts of very different magnitudes; a NaN in expert 2 only."""
    e, k, n = EXPERT_SHAPE
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((e, k, n)).astype(np.float32) * np.array([1e-3, 1.0, 1e3], np.float32)[:, None, None]
    w[2, 7, 5] = np.nan
    return _bf16(w)


DEQUANT_CONFIGS = (
    ref.NVFP4Config(),
    ref.NVFP4Config(scale="token", four_over_six="mae"),
    ref.NVFP4Config(block_2d=True, four_over_six="mse", e4m3_max=448),
    ref.NVFP4Config(four_over_six="mse", e4m3_max=256, fast_error=True),
)
DEQUANT_DTYPES = (jnp.bfloat16, jnp.float32)


def sweep_inputs(config) -> np.ndarray:
    return value_cases(*SWEEP_SHAPE_2D, seed=2) if config.block_2d else value_cases(*SWEEP_SHAPE_1D)


def shape_inputs(case) -> np.ndarray:
    cfg, rows, k, dtype = case
    rng = np.random.default_rng(rows * 10007 + k)
    x = rng.standard_normal((rows, k)).astype(np.float32) * np.exp2(rng.integers(-8, 9, size=(rows, 1)))
    x[min(1, rows - 1)] = 0.0  # a zero row (token: A = 0 -> S_enc = 1)
    return x.astype(dtype)
