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

from fp4rl import configs, numerics_study
from fp4rl.config_cli import cli


def main(argv=None) -> numerics_study.StudyResult:
    config = cli(numerics_study.NumericsConfig, configs.NUMERICS_PRESETS, argv)
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
