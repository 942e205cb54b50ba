"""tests/kernels: GPU-marked tests are skipped, with the reason, where no CUDA GPU is present."""

from __future__ import annotations

import pathlib

import pytest

from tests.kernels.quant_suite import gpu_present

_HERE = pathlib.Path(__file__).parent


# The Mosaic GPU interpreter is the suite's slowest part (minutes of CPU per worker). Its tests of
# one parameter set (e.g. a config against the oracle and against the reference) share one cached
# kernel result per process, so each parameter set is one xdist group: the sets spread over the
# workers while a set's tests stay together. Before xdist's own hook turns the marks into groups.
INTERPRET_CLASSES = ("TestMosaicInterpret",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.cls is not None and item.cls.__name__ in INTERPRET_CLASSES and hasattr(item, "callspec"):
            item.add_marker(pytest.mark.xdist_group(f"{item.cls.__name__}-{item.callspec.id}"))
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and _HERE in pathlib.Path(str(item.path)).parents:
            item.add_marker(skip)
