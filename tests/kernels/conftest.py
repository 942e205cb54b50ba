"""tests/kernels: GPU-marked tests are skipped, with the reason, where no CUDA GPU is present."""

from __future__ import annotations

import pathlib

import pytest

from tests.kernels.quant_suite import gpu_present

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and _HERE in pathlib.Path(str(item.path)).parents:
            item.add_marker(skip)
