"""IEEE f32 division and square, correctly rounded, from integer operations only (Mosaic GPU).

Why: compiled Mosaic GPU kernels do not divide correctly rounded. `tools/mosaic_probe.py` on the
H200 (session 5, `benchmarks/gpu_probe.log`) found `fl(6E / A)`, `fl(1 / S_enc)` and
`fl(1 / fl(sf * S_dec))` one ulp off in about a third of the rows, even when the quotient was
formed in float64 and rounded to f32 (the kernel's earlier `_div`): the f32 results then
crossed E4M3 / E2M1 rounding boundaries in ~0.1% of the blocks, mostly for bf16 inputs, whose
short significands put products on those boundaries often. Integer operations are exact on every
platform, so the quotient is computed here as schoolbook long division of the significands:

  a / b = (ma / mb) * 2^(ea - eb), significands normalised to [2^23, 2^24) (subnormals too, by
  locating their top bit through an exact int -> f32 conversion), one quotient bit per step
  (25 steps: 24 significant bits and the rounding bit), the remainder as the sticky bit, round to
  nearest even, then the result assembled with exponent carry, overflow to Inf and gradual
  underflow (the quotient shifted right with its sticky bits) handled on the integer bits.

Zeros and infinities follow IEEE 754 (x/0 = Inf, x/Inf = 0, 0/x = 0, Inf/x = Inf, signed). The
NaN results (NaN operand, 0/0, Inf/Inf) are `nan_division(a, b)`, the platform's own division,
so their payload and sign are the platform's, as in the reference. Each op is elementwise on any
shape; `tests/kernels/test_int_arith.py` compares it with NumPy's IEEE division bit for bit.
`square` does the same for fl(d * d) (the 4/6 MSE error), from an exact significand product.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

_STEPS = 25  # quotient bits: 1 integer + 23 fraction + 1 rounding bit
_SIGN = np.int32(-(2**31))
_EXP_MASK = np.int32(0xFF)
_FRAC_MASK = np.int32(0x7FFFFF)
_HIDDEN = np.int32(0x800000)
_INF_BITS = np.int32(0x7F800000)


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


def square(d, nan_square):
    """fl(d * d) for an f32 array, IEEE round-to-nearest-even, subnormals kept, from integer ops.

    Why: in compiled Mosaic GPU kernels the 4/6 MSE error's squares (or their sums) came out
    different from the contract in rare blocks even behind an optimization barrier (session 5
    probe), while every other op matched. The significand s < 2^24 is split as h * 2^12 + l so
    s^2 = h^2 2^24 + 2hl 2^12 + l^2 is formed exactly in int32 pieces. nan_square(d): the
    platform's d * d, used only for a NaN d."""
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
    return jnp.where(mag > _INF_BITS, nan_square(d), result)


def divide(a, b, nan_division):
    """fl(a / b) for f32 arrays a, b (broadcast), IEEE round-to-nearest-even, subnormals kept.

    nan_division(a, b): the platform division, used only where the result is NaN."""
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
        return lax.shift_left(q, np.int32(1)) | jnp.where(bit, np.int32(1), np.int32(0)), lax.shift_left(rem, np.int32(1))

    q, rem = lax.fori_loop(np.int32(0), np.int32(_STEPS), step, (jnp.zeros_like(r), r))  # q = floor(ratio * 2^24) in [2^24, 2^25)
    magnitude = _assemble(q, rem != 0, e)
    # IEEE special operands (NaN cases go to the platform below).
    a_zero, b_zero = abs_a == 0, abs_b == 0
    a_inf, b_inf = abs_a == _INF_BITS, abs_b == _INF_BITS
    magnitude = jnp.where(a_inf | b_zero, _INF_BITS, magnitude)
    magnitude = jnp.where(a_zero | b_inf, np.int32(0), magnitude)
    result = lax.bitcast_convert_type(magnitude | sign, jnp.float32)
    is_nan = (abs_a > _INF_BITS) | (abs_b > _INF_BITS) | (a_zero & b_zero) | (a_inf & b_inf)
    return jnp.where(is_nan, nan_division(a, b), result)
