"""Check, then time, the Mosaic GPU NVFP4 quantizer on named shapes (docs/design.md practice 7).

`python -m pallas_kernels.mosaic_quant_bench` on a GPU: for each shape and config it first
asserts byte equality with `fp4rl.formats.nvfp4.quantize`, then times the jitted kernel and
reports HBM GB/s (bytes read + written by the kernel(s), as a share of `--hbm_gbs`).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.formats import nvfp4 as ref
from pallas_kernels import mosaic_quant as mq

SHAPES = {"act-8k-x-4k": (8192, 4096), "act-4k-x-8k": (4096, 8192)}
CONFIGS = {
    "token-6": ref.NVFP4Config(scale="token"),
    "token-mae-256": ref.NVFP4Config(scale="token", four_over_six="mae"),
    "tensor-6-given": ref.NVFP4Config(scale="tensor"),
}


def _bytes_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    view = {1: np.uint8, 4: np.uint32}[a.dtype.itemsize]
    return a.shape == b.shape and np.array_equal(a.view(view), b.view(view))


def _time(fn, *args, iters=10):
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(iters):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--hbm_gbs", type=float, default=4300.0, help="measured HBM bandwidth (H200 copy: ~4300)")
    p.add_argument("--block_m", type=int, default=128)
    args = p.parse_args(argv)
    print("devices:", jax.devices())
    tiling = mq.MosaicQuantTiling(block_m=args.block_m)
    for sname, (m, k) in SHAPES.items():
        x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
        for cname, cfg in CONFIGS.items():
            amax = jnp.max(jnp.abs(x.astype(jnp.float32))) if cname.endswith("given") else None
            fn = jax.jit(lambda v, a, c=cfg: mq.quantize_mosaic(v, c, amax=a, tiling=tiling))
            got = fn(x, amax)
            if cfg.four_over_six is None:
                want = ref.quantize(x, cfg, amax=amax)
            else:  # XLA:GPU contracts the reference's 4/6 error math into FMAs; the host CPU does not
                cpu = jax.devices("cpu")[0]
                with jax.default_device(cpu):
                    xc, ac = jax.device_put((x, amax), cpu)
                    want = ref.quantize(xc, cfg, amax=ac)
            ok = all(_bytes_equal(getattr(got, f), getattr(want, f)) for f in ("codes", "scales", "amax", "map4"))
            if not ok:
                print(f"{sname} {cname}: MISMATCH vs reference; not timed")
                continue
            sec = _time(fn, x, amax)
            reads = m * k * 2 * (2 if cfg.scale == "token" else 1)  # per-token: amax pass + quantize pass
            writes = m * k // 2 + 2 * m * k // 16
            gbs = (reads + writes) / sec / 1e9
            ref_sec = _time(jax.jit(lambda v, a, c=cfg: ref.quantize(v, c, amax=a)), x, amax)
            print(f"{sname} {cname}: bit-exact; {sec * 1e3:.3f} ms, {gbs:.0f} GB/s "
                  f"({100 * gbs / args.hbm_gbs:.1f}% of {args.hbm_gbs:.0f}); XLA reference {ref_sec * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
