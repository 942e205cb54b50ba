"""The 4/6 choice explored (notebooks/numerics.ipynb §2; docs/numerics.md §3): how often
map-to-4 wins, the per-block error ratio err4 / err6 behind the choice, and when map-to-4 wins
(the block's crest factor).

- `map4_fractions`, `map4_fraction_figure`, `agreement_lines`: from a `numerics_study.StudyResult`;
- `block_error_ratios`, `error_ratio_figure`: per block err4 / err6, checked against
  `quantize`'s map4 bits;
- `crest_factor`, `map4_by_crest`, `crest_figure`: map-to-4 fraction per crest-factor decile.

Figures are `matplotlib.figure.Figure`s (no pyplot): in a notebook with `%matplotlib inline`
a returned figure is displayed. Imports jax (through `fp4rl.numerics_study`), unlike the rest
of `fp4rl.analysis`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from fp4rl import numerics_study as ns
from fp4rl.formats import NVFP4Config, nvfp4

# (distribution, scale) cases of the error-ratio figure.
RATIO_CASES = (("normal", "token"), ("student_t", "token"), ("llm_activations", "token"), ("weight", "tensor"))
RATIO_BINS = np.geomspace(0.25, 4, 61)  # err4 / err6, clipped to [0.25, 4]
METRIC_COLORS = {"mae": "C0", "mse": "C2"}


def four_over_six_formats(formats: Sequence[ns.Format]) -> list[ns.Format]:
    return [f for f in formats if f.four_over_six]


def map4_fractions(result: ns.StudyResult, formats: Sequence[ns.Format]
                   ) -> tuple[list[tuple[str, str]], dict[str, list[float]]]:
    """(labels, {format: fractions}): the (distribution, scale) cells where the first 4/6
    format has a map-to-4 fraction, and each 4/6 format's fraction there."""
    four_six = four_over_six_formats(formats)
    if not four_six:
        return [], {}
    labels = [(d, s) for d in result.distributions for s in ns.SCALES
              if result.get(d, s, four_six[0].name).map4_fraction is not None]
    return labels, {f.name: [result.get(d, s, f.name).map4_fraction for d, s in labels] for f in four_six}


def map4_fraction_figure(result: ns.StudyResult, formats: Sequence[ns.Format]) -> Figure:
    labels, fractions = map4_fractions(result, formats)
    fig = Figure(figsize=(9, 3.6), layout="tight")
    ax = fig.subplots()
    width = 0.38
    for j, (name, v) in enumerate(fractions.items()):
        bars = ax.bar(np.arange(len(labels)) + (j - 0.5) * width, v, width, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set_xticks(np.arange(len(labels)), [f"{d}\nper-{s}" for d, s in labels], fontsize=8)
    ax.set_ylabel("fraction of blocks choosing map-to-4")
    ax.legend(fontsize=8)
    return fig


def agreement_lines(result: ns.StudyResult, formats: Sequence[ns.Format],
                    distribution: str = "normal", scale: str = "token") -> list[str]:
    """Per 4/6 format, how often the fast error estimate chooses as the exact one does."""
    lines = []
    for f in four_over_six_formats(formats):
        m = result.get(distribution, scale, f.name)
        lines.append(f"{f.name}: fast/exact choice agreement {100 * m.fast_exact_agreement:.3f}% "
                     f"({m.fast_exact_disagreements} of {m.blocks} blocks differ), {distribution} per-{scale}")
    return lines


def block_error_ratios(x, config: NVFP4Config) -> tuple[np.ndarray, float]:
    """(err4 / err6 per block with err6 > 0, fraction of blocks choosing map-to-4).

    Raises AssertionError unless map-to-4 is chosen exactly where err4 < err6, as
    `nvfp4.quantize`'s map4 bits say (the library's choice, bit for bit).
    """
    err4, err6 = (np.asarray(e).ravel() for e in ns.four_over_six_block_errors(x, config))
    map4 = np.asarray(nvfp4.quantize(x, config).map4)
    map4 = map4[::16] if config.block_2d else map4  # one row of map4 bits per 16x16 tile row
    choose4 = err4 < err6
    if not np.array_equal(choose4, map4.ravel()):
        differ = int(np.sum(choose4 != map4.ravel()))
        raise AssertionError(f"err4 < err6 disagrees with quantize's map4 in {differ} blocks")
    ok = err6 > 0  # a zero-error block's ratio is undefined
    return err4[ok] / err6[ok], float(np.mean(choose4))


def error_ratio_figure(rows: int, cols: int, seed: int, cases: Sequence[tuple[str, str]] = RATIO_CASES) -> Figure:
    """One histogram panel per (distribution, scale), MAE and MSE choices overlaid."""
    fig = Figure(figsize=(16, 3.4), layout="tight")
    axes = np.atleast_1d(fig.subplots(1, len(cases), sharey=True))
    for ax, (dist, scale) in zip(axes, cases):
        x = ns.sample(dist, rows, cols, seed)
        for metric, color in METRIC_COLORS.items():
            cfg = NVFP4Config(four_over_six=metric, scale=scale, block_2d=ns.is_weight(dist))
            ratio, map4 = block_error_ratios(x, cfg)
            ax.hist(np.clip(ratio, RATIO_BINS[0], RATIO_BINS[-1]), bins=RATIO_BINS, histtype="step", color=color,
                    lw=1.5, label=f"{metric.upper()}: map-4 {map4:.1%}")
        ax.axvline(1, color="k", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_xticks([0.25, 0.5, 1, 2, 4], ["0.25", "0.5", "1", "2", "4"])
        ax.minorticks_off()
        ax.set_title(f"{dist}, per-{scale}" + (" (16x16)" if ns.is_weight(dist) else ""), fontsize=10)
        ax.set_xlabel("err4 / err6 (clipped to [0.25, 4])")
        ax.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("blocks")
    return fig


def crest_factor(x) -> np.ndarray:
    """float [R, K/16]: per 1x16 block, max |x| / RMS."""
    x = np.asarray(x, np.float64)
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    return np.abs(blocks).max(-1) / np.sqrt((blocks ** 2).mean(-1))


def map4_by_crest(x, config: NVFP4Config, n_bins: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres, map-to-4 fraction per bin): the 1x16 blocks of `x` binned into `n_bins`
    quantiles of their crest factor."""
    crest = crest_factor(x)
    edges = np.quantile(crest, np.linspace(0, 1, n_bins + 1))
    which = np.clip(np.digitize(crest, edges[1:-1]), 0, n_bins - 1)
    map4 = np.asarray(nvfp4.quantize(x, config).map4)
    frac = np.array([map4[which == i].mean() for i in range(n_bins)])
    return 0.5 * (edges[:-1] + edges[1:]), frac


def crest_figure(rows: int, cols: int, seed: int, distribution: str = "normal") -> Figure:
    x = np.asarray(ns.sample(distribution, rows, cols, seed))
    fig = Figure(figsize=(7, 3.2), layout="tight")
    ax = fig.subplots()
    for metric in METRIC_COLORS:
        centres, frac = map4_by_crest(x, NVFP4Config(four_over_six=metric, scale="token"))
        ax.plot(centres, frac, "o-", label=metric.upper())
    ax.set_xlabel("block crest factor max|x| / rms (decile centres)")
    ax.set_ylabel("map-to-4 fraction")
    ax.set_title(f"{distribution} data, per-token scale")
    ax.legend()
    return fig
