"""The NVFP4 block contract (docs/numerics.md §1-§3, §8) on Mosaic GPU register arrays.

Every array here is a 1D `[block_m]` array in the strided layout, one element per CUDA
thread (`mosaic` explains why), so every reduction of the contract is a
per-thread chain of elementwise ops in exactly the contract's order. A block is read through
`load(r, i)` -> column i of row r (one row for 1x16 blocks, 16 for a 16x16 tile).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4rl.formats import ieee
from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import block_math as bm

BLOCK = bm.BLOCK


def f32(c):
    return np.float32(c)


def divide(a, b):
    """IEEE f32 division fl(a / b), correctly rounded, from integer operations.

    Mosaic GPU compiles an f32 `arith.divf` to `div.full.f32` (approximate, seen in the dumped
    PTX), and a float64 detour (divide in f64, round to f32) is one ulp off in compiled kernels
    too (`tools/mosaic_probe.py`, H200). So the quotient comes
    from integer operations (`ieee.integer_divide`, the XLA:GPU reference's division too); NaN
    results from the platform's own division (their payload and sign are the platform's).
    """
    return ieee.integer_divide(a, b, lambda x, y: x / y, unroll=False)


class ExactArith(bm.PlainArith):
    """`block_math.PlainArith` with the correctly rounded division above."""

    div = staticmethod(divide)


def no_fma(v):
    """Materialise a rounded f32 product before an add/sub (Mosaic allows FMA contraction)."""
    return lax.optimization_barrier(v)


def e4m3_round(t):
    """E4M3 RNE of t in [0, 448] or NaN (already clamped): (value as f32, byte as int32).

    Normals (t >= 2^-6): integer RNE of the f32 bits to 3 mantissa bits. Subnormals:
    quantum 2^-9, `lax.round(t * 512, TO_NEAREST_EVEN)` (Mosaic: `round_even`; t * 512 is
    exact). Not the `(y + 2^23) - 2^23` trick: XLA:CPU folds that to `y` under jit, which
    would break interpret mode. NaN -> byte 0x7F (the NaN scale here is always positive).
    """
    bits = lax.bitcast_convert_type(t, jnp.int32)
    normal = t >= f32(2.0**-6)
    lsb = lax.shift_right_logical(bits, np.int32(20)) & np.int32(1)
    rbits = (bits + np.int32(0x7FFFF) + lsb) & np.int32(~0xFFFFF)
    n = lax.round(t * f32(512.0), lax.RoundingMethod.TO_NEAREST_EVEN)  # an integer 0..8
    value = jnp.where(normal, bm.from_bits(rbits), n * f32(2.0**-9))
    byte = jnp.where(
        normal,
        lax.shift_right_logical(rbits, np.int32(20)) - np.int32(960),  # (exp - 120) << 3 | mant
        n.astype(jnp.int32),
    )
    return value, jnp.where(t != t, np.int32(0x7F), byte)


def encode(col, inv):
    return bm.e2m1_encode(col * inv)


def inv_scale(sf, s_dec):
    return bm.min_nan(divide(f32(1), sf * s_dec), bm.FLT_MAX)


def element_error(x, inv, sf, amax, s_enc, config: ref.NVFP4Config):
    """e(d) of §3 for one element of one 4/6 candidate (exact or fast error; MAE or MSE)."""
    dec_sf = bm.e2m1_decode(encode(x, inv)) * sf  # exact (<= 6 significant bits)
    if config.fast_error:
        d = dec_sf - no_fma(x * s_enc)
    else:
        d = divide(dec_sf * amax, f32(6 * config.e4m3_bound)) - x
    # MSE: the square from integer ops (`ieee.integer_square`): the float product, even behind a
    # barrier, disagrees with the contract in rare compiled blocks (`tools/mosaic_probe.py --mse`).
    return bm.fabs(d) if config.four_over_six == "mae" else ieee.integer_square(d, lambda v: v * v)


def fold16(load, first, step):
    """Sequential fold over the 16 columns of a block: acc = first(x_0); acc = step(acc, x_i).

    A `fori_loop` (not a Python loop) keeps the emitted Mosaic program small; the order is
    the contract's i = 0..15.
    """
    return lax.fori_loop(np.int32(1), np.int32(BLOCK), lambda i, acc: step(acc, load(i)), first(load(np.int32(0))))


def tree_sum16(r):
    """Pairwise tree sum of the 16 row errors of a 2D tile (§3): r[0:8]+r[8:16], then 4, 2, 1.
    (`block_math.tree_sum16_rows` on a list: Mosaic GPU register arrays are not stacked.)"""
    for half in (8, 4, 2, 1):
        r = [r[i] + r[i + half] for i in range(half)]
    return r[0]


def for_rows(band: int, body, init):
    """carry = body(r, carry) for the rows r of a unit: a `fori_loop` over a 16-row band (a
    Python-unrolled band makes 2D 4/6 programs that take minutes to compile on an H200), a
    direct call for a single row (the 1D program stays loop-free)."""
    if band == 1:
        return body(np.int32(0), init)
    return lax.fori_loop(np.int32(0), np.int32(band), body, init)


def block_max_bits(load, band: int):
    """Integer max of |x| bits over a block's rows (load(r, i)): NaN-propagating, exact."""

    def row(r):
        return fold16(lambda i: load(r, i), bm.abs_bits, lambda m, x: jnp.maximum(m, bm.abs_bits(x)))

    first = row(np.int32(0))
    return first if band == 1 else for_rows(band, lambda r, m: jnp.maximum(m, row(r)), first)


def quantize_block(load, band: int, amax, s_enc, s_dec, config: ref.NVFP4Config):
    """One block -> (inv, scale byte, map4 or None), on [block_u] arrays.

    load(r, i) -> column i of row r of the block as f32 (band = 1 row for 1x16 blocks, 16 for
    a 16x16 tile). The codes are then E2M1(fl(x_i * inv)) with the chosen candidate's inv:
    selecting inv and re-encoding gives the same codes as selecting between q4 and q6.
    """
    b = bm.from_bits(block_max_bits(load, band))
    cap = bm.E4M3_MAX
    if config.four_over_six is None:
        k = s_enc * f32(bm.ONE_SIXTH)
        sf, byte = e4m3_round(bm.min_nan(b * k, cap))
        return inv_scale(sf, s_dec), byte, None
    base = divide(b, f32(6.0)) * s_enc  # divide, then multiply
    sf6, byte6 = e4m3_round(bm.min_nan(base, cap))
    sf4, byte4 = e4m3_round(bm.min_nan(base * f32(1.5), cap))
    inv6, inv4 = inv_scale(sf6, s_dec), inv_scale(sf4, s_dec)

    def errs(x):
        return (element_error(x, inv6, sf6, amax, s_enc, config), element_error(x, inv4, sf4, amax, s_enc, config))

    def row_errors(r):  # (err6, err4) of row r: the sequential sum over its 16 elements
        return fold16(lambda i: load(r, i), errs, lambda acc, x: tuple(a + e for a, e in zip(acc, errs(x))))

    if band == 1:
        err6, err4 = row_errors(np.int32(0))
    else:
        # A tile's error is the tree sum of its 16 row errors, so the row loop carries all of
        # them: row r's pair is written into slots r and 16 + r by selects. The row number is
        # carried as an array too: a select on the scalar loop index needs an implicit
        # broadcast, which Mosaic GPU does not lower ("not implemented with warpgroup
        # semantics", jax 0.11.2).
        def body(r, carry):
            row, slots = carry
            e6, e4 = row_errors(r)
            new = (e6,) * BLOCK + (e4,) * BLOCK
            slots = tuple(jnp.where(row == np.int32(i % BLOCK), e, s) for i, (e, s) in enumerate(zip(new, slots)))
            return row + np.int32(1), slots

        init = (jnp.zeros_like(bm.abs_bits(b)), (jnp.zeros_like(b),) * (2 * BLOCK))  # int32 row, f32 slots
        _, slots = lax.fori_loop(np.int32(0), np.int32(band), body, init)
        err6, err4 = tree_sum16(list(slots[:BLOCK])), tree_sum16(list(slots[BLOCK:]))
    map4 = err4 < err6  # strict: ties go to map-6
    return jnp.where(map4, inv4, inv6), jnp.where(map4, byte4, byte6), map4


def pack_pair(lo, hi):
    return (lo | lax.shift_left(hi, np.int32(4))).astype(jnp.uint8)
