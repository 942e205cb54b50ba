"""Quantization error of NVFP4, NVFP4 + Four-Over-Six and MX formats on synthetic tensors.

Shared by `experiments/numerics.py` (the table, plot and JSON of a run) and
`notebooks/numerics.ipynb` (exploration). Everything quantizes through `fp4rl.formats`, the
numerics contract of docs/numerics.md; this module only samples tensors, measures and reports.

Metric: the relative error ||x_hat - x||_2 / ||x||_2 over the whole tensor, in float32.

Distributions (`sample`), each [R, K] with K the contraction axis that blocks run along:
- normal: N(0, 1).
- student_t: Student-t with df = 2 (infinite variance: heavy tails stress the global scale).
- llm_activations: N(0, 1) plus a few fixed outlier channels (1 in 512 columns, at least
  one) scaled by 20-100x, the channel-wise outlier pattern of LLM activations (Dettmers et
  al. 2022, "LLM.int8()", s3).
- weight: N(0, 0.02^2), the usual init std of transformer weights, quantized with 16x16 2D
  blocks and a per-tensor scale as docs/numerics.md §2 prescribes for weights. Per-token scales
  do not apply (a tile spans 16 rows), so those cells are n/a.
MX formats have no per-token scale (docs/numerics.md §5), so their per-token cells are n/a too.

4/6 statistics: the fraction of blocks that choose map-to-4, and how often the fast
(scaled-domain) error picks the same candidate as the exact error (docs/numerics.md §3 quotes
> 99.97% agreement; we measure it). `four_over_six_block_errors` exposes the per-block
err_4 and err_6 for histograms; a test pins its decisions to `fp4rl.formats`' map4 bits.

Longer than ~400 lines because the experiment and the notebook both use all of it (sampling,
measuring, the 4/6 agreement, tables and plot): one module keeps the numbers they show identical.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from fp4rl.formats import elements as el
from fp4rl.formats import mx, nvfp4
from fp4rl.formats.nvfp4 import NVFP4Config

DISTRIBUTIONS = ("normal", "student_t", "llm_activations", "weight")
SCALES = ("tensor", "token")
WEIGHT_STD = 0.02
OUTLIER_EVERY = 512  # one outlier channel per 512 columns (8 of 4096)
OUTLIER_RANGE = (20.0, 100.0)  # outlier channel magnitude, times the bulk's std


@dataclasses.dataclass(frozen=True)
class Format:
    """One compared format. `four_over_six`/`e4m3_max` only apply to the NVFP4 family."""

    name: str
    family: Literal["nvfp4", "mxfp4", "mxfp8"]
    four_over_six: Literal["mae", "mse"] | None = None
    e4m3_max: int | None = None

    def nvfp4_config(self, scale: str, block_2d: bool, fast_error: bool = False) -> NVFP4Config:
        return NVFP4Config(
            block_2d=block_2d,
            scale=scale,
            four_over_six=self.four_over_six,
            e4m3_max=self.e4m3_max,
            fast_error=fast_error,
        )


FORMATS = (
    Format("NVFP4", "nvfp4"),
    Format("NVFP4+4/6 MAE E=256", "nvfp4", "mae", 256),
    Format("NVFP4+4/6 MAE E=448", "nvfp4", "mae", 448),
    Format("NVFP4+4/6 MSE E=256", "nvfp4", "mse", 256),
    Format("NVFP4+4/6 MSE E=448", "nvfp4", "mse", 448),
    Format("MXFP4", "mxfp4"),
    Format("MXFP8", "mxfp8"),
)
FORMATS_BY_NAME = {f.name: f for f in FORMATS}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One (distribution, scale, format) cell. `rel_error` is None where it does not apply
    (`na_reason` says why). The 4/6 fields are None for formats without 4/6."""

    distribution: str
    scale: str
    format: str
    rel_error: float | None
    na_reason: str | None = None
    map4_fraction: float | None = None
    rel_error_fast: float | None = None  # 4/6 with the fast (scaled-domain) choice
    map4_fraction_fast: float | None = None
    fast_exact_agreement: float | None = None  # share of blocks where both choose alike
    fast_exact_disagreements: int | None = None
    blocks: int | None = None  # 4/6 decisions taken (1x16 blocks or 16x16 tiles)


# ---------------------------------------------------------------------------- sampling


def is_weight(distribution: str) -> bool:
    """Weights use 16x16 2D blocks and a per-tensor scale (docs/numerics.md §2)."""
    return distribution == "weight"


def _check_distribution(distribution: str):
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution={distribution!r}; valid options: {DISTRIBUTIONS}")


def sample(distribution: str, rows: int, cols: int, seed: int) -> jax.Array:
    """A float32 [rows, cols] tensor. The key is fold_in(seed, index in DISTRIBUTIONS), so a
    distribution's tensor does not depend on which other distributions a run includes."""
    _check_distribution(distribution)
    key = jax.random.fold_in(jax.random.key(seed), DISTRIBUTIONS.index(distribution))
    return _sample(distribution, rows, cols, key)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _sample(distribution: str, rows: int, cols: int, key) -> jax.Array:
    k_bulk, k_chan, k_mag = jax.random.split(key, 3)
    shape = (rows, cols)
    if distribution == "normal":
        return jax.random.normal(k_bulk, shape, jnp.float32)
    if distribution == "student_t":
        # t_2 = Z / sqrt(chi2_2 / 2) with chi2_2 / 2 ~ Exp(1) = -log(U): exact for df = 2 and
        # ~50x faster on CPU than jax.random.t (a gamma rejection loop). U >= tiny and U < 1
        # keep -log(U) in (0, 88], so no sample is infinite (jax.random.exponential can give 0).
        z = jax.random.normal(k_bulk, shape, jnp.float32)
        u = jax.random.uniform(k_chan, shape, jnp.float32, minval=np.finfo(np.float32).tiny)
        return z * jax.lax.rsqrt(-jnp.log(u))
    if distribution == "weight":
        return jnp.float32(WEIGHT_STD) * jax.random.normal(k_bulk, shape, jnp.float32)
    # llm_activations: the same outlier channels in every token (channel-wise outliers)
    n_outliers = max(1, cols // OUTLIER_EVERY)
    channels = jax.random.choice(k_chan, cols, (n_outliers,), replace=False)
    lo, hi = OUTLIER_RANGE
    magnitude = jax.random.uniform(k_mag, (n_outliers,), jnp.float32, lo, hi)
    gain = jnp.ones((cols,), jnp.float32).at[channels].set(magnitude)
    return jax.random.normal(k_bulk, shape, jnp.float32) * gain


# ---------------------------------------------------------------------------- measuring


def _relative_error(x, x_hat):
    """||x_hat - x|| / ||x||, the same formula as `nvfp4.relative_error`, for MX outputs."""
    x = jnp.asarray(x, jnp.float32)
    return jnp.linalg.norm(x_hat - x) / jnp.maximum(jnp.linalg.norm(x), np.float32(1e-30))


def _measure_fn(fmt: Format, scale: str, block_2d: bool):
    """The jnp function measuring one config on a tensor x [R, K] (a dict of scalars)."""
    if fmt.family != "nvfp4":
        return lambda x: {"rel_error": _relative_error(x, mx.dequantize(mx.quantize(x, fmt.family)))}
    config = fmt.nvfp4_config(scale, block_2d)
    if fmt.four_over_six is None:
        return lambda x: {"rel_error": nvfp4.relative_error(x, nvfp4.quantize(x, config))}
    fast_config = dataclasses.replace(config, fast_error=True)

    def four_over_six(x):  # exact- and fast-error 4/6 of the same tensor, and their agreement
        exact, fast = nvfp4.quantize(x, config), nvfp4.quantize(x, fast_config)
        # 2D: map4 repeats each tile's decision on its 16 rows; one row per tile counts
        # every decision once.
        m_exact, m_fast = (t.map4[::16] if block_2d else t.map4 for t in (exact, fast))
        return {
            "rel_error": nvfp4.relative_error(x, exact),
            "map4_fraction": jnp.mean(m_exact),
            "rel_error_fast": nvfp4.relative_error(x, fast),
            "map4_fraction_fast": jnp.mean(m_fast),
            "fast_exact_disagreements": jnp.sum(m_exact != m_fast),
            "blocks": jnp.asarray(m_exact.size),
        }

    return four_over_six


def _config_key(distribution: str, scale: str, fmt: Format) -> tuple[Format, str, bool]:
    """What a compiled function depends on besides the shape: MX always uses its 1x32 blocks
    at one scale, so all distributions share its executable."""
    if fmt.family != "nvfp4":
        return fmt, "tensor", False
    return fmt, scale, is_weight(distribution)


@functools.cache
def _executable(fmt: Format, scale: str, block_2d: bool, shape: tuple[int, int]):
    """Trace and compile one config once per shape (ahead of time, so `precompile` can run
    the XLA compiles concurrently: they dominate a CPU run and run outside the GIL)."""
    arg = jax.ShapeDtypeStruct(shape, jnp.float32)
    return jax.jit(_measure_fn(fmt, scale, block_2d)).lower(arg).compile()


def precompile(cells, shape: tuple[int, int], workers: int | None = None, progress: bool = False):
    """Compile the executables of `cells` [(distribution, scale, Format)] on `workers` threads."""
    keys = list(dict.fromkeys(_config_key(*c) for c in cells if not_applicable(*c) is None))
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(workers) as pool:
        jobs = [pool.submit(_executable, *k, tuple(shape)) for k in keys]
        for job in tqdm(as_completed(jobs), total=len(jobs), desc="compile", unit="config", disable=not progress):
            job.result()  # re-raises a failed compile


def not_applicable(distribution: str, scale: str, fmt: Format) -> str | None:
    """Why a cell has no number, or None when it applies."""
    if scale == "token" and fmt.family != "nvfp4":
        return "MX formats have no per-token scale"
    if scale == "token" and is_weight(distribution):
        return "2D weight tiles span 16 rows: per-tensor scale only"
    return None


def measure(x, distribution: str, scale: str, fmt: Format) -> Measurement:
    """Quantize `x` (a sample of `distribution`) with `fmt` at `scale` and measure it."""
    _check_distribution(distribution)
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r}; valid options: {SCALES}")
    reason = not_applicable(distribution, scale, fmt)
    if reason is not None:
        return Measurement(distribution, scale, fmt.name, None, na_reason=reason)
    if x.dtype != jnp.float32:
        raise TypeError(f"measure needs a float32 tensor (the compiled signature), got {x.dtype}")
    out = jax.device_get(_executable(*_config_key(distribution, scale, fmt), tuple(x.shape))(x))
    if fmt.four_over_six is None:
        return Measurement(distribution, scale, fmt.name, float(out["rel_error"]))
    blocks, disagree = int(out["blocks"]), int(out["fast_exact_disagreements"])
    return Measurement(
        distribution,
        scale,
        fmt.name,
        float(out["rel_error"]),
        map4_fraction=float(out["map4_fraction"]),
        rel_error_fast=float(out["rel_error_fast"]),
        map4_fraction_fast=float(out["map4_fraction_fast"]),
        fast_exact_agreement=1.0 - disagree / blocks,
        fast_exact_disagreements=disagree,
        blocks=blocks,
    )


@dataclasses.dataclass(frozen=True)
class StudyResult:
    rows: int
    cols: int
    seed: int
    distributions: tuple[str, ...]
    measurements: tuple[Measurement, ...]
    seconds: float

    def get(self, distribution: str, scale: str, fmt: str) -> Measurement:
        for m in self.measurements:
            if (m.distribution, m.scale, m.format) == (distribution, scale, fmt):
                return m
        raise KeyError(f"no measurement for {(distribution, scale, fmt)}")

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "cols": self.cols,
            "seed": self.seed,
            "distributions": list(self.distributions),
            "seconds": self.seconds,
            "metric": "||x_hat - x||_2 / ||x||_2",
            "measurements": [dataclasses.asdict(m) for m in self.measurements],
        }


def check_shape(rows: int, cols: int):
    """Validate before sampling or tracing: 16x16 weight tiles and 32-wide MX blocks."""
    if rows <= 0 or rows % nvfp4.BLOCK:
        raise ValueError(f"{rows=} must be a positive multiple of {nvfp4.BLOCK} (16x16 weight tiles)")
    if cols <= 0 or cols % mx.BLOCK:
        raise ValueError(f"{cols=} must be a positive multiple of {mx.BLOCK} (the MX block)")


@dataclasses.dataclass(frozen=True)
class NumericsConfig:
    """The study `experiments.numerics` runs (presets: `fp4rl.configs.NUMERICS_PRESETS`)."""

    rows: int = 1024  # tokens (activations) or output features (weights); multiple of 16
    cols: int = 4096  # the contraction dim K the blocks run along; multiple of 32
    seed: int = 0
    out: str = "runs/numerics"
    distributions: tuple[str, ...] = DISTRIBUTIONS

    def __post_init__(self):
        check_shape(self.rows, self.cols)
        unknown = set(self.distributions) - set(DISTRIBUTIONS)
        if unknown or not self.distributions:
            raise ValueError(
                f"distributions={self.distributions}; valid options: {DISTRIBUTIONS}"
            )


def run_study(
    *,
    rows: int,
    cols: int,
    seed: int,
    distributions: Sequence[str],
    formats: Sequence[Format] = FORMATS,
    progress: bool = False,
) -> StudyResult:
    """Measure every (distribution, scale, format) cell; n/a cells are recorded, not skipped."""
    check_shape(rows, cols)
    for d in distributions:
        _check_distribution(d)
    start = time.perf_counter()
    cells = [(d, s, f) for d in distributions for s in SCALES for f in formats]
    precompile(cells, (rows, cols), progress=progress)
    measurements, tensors = [], {}
    for d, s, f in tqdm(cells, desc="measure", unit="config", disable=not progress):
        if d not in tensors:
            tensors = {d: sample(d, rows, cols, seed)}  # keep one tensor alive at a time
        measurements.append(measure(tensors[d], d, s, f))
    return StudyResult(
        rows, cols, seed, tuple(distributions), tuple(measurements), time.perf_counter() - start
    )


# ---------------------------------------------------------------------------- per-block 4/6


@functools.partial(jax.jit, static_argnames="config")
def four_over_six_block_errors(x, config: NVFP4Config) -> tuple[jax.Array, jax.Array]:
    """Per-block (err_4, err_6) of the two 4/6 candidates, following docs/numerics.md §3 step by step.

    Returns two float32 arrays [..., K/16] (1D blocks) or [..., R/16, K/16] (2D tiles), in the
    metric of `config` (MAE or MSE, exact or fast). `quantize` chooses map-to-4 exactly where
    err_4 < err_6 (a test pins this bit for bit); it does not return these errors, which the
    notebook's err_4/err_6 histograms need.
    """
    if config.four_over_six is None:
        raise ValueError("four_over_six_block_errors needs config.four_over_six in ('mae', 'mse')")
    nvfp4.check_input(x, config)
    x32 = jnp.asarray(x, jnp.float32)
    a = nvfp4.global_amax(x32, config)
    s_enc, s_dec = nvfp4.global_scales(a, config.e4m3_bound)
    if config.scale == "token":
        a, s_enc, s_dec = a[..., None], s_enc[..., None], s_dec[..., None]
    if config.block_2d:  # [..., R/16, 16 rows, K/16, 16]
        *lead, r, k = x32.shape
        xb = x32.reshape(*lead, r // 16, 16, k // 16, 16)
        b = jnp.max(jnp.abs(xb), axis=(-3, -1), keepdims=True)
    else:  # [..., R, K/16, 16]
        xb = x32.reshape(*x32.shape[:-1], x32.shape[-1] // 16, 16)
        b = jnp.max(jnp.abs(xb), axis=-1, keepdims=True)
    base = (b / jnp.float32(6)) * s_enc  # divide, then multiply (§3)
    errors = []
    for factor in (1.5, 1.0):  # map-to-4, map-to-6
        sf = el.e4m3_round_f32(jnp.minimum(base * jnp.float32(factor), jnp.float32(el.E4M3_MAX)))
        inv = jnp.minimum(jnp.float32(1) / (sf * s_dec), el.FLT_MAX)
        dec_sf = el.e2m1_decode(el.e2m1_encode(xb * inv)) * sf
        if config.fast_error:
            d = dec_sf - xb * s_enc
        else:
            d = (dec_sf * a) / jnp.float32(6 * config.e4m3_bound) - xb
        e = jnp.abs(d) if config.four_over_six == "mae" else d * d
        total = e[..., 0]
        for i in range(1, 16):  # sequential f32 sum over i = 0..15 (§3)
            total = total + e[..., i]
        if config.block_2d:  # pairwise tree sum of the 16 row errors of a tile (§3)
            r = jnp.moveaxis(total, -2, -1)
            for half in (8, 4, 2, 1):
                r = r[..., :half] + r[..., half : 2 * half]
            total = r[..., 0]
        errors.append(total)
    return errors[0], errors[1]


# ---------------------------------------------------------------------------- reporting


def _fmt_error(m: Measurement) -> str:
    return "n/a" if m.rel_error is None else f"{m.rel_error:.4f}"


def _table(result: StudyResult, formats: Sequence[Format], cell) -> list[str]:
    header = "| distribution | scale | " + " | ".join(f.name for f in formats) + " |"
    lines = [header, "|---|---|" + "---:|" * len(formats)]
    for d in result.distributions:
        for s in SCALES:
            cells = [cell(result.get(d, s, f.name)) for f in formats]
            lines.append(f"| {d} | per-{s} | " + " | ".join(cells) + " |")
    return lines


def markdown_report(result: StudyResult) -> str:
    """The run's tables as markdown: errors, map-to-4 fractions, fast/exact agreement."""
    names = {m.format for m in result.measurements}
    formats = [f for f in FORMATS if f.name in names]
    four_six = [f for f in formats if f.four_over_six]
    lines = [
        "# Quantization error by format and distribution",
        "",
        f"Tensor {result.rows}x{result.cols} (blocks along the {result.cols} columns), "
        f"seed {result.seed}, {result.seconds:.1f} s. Relative error ||x_hat - x|| / ||x||; "
        "4/6 chooses each block's candidate by the exact error (docs/numerics.md §3).",
        "",
        *_table(result, formats, _fmt_error),
        "",
        "n/a: MX formats have no per-token scale; 2D (16x16) weight tiles span 16 rows, so "
        "weights take a per-tensor scale only. The weight distribution uses 16x16 NVFP4 tiles; "
        "MX formats use their 1x32 blocks everywhere.",
    ]
    if four_six:
        lines += [
            "",
            "## Four-Over-Six: fraction of blocks choosing map-to-4 (exact error)",
            "",
            *_table(result, four_six, lambda m: "n/a" if m.map4_fraction is None else f"{m.map4_fraction:.3f}"),
            "",
            "## Four-Over-Six: fast vs exact choice agreement (share of blocks; disagreements)",
            "",
            *_table(
                result,
                four_six,
                lambda m: "n/a"
                if m.fast_exact_agreement is None
                else f"{100 * m.fast_exact_agreement:.4f}% ({m.fast_exact_disagreements})",
            ),
        ]
    return "\n".join(lines) + "\n"


# Colours: NVFP4 grey, the four 4/6 variants as two hue pairs (MAE blues, MSE greens; darker
# = E=256), MX in warm colours, so related bars read as a family.
_COLORS = {
    "NVFP4": "#7f7f7f",
    "NVFP4+4/6 MAE E=256": "#1f4e9c",
    "NVFP4+4/6 MAE E=448": "#7fa7e0",
    "NVFP4+4/6 MSE E=256": "#1e7a3c",
    "NVFP4+4/6 MSE E=448": "#86cf95",
    "MXFP4": "#d62728",
    "MXFP8": "#ff9f1c",
}


def plot(result: StudyResult, path: str | Path | None = None, title: str | None = None):
    """Top row: grouped bars of relative error (log y), one panel per scale, groups =
    distributions, bars = formats, each labelled with its value. Bottom row: the 4/6 errors
    divided by plain NVFP4's (linear y), where 4/6's few-percent gains are visible.

    Builds a `matplotlib.figure.Figure` without pyplot (no global state, any backend); in a
    notebook `display(fig)` shows it. Saved to `path` when given.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    names = {m.format for m in result.measurements}
    formats = [f for f in FORMATS if f.name in names]
    four_six = [f for f in formats if f.four_over_six]
    dists = result.distributions
    xlabels = [d.replace("_", " ") + ("\n(16x16 tiles)" if is_weight(d) else "") for d in dists]
    values = [m.rel_error for m in result.measurements if m.rel_error]
    lo, hi = min(values), max(values)
    show_ratio = bool(four_six) and "NVFP4" in names
    fig = Figure(figsize=(15, 10.5 if show_ratio else 6))
    axes = fig.subplots(2 if show_ratio else 1, 2, sharey="row", squeeze=False)

    def grouped(ax, scale, fmts, value, label_fmt):
        width = 0.84 / len(fmts)
        for j, f in enumerate(fmts):
            labelled = False
            for i, d in enumerate(dists):
                x = i + (j - (len(fmts) - 1) / 2) * width
                v = value(result.get(d, scale, f.name))
                if v is None:
                    if any(value(result.get(d, scale, g.name)) is not None for g in fmts):
                        ax.text(x, 0.02, "n/a", transform=ax.get_xaxis_transform(), ha="center",
                                va="bottom", rotation=90, fontsize=8, color="#777777")
                    continue
                ax.bar(x, v, width, color=_COLORS[f.name], edgecolor="white", linewidth=0.5,
                       label=None if labelled else f.name)
                labelled = True
                ax.annotate(label_fmt.format(v), (x, v), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", rotation=90, fontsize=7.5)
        for i, d in enumerate(dists):  # a whole group missing: say why once
            if all(value(result.get(d, scale, f.name)) is None for f in fmts):
                ax.text(i, 0.5, f"n/a\n(per-{SCALES[0]} only)", transform=ax.get_xaxis_transform(),
                        ha="center", va="center", fontsize=9, color="#777777", style="italic")
        ax.set_xticks(np.arange(len(dists)))
        ax.set_xticklabels(xlabels, fontsize=10)
        ax.set_xlim(-0.5, len(dists) - 0.5)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.set_axisbelow(True)

    for ax, scale in zip(axes[0], SCALES):
        grouped(ax, scale, formats, lambda m: m.rel_error, "{:.4f}")
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.6, hi * 2.0)
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
        ax.tick_params(axis="y", which="minor", labelsize=8)
        ax.set_title(f"relative error, per-{scale} global scale", fontsize=12)
    axes[0][0].set_ylabel("||x̂ − x|| / ||x||  (log scale)", fontsize=11)
    handles, labels = axes[0][0].get_legend_handles_labels()

    if show_ratio:
        def ratio(m):
            base = result.get(m.distribution, m.scale, "NVFP4").rel_error
            return None if m.rel_error is None or base is None else m.rel_error / base

        ratios = [r for m in result.measurements if m.format in {f.name for f in four_six}
                  if (r := ratio(m)) is not None]
        for ax, scale in zip(axes[1], SCALES):
            grouped(ax, scale, four_six, ratio, "{:.3f}")
            ax.axhline(1.0, color="#7f7f7f", linewidth=1.2, linestyle="--")
            ax.set_ylim(min(min(ratios), 1.0) - 0.03, max(max(ratios), 1.0) + 0.025)
            ax.set_title(f"4/6 error / NVFP4 error, per-{scale} (below 1 = 4/6 helps)", fontsize=12)
        axes[1][0].set_ylabel("error ratio to NVFP4 (dashed line = 1)", fontsize=11)

    fig.legend(handles, labels, loc="lower center", ncol=len(formats), fontsize=9.5, frameon=False)
    fig.suptitle(title or f"Quantization error, {result.rows}x{result.cols} tensors, seed {result.seed}",
                 fontsize=13)
    fig.tight_layout(rect=(0, 0.035 if show_ratio else 0.06, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def write_report(result: StudyResult, out_dir: str | Path, extra: dict | None = None) -> dict[str, Path]:
    """Write numerics.md, numerics.png and numerics.json into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "numerics.md", "png": out / "numerics.png", "json": out / "numerics.json"}
    paths["md"].write_text(markdown_report(result))
    plot(result, paths["png"])
    paths["json"].write_text(json.dumps({**result.to_json(), **(extra or {})}, indent=1) + "\n")
    return paths
