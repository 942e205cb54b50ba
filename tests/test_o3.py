"""The NVFP4 reference quantizer's suite at XLA's default optimisation level.

The suite compiles with LLVM's O0 backend (tests/conftest.py: compiling is most of its time),
but users run at O3, where LLVM may contract float32 multiply-adds into FMAs and reorder what O0
keeps as written. The quantizer contract is bit-exact whatever the level (docs/numerics.md), so
the shared kernel suite on the reference implementation (every config, shape, expert layout and
dequantization, byte for byte against the NumPy oracle) runs once more at O3, in a subprocess
because XLA reads its flags once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
O3 = "--xla_backend_optimization_level=3"


@pytest.mark.slow
def test_reference_quantizer_suite_is_bit_exact_at_o3(tmp_path):
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_backend_optimization_level"))
    env = {**os.environ, "XLA_FLAGS": f"{flags} {O3}".strip(), "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}  # O3 programs, not the O0 cache's
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
                             "tests/kernels/test_reference.py", "-k", "not gpu"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-2000:]
