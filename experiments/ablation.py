"""The main job: `python -m experiments.ablation [--preset {smoke,cpu,h200}] [--arms a,b|all] [--seeds N] [--out DIR]`.

Runs (or reuses) the warm-up, the preset's gradient measurements and learning run, the arms of
docs/rl.md's ablation matrix with N seeds (the seeds of an arm in one program; none by default on
the `cpu` preset), then the stability analysis and the report (report.md + 3 PNGs).
Resumable: rerun the same command after an interruption. Default preset: `cpu`. --arms also takes
the groups baselines, dose (the dose-response arms) and controls (the positive controls).

The CPU presets compile with cheaper code generation: their programs are small and compiling them
is most of their time. `smoke` uses LLVM's O0 backend, as the test suite does (tests/conftest.py;
~40% faster to compile). `cpu` keeps O3 but skips LLVM's expensive passes: it also executes for
minutes (rollouts, gradient batches, RL steps), which O0 code would slow more than compiling gains
(the main job's gradient measurements take 17% less CPU time this way). The quantizers give the
same bytes either way; elsewhere O3 contracts float32 multiply-adds into FMAs and O0 does not,
which changes such results in the last bit. A flag already in XLA_FLAGS wins.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from fp4rl import xla_flags  # no jax import: XLA_FLAGS can still be set

PRESET_XLA_FLAGS = {"smoke": "--xla_backend_optimization_level=0", "cpu": "--xla_llvm_disable_expensive_passes=true"}


def _preset(argv) -> str:
    """The --preset of `argv` (the default `cpu` without one), read before the config is parsed."""
    for arg, following in zip(argv, [*argv[1:], None]):
        if arg.startswith("--preset="):
            return arg.split("=", 1)[1]
        if arg == "--preset" and following is not None:
            return following
    return "cpu"


if __name__ == "__main__" and _preset(sys.argv[1:]) in PRESET_XLA_FLAGS:
    # Before JAX initialises its backend: XLA reads XLA_FLAGS only then.
    xla_flags.add(PRESET_XLA_FLAGS[_preset(sys.argv[1:])])

import jax  # noqa: E402

from fp4rl import configs  # noqa: E402
from fp4rl.config_cli import cli  # noqa: E402
from fp4rl.formats import stochastic  # noqa: E402
from fp4rl.rl import sft  # noqa: E402
from fp4rl.studies.ablation import AblationConfig, run  # noqa: E402


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(AblationConfig, configs.ABLATION_PRESETS, argv)
    stochastic.lower_draws_as_gpu_kernel()
    # Arms that differ only in their backward mode (nvfp4/nvfp4-pt/+dq, +46/full-hp, +hp/full-46,
    # full/full-dq, mxfp8-q/mxfp8/mxfp8+dq) share their forward programs (sync, sampler, log-probs)
    # in one process; the persistent compilation cache is for reruns: a resumed run recompiles
    # nothing it has seen.
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
