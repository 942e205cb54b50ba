"""Element and scale types of docs/numerics.md §1: E2M1 codes, E4M3 and E8M0 scale rounding, packing.

Every helper is pure jnp and computes the rounding arithmetically (compares, exact power-of-two
multiplies, `lax.round` to nearest-even) rather than through `astype` at the edges: on CPU an
f32 -> float8_e4m3fn cast turns values past 448 into NaN, f32 -> float8_e8m0fnu rounds the
exponent by neither OCP rule, and Pallas Triton cannot cast to float4 at all (docs/numerics.md §1).
The only casts used are of values that are already exactly representable, which are exact.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

FLT_MAX = np.float32(3.4028235e38)
E4M3_MAX = 448.0
E2M1_MAX = 6.0
# The 8 magnitudes of E2M1 codes 0..7; codes 8..15 are their negatives (code 8 is -0).
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
_E2M1_DECODE = np.concatenate([E2M1_GRID, -E2M1_GRID]).astype(np.float32)


def pow2(n):
    """Exact 2**n as float32 for integer n in [-126, 127], built from the exponent bits."""
    n = jnp.asarray(n, jnp.int32)
    return lax.bitcast_convert_type((n + 127) << 23, jnp.float32)


def e2m1_encode(v):
    """Round float32 `v` to the nearest E2M1 code (0..15), ties to even, saturating at +-6.

    Thresholds of docs/numerics.md §1: a tie (0.25, 0.75, ...) goes to the neighbour with an even
    mantissa, so the comparison is `>` at even-below ties and `>=` at odd-below ties. The sign
    bit follows the sign of v, so a tiny negative becomes code 8 (-0). NaN encodes as +-0:
    codes cannot carry NaN, which is why non-finite input is flagged through the scales/amax.
    """
    v = jnp.asarray(v, jnp.float32)
    a = jnp.abs(v)
    magnitude = (
        (a > 0.25).astype(jnp.uint8)
        + (a >= 0.75).astype(jnp.uint8)
        + (a > 1.25).astype(jnp.uint8)
        + (a >= 1.75).astype(jnp.uint8)
        + (a > 2.5).astype(jnp.uint8)
        + (a >= 3.5).astype(jnp.uint8)
        + (a > 5.0).astype(jnp.uint8)
    )
    sign = jnp.signbit(v).astype(jnp.uint8) << 3
    return magnitude | sign


def e2m1_decode(codes):
    """Decode E2M1 codes (0..15, any integer dtype) to float32 (code 8 decodes to -0.0)."""
    return jnp.asarray(_E2M1_DECODE)[jnp.asarray(codes).astype(jnp.int32) & 0xF]


def pack_e2m1(codes):
    """Pack codes [..., K] (K even) into bytes [..., K // 2]: element 2j in the low nibble."""
    codes = jnp.asarray(codes, jnp.uint8)
    if codes.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number of E2M1 codes: shape {codes.shape}")
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)


def unpack_e2m1(packed):
    """Inverse of `pack_e2m1`: bytes [..., K // 2] -> codes [..., K]."""
    packed = jnp.asarray(packed, jnp.uint8)
    low, high = packed & 0xF, packed >> 4
    return jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e4m3_round_f32(v):
    """Round float32 `v` to the nearest E4M3 value (as float32): RNE, saturating at 448.

    Normals have 3 mantissa bits, so the quantum of the binade [2^e', 2^(e'+1)) is 2^(e'-3);
    subnormals (below 2^-6) have the fixed quantum 2^-9, so anything below 2^-10 rounds to 0
    (a tie at exactly 2^-10 goes to the even 0). NaN stays NaN.
    """
    v = jnp.asarray(v, jnp.float32)
    a = jnp.minimum(jnp.abs(v), jnp.float32(E4M3_MAX))  # saturate first; NaN propagates
    _, e = jnp.frexp(a)  # a = m * 2**e with m in [0.5, 1): the binade exponent is e - 1
    quantum_exp = jnp.maximum(e - 4, -9)
    rounded = lax.round(a * pow2(-quantum_exp), lax.RoundingMethod.TO_NEAREST_EVEN)
    return jnp.copysign(rounded * pow2(quantum_exp), v)


def e4m3_round(v):
    """Round float32 `v` to float8_e4m3fn (the cast only sees exactly representable values)."""
    return e4m3_round_f32(v).astype(jnp.float8_e4m3fn)


def e8m0_from_exponent(exponent):
    """E8M0 byte for 2**exponent, clamped to the representable 2^-127 .. 2^127 (bytes 0..254)."""
    return (jnp.clip(exponent, -127, 127) + 127).astype(jnp.uint8)


def e8m0_to_f32(scale_bytes):
    """Decode E8M0 bytes to float32: byte s is 2^(s-127); 0xFF is NaN; byte 0 is 2^-127."""
    s = jnp.asarray(scale_bytes).astype(jnp.int32)
    # 2^-127 is an f32 subnormal, which pow2 cannot build from exponent bits: halve 2^-126.
    value = jnp.where(s == 0, pow2(-126) * jnp.float32(0.5), pow2(jnp.maximum(s, 1) - 127))
    return jnp.where(s == 255, jnp.float32(jnp.nan), value)


def floor_log2(a):
    """floor(log2(a)) for finite a > 0 (exact, from frexp)."""
    _, e = jnp.frexp(a)
    return e - 1


def ceil_log2(a):
    """ceil(log2(a)) for finite a > 0 (exact: a power of two maps to its own exponent)."""
    m, e = jnp.frexp(a)
    return jnp.where(m == 0.5, e - 1, e)


def check_blocked_input(x, block: int) -> None:
    """A quantizer's input: a real floating-point array whose last axis is a multiple of `block`."""
    dtype = jnp.result_type(x)
    if jnp.issubdtype(dtype, jnp.complexfloating) or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"quantize needs a real floating-point array, got dtype {dtype}")
    shape = jnp.shape(x)
    if len(shape) < 1 or shape[-1] % block:
        raise ValueError(f"K={shape[-1] if shape else None} of shape {shape} must be a multiple of the block {block}")
    if shape[-1] == 0:
        raise ValueError(f"K=0 of shape {shape}: quantize needs at least one block of {block} along the last axis")
