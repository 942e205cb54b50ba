"""`fl()` of the NVFP4 contract as inline PTX, for the compiled Pallas Triton kernels.

Triton's defaults break the contract's one-IEEE-op-per-fl() rule: f32 division lowers to the
approximate `div.full.f32`, LLVM contracts `a*b - c` into an FMA, and its fabs is
`FADD.FTZ |a|, -0` (flushes subnormals). Each op here is one PTX instruction with explicit
round-to-nearest-even and no `.ftz`, which ptxas neither contracts nor flushes. Interpret mode
uses `block_math.PlainArith`, the same interface in jnp.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu_triton


def _asm(instruction: str, *args):
    """One f32 PTX instruction `instruction $0, $1, ...` applied elementwise (args broadcast)."""
    args = jnp.broadcast_arrays(*(jnp.asarray(a, jnp.float32) for a in args))
    [out] = plgpu_triton.elementwise_inline_asm(
        f"{instruction} " + ", ".join(f"${i}" for i in range(len(args) + 1)) + ";",
        args=list(args),
        constraints=",".join(["=f"] + ["f"] * len(args)),
        pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(args[0].shape, jnp.float32)],
    )
    return out


class RoundedArith:
    """`fl()` ops as inline PTX with explicit round-to-nearest-even and no FTZ."""

    @staticmethod
    def mul(a, b):
        return _asm("mul.rn.f32", a, b)

    @staticmethod
    def div(a, b):
        return _asm("div.rn.f32", a, b)  # the IEEE division (Triton's default is div.full.f32)

    @staticmethod
    def add(a, b):
        return _asm("add.rn.f32", a, b)

    @staticmethod
    def sub(a, b):
        return _asm("sub.rn.f32", a, b)

    @staticmethod
    def abs(a):
        return _asm("abs.f32", a)  # not Triton's fabs, which flushes a subnormal

    @staticmethod
    def clamp_abs(v, cap):
        """min(|v|, cap): abs.f32 + min.f32, which ptxas folds into one FMNMX |v| (no FTZ; a NaN
        v gives cap, as PTX's min returns the non-NaN operand)."""
        return _asm("min.f32", _asm("abs.f32", v), cap)

    @staticmethod
    def fma(a, b, c):
        """fl(a * b + c): used only where a * b is exact (see PlainArith.fma)."""
        return _asm("fma.rn.f32", a, b, c)
