"""`qdot`: the model's linear layers as an emulated NVFP4 (or MXFP8) GEMM with custom backward.

Forward (docs/numerics.md §2): activations quantized per token (or per tensor) in 1x16 blocks along
K; weights in 16x16 (or 1x16) blocks along K; optional 4/6 on each; the GEMM consumes the exact
bf16 operands dec(q) * sf with f32 accumulation, and the global decode scales multiply the
output as an epilogue. This is what a Blackwell FP4 tensor core computes, up to the order of
accumulation; Hopper has no FP4 tensor cores, so we emulate it.

Backward modes (docs/numerics.md §7), a plain `jax.custom_vjp` over arrays:
- "bf16":        dx = g @ w^T,              dw = x^T @ g              (raw operands)
  quantized forward, BF16 backward: the paper's baseline (arms nvfp4, +46, +hp, full-dq, mxfp8).
- "dequantized": dx = g @ DQ(Q(w))^T,       dw = DQ(Q(x))^T @ g       (intervention 1)
  residuals are the packed codes + scales + amax only (no bf16 copies, no raw x).
- "quantized":   dx = Q_sr(g) @ Q(w)^T,     dw = Q_rht(x)^T @ Q_rht,sr(g)
  the NVFP4 pretraining recipe (arm nvfp4-pt): g quantized with stochastic rounding, operands re-quantized
  along the contraction dimension of each backward GEMM with per-tensor scales, a random
  Hadamard transform along tokens on both wgrad operands. The key is an explicit argument.
  With MXFP8 (arm mxfp8-q) the backward operands are re-quantized to MXFP8, no SR, no RHT.
A BF16 site (format "bf16") goes through the same custom_vjp with no quantization at all:
y = x @ w in x's dtype and the exact gradient, so every site shares the grouped-GEMM code.
Backward GEMMs accumulate in f32. Quantized operands enter them as the forward's do: the exact
bf16 values dec(q) * sf, with the global decode scale multiplying the f32 result (per expert for
a stack). DQ(Q(.)) = values * scale is not representable in bf16 in general, so rounding it to
bf16 would add a second rounding to the contract's one (docs/numerics.md §2). The one exception is
the dequantized wgrad with per-token activation scales: the scale varies along the tokens that
wgrad contracts over, so it cannot be an epilogue; there DQ(Q(x)) stays in f32 (its single
rounding) and that GEMM runs in f32.

Amplified sites (`SiteConfig.amplification` a != 1, the dose-response arms `nvfp4@A` / `+dq@A`,
docs/rl.md "Precision recipes"): the forward runs on x_a = x + a * (DQ(Q(x)) - x) and
w_a = w + a * (DQ(Q(w)) - w), each formed in f32 from the reference-exact DQ(Q(.)) and rounded
once to bf16, the operand dtype of the GEMMs (an emulation: v_a is not NVFP4-representable, so no
scale epilogue can keep it exact; the bf16 rounding, relative 2^-9, is small against the dose,
a |DQ(Q(v)) - v|). "bf16" backward: raw x and w, as at a = 1 (the paper's mismatch, amplified);
"dequantized": x_a and w_a, the chain rule of the amplified forward (its residuals are x_a and w_a
in bf16). `quantize_weight` returns w_a as a `ScaledWeight` (scale 1) in the weight's own layout
[K, N] / [E, K, N], which weight sync hands to the sampler, so the sampler's forward is the
trainer's (a GEMM reading a transposed operand may sum in another order in a program that forms it
than in one that receives it: XLA:CPU does). w_a has no packed form: on a packed-weight
backend ("packed", "packed_dgrad", "packed_wgmma" and their interpreters) its GEMMs are bf16
GEMMs, which those backends run on their bf16 kernels ("mosaic"), as they run a BF16 site's.
At a = 1 none of this is traced: the site's code path and bytes are those of the plain recipe.

Weight layouts: w [K, N] with x [..., K]; w [E, K, N] with x [E, ..., K] (equal-size
groups, vmapped); w [E, K, N] with x [R, K] sorted by expert and `group_sizes` [E] (ragged,
dropless; for the quantized backward every group must be a multiple of 32 rows, so that the
Hadamard and scale blocks along tokens never straddle two experts). The groups cover every row
of x unless the caller declares the rows past them padding (`padding_rows`); wrong sizes raise
when concrete and give NaN under jit (`qdot`), never rows of zeros that look like an answer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4rl import grouped, operands
from fp4rl.exact_dot import exact_precision, promoted
from fp4rl.formats import hadamard, ieee, mx, nvfp4
from fp4rl.recipe import SiteConfig

F32 = jnp.float32
TOKEN_ALIGN = 32  # tokens are padded to this for the quantized wgrad (NVFP4: 16, MXFP8: 32)


# ---------------------------------------------------------------- GEMMs of the three layouts
def _gemm(a_TxC, b_CxN, group_sizes, gemm: str, transpose_rhs: bool = False):
    """a @ b with f32 accumulation (a @ b^T with transpose_rhs: b is [N, C] / [E, N, C]);
    ragged: rows of `a` grouped, b [E, C, N] per group, on the `gemm` backend (fp4rl.grouped)."""
    if group_sizes is None:
        return jnp.matmul(a_TxC, _swap(b_CxN) if transpose_rhs else b_CxN, preferred_element_type=F32,
                          precision=exact_precision(jnp.promote_types(a_TxC.dtype, b_CxN.dtype)))
    return grouped.ragged_matmul(a_TxC, b_CxN, group_sizes, gemm=gemm, transpose_rhs=transpose_rhs)


def _wgrad_gemm(a_TxK, g_TxN, group_sizes, gemm: str):
    """a^T @ g over tokens: [K, N], or per group [E, K, N] in the ragged layout. Operands of two
    dtypes (f32 and bf16) are widened exactly (XLA) or split exactly (Mosaic, fp4rl.grouped)."""
    if group_sizes is None:
        a_TxK, g_TxN = promoted(a_TxK, g_TxN)
        return lax.dot_general(a_TxK, g_TxN, (([0], [0]), ([], [])), preferred_element_type=F32,
                               precision=exact_precision(a_TxK.dtype))
    return grouped.ragged_wgrad(a_TxK, g_TxN, group_sizes, gemm=gemm)


def _per_row(weight_scale, group_sizes, num_rows):
    """The weight's global decode scale for each output row: scalar, or the row's expert's."""
    if group_sizes is None or jnp.ndim(weight_scale) == 0:
        return weight_scale
    ends = jnp.cumsum(group_sizes)
    # compare_all: one fused compare-and-count; the default binary search is a while loop, whose
    # condition the GPU hands back to the host at every iteration (a sync per iteration, per call)
    row_group = jnp.searchsorted(ends, jnp.arange(num_rows), side="right", method="compare_all")
    return weight_scale.reshape(-1)[jnp.minimum(row_group, weight_scale.size - 1)][:, None]


def _swap(m):
    return jnp.swapaxes(m, -1, -2)


def _weight_array(wq):
    """The array whose shape is the weight's: codes / elements / values of a quantized weight."""
    if isinstance(wq, nvfp4.NVFP4Tensor):
        return wq.codes
    if isinstance(wq, mx.MXTensor):
        return wq.elements
    if isinstance(wq, operands.ScaledWeight):
        return wq.values
    return wq


def _weight_ndim(wq) -> int:
    return _weight_array(wq).ndim


def _reads_packed(wq, group_sizes, gemm: str, packed_backends) -> bool:
    """Whether this GEMM reads the weight packed: an NVFP4 expert stack on one of `packed_backends`."""
    return group_sizes is not None and gemm in packed_backends and isinstance(wq, nvfp4.NVFP4Tensor)


def _per_weight(fn, wq, *args):
    """Apply `fn` to a (raw or quantized) weight, one expert at a time for a stack: each
    expert is its own tensor with its own amax."""
    if _weight_ndim(wq) == 3:
        return jax.vmap(lambda t: fn(t, *args))(wq)
    return fn(wq, *args)


# ---------------------------------------------------------------- quantizing the operands
def quantize_weight(w, site: SiteConfig, impl: str = "auto"):
    """Quantize a weight [K, N] (or an expert stack [E, K, N], one tensor per expert) along K.

    Returns the quantized w^T ([N, K] / [E, N, K]) that `qdot` consumes; the trainer's forward
    and the sampler's weight sync both call this, so their bytes are identical. A BF16 site
    returns `w` unchanged; an amplified site w_a in bf16, not transposed (`_amplified_weight`).
    """
    if not site.quantized:
        return w
    if _nvfp4_stack(w, site):
        wq = operands.nvfp4_quantize_experts(w, site.weight_config(), impl, contraction_axis=1)
    else:
        wq = _per_weight(lambda m: operands.quantize(_swap(m), site, "weight", impl), w)
    return wq if site.amplification == 1.0 else _amplified_weight(w, wq, site)


# ---------------------------------------------------------------- the amplified emulation
def amplified(v, dq, amplification: float):
    """v + a * (dq - v) in f32, each operation rounded on its own (a barrier keeps XLA from
    contracting the product into an FMA or the dequantization into the subtraction), then rounded
    once to bf16: the operand of a site with amplification a (see the module docstring)."""
    v32 = ieee.as_stored(v).astype(F32)  # the value the quantizer read, not a fused producer's
    step = ieee.product(amplification, lax.optimization_barrier(dq.astype(F32)) - v32)
    return (v32 + step).astype(jnp.bfloat16)


def _amplified_weight(w, wq, site: SiteConfig) -> operands.ScaledWeight:
    """w_a ([K, N] / [E, K, N], w's layout) in bf16 from w and its quantized w^T `wq`, with scale 1
    (per expert for a stack, whose every array leaf then has the expert axis first)."""
    values = amplified(w, _swap(_per_weight(operands.dequantized, wq)), site.amplification)
    return operands.ScaledWeight(values=values, scale=jnp.ones(values.shape[:-2], F32),
                                 amplification=site.amplification)


def _check_amplification(wq, site: SiteConfig) -> None:
    """A pre-formed weight must carry the site's amplification: Q(w) cannot give w_a (w is gone),
    and w_a is not Q(w). Both come from `quantize_weight` under the same recipe."""
    given = wq.amplification if isinstance(wq, operands.ScaledWeight) else 1.0
    if site.amplification != 1.0 and not isinstance(wq, operands.ScaledWeight):
        raise ValueError(f"a site with amplification={site.amplification} takes the raw weight or its amplified "
                         f"w_a from quantize_weight(w, site), not a {type(wq).__name__} quantized without it")
    if given != site.amplification:
        raise ValueError(f"a weight formed with amplification={given} given to a site with amplification="
                         f"{site.amplification}: sync the weights under the recipe that runs them")


def _amplified_forward(x_TxK, wa, site: SiteConfig, group_sizes, impl: str, gemm: str):
    """y = x_a @ w_a with f32 accumulation; returns (y, x_a), x_a the dequantized backward's residual."""
    xa = amplified(x_TxK, operands.dequantized(operands.quantize(x_TxK, site, "act", impl)), site.amplification)
    acc = _gemm(xa, wa.values.astype(jnp.bfloat16), group_sizes, gemm)
    return acc.astype(x_TxK.dtype), xa


def _weight_along_n(w, site: SiteConfig, impl: str):
    """Q(w) along N, the contraction dimension of dgrad ([K, N] / [E, K, N])."""
    if _nvfp4_stack(w, site):
        return operands.nvfp4_quantize_experts(w, site.weight_config(), impl, contraction_axis=2)
    return _per_weight(lambda m: operands.quantize(m, site, "weight", impl), w)


def _nvfp4_stack(w, site: SiteConfig) -> bool:
    """An NVFP4 expert stack: quantized by the stack kernels (each expert its own tensor, read in
    its stored layout), with the bytes of quantizing one expert at a time."""
    return site.format == "nvfp4" and jnp.ndim(w) == 3


def _forward_from_quantized(x_TxK, wq, site: SiteConfig, group_sizes, impl: str, gemm: str):
    """y = (Xv @ Wv^T) * (S_dec,x * S_dec,w): the emulated low-precision GEMM.

    A BF16 site has no quantization: `wq` is the raw weight and y = x @ w in x's dtype.
    """
    if not site.quantized:
        return _gemm(x_TxK, wq.astype(x_TxK.dtype), group_sizes, gemm).astype(x_TxK.dtype), None
    _check_amplification(wq, site)
    if site.amplification != 1.0:
        return _amplified_forward(x_TxK, wq, site, group_sizes, impl, gemm)
    xq = operands.quantize(x_TxK, site, "act", impl)
    weight_packed = _reads_packed(wq, group_sizes, gemm, grouped.PACKED_GEMMS)
    if (weight_packed and isinstance(xq, nvfp4.NVFP4Tensor)
            and grouped.reads_packed_rows(x_TxK.shape[0], wq.codes.shape[0], gemm)):
        # both operands read packed: their 16-bit values are formed in the kernel only
        acc = grouped.ragged_matmul_nvfp4_rows(xq.codes, xq.scales, wq.codes, wq.scales, group_sizes, gemm=gemm)
        sx, sw = nvfp4.decode_scale(xq), jax.vmap(nvfp4.decode_scale)(wq)
    elif weight_packed:
        # the kernel reads codes and scales: the bf16 operand is formed in registers only
        xv, sx = operands.gemm_operand(xq)
        acc = grouped.ragged_matmul_nvfp4(xv, wq.codes, wq.scales, group_sizes, gemm=gemm)
        sw = jax.vmap(nvfp4.decode_scale)(wq)
    else:
        xv, sx = operands.gemm_operand(xq)
        wv, sw = _per_weight(operands.gemm_operand, wq)
        acc = _gemm(xv, wv, group_sizes, gemm, transpose_rhs=True)
    return (acc * (sx * _per_row(sw, group_sizes, acc.shape[0]))).astype(x_TxK.dtype), xq


# ---------------------------------------------------------------- the custom_vjp
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _qdot(x_TxK, w, key, group_sizes, site: SiteConfig, impl: str, gemm: str):
    return _forward_from_quantized(x_TxK, quantize_weight(w, site, impl), site, group_sizes, impl, gemm)[0]


def _qdot_fwd(x_TxK, w, key, group_sizes, site: SiteConfig, impl: str, gemm: str):
    wq = quantize_weight(w, site, impl)
    y, xq = _forward_from_quantized(x_TxK, wq, site, group_sizes, impl, gemm)
    w_dtype = jnp.zeros((), w.dtype)  # carries w's dtype for its cotangent (a scalar)
    if site.quantized and site.backward == "dequantized":
        # packed codes/scales/amax only: no raw x, no bf16 copies (amplified: x_a and w_a in bf16)
        residuals = (xq, wq, w_dtype)
    else:
        residuals = (x_TxK, w, key)
    return y, (residuals, group_sizes)


def _qdot_bwd(site: SiteConfig, impl: str, gemm: str, saved, g_TxN):
    residuals, group_sizes = saved
    dtype = g_TxN.dtype
    backward = site.backward if site.quantized else "bf16"  # an unquantized site: the exact gradient
    if backward == "dequantized" and site.amplification != 1.0:  # g @ w_a^T and x_a^T @ g
        xa, wa, w_dtype = residuals
        dx = _gemm(g_TxN, wa.values.astype(dtype), group_sizes, gemm, transpose_rhs=True)
        dw = _wgrad_gemm(xa.astype(dtype), g_TxN, group_sizes, gemm)
        x_dtype, w_dtype = dtype, w_dtype.dtype
    elif backward == "dequantized":
        xq, wq, w_dtype = residuals
        dx = _dequantized_dgrad(g_TxN, wq, group_sizes, gemm)
        dw = _dequantized_wgrad(xq, g_TxN, group_sizes, gemm)
        x_dtype, w_dtype = dtype, w_dtype.dtype
    elif backward == "bf16":
        x, w, _ = residuals
        dx = _gemm(g_TxN, w.astype(dtype), group_sizes, gemm, transpose_rhs=True)
        dw = _wgrad_gemm(x.astype(dtype), g_TxN, group_sizes, gemm)
        x_dtype, w_dtype = x.dtype, w.dtype
    else:
        x, w, key = residuals
        dx, dw = _quantized_backward(x, w, key, g_TxN, group_sizes, site, impl, gemm)
        x_dtype, w_dtype = x.dtype, w.dtype
    return dx.astype(x_dtype), dw.astype(w_dtype), None, None


_qdot.defvjp(_qdot_fwd, _qdot_bwd)


def _dequantized_dgrad(g_TxN, wq, group_sizes, gemm: str):
    """g @ DQ(Q(w))^T as the forward computes its GEMM: (g @ Wv) * S_dec,w, Wv = dec(q) * sf
    exact in g's dtype, the weight's global decode scale (one per expert) on the f32 result."""
    if _reads_packed(wq, group_sizes, gemm, grouped.PACKED_DGRAD_GEMMS):
        # the kernel reads codes and scales, as the forward's: no bf16 copy of the weight stack
        acc = grouped.ragged_dgrad_nvfp4(g_TxN, wq.codes, wq.scales, group_sizes, gemm=gemm)
        sw = jax.vmap(nvfp4.decode_scale)(wq)
    else:
        wv, sw = _per_weight(operands.gemm_operand, wq)  # Q(w^T) values [N, K] / [E, N, K]
        acc = _gemm(g_TxN, wv.astype(g_TxN.dtype), group_sizes, gemm)
    return acc * _per_row(sw, group_sizes, acc.shape[0])


def _dequantized_wgrad(xq, g_TxN, group_sizes, gemm: str):
    """DQ(Q(x))^T @ g. A per-tensor scale (MX: 1) is an epilogue, as in dgrad. A per-token scale
    multiplies the rows of x, the axis wgrad sums over, so it must enter before the sum: then
    DQ(Q(x)) is formed in f32 (the contract's one rounding) and the GEMM runs in f32 (g widened
    exactly; on the Mosaic backend the f32 operand is split exactly into bf16 parts)."""
    xv, sx = operands.gemm_operand(xq)
    if jnp.ndim(sx) == 0:
        return _wgrad_gemm(xv.astype(g_TxN.dtype), g_TxN, group_sizes, gemm) * sx
    return _wgrad_gemm(operands.dequantized(xq), g_TxN, group_sizes, gemm)


def _backward_config(site: SiteConfig, role: str) -> nvfp4.NVFP4Config | None:
    """Per-tensor NVFP4 configs of the backward re-quantization (None for MXFP8)."""
    if site.format != "nvfp4":
        return None
    if role == "grad":
        return nvfp4.NVFP4Config(scale="tensor")
    config = site.act_config()
    return nvfp4.NVFP4Config(scale="tensor", four_over_six=config.four_over_six,
                             e4m3_max=config.e4m3_max, fast_error=config.fast_error)


def _quantized_backward(x_TxK, w, key, g_TxN, group_sizes, site: SiteConfig, impl: str, gemm: str):
    """The NVFP4 pretraining recipe's backward (docs/numerics.md §6/§7); MXFP8: plain re-quantization."""
    if key is None:
        raise ValueError("backward='quantized' needs an explicit jax.random key: qdot(..., key=key)")
    k_dgrad, k_wgrad, k_rht = jax.random.split(key, 3)
    is_nvfp4 = site.format == "nvfp4"
    sr = lambda k: k if is_nvfp4 else None  # noqa: E731  (stochastic rounding is NVFP4's)
    grad_cfg, act_cfg = _backward_config(site, "grad"), _backward_config(site, "act")

    # dgrad = Q_sr(g) @ Q(w)^T, both quantized along N
    gv, sg = operands.gemm_operand(operands.quantize(g_TxN, site, "grad", impl, sr_key=sr(k_dgrad), config=grad_cfg))
    wv, sw = _per_weight(operands.gemm_operand, _weight_along_n(w, site, impl))
    dx = _gemm(gv, wv, group_sizes, gemm, transpose_rhs=True)
    dx = dx * (sg * _per_row(sw, group_sizes, dx.shape[0]))

    # wgrad = Q_rht(x)^T @ Q_rht,sr(g), both quantized along tokens after the same RHT
    num_tokens = x_TxK.shape[0]
    pad = -num_tokens % TOKEN_ALIGN
    if pad and group_sizes is not None:
        raise ValueError(f"ragged quantized backward needs rows a multiple of {TOKEN_ALIGN}, got {num_tokens}")
    xt = jnp.pad(x_TxK.astype(F32), ((0, pad), (0, 0))).T  # [K, T]; zero rows change no product
    gt = jnp.pad(g_TxN.astype(F32), ((0, pad), (0, 0))).T  # [N, T]
    if is_nvfp4:
        xt, gt = hadamard.random_hadamard(xt, k_rht, axis=-1), hadamard.random_hadamard(gt, k_rht, axis=-1)
    xv_t, sx = operands.gemm_operand(operands.quantize(xt, site, "act", impl, config=act_cfg))
    gv_t, sg_t = operands.gemm_operand(operands.quantize(gt, site, "grad", impl, sr_key=sr(k_wgrad), config=grad_cfg))
    dw = _wgrad_gemm(xv_t.T, gv_t.T, group_sizes, gemm) * (sx * sg_t)
    return dx, dw


# ---------------------------------------------------------------- public entry point
def is_quantized_weight(w) -> bool:
    """A weight pre-quantized by `quantize_weight` (weight sync) or formed ahead (`operand_ahead`)."""
    return isinstance(w, (nvfp4.NVFP4Tensor, mx.MXTensor, operands.ScaledWeight))


def operand_ahead(wq):
    """A pre-quantized weight's GEMM operand as a `ScaledWeight` (one tensor per expert for a
    stack); `qdot` then skips forming it. Anything else is returned as it is."""
    if not isinstance(wq, (nvfp4.NVFP4Tensor, mx.MXTensor)):
        return wq
    values, scale = _per_weight(operands.gemm_operand, wq)
    return operands.ScaledWeight(values=values, scale=scale)


def _concrete(value):
    """`value` as a NumPy array, or None under tracing (jit, vmap, grad), where it has no value yet."""
    try:
        return np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_group_sizes(group_sizes, num_rows: int, num_groups: int, padding_rows: bool):
    """Validate a ragged layout's group sizes: their shape always, their values when concrete.

    Returns None when nothing is left to check, else a traced [R] bool, all False when the sizes
    are wrong: under tracing no exception can be raised on values, so the whole output is NaN,
    which the trainer's non-finite checks stop on, instead of rows of zeros (`ragged_dot`'s rows
    past the groups) that look like an answer. With `padding_rows` the traced sizes are the
    caller's contract (the MoE's dispatch builds them to sum to at most R).
    """
    if jnp.ndim(group_sizes) != 1 or jnp.shape(group_sizes)[0] != num_groups:
        raise ValueError(f"group_sizes must have shape ({num_groups},) (one size per expert of w), got {jnp.shape(group_sizes)}")
    if not jnp.issubdtype(jnp.result_type(group_sizes), jnp.integer):
        raise ValueError(f"group_sizes must be integers, got dtype {jnp.result_type(group_sizes)}")
    sizes = _concrete(group_sizes)
    if sizes is not None:
        total = int(sizes.astype(np.int64).sum())
        if (sizes < 0).any():
            raise ValueError(f"group_sizes {sizes.tolist()} has a negative size")
        if total > num_rows or (total < num_rows and not padding_rows):
            raise ValueError(f"group_sizes {sizes.tolist()} sum to {total}, but x has {num_rows} rows: every row must "
                             "belong to exactly one group (pass padding_rows=True if rows past the groups are padding)")
        return None
    if padding_rows:
        return None
    ok = (jnp.sum(group_sizes) == num_rows) & jnp.all(group_sizes >= 0)
    return jnp.broadcast_to(ok, (num_rows,))


def qdot(x, w, site: SiteConfig, *, key=None, group_sizes=None, impl: str = "auto", padding_rows: bool = False,
         gemm: str = "xla"):
    """`x @ w` through the site's precision (see the module docstring for layouts and modes).

    `w` may be a pre-quantized weight from `quantize_weight` (weight sync: forward only).
    `key` is needed by backward="quantized" only. Output dtype: x.dtype.
    `group_sizes` (ragged layout): every row of x belongs to one group, checked when the sizes are
    concrete; under jit wrong sizes make the output NaN. `padding_rows=True` declares
    rows past sum(group_sizes) padding, with zero output rows (the MoE's static row bound).
    `gemm` selects the ragged layout's grouped-GEMM backend, forward and backward (`fp4rl.grouped`:
    "xla", "blocked", "mosaic", "packed", and the interpreters); the dense layouts always use XLA.
    """
    operands.check_impl(impl)
    grouped.check_gemm(gemm)
    prequantized = is_quantized_weight(w)
    w_ndim = _weight_ndim(w)
    if w_ndim not in (2, 3):
        raise ValueError(f"w must be [K, N] or [E, K, N], got {w_ndim} dims")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"qdot needs a contraction dimension K >= 1, got x of shape {x.shape} (an empty contraction)")
    if group_sizes is not None and (w_ndim != 3 or x.ndim != 2):
        raise ValueError(f"group_sizes needs x [R, K] and w [E, K, N]; got x {x.shape}, w with {w_ndim} dims")
    row_ok = None
    if group_sizes is not None:
        num_groups = _weight_array(w).shape[0]
        row_ok = _check_group_sizes(group_sizes, x.shape[0], num_groups, padding_rows)

    if prequantized and not site.quantized:
        raise ValueError("a BF16 site takes the raw weight, not a quantized one")

    if w_ndim == 3 and group_sizes is None:  # equal-size groups: one dense GEMM per expert
        keys = None if key is None else jax.random.split(key, x.shape[0])
        return jax.vmap(lambda xe, we, ke: qdot(xe, we, site, key=ke, impl=impl))(x, w, keys)

    x_TxK = x.reshape(-1, x.shape[-1])
    if prequantized:
        y = _forward_from_quantized(x_TxK, w, site, group_sizes, impl, gemm)[0]
    else:
        y = _qdot(x_TxK, w, key, group_sizes, site, impl, gemm)
    if row_ok is not None:
        y = jnp.where(row_ok[:, None], y, jnp.asarray(jnp.nan, y.dtype))
    return y.reshape(*x.shape[:-1], y.shape[-1])
