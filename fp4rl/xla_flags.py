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
"""

from __future__ import annotations

import os

DETERMINISTIC_GPU = "--xla_gpu_deterministic_ops=true"


def add(flag: str) -> None:
    """Append `flag` to XLA_FLAGS unless the flag's name is already there."""
    name = flag.split("=", 1)[0]
    current = os.environ.get("XLA_FLAGS", "")
    if name not in current:
        os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()
