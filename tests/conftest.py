"""Test-session setup shared by every test module."""

import os
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
# compile once. Subprocesses inherit it through the environment variable.
_CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "fp4rl-jax-cache"))
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


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
