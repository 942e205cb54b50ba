"""The NVFP4 block contract on element planes: each thread owns whole 16-element blocks.

Why: the Triton compiler lays a `[rows, blocks, 16]` tile out across threads, so every
per-block step of the contract (the block max, the sequential 16-element error sum of 4/6, the
packing of code pairs) became a reshape/split that it lowers to shared-memory layout
conversions and shuffles (`tools/triton_sass.py` counts the sm_90 SASS instructions per 16
elements of each layout: this one needs about half). Here the input is loaded as *planes*:
plane j is the j-th 32-bit word of every block (`x_words[r, b, j]`; a thread loads its block's words four
at a time, 16 contiguous bytes, and splits them into planes in its registers), so a block's
16 elements are 16 separate `[rows, blocks]` tensors that the same thread holds. The block
max is 15 elementwise maxima, the error sum is the contract's sequential sum as written, and
the 16 codes of a block pack into two 32-bit words with shifts. No op crosses threads.

`quantize_planes` returns exactly the bytes of `block_math.quantize_blocks` (the
tiled form, itself pinned to `fp4rl.formats.nvfp4`): the scale math is the same helpers; the
E2M1 encoding is a different formulation of the same rounding (`e2m1_magnitude`, checked on
every rounding boundary in `tests/kernels/test_triton_planar.py`), and the shared suite compares
the whole kernel byte for byte, interpreted on CPU and compiled on the H200.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels.nvfp4_quant import block_math as bm

BLOCK = bm.BLOCK


def words_per_block(dtype) -> int:
    """32-bit words holding one 16-element block of `dtype` (8 for 16-bit floats, 16 for f32)."""
    return BLOCK * jnp.dtype(dtype).itemsize // 4


def as_words(x):
    """x [..., K] (f32/bf16/f16) -> uint32 [..., K * itemsize / 4], the same bytes."""
    itemsize = jnp.dtype(x.dtype).itemsize
    if itemsize == 4:
        return lax.bitcast_convert_type(x, jnp.uint32)
    *lead, k = x.shape
    return lax.bitcast_convert_type(x.reshape(*lead, k // 2, 2), jnp.uint32)


def unstack_quad(quad):
    """[..., 4] -> its 4 slices [...] in order, by two size-2 unstacks of the last axis (Triton
    lowers those to `tt.split`, which stays inside the thread that holds the 4 words)."""
    even, odd = lax.unstack(quad.reshape(*quad.shape[:-1], 2, 2), axis=-1)  # words (0, 2), (1, 3)
    w0, w2 = lax.unstack(even, axis=-1)
    w1, w3 = lax.unstack(odd, axis=-1)
    return [w0, w1, w2, w3]


def unstack_last(x):
    """[..., n] (n a power of two) -> its n slices [...] in order, by size-2 unstacks of the last
    axis (`tt.split` in Triton: no data leaves the thread that holds the axis)."""
    if x.shape[-1] == 1:
        return [x.reshape(x.shape[:-1])]
    even, odd = lax.unstack(x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2), axis=-1)
    return [v for pair in zip(unstack_last(even), unstack_last(odd)) for v in pair]


def elements_from_words(words, dtype):
    """The 16 f32 element planes of a block from its word planes (exact, subnormals kept).

    Little-endian: a word of two 16-bit floats holds element 2j in its low half.
    """
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return [lax.bitcast_convert_type(w, jnp.float32) for w in words]
    out = []
    for w in words:
        if dtype == jnp.bfloat16:  # bf16 bits are the top half of the f32 bits
            for bits in (lax.shift_left(w, np.uint32(16)), w & np.uint32(0xFFFF0000)):
                out.append(lax.bitcast_convert_type(bits, jnp.float32))
        else:  # float16: the exact widening conversion
            for half in (w & np.uint32(0xFFFF), lax.shift_right_logical(w, np.uint32(16))):
                out.append(lax.bitcast_convert_type(half.astype(jnp.uint16), jnp.float16).astype(jnp.float32))
    return out


def max_bits(bits):
    """Elementwise integer max over planes of |x| bits: NaN-propagating, flush-free."""
    m = bits[0]
    for b in bits[1:]:
        m = jnp.maximum(m, b)
    return m


def _pack(planes, fields):
    """16 32-bit planes -> 2 uint32 word planes; plane i's field goes to nibble i % 8 of word i // 8.

    fields(plane, i) returns that plane's bits already in place within its word (shift + mask)."""
    words = []
    for half in (planes[:8], planes[8:]):
        w = None
        for i, p in enumerate(half):
            f = fields(lax.bitcast_convert_type(p, jnp.uint32), i)
            w = f if w is None else w | f
        words.append(w)
    return words


def pack_magnitudes(mags):
    """Magnitude codes (the low 3 bits of each plane; higher bits ignored) -> 2 word planes."""
    return _pack(mags, lambda m, i: lax.shift_left(m, np.uint32(4 * i)) & np.uint32(7 << (4 * i)))


def pack_signs(values):
    """The sign bit of each f32 plane -> bit 3 of its nibble (the E2M1 sign), 2 word planes."""
    return _pack(values, lambda bits, i: lax.shift_right_logical(bits, np.uint32(28 - 4 * i)) & np.uint32(8 << (4 * i)))


# fl(a + C) rounds a to the E2M1 quantum of its range (RNE, ties to even) and leaves its code
# in the low mantissa bits: C = 2^22 (ulp 0.5) for [0, 2): mantissa 2q = code 0..4;
# C = 2^23 + 2 (ulp 1) for [2, 4): mantissa q + 2 = code 4..6; C = 2^24 + 8 (ulp 2) for [4, 6]:
# mantissa (8 + q) / 2 = code 6..7. The significand's parity is the code's, so "ties to even"
# is E2M1's, and fl(a + C) - C = q, the E2M1 magnitude itself (exact).
# C's bits come from a's biased exponent e without compares: with e' = max(e, 127) (a < 2 is
# one range), bits(C) = e' * 0x800002 + 0x0AFFFF02 gives 0x4A800000 (2^22), 0x4B000002 and
# 0x4B800004 (2^24 + 8) for e' = 127, 128, 129: three integer ops and no predicates (the
# compares + selects would make ptxas pack 16 predicates into a register and unpack them).
_ONE_BITS = np.int32(0x3F800000)  # 1.0f: max(bits(a), bits(1)) >> 23 = max(e, 127)
_OFFSET_SLOPE, _OFFSET_BASE = np.int32(0x800002), np.int32(0x0AFFFF02)


def e2m1_magnitude(ar, v, with_value=False):
    """|E2M1 code| of v (as `block_math.e2m1_encode`, in the low 3 bits of the result) and, if
    `with_value`, the code's magnitude |dec(q)| as f32 (exact), else None.

    One rounding add instead of seven compares; saturation is the clamp to 6 (NUMERICS s1:
    (5, 6] -> 6, 5 -> 4 by the tie rule). A NaN v (only in blocks whose inv is NaN) gives an
    arbitrary magnitude here: `combine_words` zeroes those blocks.
    """
    # min(|v|, 6): one FMNMX compiled (a NaN v may give 6 or NaN; its block is masked anyway)
    a = ar.clamp_abs(v, bm.f32(6.0))
    exponent = lax.shift_right_logical(jnp.maximum(lax.bitcast_convert_type(a, jnp.int32), _ONE_BITS), np.int32(23))
    offset = bm.from_bits(exponent * _OFFSET_SLOPE + _OFFSET_BASE)
    u = ar.fma(a, bm.f32(1.0), offset)  # fl(a + C), pinned (XLA would fold (a + C) - C)
    mag = lax.bitcast_convert_type(u, jnp.int32)
    return mag, (ar.sub(u, offset) if with_value else None)


def combine_words(magnitude_words, sign_words, inv):
    """Magnitudes | signs. Where inv is NaN (a NaN in the block or its amax) every fl(x * inv)
    is NaN, which E2M1 encodes as magnitude 0 with the NaN's sign bit: only the signs stay."""
    keep = jnp.where(bm.is_nan(inv), np.uint32(0), np.uint32(0x77777777))
    return [(m & keep) | s for m, s in zip(magnitude_words, sign_words)]


def candidate(ar, xs, sf, s_dec, with_values):
    """One candidate scale sf: (inv, the scaled values fl(x_i * inv), magnitude words, |dec(q_i)|)."""
    inv = bm.inverse_scale(ar, sf, s_dec)
    vs = [ar.mul(x, inv) for x in xs]
    mags, values = zip(*(e2m1_magnitude(ar, v, with_values) for v in vs))
    return inv, vs, pack_magnitudes(list(mags)), values


def candidate_error(ar, abs_xs, abs_xs_scaled, dec, sf, amax, config):
    """One 4/6 candidate's block error, the contract's sequential sum over i = 0..15.

    On magnitudes: dec(q_i) has the sign of x_i (inv > 0 outside NaN blocks, whose errors
    are NaN anyway), and RNE is symmetric, so |fl(dec*sf - x*S_enc)| = |fl(|dec*sf| - |x|*S_enc)|
    and likewise for the exact error. dec: |dec(q_i)|; abs_xs_scaled: fl(|x_i| * S_enc) (fast
    error) or None. |dec(q)| * sf is exact (<= 6 significant bits), so the fast error's
    fl(fl(dec*sf) - y) is one FMA, fl(dec*sf - y): the same single rounding, one op fewer. It is
    formed as fl(y - dec*sf) = -fl(dec*sf - y) (RNE is symmetric; |d| and d*d are unchanged),
    with -sf negated once per block on the bits (a float negation lowers as 0 - x).
    """
    total = None
    neg_sf = bm.from_bits(lax.bitcast_convert_type(sf, jnp.int32) ^ np.int32(-(2**31)))
    for i, x in enumerate(abs_xs):
        if config.fast_error:
            d = ar.fma(dec[i], neg_sf, abs_xs_scaled[i])
        else:
            d = ar.sub(ar.div(ar.mul(ar.mul(dec[i], sf), amax), bm.f32(6 * config.e4m3_bound)), x)
        e = ar.abs(d) if config.four_over_six == "mae" else ar.mul(d, d)
        total = e if total is None else ar.add(total, e)
    return total


def tile_rows(reduce, per_row, config):
    """16x16 tiles: a per-row block quantity [rows, blocks] reduced over each tile's 16 rows (rows a
    multiple of 16) and repeated on them (`block_math.per_tile`); 1x16 blocks: as it is."""
    if not config.block_2d:
        return per_row
    return jnp.broadcast_to(bm.per_tile(reduce, per_row), per_row.shape)


def quantize_planes(ar, xs, amax, config):
    """The per-block contract on element planes (1x16 blocks, or 16x16 tiles of 16 consecutive rows:
    the tile's max and its error, the tree sum of its rows' sequential errors, cross threads).

    xs: 16 f32 planes [rows, blocks]; amax: f32 [rows, 1] (the row's global A).
    Returns (2 uint32 code-word planes, scale bytes int32 [rows, blocks], map4 bool [rows, blocks]).
    """
    s_enc, s_dec = bm.scales_from_amax(ar, amax, config.e4m3_bound)
    abs_bits = [bm.abs_bits(x) for x in xs]
    b = bm.from_bits(tile_rows(lambda v, axis: jnp.max(v, axis=axis, keepdims=True), max_bits(abs_bits), config))
    if config.four_over_six is None:
        sf, byte = bm.block_scale(ar, b, s_enc)
        inv, vs, mag_words, _ = candidate(ar, xs, sf, s_dec, with_values=False)
        return combine_words(mag_words, pack_signs(vs), inv), byte, jnp.zeros(byte.shape, jnp.bool_)
    (sf6, byte6), (sf4, byte4) = bm.four_over_six_scales(ar, b, s_enc)
    abs_xs = [bm.from_bits(a) for a in abs_bits]
    abs_xs_scaled = [ar.mul(a, s_enc) for a in abs_xs] if config.fast_error else None
    inv6, vs6, mags6, dec6 = candidate(ar, xs, sf6, s_dec, with_values=True)
    _, _, mags4, dec4 = candidate(ar, xs, sf4, s_dec, with_values=True)
    tile_error = lambda v, axis: bm.tree_sum16_rows(ar, v, axis)  # noqa: E731
    err6 = tile_rows(tile_error, candidate_error(ar, abs_xs, abs_xs_scaled, dec6, sf6, amax, config), config)
    err4 = tile_rows(tile_error, candidate_error(ar, abs_xs, abs_xs_scaled, dec4, sf4, amax, config), config)
    map4 = bm.less_nonneg(err4, err6)  # strict: ties go to map-6 (and NaN errors: map-6)
    mags = [jnp.where(map4, m4, m6) for m6, m4 in zip(mags6, mags4)]
    # Signs of candidate 6's fl(x * inv6): x's signs, and the NaN's sign in NaN blocks (map-6 there).
    return combine_words(mags, pack_signs(vs6), inv6), jnp.where(map4, byte4, byte6), map4
