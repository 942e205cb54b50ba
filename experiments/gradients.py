"""Fixed-parameter gradient measurements: `python -m experiments.gradients [--preset {smoke,cpu,h200}]`.

From the preset's BF16 warm-up (trained first when missing), B rollout batches are drawn once and
every recipe's policy gradient is compared with BF16's and with its own straight-through
gradient, against the RL noise floor; plus grad-norm tails, one-update policy change and the
sampler/trainer mismatch. Writes gradients.json, report.md and PNGs under --out and prints the
decision. Default preset: `cpu`. The smoke preset compiles with LLVM's O0 backend, as
`experiments.ablation --preset smoke` and the tests do (its programs are tiny: compiling is most
of its time).
"""

from __future__ import annotations

import dataclasses
import sys

from fp4rl import xla_flags

if __name__ == "__main__" and any(a in ("--preset=smoke", "smoke") for a in sys.argv[1:]):
    xla_flags.add("--xla_backend_optimization_level=0")  # before JAX starts its backend

import jax  # noqa: E402

from experiments import rl as rl_experiment  # noqa: E402
from fp4rl.config_cli import cli, preset_of  # noqa: E402
from fp4rl.rl import gradients  # noqa: E402


def _preset(name: str, prompts_per_step: int | None = None, **overrides) -> gradients.GradientsConfig:
    """The RL preset's measurement (rollout, loss, optimizer, warm-up), optionally with another
    number of prompts per batch."""
    config = gradients.from_rl_config(rl_experiment.PRESETS[name], out=f"runs/{name}/gradients", **overrides)
    if prompts_per_step is None:
        return config
    return dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, prompts_per_step=prompts_per_step))


PRESETS = {
    "smoke": _preset("smoke", batches=3, sr_keys=2, recipes=("bf16", "nvfp4"), mismatch_batches=1, impls=("reference",),
                     dtypes=("float32",), bootstrap=200, compile_workers=2),
    # CPU: compiling dominates (10-40 s per gradient program on 2 cores), so: the recipes that bracket
    # the question (NVFP4 everywhere, + the dequantized backward, the full recipe), batches of one
    # update's mini-batch (2 prompts x 8, as the cpu RL preset updates), and no sampler check (on XLA:CPU
    # its k3 KL measured below 1e-8 in either compute dtype; the RL runs log it every step).
    "cpu": _preset("cpu", prompts_per_step=2, batches=8, sr_keys=2, recipes=("bf16", "nvfp4", "+dq", "full"), dtypes=(),
                   compile_workers=2),
    # H200: every recipe, 128 batches of 32 prompts x 8; large groups through a CountSketch (the Gram
    # matrices of 16 gradient sources x 128 batches stay a few GB on the host); 4 threads compile ahead.
    # Two SR keys and the policy change on 16 batches keep a recipe's gradients near 0.3 s per batch.
    "h200": _preset("h200", prompts_per_step=32, batches=128, sr_keys=2, mismatch_batches=4, kl_batches=16, sketch_dim=1 << 15,
                    compile_workers=4),
}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv) and not {"-h", "--help"} & set(argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(gradients.GradientsConfig, PRESETS, argv)
    print(f"devices: {jax.devices()}")
    rl_experiment.ensure_warmup(preset_of(argv), config.init)
    gradients.run(config)
    print(f"report: {config.out}/report.md")


if __name__ == "__main__":
    main()
