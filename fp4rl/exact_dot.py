"""What makes an XLA dot multiply exactly: both operands in their common dtype, and for f32 operands
the HIGHEST precision.

Shared by every grouped-GEMM backend built from XLA ops (`fp4rl.grouped`'s "xla",
`fp4rl.blocked_gemm`'s "blocked") and by `fp4rl.qlinear`'s dense GEMMs, so that all of them
compute the same products and differ only in f32 summation order. A module of its own because
`fp4rl.grouped` dispatches to `fp4rl.blocked_gemm`, which builds on these two helpers.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


def promoted(a, b):
    """Both operands in their common dtype (an exact widening, e.g. bf16 -> f32)."""
    dtype = jnp.promote_types(a.dtype, b.dtype)
    return a.astype(dtype), b.astype(dtype)


def exact_precision(dtype):
    """The `precision` that makes an XLA dot of `dtype` operands multiply exactly: HIGHEST for f32.
    XLA:GPU's DEFAULT runs f32 dots as TF32 on Ampere and later (10 significand bits, ~5e-4
    relative), which would round the f32 operand of the dequantized wgrad; bf16 products are
    exact in f32 under any precision, so bf16 dots keep DEFAULT (and their programs unchanged)."""
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == F32 else None
