"""Stochastic rounding onto the E2M1 grid (docs/numerics.md §6), for gradients.

Within the grid interval [lo, hi] that contains |v|, round up with probability
(|v| - lo) / (hi - lo): E[round(v)] = v for |v| <= 6, and grid values never move. Magnitudes
past 6 saturate to 6. The random bits come from an explicit `jax.random` key, so a training
step that threads its key is reproducible.

The draws are one threefry2x32 per element. XLA:GPU compiles the default lowering of threefry
(20 unrolled rounds, inlined at every draw) slowly: a quantized backward draws at every site's
dgrad and wgrad, and that is most of the `nvfp4-pt` update program's compile time
(benchmarks/README.md, "RL update compile time"). `lower_draws_as_gpu_kernel` makes JAX lower each
draw to its threefry CUDA kernel instead: the same bits (the same function of key and counter),
compiled once, at the cost of materialising the broadcast keys and counters. JAX reads the flag
when it lowers a program, so the entry points set it before they build any.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.formats import elements as el


# 1 / (hi - lo) of the grid interval that starts at grid point i: every width is a power of two
# (0.5, 1 or 2), so (a - lo) / (hi - lo) is (a - lo) times this, exactly (`round_up_probability`).
# 0 past the last point: a saturated |v| never rounds up.
INVERSE_WIDTHS = np.array([2, 2, 2, 2, 1, 1, 0.5, 0], np.float32)


def interval_index(a):
    """Index (0..7, uint8) of the grid point lo <= a of the interval [lo, hi) that holds a = |v|
    (7 for a >= 6; 0 for NaN, whose comparisons are false)."""
    return jnp.sum(a[..., None] >= jnp.asarray(el.E2M1_GRID)[1:], axis=-1).astype(jnp.uint8)


def round_up_probability(a, lo_index):
    """(a - lo) / (hi - lo) for a in [lo, hi), exactly, as (a - lo) * INVERSE_WIDTHS[lo_index]:
    a - lo is exact (Sterbenz: lo <= a < hi <= 2 lo, or lo = 0), and scaling it by 2, 1 or 1/2
    is exact too (a halved difference lies in [4, 6): a multiple of 2^-21, never subnormal), so
    the correctly rounded quotient is this product. No division is traced: `ieee.divide`'s
    integer long division per gradient element made XLA:GPU compile the quantized backward for
    tens of seconds. 0 for a saturated a (6), NaN for NaN."""
    lo = jnp.asarray(el.E2M1_GRID)[lo_index]
    return (a - lo) * jnp.asarray(INVERSE_WIDTHS)[lo_index]


def stochastic_encode_e2m1(v, key):
    """E2M1 codes (0..15) of float32 `v`, rounded stochastically; sign bit follows v."""
    v = jnp.asarray(v, jnp.float32)
    a = jnp.minimum(jnp.abs(v), jnp.float32(el.E2M1_MAX))
    lo_index = interval_index(a)
    u = jax.random.uniform(key, a.shape, jnp.float32)
    magnitude = lo_index + (u < round_up_probability(a, lo_index)).astype(jnp.uint8)
    return magnitude | (jnp.signbit(v).astype(jnp.uint8) << 3)


def stochastic_round_e2m1(v, key):
    """`v` rounded stochastically onto the E2M1 grid, as float32 values; NaN stays NaN (§8:
    codes cannot carry NaN, so the values say it)."""
    v = jnp.asarray(v, jnp.float32)
    return jnp.where(jnp.isnan(v), v, el.e2m1_decode(stochastic_encode_e2m1(v, key)))


GPU_KERNEL_ENV = "JAX_THREEFRY_GPU_KERNEL_LOWERING"


def lower_draws_as_gpu_kernel() -> None:
    """Lower every threefry draw on GPU to JAX's threefry kernel (no effect on CPU; same bits).

    A value the user gave in JAX_THREEFRY_GPU_KERNEL_LOWERING wins (0 keeps XLA's lowering)."""
    if GPU_KERNEL_ENV not in os.environ:
        jax.config.update("jax_threefry_gpu_kernel_lowering", True)
