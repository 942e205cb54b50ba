"""Quantized GEMM operands: quantize a tensor for one site and hand back what a GEMM consumes.

A quantized operand is `values * scale`, where `values` holds dec(q) * block scale exactly in
bf16 and `scale` is the global decode factor applied to the GEMM output as an epilogue
(docs/numerics.md §2). For MXFP8 the E8M0 scales are powers of two, so the dequantized value is
itself exact in bf16 and `scale` is 1. The implementation of the quantizer (pure-jnp
reference or a Pallas kernel) is chosen explicitly; a kernel that cannot run raises.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fp4rl.formats import ieee, mx, nvfp4
from fp4rl.recipe import SiteConfig

IMPLS = ("auto", "reference", "triton", "mosaic")


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; valid options: {IMPLS}")


def resolve_impl(impl: str) -> str:
    """"auto" is the fastest bit-exact implementation of the platform: the Triton kernels on GPU
    (compiled suite byte-exact vs the NumPy oracle; faster than XLA on 4/6, benchmarks/), the
    jnp reference elsewhere. An explicit choice is returned as is (a kernel that cannot run raises)."""
    check_impl(impl)
    if impl != "auto":
        return impl
    return "triton" if jax.default_backend() == "gpu" else "reference"


@functools.partial(jax.jit, static_argnums=(1, 3))
def _reference_quantize(x, config: nvfp4.NVFP4Config, sr_key, forced_division) -> nvfp4.NVFP4Tensor:
    """`nvfp4.quantize` as a jitted function of its own. A model quantizes at dozens of sites with
    a few (shape, config) pairs; jit traces each pair once per process, where inlined code would
    be traced again at every site of every program (a third of the trace time of an update step).
    XLA inlines the call, so the compiled programs compute the same bytes. `forced_division`
    (`ieee.forced_division()`) keys the cache: a trace made under one division mode must not
    serve a call made under another."""
    del forced_division  # only a cache key: `ieee.divide` reads the same thread-local state
    return nvfp4.quantize(x, config, sr_key=sr_key)


def nvfp4_quantize(x, config: nvfp4.NVFP4Config, impl: str, *, sr_key=None) -> nvfp4.NVFP4Tensor:
    """NVFP4-quantize `x` [..., K] with the chosen implementation (bit-identical by contract).

    Stochastic rounding (`sr_key`, the quantized backward's gradients) runs in the kernel of the
    backends that have it (`pallas_kernels.STOCHASTIC_BACKENDS`: Triton, which "auto"
    picks on a GPU), from the draws `jax.random.uniform(sr_key, x.shape)`, the reference's bits;
    with another `impl` it is the jnp reference's (the same bytes).
    2D-block weights must come one matrix at a time (vmap over experts), so that every
    implementation takes the amax over the same tensor.
    """
    impl = resolve_impl(impl)
    import pallas_kernels  # the kernels depend on fp4rl.formats only; imported on demand

    if impl == "reference" or (sr_key is not None and impl not in pallas_kernels.STOCHASTIC_BACKENDS):
        return _reference_quantize(x, config, sr_key, ieee.forced_division())
    uniform = None if sr_key is None else jax.random.uniform(sr_key, x.shape, jnp.float32)
    if config.block_2d:
        if x.ndim != 2:
            raise ValueError(f"2D-block kernel quantization takes one [N, K] matrix, got {x.shape}; vmap over experts")
        return pallas_kernels.quantize(x, config, backend=impl, uniform=uniform)
    lead, k = x.shape[:-1], x.shape[-1]
    t = pallas_kernels.quantize(x.reshape(-1, k), config, backend=impl,
                                uniform=None if uniform is None else uniform.reshape(-1, k))
    amax = t.amax.reshape(*lead, 1) if config.scale == "token" else t.amax
    return nvfp4.NVFP4Tensor(
        codes=t.codes.reshape(*lead, k // 2),
        scales=t.scales.reshape(*lead, k // 16),
        amax=amax,
        map4=t.map4.reshape(*lead, k // 16),
        config=config,
    )


def nvfp4_quantize_experts(w, config: nvfp4.NVFP4Config, impl: str, *, contraction_axis: int) -> nvfp4.NVFP4Tensor:
    """Each expert of a stack quantized on its own along its contraction axis: equal to
    `jax.vmap(nvfp4_quantize)` of the stack laid out [E, N, K] (w is [E, K, N] with
    contraction_axis=1, [E, N, K] with 2). The kernels read the stack as stored (K-major for
    axis 1: no transposed copy of the weight is written; benchmarks/README.md, weight-sync quantizer)."""
    impl = resolve_impl(impl)
    if impl == "reference":
        stack = jnp.swapaxes(w, 1, 2) if contraction_axis == 1 else w
        return jax.vmap(lambda m: _reference_quantize(m, config, None, ieee.forced_division()))(stack)
    import pallas_kernels

    return pallas_kernels.quantize_experts(w, config, backend=impl, contraction_axis=contraction_axis)


def quantize(x, site: SiteConfig, role: str, impl: str = "auto", *, sr_key=None, config=None):
    """Quantize `x` [..., K] along its last axis as operand `role` ("act" | "weight") of `site`.

    `config` overrides the NVFP4 config of the role (the quantized backward re-quantizes
    with per-tensor scales). Returns an `NVFP4Tensor` or an `MXTensor`.
    """
    if site.format == "mxfp8":
        return mx.quantize(x, "mxfp8")
    if site.format != "nvfp4":
        raise ValueError(f"site format {site.format!r} is not quantized")
    if config is None:
        config = site.act_config() if role == "act" else site.weight_config()
    return nvfp4_quantize(x, config, impl, sr_key=sr_key)


@dataclasses.dataclass(frozen=True)
class ScaledWeight:
    """A quantized weight's GEMM operand formed ahead of its GEMMs: `values` the exact bf16
    dec(q) * sf, `scale` the global decode factor (per expert for a stack). The sampler forms it
    once per rollout instead of once per decode step (XLA does not hoist an op whose output is
    larger than its input, such as this 4-bit -> 16-bit expansion, out of a `while` loop);
    `qdot` consumes it as it consumes the packed weight, with the same values.

    amplification: != 1 for the weight of a dose-response site (`SiteConfig.amplification`):
    `values` is then w_a in bf16, in w's layout [K, N] / [E, K, N] (not transposed), and `scale`
    1 (`qlinear.quantize_weight`); `qdot` refuses it
    at a site of another amplification, as it refuses a packed weight at an amplified site."""

    values: jax.Array
    scale: jax.Array
    amplification: float = 1.0


jax.tree_util.register_dataclass(ScaledWeight, data_fields=["values", "scale"], meta_fields=["amplification"])


def gemm_operand(packed, dtype=jnp.bfloat16):
    """(values, scale): `values * scale` is the dequantized tensor; values exact in bf16."""
    if isinstance(packed, ScaledWeight):
        return packed.values.astype(dtype), packed.scale
    if isinstance(packed, mx.MXTensor):
        return mx.dequantize(packed, dtype), jnp.float32(1)
    return nvfp4.scaled_operand(packed, dtype)


def dequantized(packed):
    """DQ(Q(.)) in float32 (docs/numerics.md §2: fl(fl(dec(q) * sf) * S_dec), one rounding). Rounding
    it to bf16 would round twice; where a GEMM can take the scale as an epilogue, use
    `gemm_operand` instead."""
    if isinstance(packed, mx.MXTensor):
        return mx.dequantize(packed, jnp.float32)
    return nvfp4.dequantize(packed, jnp.float32)
