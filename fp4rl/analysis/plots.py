"""The report's figures (docs/rl.md "The report").

- `plot_grad_norm`: the grad-norm overlay (per arm, median over seeds of the raw pre-clip
  grad norm, per step the largest of its updates, with a min-max band over seeds, log scale,
  one colour per arm) above a population-reward panel on the same step axis;
- `plot_seeds`: small multiples, one panel per arm, every seed's every grad-norm measurement
  drawn (the updates of a step spread over the step), spikes and severe spikes marked;
- `plot_summary`: per run (arm x seed) spike rate and population-reward gap, and per arm the
  final held-out greedy accuracy with its hierarchical bootstrap CI.

Figures are built on `matplotlib.figure.Figure` and rendered by the Agg canvas
(`FigureCanvasAgg`), never through pyplot: no display is needed, and calling these from a
notebook neither changes its backend nor leaks open figures.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogFormatter

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import POPULATION_REWARD, REFERENCE_ARM, RunData, SeedRun, grad_norm_measurements, stack_seeds
from fp4rl.analysis.summary import ArmSummary

# Fixed arm -> colour map so an arm has the same colour in every figure and every report.
# BF16 (the reference) is black; the full recipe green; its leave-one-outs cool colours;
# NVFP4 everywhere and the single interventions warm colours; the baselines pale ones.
ARM_COLORS: Mapping[str, str] = {
    "bf16": "#000000",
    "nvfp4": "#d62728",
    "+dq": "#ff7f0e",
    "+46": "#bcbd22",
    "+hp": "#8c564b",
    "full": "#2ca02c",
    "full-dq": "#1f77b4",
    "full-46": "#9467bd",
    "full-hp": "#17becf",
    "nvfp4-pt": "#e377c2",
    "mxfp8-q": "#7f7f7f",
    "mxfp8": "#aec7e8",
    "mxfp8+dq": "#98df8a",
}
_EXTRA_COLORS = ("#ffbb78", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
# Seeds are told apart by colour inside an arm's panel (tab10 minus the marker colours).
_SEED_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22")
SPIKE_STYLE = dict(marker="o", s=60, facecolors="none", edgecolors="#ff7f0e", linewidths=1.8, zorder=5)
SEVERE_STYLE = dict(marker="X", s=90, color="#d62728", edgecolors="white", linewidths=0.6, zorder=6)


def arm_color(arm: str) -> str:
    """The arm's fixed colour; arms outside docs/rl.md's table get a deterministic extra colour."""
    if arm in ARM_COLORS:
        return ARM_COLORS[arm]
    return _EXTRA_COLORS[sum(map(ord, arm)) % len(_EXTRA_COLORS)]


def _finite_or_nan(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, np.nan)


def _positive_or_nan(x: np.ndarray) -> np.ndarray:
    """For log axes: non-finite and non-positive values are gaps, not clipped points."""
    return np.where(np.isfinite(x) & (x > 0), x, np.nan)


def _nanstats(values_SxT: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps no seed logged -> NaN
        return (np.nanmedian(values_SxT, axis=0), np.nanmin(values_SxT, axis=0), np.nanmax(values_SxT, axis=0))


class _PlainLogFormatter(LogFormatter):
    """LogFormatter's choice of which ticks to label (it thins minor labels when the axis
    spans many decades), printed as plain numbers (0.45, 2, 1e+04) instead of 4.5x10^-1."""

    def __call__(self, x, pos=None):
        return f"{x:.3g}" if super().__call__(x, pos) else ""


def _log_y(ax) -> None:
    """A log y axis, unless nothing drawn on `ax` is positive (e.g. no update ran: every grad norm
    is 0), where a log axis cannot be drawn: then the axis stays linear and says why."""
    drawn = [np.asarray(line.get_ydata(), np.float64) for line in ax.get_lines()]
    if not any(np.any(np.isfinite(y) & (y > 0)) for y in drawn):
        ax.text(0.5, 0.5, "no positive value to draw (no update ran)", transform=ax.transAxes, ha="center", color="0.4")
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _shade_warmup(ax, first_step: int, criteria: StabilityCriteria) -> None:
    """Grey out the steps where spikes are not detected (docs/rl.md: "after step 20")."""
    if criteria.warmup_steps > first_step:
        ax.axvspan(first_step, criteria.warmup_steps, color="0.92", zorder=0)


def step_grad_norms(seeds: Sequence[SeedRun]) -> tuple[np.ndarray, np.ndarray]:
    """(steps [T], values [S, T]): per seed and step, the largest pre-clip grad norm of the
    step's measurements (a non-finite one wins); NaN where a seed has no measurement."""
    seeds = list(seeds)
    steps = np.unique(np.concatenate([r.steps for r in seeds])) if seeds else np.zeros(0, np.int64)
    values = np.full((len(seeds), steps.size), np.nan)
    for i, r in enumerate(seeds):
        values[i] = grad_norm_measurements(r).step_max(steps)
    return steps, values


def spread_over_steps(steps: np.ndarray) -> np.ndarray:
    """x positions of measurements sorted by step: the k-th of a step's n at step + k / n."""
    steps = np.asarray(steps)
    if steps.size == 0:
        return steps.astype(np.float64)
    _, first, counts = np.unique(steps, return_index=True, return_counts=True)
    rank = np.arange(steps.size) - np.repeat(first, counts)
    return steps + rank / np.repeat(counts, counts)


def _error_bar(ci) -> list[list[float]]:
    """matplotlib's [[below], [above]] for an interval around its mean. An interval need not
    contain the mean (a Jeffreys redraw of 0 of n correct lies above 0): the bar then starts at
    the mean and the marker shows where the mean is."""
    return [[max(0.0, ci.mean - ci.low)], [max(0.0, ci.high - ci.mean)]]


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)
    return path


def plot_grad_norm(run: RunData, path: str | Path, criteria: StabilityCriteria = StabilityCriteria()) -> Path:
    """Grad-norm overlay over a reward panel (docs/rl.md "The report"); writes `path`."""
    fig = Figure(figsize=(12, 7.5), layout="constrained")
    ax_g, ax_r = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    any_nonfinite = False
    for arm, seeds in run.arms.items():
        color, width = arm_color(arm), (2.2 if arm in ("full", "bf16") else 1.4)
        steps, g = step_grad_norms(seeds.values())
        med, lo, hi = _nanstats(_positive_or_nan(g))
        label = f"{arm} (n={len(seeds)})"
        ax_g.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax_g.plot(steps, med, color=color, linewidth=width, label=label)
        # A non-finite grad norm cannot be drawn on a log axis: mark each seed's first one
        # on the panel's top edge so a collapse to NaN/Inf is not an invisible gap.
        series = [grad_norm_measurements(sr) for sr in seeds.values()]
        bad = [int(m.steps[np.argmax(~np.isfinite(m.values))]) for m in series if not np.isfinite(m.values).all()]
        any_nonfinite |= bool(bad)
        ax_g.scatter(bad, np.full(len(bad), 0.985), marker="v", s=70, color=color, clip_on=False, zorder=6,
                     transform=ax_g.get_xaxis_transform())
        steps, r = stack_seeds(seeds.values(), POPULATION_REWARD)
        med, lo, hi = _nanstats(_finite_or_nan(r))
        ax_r.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax_r.plot(steps, med, color=color, linewidth=width, label=label)
    _log_y(ax_g)
    ax_g.set_ylabel("pre-clip global grad norm\n(largest update of the step,\nraw, log scale)")
    ax_g.set_title("Gradient norm per arm: median over seeds, band = min-max over seeds")
    ax_r.set_ylabel("population reward mean\n(every sampled response)")
    ax_r.set_xlabel("RL step")
    ax_r.set_title("Population reward per arm (before dynamic sampling): median over seeds, band = min-max over seeds")
    first_step = min(int(r.steps[0]) for r in run.runs())
    for ax in (ax_g, ax_r):
        _shade_warmup(ax, first_step, criteria)
        ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax_g.get_legend_handles_labels()
    if any_nonfinite:
        handles.append(Line2D([], [], linestyle="none", marker="v", color="0.3", markersize=8,
                              label="first non-finite grad norm\nof a seed (top edge)"))
    handles.append(Patch(color="0.92", label=f"warm-up (< step {criteria.warmup_steps}):\nno spike detection"))
    ax_g.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="arm (seeds)", frameon=False)
    fig.suptitle(f"Run: {run.root.name}", fontsize=13)
    return _save(fig, Path(path))


def plot_seeds(
    run: RunData, summaries: Mapping[str, ArmSummary], path: str | Path,
    criteria: StabilityCriteria = StabilityCriteria(),
) -> Path:
    """Small multiples: one panel per arm, every seed's raw grad-norm measurements, spikes marked."""
    arms = list(run.arms)
    ncols = min(3, len(arms))
    nrows = -(-len(arms) // ncols)
    # At least 10 in wide so the shared legend and the title fit when there are 1-2 arms.
    fig = Figure(figsize=(max(4.6 * ncols, 10.0), 3.2 * nrows + 1.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)).ravel()
    all_seeds: list[int] = sorted({s for seeds in run.arms.values() for s in seeds})
    seed_color = {s: _SEED_COLORS[i % len(_SEED_COLORS)] for i, s in enumerate(all_seeds)}
    for ax, arm in zip(axes, arms):
        summary = {s.seed: s for s in summaries[arm].seeds}
        for seed, sr in run.arms[arm].items():
            m = grad_norm_measurements(sr)
            x, g = spread_over_steps(m.steps), _positive_or_nan(m.values)
            ax.plot(x, g, color=seed_color[seed], linewidth=0.8 if m.per_update else 1.0, alpha=0.85)
            ss = summary[seed]
            at = list(zip(m.steps.tolist(), (m.update if m.per_update else np.full(m.steps.size, -1)).tolist()))
            severe_at = set(zip(ss.severe_steps, ss.spikes.severe_updates))
            spike_at = set(zip(ss.spike_steps, ss.spikes.spike_updates))
            severe = np.array([p in severe_at for p in at], bool)
            spike_only = np.array([p in spike_at for p in at], bool) & ~severe
            ax.scatter(x[spike_only], g[spike_only], **SPIKE_STYLE)
            ax.scatter(x[severe], g[severe], **SEVERE_STYLE)
            if ss.collapse.collapsed:
                ax.axvline(ss.collapse.step, color=seed_color[seed], linestyle="--", linewidth=1.2)
        n_spk = sum(len(s.spike_steps) for s in summaries[arm].seeds)
        n_sev = sum(len(s.severe_steps) for s in summaries[arm].seeds)
        n_col = sum(s.collapse.collapsed for s in summaries[arm].seeds)
        ax.set_title(f"{arm}: {n_spk} spikes ({n_sev} severe), {n_col}/{len(summary)} collapsed",
                     color=arm_color(arm), fontsize=10, fontweight="bold")
        _log_y(ax)
        _shade_warmup(ax, min(int(r.steps[0]) for r in run.arms[arm].values()), criteria)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(arms):]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:len(arms)]):
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("pre-clip grad norm\nper update (log)")
        if i + ncols >= len(arms):  # no panel below this one: label its step axis
            ax.set_xlabel("RL step")
            ax.xaxis.set_tick_params(labelbottom=True)
    handles = [Line2D([], [], color=seed_color[s], label=f"seed {s}") for s in all_seeds]
    handles += [
        Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="#ff7f0e",
               markeredgewidth=1.8, markersize=8, label=f"spike (> {criteria.spike_factor:g}x median of previous {criteria.window})"),
        Line2D([], [], linestyle="none", marker="X", color="#d62728", markersize=9,
               label=f"severe spike (> {criteria.severe_factor:g}x)"),
        Line2D([], [], color="0.3", linestyle="--", label="collapse (seed colour)"),
        Patch(color="0.92", label=f"warm-up (< step {criteria.warmup_steps})"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5 if ncols == 3 else 4), frameon=False, fontsize=9)
    fig.suptitle("Per-seed pre-clip grad norm by arm, every measurement (a step's updates spread over the step)",
                 fontsize=13)
    return _save(fig, Path(path))


def _arm_axis(ax, arms: Sequence[str]) -> np.ndarray:
    x = np.arange(len(arms))
    ax.set_xticks(x, arms, rotation=35, ha="right")
    for tick, arm in zip(ax.get_xticklabels(), arms):
        tick.set_color(arm_color(arm))
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
    return x


def plot_summary(
    summaries: Mapping[str, ArmSummary], path: str | Path, criteria: StabilityCriteria = StabilityCriteria()
) -> Path:
    """Per run (arm x seed): spike rate and reward gap; per arm: final accuracy with CI."""
    arms = list(summaries)
    fig = Figure(figsize=(min(18.0, max(14.0, 6.0 + 1.2 * len(arms))), 5.0), layout="constrained")
    ax_s, ax_g, ax_a = fig.subplots(1, 3)
    jitter = np.random.default_rng(0)  # fixed: the figure is reproducible
    for ax in (ax_s, ax_g, ax_a):
        x = _arm_axis(ax, arms)

    for i, arm in enumerate(arms):
        seeds = summaries[arm].seeds
        dx = jitter.uniform(-0.18, 0.18, len(seeds))
        rates = np.array([s.spikes_per_100 for s in seeds])
        severe = np.array([len(s.severe_steps) > 0 for s in seeds])
        ax_s.scatter(x[i] + dx[~severe], rates[~severe], color=arm_color(arm), s=30, zorder=3)
        ax_s.scatter(x[i] + dx[severe], rates[severe], color=arm_color(arm), marker="X", s=70, zorder=3)
        gaps = np.array([s.reward_gap for s in seeds])
        ax_g.scatter(x[i] + dx, gaps, color=arm_color(arm), s=30, zorder=3)
        if np.isfinite(summaries[arm].reward_gap_mean):
            ax_g.hlines(summaries[arm].reward_gap_mean, x[i] - 0.3, x[i] + 0.3, color=arm_color(arm), linewidth=2.5)
        gap_ci = summaries[arm].reward_gap_ci
        if gap_ci is not None:
            ax_g.errorbar(x[i] + 0.32, gap_ci.mean, yerr=_error_bar(gap_ci),
                          fmt="none", ecolor=arm_color(arm), capsize=4, elinewidth=1.5, zorder=4)
        acc = np.array([s.final_accuracy for s in seeds])
        ax_a.scatter(x[i] + dx, acc, color=arm_color(arm), s=18, alpha=0.45, zorder=3)
        ci = summaries[arm].final_accuracy
        if ci is not None:
            ax_a.errorbar(x[i], ci.mean, yerr=_error_bar(ci), fmt="D",
                          color=arm_color(arm), markersize=7, capsize=6, elinewidth=2, zorder=4)
        else:
            ax_a.text(x[i], 0.5, "no eval", ha="center", va="center", rotation=90, fontsize=8, color="0.4",
                      transform=ax_a.get_xaxis_transform())

    reference = summaries.get(REFERENCE_ARM)
    line = ""
    if reference is not None and reference.judged_seeds:
        bf16_rate = float(np.mean([s.spikes_per_100 for s in reference.judged_seeds]))
        ax_s.axhline(bf16_rate + criteria.spike_margin_per_100, color="0.3", linestyle="--", linewidth=1)
        line = f"\ndashed: BF16's rate + the margin {criteria.spike_margin_per_100:g}/100 (judged on the pooled bounds)"
    ax_s.set_ylim(bottom=-0.05 * max(1.0, ax_s.get_ylim()[1]))
    ax_s.set_ylabel("spiking steps per 100 judged steps (one dot per seed)")
    ax_s.set_title(f"Spike rate per seed (X: has a severe spike){line}", fontsize=10)
    ax_g.axhline(0.0, color="0.5", linewidth=0.8)
    rises = [s.reference_reward_rise for s in summaries.values() if np.isfinite(s.reference_reward_rise)]
    margin = f"; dashed: -{criteria.reward_margin_fraction:g} x BF16's rise" if rises and rises[0] > 0 else ""
    if margin:
        ax_g.axhline(-criteria.reward_margin_fraction * rises[0], color="0.3", linestyle="--", linewidth=1)
    ax_g.set_ylabel("mean population-reward gap to BF16's same seed")
    ax_g.set_title(f"Population-reward gap to BF16, paired by seed (dots: seeds, bar: mean,\nwhisker: {criteria.ci_level:.0%} CI "
                   f"over judged seeds){margin}", fontsize=10)
    ax_a.set_ylabel("final held-out accuracy (greedy)")
    kinds = sorted({s.final_accuracy.kind for s in summaries.values() if s.final_accuracy is not None})
    ax_a.set_title(f"Final held-out accuracy: mean and {criteria.ci_level:.0%} bootstrap CI\n"
                   f"(resampling {', '.join(kinds) or 'n/a'}; dots: seeds)", fontsize=10)
    fig.suptitle("Per-run summary (arm x seed)", fontsize=13)
    return _save(fig, Path(path))


__all__ = ["ARM_COLORS", "arm_color", "plot_grad_norm", "plot_seeds", "plot_summary"]
