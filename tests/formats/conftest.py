"""Fixtures shared by the formats suite.

`impl` is the NVFP4 quantizer under test: any callable `quantize(x, config) -> NVFP4Tensor`.
Kernel authors add theirs to IMPLS (e.g. "pallas_triton_interpret": a wrapper that passes
interpret=True on CPU); every test that takes `impl` then runs on it, against the same
independent oracle (tests/formats/oracle.py) and the same inputs (tests/formats/cases.py).
"""

from __future__ import annotations

import numpy as np
import pytest


def _reference_quantize(x, config):
    from fp4rl.formats import nvfp4

    return nvfp4.quantize(x, config)


def _reference_integer_division(x, config):
    """The reference as XLA:GPU runs it: every division through `ieee.integer_divide`."""
    from fp4rl.formats import ieee, nvfp4

    with ieee.integer_division_everywhere():
        return nvfp4.quantize(x, config)


#: name -> quantize(x, config). The reference jnp implementation is the first entry.
IMPLS = {
    "reference": _reference_quantize,
    "reference_integer_division": _reference_integer_division,
}


@pytest.fixture(params=list(IMPLS), scope="session")
def impl(request):
    return IMPLS[request.param]


def known_failure(request, impl, failing_impls, reason: str):
    """Mark the running test xfail(strict=True) when `impl` is one of `failing_impls`: a
    known, reported bug of that implementation. Strict, so a fix turns into an XPASS failure
    that asks for the marker to go; other implementations are held to the full test."""
    name = next(k for k, v in IMPLS.items() if v is impl)
    if name in failing_impls:
        request.node.add_marker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"[{name}] {reason}"))


def tensor_bytes(t) -> dict[str, np.ndarray]:
    """Raw bytes of an NVFP4Tensor: codes, scale bytes, amax bits, map4 (for assert_array_equal)."""
    return {
        "codes": np.asarray(t.codes).view(np.uint8),
        "scales": np.asarray(t.scales).view(np.uint8),
        "amax": np.asarray(t.amax, np.float32).view(np.uint32),
        "map4": np.asarray(t.map4).astype(bool),
    }


def ref_bytes(r) -> dict[str, np.ndarray]:
    """The same fields from an oracle.NVFP4Ref."""
    return {
        "codes": np.asarray(r.codes, np.uint8),
        "scales": np.asarray(r.scales, np.uint8),
        "amax": np.asarray(r.amax, np.float32).view(np.uint32),
        "map4": np.asarray(r.map4, bool),
    }


def assert_same_bytes(got: dict, want: dict, what: str = ""):
    for field in ("codes", "scales", "amax", "map4"):
        g, w = got[field], want[field]
        assert g.shape == w.shape, f"{what} {field}: shape {g.shape} != {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{what} field {field}")
