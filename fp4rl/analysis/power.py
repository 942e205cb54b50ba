"""The claim rule's operating characteristics, by simulation, stated before a matrix runs.

docs/rl.md "Stability criteria": the claim is REPRODUCED when `full` passes the spike, collapse
and reward criteria and each leave-one-out arm (full-dq, full-46, full-hp) fails one; NOT
REPRODUCED on a decided failure; UNDECIDED otherwise. Whether that rule can decide anything at a
given number of seeds is a property of the rule and of the noise, so this module simulates the
whole rule: per replicate it draws every arm's per-seed spike counts, severe spikes and paired
reward gaps, and BF16's reward rise, from a noise model measured on the committed chain matrix,
then judges them with the same functions the report uses (`verdicts.spike_decision`,
`verdicts.reward_decision`, `verdicts.claim_reproduced`). The result is P(REPRODUCED),
P(NOT REPRODUCED) and P(UNDECIDED) per scenario and seed count.

Noise model (`NoiseModel`): a seed's spike rate is BF16's rate x the arm's ratio x a Gamma(1/phi,
phi) seed effect (mean 1; phi > 0 makes spikes cluster inside seeds, as measured); its spiking
steps are binomial over its judged steps, each one severe with a fixed probability; its mean
paired reward gap is normal around the arm's gap. Collapses are not drawn: the committed runs have
none, so the collapse criterion passes in every simulated arm (it is judged as the report judges
it, on the number of judged seeds).

    python -m experiments.rule_power --seeds 2,4,8 --steps 300 --replicates 2000
    python -m experiments.rule_power --out results/rule_power   # also writes README.md's table there

The Student t power of the paired reward gap (`paired_t_power`, `detectable_paired_gap`) is
analytic and printed beside the simulation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.stats import chi, norm
from scipy.stats import t as student_t

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import FULL_ARM, LEAVE_ONE_OUT_ARMS, REFERENCE_ARM, load_run
from fp4rl.analysis.summary import reward_rise, summarize_run
from fp4rl.analysis.verdicts import (
    ArmVerdict, CriterionResult, claim_reproduced, reward_decision, seed_spike_counts, spike_decision,
)

# results/long_h200/chain/matrix under the declared criteria (`measured_defaults`, pinned by
# tests/analysis/test_power.py): BF16 spiked in 3 of its 2240 judged steps (8 seeds x 280), one
# of them severe, and 1 of the 5 spiking steps of bf16, full and full-dq together was severe; the
# per-seed mean paired reward gaps of full (4 seeds) and full-dq (2) have a pooled sd of 0.0025;
# BF16's population reward rises by 0.307 over 300 steps (sd 0.037 over its seeds). The seed
# effect's dispersion is BF16's counts' method-of-moments estimate (var = m + phi m^2: 1.3),
# rounded to 1: 8 seeds with 3 spikes barely estimate it (`--dispersion` varies it).
CHAIN_BF16_SPIKING_STEPS = (3, 2240)
CHAIN_SEVERE_FRACTION = 0.2
CHAIN_GAP_SD = 0.0025
CHAIN_REWARD_RISE = (0.307, 0.037)
CHAIN_DISPERSION = 1.0
CHAIN_GAPS = {"full": -0.013, "loo": -0.014}  # full's and full-dq's measured mean paired gaps
OUTCOMES = ("REPRODUCED", "NOT REPRODUCED", "UNDECIDED")
ARMS = (REFERENCE_ARM, FULL_ARM, *LEAVE_ONE_OUT_ARMS)


@dataclasses.dataclass(frozen=True)
class NoiseModel:
    """What varies from seed to seed (module docstring); defaults measured on the chain matrix."""

    bf16_step_rate: float = CHAIN_BF16_SPIKING_STEPS[0] / CHAIN_BF16_SPIKING_STEPS[1]
    severe_fraction: float = CHAIN_SEVERE_FRACTION
    dispersion: float = CHAIN_DISPERSION
    gap_sd: float = CHAIN_GAP_SD
    reward_rise: float = CHAIN_REWARD_RISE[0]
    rise_sd: float = CHAIN_REWARD_RISE[1]

    def __post_init__(self) -> None:
        if not 0.0 <= self.bf16_step_rate < 1.0 or not 0.0 <= self.severe_fraction <= 1.0:
            raise ValueError(f"need 0 <= {self.bf16_step_rate=} < 1 and 0 <= {self.severe_fraction=} <= 1")
        if self.dispersion < 0 or self.gap_sd <= 0 or self.rise_sd < 0:
            raise ValueError(f"need {self.dispersion=} >= 0, {self.gap_sd=} > 0 and {self.rise_sd=} >= 0")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One truth: every arm's spike rate as a multiple of BF16's and its mean paired reward gap."""

    name: str
    spike_ratio: Mapping[str, float]
    gap: Mapping[str, float]

    def truth(self, noise: NoiseModel, c: StabilityCriteria) -> str:
        """What the rule should read here, by its own margins: the claim holds when full's true
        spike excess is below the margin and its gap above -margin, and every leave-one-out arm's
        excess is above the margin or its gap below -margin."""
        margin = c.spike_margin_per_100 / 100.0
        gap_margin = c.reward_margin_fraction * noise.reward_rise

        def stable(arm: str) -> bool:
            excess = (self.spike_ratio[arm] - 1.0) * noise.bf16_step_rate
            return excess < margin and self.gap[arm] > -gap_margin

        holds = stable(FULL_ARM) and not any(stable(arm) for arm in LEAVE_ONE_OUT_ARMS)
        return "REPRODUCED" if holds else "NOT REPRODUCED"


def scenario(name: str, full_ratio: float, loo_ratio: float, full_gap: float = CHAIN_GAPS["full"],
             loo_gap: float = CHAIN_GAPS["loo"]) -> Scenario:
    ratios = {REFERENCE_ARM: 1.0, FULL_ARM: full_ratio, **{a: loo_ratio for a in LEAVE_ONE_OUT_ARMS}}
    gaps = {REFERENCE_ARM: 0.0, FULL_ARM: full_gap, **{a: loo_gap for a in LEAVE_ONE_OUT_ARMS}}
    return Scenario(name, ratios, gaps)


def default_scenarios(c: StabilityCriteria = StabilityCriteria(), noise: NoiseModel = NoiseModel()) -> list[Scenario]:
    """The issue's truths: the leave-one-out arms spike k x BF16's rate (k = 2, 4, 10) with full
    as stable as BF16; and the claim false three ways (no intervention needed; full spiking;
    full lagging in reward by twice the margin)."""
    lag = -2 * c.reward_margin_fraction * noise.reward_rise
    return [
        scenario("leave-one-out arms spike 2x BF16's rate", 1.0, 2.0),
        scenario("leave-one-out arms spike 4x BF16's rate", 1.0, 4.0),
        scenario("leave-one-out arms spike 10x BF16's rate", 1.0, 10.0),
        scenario("every arm as stable as BF16 (no intervention needed)", 1.0, 1.0),
        scenario("full spikes 10x BF16's rate (leave-one-out arms 10x too)", 10.0, 10.0),
        scenario(f"full lags BF16 by {-lag:.3f} in reward (leave-one-out arms spike 10x)", 1.0, 10.0, full_gap=lag),
    ]


def _draw_counts(rng, rate: float, seeds: int, steps: int, noise: NoiseModel) -> list[tuple[int, int, int]]:
    if noise.dispersion > 0:
        effect = rng.gamma(1.0 / noise.dispersion, noise.dispersion, size=seeds)
    else:
        effect = np.ones(seeds)
    spikes = rng.binomial(steps, np.minimum(rate * effect, 1.0))
    severe = rng.binomial(spikes, noise.severe_fraction)
    return [(int(k), steps, int(s)) for k, s in zip(spikes, severe)]


def _collapse_result(seeds: int, c: StabilityCriteria) -> CriterionResult:
    """No simulated seed collapses: PASS with `min_seeds` judged seeds, as `collapse_criterion`."""
    threshold = f"no seed collapses; >= {c.min_seeds} seeds"
    if seeds >= c.min_seeds:
        return CriterionResult("collapse", True, "none", threshold)
    return CriterionResult("collapse", None, "none observed", threshold, f"{seeds} judged seed(s)")


def simulate_once(rng, truth: Scenario, seeds: int, judged_steps: int, noise: NoiseModel,
                  c: StabilityCriteria) -> dict[str, ArmVerdict]:
    """One replicate: every arm's verdict under `truth` with `seeds` judged seeds each."""
    rates = {arm: noise.bf16_step_rate * truth.spike_ratio[arm] for arm in ARMS}
    counts = {arm: _draw_counts(rng, rates[arm], seeds, judged_steps, noise) for arm in ARMS}
    rise = float(np.mean(rng.normal(noise.reward_rise, noise.rise_sd, size=seeds)))
    verdicts = {}
    for arm in ARMS[1:]:
        gaps = list(rng.normal(truth.gap[arm], noise.gap_sd, size=seeds))
        verdicts[arm] = ArmVerdict(arm, spike_decision(counts[arm], counts[REFERENCE_ARM], c),
                                   _collapse_result(seeds, c), reward_decision(gaps, rise, c))
    return verdicts


@dataclasses.dataclass(frozen=True)
class OperatingPoint:
    """The rule's outcome frequencies for one scenario at one number of seeds per arm."""

    scenario: Scenario
    seeds: int
    steps: int
    replicates: int
    outcomes: Mapping[str, float]  # P(REPRODUCED), P(NOT REPRODUCED), P(UNDECIDED)
    full_spike_pass: float  # P(full passes the spike criterion)
    loo_spike_fail: float  # P(a given leave-one-out arm fails it), averaged over the three


def operating_point(truth: Scenario, seeds: int, steps: int, replicates: int, noise: NoiseModel = NoiseModel(),
                    c: StabilityCriteria = StabilityCriteria(), seed: int = 0) -> OperatingPoint:
    """Simulate `replicates` matrices of `seeds` seeds x `steps` steps under `truth`."""
    if seeds < 1 or steps <= c.warmup_steps or replicates < 1:
        raise ValueError(f"need seeds >= 1, steps > {c.warmup_steps} (the warm-up) and replicates >= 1")
    rng = np.random.default_rng(seed)
    tally = dict.fromkeys(OUTCOMES, 0)
    full_pass = loo_fail = 0
    for _ in range(replicates):
        verdicts = simulate_once(rng, truth, seeds, steps - c.warmup_steps, noise, c)
        reproduced = claim_reproduced(verdicts).reproduced
        tally[{True: OUTCOMES[0], False: OUTCOMES[1], None: OUTCOMES[2]}[reproduced]] += 1
        full_pass += verdicts[FULL_ARM].spike.passed is True
        loo_fail += sum(verdicts[a].spike.passed is False for a in LEAVE_ONE_OUT_ARMS)
    return OperatingPoint(truth, seeds, steps, replicates, {k: v / replicates for k, v in tally.items()},
                          full_pass / replicates, loo_fail / (replicates * len(LEAVE_ONE_OUT_ARMS)))


def false_spike_failure_rate(seeds: int, steps: int, replicates: int, noise: NoiseModel = NoiseModel(),
                             c: StabilityCriteria = StabilityCriteria(), seed: int = 1) -> float:
    """P(an arm exactly as stable as BF16 FAILs the spike criterion): the test's size under the
    noise model's clustering (the one-sided level promises 1 - spike_level)."""
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(replicates):
        arm = _draw_counts(rng, noise.bf16_step_rate, seeds, steps - c.warmup_steps, noise)
        ref = _draw_counts(rng, noise.bf16_step_rate, seeds, steps - c.warmup_steps, noise)
        fails += spike_decision(arm, ref, c).passed is False
    return fails / replicates


# ----------------------------------------------------------------------------- reward power (analytic)


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


# ----------------------------------------------------------------------------- measured inputs and the table


def measured_defaults(run_dir, criteria: StabilityCriteria = StabilityCriteria()) -> dict[str, float]:
    """The noise model's inputs measured on a run directory under `criteria`: BF16's spiking and
    judged steps, the severe share of every arm's spiking steps, the method-of-moments dispersion
    of BF16's per-seed counts, the pooled within-arm sd of the other arms' per-seed mean paired
    gaps, and BF16's reward rise (mean and sd over its seeds)."""
    run = load_run(run_dir)
    summaries = summarize_run(run, criteria)
    if REFERENCE_ARM not in summaries:
        raise ValueError(f"{run_dir} has no {REFERENCE_ARM} arm")
    ref = np.array(seed_spike_counts(summaries[REFERENCE_ARM]), np.float64).reshape(-1, 3)
    every = np.concatenate([np.array(seed_spike_counts(s), np.float64).reshape(-1, 3) for s in summaries.values()])
    mean = ref[:, 0].mean() if ref.size else math.nan
    dispersion = max(0.0, (ref[:, 0].var(ddof=1) - mean) / mean**2) if len(ref) > 1 and mean > 0 else math.nan
    variances, dofs = [], []
    for arm, s in summaries.items():
        gaps = np.array([x.reward_gap for x in s.judged_seeds if np.isfinite(x.reward_gap)])
        if arm != REFERENCE_ARM and gaps.size >= 2:
            variances.append(gaps.var(ddof=1) * (gaps.size - 1))
            dofs.append(gaps.size - 1)
    rises = [reward_rise({k: r}, criteria.reward_rise_steps) for k, r in run.arms[REFERENCE_ARM].items()]
    return {"bf16_spiking_steps": float(ref[:, 0].sum()), "bf16_judged_steps": float(ref[:, 1].sum()),
            "severe_fraction": float(every[:, 2].sum() / every[:, 0].sum()) if every[:, 0].sum() else math.nan,
            "dispersion": dispersion, "gap_sd": math.sqrt(sum(variances) / sum(dofs)) if dofs else math.nan,
            "reward_rise": float(np.nanmean(rises)), "rise_sd": float(np.nanstd(rises, ddof=1))}


def measured_noise(run_dir, c: StabilityCriteria) -> tuple[NoiseModel, str]:
    """The noise model measured on `run_dir`; what it cannot measure (no other arm with 2 seeds, no
    spike to split into severe ones, BF16 too short for a rise) stays the chain's, and says so."""
    m = measured_defaults(run_dir, c)
    if m["bf16_judged_steps"] == 0:
        raise ValueError(f"{run_dir}: BF16 has no judged step (runs shorter than the criteria need)")
    chain = NoiseModel()
    fields = {"severe_fraction": m["severe_fraction"], "dispersion": m["dispersion"], "gap_sd": m["gap_sd"],
              "reward_rise": m["reward_rise"], "rise_sd": m["rise_sd"]}
    kept = [k for k, v in fields.items() if not (math.isfinite(v) and (v > 0 or k == "dispersion"))]
    fields.update({k: getattr(chain, k) for k in kept})
    noise = NoiseModel(m["bf16_spiking_steps"] / m["bf16_judged_steps"], **fields)
    source = f"measured on {run_dir}: BF16 {m['bf16_spiking_steps']:.0f}/{m['bf16_judged_steps']:.0f} spiking steps"
    if kept:
        source += f"; not measurable there, so the chain matrix's: {', '.join(kept)}"
    return noise, source


def markdown(points: Sequence[OperatingPoint], sizes: Mapping[int, float], noise: NoiseModel,
             c: StabilityCriteria = StabilityCriteria(), source: str = "") -> str:
    """The decision rule, the noise model and the operating characteristics, as markdown."""
    margin = c.reward_margin_fraction * noise.reward_rise
    lines = [
        "Decision rule, stated before the runs (docs/rl.md \"Stability criteria\"): " + c.describe()[1],
        "",
        c.describe()[3][0].upper() + c.describe()[3][1:],
        "",
        f"Claim: REPRODUCED when {FULL_ARM} passes spike, collapse and reward and each of "
        f"{', '.join(LEAVE_ONE_OUT_ARMS)} fails one; NOT REPRODUCED on a decided failure; otherwise UNDECIDED.",
        "",
        f"Noise model{f' ({source})' if source else ''}: BF16 spiking-step rate {100 * noise.bf16_step_rate:.3f}/100, "
        f"severe share {noise.severe_fraction:g}, seed dispersion phi {noise.dispersion:g}, per-seed sd of the mean "
        f"paired gap {noise.gap_sd:g}, BF16's reward rise {noise.reward_rise:g} (sd {noise.rise_sd:g}) so the reward "
        f"margin is {margin:.4f}; spike margin {c.spike_margin_per_100:g}/100 steps.",
        "",
        "| truth | what the margins make of it | seeds per arm | steps | P(REPRODUCED) | P(NOT REPRODUCED) | "
        "P(UNDECIDED) | P(full passes spike) | P(a leave-one-out arm fails spike) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        o = p.outcomes
        lines.append(f"| {p.scenario.name} | {p.scenario.truth(noise, c)} | {p.seeds} | {p.steps} | "
                     f"{o['REPRODUCED']:.3f} | {o['NOT REPRODUCED']:.3f} | {o['UNDECIDED']:.3f} | "
                     f"{p.full_spike_pass:.3f} | {p.loo_spike_fail:.3f} |")
    lines += ["", f"{points[0].replicates if points else 0} replicates per row (Monte Carlo standard error <= "
              f"{0.5 / math.sqrt(points[0].replicates) if points else math.nan:.3f}).", "",
              "Size of the spike test (P(FAIL) of an arm exactly as stable as BF16, one-sided level "
              f"{1 - c.spike_level:.2f}): " + ", ".join(f"{s} seeds {v:.3f}" for s, v in sizes.items()) + ".", "",
              "Reward, analytic (Student t over seeds): " + ", ".join(
                  f"{s} seeds: half-width {t_half_width(noise.gap_sd, s, c.ci_level):.4f}" for s in sizes) + "."]
    return "\n".join(lines)
