"""Test-session setup shared by every test module."""

import atexit
import os
import shutil
import tempfile

# XLA:CPU compile time dominates the suite (every recipe is its own program); LLVM's O0
# backend compiles ~40% faster and the test programs are tiny. Set before jax initialises
# its backend; subprocesses (kill-and-resume, notebooks) inherit it.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

# One persistent compilation cache per test session: the smoke runs (SFT, RL, ablation,
# kill-and-resume, notebooks) compile the same programs in several processes, which then
# compile once. The first process of the session (pytest's, before its xdist workers start)
# makes it and removes it at exit; workers and subprocesses inherit it through the environment
# variable. Not one folder for every session on the machine: two suites at once (two checkouts)
# then read each other's entries while they are written, and XLA crashed reading one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="fp4rl-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# Tests that share an expensive per-process result run on one xdist worker (`--dist loadgroup`):
# - the Mosaic GPU interpreter's tests of one parameter set (a config against the oracle and against
#   the reference share one cached kernel result; the interpreter is the suite's slowest part);
# - the modules whose module-scoped fixture is a whole smoke measurement;
# - the tests of one recipe in `test_bf16_logprobs.py` (they share its cached rollout and programs);
# - the formats modules that quantize through `tests.formats.harness.batched`, whose first call
#   compiles every valid config per implementation ahead (~100 s of CPU each time a worker does it).
# xdist turns the marks into groups by suffixing each node id with "@group"; pytest 9 builds node ids
# differently and the suffix is silently lost (hence pytest<9 in pyproject.toml, and the check below).
INTERPRET_CLASSES = ("TestMosaicInterpret",)
ONE_WORKER_MODULES = ("test_gradients.py",)
PER_RECIPE_MODULES = ("test_bf16_logprobs.py",)
BATCHED_QUANTIZER_MODULES = ("test_nvfp4.py", "test_properties.py")


def _params(item) -> dict:
    return item.callspec.params if hasattr(item, "callspec") else {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.cls is not None and item.cls.__name__ in INTERPRET_CLASSES and hasattr(item, "callspec"):
            item.add_marker(pytest.mark.xdist_group(f"{item.cls.__name__}-{item.callspec.id}"))
        elif item.path.name in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
        elif item.path.parent.name == "formats" and item.path.name in BATCHED_QUANTIZER_MODULES:
            item.add_marker(pytest.mark.xdist_group("formats-batched-quantizers"))
        elif item.path.name in PER_RECIPE_MODULES and "name" in _params(item):
            item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}-{_params(item)['name']}"))


def pytest_collection_finish(session):
    """On an xdist worker with --dist loadgroup: refuse to run if the groups did not take effect
    (every grouped test would then silently pay for its shared result again)."""
    if not hasattr(session.config, "workerinput") or not session.config.getvalue("loadgroup"):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist's loadgroup did not group {len(lost)} tests (e.g. {lost[0]}) with "
                                f"pytest {pytest.__version__}: install the versions pinned in pyproject.toml")


@pytest.fixture(scope="session")
def warmup_dir(tmp_path_factory):
    """The smoke preset's BF16 warm-up, trained once per test process (~15 s on CPU) and only read
    by the tests that load it (RL steps, gradient measurements, resume, serving)."""
    import dataclasses

    from fp4rl import configs
    from fp4rl.rl import sft

    out = tmp_path_factory.mktemp("smoke_sft")
    sft.train(dataclasses.replace(configs.SFT_PRESETS["smoke"], out=str(out)), progress=False)
    return out
