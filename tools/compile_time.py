"""Compile time of the programs that dominate an RL arm's first step.

    JAX_PLATFORMS=cpu python tools/compile_time.py grad h200 bf16,nvfp4,full
    python tools/compile_time.py update h200 bf16,full 4 xla,blocked     # on the GPU

`grad`: trace and compile seconds of `jax.jit(jax.grad(mean(forward(...))))` on an [8, 64] token
batch, per recipe, scanned vs unrolled layers. `update`: the RL trainer's vmapped update program
(`fp4rl.rl.trainer.Trainer`, the preset's batch shapes, N seeds) per arm and grouped-GEMM backend,
on randomly initialised parameters (no warm-up needed): compile seconds, and the compiled
program's argument, output and temporary buffer sizes (XLA's memory analysis; on CPU they show
what a program would ask of a GPU's memory). Compile times are machine-dependent; compare lines of one run.
"""

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp4rl import configs  # noqa: E402
from fp4rl.formats import stochastic  # noqa: E402
from fp4rl.model import ModelConfig, forward, init  # noqa: E402
from fp4rl.recipe import PrecisionRecipe  # noqa: E402
from fp4rl.rl import sft, trainer  # noqa: E402


def grad(model: str = "h200", recipes: str = "bf16,nvfp4,full") -> None:
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


def update(preset: str = "h200", arms: str = "bf16", seeds: str = "4", gemms: str = "xla,blocked") -> None:
    model_config = sft.model_config(configs.SFT_PRESETS[preset])
    graphdef, params = init(model_config, 0)
    warmup = (graphdef, params, {"model_config": dataclasses.asdict(model_config)})
    for arm in arms.split(","):
        for gemm in gemms.split(","):
            config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=int(seeds), expert_gemm=gemm,
                                         out=tempfile.mkdtemp())
            run = trainer.Trainer(config, progress=False, warmup=warmup)
            (_, task), = [(key, task) for key, task in run.compile_tasks() if key[0] is run._update]
            t0 = time.perf_counter()
            memory = task().memory_analysis()
            seconds = time.perf_counter() - t0
            flags = os.environ.get("XLA_FLAGS", "") or "default XLA_FLAGS"
            gib = "n/a" if memory is None else " ".join(
                f"{name} {getattr(memory, f'{name}_size_in_bytes') / 2**30:.1f}" for name in ("argument", "output", "temp"))
            print(f"{preset} {arm:6s} seeds {seeds} gemm {run.model_config.expert_gemm:8s} compile {seconds:6.1f} s, GiB: {gib} ({flags}) "
                  f"threefry kernel {int(jax.config.jax_threefry_gpu_kernel_lowering)}",
                  flush=True)


if __name__ == "__main__":
    stochastic.lower_draws_as_gpu_kernel()  # as the entry points do (JAX_THREEFRY_GPU_KERNEL_LOWERING=0: XLA's lowering)
    {"grad": grad, "update": update}[sys.argv[1]](*sys.argv[2:])
