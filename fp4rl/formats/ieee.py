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

A fourth, on XLA:GPU only: its f32 division is PTX `div.full.f32`, an approximation (up to
2 ulp; openxla/xla#37181: a / a != 1), which changed 4/6-exact choices on the H200
(benchmarks/gpu_reference_check.log). `divide` therefore computes the correctly rounded
quotient with integer arithmetic on every platform but the CPU, whose division is IEEE.
"""

from __future__ import annotations

import contextlib
import threading

import jax
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
    numerator, denominator = jnp.broadcast_arrays(numerator, denominator)
    # Chosen at trace time: a jit traces for the default backend, and the integer path is
    # correct everywhere (only slower). `lax.platform_dependent` would put a cond around every
    # division, which made tracing a vmapped quantized backward ~4x slower.
    if not _depth("native") and (_depth("integer") or jax.default_backend() != "cpu"):
        return rounded_divide(numerator, denominator)
    return numerator / denominator


_FORCED = threading.local()  # per thread: JAX traces in the calling thread, and tests trace in parallel


def _depth(mode: str) -> int:
    return getattr(_FORCED, mode, 0)


@contextlib.contextmanager
def _forcing(mode: str):
    setattr(_FORCED, mode, _depth(mode) + 1)
    try:
        yield
    finally:
        setattr(_FORCED, mode, _depth(mode) - 1)


def forced_division() -> tuple[int, int]:
    """The calling thread's forcing state (native, integer), which decides how `divide` traces:
    part of the cache key of any jitted function whose trace calls `divide`."""
    return _depth("native"), _depth("integer")


def integer_division_everywhere():
    """Trace `divide` as `rounded_divide` on the CPU too (tests run the GPU path on the CPU).

    Thread-local: a process-wide flag leaked out of the block when two threads used it at once.
    """
    return _forcing("integer")


def native_division_for_cpu():
    """Trace `divide` as the hardware division even when the default backend is a GPU: for a
    program placed on the CPU (XLA:CPU divides per IEEE), e.g. the benchmark's CPU reference,
    whose integer division made XLA:CPU compile for minutes. Wins over `integer_division_everywhere`."""
    return _forcing("native")


def reciprocal(x):
    """fl(1 / x)."""
    return divide(jnp.ones_like(jnp.asarray(x, jnp.float32)), x)


_SIGN, _MANT, _IMPLICIT = (jnp.uint32(v) for v in (0x80000000, 0x7FFFFF, 0x800000))


def _unpack(bits):
    """(significand with its leading 1 at bit 23, unbiased-plus-127 exponent) of a nonzero finite
    f32, subnormals normalised (their exponent drops below 1)."""
    e = ((bits >> 23) & jnp.uint32(0xFF)).astype(jnp.int32)
    f = bits & _MANT
    shift = jnp.where(e == 0, lax.clz(f).astype(jnp.int32) - 8, 0)  # bring the top bit to bit 23
    m = jnp.where(e == 0, f << shift.astype(jnp.uint32), f | _IMPLICIT)
    return m, jnp.where(e == 0, 1 - shift, e)


def rounded_divide(a, b):
    """IEEE-754 binary32 a / b, round-to-nearest-even, subnormals kept, from integer operations only.

    Long division of the 24-bit significands gives 26 quotient bits (24 kept, a guard bit, one
    more) and a sticky remainder; the rounding then shifts in the exponent's underflow. Same
    shapes in, NaN out is the canonical quiet NaN. Used where the native division is not IEEE.
    """
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    ua, ub = lax.bitcast_convert_type(a, jnp.uint32), lax.bitcast_convert_type(b, jnp.uint32)
    sign = (ua ^ ub) & _SIGN
    ma, ea = _unpack(ua)
    mb, eb = _unpack(ub)
    smaller = ma < mb  # then the quotient is in [1/2, 1): take one more numerator bit
    r = jnp.where(smaller, ma << 1, ma)
    e = ea - eb + 127 - smaller.astype(jnp.int32)  # biased exponent of a quotient in [1, 2)
    q = jnp.zeros_like(ua)
    for _ in range(26):  # restoring division: q = floor(r * 2^25 / mb), r < 2 mb < 2^25
        bit = r >= mb
        r = jnp.where(bit, r - mb, r) << 1
        q = (q << 1) | bit.astype(jnp.uint32)
    sticky = r != 0
    # Drop 2 bits (normal) or 2 + (1 - e) (subnormal result), rounding to nearest even.
    drop = jnp.clip(jnp.where(e >= 1, 2, 3 - e), 2, 31).astype(jnp.uint32)
    kept = q >> drop
    guard = (q >> (drop - 1)) & 1
    below = ((q & ((jnp.uint32(1) << (drop - 1)) - 1)) != 0) | sticky
    kept = kept + (guard & (below | (kept & 1) != 0).astype(jnp.uint32))
    # The exponent field adds to the significand's implicit bit (a carry out of rounding moves it).
    magnitude = (jnp.maximum(e, 1) - 1).astype(jnp.uint32) * jnp.uint32(1 << 23) + kept
    overflow = (e >= 255) | (magnitude >= 0x7F800000)
    magnitude = jnp.where(overflow, jnp.uint32(0x7F800000), magnitude)

    # Classes from the bits: a float compare would see a subnormal as 0 where denormals are flushed.
    abs_a, abs_b = ua & ~_SIGN, ub & ~_SIGN
    inf = jnp.uint32(0x7F800000)
    zero_a, zero_b, inf_a, inf_b = abs_a == 0, abs_b == 0, abs_a == inf, abs_b == inf
    nan = (abs_a > inf) | (abs_b > inf) | (zero_a & zero_b) | (inf_a & inf_b)
    out = jnp.where(zero_a | inf_b, sign, sign | magnitude)
    out = jnp.where(inf_a | zero_b, sign | inf, out)
    out = jnp.where(nan, jnp.uint32(0x7FC00000), out)
    return lax.bitcast_convert_type(out, jnp.float32)


def as_stored(x):
    """`x` exactly as its dtype stores it, before a quantizer widens it to f32.

    XLA:GPU allows excess precision by default (`xla_allow_excess_precision`): fused into its
    producer, a bf16 tensor can reach the quantizer as the producer's unrounded f32 value, so
    the codes would depend on fusion decisions. The barrier materialises the stored value.
    Why it is here: on the H200 the model's logits under `nvfp4` differed between the jnp
    reference and the Triton kernel (which always reads the stored tensor) although each
    matched the NumPy oracle standalone; this is the suspected cause, not yet re-checked there.
    """
    return lax.optimization_barrier(jnp.asarray(x))


def product(a, b):
    """fl(a * b), rounded before any add/subtract consumes it (no FMA contraction)."""
    return lax.optimization_barrier(jnp.asarray(a, jnp.float32) * jnp.asarray(b, jnp.float32))


def nan_max(a, axis=None, keepdims: bool = False):
    """max over `axis` that is NaN wherever a NaN was reduced (NUMERICS.md s8)."""
    m = jnp.max(a, axis=axis, keepdims=keepdims)
    return jnp.where(jnp.any(jnp.isnan(a), axis=axis, keepdims=keepdims), jnp.float32(jnp.nan), m)
