"""Fused NVFP4 (+ Four-Over-Six) quantizer as a Pallas **Mosaic GPU** kernel (Hopper, sm_90a).

Reproduces `fp4rl.formats.nvfp4.quantize` byte for byte (docs/numerics.md §1-§3, §8): packed E2M1
codes (uint8 [..., K/2], element 2j in the low nibble), E4M3 block scales (float8_e4m3fn
[..., K/16]), the global amax (f32 `()` per tensor, `[..., 1]` per token) and the 4/6 choice;
1x16 blocks and 16x16 weight tiles, and expert stacks `[E, K, N]` / `[E, N, K]`
(`quantize_experts_mosaic`, each expert its own tensor, as `jax.vmap` of the reference).

Kernel shape (why it looks like this)
-------------------------------------
Mosaic GPU arrays live in registers with a *layout*; cross-thread reductions are tree
shaped and reshapes of a register array are limited. The contract, however, fixes a
*sequential* f32 sum over the 16 elements of a block (§3), so a reduction over a lane axis
is not allowed. We therefore use one CUDA thread per *unit*: a row (1x16 blocks) or a band
of 16 rows (16x16 tiles: the tile max, the 16 row errors and their tree sum stay in one
thread). A program owns `block_m` units (a multiple of the 128 threads of a warpgroup) of
one group (expert), and every array in the body is a 1D `[block_m]` array in the strided
layout (one element per thread). A block's column i of row r is one such array, loaded
from a strided GMEM view (`_View`; K-major expert stacks give coalesced loads), so every
reduction of the contract (block max, error sum, per-token amax) is a per-thread chain of
elementwise ops in exactly the contract's order. `fori_loop`s walk the K/16 blocks and the
16 columns. The per-block math is `mosaic_block`; this module has the views,
the kernel bodies and the wrappers.

Bit-exactness details
---------------------
* Mosaic GPU emits f32 add/sub/mul with the `contract` fast-math flag (FMA allowed,
  `mosaic/gpu/fragmented_array.py`). Every product that feeds an add/sub in the contract and
  is *not* exact (`x * S_enc` of the fast 4/6 error) goes through `lax.optimization_barrier`,
  which Mosaic lowers to opaque inline asm, so no FMA can form. Products that are exact
  (`dec(q) * sf`, `t * 512`) give the same result fused or not.
* Division and the MSE square are computed from integer ops (`fp4rl.formats.ieee`:
  `integer_divide`, `integer_square`): compiled float divisions (also via f64) are one ulp
  off in about a third of the rows and float MSE squares disagree in rare blocks
  (`tools/mosaic_probe.py` on an H200: `benchmarks/logs/mosaic_probe_float_*.log`).
* f32 max/min lower to `max.NaN`/`min.NaN` (NaN-propagating like jnp); block and row maxima
  are taken on the integer bits of |x| (NaN sorts above Inf), as in `block_math`.
* E4M3 rounding is integer RNE on the f32 bits (normals) and the 2^23 trick (subnormals);
  E2M1 codes are compares; no float8/float4 casts are emitted in the kernel.

Kernels (each has a name that appears in the lowered program):
* `fp4rl_mosaic_nvfp4_quant`  the quantizer (per-token amax computed in-kernel, or given).
* `fp4rl_mosaic_nvfp4_amax`   per-unit amax, used for a per-tensor amax that is not given
  (the max over the unit maxima of each group is then one tiny XLA reduce).
* `fp4rl_mosaic_nvfp4_dequant` dequantization (§2 order `fl(fl(dec(q)*sf)*S_dec)`).

Interpret mode: jax 0.11.2 has a Mosaic GPU interpreter (`plgpu.InterpretGPUParams`) that runs
on CPU; `interpret=True` uses it.

Cost of this shape: one thread per unit with strided scalar loads keeps the kernel far from
the copy bandwidth on row-major activations (`benchmarks/bench_quant.md`), and a 2D 4/6 kernel
takes minutes to compile. The model's default on a GPU is therefore the Triton backend; this
one is the second, independent implementation of the same bytes (`impl="mosaic"`).

Longer than ~400 lines because every form (1D rows, 16x16 tiles, row- and K-major expert stacks)
shares one set of wrappers, grids and launch code here; the per-block math is in `mosaic_block`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant import mosaic_block as mb
from pallas_kernels.nvfp4_quant import wrappers
from pallas_kernels.nvfp4_quant.tunables import MosaicQuantTiling

BLOCK = bm.BLOCK
QUANT_KERNEL_NAME = "fp4rl_mosaic_nvfp4_quant"
AMAX_KERNEL_NAME = "fp4rl_mosaic_nvfp4_amax"
DEQUANT_KERNEL_NAME = "fp4rl_mosaic_nvfp4_dequant"


def _interpret_param(interpret: bool):
    return plgpu.InterpretGPUParams() if interpret else None


# ----------------------------------------------------------------------------------------
# How a kernel sees its input
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _View:
    """G groups (experts; 1 for a plain tensor) of M rows x K, quantized along K.

    One CUDA thread per *unit*: a row (band=1, 1x16 blocks) or a band of 16 rows (band=16,
    16x16 tiles: the tile's max, error tree sum and scale stay inside one thread). The
    input is read row-major `[G, M/band, band, K]` or K-major `[G, K, M/band, band]` (an
    expert stack [E, K, N] as it is stored: thread t then loads w[e, k, t], consecutive
    threads consecutive addresses, no transposed copy). Outputs are row-major. The band
    axis is left out of the refs when band == 1, which keeps the 1D views two-level.
    """

    groups: int
    m: int
    k: int
    band: int
    k_major: bool

    @property
    def units(self) -> int:
        return self.m // self.band

    def _unit_shape(self):
        return (self.units,) if self.band == 1 else (self.units, self.band)

    def x_shape(self):
        g, k = self.groups, self.k
        return (g, k, *self._unit_shape()) if self.k_major else (g, *self._unit_shape(), k)

    def out_shape(self, cols: int):
        return (self.groups, *self._unit_shape(), cols)

    def _unit_index(self, units, r):
        return (units,) if self.band == 1 else (units, r)

    def load(self, x_ref, g, units, r, c):
        """Column c of row r of each unit, as f32 [block_u] (one element per thread)."""
        idx = (g, c, *self._unit_index(units, r)) if self.k_major else (g, *self._unit_index(units, r), c)
        return x_ref.at[idx][...].astype(jnp.float32)

    def out_at(self, out_ref, g, units, r, c):
        return out_ref.at[(g, *self._unit_index(units, r), c)]


def _unit_start(units_total: int, block_u: int):
    # The last program overlaps the previous one instead of reading past the end (the wrapper
    # pads to at least block_u units): overlapping units are recomputed to identical bytes.
    return jnp.minimum(lax.axis_index("m") * block_u, units_total - block_u)


def _program_units(view: _View, block_u: int):
    return lax.axis_index("g"), pl.ds(_unit_start(view.units, block_u), block_u)


# ----------------------------------------------------------------------------------------
# Kernel bodies
# ----------------------------------------------------------------------------------------


def _unit_amax_bits(view: _View, x_ref, g, units):
    """max|x| over each unit's rows and all K columns as int32 bits (one thread per unit)."""

    def block_bits(j):
        return mb.block_max_bits(lambda r, i: view.load(x_ref, g, units, r, j * BLOCK + i), view.band)

    return lax.fori_loop(np.int32(1), np.int32(view.k // BLOCK), lambda j, m: jnp.maximum(m, block_bits(j)),
                         block_bits(np.int32(0)))


def _make_quant_body(view: _View, block_u, block_k, config: ref.NVFP4Config, amax_mode: str):
    """amax_mode: "compute" (per token, in-kernel) or "given" (one value per unit, [G, U]; a
    per-tensor amax comes broadcast to every unit)."""
    nblk = block_k // BLOCK
    band = view.band

    def quantize_cols(x_ref, codes_ref, scales_ref, map4_ref, g, units, amax):
        s_enc, s_dec = bm.scales_from_amax(mb.ExactArith, amax, config.e4m3_bound)
        k0 = lax.axis_index("k") * nblk  # first block of this program

        def body(j, carry):
            blk = k0 + j

            def load(r, i):
                return view.load(x_ref, g, units, r, blk * BLOCK + i)

            inv, byte, map4 = mb.quantize_block(load, band, amax, s_enc, s_dec, config)
            flag = jnp.zeros_like(byte) if map4 is None else jnp.where(map4, np.int32(1), np.int32(0))

            def store_row(r, c):  # a tile's rows share its scale byte and choice
                def pack(p, c):
                    view.out_at(codes_ref, g, units, r, blk * (BLOCK // 2) + p)[...] = mb.pack_pair(
                        mb.encode(load(r, 2 * p), inv), mb.encode(load(r, 2 * p + 1), inv)
                    )
                    return c

                lax.fori_loop(np.int32(0), np.int32(BLOCK // 2), pack, np.int32(0))
                view.out_at(scales_ref, g, units, r, blk)[...] = byte.astype(jnp.uint8)
                view.out_at(map4_ref, g, units, r, blk)[...] = flag.astype(jnp.uint8)
                return c

            mb.for_rows(band, store_row, np.int32(0))
            return carry

        lax.fori_loop(np.int32(0), np.int32(nblk), body, np.int32(0))

    if amax_mode == "compute":

        def kernel(x_ref, codes_ref, scales_ref, map4_ref, amax_out_ref):
            g, units = _program_units(view, block_u)
            # max(., 0) is `max.NaN.f32` on the GPU: a NaN amax comes out as the canonical NaN
            # 0x7FFFFFFF, as XLA's reduce in the reference, not with the input's payload.
            amax = jnp.maximum(bm.from_bits(_unit_amax_bits(view, x_ref, g, units)), mb.f32(0))
            amax_out_ref.at[g, units][...] = amax
            quantize_cols(x_ref, codes_ref, scales_ref, map4_ref, g, units, amax)

    else:

        def kernel(x_ref, amax_ref, codes_ref, scales_ref, map4_ref):
            g, units = _program_units(view, block_u)
            quantize_cols(x_ref, codes_ref, scales_ref, map4_ref, g, units, amax_ref.at[g, units][...])

    return kernel


@functools.lru_cache(maxsize=None)
def _quant_call(view: _View, dtype, config, amax_mode, tiling: MosaicQuantTiling, interpret: bool):
    block_u, k = tiling.block_m, view.k
    block_k = k if (tiling.block_k is None or amax_mode == "compute") else tiling.block_k
    if k % block_k:
        raise ValueError(f"{k=} must be a multiple of block_k={block_k}")
    out_type = [jax.ShapeDtypeStruct(view.out_shape(cols), jnp.uint8) for cols in (k // 2, k // BLOCK, k // BLOCK)]
    if amax_mode == "compute":
        out_type.append(jax.ShapeDtypeStruct((view.groups, view.units), jnp.float32))
    return plgpu.kernel(
        _make_quant_body(view, block_u, block_k, config, amax_mode),
        out_type=tuple(out_type),
        grid=(view.groups, pl.cdiv(view.units, block_u), k // block_k),
        grid_names=("g", "m", "k"),
        kernel_name=QUANT_KERNEL_NAME,
        interpret=_interpret_param(interpret),
    )


@functools.lru_cache(maxsize=None)
def _amax_call(view: _View, dtype, tiling: MosaicQuantTiling, interpret: bool):
    block_u = tiling.block_m

    def kernel(x_ref, amax_out_ref):
        g, units = _program_units(view, block_u)
        amax_out_ref.at[g, units][...] = bm.from_bits(_unit_amax_bits(view, x_ref, g, units))

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((view.groups, view.units), jnp.float32),
        grid=(view.groups, pl.cdiv(view.units, block_u)),
        grid_names=("g", "m"),
        kernel_name=AMAX_KERNEL_NAME,
        interpret=_interpret_param(interpret),
    )


@functools.lru_cache(maxsize=None)
def _dequant_call(m_total, k, out_dtype, e4m3_bound, tiling: MosaicQuantTiling, interpret: bool):
    block_m = tiling.block_m

    def kernel(codes_ref, scales_ref, amax_ref, out_ref):
        rows = pl.ds(jnp.minimum(lax.axis_index("m") * block_m, m_total - block_m), block_m)
        s_dec = bm.dequant_s_dec(mb.ExactArith, amax_ref.at[rows][...], e4m3_bound)  # NaN if amax is not finite

        def body(j, carry):
            sf = bm.e4m3_decode(scales_ref.at[rows, j][...].astype(jnp.int32))
            for p in range(BLOCK // 2):
                byte = codes_ref.at[rows, j * (BLOCK // 2) + p][...].astype(jnp.int32)
                for h, code in enumerate((byte & np.int32(15), lax.shift_right_logical(byte, np.int32(4)))):
                    v = (bm.e2m1_decode(code) * sf) * s_dec
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


def _pad_rows(a, block_m, axis=0):
    """Pad `axis` up to one program (tiny inputs only; larger ones use overlapping last tiles)."""
    n = a.shape[axis]
    if n >= block_m:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, block_m - n)
    return jnp.pad(a, pad)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _quantize_groups(x, amax, view: _View, config: ref.NVFP4Config, tiling: MosaicQuantTiling, interpret: bool):
    """x [G, M, K] (or [G, K, M] K-major) -> codes, scale bytes, map4 ([G, M, .]) and the amax.

    amax: None (computed: per token [G, M] from the quantizer, per tensor [G] from the
    amax kernel), [G, M] (given per token) or [G] (given per tensor).
    """
    g, m = view.groups, view.m
    pad_to = tiling.block_m * view.band  # at least one program of units in every group
    padded = dataclasses.replace(view, m=max(m, pad_to))
    xk = _pad_rows(x, pad_to, axis=2 if view.k_major else 1).reshape(padded.x_shape())
    units = view.units
    if config.scale == "token" and amax is None:
        codes, scales, map4, amax_units = _quant_call(padded, x.dtype, config, "compute", tiling, interpret)(xk)
        amax_out = amax_units[:, :m]
    else:
        if amax is None:  # per tensor (each group its own tensor): max over the unit maxima
            amax = jnp.max(_amax_call(padded, x.dtype, tiling, interpret)(xk)[:, :units], axis=1)
        amax_out = amax
        if config.scale == "token":
            amax_units = _pad_rows(amax, tiling.block_m, axis=1)
        else:
            # The per-tensor amax reaches the kernel as one value per unit: a scalar read from a
            # ref fails to lower in Mosaic GPU ("Scalars must be represented by non-vector
            # types", seen compiled on the H200); the per-unit vector form lowers.
            amax_units = jnp.broadcast_to(amax[:, None], (g, padded.units))
        codes, scales, map4 = _quant_call(padded, x.dtype, config, "given", tiling, interpret)(xk, amax_units)

    def rows(a):
        return a.reshape(g, padded.m, a.shape[-1])[:, :m]

    return rows(codes), rows(scales), rows(map4) != 0, amax_out


def _validate(x, config: ref.NVFP4Config):
    wrappers.check_input(x, config)
    if jnp.result_type(x) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise TypeError(f"the Mosaic GPU quantizer takes float32 or bfloat16 input, got {jnp.result_type(x)}")
    if math.prod(jnp.shape(x)[:-1]) == 0:
        raise ValueError(f"the Mosaic GPU quantizer needs at least one row, got shape {jnp.shape(x)}")


def _quantize(x_g, config, amax, lead, groups, k, k_major, tiling, interpret) -> ref.NVFP4Tensor:
    """x_g [G, M, K] (or [G, K, M] K-major), lead = the result's leading shape (prod = G * M),
    amax as the caller was given it -> the NVFP4Tensor shaped like the reference's."""
    m = math.prod(lead) // groups
    given = None if amax is None else wrappers.amax_rows(amax, config, lead, groups)  # [G, M]
    if given is not None and config.scale == "tensor":
        given = given[:, 0]  # one value per group
    view = _View(groups=groups, m=m, k=k, band=BLOCK if config.block_2d else 1, k_major=k_major)
    codes, scales, map4, computed = _quantize_groups(x_g, given, view, config, tiling, interpret)
    if amax is not None:
        amax_out = jnp.asarray(amax, jnp.float32)
    elif config.scale == "token":
        amax_out = computed.reshape(*lead, 1)
    else:
        amax_out = computed.reshape(() if groups == 1 else (groups,))
    return wrappers.assemble(codes, scales, map4, amax_out, config, lead, k)


def quantize_mosaic(
    x,
    config: ref.NVFP4Config = ref.NVFP4Config(),
    *,
    amax=None,
    interpret: bool = False,
    tiling: MosaicQuantTiling = MosaicQuantTiling(),
) -> ref.NVFP4Tensor:
    """`fp4rl.formats.nvfp4.quantize(x, config, amax=amax)` as a Mosaic GPU kernel (same bytes).

    x: float32 or bfloat16 [..., K], K a multiple of 16 (2D blocks: the second-to-last axis a
    multiple of 16 too; tiles never straddle two leading-axis slices, so the leading axes
    flatten into rows). amax: optional global amax, `()` per tensor or `[..., 1]` per token;
    by default computed from x (per token: inside the quantizer kernel; per tensor: unit
    maxima in `fp4rl_mosaic_nvfp4_amax`, then their max).
    interpret=True runs the Mosaic GPU interpreter (CPU); interpret=False needs a CUDA GPU
    (Hopper or newer) and raises otherwise.
    """
    wrappers.require_gpu(interpret, "quantize_mosaic")
    _validate(x, config)
    *lead, k = jnp.shape(x)
    x_g = jnp.asarray(x).reshape(1, math.prod(lead), k)
    return _quantize(x_g, config, amax, tuple(lead), 1, k, False, tiling, interpret)


def quantize_experts_mosaic(
    w,
    config: ref.NVFP4Config = ref.NVFP4Config(),
    *,
    contraction_axis: int = 1,
    amax=None,
    interpret: bool = False,
    tiling: MosaicQuantTiling = MosaicQuantTiling(),
) -> ref.NVFP4Tensor:
    """Quantize an expert stack, each expert on its own: `jax.vmap(reference.quantize)`.

    w: [E, K, N] (contraction_axis=1, the qdot weight layout; read K-major in the kernel, no
    transposed copy) or [E, N, K] (contraction_axis=2). The result is laid out [E, N, K/2] /
    [E, N, K/16] with amax `[E]` per expert (per tensor) or `[E, N, 1]` (per token), as
    `jax.vmap(lambda v: quantize(v, config))` of the stack laid out [E, N, K].
    amax: optional, `[E]` per tensor or `[E, N, 1]` per token.
    """
    e, n, k = wrappers.expert_stack_dims(w, contraction_axis)
    wrappers.require_gpu(interpret, "quantize_experts_mosaic")
    _validate(jax.ShapeDtypeStruct((e, n, k), jnp.result_type(w)), config)
    return _quantize(jnp.asarray(w), config, amax, (e, n), e, k, contraction_axis == 1, tiling, interpret)


def dequantize_mosaic(
    t: ref.NVFP4Tensor,
    dtype=jnp.bfloat16,
    *,
    interpret: bool = False,
    tiling: MosaicQuantTiling = MosaicQuantTiling(),
):
    """`fl(fl(dec(q) * f32(sf)) * S_dec)` cast to `dtype`, as a Mosaic GPU kernel (§2, §8).

    Same values as `fp4rl.formats.nvfp4.dequantize(t, dtype)` for tensors [..., K] (1D or 2D
    blocks: a 2D tile's scale is stored on each of its rows), and as `jax.vmap` of it for
    the `[E]`-amax tensors of `quantize_experts_mosaic`.
    """
    if not isinstance(t, ref.NVFP4Tensor):
        raise TypeError(f"dequantize takes an NVFP4Tensor, got {type(t).__name__}")
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise TypeError(f"dequantize writes float32, bfloat16 or float16, got {dtype}")
    wrappers.require_gpu(interpret, "dequantize_mosaic")
    *lead, half = t.codes.shape
    m, k = math.prod(lead), 2 * half
    amax_rows = wrappers.dequant_amax_rows(t)
    scale_bytes = lax.bitcast_convert_type(t.scales, jnp.uint8).reshape(m, k // BLOCK)
    call = _dequant_call(max(m, tiling.block_m), k, dtype, t.config.e4m3_bound, tiling, interpret)
    out = call(*(_pad_rows(a, tiling.block_m) for a in (t.codes.reshape(m, half), scale_bytes, amax_rows)))
    return out[:m].reshape(*lead, k)
