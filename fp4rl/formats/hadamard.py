"""The 16x16 random Hadamard transform of the NVFP4 pretraining recipe (docs/numerics.md §6).

Each block of 16 consecutive elements along `axis` is multiplied by M = H16 * D / 4, where H16
is the Sylvester Hadamard matrix and D a diagonal of random signs drawn from an explicit key.
M is orthogonal (H16 H16^T = 16 I), so applying the same M to both operands of a GEMM along
their contraction axis leaves the product unchanged: (M a)^T (M b) = a^T b. It spreads
outliers across the block before the amax is taken, which is why the recipe uses it on the
weight-gradient GEMM. Computed with the fast Walsh-Hadamard butterflies (adds and subtracts
in float32), not a matmul, so no TF32 path can change the result on a GPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BLOCK = 16


def hadamard_signs(key):
    """The diagonal D: 16 random signs (+-1.0 float32) from `key`."""
    return jax.random.rademacher(key, (BLOCK,), jnp.float32)


def random_hadamard(x, key, axis: int = -1):
    """Apply H16 * D / 4 to every 16-block of `x` along `axis` (float32 result)."""
    x = jnp.asarray(x, jnp.float32)
    axis = axis % x.ndim
    n = x.shape[axis]
    if n % BLOCK:
        raise ValueError(f"axis {axis} of shape {x.shape} must be a multiple of the block {BLOCK}")
    y = jnp.moveaxis(x, axis, -1)
    lead = y.shape[:-1]
    y = y.reshape(*lead, n // BLOCK, BLOCK) * hadamard_signs(key)
    for h in (1, 2, 4, 8):  # one butterfly stage per factor of H16 = H2 (x) H2 (x) H2 (x) H2
        pairs = y.reshape(*lead, n // BLOCK, BLOCK // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, n // BLOCK, BLOCK)
    y = (y * jnp.float32(0.25)).reshape(*lead, n)
    return jnp.moveaxis(y, -1, axis)
