"""Runs each module of tests/parallel/multidevice in a fresh pytest process with 8 host CPU
devices (XLA fixes the device count when its backend starts, so the flag cannot be set inside
this test process). A failure shows the inner pytest's output."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODULES = sorted(p.name for p in (HERE / "multidevice").glob("test_*.py"))


def test_modules_found():
    assert MODULES, "tests/parallel/multidevice holds no test modules"


@pytest.mark.parametrize("module", MODULES)
def test_on_8_cpu_devices(module):
    env = {**os.environ, "FP4RL_MULTIDEVICE": "1", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           str(HERE / "multidevice" / module)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]
