"""The decision rule and the power of each test of a planned ablation matrix, stated before it runs.

Given the seeds per arm, the steps per seed, the updates per step, BF16's spike rate and the
seed-to-seed spread of the paired reward gap, it says what each test of docs/rl.md "Stability
criteria" can detect:

- spikes: the spiking-step rate of an arm that the one-sided Fisher exact test against BF16
  (spiking / judged steps pooled over seeds, p < alpha) detects with the given power, both arms'
  counts binomial (`statistics.detectable_rate_at`). The units are judged steps (steps >=
  warm-up), not updates: a step spikes when any of its updates does, since the updates of one
  step share their rollouts and their spikes cluster;
- reward: the true mean paired gap (arm seed k minus BF16 seed k) that a two-sided Student t
  interval over seeds excludes 0 with the given power (noncentral t, n - 1 degrees of freedom),
  from a per-seed sd of the seeds' mean gaps. By symmetry it is also the smallest tolerance at
  which an arm with no true gap has its interval above -tolerance with that power.

The defaults are measured on results/matrix_h200 (2 seeds x 100 steps, 2 updates per step, the
`h200` preset, arithmetic task) under the declared criteria; `--from-run DIR` measures them on
another run directory instead.

    python -m fp4rl.analysis.power --seeds 8,4 --steps 300
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.stats import chi, norm
from scipy.stats import t as student_t

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.statistics import detectable_rate_at

# results/matrix_h200 under the declared criteria (`measured_defaults("results/matrix_h200")`,
# pinned by tests/analysis/test_power.py): BF16 spiked in 1 of its 160 judged steps, and the
# per-seed mean paired reward gaps of the ten other arms have a pooled sd of 0.0020 (10 degrees
# of freedom: 2 seeds per arm). Both come from short runs on a task that saturates by step 20;
# a long-horizon task may spike more often and spread its seeds more.
MATRIX_H200_BF16_SPIKING_STEPS = (1, 160)
MATRIX_H200_GAP_SD = 0.0020


@dataclasses.dataclass(frozen=True)
class PlannedMatrix:
    """One planned matrix: `seeds` per arm (and per BF16 arm unless `reference_seeds`),
    `steps` per seed, `updates_per_step` mini-batch updates each, judged from `warmup_steps`."""

    seeds: int
    steps: int
    updates_per_step: int = 2
    warmup_steps: int = StabilityCriteria().warmup_steps
    reference_seeds: int | None = None

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.steps <= self.warmup_steps or self.updates_per_step < 1 or self.warmup_steps < 0:
            raise ValueError(f"need seeds >= 1, steps > warmup_steps >= 0 and updates_per_step >= 1, not {self}")
        if self.reference_seeds is not None and self.reference_seeds < 1:
            raise ValueError(f"{self.reference_seeds=} must be >= 1")

    @property
    def judged_steps(self) -> int:
        """Judged steps of one arm, pooled over its seeds."""
        return self.seeds * (self.steps - self.warmup_steps)

    @property
    def reference_judged_steps(self) -> int:
        return (self.reference_seeds or self.seeds) * (self.steps - self.warmup_steps)


@dataclasses.dataclass(frozen=True)
class Power:
    """What the tests of one planned matrix detect (see the module docstring)."""

    plan: PlannedMatrix
    baseline_step_rate: float
    detectable_step_rate: float
    gap_sd: float
    detectable_gap: float
    t_half_width: float


def step_rate_from_update_rate(update_rate: float, updates_per_step: int) -> float:
    """A step's spike probability when each of its updates spikes independently at `update_rate`:
    1 - (1 - p)^u. An upper bound: the updates of one step spike together more often than that."""
    if not 0.0 <= update_rate < 1.0 or updates_per_step < 1:
        raise ValueError(f"need 0 <= {update_rate=} < 1 and {updates_per_step=} >= 1")
    return 1.0 - (1.0 - update_rate) ** updates_per_step


def paired_t_power(gap: float, sd: float, seeds: int, ci: float = 0.95) -> float:
    """P(the two-sided `ci` t interval over `seeds` per-seed mean gaps excludes 0) when their true
    mean is `gap` and their sd `sd` (the noncentral t law with seeds - 1 degrees of freedom)."""
    if seeds < 2 or sd <= 0:
        raise ValueError(f"need seeds >= 2 and sd > 0, not {seeds=} {sd=}")
    df, nc = seeds - 1, abs(gap) * math.sqrt(seeds) / sd
    crit = student_t.ppf((1.0 + ci) / 2.0, df)
    # T' = (Z + nc) / (S / sqrt(df)) with S ~ chi(df): integrate the normal tails over S (scipy's
    # noncentral t returns NaN for 1 degree of freedom at the large nc that 2 seeds need).
    def rejects(s: float) -> float:
        return float(norm.cdf(nc - crit * s / math.sqrt(df)) + norm.cdf(-nc - crit * s / math.sqrt(df))) * chi.pdf(s, df)

    return float(quad(rejects, 0.0, np.inf, limit=200)[0])


def detectable_paired_gap(sd: float, seeds: int, ci: float = 0.95, power: float = 0.8) -> float:
    """The smallest |true mean paired gap| that the two-sided `ci` t interval over `seeds` seeds
    excludes 0 with `power`; inf with one seed (no interval)."""
    if seeds < 2:
        return math.inf
    if not 0.0 < power < 1.0:
        raise ValueError(f"need 0 < {power=} < 1")
    high = sd
    while paired_t_power(high, sd, seeds, ci) < power:
        high *= 2.0
    return float(brentq(lambda g: paired_t_power(g, sd, seeds, ci) - power, 0.0, high, xtol=1e-10 * sd))


def t_half_width(sd: float, seeds: int, ci: float = 0.95) -> float:
    """The half-width of the `ci` t interval over `seeds` values of sd `sd` (inf with one seed)."""
    return math.inf if seeds < 2 else float(student_t.ppf((1.0 + ci) / 2.0, seeds - 1) * sd / math.sqrt(seeds))


def plan_power(plan: PlannedMatrix, baseline_step_rate: float, gap_sd: float,
               criteria: StabilityCriteria = StabilityCriteria()) -> Power:
    """Both tests' power for `plan`, at the declared alpha, power and interval level of `criteria`."""
    rate = detectable_rate_at(plan.judged_steps, plan.reference_judged_steps, baseline_step_rate,
                              criteria.reference_spike_alpha, criteria.reference_spike_power)
    return Power(plan, baseline_step_rate, rate, gap_sd,
                 detectable_paired_gap(gap_sd, plan.seeds, criteria.ci_level, criteria.reference_spike_power),
                 t_half_width(gap_sd, plan.seeds, criteria.ci_level))


def measured_defaults(run_dir, criteria: StabilityCriteria = StabilityCriteria()) -> tuple[tuple[int, int], float]:
    """((BF16's spiking steps, its judged steps), pooled sd of the other arms' per-seed mean paired
    reward gaps) of a run directory under `criteria`: the two inputs of `plan_power`."""
    from fp4rl.analysis.runs import REFERENCE_ARM, load_run
    from fp4rl.analysis.summary import summarize_run
    from fp4rl.analysis.verdicts import spike_counts

    summaries = summarize_run(load_run(run_dir), criteria)
    if REFERENCE_ARM not in summaries:
        raise ValueError(f"{run_dir} has no {REFERENCE_ARM} arm")
    k, n, _ = spike_counts(summaries[REFERENCE_ARM])
    # Pooled within-arm variance: each arm's seeds vary around that arm's own mean gap.
    variances, dofs = [], []
    for arm, s in summaries.items():
        gaps = np.array([x.reward_gap for x in s.judged_seeds if np.isfinite(x.reward_gap)])
        if arm != REFERENCE_ARM and gaps.size >= 2:
            variances.append(gaps.var(ddof=1) * (gaps.size - 1))
            dofs.append(gaps.size - 1)
    sd = math.sqrt(sum(variances) / sum(dofs)) if dofs else math.nan
    return (k, n), sd


def markdown(powers: Sequence[Power], criteria: StabilityCriteria = StabilityCriteria(), source: str = "") -> str:
    """The decision rule and each planned matrix's power, as a markdown table."""
    c = criteria
    lines = [
        "Decision rule, stated before the runs (docs/rl.md \"Stability criteria\"):",
        "",
        f"- spike vs BF16: an arm FAILs when it spikes more often than BF16, one-sided Fisher exact test on spiking / "
        f"judged steps (steps >= {c.warmup_steps}; a step spikes when any of its updates is > {c.spike_factor:g}x the "
        f"median of the previous {c.window} measurements) pooled over seeds, p < {c.reference_spike_alpha:g};",
        f"- reward: PASS when the {c.ci_level:.0%} interval of the mean paired gap to BF16 (seed k minus BF16 seed k) "
        f"lies above -{c.reward_gap_tolerance:g}, FAIL when below; the t interval over seeds is reported beside the "
        "bootstrap, and verdicts on fewer than "
        f"{c.few_seeds} seeds are marked (few seeds).",
        "",
        f"Power at {c.reference_spike_power:.0%}{f' ({source})' if source else ''}:",
        "",
        "| seeds per arm | steps | updates per step | judged steps per arm (BF16) | BF16 spiking-step rate (assumed) | "
        f"spike rate detected (Fisher, p < {c.reference_spike_alpha:g}) | x BF16's | per-seed sd of the mean paired "
        f"gap (assumed) | paired reward gap detected (t, {c.ci_level:.0%}) | t interval half-width |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in powers:
        q = p.plan
        ratio = p.detectable_step_rate / p.baseline_step_rate if p.baseline_step_rate > 0 else math.inf
        lines.append(
            f"| {q.seeds} | {q.steps} | {q.updates_per_step} | {q.judged_steps} ({q.reference_judged_steps}) | "
            f"{p.baseline_step_rate:.2%} | {p.detectable_step_rate:.2%} | {ratio:.1f}x | {p.gap_sd:.4f} | "
            f"{p.detectable_gap:.4f} | {p.t_half_width:.4f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the decision rule and the power of each planned matrix as a markdown table."""
    bf16_k, bf16_n = MATRIX_H200_BF16_SPIKING_STEPS
    parser = argparse.ArgumentParser(
        prog="python -m fp4rl.analysis.power", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="8,4", help="seeds per arm; a comma list gives one row each (default 8,4)")
    parser.add_argument("--steps", type=int, default=300, help="RL steps per seed (default 300)")
    parser.add_argument("--updates-per-step", type=int, default=2, help="mini-batch updates per step (default 2)")
    parser.add_argument("--warmup-steps", type=int, default=StabilityCriteria().warmup_steps,
                        help="steps before the spike criterion judges (default: the declared one)")
    parser.add_argument("--reference-seeds", type=int, default=None, help="BF16 seeds (default: as --seeds)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--baseline-step-rate", type=float, default=None,
                      help=f"BF16's spiking-step rate (default {bf16_k}/{bf16_n}, results/matrix_h200)")
    rate.add_argument("--baseline-update-rate", type=float, default=None,
                      help="BF16's per-update spike rate, converted to steps as if updates were independent (an upper bound)")
    parser.add_argument("--gap-sd", type=float, default=None,
                        help=f"per-seed sd of the mean paired reward gap (default {MATRIX_H200_GAP_SD}, results/matrix_h200)")
    parser.add_argument("--from-run", default=None, help="measure BF16's rate and the gap sd on this run directory")
    args = parser.parse_args(argv)

    source = f"BF16 rate and gap sd measured on results/matrix_h200: {bf16_k}/{bf16_n} steps, sd {MATRIX_H200_GAP_SD}"
    baseline, gap_sd = bf16_k / bf16_n, MATRIX_H200_GAP_SD
    if args.from_run:
        (k, n), measured_sd = measured_defaults(args.from_run)
        if n == 0:
            parser.error(f"{args.from_run}: BF16 has no judged step (runs shorter than the criteria need)")
        baseline, source = k / n, f"BF16 rate measured on {args.from_run}: {k}/{n} steps"
        if math.isfinite(measured_sd):
            gap_sd, source = measured_sd, f"{source}, gap sd {measured_sd:.4f}"
        elif args.gap_sd is None:  # a BF16-only run has no paired gap: say whose sd the table assumes
            source = f"{source}; no other arm with 2+ seeds there, so the gap sd is results/matrix_h200's {gap_sd}"
    if args.baseline_step_rate is not None:
        baseline, source = args.baseline_step_rate, "BF16 rate given"
    elif args.baseline_update_rate is not None:
        baseline = step_rate_from_update_rate(args.baseline_update_rate, args.updates_per_step)
        source = f"BF16 rate from {args.baseline_update_rate:g} per update, as if independent"
    if args.gap_sd is not None:
        gap_sd, source = args.gap_sd, f"{source}; gap sd given"
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        plans = [PlannedMatrix(s, args.steps, args.updates_per_step, args.warmup_steps, args.reference_seeds)
                 for s in seeds]
    except ValueError as e:
        parser.error(str(e))
    print(markdown([plan_power(p, baseline, gap_sd) for p in plans], source=source))


if __name__ == "__main__":
    main()
