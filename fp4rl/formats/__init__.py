"""The numerics contract of docs/numerics.md as pure, jit-able jnp (depends on jax only)."""

from fp4rl.formats import elements, hadamard, mx, nvfp4, stochastic
from fp4rl.formats.nvfp4 import NVFP4Config, NVFP4Tensor

__all__ = ["elements", "hadamard", "mx", "nvfp4", "stochastic", "NVFP4Config", "NVFP4Tensor"]
