"""The main job: `python -m experiments.ablation [--preset {smoke,cpu,h200}] [--arms a,b] [--seeds N] [--out DIR]`.

Runs (or reuses) the warm-up, every arm of docs/rl.md's ablation matrix with N seeds (the seeds of
an arm in one program), then the stability analysis and the report (report.md + 3 PNGs).
Resumable: rerun the same command after an interruption. Default preset: `cpu`.

The smoke preset compiles with LLVM's O0 backend, as the test suite does (tests/conftest.py):
its programs are tiny and compiling them is most of its time (O0 compiles them ~40% faster). The
quantizers give the same bytes at O0; elsewhere O3 contracts float32 multiply-adds into FMAs and
O0 does not, which changes such results in the last bit. An XLA_FLAGS that already sets
--xla_backend_optimization_level wins.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

O0_FLAG = "--xla_backend_optimization_level=0"


def _is_smoke(argv) -> bool:
    return any(a == "--preset=smoke" or (a == "--preset" and b == "smoke") for a, b in zip(argv, [*argv[1:], None]))


if __name__ == "__main__" and _is_smoke(sys.argv[1:]):
    # Before JAX initialises its backend (importing fp4rl does): XLA reads XLA_FLAGS only then.
    if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {O0_FLAG}".strip()

import jax  # noqa: E402

from fp4rl import configs, xla_flags  # noqa: E402
from fp4rl.config_cli import cli  # noqa: E402
from fp4rl.rl import sft  # noqa: E402
from fp4rl.rl.ablation import AblationConfig, run  # noqa: E402


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(AblationConfig, configs.ABLATION_PRESETS, argv)
    # Arms that differ only in their backward mode (nvfp4/+dq, +46/full-hp, +hp/full-46,
    # full/full-dq) share their forward programs (sync, sampler, log-probs) in one process; the
    # persistent compilation cache is for reruns: a resumed run recompiles nothing it has seen.
    # JAX_COMPILATION_CACHE_DIR, when set, wins (e.g. one cache shared by an LR sweep's runs).
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(Path(config.out) / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    if not sft.is_finished(Path(config.out) / "sft"):  # it trains the warm-up: reproducibly
        xla_flags.add(xla_flags.DETERMINISTIC_GPU)
    print(f"devices: {jax.devices()}")
    print(f"arms: {', '.join(config.arms)}; seeds per arm: {config.arm_seeds or config.seeds}; out: {config.out}")
    command = "python -m experiments.ablation " + " ".join(shlex.quote(a) for a in argv)
    result = run(config, commands=(command,))
    print(f"status: {result['status']}")


if __name__ == "__main__":
    main()
