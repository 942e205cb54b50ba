"""What every GPU benchmark entry point shares: timing, the GPU check, writing the results."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from fp4rl.config_cli import cli


def median_seconds(fn, *args, iters: int, calls_per_sample: int = 10) -> float:
    """Median seconds per call over `iters` samples, after a warm-up (compile) call.

    A sample dispatches `calls_per_sample` calls back to back and waits for the last one only,
    so the GPU's queue stays full and the host's dispatch latency (tens of microseconds, a
    large part of a 0.2 ms kernel when every call is waited for) overlaps the device work:
    the sample measures device throughput, as CUDA-event timing would.
    """
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(calls_per_sample - 1):
            fn(*args)
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - t0) / calls_per_sample)
    return float(np.median(samples))


def bench_main(name: str, config_cls, run: Callable, to_markdown: Callable, argv=None) -> None:
    """Parse the config, refuse to run without a GPU (CPU timings are not performance
    numbers), run, and write `<out>/<name>.json` + `<out>/<name>.md`."""
    config = cli(config_cls, argv=argv)
    print(f"devices: {jax.devices()}")
    if jax.default_backend() != "gpu":
        raise SystemExit(f"{name} measures the GPU; no GPU here (CPU numbers are not performance numbers)")
    result = run(config)
    write_results(config.out, name, result, to_markdown(result))
    print(to_markdown(result))


def write_results(out: str, name: str, result: dict, markdown: str) -> None:
    """`<out>/<name>.json` (the numbers) and `<out>/<name>.md` (the table), the benchmarks' file pair."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(result, indent=2))
    (path / f"{name}.md").write_text(markdown)
