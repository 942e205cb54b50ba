"""Test-session setup shared by every test module."""

import os
import tempfile

import jax

# One persistent compilation cache per test session: the smoke runs (SFT, RL, ablation,
# kill-and-resume, notebooks) compile the same programs in several processes, which then
# compile once. Subprocesses inherit it through the environment variable.
_CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "fp4rl-jax-cache"))
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
