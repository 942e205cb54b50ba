"""Measure every stability criterion of one run or arm (docs/rl.md "Stability criteria").

`summarize_seed` feeds one (arm, seed) run to the detectors (`fp4rl.analysis.detectors`):
spikes on its grad-norm measurements (per update from updates.jsonl, per step without it),
collapse, its power, and its held-out evaluations. `summarize_arm` adds the population-reward
gap to the BF16 arm, paired by seed, with its intervals, and the accuracy intervals over seeds
(`fp4rl.analysis.statistics`); `summarize_run` does every arm of a loaded run directory.
The resulting `ArmSummary` is what `fp4rl.analysis.verdicts.verdict` judges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import CollapseResult, SeedPower, SpikeResult, detect_collapse, find_spikes, seed_power
from fp4rl.analysis.runs import (
    POPULATION_ACCURACY, POPULATION_REWARD, REFERENCE_ARM, GradNormSeries, RunData, SeedRun, grad_norm_measurements,
)
from fp4rl.analysis.statistics import (
    BootstrapCI, MismatchSummary, accuracy_change_ci, accuracy_ci, mismatch_summary, reward_gap_ci,
    reward_gap_to_reference,
)

GREEDY_EVAL = "eval/accuracy"
SAMPLED_EVAL = "eval/sampled_accuracy"
EVAL_SIZE = "eval/n"
INITIAL_EVAL_SIZE = "eval/initial_n"  # the policy before RL, logged with step 0


@dataclasses.dataclass(frozen=True)
class EvalPoint:
    """One held-out evaluation: its step, accuracy, and number of problems (None: not logged)."""

    step: int
    accuracy: float
    n: int | None


@dataclasses.dataclass(frozen=True)
class SeedSummary:
    """Every criterion's measurement for one (arm, seed) run.

    final_greedy / final_sampled / first_sampled: the last greedy, last and first sampled
    evaluations with a finite accuracy (None if never logged); the first is the policy before
    RL (step -1) when the trainer evaluated it. reward_gap: NaN without a
    reference arm or population reward.
    """

    arm: str
    seed: int
    n_steps: int
    last_step: int
    spikes: SpikeResult
    power: SeedPower
    collapse: CollapseResult
    reward_gap: float
    final_greedy: EvalPoint | None
    final_sampled: EvalPoint | None
    first_sampled: EvalPoint | None
    mismatch: MismatchSummary
    skipped_updates: int
    empty_updates: int

    @property
    def spike_steps(self) -> tuple[int, ...]:
        return self.spikes.spike_steps

    @property
    def severe_steps(self) -> tuple[int, ...]:
        return self.spikes.severe_steps

    @property
    def spikes_per_100(self) -> float:
        return self.spikes.per_100_steps

    @property
    def severe_per_100(self) -> float:
        return self.spikes.severe_per_100_steps

    @property
    def final_accuracy(self) -> float:
        return float("nan") if self.final_greedy is None else self.final_greedy.accuracy

    @property
    def final_accuracy_step(self) -> int | None:
        return None if self.final_greedy is None else self.final_greedy.step


@dataclasses.dataclass(frozen=True)
class ArmSummary:
    """One arm over its seeds.

    reward_gap_mean: mean of every seed's gap, paired by seed (NaN when `has_reference` is False);
    reward_gap_ci: the interval over the judged seeds (None when no judged seed has a gap).
    reference_judged: judged seeds of the reference arm. reference_reward_rise: what RL gains in
    the reference arm's population reward (`reward_rise`; NaN without one), which sets the
    reward criterion's margin. final_accuracy (greedy),
    final_sampled_accuracy, sampled_accuracy_change: intervals over seeds (None when no seed
    logged the evaluation; the change needs two evaluations in a seed). notes: what the
    intervals leave out.
    """

    arm: str
    seeds: tuple[SeedSummary, ...]
    has_reference: bool
    reward_gap_mean: float
    final_accuracy: BootstrapCI | None
    mismatch: MismatchSummary  # means over seeds (max for max_abs_logp_diff)
    reward_gap_ci: BootstrapCI | None = None
    reference_judged: int = 0
    final_sampled_accuracy: BootstrapCI | None = None
    sampled_accuracy_change: BootstrapCI | None = None
    notes: tuple[str, ...] = ()
    reference_reward_rise: float = float("nan")

    @property
    def judged_seeds(self) -> tuple[SeedSummary, ...]:
        return tuple(s for s in self.seeds if s.power.judged)


def _eval_points(run: SeedRun, key: str) -> list[EvalPoint]:
    """The evaluations of `key`, in step order; the policy before RL first (step -1) when the
    trainer logged it (`eval/initial_*` with step 0)."""
    points = []
    initial = key.replace("eval/", "eval/initial_")
    if initial in run.metrics and run.logged(initial)[0].size:
        v, n = run.logged(initial)[1][0], run.logged(INITIAL_EVAL_SIZE)[1]
        if np.isfinite(v):
            points.append(EvalPoint(-1, float(v), int(n[0]) if n.size and np.isfinite(n[0]) and n[0] >= 1 else None))
    steps, values = run.logged(key)
    ok = np.isfinite(values)
    sizes = dict(zip(*(a.tolist() for a in run.logged(EVAL_SIZE))))
    for s, v in zip(steps[ok], values[ok]):
        n = sizes.get(int(s))
        points.append(EvalPoint(int(s), float(v), int(n) if n is not None and np.isfinite(n) and n >= 1 else None))
    return points


def _idle_steps(run: SeedRun, series: GradNormSeries, criteria: StabilityCriteria) -> np.ndarray:
    """bool [T]: steps that applied no update or whose every grad norm was <= idle_grad_norm."""
    u = run.updates
    if series.per_update and u is not None:
        active = series.steps[~(series.values <= criteria.idle_grad_norm)]  # NaN counts as active
        return ~np.isin(run.steps, active) | ~np.isin(run.steps, u.steps[u.applied()])
    idle = np.zeros(len(run), bool)
    if "grad_norm/global" in run.metrics:
        idle |= run.present["grad_norm/global"] & (run.metrics["grad_norm/global"] <= criteria.idle_grad_norm)
    if "updates/applied" in run.metrics:
        idle |= run.present["updates/applied"] & (run.metrics["updates/applied"] == 0)
    return idle


def _update_series(run: SeedRun) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """updates.jsonl's series of the non-empty updates, for the non-finite scan (the grad norm is
    scanned as the grad-norm measurements)."""
    u = run.updates
    if u is None:
        return {}
    keep = u.measured()
    return {f"{k} (updates.jsonl)": (u.steps[keep & u.present[k]], v[keep & u.present[k]])
            for k, v in u.metrics.items() if k not in ("empty", "skipped", "grad_norm/global")}


def _power(run: SeedRun, series: GradNormSeries, criteria: StabilityCriteria) -> SeedPower:
    accuracy = run.logged(POPULATION_ACCURACY)[1] if POPULATION_ACCURACY in run.metrics else None
    return seed_power(run.steps, _idle_steps(run, series, criteria), series.steps, accuracy, criteria)


def summarize_seed(run: SeedRun, criteria: StabilityCriteria = StabilityCriteria(), reward_gap: float = float("nan")) -> SeedSummary:
    """Measure spikes, collapse, power, evaluations and mismatch of one run."""
    series = grad_norm_measurements(run)
    spikes = find_spikes(series.steps, series.values, series.update if series.per_update else None, criteria)
    numeric = {k: v for k, v in run.metrics.items() if v.dtype != bool}
    reward = np.where(run.present[POPULATION_REWARD], run.metrics[POPULATION_REWARD], np.nan) \
        if POPULATION_REWARD in run.metrics else None
    collapse = detect_collapse(
        run.steps, series.values, reward, criteria, grad_steps=series.steps, reward_key=POPULATION_REWARD,
        grad_key="grad_norm/global (updates.jsonl)" if series.per_update else "grad_norm/global",
        other_metrics=numeric, present=run.present, nonfinite_flag=run.metrics.get("nonfinite"),
        update_metrics=_update_series(run),
    )
    greedy, sampled = _eval_points(run, GREEDY_EVAL), _eval_points(run, SAMPLED_EVAL)
    skipped = run.metrics.get("skipped_update")
    empty = run.logged("updates/empty")[1]
    return SeedSummary(
        arm=run.arm, seed=run.seed, n_steps=len(run), last_step=int(run.steps[-1]),
        spikes=spikes, power=_power(run, series, criteria), collapse=collapse, reward_gap=reward_gap,
        final_greedy=greedy[-1] if greedy else None,
        final_sampled=sampled[-1] if sampled else None,
        first_sampled=sampled[0] if sampled else None,
        mismatch=mismatch_summary(run.metrics),
        skipped_updates=0 if skipped is None else int(np.count_nonzero(skipped & run.present["skipped_update"])),
        empty_updates=int(np.nansum(empty)),
    )


def _reward_series(runs: Mapping[int, SeedRun]) -> dict:
    return {s: r.logged(POPULATION_REWARD) for s, r in runs.items() if POPULATION_REWARD in r.metrics}


def reward_rise(runs: Mapping[int, SeedRun], window: int) -> float:
    """Mean over seeds of (mean population reward of the last `window` logged steps minus that of
    the first `window`): what RL gained over the run. NaN when no seed logged 2 x window steps."""
    rises = []
    for steps, values in _reward_series(runs).values():
        v = np.asarray(values, np.float64)[np.argsort(steps, kind="stable")]
        v = v[np.isfinite(v)]
        if v.size >= 2 * window:
            rises.append(v[-window:].mean() - v[:window].mean())
    return float(np.mean(rises)) if rises else float("nan")


def _accuracy_interval(points: list[EvalPoint | None], n_seeds: int, what: str, c: StabilityCriteria,
                       notes: list[str]) -> BootstrapCI | None:
    have = [p for p in points if p is not None]
    if not have:
        return None
    ci = accuracy_ci([p.accuracy for p in have], [p.n for p in have], c.bootstrap_samples, c.ci_level)
    if len(have) < n_seeds:
        notes.append(f"{what}: {n_seeds - len(have)} of {n_seeds} seeds logged no finite value and are left out")
    if ci.note:
        notes.append(f"{what}: {ci.note}")
    return ci


def summarize_arm(
    arm: str,
    runs: Mapping[int, SeedRun],
    reference_runs: Mapping[int, SeedRun] | None,
    criteria: StabilityCriteria = StabilityCriteria(),
    reference_judged: int | None = None,
    reference_rise: float | None = None,
) -> ArmSummary:
    """Summarise one arm's seeds; `reference_runs` are the BF16 arm's seeds (None if absent).
    reference_judged, reference_rise: how many of them are judged and their `reward_rise` (computed
    here when not given: `summarize_run` computes them once for every arm)."""
    c = criteria
    notes: list[str] = []
    gaps: Mapping[int, float] = {}
    gap_mean, series, rise = float("nan"), {}, float("nan")
    if reference_runs:
        rise = reward_rise(reference_runs, c.reward_rise_steps) if reference_rise is None else reference_rise
        rg = reward_gap_to_reference(_reward_series(runs), _reward_series(reference_runs))
        gaps, gap_mean, series = rg.per_seed, rg.mean, rg.series
        if rg.unpaired:
            notes.append(f"reward gap: seed(s) {', '.join(map(str, rg.unpaired))} have no reference-arm seed of the "
                         "same number to pair with and are left out")
        if reference_judged is None:
            reference_judged = sum(_power(r, grad_norm_measurements(r), c).judged for r in reference_runs.values())
    seeds = tuple(summarize_seed(r, c, gaps.get(s, float("nan"))) for s, r in runs.items())
    judged_gaps = [series[s.seed] for s in seeds if s.power.judged and series.get(s.seed, np.zeros(0)).size]
    gap_ci = reward_gap_ci(judged_gaps, c.reward_block_steps, c.bootstrap_samples, c.ci_level) if judged_gaps else None
    greedy = _accuracy_interval([s.final_greedy for s in seeds], len(seeds), "final greedy accuracy", c, notes)
    sampled = _accuracy_interval([s.final_sampled for s in seeds], len(seeds), "final sampled accuracy", c, notes)
    twice = [s for s in seeds if s.first_sampled is not None and s.final_sampled.step > s.first_sampled.step]
    change = None
    if twice:
        change = accuracy_change_ci([s.first_sampled.accuracy for s in twice], [s.first_sampled.n for s in twice],
                                    [s.final_sampled.accuracy for s in twice], [s.final_sampled.n for s in twice],
                                    c.bootstrap_samples, c.ci_level)
        if len(twice) < len(seeds):
            notes.append(f"sampled accuracy change: {len(seeds) - len(twice)} of {len(seeds)} seeds evaluated "
                         "fewer than twice and are left out")
        if change.note:
            notes.append(f"sampled accuracy change: {change.note}")

    def over_seeds(field: str, fn) -> float:
        v = np.array([getattr(s.mismatch, field) for s in seeds])
        v = v[np.isfinite(v)]
        return float(fn(v)) if v.size else float("nan")

    mismatch = MismatchSummary(
        kl_k3=over_seeds("kl_k3", np.mean), kl_k1=over_seeds("kl_k1", np.mean),
        max_abs_logp_diff=over_seeds("max_abs_logp_diff", np.max), routing_flip=over_seeds("routing_flip", np.mean),
    )
    return ArmSummary(arm=arm, seeds=seeds, has_reference=bool(reference_runs), reward_gap_mean=gap_mean,
                      final_accuracy=greedy, mismatch=mismatch, reward_gap_ci=gap_ci,
                      reference_judged=reference_judged or 0, final_sampled_accuracy=sampled,
                      sampled_accuracy_change=change, notes=tuple(notes), reference_reward_rise=rise)


def summarize_run(
    run: RunData, criteria: StabilityCriteria = StabilityCriteria(), reference_arm: str = REFERENCE_ARM
) -> dict[str, ArmSummary]:
    """Summarise every arm of a loaded run against the `reference_arm`'s population reward."""
    reference = run.arms.get(reference_arm)
    ref_judged = None
    if reference:
        ref_judged = sum(_power(r, grad_norm_measurements(r), criteria).judged for r in reference.values())
    rise = reward_rise(reference, criteria.reward_rise_steps) if reference else None
    return {arm: summarize_arm(arm, seeds, reference, criteria, ref_judged, rise) for arm, seeds in run.arms.items()}
