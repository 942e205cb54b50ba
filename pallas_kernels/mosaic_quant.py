"""Fused NVFP4 (+ Four-Over-Six) quantizer as a Pallas **Mosaic GPU** kernel (Hopper, sm_90a).

Reproduces `fp4rl.formats.nvfp4.quantize` byte for byte (NUMERICS.md s1-s3, s8): packed E2M1
codes (uint8 [M, K/2], element 2j in the low nibble), E4M3 block scales (float8_e4m3fn
[M, K/16]), the global amax (f32 `()` per tensor, `[M, 1]` per token) and the 4/6 choice.

Kernel shape (why it looks like this)
-------------------------------------
Mosaic GPU arrays live in registers with a *layout*; cross-thread reductions are tree
shaped and reshapes of a register array are limited. The contract, however, fixes a
*sequential* f32 sum over the 16 elements of a block (s3), so a reduction over a lane axis
is not allowed. We therefore use one CUDA thread per row: a program owns `block_m` rows
(a multiple of the 128 threads of a warpgroup), and every array in the body is a 1D
`[block_m]` array in the strided layout (one element per thread). A block of 16 elements is
16 such arrays (the 16 K-columns of the block, loaded from a strided GMEM view), so every
reduction of the contract (block max, error sum, per-token amax) is a per-thread chain of
elementwise ops in exactly the contract's order. A `fori_loop` walks the K/16 blocks.

Bit-exactness details
---------------------
* Mosaic GPU emits f32 add/sub/mul with the `contract` fast-math flag (FMA allowed,
  `mosaic/gpu/fragmented_array.py`). Every product that feeds an add/sub in the contract and
  is *not* exact (`x * S_enc` of the fast 4/6 error) goes through `lax.optimization_barrier`,
  which Mosaic lowers to opaque inline asm, so no FMA can form. Products that are exact
  (`dec(q) * sf`, `t * 512`) give the same result fused or not.
* Division and the MSE square are computed from integer ops (`fp4rl.formats.ieee`:
  `integer_divide`, `integer_square`): the compiled kernel's f32 divisions (also via f64) were
  one ulp off in about a third of the rows and its MSE squares disagreed in rare blocks
  (`tools/mosaic_probe.py`, session 5, H200).
* f32 max/min lower to `max.NaN`/`min.NaN` (NaN-propagating like jnp); block and row maxima
  are taken on the integer bits of |x| (NaN sorts above Inf), as in `pallas_kernels.common`.
* E4M3 rounding is integer RNE on the f32 bits (normals) and the 2^23 trick (subnormals);
  E2M1 codes are compares; no float8/float4 casts are emitted in the kernel.

Kernels (each has a name that appears in the lowered program):
* `fp4rl_mosaic_nvfp4_quant`  the quantizer (per-token amax computed in-kernel, or given).
* `fp4rl_mosaic_nvfp4_amax`   per-row amax, used for a per-tensor amax that is not given
  (the max over the M row maxima is then one tiny XLA reduce).
* `fp4rl_mosaic_nvfp4_dequant` dequantization (s2 order `fl(fl(dec(q)*sf)*S_dec)`).

The 16x16 (2D) weight form is not implemented in this backend (raises NotImplementedError).

Interpret mode: jax 0.11.2 has a Mosaic GPU interpreter (`plgpu.InterpretGPUParams`) that runs
on CPU; `interpret=True` uses it.

Status (H200, jax 0.11.2, session 5): the bf16 failures of session 4 were 1-ulp divisions that
bf16's short significands put on rounding boundaries often. With the integer division every
map-to-6 and MAE case of the compiled suite passed and two bf16 MSE cases failed in single
blocks; with the integer square those and every other compiled test that ran passed (which
tests did not run on the final code: benchmarks/README.md).
Slow: one thread per row with strided scalar loads (~4-7% of the copy bandwidth).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4rl.formats import ieee
from fp4rl.formats import nvfp4 as ref
from pallas_kernels import common as cm

BLOCK = 16
WARPGROUP = 128  # CUDA threads of one Mosaic GPU "thread" (a warpgroup) = rows per 128
QUANT_KERNEL_NAME = "fp4rl_mosaic_nvfp4_quant"
AMAX_KERNEL_NAME = "fp4rl_mosaic_nvfp4_amax"
DEQUANT_KERNEL_NAME = "fp4rl_mosaic_nvfp4_dequant"


@dataclasses.dataclass(frozen=True)
class MosaicQuantTiling:
    """Tunables of the Mosaic GPU quantizer, validated before tracing.

    block_m: rows per program (one CUDA thread per row; a multiple of 128).
    block_k: K columns per program when the amax is known before the kernel (per tensor, or
      a given per-token amax); None = all of K. With the amax computed in-kernel (per token)
      a program needs its whole rows, so block_k must be None there.
    """

    block_m: int = 128
    block_k: int | None = None

    def __post_init__(self):
        if self.block_m <= 0 or self.block_m % WARPGROUP:
            raise ValueError(f"block_m={self.block_m} must be a positive multiple of {WARPGROUP} (one thread per row)")
        if self.block_k is not None and (self.block_k <= 0 or self.block_k % BLOCK):
            raise ValueError(f"block_k={self.block_k} must be a positive multiple of block={BLOCK}")


def _interpret_param(interpret: bool):
    return plgpu.InterpretGPUParams() if interpret else None


# ----------------------------------------------------------------------------------------
# Element math on [block_m] arrays (one element per thread). Contract order, s2/s3.
# ----------------------------------------------------------------------------------------


def _f32(c):
    return np.float32(c)


def _div(a, b):
    """IEEE f32 division fl(a / b), correctly rounded, from integer operations.

    Mosaic GPU compiles an f32 `arith.divf` to `div.full.f32` (approximate, seen in the dumped
    PTX), and the float64 detour this kernel used before (divide in f64, round to f32) was one
    ulp off in compiled kernels too (`tools/mosaic_probe.py`, session 5). So the quotient comes
    from integer operations (`ieee.integer_divide`, the XLA:GPU reference's division too); NaN
    results from the platform's own division (their payload and sign are the platform's).
    """
    return ieee.integer_divide(a, b, lambda x, y: x / y, unroll=False)


class _ExactArith(cm.PlainArith):
    """`cm.PlainArith` with the correctly rounded division above."""

    div = staticmethod(_div)


def _no_fma(v):
    """Materialise a rounded f32 product before an add/sub (Mosaic allows FMA contraction)."""
    return lax.optimization_barrier(v)


def _e4m3_round(t):
    """E4M3 RNE of t in [0, 448] or NaN (already clamped): (value as f32, byte as int32).

    Normals (t >= 2^-6): integer RNE of the f32 bits to 3 mantissa bits. Subnormals:
    quantum 2^-9, `lax.round(t * 512, TO_NEAREST_EVEN)` (Mosaic: `round_even`; t * 512 is
    exact). Not the `(y + 2^23) - 2^23` trick: XLA:CPU folds that to `y` under jit, which
    would break interpret mode. NaN -> byte 0x7F (the NaN scale here is always positive).
    """
    bits = lax.bitcast_convert_type(t, jnp.int32)
    normal = t >= _f32(2.0**-6)
    lsb = lax.shift_right_logical(bits, np.int32(20)) & np.int32(1)
    rbits = (bits + np.int32(0x7FFFF) + lsb) & np.int32(~0xFFFFF)
    n = lax.round(t * _f32(512.0), lax.RoundingMethod.TO_NEAREST_EVEN)  # an integer 0..8
    value = jnp.where(normal, cm.from_bits(rbits), n * _f32(2.0**-9))
    byte = jnp.where(
        normal,
        lax.shift_right_logical(rbits, np.int32(20)) - np.int32(960),  # (exp - 120) << 3 | mant
        n.astype(jnp.int32),
    )
    return value, jnp.where(t != t, np.int32(0x7F), byte)


def _encode(col, inv):
    return cm.e2m1_encode(col * inv)


def _inv_scale(sf, s_dec):
    return cm.min_nan(_div(_f32(1), sf * s_dec), cm.FLT_MAX)


def _element_error(x, inv, sf, amax, s_enc, config: ref.NVFP4Config):
    """e(d) of s3 for one element of one 4/6 candidate (exact or fast error; MAE or MSE)."""
    dec_sf = cm.e2m1_decode(_encode(x, inv)) * sf  # exact (<= 6 significant bits)
    if config.fast_error:
        d = dec_sf - _no_fma(x * s_enc)
    else:
        d = _div(dec_sf * amax, _f32(6 * config.e4m3_bound)) - x
    # MSE: the square from integer ops (`ieee.integer_square`): the float product, even behind a
    # barrier, disagreed with the contract in rare compiled blocks (session-5 probe).
    return cm.fabs(d) if config.four_over_six == "mae" else ieee.integer_square(d, lambda v: v * v)


def _fold16(load, first, step):
    """Sequential fold over the 16 columns of a block: acc = first(x_0); acc = step(acc, x_i).

    A `fori_loop` (not a Python loop) keeps the emitted Mosaic program small; the order is
    the contract's i = 0..15.
    """
    return lax.fori_loop(np.int32(1), np.int32(BLOCK), lambda i, acc: step(acc, load(i)), first(load(np.int32(0))))


def _quantize_block(load, amax, s_enc, s_dec, config: ref.NVFP4Config):
    """One block (load(i) -> column i as f32 [block_m]) -> (inv, scale byte, map4 or None).

    The codes are then E2M1(fl(x_i * inv)) with the chosen candidate's inv: selecting inv
    and re-encoding gives the same codes as selecting between q4 and q6.
    """
    bits = _fold16(load, cm.abs_bits, lambda m, x: jnp.maximum(m, cm.abs_bits(x)))
    b = cm.from_bits(bits)  # integer max of |x| bits: NaN-propagating, exact
    cap = cm.E4M3_MAX
    if config.four_over_six is None:
        k = s_enc * _f32(cm.ONE_SIXTH)
        sf, byte = _e4m3_round(cm.min_nan(b * k, cap))
        return _inv_scale(sf, s_dec), byte, None
    base = _div(b, _f32(6.0)) * s_enc  # divide, then multiply
    sf6, byte6 = _e4m3_round(cm.min_nan(base, cap))
    sf4, byte4 = _e4m3_round(cm.min_nan(base * _f32(1.5), cap))
    inv6, inv4 = _inv_scale(sf6, s_dec), _inv_scale(sf4, s_dec)

    def errs(x):
        return (_element_error(x, inv6, sf6, amax, s_enc, config), _element_error(x, inv4, sf4, amax, s_enc, config))

    err6, err4 = _fold16(load, errs, lambda acc, x: tuple(a + e for a, e in zip(acc, errs(x))))
    map4 = err4 < err6  # strict: ties go to map-6
    return jnp.where(map4, inv4, inv6), jnp.where(map4, byte4, byte6), map4


def _pack_pair(lo, hi):
    return (lo | lax.shift_left(hi, np.int32(4))).astype(jnp.uint8)


# ----------------------------------------------------------------------------------------
# Kernel bodies
# ----------------------------------------------------------------------------------------


def _row_start(m_total: int, block_m: int):
    # The last program overlaps the previous one instead of reading past M (M >= block_m
    # is guaranteed by the wrapper): overlapping rows are recomputed to identical bytes.
    return jnp.minimum(lax.axis_index("m") * block_m, m_total - block_m)


def _load_col(x_ref, rows, c):
    return x_ref.at[rows, c][...].astype(jnp.float32)


def _row_amax_bits(x_ref, rows, k: int):
    """Per-row max|x| over all K columns as int32 bits (each thread walks its own row)."""

    def block_bits(j):
        return _fold16(
            lambda i: _load_col(x_ref, rows, j * BLOCK + i), cm.abs_bits, lambda m, x: jnp.maximum(m, cm.abs_bits(x))
        )

    def body(j, m):
        return jnp.maximum(m, block_bits(j))

    first = block_bits(np.int32(0))
    return lax.fori_loop(np.int32(1), np.int32(k // BLOCK), body, first)


def _make_quant_body(m_total, k, block_m, block_k, config: ref.NVFP4Config, amax_mode: str):
    """amax_mode: "compute" (per token, in-kernel) or "token" (given per row [M]; a per-tensor
    amax comes broadcast to every row)."""
    nblk = block_k // BLOCK
    six_e_bound = config.e4m3_bound

    def quantize_cols(x_ref, codes_ref, scales_ref, map4_ref, rows, amax):
        s_enc, s_dec = cm.scales_from_amax(_ExactArith, amax, six_e_bound)
        k0 = lax.axis_index("k") * nblk  # first block of this program

        def body(j, carry):
            blk = k0 + j

            def load(i):
                return _load_col(x_ref, rows, blk * BLOCK + i)

            inv, byte, map4 = _quantize_block(load, amax, s_enc, s_dec, config)

            def pack(p, c):
                codes_ref.at[rows, blk * (BLOCK // 2) + p][...] = _pack_pair(
                    _encode(load(2 * p), inv), _encode(load(2 * p + 1), inv)
                )
                return c

            lax.fori_loop(np.int32(0), np.int32(BLOCK // 2), pack, np.int32(0))
            scales_ref.at[rows, blk][...] = byte.astype(jnp.uint8)
            flag = jnp.zeros_like(byte) if map4 is None else jnp.where(map4, np.int32(1), np.int32(0))
            map4_ref.at[rows, blk][...] = flag.astype(jnp.uint8)
            return carry

        lax.fori_loop(np.int32(0), np.int32(nblk), body, np.int32(0))

    if amax_mode == "compute":

        def kernel(x_ref, codes_ref, scales_ref, map4_ref, amax_out_ref):
            rows = pl.ds(_row_start(m_total, block_m), block_m)
            # max(., 0) is `max.NaN.f32` on the GPU: a NaN amax comes out as the canonical NaN
            # 0x7FFFFFFF, as XLA's reduce in the reference, not with the input's payload.
            amax = jnp.maximum(cm.from_bits(_row_amax_bits(x_ref, rows, k)), _f32(0))
            amax_out_ref.at[rows][...] = amax
            quantize_cols(x_ref, codes_ref, scales_ref, map4_ref, rows, amax)

    else:

        def kernel(x_ref, amax_ref, codes_ref, scales_ref, map4_ref):
            rows = pl.ds(_row_start(m_total, block_m), block_m)
            quantize_cols(x_ref, codes_ref, scales_ref, map4_ref, rows, amax_ref.at[rows][...])

    return kernel


@functools.lru_cache(maxsize=None)
def _quant_call(m_total, k, dtype, config, amax_mode, tiling: MosaicQuantTiling, interpret: bool):
    block_m = tiling.block_m
    block_k = k if (tiling.block_k is None or amax_mode == "compute") else tiling.block_k
    if k % block_k:
        raise ValueError(f"{k=} must be a multiple of block_k={block_k}")
    out_type = [
        jax.ShapeDtypeStruct((m_total, k // 2), jnp.uint8),
        jax.ShapeDtypeStruct((m_total, k // BLOCK), jnp.uint8),
        jax.ShapeDtypeStruct((m_total, k // BLOCK), jnp.uint8),
    ]
    if amax_mode == "compute":
        out_type.append(jax.ShapeDtypeStruct((m_total,), jnp.float32))
    body = _make_quant_body(m_total, k, block_m, block_k, config, amax_mode)
    return plgpu.kernel(
        body,
        out_type=tuple(out_type),
        grid=(pl.cdiv(m_total, block_m), k // block_k),
        grid_names=("m", "k"),
        kernel_name=QUANT_KERNEL_NAME,
        interpret=_interpret_param(interpret),
    )


@functools.lru_cache(maxsize=None)
def _amax_call(m_total, k, dtype, tiling: MosaicQuantTiling, interpret: bool):
    block_m = tiling.block_m

    def kernel(x_ref, amax_out_ref):
        rows = pl.ds(_row_start(m_total, block_m), block_m)
        amax_out_ref.at[rows][...] = cm.from_bits(_row_amax_bits(x_ref, rows, k))

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((m_total,), jnp.float32),
        grid=(pl.cdiv(m_total, block_m),),
        grid_names=("m",),
        kernel_name=AMAX_KERNEL_NAME,
        interpret=_interpret_param(interpret),
    )


@functools.lru_cache(maxsize=None)
def _dequant_call(m_total, k, out_dtype, e4m3_bound, tiling: MosaicQuantTiling, interpret: bool):
    block_m = tiling.block_m

    def kernel(codes_ref, scales_ref, amax_ref, out_ref):
        rows = pl.ds(_row_start(m_total, block_m), block_m)
        amax = amax_ref.at[rows][...]
        _, s_dec = cm.scales_from_amax(_ExactArith, amax, e4m3_bound)
        finite = cm.abs_bits(amax) < np.int32(0x7F800000)
        s_dec = jnp.where(finite, s_dec, _f32(np.nan))  # s8: a non-finite amax -> NaN

        def body(j, carry):
            sf = cm.e4m3_decode(scales_ref.at[rows, j][...].astype(jnp.int32))
            for p in range(BLOCK // 2):
                byte = codes_ref.at[rows, j * (BLOCK // 2) + p][...].astype(jnp.int32)
                for h, code in enumerate((byte & np.int32(15), lax.shift_right_logical(byte, np.int32(4)))):
                    v = (cm.e2m1_decode(code) * sf) * s_dec
                    out_ref.at[rows, j * BLOCK + 2 * p + h][...] = v.astype(out_dtype)
            return carry

        lax.fori_loop(np.int32(0), np.int32(k // BLOCK), body, np.int32(0))

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((m_total, k), out_dtype),
        grid=(pl.cdiv(m_total, block_m),),
        grid_names=("m",),
        kernel_name=DEQUANT_KERNEL_NAME,
        interpret=_interpret_param(interpret),
    )


# ----------------------------------------------------------------------------------------
# Public wrappers
# ----------------------------------------------------------------------------------------


def _check_2d(shape, what):
    if len(shape) != 2:
        raise ValueError(f"{what} takes a 2D array [M, K], got shape {shape}")


def _pad_rows(a, block_m):
    """Pad rows up to one program (tiny inputs only; larger M uses overlapping last tiles)."""
    m = a.shape[0]
    if m >= block_m:
        return a
    return jnp.pad(a, [(0, block_m - m)] + [(0, 0)] * (a.ndim - 1))


def quantize_mosaic(
    x,
    config: ref.NVFP4Config = ref.NVFP4Config(),
    *,
    amax=None,
    interpret: bool = False,
    tiling: MosaicQuantTiling = MosaicQuantTiling(),
) -> ref.NVFP4Tensor:
    """`fp4rl.formats.nvfp4.quantize(x, config, amax=amax)` as a Mosaic GPU kernel (same bytes).

    x: float32 or bfloat16 [M, K], K a multiple of 16. amax: optional global amax, `()` per
    tensor or `[M, 1]` per token; by default computed from x (per token: inside the quantizer
    kernel; per tensor: row maxima in `fp4rl_mosaic_nvfp4_amax`, then their max).
    interpret=True runs the Mosaic GPU interpreter (CPU); interpret=False needs a CUDA GPU
    (Hopper or newer) and raises otherwise.
    """
    cm.require_gpu(interpret, "quantize_mosaic")
    cm.check_input(x, config)
    _check_2d(jnp.shape(x), "quantize_mosaic")
    if config.block_2d:
        raise NotImplementedError("quantize_mosaic: the 16x16 (2D) weight form is not implemented in the Mosaic backend")
    x = jnp.asarray(x)
    if x.dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise TypeError(f"quantize_mosaic takes float32 or bfloat16 input, got {x.dtype}")
    m, k = x.shape
    if m == 0:
        raise ValueError("quantize_mosaic needs at least one row (M >= 1)")
    xp = _pad_rows(x, tiling.block_m)
    mp = xp.shape[0]
    if config.scale == "token":
        if amax is None:
            codes, scales, map4, amax_rows = _quant_call(mp, k, xp.dtype, config, "compute", tiling, interpret)(xp)
            amax_out = amax_rows[:m, None]
        else:
            amax_out = jnp.asarray(amax, jnp.float32)
            if amax_out.shape != (m, 1):
                raise ValueError(f"a per-token amax must have shape {(m, 1)}, got {amax_out.shape}")
            codes, scales, map4 = _quant_call(mp, k, xp.dtype, config, "token", tiling, interpret)(
                xp, _pad_rows(amax_out[:, 0], tiling.block_m)
            )
    else:
        if amax is None:
            rows_amax = _amax_call(mp, k, xp.dtype, tiling, interpret)(xp)
            amax_out = jnp.max(rows_amax[:m])
        else:
            amax_out = jnp.asarray(amax, jnp.float32)
            if amax_out.shape != ():
                raise ValueError(f"a per-tensor amax must have shape (), got {amax_out.shape}")
        # The per-tensor amax reaches the kernel as one value per row: a scalar read from a ref
        # fails to lower in Mosaic GPU ("Scalars must be represented by non-vector types", seen
        # compiled on the H200), the per-row vector form is the "token" kernel's, which lowers.
        amax_rows = jnp.broadcast_to(amax_out.reshape(1), (mp,))
        codes, scales, map4 = _quant_call(mp, k, xp.dtype, config, "token", tiling, interpret)(xp, amax_rows)
    return cm.assemble(codes[:m], scales[:m], map4[:m] != 0, amax_out, config, (m,), k)


def dequantize_mosaic(
    t: ref.NVFP4Tensor,
    dtype=jnp.bfloat16,
    *,
    interpret: bool = False,
    tiling: MosaicQuantTiling = MosaicQuantTiling(),
):
    """`fl(fl(dec(q) * f32(sf)) * S_dec)` cast to `dtype`, as a Mosaic GPU kernel (s2, s8).

    Same values as `fp4rl.formats.nvfp4.dequantize(t, dtype)` for 1D-block tensors [M, K].
    """
    cm.require_gpu(interpret, "dequantize_mosaic")
    _check_2d(t.codes.shape, "dequantize_mosaic")
    m, half = t.codes.shape
    k = 2 * half
    amax_rows = jnp.broadcast_to(jnp.asarray(t.amax, jnp.float32).reshape(-1), (m,)) if t.config.scale == "tensor" \
        else jnp.asarray(t.amax, jnp.float32).reshape(m)
    scale_bytes = lax.bitcast_convert_type(t.scales, jnp.uint8)
    call = _dequant_call(max(m, tiling.block_m), k, jnp.dtype(dtype), t.config.e4m3_bound, tiling, interpret)
    out = call(
        _pad_rows(t.codes, tiling.block_m), _pad_rows(scale_bytes, tiling.block_m), _pad_rows(amax_rows, tiling.block_m)
    )
    return out[:m]
