"""Relative quantization error of NVFP4, NVFP4 + 4/6 and MX formats on synthetic tensors.

    python -m experiments.numerics                       # 1024x4096, writes runs/numerics/
    python -m experiments.numerics --preset smoke --out=/tmp/numerics
    python -m experiments.numerics --rows=512 --distributions=normal,weight

Writes <out>/numerics.md (tables), numerics.png (grouped bars) and numerics.json (every
cell, plus the config and devices). The measuring lives in `fp4rl.numerics_study`.
"""

from __future__ import annotations

import dataclasses
import time

import jax

from fp4rl import numerics_study
from fp4rl.config_cli import cli


@dataclasses.dataclass(frozen=True)
class NumericsConfig:
    rows: int = 1024  # tokens (activations) or output features (weights); multiple of 16
    cols: int = 4096  # the contraction dim K the blocks run along; multiple of 32
    seed: int = 0
    out: str = "runs/numerics"
    distributions: tuple[str, ...] = numerics_study.DISTRIBUTIONS

    def __post_init__(self):
        numerics_study.check_shape(self.rows, self.cols)
        unknown = set(self.distributions) - set(numerics_study.DISTRIBUTIONS)
        if unknown or not self.distributions:
            raise ValueError(
                f"distributions={self.distributions}; valid options: {numerics_study.DISTRIBUTIONS}"
            )


PRESETS = {
    "default": NumericsConfig(),
    "smoke": NumericsConfig(rows=64, cols=256),  # seconds on CPU
}


def main(argv=None) -> numerics_study.StudyResult:
    config = cli(NumericsConfig, PRESETS, argv)
    devices = [str(d) for d in jax.devices()]
    print(f"jax {jax.__version__} on {jax.default_backend()}: {devices}")
    print(f"config: {config}")
    start = time.perf_counter()
    result = numerics_study.run_study(
        rows=config.rows,
        cols=config.cols,
        seed=config.seed,
        distributions=config.distributions,
        progress=True,
    )
    extra = {"config": dataclasses.asdict(config), "devices": devices, "jax": jax.__version__}
    paths = numerics_study.write_report(result, config.out, extra)
    print(numerics_study.markdown_report(result))
    print(f"wrote {', '.join(str(p) for p in paths.values())} in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
