"""NVFP4 quantization (docs/numerics.md §2) with optional Four-Over-Six (§3), as pure jnp.

Layout: blocks of 16 run along the last axis K (the contraction dimension of the consuming
GEMM). With `block_2d=True` the block is a 16x16 tile over the last two axes [R, K], so the
quantized weight is the same whichever dimension a GEMM contracts over. The global amax is
per tensor (`()`) or per token (`[..., 1]`, one per row). Any leading batch dims are allowed;
everything is vectorised (no Python loop over blocks), so it works under jit and vmap.

Every `fl(.)` of the contract is one float32 operation written as its own jnp op; the ones
XLA would otherwise rewrite (divisions by constants, products feeding a subtraction or a
sum, NaN-dropping max reductions) go through `fp4rl.formats.ieee`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.formats import elements as el
from fp4rl.formats import ieee
from fp4rl.formats.stochastic import stochastic_encode_e2m1

BLOCK = 16
SCALES = ("tensor", "token")
FOUR_OVER_SIX = (None, "mae", "mse")
E4M3_BOUNDS = (None, 256, 448)


@dataclasses.dataclass(frozen=True)
class NVFP4Config:
    """How to quantize one tensor. Frozen and hashable: usable as a static jit argument.

    block_2d: 16x16 tiles over the last two axes (weights) instead of 1x16 along K.
    scale: "tensor" (one global amax) or "token" (one amax per row, docs/numerics.md §4).
    four_over_six: None, "mae" or "mse" (the per-block error metric of §3).
    e4m3_max: the E of §2/§3; None means 448 without 4/6 and 256 with it.
    fast_error: measure the 4/6 error in the scaled domain (§3 "fast error").
    """

    block_2d: bool = False
    scale: Literal["tensor", "token"] = "tensor"
    four_over_six: Literal["mae", "mse"] | None = None
    e4m3_max: int | None = None
    fast_error: bool = False

    def __post_init__(self):
        if self.scale not in SCALES:
            raise ValueError(f"scale={self.scale!r}; valid options: {SCALES}")
        if self.four_over_six not in FOUR_OVER_SIX:
            raise ValueError(f"four_over_six={self.four_over_six!r}; valid options: {FOUR_OVER_SIX}")
        if self.e4m3_max not in E4M3_BOUNDS:
            raise ValueError(f"e4m3_max={self.e4m3_max!r}; valid options: {E4M3_BOUNDS}")
        if self.block_2d and self.scale == "token":
            raise ValueError(
                "block_2d=True needs scale='tensor': a 16x16 tile spans 16 rows, so it cannot "
                "have one amax per row; valid options: (block_2d=False, scale='token'|'tensor') "
                "or (block_2d=True, scale='tensor')"
            )
        if self.fast_error and self.four_over_six is None:
            raise ValueError(
                "fast_error=True only applies to Four-Over-Six; valid options: "
                "four_over_six in ('mae', 'mse') with fast_error True/False, or "
                "four_over_six=None with fast_error=False"
            )

    @property
    def e4m3_bound(self) -> int:
        """The resolved E: 256 by default under 4/6 (map-4 never saturates), else 448."""
        if self.e4m3_max is not None:
            return self.e4m3_max
        return 256 if self.four_over_six else 448


@dataclasses.dataclass(frozen=True)
class NVFP4Tensor:
    """A quantized tensor (a pytree; `config` and `shape` are static).

    codes: uint8 [..., K // 2], two E2M1 codes per byte, even element in the low nibble.
    scales: float8_e4m3fn [..., K // 16]; for 2D, each tile's scale repeated on its 16 rows.
    amax: float32, `()` per tensor or `[..., 1]` per token (the global amax A).
    map4: bool [..., K // 16], True where 4/6 chose map-to-4 (all False without 4/6).
    """

    codes: jax.Array
    scales: jax.Array
    amax: jax.Array
    map4: jax.Array
    config: NVFP4Config

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.codes.shape[:-1], self.codes.shape[-1] * 2)


jax.tree_util.register_dataclass(
    NVFP4Tensor, data_fields=["codes", "scales", "amax", "map4"], meta_fields=["config"]
)


def check_input(x, config: NVFP4Config, block: int = BLOCK):
    """Validate dtype and shape before tracing anything (clear errors, never a wrong answer)."""
    el.check_blocked_input(x, block)
    shape = jnp.shape(x)
    if config.block_2d and (len(shape) < 2 or shape[-2] % BLOCK):
        raise ValueError(
            f"2D (16x16) blocks need rows that are a multiple of {BLOCK}: shape {shape}"
        )


def _concrete(value):
    """`value` as a NumPy array, or None under tracing (jit, vmap), where it has no value yet."""
    try:
        return np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def check_amax(amax, x32, config: NVFP4Config) -> None:
    """A given global amax: its shape always; when concrete, >= 0 (a maximum of |x|) and not 0
    where x has a nonzero value (the S_enc = 1 guard would then quantize x far off scale).
    NaN and inf stay allowed: the contract defines them (§8). An amax below max|x| is allowed
    too: it saturates the block scales, as a deliberately clipped amax does."""
    want = () if config.scale == "tensor" else (*jnp.shape(x32)[:-1], 1)
    if jnp.shape(amax) != want:
        raise ValueError(f"amax of shape {jnp.shape(amax)} does not fit scale={config.scale!r} and x of shape "
                         f"{jnp.shape(x32)}: expected {want}")
    a = _concrete(amax)
    if a is None:
        return
    if (a < 0).any():
        raise ValueError(f"amax must be >= 0 (a maximum of |x|), got a minimum of {a.min()}")
    if (a == 0).any() and (x := _concrete(x32)) is not None:
        row_max = np.abs(x).max() if config.scale == "tensor" else np.abs(x).max(axis=-1, keepdims=True)
        if ((a == 0) & (row_max > 0)).any():
            raise ValueError("amax is 0 where x has nonzero values; pass max|x| (or none to compute it)")


def global_amax(x32, config: NVFP4Config):
    """A of §2: max|x| over the tensor, or over each row's K elements (keepdims) per token."""
    if config.scale == "token":
        return ieee.nan_max(jnp.abs(x32), axis=-1, keepdims=True)
    return ieee.nan_max(jnp.abs(x32))


def global_scales(amax, e4m3_max: int):
    """(S_enc, S_dec) of §2: S_enc = fl(6E/A), capped at FLT_MAX, 1 when A == 0 or S_enc == 0.

    A NaN amax gives NaN scales; an infinite amax gives S_enc == 0 -> 1 by the contract's
    guard, which is why `dequantize` also checks the amax itself (§8).
    """
    amax = jnp.asarray(amax, jnp.float32)
    s_enc = ieee.divide(jnp.float32(6 * e4m3_max), amax)
    s_enc = jnp.minimum(s_enc, el.FLT_MAX)
    s_enc = jnp.where((amax == 0) | (s_enc == 0), jnp.float32(1), s_enc)
    s_dec = ieee.reciprocal(s_enc)
    return s_enc, s_dec


def _blocks(x32, config: NVFP4Config):
    """View [..., R, K] as [..., R, K/16, 16] (1D) or [..., R/16, 16, K/16, 16] (2D)."""
    if config.block_2d:
        *lead, r, k = x32.shape
        return x32.reshape(*lead, r // BLOCK, BLOCK, k // BLOCK, BLOCK)
    return x32.reshape(*x32.shape[:-1], x32.shape[-1] // BLOCK, BLOCK)


def _block_amax(xb, config: NVFP4Config):
    """b of §2, broadcastable against the blocked view (keepdims). NaN propagates."""
    axes = (-3, -1) if config.block_2d else (-1,)
    return ieee.nan_max(jnp.abs(xb), axis=axes, keepdims=True)


def _encode_with_scale(xb, sf, s_dec, sr_key=None):
    """q_i = E2M1(fl(x_i * inv)) with inv = min(fl(1 / fl(f32(sf) * S_dec)), FLT_MAX).

    With `sr_key`, E2M1 rounding is stochastic (§6) instead of nearest-even.
    """
    inv = jnp.minimum(ieee.reciprocal(sf.astype(jnp.float32) * s_dec), el.FLT_MAX)
    if sr_key is None:
        return el.e2m1_encode(xb * inv)
    return stochastic_encode_e2m1(xb * inv, sr_key)


def _sequential_sum16(e):
    """Sequential f32 sum over the last axis of 16 (i = 0..15), as the contract fixes the order."""
    total = e[..., 0]
    for i in range(1, BLOCK):
        total = total + e[..., i]
    return total


def _tree_sum16(r, axis):
    """Pairwise tree sum of 16 row errors: r[0:8]+r[8:16], then 4, 2, 1 (§3, 2D weights)."""
    r = jnp.moveaxis(r, axis, -1)
    for half in (8, 4, 2, 1):
        r = r[..., :half] + r[..., half : 2 * half]
    return jnp.moveaxis(r, -1, axis)


def _candidate_error(xb, codes, sf, amax, s_enc, config: NVFP4Config):
    """Per-block dequantization error of one 4/6 candidate, keepdims over the block axes."""
    dec_sf = el.e2m1_decode(codes) * sf.astype(jnp.float32)  # exact (<= 6 significant bits)
    if config.fast_error:
        d = dec_sf - ieee.product(xb, s_enc)
    else:
        v = ieee.divide(dec_sf * amax, jnp.float32(6 * config.e4m3_bound))
        d = v - xb
    e = jnp.abs(d) if config.four_over_six == "mae" else ieee.product(d, d)
    row_err = _sequential_sum16(e)[..., None]  # keepdims on the element axis
    if config.block_2d:
        return _tree_sum16(row_err, axis=-3)  # the tile-row axis is kept with size 1
    return row_err


def _per_block(global_value, config: NVFP4Config):
    """Reshape A, S_enc or S_dec to broadcast against the blocked view (per token: add an axis)."""
    if config.scale == "token":
        return global_value[..., None]  # [..., R, 1] -> [..., R, 1, 1]
    return global_value


def quantize(x, config: NVFP4Config = NVFP4Config(), *, amax=None, sr_key=None) -> NVFP4Tensor:
    """Quantize `x` [..., K] to NVFP4 per docs/numerics.md §2/§3.

    amax: optional precomputed global amax (per tensor `()` or per token `[..., 1]`), e.g. a
      per-tensor amax shared by several shards; by default it is computed from `x`. Validated by
      `check_amax` (its shape always, its values when they are concrete).
    sr_key: a jax.random key to round elements stochastically (§6, for gradients) instead of
      to nearest-even; scale selection is unchanged. Not combinable with 4/6.
    """
    check_input(x, config)
    if sr_key is not None and config.four_over_six:
        raise ValueError("stochastic rounding (sr_key) is not defined together with four_over_six")
    x32 = ieee.as_stored(x).astype(jnp.float32)
    if amax is not None:
        check_amax(amax, x32, config)
    a = global_amax(x32, config) if amax is None else jnp.asarray(amax, jnp.float32)
    s_enc, s_dec = global_scales(a, config.e4m3_bound)
    xb = _blocks(x32, config)
    a_b, s_enc_b, s_dec_b = (_per_block(v, config) for v in (a, s_enc, s_dec))
    b = _block_amax(xb, config)

    if config.four_over_six is None:
        k = s_enc_b * (np.float32(1) / np.float32(6))  # a host constant: fl(1/6)
        sf = el.e4m3_round(jnp.minimum(b * k, jnp.float32(el.E4M3_MAX)))
        codes = _encode_with_scale(xb, sf, s_dec_b, sr_key)
        map4 = jnp.zeros(sf.shape, bool)
    else:
        base = ieee.divide(b, jnp.float32(6)) * s_enc_b
        sf6 = el.e4m3_round(jnp.minimum(base, jnp.float32(el.E4M3_MAX)))
        sf4 = el.e4m3_round(jnp.minimum(base * jnp.float32(1.5), jnp.float32(el.E4M3_MAX)))
        q6 = _encode_with_scale(xb, sf6, s_dec_b)
        q4 = _encode_with_scale(xb, sf4, s_dec_b)
        err6 = _candidate_error(xb, q6, sf6, a_b, s_enc_b, config)
        err4 = _candidate_error(xb, q4, sf4, a_b, s_enc_b, config)
        map4 = err4 < err6  # strict: ties go to map-6
        sf = jnp.where(map4, sf4, sf6)
        codes = jnp.where(map4, q4, q6)

    codes = codes.reshape(x32.shape)
    sf, map4 = _scale_layout(sf, config, x32.shape), _scale_layout(map4, config, x32.shape)
    return NVFP4Tensor(codes=el.pack_e2m1(codes), scales=sf, amax=a, map4=map4, config=config)


def _scale_layout(per_block, config: NVFP4Config, shape):
    """Blocked keepdims array -> [..., K // 16] (2D: each tile's value repeated on its 16 rows)."""
    per_block = per_block[..., 0]
    if config.block_2d:
        per_block = jnp.broadcast_to(per_block, (*per_block.shape[:-3], per_block.shape[-3], BLOCK, per_block.shape[-1]))
    return per_block.reshape(*shape[:-1], shape[-1] // BLOCK)


def scaled_operand(t: NVFP4Tensor, dtype=jnp.bfloat16):
    """The emulated-GEMM operand of §2: (dec(q) * sf in `dtype`, S_dec).

    dec(q)*sf has at most 6 significant bits and lies in 2^-10..2688, so it is exact in bf16
    and fp16. S_dec is `()` per tensor or `[..., 1]` per token; it is NaN where the amax is
    not finite (§8), so the GEMM output is NaN there. Blocks with a NaN scale give NaN values.
    """
    dec = el.e2m1_decode(el.unpack_e2m1(t.codes))
    sf = jnp.repeat(t.scales.astype(jnp.float32), BLOCK, axis=-1)
    return (dec * sf).astype(dtype), decode_scale(t)


def decode_scale(t: NVFP4Tensor):
    """S_dec of `scaled_operand` alone: `()` per tensor or `[..., 1]` per token, NaN where the amax
    is not finite (a kernel that reads the codes and scales itself needs only this)."""
    _, s_dec = global_scales(t.amax, t.config.e4m3_bound)
    return jnp.where(jnp.isfinite(t.amax), s_dec, jnp.float32(jnp.nan))


def dequantize(t: NVFP4Tensor, dtype=jnp.float32):
    """x_hat_i = fl(fl(dec(q_i) * f32(sf)) * S_dec), then cast to `dtype` (§2, §8)."""
    dec_sf, s_dec = scaled_operand(t, jnp.float32)
    return (dec_sf * s_dec).astype(dtype)


def relative_error(x, t: NVFP4Tensor) -> jax.Array:
    """||x_hat - x|| / ||x|| in float32 (a quantization diagnostic)."""
    x32 = jnp.asarray(x, jnp.float32)
    return jnp.linalg.norm(dequantize(t) - x32) / jnp.maximum(jnp.linalg.norm(x32), np.float32(1e-30))
