"""Where the compiled Mosaic GPU quantizer parts from the contract on bf16 input (GPU only).

bf16 input with M > 128 rows is where a one-ulp arithmetic error of a compiled kernel shows up
in the bytes (its short significands put values on rounding boundaries often), while the Mosaic
*interpreter* on the CPU cannot show it. This prints, per case, which output field differs from
the NumPy oracle (`tests/formats/oracle.py`, which never fuses or flushes), in how many elements
and which rows, for the kernel with its in-kernel per-token amax, the same kernel given the
oracle's amax, and the row-amax kernel alone: enough to tell an amax problem from a
quantization problem.

    python tools/mosaic_probe.py [--mse]        # on the H200 (tools/gpu_session.sh probe)
    JAX_PLATFORMS=cpu python tools/mosaic_probe.py --interpret   # the same on the CPU interpreter
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import block_math as bm
from pallas_kernels.nvfp4_quant import mosaic as mq
from pallas_kernels.nvfp4_quant import mosaic_block as mb
from pallas_kernels.nvfp4_quant import shapes
from tests.formats import oracle
from tests.kernels.test_mosaic import CONFIGS, make_input

CASES = shapes.MOSAIC_OVERLAP  # bf16 shapes sensitive to one-ulp errors (M > 128), as the Mosaic GPU tests
NAMES = ["token-6", "token-mae-256", "tensor-mae-448-fast"]


def rows_of(mask) -> str:
    rows = np.unique(np.argwhere(mask)[:, 0])
    return f"{len(rows)} rows {rows[:12].tolist()}{'...' if len(rows) > 12 else ''}"


def compare(label, got, want, x32):
    """One line per differing field (codes, scales, map4, amax) against the oracle's bytes."""
    fields = {
        "codes": (np.asarray(got.codes), want.codes),
        "scales": (np.asarray(got.scales).view(np.uint8), want.scales),
        "map4": (np.asarray(got.map4), want.map4),
        "amax": (np.asarray(got.amax, np.float32).reshape(np.shape(want.amax)).view(np.uint32),
                 np.asarray(want.amax, np.float32).view(np.uint32)),
    }
    bad = []
    for name, (g, w) in fields.items():
        differ = g != w
        if differ.any():
            i = tuple(np.argwhere(differ)[0])
            detail = f"{name}: {int(differ.sum())}/{differ.size} differ, {rows_of(differ) if differ.ndim > 1 else ''}"
            detail += f" first at {list(map(int, i))}: got {g[i]!r} want {w[i]!r}"
            if name == "amax" and differ.ndim > 1:
                r = i[0]
                detail += f" (row {r}: max|x| = {np.max(np.abs(x32[r])):.9g}, got {g[i].view(np.float32)!r})"
            bad.append(detail)
    print(f"  {label}: " + ("EQUAL" if not bad else "\n    " + "\n    ".join(bad)), flush=True)


STAGES = ("x", "s_enc", "k", "t", "sf", "sf_s_dec", "inv", "v")


def intermediates_call(m, k, dtype, interpret):
    """Block 0 of every row through the kernel's own helpers (plain map-to-6, amax given per
    row), every intermediate written out as f32: [len(STAGES), M, 16] (scalars repeated)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    block_m = mq.MosaicQuantTiling().block_m
    view = mq._View(groups=1, m=m, k=k, band=1, k_major=False)

    def kernel(x_ref, amax_ref, out_ref):
        g, rows = mq._program_units(view, block_m)
        amax = amax_ref.at[g, rows][...]
        s_enc, s_dec = bm.scales_from_amax(mb.ExactArith, amax, 448)
        cols = [view.load(x_ref, g, rows, 0, i) for i in range(16)]
        bits = bm.abs_bits(cols[0])
        for c in cols[1:]:
            bits = jnp.maximum(bits, bm.abs_bits(c))
        b = bm.from_bits(bits)
        kk = s_enc * mb.f32(bm.ONE_SIXTH)
        t = bm.min_nan(b * kk, bm.E4M3_MAX)
        sf, _ = mb.e4m3_round(t)
        prod = sf * s_dec
        inv = mb.inv_scale(sf, s_dec)
        scalars = {"s_enc": s_enc, "k": kk, "t": t, "sf": sf, "sf_s_dec": prod, "inv": inv}
        for i in range(16):
            out_ref.at[0, rows, i][...] = cols[i]
            out_ref.at[len(STAGES) - 1, rows, i][...] = cols[i] * inv
            for j, name in enumerate(STAGES[1:-1], start=1):
                out_ref.at[j, rows, i][...] = scalars[name]

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((len(STAGES), m, 16), jnp.float32), grid=(1, pl.cdiv(m, block_m)),
        grid_names=("g", "m"), kernel_name="fp4rl_mosaic_probe", interpret=mq._interpret_param(interpret))


def numpy_intermediates(x32, amax):
    """The same stages from the NumPy oracle's helpers (the contract: one IEEE op per fl())."""
    f = np.float32
    s_enc, s_dec = oracle.global_scales(amax, 448)
    b = np.max(np.abs(x32[:, :16]), axis=1)
    kk = (s_enc * (f(1) / f(6))).astype(f)
    t = np.minimum(b * kk, f(448)).astype(f)
    sf = oracle.e4m3(t).astype(np.float32)
    prod = (sf * s_dec).astype(f)
    inv = oracle._inv_scale(sf, s_dec)
    v = (x32[:, :16] * inv[:, None]).astype(f)
    rep = lambda a: np.repeat(a[:, None], 16, axis=1)
    return {"x": x32[:, :16], "s_enc": rep(s_enc), "k": rep(kk), "t": rep(t), "sf": rep(sf),
            "sf_s_dec": rep(prod), "inv": rep(inv), "v": v}


def probe_intermediates(interpret: bool):
    for m, k in CASES[:2]:
        for dtype in (jnp.bfloat16, jnp.float32):
            x = make_input(m, k, dtype, seed=m * k, subnormal=False, nan=False)
            x32 = np.asarray(x.astype(jnp.float32))
            amax = np.max(np.abs(x32), axis=1).astype(np.float32)
            got = np.asarray(intermediates_call(m, k, x.dtype, interpret)(x[None], jnp.asarray(amax)[None]))
            want = numpy_intermediates(x32, amax)
            line = []
            for j, name in enumerate(STAGES):
                differ = got[j].view(np.uint32) != want[name].view(np.uint32)
                if differ.any():
                    r, c = np.argwhere(differ)[0]
                    line.append(f"{name}: {int(differ.sum())} differ (rows {rows_of(differ)}), first [{r},{c}] got "
                                f"{got[j][r, c]!r} want {want[name][r, c]!r}")
            print(f"== intermediates {m}x{k} {jnp.dtype(dtype).name}: " + ("all EQUAL" if not line else
                  "\n    " + "\n    ".join(line)), flush=True)


def probe_outputs(cases, names, interpret: bool):
    """Kernel (amax computed, given; bf16 and its f32 upcast) and the XLA reference (default
    device and host CPU) against the NumPy oracle, field by field, for bf16 inputs."""
    cpu = jax.devices("cpu")[0]
    for m, k in cases:
        x = make_input(m, k, jnp.bfloat16, seed=m * k, subnormal=False, nan=False)  # as test_gpu_matches_reference
        x32 = np.asarray(x.astype(jnp.float32))
        row_max = np.max(np.abs(x32), axis=1)
        padded = mq._pad_rows(x, mq.MosaicQuantTiling().block_m)  # as quantize_mosaic does for M < 128
        view = mq._View(groups=1, m=padded.shape[0], k=k, band=1, k_major=False)
        got_rows = np.asarray(mq._amax_call(view, x.dtype, mq.MosaicQuantTiling(), interpret)(padded[None]))[0, :m]
        n_bad = int(np.sum(got_rows.view(np.uint32) != row_max.view(np.uint32)))
        print(f"== {m}x{k} bfloat16: row-amax kernel vs max|x|: {n_bad}/{m} rows differ"
              + (f", {rows_of((got_rows != row_max)[:, None])}" if n_bad else ""), flush=True)
        for name in names:
            config = CONFIGS[name]
            want = oracle.quantize_nvfp4(x32, scale=config.scale, four_over_six=config.four_over_six,
                                         e4m3_max=config.e4m3_max, fast_error=config.fast_error)
            print(f" {name}:", flush=True)
            compare("kernel", mq.quantize_mosaic(x, config, interpret=interpret), want, x32)
            compare("kernel on the exact f32 upcast", mq.quantize_mosaic(jnp.asarray(x32), config, interpret=interpret),
                    want, x32)
            given = mq.quantize_mosaic(x, config, amax=jnp.asarray(want.amax), interpret=interpret)
            compare("kernel, oracle amax given", given, want, x32)
            compare(f"XLA reference ({jax.default_backend()})", ref.quantize(x, config), want, x32)
            with jax.default_device(cpu):
                compare("XLA reference (host CPU)", ref.quantize(jax.device_put(x, cpu), config), want, x32)


def main(argv):
    interpret = "--interpret" in argv
    print(jax.devices(), f"{interpret=}", flush=True)
    if "--mse" in argv:  # the bf16 MSE cases, where the rounding of the error's square shows
        probe_outputs([(129, 272), (33, 8192)], ["token-mse-256", "token-mse-448-fast"], interpret)
        return
    probe_intermediates(interpret)
    probe_outputs(CASES[:2], NAMES, interpret)  # the third case adds nothing the first two do not show


if __name__ == "__main__":
    main(sys.argv[1:])
