"""Compile time of the programs that dominate an RL arm's first step.

    JAX_PLATFORMS=cpu python tools/compile_time.py grad h200 bf16,nvfp4,full
    python tools/compile_time.py update h200 bf16,full 4 xla,blocked     # on the GPU
    JAX_PLATFORMS=cpu python tools/compile_time.py size h200 nvfp4,nvfp4-pt 4 packed

`grad`: trace and compile seconds of `jax.jit(jax.grad(mean(forward(...))))` on an [8, 64] token
batch, per recipe, scanned vs unrolled layers. `update`: the RL trainer's vmapped update program
(`fp4rl.rl.trainer.Trainer`, the preset's batch shapes, N seeds; a 5th argument "update,sample"
adds the sampler's) per arm and grouped-GEMM backend, on randomly initialised parameters (no
warm-up needed): compile seconds, the divisions XLA put in Triton fusions
(`triton_fusion_divisions`), and the compiled program's argument, output and temporary buffer
sizes (XLA's memory analysis; on CPU they show what a program would ask of a GPU's memory).
Compile times are machine-dependent; compare lines of one run.
`size`: the same update program (or the sampler's and weight sync's, a 5th argument
"sync,sample,update") lowered for CUDA on this machine, which needs no GPU (the calls that
ask for one are answered as an H200 would: `as_if_on_an_h200`): its StableHLO op count, custom calls
and integer divisions (`ieee.integer_divide`, by operand shape), the program's size before XLA
compiles it. Not a compile time: what XLA:GPU makes of it is measured on the GPU (`update`).
"""

import collections
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import time
import types
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp4rl import configs  # noqa: E402
from fp4rl.formats import ieee, stochastic  # noqa: E402
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


def update(preset: str = "h200", arms: str = "bf16", seeds: str = "4", gemms: str = "xla,blocked",
           programs: str = "update") -> None:
    flags = os.environ.get("XLA_FLAGS", "") or "default XLA_FLAGS"
    model_config = sft.model_config(configs.SFT_PRESETS[preset])
    graphdef, params = init(model_config, 0)
    warmup = (graphdef, params, {"model_config": dataclasses.asdict(model_config)})
    for arm in arms.split(","):
        for gemm in gemms.split(","):
            config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=int(seeds), expert_gemm=gemm,
                                         out=tempfile.mkdtemp())
            run = trainer.Trainer(config, progress=False, warmup=warmup)
            for program, _, lower in run.lowerings():
                if program not in programs.split(","):
                    continue
                t0 = time.perf_counter()
                compiled = lower().compile()
                seconds = time.perf_counter() - t0
                memory = compiled.memory_analysis()
                gib = "n/a" if memory is None else " ".join(
                    f"{name} {getattr(memory, f'{name}_size_in_bytes') / 2**30:.1f}" for name in ("argument", "output", "temp"))
                label = "" if program == "update" else f"{program} "  # the update's line as `compile` mode parses it
                print(f"{preset} {arm:6s} seeds {seeds} gemm {run.model_config.expert_gemm:8s} {label}compile {seconds:6.1f} s, "
                      f"GiB: {gib} ({flags}) threefry kernel {int(jax.config.jax_threefry_gpu_kernel_lowering)}, "
                      f"divisions in Triton fusions {triton_fusion_divisions(compiled.as_text())}", flush=True)


def triton_fusion_divisions(hlo_text: str) -> int:
    """`divide` instructions that XLA:GPU emits through Triton, in a compiled program's HLO: inside the
    computations of fusions whose backend config is a Triton kind ("__triton...") and what those
    call. Triton lowers an f32 division as `div.full.f32` whatever LLVM is told, so under
    `xla_flags.IEEE_GPU_DIVISION` these would be approximate: the flag keeps the contract only
    while this is 0 (on CPU, and with the integer long division, it is 0 anyway)."""
    bodies = {m[1]: m[2] for m in re.finditer(r"^(?:ENTRY )?%([\w.\-]+) \(.*?\) -> [^\n]*\{\n(.*?)^\}", hlo_text,
                                              re.M | re.S)}
    pending = [c for line in hlo_text.splitlines() if '"__triton' in line for c in re.findall(r"calls=%([\w.\-]+)", line)]
    seen = set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending += re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", bodies.get(name, ""))
    return sum(len(re.findall(r" divide\(", bodies.get(name, ""))) for name in seen)


@contextlib.contextmanager
def as_if_on_an_h200():
    """Trace as for an H200 on a machine without one: jax.default_backend() says "gpu" (so "auto"
    picks the GPU kernels and `ieee.divide` its GPU form), the Pallas Triton lowering targets
    sm_90, the grouped GEMMs see 132 SMs and the kernels' device guard lets them lower. Only
    lowering: running anything compiled under it is meaningless."""
    from jax._src.pallas.triton import gpu_info, pallas_call_registration

    from pallas_kernels.nvfp4_quant import wrappers

    local_devices = jax.local_devices
    with mock.patch.object(jax, "default_backend", lambda: "gpu"), \
            mock.patch.object(pallas_call_registration.gpu_info_lib, "get_gpu_info",
                              lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)), \
            mock.patch.object(jax, "local_devices", lambda *a, backend=None, **kw: (
                [types.SimpleNamespace(core_count=132)] if backend == "gpu" else local_devices(*a, backend=backend, **kw))), \
            mock.patch.object(wrappers, "require_gpu", lambda *a, **kw: None):
        yield


def gpu_program_size(preset: str, arm: str, seeds: int, gemm: str, program: str = "update") -> dict:
    """An RL program of `arm` ("sync", "sample" or "update", `Trainer.lowerings`) lowered for CUDA
    (`as_if_on_an_h200`): {"ops": StableHLO ops, "custom_calls": {target: count},
    "integer_divisions": {operand shape: count}}."""
    divisions = collections.Counter()
    integer_divide = ieee.integer_divide

    def counted(a, b, *args, **kw):
        divisions[tuple(jnp.shape(a))] += 1
        return integer_divide(a, b, *args, **kw)

    model_config = sft.model_config(configs.SFT_PRESETS[preset])
    graphdef, params = init(model_config, 0)
    warmup = (graphdef, params, {"model_config": dataclasses.asdict(model_config)})
    config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=seeds, expert_gemm=gemm, out=tempfile.mkdtemp())
    jax.clear_caches()  # arms that share a program (the forward) would reuse its trace, uncounted
    with as_if_on_an_h200(), mock.patch.object(ieee, "integer_divide", counted):
        run = trainer.Trainer(config, progress=False, warmup=warmup)
        fn = getattr(run.programs, program)
        with mock.patch.object(run.programs, program, types.SimpleNamespace(
                lower=lambda *args: fn.trace(*args).lower(lowering_platforms=("cuda",)))):
            [lower] = [lower for name, _, lower in run.lowerings() if name == program]
            text = lower().as_text()
    return {"ops": len(re.findall(r"= \"?[a-z_]+\.[a-z_.]+", text)),
            "custom_calls": dict(collections.Counter(re.findall(r"custom_call @([A-Za-z_0-9]+)", text))),
            "integer_divisions": dict(divisions)}


def size(preset: str = "h200", arms: str = "nvfp4", seeds: str = "4", gemms: str = "packed",
         programs: str = "update") -> None:
    flags = os.environ.get("XLA_FLAGS", "") or "default XLA_FLAGS"
    for arm in arms.split(","):
        for gemm in gemms.split(","):
            for name in programs.split(","):
                program = gpu_program_size(preset, arm, int(seeds), gemm, name)
                divisions = program["integer_divisions"]
                print(f"{preset} {arm:6s} seeds {seeds} gemm {gemm:8s} {name} lowered for CUDA: {program['ops']} StableHLO "
                      f"ops, integer divisions {sum(divisions.values())} {divisions}, "
                      f"custom calls {program['custom_calls']} ({flags})", flush=True)


if __name__ == "__main__":
    stochastic.lower_draws_as_gpu_kernel()  # as the entry points do (JAX_THREEFRY_GPU_KERNEL_LOWERING=0: XLA's lowering)
    {"grad": grad, "update": update, "size": size}[sys.argv[1]](*sys.argv[2:])
