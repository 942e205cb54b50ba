"""What every GPU benchmark entry point shares: timing, the GPU check, writing the results."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from fp4rl.config_cli import cli


def median_seconds(fn, *args, iters: int) -> float:
    """Median seconds per call over `iters` calls, after a warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def bench_main(name: str, config_cls, run: Callable, to_markdown: Callable, argv=None) -> None:
    """Parse the config, refuse to run without a GPU (CPU timings are not performance
    numbers), run, and write `<out>/<name>.json` + `<out>/<name>.md`."""
    config = cli(config_cls, argv=argv)
    print(f"devices: {jax.devices()}")
    if jax.default_backend() != "gpu":
        raise SystemExit(f"{name} measures the GPU; no GPU here (CPU numbers are not performance numbers)")
    result = run(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    (out / f"{name}.md").write_text(to_markdown(result))
    print(to_markdown(result))
