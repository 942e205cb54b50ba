"""The dose-response of the forward/backward mismatch (docs/rl.md "The ablation matrix"): per
amplification a and backward, the arm's spikes and reward against BF16, and the smallest a at which
each backward first fails.

The arms `nvfp4@A` (BF16 backward on the raw operands: the paper's mismatch, amplified) and `+dq@A`
(the backward of the amplified forward: consistent) run the forward on w + a (DQ(Q(w)) - w) and
x + a (DQ(Q(x)) - x); a = 1 is `nvfp4` and `+dq` themselves. Amplifying the error at a fixed RL noise
emulates the larger error-to-noise ratios that bigger models and batches bring: an emulation, not a
measurement at scale. The paper's mechanism predicts that from some a on the BF16-backward arm fails
(spikes or lags in reward) while the dequantized one stays stable longer.

    python -m experiments.dose_response RUN_DIR   # writes RUN_DIR/dose_response.md and .png
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import REFERENCE_ARM, load_run
from fp4rl.analysis.statistics import RateDifference, rate_difference, student_t_interval
from fp4rl.analysis.summary import ArmSummary, summarize_run
from fp4rl.analysis.verdicts import ArmVerdict, run_verdicts, seed_spike_counts
from fp4rl.recipe import DOSE_BASES, PrecisionRecipe

BACKWARD_OF = {"nvfp4": "bf16", "+dq": "dequantized"}  # the two dose bases and their backwards


def dose_of(arm: str) -> tuple[str, float] | None:
    """(base, amplification) of a dose-response arm (`nvfp4` and `+dq` are a = 1), else None; the
    name is read by the recipe's own parser (`PrecisionRecipe.from_name`)."""
    base = arm.partition("@")[0]
    if base not in DOSE_BASES:
        return None
    try:
        return base, PrecisionRecipe.from_name(arm).routed_experts.amplification
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class DosePoint:
    """One arm of the dose-response: its dose, its spike-rate difference to BF16 (None without 2
    judged seeds on each side), its mean paired reward gap with the t interval over seeds (None
    without 2 seeds), and its verdict (True PASS, False FAIL, None UNDECIDED)."""

    arm: str
    base: str
    amplification: float
    seeds: int
    spikes: RateDifference | None
    gap: float
    gap_interval: tuple[float, float] | None
    passed: bool | None
    failed: tuple[str, ...]


def dose_points(summaries: Mapping[str, ArmSummary], verdicts: Mapping[str, ArmVerdict],
                c: StabilityCriteria = StabilityCriteria()) -> list[DosePoint]:
    """Every dose-response arm of a run, sorted by base, then amplification."""
    reference = summaries.get(REFERENCE_ARM)
    ref_counts = seed_spike_counts(reference) if reference is not None else []
    points = []
    for arm, s in summaries.items():
        dose = dose_of(arm)
        if dose is None:
            continue
        counts = seed_spike_counts(s)
        spikes = None
        if len(counts) >= 2 and len(ref_counts) >= 2:
            spikes = rate_difference([x[:2] for x in counts], [x[:2] for x in ref_counts], c.spike_level)
        gaps = [x.reward_gap for x in s.judged_seeds if np.isfinite(x.reward_gap)]
        v = verdicts[arm]
        points.append(DosePoint(arm, dose[0], dose[1], len(s.judged_seeds), spikes,
                                float(np.mean(gaps)) if gaps else math.nan,
                                student_t_interval(gaps, c.ci_level) if len(gaps) >= 2 else None, v.passed, v.failed()))
    return sorted(points, key=lambda p: (DOSE_BASES.index(p.base), p.amplification))


def first_failure(points: Sequence[DosePoint], base: str) -> float | None:
    """The smallest amplification at which `base`'s arm FAILs a criterion (None: none fails)."""
    failing = [p.amplification for p in points if p.base == base and p.passed is False]
    return min(failing) if failing else None


def markdown(points: Sequence[DosePoint], c: StabilityCriteria = StabilityCriteria()) -> str:
    """The table and each backward's first failing dose."""
    mark = {True: "PASS", False: "FAIL", None: "UNDECIDED"}
    lines = ["| arm | backward | a | judged seeds | spiking-step rate - BF16's, per 100 steps (one-sided "
             f"{c.spike_level:.0%} bounds) | paired reward gap (t {c.ci_level:.0%}) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for p in points:
        spikes = "n/a" if p.spikes is None else (f"{100 * p.spikes.difference:+.2f} [{100 * p.spikes.low:+.2f}, "
                                                 f"{100 * p.spikes.high:+.2f}]")
        gap = "n/a" if not np.isfinite(p.gap) else f"{p.gap:+.4f}" + (
            "" if p.gap_interval is None else f" [{p.gap_interval[0]:+.4f}, {p.gap_interval[1]:+.4f}]")
        verdict = mark[p.passed] + (f" ({', '.join(p.failed)})" if p.failed else "")
        lines.append(f"| `{p.arm}` | {BACKWARD_OF[p.base]} | {p.amplification:g} | {p.seeds} | {spikes} | {gap} | "
                     f"{verdict} |")
    lines.append("")
    for base in DOSE_BASES:
        a = first_failure(points, base)
        tried = sorted({p.amplification for p in points if p.base == base})
        where = f"a = {a:g}" if a is not None else f"none of a = {', '.join(f'{x:g}' for x in tried) or '(none run)'}"
        lines.append(f"- {BACKWARD_OF[base]} backward (`{base}@A`): first fails at {where}.")
    return "\n".join(lines)


def plot(points: Sequence[DosePoint], path: str | Path, c: StabilityCriteria = StabilityCriteria(),
         reward_margin: float | None = None) -> Path:
    """Spike-rate difference and paired reward gap against a, one line per backward, with their
    intervals; the spike margin and the reward margin dashed."""
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax_s, ax_g = fig.subplots(1, 2)
    for base, color, shift in zip(DOSE_BASES, ("#d62728", "#1f77b4"), (0.97, 1.03)):
        mine = [p for p in points if p.base == base]
        a = np.array([p.amplification * shift for p in mine])
        with_spikes = [(x, p.spikes) for x, p in zip(a, mine) if p.spikes is not None]
        if with_spikes:
            xs, ds = zip(*with_spikes)
            mid = np.array([100 * d.difference for d in ds])
            err = [mid - [100 * d.low for d in ds], [100 * d.high for d in ds] - mid]
            ax_s.errorbar(xs, mid, yerr=err, fmt="o-", color=color, capsize=4, label=f"{BACKWARD_OF[base]} backward")
        with_gap = [(x, p) for x, p in zip(a, mine) if p.gap_interval is not None]
        if with_gap:
            xs, ps = zip(*with_gap)
            mid = np.array([p.gap for p in ps])
            err = [mid - [p.gap_interval[0] for p in ps], [p.gap_interval[1] for p in ps] - mid]
            ax_g.errorbar(xs, mid, yerr=err, fmt="o-", color=color, capsize=4, label=f"{BACKWARD_OF[base]} backward")
        for x, p in zip(a, mine):
            if p.passed is False:
                ax_s.annotate("FAIL", (x, 0), textcoords="offset points", xytext=(0, -14), ha="center",
                              color=color, fontsize=8)
    ax_s.axhline(c.spike_margin_per_100, color="0.3", linestyle="--", linewidth=1)
    ax_s.axhline(0.0, color="0.6", linewidth=0.8)
    ax_s.set_title(f"spiking-step rate minus BF16's (per 100 steps);\ndashed: the margin {c.spike_margin_per_100:g}",
                   fontsize=10)
    ax_g.axhline(0.0, color="0.6", linewidth=0.8)
    if reward_margin is not None and np.isfinite(reward_margin):
        ax_g.axhline(-reward_margin, color="0.3", linestyle="--", linewidth=1)
    ax_g.set_title("population-reward gap to BF16, paired by seed;\ndashed: -margin", fontsize=10)
    for ax in (ax_s, ax_g):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("amplification a of the quantization error (1: the recipe itself)")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle("Dose-response of the forward/backward mismatch (an emulation of larger error / noise)")
    FigureCanvasAgg(fig)
    fig.savefig(Path(path), dpi=120)
    return Path(path)


def write(run_dir: str | Path, c: StabilityCriteria = StabilityCriteria()) -> tuple[Path, Path]:
    """RUN_DIR/dose_response.md and dose_response.png from the run's dose arms and its BF16."""
    run_dir = Path(run_dir)
    summaries = summarize_run(load_run(run_dir), c)
    points = dose_points(summaries, run_verdicts(summaries, c), c)
    if not points:
        raise ValueError(f"{run_dir} holds no dose-response arm ({', '.join(DOSE_BASES)} or BASE@A)")
    rises = [s.reference_reward_rise for s in summaries.values() if np.isfinite(s.reference_reward_rise)]
    margin = c.reward_margin_fraction * rises[0] if rises else None
    figure = plot(points, run_dir / "dose_response.png", c, margin)
    text = (f"# Dose-response of the mismatch: `{run_dir}`\n\n{__doc__.split(chr(10) * 2)[1]}\n\n"
            f"{markdown(points, c)}\n\n![dose-response](dose_response.png)\n")
    table = run_dir / "dose_response.md"
    table.write_text(text)
    return table, figure
