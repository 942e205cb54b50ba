"""Figures of the fixed-parameter gradient measurements, drawn from the finished results
(`fp4rl.analysis.gradient_report.analyze`'s output as written to gradients.json)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fp4rl.analysis import batch_scaling
from fp4rl.analysis.gradient_rule import COHERENT_BIAS_MAX, DECISION_GROUP, NOISE_FRACTION_MAX, TAIL_FACTOR
from fp4rl.analysis.plots import arm_color


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)
    return path


def _values(cis, key) -> np.ndarray:
    return np.array([np.nan if c[key] is None else c[key] for c in cis], np.float64)


def _errorbars(ax, x, cis, color) -> bool:
    """Points with CI bars on a log axis (an infinite upper end drawn to the panel's top);
    returns whether any point was drawable (positive)."""
    v, lo, hi = _values(cis, "value"), _values(cis, "lo"), _values(cis, "hi")
    v = np.where(v > 0, v, np.nan)
    lo = np.where(lo > 0, lo, v)
    hi = np.where(np.isfinite(hi), hi, np.nanmax(np.r_[v, lo, 1.0]) * 10)
    ax.errorbar(x, v, yerr=[np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)], fmt="o", color=color, capsize=3)
    return bool(np.any(np.isfinite(v)))


def plot_errors(results: Mapping, path: Path) -> Path:
    """Per group: each recipe's noise fraction and coherent bias (vs bf16) with CIs and thresholds."""
    groups, recipes = results["groups"], [n for n in results["recipes"] if n != "bf16"]
    fig = Figure(figsize=(3.2 * len(groups), 7), layout="constrained")
    axes = fig.subplots(2, len(groups), sharey="row", squeeze=False)
    for j, grp in enumerate(groups):
        for row, (key, threshold) in enumerate((("noise_fraction", NOISE_FRACTION_MAX), ("coherent_bias", COHERENT_BIAS_MAX))):
            ax = axes[row, j]
            drawn = [_errorbars(ax, [i], [results["recipes"][name]["vs_bf16"][grp][key]], arm_color(name))
                     for i, name in enumerate(recipes)]
            ax.axhline(threshold, color="#d62728", linestyle="--", linewidth=1)
            if any(drawn):
                ax.set_yscale("log")
            ax.set_xticks(range(len(recipes)), recipes, rotation=60, fontsize=8)
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(grp)
            if j == 0:
                ax.set_ylabel("error / RL noise floor" if key == "noise_fraction" else "coherent bias / bf16 signal")
    fig.suptitle(f"Gradient error vs BF16 with {results['ci']}; dashed: decision thresholds", fontsize=10)
    return _save(fig, path)


def plot_grad_norms(results: Mapping, path: Path) -> Path:
    """Per recipe the pre-clip grad norms over the batches, its median and the tail threshold."""
    recipes = list(results["recipes"])
    fig = Figure(figsize=(max(6, 0.9 * len(recipes) + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for i, name in enumerate(recipes):
        norms = np.asarray(results["recipes"][name]["grad_norm"]["values"])
        med = np.median(norms)
        tail = norms > TAIL_FACTOR * med
        x = i + rng.uniform(-0.25, 0.25, norms.size)
        ax.scatter(x[~tail], norms[~tail], s=12, color=arm_color(name), alpha=0.7)
        ax.scatter(x[tail], norms[tail], s=40, marker="X", color="#d62728", zorder=5)
        ax.hlines(med, i - 0.35, i + 0.35, color="0.2", linewidth=2)
        ax.hlines(TAIL_FACTOR * med, i - 0.35, i + 0.35, color="#d62728", linestyle=":", linewidth=1.2)
    ax.set_yscale("log")
    ax.set_xticks(range(len(recipes)), recipes, rotation=45)
    ax.set_ylabel("pre-clip global grad norm (log)")
    ax.set_title(f"Grad norm per batch at the warm-up parameters: bar = median, dotted = {TAIL_FACTOR:g}x median, "
                 "X = tail", fontsize=10)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_policy_change(results: Mapping, path: Path) -> Path:
    """KL(old || new) of one AdamW update against the learning rate, per recipe, with CIs."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    lrs, positive = results["lrs"], False
    for name, e in results["recipes"].items():
        cis = [e["policy_change_kl"][f"{lr:g}"] for lr in lrs]
        ax.plot(lrs, _values(cis, "value"), color=arm_color(name), marker="o", label=name)
        ax.fill_between(lrs, _values(cis, "lo"), _values(cis, "hi"), color=arm_color(name), alpha=0.12, linewidth=0)
        positive |= bool(np.any(_values(cis, "value") > 0))
    ax.set_xscale("log")
    if positive:
        ax.set_yscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("KL(old || new), k3 per token")
    ax.set_title("Policy change of one AdamW update from the warm-up", fontsize=10)
    ax.legend(fontsize=8, ncols=2, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_batch_scaling(results: Mapping, path: Path) -> Path:
    """Group 'all', per recipe against tokens per update (k stored batches): the noise fraction with
    the rule's threshold, and the FP4-All-the-Way ratio ||g|| / ||error|| with its sqrt(3) line."""
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax_nf, ax_r = fig.subplots(1, 2)
    positive = {ax_nf: False, ax_r: False}
    for name, e in results["recipes"].items():
        if name == "bf16":  # the reference: no error
            continue
        curve = e["batch_scaling"][DECISION_GROUP]["curve"]
        tokens = np.asarray(curve["tokens"], np.float64)
        for ax, key in ((ax_nf, "noise_fraction"), (ax_r, "fp4_ratio")):
            y = np.array([np.nan if v is None else v for v in curve[key]], np.float64)
            y = np.where((y > 0) & np.isfinite(y) & (tokens > 0), y, np.nan)
            ax.plot(tokens, y, color=arm_color(name), label=name)
            positive[ax] |= bool(np.any(np.isfinite(y)))
    ax_nf.axhline(NOISE_FRACTION_MAX, color="#d62728", linestyle="--", linewidth=1)
    ax_r.axhline(batch_scaling.SQRT3, color="#d62728", linestyle="--", linewidth=1)
    for ax, label in ((ax_nf, "error / RL noise floor (squared norms)"), (ax_r, "||g_bf16|| / ||g_r - g_bf16||")):
        if positive[ax]:  # else nothing to scale (e.g. no batch with a loss token)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel("loss tokens per update (k stored batches)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_nf.set_title(f"Noise fraction; dashed: the rule's {NOISE_FRACTION_MAX:g}", fontsize=10)
    ax_r.set_title("FP4 All the Way yardstick; dashed: sqrt(3)", fontsize=10)
    ax_nf.legend(fontsize=8, ncols=2, frameon=False)
    return _save(fig, path)
