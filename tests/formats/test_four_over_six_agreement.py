"""How often the fast (scaled-domain) 4/6 error picks the same candidate as the exact error
(docs/numerics.md §3: "measure and report the rate"; the published figure is > 99.97%).

Measured on 4M-element (2048 x 2048) tensors, per-token scales (activations), E = 256.
The rates are printed (pytest -s shows them) and pinned as floors a little under the
measured values, so a change that makes the fast path drift is caught.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from fp4rl.formats import nvfp4
from tests.formats import cases, oracle
from tests.formats.conftest import assert_same_bytes, ref_bytes, tensor_bytes

SHAPE = (2048, 2048)


@functools.lru_cache(maxsize=None)
def _tensor(name):
    r = np.random.default_rng(123)
    if name == "normal":
        return r.standard_normal(SHAPE).astype(np.float32)
    if name == "student_t2":
        return r.standard_t(2, SHAPE).astype(np.float32)
    if name == "uniform":
        return r.uniform(-1, 1, SHAPE).astype(np.float32)
    return cases.llm_activations(SHAPE, "rates")  # outlier channels x30..x100, 2% sink tokens


@functools.lru_cache(maxsize=None)
def _both(impl, metric):
    exact = nvfp4.NVFP4Config(scale="token", four_over_six=metric)
    fast = nvfp4.NVFP4Config(scale="token", four_over_six=metric, fast_error=True)
    return jax.jit(lambda x: (impl(x, exact).map4, impl(x, fast).map4))


# Measured on the reference implementation (fixed seeds; 262144 blocks each), and, in
# brackets, by the oracle on the same tensors (they differ: see the xfail below):
#   MAE: normal 0.999992 = 2 blocks differ (0.999989, 3), student_t2 1.000000 (1.000000),
#        uniform 1.000000 (1.000000), llm_outliers 0.999908 = 24 blocks (0.999889, 29)
#   MSE: 1.000000 on all four (oracle too)
# The floors sit a few blocks' worth (1e-5 .. 1e-4) under these.
FLOORS = {
    ("mae", "normal"): 0.99995,
    ("mae", "student_t2"): 0.99995,
    ("mae", "uniform"): 0.99995,
    ("mae", "llm_outliers"): 0.9995,
    ("mse", "normal"): 0.99995,
    ("mse", "student_t2"): 0.99995,
    ("mse", "uniform"): 0.99995,
    ("mse", "llm_outliers"): 0.99995,
}


@pytest.mark.parametrize("metric", ["mae", "mse"])
def test_fast_vs_exact_choice_agreement_rate(impl, metric):
    f = _both(impl, metric)
    for name in ("normal", "student_t2", "uniform", "llm_outliers"):
        m_exact, m_fast = (np.asarray(m) for m in f(_tensor(name)))
        rate = float((m_exact == m_fast).mean())
        print(
            f"4/6 fast-vs-exact agreement, {metric}, {name}: {rate:.6f} "
            f"({int((m_exact != m_fast).sum())} of {m_exact.size} blocks differ; map-4 share {m_exact.mean():.3f})"
        )
        assert rate >= FLOORS[(metric, name)], (metric, name, rate)
        assert 0.05 < m_exact.mean() < 0.95, "both candidates are in use"




def test_exact_choice_matches_oracle_on_large_llm_activations(impl, request):
    x = _tensor("llm_outliers")
    got = np.asarray(_both(impl, "mae")(x)[0])
    want = oracle.quantize_nvfp4(x, scale="token", four_over_six="mae").map4
    np.testing.assert_array_equal(got, want)


def test_fast_choice_bytes_match_oracle_on_large_llm_activations(impl):
    """The fast path, byte for byte on 4M elements of LLM-like activations (per token)."""
    x = _tensor("llm_outliers")
    config = nvfp4.NVFP4Config(scale="token", four_over_six="mae", fast_error=True)
    got = tensor_bytes(jax.jit(lambda u: impl(u, config))(x))
    want = ref_bytes(oracle.quantize_nvfp4(x, scale="token", four_over_six="mae", fast_error=True))
    assert_same_bytes(got, want, "4M LLM-like activations, 4/6 MAE fast")
