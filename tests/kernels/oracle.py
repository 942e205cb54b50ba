"""An independent NumPy oracle of docs/numerics.md §2/§3 (NVFP4 + Four-Over-Six), for tests only.

Independent of `fp4rl.formats` and of the kernels: NumPy float32 ufuncs evaluate each
operation as one correctly rounded IEEE f32 op (no FMA, no flush-to-zero), E2M1 rounding of
finite values is ml_dtypes' `float4_e2m1fn` cast (docs/numerics.md §1 names it a good oracle) and
E4M3 rounding is ml_dtypes' `float8_e4m3fn` cast of the value clamped to 448. The only
hand-written rounding is for non-finite values, which ml_dtypes has no opinion on that the
contract shares: NaN -> code 0 with the NaN's sign bit (+-0), +-Inf -> +-6 (saturation).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(3.4028235e38)
_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e2m1_codes(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float32)
    finite = np.isfinite(v)
    codes = np.where(finite, v, F32(0)).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    sign = np.signbit(v).astype(np.uint8) << 3
    codes = np.where(np.isinf(v), np.uint8(7) | sign, codes)
    codes = np.where(np.isnan(v), sign, codes)
    return codes.astype(np.uint8)


def e4m3(v: np.ndarray):
    """(value as f32, byte) of E4M3(min(v, 448)) for v >= 0 or NaN."""
    clamped = np.minimum(np.asarray(v, np.float32), F32(448))  # NaN propagates
    q = clamped.astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float32), q.view(np.uint8)


def global_scales(amax: np.ndarray, e: int):
    with np.errstate(all="ignore"):
        s_enc = F32(6 * e) / amax
        s_enc = np.minimum(s_enc, FLT_MAX)
        s_enc = np.where((amax == 0) | (s_enc == 0), F32(1), s_enc).astype(np.float32)
        s_dec = (F32(1) / s_enc).astype(np.float32)
    return s_enc, s_dec


def quantize(x, *, block_2d=False, scale="tensor", four_over_six=None, e4m3_bound=448,
             fast_error=False, amax=None):
    """x [..., R, K] (numpy, any float dtype) -> dict(codes, scales (bytes), amax, map4)."""
    x = np.asarray(x).astype(np.float32)
    *lead, k = x.shape
    with np.errstate(all="ignore"):
        if amax is None:
            a = np.max(np.abs(x), axis=-1, keepdims=True) if scale == "token" else np.max(np.abs(x))
        else:
            a = np.asarray(amax, np.float32)
        a = np.asarray(a, np.float32)
        s_enc, s_dec = global_scales(a, e4m3_bound)
        # Per-element views of the row-wise globals: [..., R, K//16, 1] (per token) or scalar.
        if scale == "token":
            a_b, s_enc_b, s_dec_b = (v[..., None] for v in (a, s_enc, s_dec))
        else:
            a_b, s_enc_b, s_dec_b = a, s_enc, s_dec
        xb = x.reshape(*lead, k // 16, 16)
        b = np.max(np.abs(xb), axis=-1, keepdims=True)  # [..., R, NB, 1]
        if block_2d:
            r = lead[-1]
            bt = b.reshape(*lead[:-1], r // 16, 16, k // 16, 1).max(axis=-3, keepdims=True)
            b = np.broadcast_to(bt, (*lead[:-1], r // 16, 16, k // 16, 1)).reshape(b.shape)

        def encode(sf):
            inv = np.minimum(F32(1) / (sf * s_dec_b), FLT_MAX)
            return e2m1_codes(xb * inv)

        def error(q, sf):
            dec_sf = _GRID[q] * sf
            if fast_error:
                d = dec_sf - xb * s_enc_b
            else:
                d = ((dec_sf * a_b) / F32(6 * e4m3_bound)).astype(np.float32) - xb
            e = np.abs(d) if four_over_six == "mae" else d * d
            total = e[..., 0]
            for i in range(1, 16):
                total = (total + e[..., i]).astype(np.float32)
            total = total[..., None]
            if block_2d:
                r = lead[-1]
                t = total.reshape(*lead[:-1], r // 16, 16, k // 16, 1)
                for half in (8, 4, 2, 1):
                    t = t[..., :half, :, :] + t[..., half:2 * half, :, :]
                total = np.broadcast_to(t, (*lead[:-1], r // 16, 16, k // 16, 1)).reshape(total.shape)
            return total

        if four_over_six is None:
            k6 = (s_enc_b * (F32(1) / F32(6))).astype(np.float32)
            sf, byte = e4m3(b * k6)
            q = encode(sf)
            map4 = np.zeros(b.shape, bool)
        else:
            base = ((b / F32(6)).astype(np.float32) * s_enc_b).astype(np.float32)
            sf6, byte6 = e4m3(base)
            sf4, byte4 = e4m3((base * F32(1.5)).astype(np.float32))
            q6, q4 = encode(sf6), encode(sf4)
            map4 = error(q4, sf4) < error(q6, sf6)
            byte = np.where(map4, byte4, byte6)
            q = np.where(map4, q4, q6)
    q = q.reshape(*lead, k)
    codes = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    return dict(
        codes=codes,
        scales=np.asarray(byte, np.uint8).reshape(*lead, k // 16),
        amax=a,
        map4=np.asarray(map4).reshape(*lead, k // 16),
    )


def dequantize(codes, scale_bytes, amax, e4m3_bound, out_dtype):
    """fl(fl(dec * sf) * S_dec), NaN where amax is not finite, cast to `out_dtype`.

    amax must broadcast against [..., K]: `()` per tensor, `[..., 1]` per token.
    """
    codes = np.asarray(codes, np.uint8)
    q = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)
    sf = np.asarray(scale_bytes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    sf = np.repeat(sf, 16, axis=-1)
    a = np.asarray(amax, np.float32)
    _, s_dec = global_scales(a, e4m3_bound)
    s_dec = np.where(np.isfinite(a), s_dec, F32(np.nan)).astype(np.float32)
    with np.errstate(all="ignore"):
        out = (_GRID[q] * sf).astype(np.float32) * s_dec
    return out.astype(np.float32).astype(out_dtype)
