"""Fused NVFP4 (+ Four-Over-Six) quantize and dequantize kernels, Pallas Triton backend.

Kernel, wrapper, reference (docs/design.md practice 1): the reference is
`fp4rl.formats.nvfp4.quantize` / `dequantize`; every wrapper here returns the reference's
bytes (codes, scale bytes, amax, map4) exactly, for every `NVFP4Config`.

Layout and grid
---------------
The kernels see the input as groups of row-major matrices `[G, M, K]` (G = 1 for a plain
tensor, G = E for an expert stack), quantized in 16-element blocks along the last axis K.
The grid is `(G, cdiv(M, rows))`; one program owns `rows` rows (1D blocks: the tunable
`rows_1d`; 2D blocks: always one 16-row tile row) and walks K in chunks of `block_k`
(`block_k_2d` for 2D) columns, a power of two since Triton tensors must have power-of-two
sizes (see `TritonQuantTunables`).

* 1x16 blocks of a row-major input use the *planar* layout by default (`triton_planar`,
  `TritonQuantTunables.layout`): each thread owns whole blocks, held as 8 (16 for f32)
  32-bit word planes, so the block max, the sequential 4/6 error sum and the packing of
  codes never cross threads, and E2M1 encoding is one rounding add per element. Each thread
  reads its blocks with 128-bit loads (4 words at a time) and writes a block's codes with one
  64-bit store; with K in several chunks the next chunk's loads are issued before the current
  one is processed (`TritonQuantTunables.prefetch`), so loads overlap the arithmetic. The
  E2M1 range offset comes from the exponent by integer ops (no compares), the fast error is one
  FMA and |v| clamps with one FMNMX, which keeps a thread's main path short (`tools/triton_sass.py`
  counts its sm_90 SASS instructions per 16 elements). The launch shape is chosen per
  variant when none is given (`default_tunables`: plain NVFP4 reads each row once). The tiled
  layout (below) serves 16x16 tiles, K-major expert stacks and `layout="tiled"`.
* Neither M nor K needs to be a multiple of the row block or chunk: the tails are MASKED
  (loads fill 0, stores are masked), never padded, so no extra HBM copy is made. A masked
  row or column only ever produces zero blocks that are not stored.
* Stochastic rounding (`uniform=`, docs/numerics.md §6): the tiled kernel reads the draws as it
  reads x (f32, the same tile) and rounds each element up iff its draw is below its exact
  round-up probability (`block_math.stochastic_e2m1_encode`); the planar layout is not used.
* Per-token amax (`scale="token"`) is computed inside the quantize kernel (an integer max
  over the row's bits, one extra pass over the row when K spans several chunks). A
  per-tensor amax is either given (`amax=`) or computed by a small row-amax kernel followed
  by a max over rows; it reaches the quantize kernel as one f32 per row.
* 2D (16x16) blocks: each program loads one tile row `[16, chunk]`; `b` is the max over the
  tile, all 16 rows share its scale, each row computes its own sequential 16-element error
  and the tile's error is the pairwise tree sum of the 16 row errors (docs/numerics.md §3).
  Scales and map4 are stored repeated on the 16 rows, as the reference stores them.
* Expert stacks `[E, K, N]` (the qdot weight layout, contraction axis K in the middle):
  `quantize_experts` reads the stack K-major, so no transposed copy of the weight is written, and
  returns exactly `jax.vmap(reference.quantize)(swapaxes(w, 1, 2))`: codes `[E, N, K/2]`, scales
  and map4 `[E, N, K/16]`, amax `[E]` per expert (or `[E, N, 1]` per token). With a per-tensor
  amax (the weights) and the planar layout it loads `[16 nbc, rows_2d]` tiles whose columns are
  the quantized rows, and splits them in the thread into element planes
  (`triton_kmajor`; 1x16 blocks and 16x16 tiles, whose max and error reduce across the
  16 threads of a tile); otherwise the tiled kernel loads `[chunk, rows]` and transposes it in
  registers. The per-tensor amax pass reads the stack as stored (K rows of N contiguous values).

Bit-exactness on the GPU
------------------------
The contract (docs/numerics.md §2/§3) fixes every `fl()` as one IEEE f32 op, no FMA. Compiled,
three Triton defaults would break it: `arith.divf` lowers to the approximate
`div.full.f32`; LLVM contracts `a*b - c` into an FMA (the fast-error subtraction and the
MSE sum of squares); and float min/max lower to `minnumf`/`maxnumf`, which drop NaN.
So compiled kernels do every contract op through `RoundedArith` (inline PTX `div.rn.f32`,
`mul.rn.f32`, `add.rn.f32`, `sub.rn.f32`, and `fma.rn.f32` / `abs.f32` where the planar
encoder needs them: correctly rounded, never contracted or flushed; Triton's own fabs is
`FADD.FTZ |a|, -0`, which flushes a subnormal error term),
and abs/max/E4M3 rounding/E2M1 sign are integer bit operations (`block_math`).
The fast 4/6 error's product `dec(q)*sf` is exact in f32 (as it is in the f16 registers
the paper uses), so it is formed in f32; the subtraction is the contract's f32 one.
E4M3 scales are computed on the bits and stored as bytes, not with the f32->fp8 cast.
Compares that a flush-to-zero compare could change (A == 0, S_enc == 0, err4 < err6) are
done on the bits too, and bf16 <-> f32 conversions are bit shifts, so f32 subnormals behave
as IEEE says on the GPU. Interpret mode runs the same kernel body with jnp ops
(`PlainArith`, pinned against XLA:CPU's FMA contraction and reciprocal-multiply rewrite);
XLA:CPU flushes subnormals, so interpret mode is IEEE-exact only where no f32 subnormal
arises (the reference on the CPU shares that limit).

NaN sign: an E2M1 code carries the sign bit of `fl(x*inv)`. In a block whose value is NaN
the scale byte is NaN (0x7F), so the block dequantizes to NaN whatever its codes are; the
codes there follow the platform's NaN sign rules (x86 propagates an operand NaN's sign,
NVIDIA GPUs return the canonical +NaN), which is why the GPU tests use positive NaNs.

Longer than ~400 lines because the tiled and planar kernels share one quantize builder, the
wrappers and the launch code, which a split would duplicate; the planar block math is in
`triton_planar`, the K-major expert-stack kernel and the shared chunk loop in `triton_kmajor`, the
launch shapes in `tunables`, the PTX ops in `triton_arith`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant import triton_planar as planar
from pallas_kernels.nvfp4_quant import wrappers
from pallas_kernels.nvfp4_quant.triton_kmajor import arith, as_f32, chunk_loop, kmajor_planar_kernel
from pallas_kernels.nvfp4_quant.tunables import DEFAULT_TUNABLES, TritonQuantTunables, default_tunables, next_power_of_two

QUANT_NAME = "fp4rl_nvfp4_quant_triton"
AMAX_NAME = "fp4rl_nvfp4_amax_triton"
DEQUANT_NAME = "fp4rl_nvfp4_dequant_triton"


# ----------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------


def _load_raw(x_ref, g, r0, k0, *, rows, chunk, m, k, k_major):
    """x[g, r0:r0+rows, k0:k0+chunk] in its own dtype, [rows, chunk], zeros outside the array."""
    row_ok = (r0 + jnp.arange(rows)) < m
    col_ok = (k0 + jnp.arange(chunk)) < k
    if k_major:  # x is [G, K, M]: load [chunk, rows] and transpose in registers
        mask = col_ok[:, None] & row_ok[None, :]
        return plgpu_triton.load(x_ref.at[g, pl.ds(k0, chunk), pl.ds(r0, rows)], mask=mask, other=0).T
    mask = row_ok[:, None] & col_ok[None, :]
    return plgpu_triton.load(x_ref.at[g, pl.ds(r0, rows), pl.ds(k0, chunk)], mask=mask, other=0)


def _load_rows(x_ref, g, r0, k0, **kw):
    """x[g, r0:r0+rows, k0:k0+chunk] as f32 [rows, chunk], zeros outside the array."""
    return as_f32(_load_raw(x_ref, g, r0, k0, **kw))


def _row_amax_bits(load_chunk, n_chunks, rows):
    """max |x| over each row's K elements as int32 bits (NaN-propagating, exact)."""
    if n_chunks == 1:
        return jnp.max(bm.abs_bits(load_chunk(0)), axis=1)

    def body(i, acc):
        return jnp.maximum(acc, jnp.max(bm.abs_bits(load_chunk(i)), axis=1))

    return lax.fori_loop(0, n_chunks, body, jnp.zeros((rows,), jnp.int32))


def _store_cols(ref_, g, r0, c0, value, *, rows, m, ncols):
    row_ok = (r0 + jnp.arange(rows)) < m
    width = value.shape[1]
    col_ok = (c0 + jnp.arange(width)) < ncols
    plgpu_triton.store(
        ref_.at[g, pl.ds(r0, rows), pl.ds(c0, width)], value, mask=row_ok[:, None] & col_ok[None, :]
    )


def _quant_refs(refs, amax_given, stochastic=False):
    """(x, amax in or None, draws or None, codes, scales, map4, amax out or None) of a quantize kernel."""
    refs = list(refs)
    x_ref = refs.pop(0)
    amax_ref = refs.pop(0) if amax_given else None
    uniform_ref = refs.pop(0) if stochastic else None
    codes_ref, scales_ref, map4_ref = refs[:3]
    return x_ref, amax_ref, uniform_ref, codes_ref, scales_ref, map4_ref, (None if amax_given else refs[3])


def _quant_kernel(*refs, m, k, rows, chunk, config, k_major, amax_given, prefetch, interpret, stochastic=False):
    x_ref, amax_ref, uniform_ref, codes_ref, scales_ref, map4_ref, amax_out_ref = _quant_refs(refs, amax_given,
                                                                                             stochastic)
    ar = arith(interpret)
    g = pl.program_id(0)
    r0 = pl.program_id(1) * rows
    n_chunks = pl.cdiv(k, chunk)
    nb = chunk // bm.BLOCK
    row_ok = (r0 + jnp.arange(rows)) < m

    def load_raw(i):
        return _load_raw(x_ref, g, r0, i * chunk, rows=rows, chunk=chunk, m=m, k=k, k_major=k_major)

    def load_chunk(i):
        return as_f32(load_raw(i))

    first = load_chunk(0) if n_chunks == 1 else None  # one chunk: load x once for both passes
    if amax_given:
        amax = plgpu_triton.load(amax_ref.at[g, pl.ds(r0, rows)], mask=row_ok, other=0.0)
    else:
        amax = bm.from_bits(_row_amax_bits(lambda i: first if first is not None else load_chunk(i), n_chunks, rows))
        plgpu_triton.store(amax_out_ref.at[g, pl.ds(r0, rows)], amax, mask=row_ok)
    amax = amax[:, None]  # [rows, 1]

    def quantize_chunk(i, x):
        k0 = i * chunk
        uniform = None
        if stochastic:  # the draws of these elements ([G, M, K] as x; masked tails load 0 and are not stored)
            uniform = _load_rows(uniform_ref, g, r0, k0, rows=rows, chunk=chunk, m=m, k=k, k_major=False)
            uniform = uniform.reshape(rows, nb, bm.BLOCK)
        codes, scale_bytes, map4 = bm.quantize_blocks(ar, x.reshape(rows, nb, bm.BLOCK), amax, config, uniform)
        _store_cols(codes_ref, g, r0, k0 // 2, bm.pack_codes(codes.reshape(rows, chunk)),
                    rows=rows, m=m, ncols=k // 2)
        _store_cols(scales_ref, g, r0, k0 // bm.BLOCK, scale_bytes.astype(jnp.uint8),
                    rows=rows, m=m, ncols=k // bm.BLOCK)
        _store_cols(map4_ref, g, r0, k0 // bm.BLOCK, map4, rows=rows, m=m, ncols=k // bm.BLOCK)

    if n_chunks == 1:
        quantize_chunk(0, first)
    else:
        chunk_loop(n_chunks, load_raw, lambda i, raw: quantize_chunk(i, as_f32(raw)), prefetch, 0)


def _planar_quant_kernel(*refs, m, k, rows, nbc, groups, dtype, config, amax_given, prefetch, interpret):
    """1x16 blocks of a row-major input held as element planes (`triton_planar`).

    x_ref: uint32 [G, M, K/16, wpb] (the input's bytes, one row of wpb words per block); a program
    owns `groups` consecutive groups of `rows` rows and walks each `nbc` blocks at a time. Plane j
    of a chunk is word j of each of its blocks, loaded four words at a time (`[rows, nbc, 4]`, 16
    contiguous bytes per thread: vector loads; the planes are split from them inside the thread).
    Codes are written as uint32 [G, M, K/16, 2] (two words per block), scales/map4 one byte per
    block. `groups` > 1 only when a row is one chunk (see `TritonQuantTunables.row_groups`).
    """
    x_ref, amax_ref, _, codes_ref, scales_ref, map4_ref, amax_out_ref = _quant_refs(refs, amax_given)
    ar = arith(interpret)
    g = pl.program_id(0)
    nblocks = k // bm.BLOCK
    n_chunks = pl.cdiv(nblocks, nbc)
    wpb = planar.words_per_block(dtype)

    def row_ok(r0):
        return (r0 + jnp.arange(rows)) < m

    def mask(r0, b0):
        return row_ok(r0)[:, None] & ((b0 + jnp.arange(nbc)) < nblocks)[None, :]

    def load_words(r0, i):  # chunk i's word planes; a chunk past the end loads nothing (all masked)
        b0 = i * nbc
        quad_ok = jnp.broadcast_to(mask(r0, b0)[:, :, None], (rows, nbc, 4))
        words = []
        for q in range(wpb // 4):  # 4 contiguous words (16 bytes) of every block: one 128-bit load per thread
            quad = plgpu_triton.load(x_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc), pl.ds(4 * q, 4)],
                                     mask=quad_ok, other=0)
            words += planar.unstack_quad(quad)
        return words

    def chunk_max(words):  # [rows, nbc]: reduced across threads once, after the loop
        return planar.max_bits([bm.abs_bits(x) for x in planar.elements_from_words(words, dtype)])

    def given_amax(r0):
        return plgpu_triton.load(amax_ref.at[g, pl.ds(r0, rows)], mask=row_ok(r0), other=0.0)

    def store_amax(r0, bits):
        amax = bm.from_bits(bits)
        plgpu_triton.store(amax_out_ref.at[g, pl.ds(r0, rows)], amax, mask=row_ok(r0))
        return amax

    def quantize_chunk(r0, i, words, amax):
        b0 = i * nbc
        codes, scale_bytes, map4 = planar.quantize_planes(ar, planar.elements_from_words(words, dtype), amax, config)
        pair_ok = jnp.broadcast_to(mask(r0, b0)[:, :, None], (rows, nbc, 2))
        plgpu_triton.store(codes_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc), pl.ds(0, 2)],
                           jnp.stack(codes, axis=-1), mask=pair_ok)  # the block's two code words: one 64-bit store
        plgpu_triton.store(scales_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc)], scale_bytes.astype(jnp.uint8),
                           mask=mask(r0, b0))
        plgpu_triton.store(map4_ref.at[g, pl.ds(r0, rows), pl.ds(b0, nbc)], map4, mask=mask(r0, b0))

    def pipelined(n, load, process, state, first, wrap):
        """state = process(i, load(i), state) for i < n. With `prefetch`, load(i+1) is issued before
        item i is processed and carried by the loop, so a warp has loads in flight while it
        computes; after the last item the prefetch is load(0) if `wrap`, else load(n) (past the
        end: all masked, loads nothing). Returns (state, that last prefetch)."""
        if not prefetch:
            return lax.fori_loop(0, n, lambda i, st: process(i, load(i), st), state), None

        def body(i, carry):
            st, item = carry
            nxt = load(lax.rem(i + 1, n) if wrap else i + 1)
            return process(i, item, st), nxt

        return lax.fori_loop(0, n, body, (state, first))

    # The first chunk's index is traced: a static slice is bounds-checked at trace time as if
    # unmasked, which rejects the masked tail of a chunk wider than the row.
    zero = pl.program_id(0) * 0
    first_row = pl.program_id(1) * (groups * rows)
    if n_chunks == 1:  # a row is one chunk: loaded once, for both the amax and the quantization
        def group_start(j):
            return first_row + j * rows

        def quantize_group(j, words, st):
            r0 = group_start(j)
            amax = given_amax(r0) if amax_given else store_amax(r0, jnp.max(chunk_max(words), axis=1))
            quantize_chunk(r0, zero, words, amax[:, None])
            return st

        def load_group(j):
            return load_words(group_start(j), zero)

        if groups == 1:
            quantize_group(zero, load_group(zero), 0)
        else:
            pipelined(groups, load_group, quantize_group, 0, load_group(zero) if prefetch else None, wrap=False)
        return

    # Several chunks: two passes over the row (amax, then quantize); one row group per program.
    r0 = first_row

    def load_chunk(i):
        return load_words(r0, i)

    first = load_chunk(zero) if prefetch else None
    if amax_given:
        amax = given_amax(r0)
    else:  # the amax pass's last prefetch is the quantize pass's chunk 0
        bits, first = pipelined(n_chunks, load_chunk, lambda i, words, acc: jnp.maximum(acc, chunk_max(words)),
                                jnp.zeros((rows, nbc), jnp.int32), first, wrap=True)
        amax = store_amax(r0, jnp.max(bits, axis=1))

    def quantize_step(i, words, st):
        quantize_chunk(r0, i, words, amax[:, None])
        return st

    pipelined(n_chunks, load_chunk, quantize_step, 0, first, wrap=False)


def _amax_kernel(x_ref, out_ref, *, m, k, rows, chunk, k_major):
    g = pl.program_id(0)
    r0 = pl.program_id(1) * rows
    row_ok = (r0 + jnp.arange(rows)) < m

    def load_chunk(i):
        return _load_rows(x_ref, g, r0, i * chunk, rows=rows, chunk=chunk, m=m, k=k, k_major=k_major)

    bits = _row_amax_bits(load_chunk, pl.cdiv(k, chunk), rows)
    plgpu_triton.store(out_ref.at[g, pl.ds(r0, rows)], bm.from_bits(bits), mask=row_ok)


def _dequant_kernel(codes_ref, scales_ref, amax_ref, out_ref, *, m, k, rows, chunk, e4m3_bound, interpret):
    ar = arith(interpret)
    g = pl.program_id(0)
    r0 = pl.program_id(1) * rows
    row_ok = (r0 + jnp.arange(rows)) < m
    nb = chunk // bm.BLOCK
    amax = plgpu_triton.load(amax_ref.at[g, pl.ds(r0, rows)], mask=row_ok, other=0.0)
    s_dec = bm.dequant_s_dec(ar, amax, e4m3_bound)[:, None, None]

    def body(i, carry):
        k0 = i * chunk
        half_ok = (k0 // 2 + jnp.arange(chunk // 2)) < k // 2
        packed = plgpu_triton.load(
            codes_ref.at[g, pl.ds(r0, rows), pl.ds(k0 // 2, chunk // 2)],
            mask=row_ok[:, None] & half_ok[None, :], other=0,
        )
        blk_ok = (k0 // bm.BLOCK + jnp.arange(nb)) < k // bm.BLOCK
        sbytes = plgpu_triton.load(
            scales_ref.at[g, pl.ds(r0, rows), pl.ds(k0 // bm.BLOCK, nb)],
            mask=row_ok[:, None] & blk_ok[None, :], other=0,
        )
        sf = bm.e4m3_decode(sbytes.astype(jnp.int32))
        dec = bm.e2m1_decode(bm.unpack_codes(packed)).reshape(rows, nb, bm.BLOCK)
        # fl(fl(dec * sf) * S_dec), then one rounding to the output dtype (reference order).
        value = ar.mul(ar.mul(dec, sf[..., None]), s_dec).reshape(rows, chunk)
        value = bm.f32_to_bf16(value) if out_ref.dtype == jnp.bfloat16 else value.astype(out_ref.dtype)
        _store_cols(out_ref, g, r0, k0, value, rows=rows, m=m, ncols=k)
        return carry

    n_chunks = pl.cdiv(k, chunk)
    if n_chunks == 1:
        body(0, 0)
    else:
        lax.fori_loop(0, n_chunks, body, 0)


# ----------------------------------------------------------------------------------------
# pallas_call builders (shapes static, so they are built inside the jitted wrappers)
# ----------------------------------------------------------------------------------------


def _params(tunables: TritonQuantTunables):
    return plgpu_triton.CompilerParams(num_warps=tunables.num_warps, num_stages=tunables.num_stages)


def _row_amax_call(x_g, *, m, k, k_major, tunables, interpret):
    rows, chunk = tunables.rows_1d, tunables.chunk(k)
    groups = x_g.shape[0]
    kernel = functools.partial(_amax_kernel, m=m, k=k, rows=rows, chunk=chunk, k_major=k_major)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((groups, m), jnp.float32),
        grid=(groups, pl.cdiv(m, rows)),
        compiler_params=_params(tunables),
        interpret=interpret,
        name=AMAX_NAME,
    )(x_g)


def _quant_call(x_g, amax_rows, *, m, k, k_major, config, tunables, interpret, uniform_g=None):
    groups = x_g.shape[0]
    stochastic = uniform_g is not None  # stochastic rounding: the tiled kernel, which reads the draws as it reads x
    planar_layout = tunables.layout == "planar" and not k_major and not config.block_2d and not stochastic
    kmajor_planar = tunables.layout == "planar" and k_major and amax_rows is not None and not stochastic
    row_groups = 1
    if kmajor_planar:  # element planes read along K; codes written as uint32 word pairs, as below
        rows = tunables.rows_2d
        kernel = functools.partial(kmajor_planar_kernel, m=m, k=k, rows=rows,
                                   nbc=min(tunables.block_k_2d, next_power_of_two(k)) // bm.BLOCK, config=config,
                                   prefetch=tunables.prefetch, interpret=interpret)
        x_in = x_g
        codes_shape = jax.ShapeDtypeStruct((groups, m, k // bm.BLOCK, 2), jnp.uint32)
    elif planar_layout:  # codes written as uint32 word pairs (one per block), read from the input's words
        rows = tunables.rows_1d
        row_groups = tunables.row_groups if tunables.chunk(k) >= k else 1
        kernel = functools.partial(_planar_quant_kernel, m=m, k=k, rows=rows, nbc=tunables.chunk(k) // bm.BLOCK,
                                   groups=row_groups, prefetch=tunables.prefetch,
                                   dtype=x_g.dtype, config=config, amax_given=amax_rows is not None,
                                   interpret=interpret)
        x_in = planar.as_words(x_g).reshape(groups, m, k // bm.BLOCK, planar.words_per_block(x_g.dtype))
        codes_shape = jax.ShapeDtypeStruct((groups, m, k // bm.BLOCK, 2), jnp.uint32)
    else:
        rows = tunables.rows(config)
        kernel = functools.partial(_quant_kernel, m=m, k=k, rows=rows, chunk=tunables.chunk(k, config), config=config,
                                   k_major=k_major, amax_given=amax_rows is not None, prefetch=tunables.prefetch,
                                   interpret=interpret, stochastic=stochastic)
        codes_shape, x_in = jax.ShapeDtypeStruct((groups, m, k // 2), jnp.uint8), x_g
    out_shape = [
        codes_shape,
        jax.ShapeDtypeStruct((groups, m, k // bm.BLOCK), jnp.uint8),
        jax.ShapeDtypeStruct((groups, m, k // bm.BLOCK), jnp.bool_),
    ]
    if amax_rows is None:
        out_shape.append(jax.ShapeDtypeStruct((groups, m), jnp.float32))
    args = (x_in,) + (() if amax_rows is None else (amax_rows,)) + ((uniform_g,) if stochastic else ())
    outs = list(pl.pallas_call(
        kernel,
        out_shape=tuple(out_shape),
        grid=(groups, pl.cdiv(m, rows * row_groups)),
        compiler_params=_params(tunables),
        interpret=interpret,
        name=QUANT_NAME,
    )(*args))
    if planar_layout or kmajor_planar:
        outs[0] = lax.bitcast_convert_type(outs[0], jnp.uint8).reshape(groups, m, k // 2)
    return tuple(outs) if amax_rows is None else (*outs, None)


def _quantize_groups(x_g, amax, config, *, m, k, k_major, tunables, interpret, uniform_g=None):
    """x_g [G, M, K] (or [G, K, M] when k_major) -> raw outputs and the amax to report.
    uniform_g: None, or stochastic rounding's draws f32 [G, M, K] (row-major x only)."""
    groups = x_g.shape[0]
    if config.scale == "token" and amax is None:
        codes, sbytes, map4, row_amax = _quant_call(
            x_g, None, m=m, k=k, k_major=k_major, config=config, tunables=tunables, interpret=interpret,
            uniform_g=uniform_g)
        return codes, sbytes, map4, row_amax
    if amax is None:  # per tensor: row maxima in Pallas, then a max over rows per group
        # A group's max is over all its elements, whatever axis its blocks run along, so the rows
        # are read as stored: a K-major stack [G, K, M] as K rows of M contiguous elements (read
        # as [chunk, rows] tiles, its runs of `rows_1d` elements would use a fraction of each burst).
        rows, width = (k, m) if k_major else (m, k)
        row_amax = _row_amax_call(x_g, m=rows, k=width, k_major=False, tunables=tunables, interpret=interpret)
        # max over rows on the bits: NaN-propagating on every platform (XLA:CPU's vectorised
        # float max reductions have been seen to drop NaN)
        group_amax = bm.from_bits(jnp.max(bm.abs_bits(row_amax), axis=1))
        amax_r = jnp.broadcast_to(group_amax[:, None], (groups, m))
    else:
        amax_r = amax
    codes, sbytes, map4, _ = _quant_call(
        x_g, amax_r, m=m, k=k, k_major=k_major, config=config, tunables=tunables, interpret=interpret,
        uniform_g=uniform_g)
    return codes, sbytes, map4, (amax_r if config.scale == "token" else amax_r[:, 0])


def _validate(x, config, tunables):
    if not isinstance(config, ref.NVFP4Config):
        raise TypeError(f"config must be an NVFP4Config, got {type(config).__name__}")
    if not isinstance(tunables, TritonQuantTunables):
        raise TypeError(f"tunables must be a TritonQuantTunables, got {type(tunables).__name__}")
    wrappers.check_input(x, config)


# ----------------------------------------------------------------------------------------
# Public wrappers
# ----------------------------------------------------------------------------------------


def quantize_triton(x, config: ref.NVFP4Config = ref.NVFP4Config(), *, interpret: bool = False,
                    amax=None, tunables: TritonQuantTunables | None = None, uniform=None) -> ref.NVFP4Tensor:
    """`fp4rl.formats.nvfp4.quantize(x, config, amax=amax)`, fused in Pallas Triton kernels.

    x: float32/bfloat16/float16 [..., K], K a multiple of 16 (2D: rows a multiple of 16).
    amax: optional global amax, `()` per tensor or `[..., 1]` per token (as the reference).
    interpret: run the kernels in Pallas interpret mode (CPU); otherwise a GPU is required.
    tunables: launch shape; None = `default_tunables(config, K)`.
    uniform: stochastic rounding's draws, f32 in [0, 1) of x's shape: the result is then the
      reference's `quantize(x, config, sr_key=key)` for the draws `jax.random.uniform(key, x.shape)`
      (docs/numerics.md §6; not with 4/6). Read by the tiled kernel (the planar layout is not used).
    """
    _validate(x, config, DEFAULT_TUNABLES if tunables is None else tunables)
    wrappers.check_uniform(x, config, uniform)
    if tunables is None:
        tunables = default_tunables(config, jnp.shape(x)[-1])
    wrappers.require_gpu(interpret, QUANT_NAME)
    return _quantize_jit(x, None if amax is None else jnp.asarray(amax, jnp.float32), uniform, config, interpret,
                         tunables)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _quantize_jit(x, amax, uniform, config, interpret, tunables):
    *lead, k = x.shape
    m = math.prod(lead)
    x_g = x.reshape(1, m, k)
    amax_r = None if amax is None else wrappers.amax_rows(amax, config, tuple(lead), 1)
    codes, sbytes, map4, amax_out = _quantize_groups(
        x_g, amax_r, config, m=m, k=k, k_major=False, tunables=tunables, interpret=interpret,
        uniform_g=None if uniform is None else uniform.reshape(1, m, k))
    if amax is not None:
        amax_out = amax
    elif config.scale == "token":
        amax_out = amax_out.reshape(*lead, 1)
    else:
        amax_out = amax_out.reshape(())
    return wrappers.assemble(codes, sbytes, map4, amax_out, config, tuple(lead), k)


def quantize_experts_triton(w, config: ref.NVFP4Config = ref.NVFP4Config(), *, contraction_axis: int = 1,
                            interpret: bool = False, amax=None,
                            tunables: TritonQuantTunables | None = None) -> ref.NVFP4Tensor:
    """Quantize an expert stack, each expert on its own: `jax.vmap(reference.quantize)`.

    w: [E, K, N] (contraction_axis=1, the qdot weight layout) or [E, N, K] (contraction_axis=2).
    Blocks run along K; the result is laid out [E, N, K/2] / [E, N, K/16], i.e. equal to
    `jax.vmap(lambda v: quantize(v, config))(w if K is last else swapaxes(w, 1, 2))`:
    amax `[E]` per expert (per tensor) or `[E, N, 1]` (per token). A K-major stack is read
    as stored (module docstring); no transposed copy of w is made.
    amax: optional, `[E]` per tensor or `[E, N, 1]` per token.
    tunables: launch shape; None = `default_tunables(config, K, k_major=contraction_axis == 1)`.
    """
    e, n, k = wrappers.expert_stack_dims(w, contraction_axis)
    _validate(jax.ShapeDtypeStruct((n, k), jnp.result_type(w)), config, DEFAULT_TUNABLES if tunables is None else tunables)
    if tunables is None:
        tunables = default_tunables(config, k, k_major=contraction_axis == 1)
    wrappers.require_gpu(interpret, QUANT_NAME)
    amax = None if amax is None else jnp.asarray(amax, jnp.float32)
    return _quantize_experts_jit(w, amax, config, contraction_axis == 1, interpret, tunables)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _quantize_experts_jit(w, amax, config, k_major, interpret, tunables):
    e = w.shape[0]
    n, k = (w.shape[2], w.shape[1]) if k_major else (w.shape[1], w.shape[2])
    amax_r = None if amax is None else wrappers.amax_rows(amax, config, (e, n), e)
    codes, sbytes, map4, amax_out = _quantize_groups(
        w, amax_r, config, m=n, k=k, k_major=k_major, tunables=tunables, interpret=interpret
    )
    if amax is not None:
        amax_out = amax
    elif config.scale == "token":
        amax_out = amax_out.reshape(e, n, 1)
    return wrappers.assemble(codes, sbytes, map4, amax_out, config, (e, n), k)


def dequantize_triton(t: ref.NVFP4Tensor, dtype=jnp.bfloat16, *, interpret: bool = False,
                      tunables: TritonQuantTunables = DEFAULT_TUNABLES):
    """`fp4rl.formats.nvfp4.dequantize(t, dtype)` as a Pallas Triton kernel: [..., K] in `dtype`.

    Also takes the `[E]`-amax tensors of `quantize_experts_triton` (then it equals
    `jax.vmap(reference.dequantize)`). Order: fl(fl(dec(q) * f32(sf)) * S_dec), then one
    rounding to `dtype`; S_dec is NaN where the amax is not finite (docs/numerics.md §8).
    """
    if not isinstance(t, ref.NVFP4Tensor):
        raise TypeError(f"dequantize takes an NVFP4Tensor, got {type(t).__name__}")
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise TypeError(f"dequantize writes float32, bfloat16 or float16, got {dtype}")
    wrappers.check_k(t.codes.shape[-1] * 2)
    wrappers.require_gpu(interpret, DEQUANT_NAME)
    return _dequantize_jit(t, dtype, interpret, tunables)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _dequantize_jit(t, dtype, interpret, tunables):
    *lead, half = t.codes.shape
    k = 2 * half
    m = math.prod(lead)
    rows, chunk = tunables.rows_1d, tunables.chunk(k)
    codes = t.codes.reshape(1, m, half)
    sbytes = lax.bitcast_convert_type(t.scales, jnp.uint8).reshape(1, m, k // bm.BLOCK)
    amax_r = wrappers.dequant_amax_rows(t).reshape(1, m)
    kernel = functools.partial(
        _dequant_kernel, m=m, k=k, rows=rows, chunk=chunk, e4m3_bound=t.config.e4m3_bound, interpret=interpret
    )
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((1, m, k), dtype),
        grid=(1, pl.cdiv(m, rows)),
        compiler_params=_params(tunables),
        interpret=interpret,
        name=DEQUANT_NAME,
    )(codes, sbytes, amax_r)
    return out.reshape(*lead, k)
