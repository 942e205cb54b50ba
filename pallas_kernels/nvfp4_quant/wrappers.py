"""What every backend's wrapper does around its kernels, in plain XLA (docs/numerics.md §2, §8).

Input validation (the reference's rules, with the kernels' messages), the device guard that
refuses to run a compiled kernel without a GPU (there is no silent fallback to XLA), the per-row
layout of a global amax, the shape of an expert stack, and the assembly of an `NVFP4Tensor`
from a kernel's raw outputs. One copy here, so that every backend validates and lays out its
results exactly as the reference does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant.block_math import BLOCK


def require_gpu(interpret: bool, what: str) -> None:
    """Refuse to run a compiled GPU kernel where there is no GPU (never fall back to XLA)."""
    if interpret:
        return
    backend = jax.default_backend()
    if backend != "gpu":
        raise RuntimeError(
            f"{what} is a compiled GPU kernel but jax.default_backend()={backend!r}; "
            "run it on a CUDA GPU, or pass interpret=True to run it in Pallas interpret mode "
            "(there is no silent XLA fallback)."
        )


def check_k(k: int, block: int = BLOCK) -> None:
    if k % block or k < block:
        raise ValueError(f"{k=} must be a multiple of {block=} (and at least one block)")


def check_input(x, config: ref.NVFP4Config) -> None:
    """Validate dtype and shape before tracing (the reference's rules, the kernels' messages)."""
    dtype = jnp.result_type(x)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise TypeError(f"the NVFP4 kernels take float32, bfloat16 or float16 input, got {dtype}")
    shape = jnp.shape(x)
    if len(shape) < 1:
        raise ValueError(f"quantize needs an array with a K axis, got shape {shape}")
    check_k(shape[-1])
    if config.block_2d:
        rows = shape[-2] if len(shape) >= 2 else 1
        tile = BLOCK
        if len(shape) < 2 or rows % tile:
            raise ValueError(f"{rows=} must be a multiple of {tile=} for 2D (16x16) blocks")


def check_uniform(x, config: ref.NVFP4Config, uniform) -> None:
    """Stochastic rounding's draws (None: round to nearest even): float32 of x's shape; not with 4/6."""
    if uniform is None:
        return
    if config.four_over_six is not None:
        raise ValueError("stochastic rounding (uniform) is not defined together with four_over_six")
    if jnp.shape(uniform) != jnp.shape(x) or jnp.result_type(uniform) != jnp.dtype(jnp.float32):
        raise ValueError(f"uniform must be float32 draws of x's shape {jnp.shape(x)}, got "
                         f"{jnp.result_type(uniform)} {jnp.shape(uniform)}")


def amax_rows(amax, config: ref.NVFP4Config, lead_shape, groups: int):
    """A given global amax -> float32 [groups, rows_per_group], one value per quantized row.

    Per tensor: `()` (groups == 1) or `[groups]` (an expert stack); per token: `[..., 1]`.
    """
    amax = jnp.asarray(amax, jnp.float32)
    rows = math.prod(lead_shape) // groups
    if config.scale == "token":
        expected = (*lead_shape, 1)
        if amax.shape != expected:
            raise ValueError(f"a per-token amax must have shape {expected}, got {amax.shape}")
        return amax.reshape(groups, rows)
    expected = () if groups == 1 else (groups,)
    if amax.shape == ():
        amax = amax[None]
    if amax.shape != (groups,):
        raise ValueError(f"a per-tensor amax must have shape {expected}, got {amax.shape}")
    return jnp.broadcast_to(amax[:, None], (groups, rows))


def expert_stack_dims(w, contraction_axis: int):
    """(E, N, K) of an expert stack w: [E, K, N] (contraction_axis=1) or [E, N, K] (2)."""
    if contraction_axis not in (1, 2):
        raise ValueError(f"{contraction_axis=} must be 1 (w is [E, K, N]) or 2 (w is [E, N, K])")
    if jnp.ndim(w) != 3:
        raise ValueError(f"an expert stack is [E, K, N] or [E, N, K], got shape {jnp.shape(w)}")
    e, d1, d2 = jnp.shape(w)
    return (e, d2, d1) if contraction_axis == 1 else (e, d1, d2)


def dequant_amax_rows(t: ref.NVFP4Tensor):
    """The amax of a quantized tensor -> float32 [rows] (rows = prod(codes.shape[:-1])).

    `()` per tensor, `[..., 1]` per token, and also `[E]` / `[E, ...]` leading-axis amaxes of
    a `jax.vmap`-ed quantize (expert stacks): the same broadcast `jax.vmap(dequantize)` makes.
    """
    lead = t.codes.shape[:-1]
    amax = jnp.asarray(t.amax, jnp.float32)
    if amax.ndim == len(lead) + 1 and amax.shape[-1] == 1:
        amax = amax[..., 0]
    if amax.shape != lead[: amax.ndim]:
        raise ValueError(f"amax of shape {amax.shape} does not match codes of shape {t.codes.shape}")
    amax = amax.reshape(amax.shape + (1,) * (len(lead) - amax.ndim))
    return jnp.broadcast_to(amax, lead).reshape(-1)


def assemble(codes_u8, scale_bytes_u8, map4, amax, config, lead_shape, k):
    """Raw kernel outputs (flattened rows) -> an NVFP4Tensor shaped like the reference's."""
    codes = codes_u8.reshape(*lead_shape, k // 2)
    scales = lax.bitcast_convert_type(scale_bytes_u8, jnp.float8_e4m3fn).reshape(*lead_shape, k // BLOCK)
    map4 = map4.reshape(*lead_shape, k // BLOCK)
    return ref.NVFP4Tensor(codes=codes, scales=scales, amax=amax, map4=map4, config=config)
