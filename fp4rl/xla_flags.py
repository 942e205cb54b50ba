"""XLA flags that the experiments set before JAX initialises its backend (no jax import here).

XLA reads `XLA_FLAGS` once, when the first backend starts (the first `jax.devices()` or array,
not `import jax`), so an entry point calls `add` before that. A flag the user already set (any
value) wins.

DETERMINISTIC_GPU: XLA:GPU otherwise reduces with atomics in some scatters and reductions, so
two runs of the same warm-up differ in the last bits and every RL arm would start from a slightly
different checkpoint. With it, a device call recreates the warm-up bit for bit (`sft_meta.json`
records the parameters' SHA-256). It makes every scatter a sort, so the model's training step has
none (`fp4rl.model.expert_dispatch`): the flag costs the h200 warm-up step 11%
(benchmarks/README.md, "Warm-up step time"). The entry points set it only for the warm-up (RL
seeds differ anyway). No effect on CPU.

IEEE_GPU_DIVISION: XLA:GPU asks LLVM for `div.full.f32` (an approximation, up to 2 ulp) for every
f32 division; this LLVM option of its backend makes it `div.rn.f32`, the IEEE division without
flush-to-zero. Under it `fp4rl.formats.ieee.divide` divides natively on the GPU instead of by
integer long division (25 unrolled steps per division, ~560 HLO ops for each per-tensor scale,
the bulk of a quantized backward's program). An experiment until the GPU checks pass with it
(`tools/check_gpu_reference.py` against the NumPy oracle, and no division in a fusion XLA emits
through Triton, whose f32 division stays `div.full.f32`: `tools/compile_time.py update` counts
them): no entry point sets it.
"""

from __future__ import annotations

import os

DETERMINISTIC_GPU = "--xla_gpu_deterministic_ops=true"
_IEEE_DIVISION_OPTION = "-nvptx-prec-divf32=3"  # LLVM NVPTX: f32 fdiv as div.rn.f32, no FTZ
IEEE_GPU_DIVISION = f"--xla_backend_extra_options={_IEEE_DIVISION_OPTION}"


def ieee_gpu_division() -> bool:
    """Whether XLA_FLAGS makes XLA:GPU's f32 division IEEE (`IEEE_GPU_DIVISION`, alone or among
    other `xla_backend_extra_options`). XLA reads it when its backend starts, as every flag here."""
    return _IEEE_DIVISION_OPTION in os.environ.get("XLA_FLAGS", "")


def add(flag: str) -> None:
    """Append `flag` to XLA_FLAGS unless the flag's name is already there."""
    name = flag.split("=", 1)[0]
    current = os.environ.get("XLA_FLAGS", "")
    if name not in current:
        os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()
