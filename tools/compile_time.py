"""Trace + XLA compile time of one model's training gradient, per recipe, scanned vs unrolled layers.

    JAX_PLATFORMS=cpu python tools/compile_time.py h200 bf16,nvfp4,full

Prints one line per (recipe, layers) with the trace and compile seconds of
`jax.jit(jax.grad(mean(forward(...))))` on an [8, 64] token batch (what dominates the first
step of a quantized RL arm). Compile times are machine-dependent; compare lines of one run.
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp4rl.model import ModelConfig, forward, init  # noqa: E402
from fp4rl.recipe import PrecisionRecipe  # noqa: E402


def main(model: str = "h200", recipes: str = "bf16,nvfp4,full") -> None:
    graphdef, params = init(ModelConfig.from_name(model), 0)
    tokens = jnp.zeros((8, 64), jnp.int32)
    for name in recipes.split(","):
        recipe = PrecisionRecipe.from_name(name)
        for scan in (True, False):
            def loss(p, key, scan=scan):
                return jnp.mean(forward(graphdef, p, tokens, recipe, key=key, scan_layers=scan)[0])

            t0 = time.perf_counter()
            lowered = jax.jit(jax.grad(loss)).lower(params, jax.random.key(0))
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
            layers = "scanned" if scan else "unrolled"
            print(f"{model} {name:6s} {layers:8s} trace+lower {t1 - t0:5.1f} s  compile {t2 - t1:5.1f} s", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
