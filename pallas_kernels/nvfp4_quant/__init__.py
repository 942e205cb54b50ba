"""Pallas GPU kernels of fp4rl, behind one explicit backend registry.

    from pallas_kernels import quantize, dequantize
    t = quantize(x, NVFP4Config(scale="token"), backend="triton")          # GPU, compiled
    t = quantize(x, config, backend="triton", interpret=True)               # CPU interpret mode
    x_hat = dequantize(t, jnp.bfloat16, backend="mosaic")

Every backend reproduces `fp4rl.formats.nvfp4` byte for byte (docs/numerics.md). A backend is a
module `pallas_kernels.<module>` exposing, for backend name `<b>`:

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

# backend name -> module (relative to this package) that implements it
BACKENDS: dict[str, str] = {
    "triton": "pallas_kernels.triton_quant",
    "mosaic": "pallas_kernels.mosaic_quant",
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


def quantize(x, config, *, backend: str, interpret: bool = False, amax=None, **options):
    """NVFP4-quantize x [..., K] with a Pallas kernel; equals `fp4rl.formats.nvfp4.quantize`."""
    return _entry(backend, "quantize")(x, config, interpret=interpret, amax=amax, **options)


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


__all__ = ["BACKENDS", "BackendUnavailableError", "backend_module", "dequantize", "quantize", "quantize_experts"]
