"""OCP microscaling formats (docs/numerics.md §5), for validation runs and comparison.

- MXFP8: E4M3 elements in 32-element blocks, E8M0 scale by RCEIL: the smallest power of two
  >= fl(amax * fl(1/448)); amax 0 gives byte 0. Elements RNE, saturating at 448.
- MXFP4: E2M1 elements in 32-element blocks, E8M0 scale by the OCP rule
  2^(floor(log2(amax)) - 2); elements RNE, saturating at 6 (values in (6, 8) clip).
  amax 0 gives byte 0 (the spec is silent; same as MXFP8).
A block containing NaN or Inf gets the NaN scale byte 0xFF, so it dequantizes to NaN (§8).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.formats import elements as el
from fp4rl.formats import ieee

BLOCK = 32
FORMATS = ("mxfp8", "mxfp4")


@dataclasses.dataclass(frozen=True)
class MXTensor:
    """elements: float8_e4m3fn [..., K] (mxfp8) or packed E2M1 uint8 [..., K // 2] (mxfp4);
    scales: E8M0 bytes (uint8) [..., K // 32]."""

    elements: jax.Array
    scales: jax.Array
    fmt: Literal["mxfp8", "mxfp4"]


jax.tree_util.register_dataclass(MXTensor, data_fields=["elements", "scales"], meta_fields=["fmt"])


def _check(x, fmt):
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}; valid options: {FORMATS}")
    el.check_blocked_input(x, BLOCK)


def _scale_exponent(amax, fmt):
    if fmt == "mxfp8":
        t = amax * (np.float32(1) / np.float32(el.E4M3_MAX))  # a host constant
        return jnp.where(t > 0, el.ceil_log2(jnp.where(t > 0, t, 1)), -127)
    return jnp.where(amax > 0, el.floor_log2(jnp.where(amax > 0, amax, 1)) - 2, -127)


def quantize(x, fmt: Literal["mxfp8", "mxfp4"] = "mxfp8") -> MXTensor:
    """Quantize `x` [..., K] (K a multiple of 32) to MXFP8 or MXFP4."""
    _check(x, fmt)
    x32 = ieee.as_stored(x).astype(jnp.float32)
    xb = x32.reshape(*x32.shape[:-1], x32.shape[-1] // BLOCK, BLOCK)
    amax = ieee.nan_max(jnp.abs(xb), axis=-1, keepdims=True)
    exponent = jnp.clip(_scale_exponent(amax, fmt), -127, 127)
    scales = jnp.where(jnp.isfinite(amax), el.e8m0_from_exponent(exponent), jnp.uint8(0xFF))
    # x / 2^e as two exact power-of-two multiplies (2^-e alone can leave the f32 normal range)
    half = exponent // 2
    scaled = xb * el.pow2(-half) * el.pow2(-(exponent - half))
    if fmt == "mxfp8":
        elements = el.e4m3_round(scaled).reshape(x32.shape)
    else:
        elements = el.pack_e2m1(el.e2m1_encode(scaled).reshape(x32.shape))
    return MXTensor(elements=elements, scales=scales[..., 0], fmt=fmt)


def dequantize(t: MXTensor, dtype=jnp.float32):
    """element * 2^(s - 127); the NaN scale byte 0xFF gives NaN."""
    if t.fmt == "mxfp8":
        values = t.elements.astype(jnp.float32)
    else:
        values = el.e2m1_decode(el.unpack_e2m1(t.elements))
    vb = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK)
    s = t.scales.astype(jnp.int32)[..., None] - 127
    half = s // 2
    out = vb * el.pow2(jnp.clip(half, -126, 127)) * el.pow2(jnp.clip(s - half, -126, 127))
    out = jnp.where(t.scales[..., None] == 0xFF, jnp.float32(jnp.nan), out)
    return out.reshape(values.shape).astype(dtype)
