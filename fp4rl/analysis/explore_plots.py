"""The ablation explorer's figures (notebooks/ablations.ipynb), beyond the report's three
(`fp4rl.analysis.plots`):

- `learning_figure`: held-out accuracy (sampled and greedy) over the steps, the long-horizon
  matrix's measure of whether and how fast each arm learns;
- `grad_norm_groups_figure`: per-group pre-clip grad norms, one panel per group;
- `mismatch_figure`: trainer vs sampler k3 KL and routing-flip rate;
- `reward_vs_grad_norm_figure`: population reward vs grad norm, spike steps ringed;
- `spike_sensitivity_figure`: spike rate vs spike factor per arm.

Per arm a panel draws the median over seeds and the min-max band, in the report's arm colours.
Built on `matplotlib.figure.Figure` (no pyplot); `save` renders one to PNG on the Agg canvas,
`show` also displays it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from fp4rl.analysis import explore, learning, plots
from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.plots import _PlainLogFormatter
from fp4rl.analysis.runs import GRAD_GROUPS, RunData

# The spike factors the sensitivity curve is drawn at.
CURVE_FACTORS = tuple(float(f) for f in np.geomspace(1.5, 20.0, 24))


def save(fig: Figure, path: str | Path) -> Path:
    """Render `fig` on the Agg canvas into `path` (a PNG); return the path."""
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    return Path(path)


def show(fig: Figure, path: str | Path) -> None:
    """`save` `fig` into `path` and display the PNG (`explore.show_png`)."""
    explore.show_png(save(fig, path))


def log_axis(ax, which: str = "y") -> None:
    """A log axis labelled with plain numbers (0.45, 2, 1e+04)."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    axis.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def overlay(ax, run: RunData, key: str, criteria: StabilityCriteria, log: bool = True,
            ylabel: str | None = None) -> bool:
    """Every arm's median over seeds (line) and min-max band of metric `key`, the warm-up
    shaded; a "not logged" note instead when no arm logged it. True when something was drawn."""
    drawn = False
    for arm, seeds in run.arms.items():
        stats = explore.arm_stats(seeds.values(), key, log)
        if stats is None:
            continue
        steps, med, lo, hi = stats
        color = plots.arm_color(arm)
        ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.plot(steps, med, color=color, linewidth=1.3, label=f"{arm} (n={len(seeds)})")
        drawn = True
    if drawn:
        if log:
            log_axis(ax)
        first, last = min(int(r.steps[0]) for r in run.runs()), max(int(r.steps[-1]) for r in run.runs())
        if criteria.warmup_steps > first:  # the warm-up: no spike detection (clipped to the run)
            ax.axvspan(first, min(criteria.warmup_steps, last), color="0.92", zorder=0)
    else:
        ax.text(0.5, 0.5, f"{key}: not logged", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_title(key, fontsize=10)
    ax.set_ylabel(ylabel or key)
    ax.grid(True, which="major", alpha=0.3)
    return drawn


def legend_below(fig: Figure, axes: Sequence) -> None:
    """One legend under the figure for every labelled artist of `axes` (deduplicated by label)."""
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(len(handles), 6), frameon=False, fontsize=9)


def _eval_curves(seeds) -> list:
    """`learning.seed_curve` of every seed that evaluated (x: updates done, 0 = before RL)."""
    curves = []
    for run in seeds:
        try:
            curves.append(learning.seed_curve(run))
        except ValueError:  # no initial evaluation: nothing to draw for this seed
            continue
    return curves


def learning_figure(run: RunData) -> Figure:
    """Held-out accuracy (sampled, greedy) at each evaluation, per arm: the median over seeds with
    a marker per evaluation and the min-max band; a note where no arm evaluated."""
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    drawn = False
    for arm, seeds in run.arms.items():
        curves = _eval_curves(seeds.values())
        if not curves:
            continue
        x = np.unique(np.concatenate([c.steps for c in curves]))
        for ax, field in zip(axes, ("sampled", "greedy")):
            y = np.full((len(curves), x.size), np.nan)
            for row, c in zip(y, curves):
                row[np.searchsorted(x, c.steps)] = getattr(c, field)
            color = plots.arm_color(arm)
            ax.fill_between(x, np.nanmin(y, 0), np.nanmax(y, 0), color=color, alpha=0.15, linewidth=0)
            ax.plot(x, np.nanmedian(y, 0), "o-", markersize=3, color=color, linewidth=1.3,
                    label=f"{arm} (n={len(curves)})")
        drawn = True
    for ax, label in zip(axes, ("sampled (T=1)", "greedy")):
        if not drawn:
            ax.text(0.5, 0.5, "no held-out evaluation logged", ha="center", va="center", transform=ax.transAxes,
                    color="0.4")
        ax.set_title(f"held-out accuracy, {label}", fontsize=10)
        ax.set_xlabel("RL updates done (0: before RL)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("accuracy (fraction of held-out problems)")
    legend_below(fig, axes)
    fig.suptitle("Held-out accuracy: median over seeds, band = min-max over seeds", fontsize=13)
    return fig


def grad_norm_groups_figure(run: RunData, criteria: StabilityCriteria) -> Figure:
    fig = Figure(figsize=(15, 8), layout="constrained")
    axes = fig.subplots(2, 3, sharex=True).ravel()
    for ax, group in zip(axes, GRAD_GROUPS):
        overlay(ax, run, f"grad_norm/{group}", criteria, log=True, ylabel="pre-clip grad norm (log)")
    for ax in axes[3:]:
        ax.set_xlabel("RL step")
    legend_below(fig, axes)
    fig.suptitle("Per-group pre-clip grad norm: median over seeds, band = min-max over seeds", fontsize=13)
    return fig


def mismatch_figure(run: RunData, criteria: StabilityCriteria) -> Figure:
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    ax_kl, ax_flip = fig.subplots(1, 2, sharex=True)
    overlay(ax_kl, run, "mismatch/kl_k3", criteria, log=True, ylabel="k3 KL per token (log)")
    overlay(ax_flip, run, "mismatch/routing_flip", criteria, log=False, ylabel="routing-flip rate")
    for ax in (ax_kl, ax_flip):
        ax.set_xlabel("RL step")
    legend_below(fig, (ax_kl, ax_flip))
    fig.suptitle("Trainer vs sampler mismatch: median over seeds, band = min-max over seeds", fontsize=13)
    return fig


def reward_vs_grad_norm_figure(points: Mapping[str, explore.RewardGrad]) -> Figure:
    """One dot per point of `explore.reward_grad_points`, spike steps ringed."""
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax = fig.subplots()
    for arm, p in points.items():
        ax.scatter(p.grad, p.reward, s=10, alpha=0.45, color=plots.arm_color(arm), label=f"{arm} (n={p.n_seeds})")
        ax.scatter(p.grad[p.spike], p.reward[p.spike], **plots.SPIKE_STYLE)
    if points:
        log_axis(ax, "x")
    ax.set_xlabel("pre-clip global grad norm, largest update of the step (log)")
    ax.set_ylabel("population reward mean (every sampled response)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="arm (seeds); rings: spike steps")
    ax.set_title("Population reward vs grad norm, every logged step of every seed (finite values only)")
    return fig


def spike_sensitivity_figure(run: RunData, criteria: StabilityCriteria,
                             factors: Sequence[float] = CURVE_FACTORS) -> Figure:
    """Per arm, `explore.spike_rate_curve` over `factors`, with the declared thresholds."""
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.subplots()
    n = len(run.arms)
    for i, (arm, seeds) in enumerate(run.arms.items()):
        curve = explore.spike_rate_curve(seeds.values(), criteria, factors)
        width = 1.0 + 3.0 * (n - 1 - i) / max(n - 1, 1)  # overlapping curves stay visible
        ax.plot(factors, curve, "o-", markersize=3, linewidth=width, color=plots.arm_color(arm),
                label=f"{arm} (n={len(seeds)})")
    if not any(r.steps[-1] >= criteria.warmup_steps for r in run.runs()):
        ax.text(0.5, 0.5, f"no step at or past the warm-up (step {criteria.warmup_steps}): no spike is ever detected",
                ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.axvline(criteria.spike_factor, color="0.3", linestyle=":", label=f"declared spike {criteria.spike_factor:g}x")
    ax.axvline(criteria.severe_factor, color="#d62728", linestyle=":",
               label=f"declared severe {criteria.severe_factor:g}x")
    log_axis(ax, "x")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("spike factor (x the median of the previous window of measurements)")
    ax.set_ylabel("spikes per 100 steps (mean over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"Spike rate vs spike factor (window {criteria.window}, after step {criteria.warmup_steps})")
    return fig
