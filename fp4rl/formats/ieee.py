"""Single IEEE float32 operations that XLA may not rewrite (docs/numerics.md: every fl() is one op).

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
2 ulp; openxla/xla#37181: a / a != 1), which changes 4/6-exact choices on an H200
(benchmarks/logs/check_gpu_reference_native_division.log). `divide` therefore computes the
correctly rounded quotient with integer arithmetic on every platform but the CPU, whose
division is IEEE (docs/numerics.md §9), or where XLA_FLAGS makes XLA:GPU's division IEEE
(`fp4rl.xla_flags.IEEE_GPU_DIVISION`; `divide` is then native there too). The same integer
division (and `integer_square`) serves the compiled Mosaic GPU quantizer, whose float divisions (even through float64) and
MSE squares are off by an ulp in some blocks on an H200 (`tools/mosaic_probe.py`;
benchmarks/logs/mosaic_probe_float_division.log, mosaic_probe_float_square.log).
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4rl import xla_flags


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
    # division, which makes tracing a vmapped quantized backward ~4x slower. A GPU whose XLA
    # divides per IEEE (`xla_flags.IEEE_GPU_DIVISION`) divides natively, as the CPU.
    native_here = jax.default_backend() == "cpu" or xla_flags.ieee_gpu_division()
    if not _depth("native") and (_depth("integer") or not native_here):
        return integer_divide(numerator, denominator)
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
    """Trace `divide` as `integer_divide` on the CPU too (tests run the GPU path on the CPU).

    Thread-local: a process-wide flag would leak out of the block when two threads use it at once.
    """
    return _forcing("integer")


def native_division_for_cpu():
    """Trace `divide` as the hardware division even when the default backend is a GPU: for a
    program placed on the CPU (XLA:CPU divides per IEEE), e.g. the benchmark's CPU reference,
    whose integer division makes XLA:CPU compile for minutes. Wins over `integer_division_everywhere`."""
    return _forcing("native")


def reciprocal(x):
    """fl(1 / x)."""
    return divide(jnp.ones_like(jnp.asarray(x, jnp.float32)), x)


# IEEE f32 division and square from integer operations (exact on every platform).
_STEPS = 25  # quotient bits: 1 integer + 23 fraction + 1 rounding bit
_SIGN = np.int32(-(2**31))
_EXP_MASK = np.int32(0xFF)
_FRAC_MASK = np.int32(0x7FFFFF)
_HIDDEN = np.int32(0x800000)
_INF_BITS = np.int32(0x7F800000)
_CANONICAL_NAN = np.float32(np.nan)  # 0x7FC00000


def _bits(x):
    return lax.bitcast_convert_type(x, jnp.int32)


def _normalised(bits):
    """(significand in [2^23, 2^24), unbiased-exponent-like e) with value = sig * 2^(e - 150).

    Normals: e = biased exponent. Subnormals (exponent field 0, fraction f > 0): the top bit of f
    is at p = exponent of f32(f) - 127 (f < 2^23 converts exactly), f << (23 - p) is normalised
    and e = 1 - (23 - p). Zero gives garbage here (callers override zeros)."""
    exp = lax.shift_right_logical(bits, np.int32(23)) & _EXP_MASK
    frac = bits & _FRAC_MASK
    top = lax.shift_right_logical(_bits(frac.astype(jnp.float32)), np.int32(23)) - np.int32(127)
    shift = jnp.maximum(np.int32(23) - top, np.int32(0))
    subnormal = exp == 0
    sig = jnp.where(subnormal, lax.shift_left(frac, shift), frac | _HIDDEN)
    e = jnp.where(subnormal, np.int32(1) - shift, exp)
    return sig, e


def _round_shifted(q, sticky, shift):
    """round-to-nearest-even of q / 2^shift (shift in [1, 31]) with `sticky` = lower bits were nonzero."""
    kept = lax.shift_right_logical(q, shift)
    half = lax.shift_right_logical(q, shift - np.int32(1)) & np.int32(1)
    below = (q & (lax.shift_left(np.int32(1), shift - np.int32(1)) - np.int32(1))) != 0
    up = (half == 1) & (below | sticky | ((kept & np.int32(1)) == 1))
    return kept + jnp.where(up, np.int32(1), np.int32(0))


def _assemble(q, sticky, e):
    """|result| bits from q = floor(significand * 2^24) in [2^24, 2^25) (24 bits + the rounding
    bit), `sticky` (the bits below q were nonzero) and the biased exponent e (any int32).

    Normal result (e >= 1): q / 2 rounded, plus (e - 1) << 23 (a rounding carry lands in the
    exponent, up to Inf). Subnormal (e <= 0): q / 2^(2 - e) rounded, exponent field 0."""
    shift = jnp.where(e >= 1, np.int32(1), jnp.minimum(np.int32(2) - e, np.int32(31)))
    rounded = _round_shifted(q, sticky, shift)
    e_field = jnp.clip(e, np.int32(1), np.int32(255)) - np.int32(1)
    finite = jnp.where(e >= 1, lax.shift_left(e_field, np.int32(23)) + rounded, rounded)
    return jnp.minimum(finite, _INF_BITS)


def integer_square(d, nan_square=None):
    """fl(d * d) for an f32 array, IEEE round-to-nearest-even, subnormals kept, from integer ops.

    Why: in compiled Mosaic GPU kernels the float product of the 4/6 MSE error differs from the
    contract in rare blocks even behind an optimization barrier (`tools/mosaic_probe.py --mse`,
    H200), while every other op matches. The significand s < 2^24 is split as h * 2^12 + l so
    s^2 = h^2 2^24 + 2hl 2^12 + l^2 is formed exactly in int32 pieces. nan_square(d) gives the
    result for a NaN d (None: the canonical quiet NaN)."""
    d = jnp.asarray(d, jnp.float32)
    mag = _bits(d) & ~_SIGN
    sig, e = _normalised(mag)
    hi, lo = lax.shift_right_logical(sig, np.int32(12)), sig & np.int32(0xFFF)
    mid = hi * lo * np.int32(2)  # < 2^25
    low = lax.shift_left(mid & np.int32(0x3FF), np.int32(12)) + lo * lo  # < 2^25
    q = hi * hi * np.int32(4) + lax.shift_right_logical(mid, np.int32(10)) + lax.shift_right_logical(low, np.int32(22))
    sticky = (low & np.int32(0x3FFFFF)) != 0  # q = floor(s^2 / 2^22) in [2^24, 2^26)
    wide = q >= np.int32(1 << 25)  # s^2 / 2^46 in [2, 4): one more bit goes to the sticky
    sticky = sticky | (wide & ((q & np.int32(1)) != 0))
    q = jnp.where(wide, lax.shift_right_logical(q, np.int32(1)), q)
    # value = s * 2^(e - 150), so value^2 = (q / 2^24) * 2^(2e - 254 [+1 if wide]): biased 2e - 127.
    magnitude = _assemble(q, sticky, e * np.int32(2) - np.int32(127) + jnp.where(wide, np.int32(1), np.int32(0)))
    magnitude = jnp.where(mag == 0, np.int32(0), jnp.where(mag == _INF_BITS, _INF_BITS, magnitude))
    result = lax.bitcast_convert_type(magnitude, jnp.float32)
    return jnp.where(mag > _INF_BITS, _CANONICAL_NAN if nan_square is None else nan_square(d), result)


def integer_divide(a, b, nan_division=None, *, unroll: bool = True):
    """fl(a / b) for f32 arrays a, b (broadcast), IEEE round-to-nearest-even, subnormals kept,
    from integer operations only (used where the native division is not IEEE: XLA:GPU, whose
    f32 division is `div.full.f32`, and compiled Mosaic GPU kernels, see the module docstring).

    Schoolbook long division of the significands (normalised to [2^23, 2^24), subnormals by
    locating their top bit through an exact int -> f32 conversion), one quotient bit per step
    (25 steps: 24 significant bits and the rounding bit), the remainder as the sticky bit, round
    to nearest even, then the exponent (with rounding carry, overflow to Inf, gradual underflow).
    nan_division(a, b) gives the NaN results (None: the canonical quiet NaN 0x7FC00000).
    unroll: the steps as straight-line code (XLA fuses it); False: a `fori_loop` (a smaller
    Mosaic GPU kernel body)."""
    a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    ia, ib = _bits(a), _bits(b)
    sign = (ia ^ ib) & _SIGN
    abs_a, abs_b = ia & ~_SIGN, ib & ~_SIGN
    ma, ea = _normalised(abs_a)
    mb, eb = _normalised(abs_b)
    # ma / mb in [1/2, 2): bring it to [1, 2) by doubling ma (still < 2^25).
    low = ma < mb
    r = jnp.where(low, lax.shift_left(ma, np.int32(1)), ma)
    e = ea - eb + np.int32(127) - jnp.where(low, np.int32(1), np.int32(0))  # biased result exponent

    def step(_, carry):
        q, rem = carry
        bit = rem >= mb
        rem = jnp.where(bit, rem - mb, rem)
        q = lax.shift_left(q, np.int32(1)) | jnp.where(bit, np.int32(1), np.int32(0))
        return q, lax.shift_left(rem, np.int32(1))

    carry = (jnp.zeros_like(r), r)
    if unroll:
        for i in range(_STEPS):
            carry = step(i, carry)
    else:
        carry = lax.fori_loop(np.int32(0), np.int32(_STEPS), step, carry)
    q, rem = carry  # q = floor(ratio * 2^24) in [2^24, 2^25)
    magnitude = _assemble(q, rem != 0, e)
    # IEEE special operands (NaN cases go to the platform below).
    a_zero, b_zero = abs_a == 0, abs_b == 0
    a_inf, b_inf = abs_a == _INF_BITS, abs_b == _INF_BITS
    magnitude = jnp.where(a_inf | b_zero, _INF_BITS, magnitude)
    magnitude = jnp.where(a_zero | b_inf, np.int32(0), magnitude)
    result = lax.bitcast_convert_type(magnitude | sign, jnp.float32)
    is_nan = (abs_a > _INF_BITS) | (abs_b > _INF_BITS) | (a_zero & b_zero) | (a_inf & b_inf)
    return jnp.where(is_nan, _CANONICAL_NAN if nan_division is None else nan_division(a, b), result)


def as_stored(x):
    """`x` exactly as its dtype stores it, before a quantizer widens it to f32.

    XLA:GPU allows excess precision by default (`xla_allow_excess_precision`): fused into its
    producer, a bf16 tensor can reach the quantizer as the producer's unrounded f32 value, so
    the codes would depend on fusion decisions. The barrier materialises the stored value, which
    is also what a Pallas kernel always reads, so the jnp reference and the kernels quantize the
    same values inside a model (tests/model/test_gpu_impl.py compares them bitwise on a GPU;
    docs/numerics.md §9).
    """
    return lax.optimization_barrier(jnp.asarray(x))


def product(a, b):
    """fl(a * b), rounded before any add/subtract consumes it (no FMA contraction)."""
    return lax.optimization_barrier(jnp.asarray(a, jnp.float32) * jnp.asarray(b, jnp.float32))


def nan_max(a, axis=None, keepdims: bool = False):
    """max over `axis` that is NaN wherever a NaN was reduced (docs/numerics.md §8)."""
    m = jnp.max(a, axis=axis, keepdims=keepdims)
    return jnp.where(jnp.any(jnp.isnan(a), axis=axis, keepdims=keepdims), jnp.float32(jnp.nan), m)
