"""Fixed-parameter gradient measurements: `python -m experiments.gradients [--preset {smoke,cpu,h200}]`.

From the preset's BF16 warm-up (trained first when missing), B rollout batches are drawn once and
every recipe's policy gradient is compared with BF16's and with its own straight-through
gradient, against the RL noise floor; plus grad-norm tails, one-update policy change and the
sampler/trainer mismatch. Writes gradients.json, report.md and PNGs under --out and prints the
decision. The recipes can be measured in several processes (each with --recipes=... and the same
--rollouts_file, so they share the batches) and combined with --merge=DIR,DIR,... (nothing is
measured then). Default preset: `cpu`. The smoke preset compiles with LLVM's O0 backend, as
`experiments.ablation --preset smoke` and the tests do (its programs are tiny: compiling is most
of its time).
"""

from __future__ import annotations

import sys

from fp4rl import xla_flags

if __name__ == "__main__" and any(a in ("--preset=smoke", "smoke") for a in sys.argv[1:]):
    xla_flags.add("--xla_backend_optimization_level=0")  # before JAX starts its backend

import jax  # noqa: E402

from fp4rl import configs  # noqa: E402
from fp4rl.config_cli import cli, preset_of  # noqa: E402
from fp4rl.formats import stochastic  # noqa: E402
from fp4rl.rl import sft  # noqa: E402
from fp4rl.studies import gradients, gradients_config  # noqa: E402


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv):
        argv = ["--preset", "cpu", *argv]
    config = cli(gradients_config.GradientsConfig, configs.GRADIENTS_PRESETS, argv)
    stochastic.lower_draws_as_gpu_kernel()
    print(f"devices: {jax.devices()}")
    preset = preset_of(argv)
    if not config.merge:  # merging reads earlier measurements only
        sft.ensure_warmup(configs.warmup_config(preset, config.init), preset)
    gradients.run(config)
    print(f"report: {config.out}/report.md")


if __name__ == "__main__":
    main()
