"""8 host CPU devices for this directory (run by tests/parallel/test_multidevice.py, or directly
with FP4RL_MULTIDEVICE=1). The flag must be set before XLA's CPU backend starts."""

import os

DEVICES = 8
_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import jax  # noqa: E402


def pytest_sessionstart(session):
    if jax.device_count() != DEVICES:  # the backend started before the flag: every test here would lie
        raise RuntimeError(f"tests/parallel/multidevice needs {DEVICES} devices, got {jax.devices()}: run it in a "
                           "fresh process (tests/parallel/test_multidevice.py does)")
