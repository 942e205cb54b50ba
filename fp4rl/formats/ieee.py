"""Single IEEE float32 operations that XLA may not rewrite (NUMERICS.md: every fl() is one op).

XLA's algebraic simplifier and code generators change float32 results in three ways that
the contract forbids, all observed on XLA:CPU (and the first two on XLA:GPU):
1. a division by a broadcast constant becomes a multiply by its reciprocal (then
   reassociated with neighbouring constant multiplies);
2. a product feeding an add/subtract is contracted into a fused multiply-add;
3. a max reduction over many rows can drop NaN (a vectorised max that returns the other
   operand), so a NaN block gets a finite amax.
`lax.optimization_barrier` makes a value opaque to the simplifier and materialises it
outside the consumer's fusion, which rules out 1 and 2; NaN is propagated explicitly for 3.
Known platform limit: XLA:CPU flushes float32 subnormals to zero, so a tensor whose amax is
below 6E / FLT_MAX (~8e-36) gets a zero S_dec there (documented; not fixable in jnp).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def divide(numerator, denominator):
    """fl(numerator / denominator), never a multiply by a reciprocal.

    The denominator is made a full array that depends on the numerator (plus an exact zero
    derived from it), behind a barrier: under any vmap it is batched like the numerator, so
    the simplifier never sees "x / broadcast(c)", which it would rewrite as x * (1/c).
    """
    numerator = jnp.asarray(numerator, jnp.float32)
    zero = jnp.where(jnp.isfinite(numerator), numerator - numerator, jnp.float32(0))
    denominator = lax.optimization_barrier(jnp.asarray(denominator, jnp.float32) + zero)
    return numerator / denominator


def product(a, b):
    """fl(a * b), rounded before any add/subtract consumes it (no FMA contraction)."""
    return lax.optimization_barrier(jnp.asarray(a, jnp.float32) * jnp.asarray(b, jnp.float32))


def nan_max(a, axis=None, keepdims: bool = False):
    """max over `axis` that is NaN wherever a NaN was reduced (NUMERICS.md s8)."""
    m = jnp.max(a, axis=axis, keepdims=keepdims)
    return jnp.where(jnp.any(jnp.isnan(a), axis=axis, keepdims=keepdims), jnp.float32(jnp.nan), m)
