"""The NVFP4 block contract (docs/numerics.md §1-§3, §8) as kernel-side element math.

Written against an `Arith` object, so that one kernel body serves interpret mode (`PlainArith`,
plain jnp ops) and a compiled backend that must pin every `fl()` of the contract to one
IEEE-rounded f32 instruction (`triton_arith.RoundedArith`; Mosaic GPU: `mosaic_block.ExactArith`).
Everything that is not an `fl()` of the contract is done on the integer bits (abs, max, E4M3
rounding of normals, E2M1 sign), which is exact on every backend: the Triton lowering turns
float min/max into `minnumf`/`maxnumf`, which drop NaN, whereas the contract (and the
reference) propagate it (§8). The wrapper side (validation, amax layout, assembly of the
result) is `wrappers`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4rl.formats import elements as el
from fp4rl.formats import nvfp4 as ref

BLOCK = ref.BLOCK  # 16 elements per NVFP4 block along K (and 16 rows per 2D tile)
FLT_MAX = np.float32(3.4028235e38)
E4M3_MAX = np.float32(448.0)
ONE_SIXTH = np.float32(1.0) / np.float32(6.0)  # fl(1/6), as the contract's k = fl(S_enc * fl(1/6))
_MIN_NORMAL_E4M3 = np.float32(2.0**-6)
_ABS_MASK = np.int32(0x7FFFFFFF)


class PlainArith:
    """`fl()` ops as jnp for interpret mode, pinned against XLA:CPU's float rewrites.

    Measured on XLA:CPU (jax 0.11.2), each breaking the contract's one-IEEE-op-per-fl():
    * under jit, `a*b - c` is contracted into an FMA (~23% of random f32 triples differ);
    * `x / c` with a scalar (broadcast) divisor becomes `x * (1/c)` (~33% of `x / 6` differ),
      eager or jitted;
    * `(y + c) - c` is folded to `y` (so no magic-number rounding anywhere in the kernels).
    So a product is materialised behind `lax.optimization_barrier`, and a divisor is
    broadcast to the full shape behind a barrier (then XLA emits a true division). XLA:CPU
    also flushes subnormals (DAZ/FTZ), which no jnp code can undo: see the tests' notes.
    """

    @staticmethod
    def mul(a, b):
        return lax.optimization_barrier(a * b)

    @staticmethod
    def div(a, b):
        a, b = jnp.broadcast_arrays(a, b)
        return a / lax.optimization_barrier(b)

    @staticmethod
    def add(a, b):
        return a + b

    @staticmethod
    def abs(a):
        return jnp.abs(a)

    @staticmethod
    def clamp_abs(v, cap):
        """min(|v|, cap) for non-NaN v (a NaN v may give NaN or cap: callers mask NaN blocks)."""
        return jnp.minimum(jnp.abs(v), cap)

    @staticmethod
    def fma(a, b, c):
        """fl(a * b + c), used only where a * b is exact (so contracted or not, one rounding);
        behind a barrier so XLA cannot fold a later `- c` into it."""
        return lax.optimization_barrier(a * b + c)

    @staticmethod
    def sub(a, b):
        return a - b


def f32(c) -> jax.Array:
    return jnp.asarray(np.float32(c), jnp.float32)


def abs_bits(x):
    """|x| as int32 bits (sign cleared). On non-negative floats the int order is the float
    order, NaN above Inf, so an integer max is a NaN-propagating, flush-free float max."""
    return lax.bitcast_convert_type(x, jnp.int32) & _ABS_MASK


def from_bits(bits):
    return lax.bitcast_convert_type(bits, jnp.float32)


def fabs(x):
    return from_bits(abs_bits(x))


def with_sign(magnitude, negative):
    """Set the sign bit where `negative` (magnitude >= 0 or NaN). Not `-x`: the Triton lowering
    negates as `0 - x`, which turns -(+0) into +0 (code 8 must decode to -0.0)."""
    sign = jnp.where(negative, np.int32(-(2**31)), np.int32(0))
    return from_bits(abs_bits(magnitude) | sign)


def is_nan(x):
    return x != x


def min_nan(x, cap):
    """min(x, cap) that keeps NaN (Triton lowers jnp.minimum to minnumf, which drops NaN)."""
    return jnp.where(x > cap, f32(cap), x)


def scales_from_amax(ar, amax, e4m3_bound: int):
    """S_enc, S_dec of §2 from A: S_enc = min(fl(6E/A), FLT_MAX); 1 if A == 0 or S_enc == 0."""
    s_enc = ar.div(f32(6 * e4m3_bound), amax)
    s_enc = min_nan(s_enc, FLT_MAX)
    # Zero tests on the bits (A >= 0 and S_enc >= 0 here): a flush-to-zero float compare would
    # call a subnormal A zero, and the contract's IEEE compare does not.
    zero = (abs_bits(amax) == 0) | (abs_bits(s_enc) == 0)
    s_enc = jnp.where(zero, f32(1), s_enc)
    s_dec = ar.div(f32(1), s_enc)
    return s_enc, s_dec


def e4m3_round(ar, t):
    """E4M3 rounding of t in [0, 448] or NaN (already clamped): (value as f32, byte as int32).

    All on the integer bits of t, nearest-even (no float rounding tricks: XLA's algebraic
    simplifier folds `(y + 2^23) - 2^23` to `y`, so the classic magic-number RNE is unsafe):
    * normals (t >= 2^-6): drop 20 of the 23 f32 mantissa bits;
    * subnormals (quantum 2^-9): n = RNE(t / 2^-9) from the 24-bit significand shifted right
      by 141 - biased_exponent (21..24; more than 24 means t < 2^-10 -> 0, ties included).
    NaN -> byte 0x7F (the reference's NaN scale is positive: it comes from max|x|).
    """
    del ar  # exact integer work: no fl() of the contract happens here
    bits = lax.bitcast_convert_type(t, jnp.int32)
    normal = t >= _MIN_NORMAL_E4M3
    lsb = lax.shift_right_logical(bits, np.int32(20)) & np.int32(1)
    rbits = (bits + np.int32(0x7FFFF) + lsb) & np.int32(~0xFFFFF)
    biased = lax.shift_right_logical(bits, np.int32(23)) & np.int32(0xFF)
    drop = np.int32(141) - biased
    shift = jnp.clip(drop, np.int32(21), np.int32(24))
    sig = (bits & np.int32(0x7FFFFF)) | np.int32(0x800000)
    n = lax.shift_right_logical(sig, shift)
    rem = sig & (lax.shift_left(np.int32(1), shift) - np.int32(1))
    half = lax.shift_left(np.int32(1), shift - np.int32(1))
    up = (rem > half) | ((rem == half) & ((n & np.int32(1)) == np.int32(1)))
    n = jnp.where(drop > 24, np.int32(0), n + jnp.where(up, np.int32(1), np.int32(0)))
    value = jnp.where(normal, from_bits(rbits), n.astype(jnp.float32) * f32(2.0**-9))  # exact: n <= 8
    byte = jnp.where(normal, lax.shift_right_logical(rbits, np.int32(20)) - np.int32(960), n)
    byte = jnp.where(is_nan(t), np.int32(0x7F), byte)
    value = jnp.where(is_nan(t), t, value)
    return value, byte


def e4m3_decode(byte):
    """float8_e4m3fn byte (int32 0..255) -> float32 (exact); 0x7F/0xFF -> NaN."""
    e = lax.shift_right_logical(byte, np.int32(3)) & np.int32(15)
    m = byte & np.int32(7)
    normal = from_bits(lax.shift_left(e + np.int32(120), np.int32(23)) | lax.shift_left(m, np.int32(20)))
    sub = m.astype(jnp.float32) * f32(2.0**-9)  # exact: m <= 7
    v = jnp.where(e == 0, sub, normal)
    v = jnp.where((byte & np.int32(0x7F)) == np.int32(0x7F), f32(np.nan), v)
    return with_sign(v, (byte & np.int32(0x80)) != 0)


def e2m1_encode(v):
    """Codes 0..15 (int32) of §1: RNE, saturating at 6, sign from the sign bit (NaN -> +-0)."""
    a = fabs(v)
    one = np.int32(1)
    zero = np.int32(0)

    def step(c):
        return jnp.where(c, one, zero)

    magnitude = (
        step(a > 0.25) + step(a >= 0.75) + step(a > 1.25) + step(a >= 1.75)
        + step(a > 2.5) + step(a >= 3.5) + step(a > 5.0)
    )
    sign = lax.shift_right_logical(lax.bitcast_convert_type(v, jnp.int32), np.int32(31))
    return magnitude | lax.shift_left(sign, np.int32(3))


def stochastic_e2m1_encode(ar, v, u):
    """Codes 0..15 of §6: |v| in the grid interval [lo, hi) rounds up to hi iff u < (|v| - lo) /
    (hi - lo), with the quotient formed exactly as `fp4rl.formats.stochastic.round_up_probability`
    does (a - lo, then times 1 / (hi - lo), a power of two). No clamp to 6: past it lo = 6 and the
    factor is 0, so the probability is 0 (NaN for Inf), and nothing rounds up. u < p is compared on
    the bits (u, p >= 0: no flush-to-zero compare; False for a NaN p, as the float compare). NaN v:
    every compare is false, code +-0 as the reference's."""
    a = fabs(v)
    one, zero = np.int32(1), np.int32(0)
    lo_index = sum(jnp.where(a >= f32(g), one, zero) for g in el.E2M1_GRID[1:])
    lo = e2m1_decode(lo_index)
    width_inverse = jnp.where(lo_index < 4, f32(2.0), jnp.where(lo_index < 6, f32(1.0),
                                                                 jnp.where(lo_index == 6, f32(0.5), f32(0.0))))
    p_up = ar.mul(ar.sub(a, lo), width_inverse)
    magnitude = lo_index + jnp.where(less_nonneg(u, p_up), one, zero)
    sign = lax.shift_right_logical(lax.bitcast_convert_type(v, jnp.int32), np.int32(31))
    return magnitude | lax.shift_left(sign, np.int32(3))


def e2m1_decode(code):
    """E2M1 code (int32) -> float32: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives (8 -> -0.0)."""
    m = code & np.int32(7)
    mf = m.astype(jnp.float32)
    mag = jnp.where(m < 4, mf * f32(0.5), jnp.where(m == 7, f32(6.0), mf - f32(2.0)))  # exact
    return with_sign(mag, (code & np.int32(8)) != 0)


def block_scale(ar, b, s_enc):
    """Plain NVFP4 scale of a block with max |x| = b: E4M3(min(fl(b * fl(S_enc * fl(1/6))), 448))
    as (value, byte)."""
    return e4m3_round(ar, min_nan(ar.mul(b, ar.mul(s_enc, f32(ONE_SIXTH))), E4M3_MAX))


def four_over_six_scales(ar, b, s_enc):
    """The two 4/6 candidate scales (sf6, byte6), (sf4, byte4) of §3:
    base = fl(fl(b / 6) * S_enc) (divide, then multiply); sf6 = E4M3(min(base, 448));
    sf4 = E4M3(min(fl(base * 1.5), 448))."""
    base = ar.mul(ar.div(b, f32(6.0)), s_enc)
    return e4m3_round(ar, min_nan(base, E4M3_MAX)), e4m3_round(ar, min_nan(ar.mul(base, f32(1.5)), E4M3_MAX))


def inverse_scale(ar, sf, s_dec):
    """inv = min(fl(1 / fl(f32(sf) * S_dec)), FLT_MAX) per block."""
    return min_nan(ar.div(f32(1), ar.mul(sf, s_dec)), FLT_MAX)


def encode_with_scale(ar, xb, sf, s_dec, uniform=None):
    """q_i = E2M1(fl(x_i * inv)) with inv = `inverse_scale`; with `uniform` (f32 [R, NB, 16] in
    [0, 1)), the E2M1 rounding is stochastic (§6, `stochastic_e2m1_encode`).

    xb [R, NB, 16]; sf [R', NB] (R' in {1, R}); s_dec [R, 1].
    """
    v = ar.mul(xb, inverse_scale(ar, sf, s_dec)[..., None])
    return e2m1_encode(v) if uniform is None else stochastic_e2m1_encode(ar, v, uniform)


def sequential_sum16(ar, e):
    """Sequential f32 sum over the last axis (size 16), i = 0..15, as §3 fixes the order."""
    parts = lax.split(e, (1,) * BLOCK, axis=e.ndim - 1)
    total = parts[0]
    for p in parts[1:]:
        total = ar.add(total, p)
    return total.reshape(e.shape[:-1])


def tree_sum16_rows(ar, r, axis: int = 0):
    """Pairwise tree sum over `axis` (size 16): r[0:8]+r[8:16], then 4, 2, 1 (§3, 2D)."""
    for half in (8, 4, 2, 1):
        lo, hi = lax.split(r, (half, half), axis=axis)
        r = ar.add(lo, hi)
    return r


def per_tile(reduce, a):
    """A per-16x16-tile reduction of a per-row block quantity a [R, NB] (R = 16 t rows, t tiles).

    `reduce(v, axis)` maps [.., 16, ..] to [.., 1, ..] along `axis`. One tile row gives [1, NB]
    (callers broadcast it); several give [R, NB], each tile's value repeated on its 16 rows."""
    rows, nb = a.shape
    if rows == BLOCK:
        return reduce(a, 0)
    tiles = rows // BLOCK
    r = reduce(a.reshape(tiles, BLOCK, nb), 1)
    return jnp.broadcast_to(r, (tiles, BLOCK, nb)).reshape(rows, nb)


def candidate_error(ar, xb, q, sf, amax, s_enc, config: ref.NVFP4Config):
    """Per-row block error of one 4/6 candidate: [R, NB] (sequential over the 16 elements)."""
    dec_sf = ar.mul(e2m1_decode(q), sf[..., None])  # exact (<= 6 significant bits)
    if config.fast_error:
        d = ar.sub(dec_sf, ar.mul(xb, s_enc[..., None]))
    else:
        v = ar.div(ar.mul(dec_sf, amax[..., None]), f32(6 * config.e4m3_bound))
        d = ar.sub(v, xb)
    e = fabs(d) if config.four_over_six == "mae" else ar.mul(d, d)
    return sequential_sum16(ar, e)


def quantize_blocks(ar, xb, amax, config: ref.NVFP4Config, uniform=None):
    """The whole per-block contract on one chunk of rows.

    xb: f32 [R, NB, 16] (R rows, NB blocks of 16 along K); for 2D, R is a multiple of 16 (tile rows).
    amax: f32 [R, 1] (the row's global A).
    uniform: None, or the draws of stochastic rounding (f32 [R, NB, 16]; not with 4/6, as the reference).
    Returns codes int32 [R, NB, 16], scale bytes int32 [R, NB], map4 bool [R, NB].
    """
    if uniform is not None and config.four_over_six is not None:
        raise ValueError("stochastic rounding (uniform) is not defined together with four_over_six")
    rows, nb, _ = xb.shape
    s_enc, s_dec = scales_from_amax(ar, amax, config.e4m3_bound)
    bmax = jnp.max(abs_bits(xb), axis=2)  # integer max: NaN-propagating, exact
    if config.block_2d:
        bmax = per_tile(lambda v, axis: jnp.max(v, axis=axis, keepdims=True), bmax)  # one b per 16x16 tile
    b = from_bits(bmax)
    if config.four_over_six is None:
        sf, byte = block_scale(ar, b, s_enc)
        codes = encode_with_scale(ar, xb, sf, s_dec, uniform)
        map4 = jnp.zeros((rows, nb), jnp.bool_)
        byte = jnp.broadcast_to(byte, (rows, nb))
        return codes, byte, map4
    (sf6, byte6), (sf4, byte4) = four_over_six_scales(ar, b, s_enc)
    q6 = encode_with_scale(ar, xb, sf6, s_dec)
    q4 = encode_with_scale(ar, xb, sf4, s_dec)
    err6 = candidate_error(ar, xb, q6, sf6, amax, s_enc, config)
    err4 = candidate_error(ar, xb, q4, sf4, amax, s_enc, config)
    if config.block_2d:
        tile_err = functools.partial(per_tile, lambda v, axis: tree_sum16_rows(ar, v, axis))
        err6, err4 = tile_err(err6), tile_err(err4)  # one error per 16x16 tile
    map4 = jnp.broadcast_to(less_nonneg(err4, err6), (rows, nb))  # strict: ties go to map-6
    byte = jnp.where(map4, jnp.broadcast_to(byte4, (rows, nb)), jnp.broadcast_to(byte6, (rows, nb)))
    codes = jnp.where(map4[..., None], q4, q6)
    return codes, byte, map4


def less_nonneg(a, b):
    """a < b for floats that are >= 0 or NaN, compared on the bits (so no FTZ compare can
    merge two subnormal errors); False where either is NaN, as the float compare."""
    return (abs_bits(a) < abs_bits(b)) & ~is_nan(a) & ~is_nan(b)


def bf16_to_f32(x):
    """bfloat16 -> float32 exactly, on the bits (subnormals kept on every backend)."""
    bits = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    return lax.bitcast_convert_type(lax.shift_left(bits, np.uint32(16)), jnp.float32)


def f32_to_bf16(v):
    """float32 -> bfloat16, nearest-even, on the bits (subnormals kept; NaN -> quiet NaN)."""
    bits = lax.bitcast_convert_type(v, jnp.uint32)
    lsb = lax.shift_right_logical(bits, np.uint32(16)) & np.uint32(1)
    rounded = lax.shift_right_logical(bits + np.uint32(0x7FFF) + lsb, np.uint32(16))
    quiet_nan = lax.shift_right_logical(bits, np.uint32(16)) | np.uint32(0x40)
    out = jnp.where(is_nan(v), quiet_nan, rounded).astype(jnp.uint16)
    return lax.bitcast_convert_type(out, jnp.bfloat16)


def pack_codes(codes):
    """codes int32 [R, K] -> bytes uint8 [R, K/2], element 2j in the low nibble."""
    rows, k = codes.shape
    lo, hi = lax.split(codes.reshape(rows, k // 2, 2), (1, 1), axis=2)
    packed = lo.reshape(rows, k // 2) | lax.shift_left(hi.reshape(rows, k // 2), np.int32(4))
    return packed.astype(jnp.uint8)


def unpack_codes(packed):
    """bytes [R, K/2] (uint8) -> codes int32 [R, K]."""
    rows, half = packed.shape
    p = packed.astype(jnp.int32)
    lo = p & np.int32(15)
    hi = lax.shift_right_logical(p, np.int32(4)) & np.int32(15)
    return jnp.stack([lo, hi], axis=-1).reshape(rows, 2 * half)


def dequant_s_dec(ar, amax, e4m3_bound: int):
    """S_dec per row for dequantization: NaN where the amax is not finite (§8)."""
    _, s_dec = scales_from_amax(ar, amax, e4m3_bound)
    finite = abs_bits(amax) < np.int32(0x7F800000)
    return jnp.where(finite, s_dec, f32(np.nan))
