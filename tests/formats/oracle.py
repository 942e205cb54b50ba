"""An independent NumPy oracle of docs/numerics.md (NVFP4, Four-Over-Six, MXFP8, MXFP4).

Written from the contract alone, never from ``fp4rl.formats``, so that the pure-jnp reference
is itself under test (docs/design.md practice 2). Every ``fl(.)`` of the contract is one float32
NumPy operation on float32 operands (NumPy never fuses a multiply and an add, and under NEP 50
a float32 array op a float32 scalar stays float32); the module asserts the dtype of every
intermediate that matters. Element rounding uses ml_dtypes, which docs/numerics.md §1 names as the
oracle for E2M1; E4M3 goes through ml_dtypes after clamping to 448 (ml_dtypes turns values
past 448 into NaN).

Where the contract is silent the oracle makes the choice that is cheapest to state and the
tests do not compare bytes there (NaN inputs, -0.0 inputs, E8M0 exponents outside
[-127, 127]); see the docstrings.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(3.4028235e38)
ONE = F32(1.0)
SIX = F32(6.0)
ONE_SIXTH = ONE / SIX  # fl(1/6), docs/numerics.md §2
E4M3_MAX = F32(448.0)
E2M1_MAX = F32(6.0)
#: magnitudes of E2M1 codes 0..7 (codes 8..15 are the negatives, code 8 is -0).
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_DECODE = np.concatenate([E2M1_GRID, -E2M1_GRID]).astype(np.float32)

NVFP4_BLOCK = 16
MX_BLOCK = 32


def _f32(a) -> np.ndarray:
    a = np.asarray(a)
    assert a.dtype == np.float32, a.dtype
    return a


# --------------------------------------------------------------------------------------
# Element and scale types (docs/numerics.md §1)


def e2m1_codes(v) -> np.ndarray:
    """E2M1 codes 0..15 of float32 values: RNE, saturating at +-6, sign bit of v.

    Clipping to [-6, 6] first is exact and keeps the saturation independent of how ml_dtypes
    treats Inf. NaN has no E2M1 value: it gets code 0 with the NaN's sign bit (+-0), the codes
    the reference and the kernels write in a NaN block (whose scale byte is NaN, so the block
    dequantizes to NaN whatever its codes are, docs/numerics.md §8).
    """
    v = _f32(v)
    with np.errstate(invalid="ignore"):
        c = np.clip(v, -E2M1_MAX, E2M1_MAX)
    codes = c.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & np.uint8(0xF)
    nan_codes = np.signbit(v).astype(np.uint8) << np.uint8(3)
    return np.where(np.isnan(v), nan_codes, codes).astype(np.uint8)


def e2m1_decode(codes) -> np.ndarray:
    return E2M1_DECODE[np.asarray(codes, np.uint8)]


def round_up_probability(a):
    """(grid index of lo, (a - lo) / (hi - lo) in float64) for magnitudes a <= 6 (or NaN) in the E2M1
    grid interval [lo, hi): the probability of stochastic rounding (§6); 0 at 6, NaN for NaN."""
    a = np.asarray(a, np.float64)
    with np.errstate(invalid="ignore"):
        lo_index = np.sum(a[..., None] >= E2M1_GRID[1:].astype(np.float64), axis=-1)
        lo = E2M1_GRID[lo_index].astype(np.float64)
        hi = E2M1_GRID[np.minimum(lo_index + 1, 7)].astype(np.float64)
        return lo_index, np.where(hi > lo, (a - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)


def stochastic_e2m1_codes(v, u) -> np.ndarray:
    """E2M1 codes of float32 values rounded stochastically (docs/numerics.md §6) with the given
    uniform draws u in [0, 1): |v| (saturated at 6) rounds up to the next grid point iff
    u < `round_up_probability` (float64, exact here); sign bit of v; NaN -> +-0."""
    v, u = _f32(v), _f32(u)
    with np.errstate(invalid="ignore"):
        lo_index, p_up = round_up_probability(np.minimum(np.abs(v), E2M1_MAX))
        up = u.astype(np.float64) < p_up  # False for NaN
    magnitude = (lo_index + up).astype(np.uint8)
    return magnitude | (np.signbit(v).astype(np.uint8) << np.uint8(3))


def e4m3(v) -> np.ndarray:
    """float8_e4m3fn of float32 values: RNE with subnormals, saturating at +-448, NaN stays."""
    v = _f32(v)
    with np.errstate(invalid="ignore"):
        c = np.clip(v, -E4M3_MAX, E4M3_MAX)
    return c.astype(ml_dtypes.float8_e4m3fn)


def pack(codes) -> np.ndarray:
    """Two E2M1 codes per byte, element 2j in the low nibble (docs/numerics.md §1)."""
    c = np.asarray(codes, np.uint8)
    assert c.shape[-1] % 2 == 0
    return (c[..., 0::2] | (c[..., 1::2] << np.uint8(4))).astype(np.uint8)


def unpack(packed) -> np.ndarray:
    p = np.asarray(packed, np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), np.uint8)
    out[..., 0::2] = p & np.uint8(0xF)
    out[..., 1::2] = p >> np.uint8(4)
    return out


# --------------------------------------------------------------------------------------
# NVFP4 (docs/numerics.md §2, §3)


def resolve_e(four_over_six, e4m3_max) -> int:
    """E: the config's e4m3_max, else 256 with Four-Over-Six and 448 without (§2, §3)."""
    if e4m3_max is not None:
        return int(e4m3_max)
    return 256 if four_over_six is not None else 448


def global_scales(amax, e: int):
    """S_enc = fl(6E/A), capped at FLT_MAX, 1 when A == 0 or S_enc == 0; S_dec = fl(1/S_enc)."""
    a = _f32(np.asarray(amax, np.float32))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s_enc = F32(6 * e) / a  # 6E is exact in f32 (1536 or 2688)
        s_enc = np.minimum(s_enc, FLT_MAX)
        s_enc = np.where((a == 0) | (s_enc == 0), ONE, s_enc).astype(np.float32)
        s_dec = (ONE / s_enc).astype(np.float32)
    return _f32(s_enc), _f32(s_dec)


def _inv_scale(sf_f32, s_dec):
    """inv = min(fl(1 / fl(f32(sf) * S_dec)), FLT_MAX)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _f32(np.minimum(ONE / _f32(sf_f32 * s_dec), FLT_MAX))


def _seq_sum16(e):
    """Sequential float32 sum over the last axis (length 16), i = 0..15."""
    e = _f32(e)
    acc = np.zeros(e.shape[:-1], np.float32)
    for i in range(e.shape[-1]):
        acc = _f32(acc + e[..., i])
    return acc


def _tree_sum16(r, axis):
    """Pairwise tree sum of 16 row errors: r[0:8]+r[8:16], r[0:4]+r[4:8], r[0:2]+r[2:4], r0+r1."""
    r = np.moveaxis(_f32(r), axis, -1)
    assert r.shape[-1] == 16
    for half in (8, 4, 2, 1):
        r = _f32(r[..., :half] + r[..., half : 2 * half])
    return r[..., 0]


@dataclasses.dataclass
class NVFP4Ref:
    """Oracle output. Byte fields mirror NVFP4Tensor; the rest exposes the two candidates."""

    codes: np.ndarray  # uint8 [..., K//2]
    scales: np.ndarray  # uint8 [..., K//16], bytes of float8_e4m3fn
    amax: np.ndarray  # float32 () or [..., 1]
    map4: np.ndarray  # bool [..., K//16]
    e: int
    # candidates (4/6 only; for map-to-6 only the *6 fields are set)
    codes6: np.ndarray | None = None  # uint8 unpacked [..., K]
    sf6: np.ndarray | None = None  # float32 [..., K//16]
    codes4: np.ndarray | None = None
    sf4: np.ndarray | None = None
    err6: np.ndarray | None = None  # float32 [..., K//16] (1D) or per tile, repeated per row (2D)
    err4: np.ndarray | None = None


def _block_max_1d(ax):
    # ax: [..., G, 16] -> [..., G]; NaN propagates (np.max does)
    return _f32(np.max(ax, axis=-1))


def _block_max_2d(ax):
    # ax: [..., M, K] -> per-row view of the 16x16 tile max: [..., M, K//16]
    *lead, m, k = ax.shape
    t = ax.reshape(*lead, m // 16, 16, k // 16, 16)
    tmax = np.max(t, axis=(-3, -1))  # [..., M//16, K//16]
    return _f32(np.repeat(tmax, 16, axis=-2))


def _amax_out(amax, scale, batch_dims):
    """Per tensor: () (or the batch shape); per token: [..., 1]."""
    if scale == "tensor":
        return amax.reshape(amax.shape[:batch_dims])
    return amax


def quantize_nvfp4(
    x,
    *,
    block_2d: bool = False,
    scale: str = "tensor",
    four_over_six: str | None = None,
    e4m3_max: int | None = None,
    fast_error: bool = False,
    batch_dims: int = 0,
    amax=None,
    uniform=None,
) -> NVFP4Ref:
    """NVFP4 quantization of float32 ``x`` [..., K] (2D: [..., M, K]) per docs/numerics.md §2, §3.

    batch_dims: the first ``batch_dims`` axes hold independent tensors (as under jax.vmap):
    a per-tensor amax is then taken per batch entry (returned with the batch shape).
    amax: a given global amax (``()`` per tensor, ``[..., 1]`` per token) instead of max|x|.
    uniform: float32 draws of x's shape: the elements rounded stochastically with them (§6,
    `stochastic_e2m1_codes`; the scales are unchanged); not with Four-Over-Six.
    """
    assert uniform is None or four_over_six is None, "stochastic rounding is not defined with 4/6"
    x = np.asarray(x)
    assert x.dtype == np.float32, "the oracle takes float32 input"
    k = x.shape[-1]
    assert k % NVFP4_BLOCK == 0
    if block_2d:
        assert x.ndim >= 2 and x.shape[-2] % NVFP4_BLOCK == 0
        assert scale == "tensor", "2D tiles share one scale across 16 rows: per-tensor A only"
    e = resolve_e(four_over_six, e4m3_max)
    ax = np.abs(x)
    if amax is not None:
        assert scale in ("tensor", "token"), scale
        amax = _f32(np.asarray(amax, np.float32))
    elif scale == "tensor":
        red = tuple(range(batch_dims, x.ndim))
        # keepdims: broadcasts against the per-block arrays [..., G] (and, via [..., None],
        # against the per-element ones [..., G, 16]); reshaped to the batch shape on return.
        amax = _f32(np.max(ax, axis=red, keepdims=True))
    elif scale == "token":
        amax = _f32(np.max(ax, axis=-1, keepdims=True))
    else:
        raise AssertionError(scale)
    s_enc, s_dec = global_scales(amax, e)

    g = k // NVFP4_BLOCK
    xb = x.reshape(*x.shape[:-1], g, NVFP4_BLOCK)  # [..., G, 16]
    b = _block_max_2d(ax) if block_2d else _block_max_1d(ax.reshape(xb.shape))  # [..., G]
    # per-block views of the global scales: () stays (), [..., 1] broadcasts against [..., G]
    a_blk = amax
    s_enc_b, s_dec_b = s_enc, s_dec

    with np.errstate(all="ignore"):
        if four_over_six is None:
            kk = _f32(s_enc_b * ONE_SIXTH)
            sf = e4m3(np.minimum(_f32(b * kk), E4M3_MAX))
            sf32 = _f32(sf.astype(np.float32))
            inv = _inv_scale(sf32, s_dec_b)
            v = _f32(xb * inv[..., None])
            q = e2m1_codes(v) if uniform is None else stochastic_e2m1_codes(v, _f32(uniform).reshape(v.shape))
            q = q.reshape(x.shape)
            return NVFP4Ref(
                codes=pack(q),
                scales=sf.view(np.uint8),
                amax=_amax_out(amax, scale, batch_dims),
                map4=np.zeros(b.shape, bool),
                e=e,
                codes6=q,
                sf6=sf32,
            )

        base = _f32(_f32(b / SIX) * s_enc_b)  # divide, then multiply
        sf6 = e4m3(np.minimum(base, E4M3_MAX))
        sf4 = e4m3(np.minimum(_f32(base * F32(1.5)), E4M3_MAX))
        cands = []
        six_e = F32(6 * e)
        for sf in (sf6, sf4):
            sf32 = _f32(sf.astype(np.float32))
            inv = _inv_scale(sf32, s_dec_b)
            q = e2m1_codes(_f32(xb * inv[..., None]))  # [..., G, 16]
            dq = _f32(e2m1_decode(q) * sf32[..., None])  # exact
            if fast_error:
                d = _f32(dq - _f32(xb * s_enc_b[..., None]))
            else:
                v = _f32(_f32(dq * a_blk[..., None]) / six_e)
                d = _f32(v - xb)
            if four_over_six == "mae":
                err_el = _f32(np.abs(d))
            elif four_over_six == "mse":
                err_el = _f32(d * d)
            else:
                raise AssertionError(four_over_six)
            err = _seq_sum16(err_el)  # [..., G] (per row of the tile in 2D)
            if block_2d:
                *lead, m, gg = err.shape
                t = err.reshape(*lead, m // 16, 16, gg)
                err = np.repeat(_tree_sum16(t, axis=-2)[..., None, :], 16, axis=-2).reshape(err.shape)
            cands.append((sf, sf32, q.reshape(x.shape), err))
        (sf6b, sf6f, q6, e6), (sf4b, sf4f, q4, e4) = cands
        map4 = e4 < e6  # strict: ties go to map-6
        q = np.where(np.repeat(map4, NVFP4_BLOCK, axis=-1), q4, q6)
        scales = np.where(map4, sf4b.view(np.uint8), sf6b.view(np.uint8))
    return NVFP4Ref(
        codes=pack(q),
        scales=scales.astype(np.uint8),
        amax=_amax_out(amax, scale, batch_dims),
        map4=map4,
        e=e,
        codes6=q6,
        sf6=sf6f,
        codes4=q4,
        sf4=sf4f,
        err6=e6,
        err4=e4,
    )


def dequantize_nvfp4(codes, scales, amax, e: int) -> np.ndarray:
    """x_hat = fl(fl(dec(q) * f32(sf)) * S_dec) (docs/numerics.md §2), with §8 on top: a non-finite
    amax makes every output it governs NaN, and a block whose scale is NaN dequantizes to NaN."""
    q = unpack(codes)
    sf = np.asarray(scales, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    amax = np.asarray(amax, np.float32)
    _, s_dec = global_scales(amax, e)
    with np.errstate(all="ignore"):
        dq = _f32(e2m1_decode(q) * np.repeat(sf, NVFP4_BLOCK, axis=-1))
        out = _f32(dq * s_dec)
        out = np.where(np.isfinite(amax), out, F32(np.nan)).astype(np.float32)
    return out


# --------------------------------------------------------------------------------------
# MX formats (docs/numerics.md §5)


def _exponent_floor_log2(v):
    """floor(log2(v)) for finite v > 0, exactly (frexp: v = m * 2^ex with m in [0.5, 1))."""
    m, ex = np.frexp(v.astype(np.float64))
    return ex.astype(np.int64) - 1, m


@dataclasses.dataclass
class MXRef:
    elements: np.ndarray  # MXFP8: uint8 bytes of float8_e4m3fn [..., K]; MXFP4: packed codes [..., K//2]
    scales_e8m0: np.ndarray  # uint8 [..., K//32]
    finite_blocks: np.ndarray  # bool [..., K//32]: blocks whose amax is finite (bytes defined)


def quantize_mx(x, fmt: str) -> MXRef:
    """MXFP8 (RCEIL E8M0, E4M3 elements) or MXFP4 (OCP floor E8M0, E2M1 elements).

    Scale exponents below -127 clamp to -127 (byte 0, the smallest E8M0 power of two, which is
    then the smallest representable power >= the RCEIL target); the contract does not name this
    case, and it only arises for blocks whose amax is a float32 subnormal.
    """
    x = np.asarray(x)
    assert x.dtype == np.float32
    k = x.shape[-1]
    assert k % MX_BLOCK == 0
    xb = x.reshape(*x.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    with np.errstate(all="ignore"):
        amax = _f32(np.max(np.abs(xb), axis=-1))
        finite = np.isfinite(amax)
        safe = np.where(finite, amax, F32(1)).astype(np.float32)
        if fmt == "mxfp8":
            t = _f32(safe * (ONE / E4M3_MAX))  # fl(amax * fl(1/448))
            fl_log, m = _exponent_floor_log2(np.where(t > 0, t, F32(1)))
            exp = np.where(m == 0.5, fl_log, fl_log + 1)  # smallest power of two >= t
            exp = np.where(t > 0, exp, -127)
        elif fmt == "mxfp4":
            fl_log, _ = _exponent_floor_log2(np.where(safe > 0, safe, F32(1)))
            exp = np.where(safe > 0, fl_log - 2, -127)
        else:
            raise AssertionError(fmt)
        exp = np.clip(exp, -127, 127)
        scale_byte = (exp + 127).astype(np.uint8)
        scale_byte = np.where(finite, scale_byte, np.uint8(0xFF)).astype(np.uint8)
        # x / 2^exp: exact in float64, and exact in float32 unless the quotient is a float32
        # subnormal, which rounds to 0 in both element formats anyway.
        y = (xb.astype(np.float64) * np.exp2(-exp.astype(np.float64))[..., None]).astype(np.float32)
        if fmt == "mxfp8":
            el = e4m3(y).view(np.uint8).reshape(x.shape)
        else:
            el = pack(e2m1_codes(y).reshape(x.shape))
    return MXRef(elements=el, scales_e8m0=scale_byte, finite_blocks=finite)


def dequantize_mx(ref_elements, scales_e8m0, fmt: str) -> np.ndarray:
    """Element value times 2^(s-127), exact in float64, then float32; byte 0xFF is NaN."""
    s = np.asarray(scales_e8m0, np.uint8)
    if fmt == "mxfp8":
        v = np.asarray(ref_elements, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    else:
        v = e2m1_decode(unpack(ref_elements)).astype(np.float64)
    sc = np.where(s == 0xFF, np.nan, np.exp2(s.astype(np.float64) - 127.0))
    out = v.reshape(*v.shape[:-1], -1, MX_BLOCK) * sc[..., None]
    return out.reshape(v.shape).astype(np.float32)
