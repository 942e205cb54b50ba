"""NVFP4 (+ Four-Over-Six) quantize and dequantize, one op with two Pallas backends.

    from pallas_kernels.nvfp4_quant import quantize, dequantize, NVFP4Config
    t = quantize(x, NVFP4Config(scale="token"), backend="triton")          # GPU, compiled
    t = quantize(x, config, backend="triton", interpret=True)               # CPU interpret mode
    x_hat = dequantize(t, jnp.bfloat16, backend="mosaic")

The reference is `fp4rl.formats.nvfp4` (re-exported here as `reference_quantize` /
`reference_dequantize`, with its `NVFP4Config` and `NVFP4Tensor`); every backend reproduces its
bytes exactly (docs/numerics.md). The package:

    block_math.py     the contract's element and block math, shared by both backends
    wrappers.py       validation, GPU guard, amax layout, result assembly (plain XLA)
    tunables.py       launch shapes: TritonQuantTunables, MosaicQuantTiling
    shapes.py         named shapes shared by the tests, the benchmark and the tuner
    triton.py         the Pallas Triton kernels (+ triton_planar.py, triton_kmajor.py, triton_arith.py)
    mosaic.py         the Pallas Mosaic GPU kernels (+ mosaic_block.py)

The tests are one shared suite (`tests/kernels/quant_suite.py`) run on the reference and on each
backend, against one NumPy oracle (`tests/formats/oracle.py`). A backend is a module
`pallas_kernels.nvfp4_quant.<module>` exposing, for backend name `<b>`:

    quantize_<b>(x, config, *, interpret=False, amax=None, **options) -> NVFP4Tensor
    dequantize_<b>(t, dtype, *, interpret=False, **options) -> array
    quantize_experts_<b>(w, config, *, contraction_axis=1, interpret=False, amax=None, **options)
        (optional)  == jax.vmap(reference quantize) over the leading expert axis

`options` are backend-specific launch tunables (e.g. `tunables=TritonQuantTunables(...)`).
Backends are imported lazily; asking for one that is unknown, cannot be imported, or lacks
an entry point raises `BackendUnavailableError`. There is never a silent fallback to XLA or
to another backend.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import jax.numpy as jnp

from fp4rl.formats.nvfp4 import NVFP4Config, NVFP4Tensor
from fp4rl.formats.nvfp4 import dequantize as reference_dequantize
from fp4rl.formats.nvfp4 import quantize as reference_quantize

# backend name -> module that implements it
BACKENDS: dict[str, str] = {
    "triton": "pallas_kernels.nvfp4_quant.triton",
    "mosaic": "pallas_kernels.nvfp4_quant.mosaic",
}


class BackendUnavailableError(RuntimeError):
    """The requested kernel backend does not exist here or cannot be imported."""


def backend_module(backend: str) -> ModuleType:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; valid options: {sorted(BACKENDS)}")
    try:
        return importlib.import_module(BACKENDS[backend])
    except ImportError as e:
        raise BackendUnavailableError(
            f"kernel backend {backend!r} (module {BACKENDS[backend]}) cannot be imported: {e}"
        ) from e


def _entry(backend: str, op: str):
    module = backend_module(backend)
    name = f"{op}_{backend}"
    fn = getattr(module, name, None)
    if fn is None:
        raise BackendUnavailableError(f"kernel backend {backend!r} has no {name} in {module.__name__}")
    return fn


# the backends whose quantize takes stochastic rounding's draws (`uniform=`)
STOCHASTIC_BACKENDS = ("triton",)


def quantize(x, config, *, backend: str, interpret: bool = False, amax=None, uniform=None, **options):
    """NVFP4-quantize x [..., K] with a Pallas kernel; equals `fp4rl.formats.nvfp4.quantize`.

    uniform: stochastic rounding's draws (float32, x's shape; `STOCHASTIC_BACKENDS` only): equals
    `nvfp4.quantize(x, config, sr_key=key)` for uniform = `jax.random.uniform(key, x.shape)`."""
    if uniform is None:
        return _entry(backend, "quantize")(x, config, interpret=interpret, amax=amax, **options)
    if backend not in STOCHASTIC_BACKENDS:
        raise BackendUnavailableError(f"kernel backend {backend!r} has no stochastic rounding (uniform=); "
                                      f"backends with it: {STOCHASTIC_BACKENDS}")
    return _entry(backend, "quantize")(x, config, interpret=interpret, amax=amax, uniform=uniform, **options)


def dequantize(t, dtype=jnp.bfloat16, *, backend: str, interpret: bool = False, **options):
    """Dequantize an NVFP4Tensor with a Pallas kernel; equals `fp4rl.formats.nvfp4.dequantize`."""
    return _entry(backend, "dequantize")(t, dtype, interpret=interpret, **options)


def quantize_experts(w, config, *, backend: str, contraction_axis: int = 1, interpret: bool = False,
                     amax=None, **options):
    """Quantize an expert stack [E, K, N] (or [E, N, K]) per expert along K.

    Equals `jax.vmap(lambda v: nvfp4.quantize(v, config))` of the stack laid out [E, N, K].
    """
    return _entry(backend, "quantize_experts")(
        w, config, contraction_axis=contraction_axis, interpret=interpret, amax=amax, **options
    )


__all__ = [
    "BACKENDS", "STOCHASTIC_BACKENDS", "BackendUnavailableError", "NVFP4Config", "NVFP4Tensor", "backend_module",
    "dequantize", "quantize", "quantize_experts", "reference_dequantize", "reference_quantize",
]
