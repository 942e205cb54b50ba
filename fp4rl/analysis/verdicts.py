"""Verdicts of docs/rl.md "Stability criteria": PASS, FAIL or UNDECIDED per criterion and arm,
and the claim status.

"The claim is reproduced when the full recipe passes the spike, collapse and reward criteria
and each leave-one-out arm fails at least one." A verdict needs power (`StabilityCriteria`):
a criterion without it is UNDECIDED with its reason, never FAIL, so the claim is NOT
REPRODUCED only on a decided failure (the full recipe failing a criterion, or a leave-one-out
arm passing every one), and UNDECIDED when the runs cannot tell.

- spike: judged against the run's BF16 arm, always ("as stable as BF16"), at the seed level:
  each judged seed gives (spiking steps, judged steps), and `statistics.rate_difference` bounds
  the arm's pooled rate minus BF16's with a between-seed variance (spikes cluster inside a seed,
  so pooled steps are not independent). PASS when the upper bound is below the declared
  non-inferiority margin and the arm has no significant excess of severe spikes; FAIL when the
  rate's or the severe rate's lower bound is above 0 (more spikes than BF16); UNDECIDED
  otherwise, or without 2 judged seeds on either side.
- collapse: a collapse event is decided in any seed (a non-finite value needs no power, the
  reward rule is only confirmed after `recovery_steps` observed steps, the grad-norm rule is
  an event against a non-zero early median); a PASS needs `min_seeds` judged seeds without
  an unconfirmed reward drop.
- reward: the Student t interval over the judged seeds' mean population-reward gaps, paired by
  seed, against -margin, the margin a declared fraction of BF16's own reward rise; both PASS and
  FAIL need `min_seeds` judged seeds (at least 2: the interval is over seeds).

A decided verdict that more seeds could overturn (a pass, a comparison with BF16, an interval)
and that rests on fewer than `few_seeds` judged seeds carries `few_seeds` (the report marks it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import FULL_ARM, LEAVE_ONE_OUT_ARMS, REFERENCE_ARM
from fp4rl.analysis.statistics import RateDifference, rate_difference, student_t_interval
from fp4rl.analysis.summary import ArmSummary, SeedSummary


@dataclasses.dataclass(frozen=True)
class CriterionResult:
    """passed: True (PASS), False (FAIL) or None (UNDECIDED, `reason` says why).

    few_seeds: the number of judged seeds when the decided verdict rests on fewer than
    `StabilityCriteria.few_seeds` of them and more seeds could overturn it (a pass, a
    comparison, an interval); None otherwise. An observed event (a collapse, a seed above the
    spike rate) is a failure at any number of seeds and is not flagged.
    """

    name: str
    passed: bool | None
    value: str
    threshold: str
    reason: str | None = None
    few_seeds: int | None = None


def _rests_on(result: CriterionResult, n_seeds: int, c: StabilityCriteria) -> CriterionResult:
    """`result` flagged "few seeds" when it is decided on fewer than `c.few_seeds` judged seeds."""
    if result.passed is None or n_seeds >= c.few_seeds:
        return result
    return dataclasses.replace(result, few_seeds=n_seeds)


@dataclasses.dataclass(frozen=True)
class ArmVerdict:
    """Pass/fail of the spike, collapse and reward criteria; `passed` is False if any failed,
    None if none failed but one is undecided, True if all passed."""

    arm: str
    spike: CriterionResult
    collapse: CriterionResult
    reward: CriterionResult

    @property
    def criteria(self) -> tuple[CriterionResult, ...]:
        return (self.spike, self.collapse, self.reward)

    @property
    def passed(self) -> bool | None:
        results = [c.passed for c in self.criteria]
        if False in results:
            return False
        return None if None in results else True

    def failed(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.criteria if c.passed is False)

    def undecided(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.criteria if c.passed is None)


def _not_judged(seeds: tuple[SeedSummary, ...]) -> list[str]:
    return [f"seed{x.seed}: {x.power.reason}" for x in seeds if not x.power.judged]


SeedSpikes = tuple[int, int, int]  # (spiking steps, judged steps, steps with a severe spike) of one seed


def seed_spike_counts(s: ArmSummary) -> list[SeedSpikes]:
    """(spiking steps, judged steps, severe spiking steps) of each judged seed of the arm.

    Steps, not updates: the updates of one step share their rollouts, so a spike in one makes one
    in the other likelier; seeds, not pooled steps, are the independent units of the comparison."""
    return [(x.spikes.spiking_steps, x.spikes.judged_steps, x.spikes.severe_spiking_steps) for x in s.judged_seeds]


def spike_counts(s: ArmSummary) -> tuple[int, int, int]:
    """(spiking steps, judged steps, steps with a severe spike) summed over the arm's judged seeds."""
    counts = seed_spike_counts(s)
    return tuple(sum(x[i] for x in counts) for i in range(3))


def _per_100(d: RateDifference) -> str:
    return f"{100 * d.difference:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]"


def spike_decision(counts: list[SeedSpikes], reference: list[SeedSpikes] | None,
                   c: StabilityCriteria = StabilityCriteria()) -> CriterionResult:
    """The spike criterion on per-seed counts of the arm and of BF16 (module docstring)."""
    margin = c.spike_margin_per_100 / 100.0
    threshold = (f"vs BF16, per 100 judged steps: PASS when the {c.spike_level:.0%} upper bound of the rate difference "
                 f"< {c.spike_margin_per_100:g} and no severe excess; FAIL when a lower bound (all or severe) > 0; "
                 f">= {max(2, c.min_seeds)} judged seeds each")
    k, n, severe = (sum(x[i] for x in counts) for i in range(3))
    value = f"{k}/{n} spiking steps ({100 * k / n:.2f}/100), {severe} severe" if n else "no judged step"
    need = max(2, c.min_seeds)
    if reference is None:
        return CriterionResult("spike", None, value, threshold, "no BF16 reference arm")
    if len(counts) < need or len(reference) < need:
        return CriterionResult("spike", None, value, threshold,
                               f"{len(counts)} judged seed(s) here and {len(reference)} in BF16; {need} needed on "
                               "each side (seeds are the units of the comparison)")
    k_ref, n_ref, severe_ref = (sum(x[i] for x in reference) for i in range(3))
    every = rate_difference([(x[0], x[1]) for x in counts], [(x[0], x[1]) for x in reference], c.spike_level)
    big = rate_difference([(x[2], x[1]) for x in counts], [(x[2], x[1]) for x in reference], c.spike_level)
    value += (f" vs BF16 {k_ref}/{n_ref} ({100 * k_ref / n_ref:.2f}/100), {severe_ref} severe; difference per 100 "
              f"steps {_per_100(every)}, severe {_per_100(big)} (one-sided {c.spike_level:.0%} bounds, "
              f"{len(counts)} + {len(reference)} seeds)")
    seeds = min(len(counts), len(reference))
    if every.high < margin and big.low <= 0:
        return _rests_on(CriterionResult("spike", True, value, threshold), seeds, c)
    if every.low > 0 or big.low > 0:
        return _rests_on(CriterionResult("spike", False, value, threshold), seeds, c)
    return CriterionResult("spike", None, value, threshold,
                           f"the upper bound {100 * every.high:+.2f}/100 is not below the margin "
                           f"{c.spike_margin_per_100:g}/100, and no lower bound is above 0")


def spike_criterion(s: ArmSummary, c: StabilityCriteria = StabilityCriteria(),
                    reference: ArmSummary | None = None) -> CriterionResult:
    """The arm's spikes against BF16's (`spike_decision`); the BF16 arm itself is the yardstick,
    not judged."""
    result = spike_decision(seed_spike_counts(s), None if reference is None else seed_spike_counts(reference), c)
    not_judged = _not_judged(s.seeds)
    if not_judged and result.passed is None:
        result = dataclasses.replace(result, reason="; ".join([result.reason, *not_judged]))
    return result


def _as_reference(result: CriterionResult) -> CriterionResult:
    """The BF16 arm's own comparison with itself: reported, never a verdict."""
    return dataclasses.replace(result, passed=None, few_seeds=None,
                               reason="the BF16 reference: every other arm is judged against it")


def collapse_criterion(s: ArmSummary, c: StabilityCriteria = StabilityCriteria()) -> CriterionResult:
    """No seed collapses; decided failures need no power, a pass needs `min_seeds` judged seeds."""
    threshold = f"no seed collapses; >= {c.min_seeds} seeds"
    collapsed = [x for x in s.seeds if x.collapse.collapsed]
    if collapsed:
        return CriterionResult("collapse", False, "; ".join(f"seed{x.seed}: {x.collapse.reason}" for x in collapsed),
                               threshold)
    clear = [x for x in s.judged_seeds if not x.collapse.reward_drop_unconfirmed]
    if len(clear) >= c.min_seeds:
        return _rests_on(CriterionResult("collapse", True, "none", threshold), len(clear), c)
    pending = [f"seed{x.seed}: {x.collapse.note}" for x in s.judged_seeds if x.collapse.reward_drop_unconfirmed]
    counted = "judged seed(s) without an unconfirmed reward drop" if pending else "judged seed(s)"
    reason = "; ".join([f"{len(clear)} {counted}, {c.min_seeds} needed", *_not_judged(s.seeds), *pending])
    return CriterionResult("collapse", None, "none observed", threshold, reason)


def reward_decision(gaps: list[float], rise: float, c: StabilityCriteria = StabilityCriteria(),
                    bootstrap: str = "") -> CriterionResult:
    """The reward criterion on the judged seeds' mean paired gaps to BF16 and BF16's reward rise
    (module docstring); `bootstrap`: the two-level bootstrap interval's text, reported beside."""
    margin = c.reward_margin_fraction * rise
    threshold = (f"{c.ci_level:.0%} t interval over seeds >= -{c.reward_margin_fraction:g} x BF16's reward rise; "
                 f">= {max(2, c.min_seeds)} seeds")
    if not np.isfinite(rise) or rise <= 0:
        return CriterionResult("reward", None, "n/a", threshold,
                               f"BF16's population reward does not rise over the run (rise {rise:+.3f}), so there is "
                               "no learning to track and no margin")
    threshold = threshold.replace("BF16's reward rise", f"BF16's reward rise {rise:.3f} = {margin:.4f}")
    if len(gaps) < max(2, c.min_seeds):
        return CriterionResult("reward", None, f"{np.mean(gaps):+.4f} over {len(gaps)} seed(s)" if gaps else "n/a",
                               threshold, f"{len(gaps)} judged seed(s) with a paired gap, {max(2, c.min_seeds)} needed")
    low, high = student_t_interval(gaps, c.ci_level)
    value = f"{np.mean(gaps):+.4f}, t [{low:+.4f}, {high:+.4f}] over {len(gaps)} judged seeds" + bootstrap
    if low >= -margin:
        return _rests_on(CriterionResult("reward", True, value, threshold), len(gaps), c)
    if high < -margin:
        return _rests_on(CriterionResult("reward", False, value, threshold), len(gaps), c)
    return CriterionResult("reward", None, value, threshold, f"the {c.ci_level:.0%} t interval straddles -{margin:.4f}")


def reward_criterion(s: ArmSummary, c: StabilityCriteria = StabilityCriteria()) -> CriterionResult:
    """The paired reward gap to BF16 against the margin (`reward_decision`)."""
    threshold = f"t interval >= -{c.reward_margin_fraction:g} x BF16's reward rise"
    if not s.has_reference:
        return CriterionResult("reward", None, "n/a", threshold, "no BF16 reference arm")
    if s.reference_judged == 0:
        return CriterionResult("reward", None, "n/a", threshold, "no judged seed in the BF16 reference arm")
    gaps = [x.reward_gap for x in s.judged_seeds if np.isfinite(x.reward_gap)]
    ci = s.reward_gap_ci
    boot = "" if ci is None or ci.n < 2 else f"; bootstrap (seeds+steps) [{ci.low:+.4f}, {ci.high:+.4f}]"
    result = reward_decision(gaps, s.reference_reward_rise, c, boot)
    if result.passed is None and len(gaps) < max(2, c.min_seeds):
        result = dataclasses.replace(result, reason="; ".join([result.reason, *_not_judged(s.seeds)]))
    return result


def equivalence(a: ArmSummary, b: ArmSummary, c: StabilityCriteria = StabilityCriteria()) -> CriterionResult:
    """Are arms `a` and `b` equivalent within the rule's own margins, both ways?

    spikes: the one-sided bounds of a's spiking-step rate minus b's (`rate_difference`, seeds as
    units) both inside (-margin, +margin); reward: the t interval over the seeds both arms hold of
    (a's paired gap to BF16 minus b's, seed by seed: the same prompts, so the difference is paired
    too) inside (-reward margin, +reward margin). EQUIVALENT (passed True) when both hold; NOT
    EQUIVALENT (False) when a spike bound lies wholly outside the band on one side (low > margin or
    high < -margin) or the reward interval lies wholly outside (-margin, +margin); UNDECIDED
    otherwise (too few seeds, or an interval straddling a margin)."""
    name, margin = f"{a.arm} vs {b.arm}", c.spike_margin_per_100 / 100.0
    rise = a.reference_reward_rise
    reward_margin = c.reward_margin_fraction * rise if np.isfinite(rise) and rise > 0 else float("nan")
    threshold = (f"spike difference within +-{c.spike_margin_per_100:g}/100 and paired reward difference within "
                 f"+-{reward_margin:.4f} ({c.reward_margin_fraction:g} x BF16's rise), both ways")
    ca, cb = seed_spike_counts(a), seed_spike_counts(b)
    gap_a = {x.seed: x.reward_gap for x in a.judged_seeds if np.isfinite(x.reward_gap)}
    gap_b = {x.seed: x.reward_gap for x in b.judged_seeds if np.isfinite(x.reward_gap)}
    diffs = [gap_a[k] - gap_b[k] for k in sorted(gap_a.keys() & gap_b.keys())]
    need = max(2, c.min_seeds)
    if min(len(ca), len(cb), len(diffs)) < need or not np.isfinite(reward_margin):
        return CriterionResult(name, None, f"{len(ca)} and {len(cb)} judged seeds, {len(diffs)} paired", threshold,
                               f"{need} judged seeds of each arm with paired gaps and a BF16 that learns are needed")
    d = rate_difference([x[:2] for x in ca], [x[:2] for x in cb], c.spike_level)
    low, high = student_t_interval(diffs, c.ci_level)
    value = (f"spike difference per 100 steps {_per_100(d)}; paired reward difference {np.mean(diffs):+.4f} "
             f"t [{low:+.4f}, {high:+.4f}] over {len(diffs)} seeds")
    if -margin < d.low and d.high < margin and -reward_margin < low and high < reward_margin:
        return _rests_on(CriterionResult(name, True, value, threshold), len(diffs), c)
    if d.low > margin or d.high < -margin or low > reward_margin or high < -reward_margin:
        return _rests_on(CriterionResult(name, False, value, threshold), len(diffs), c)
    return CriterionResult(name, None, value, threshold, "an interval straddles a margin")


def verdict(arm_summary: ArmSummary, criteria: StabilityCriteria = StabilityCriteria(),
            reference: ArmSummary | None = None) -> ArmVerdict:
    """Judge one arm against the declared thresholds (see `StabilityCriteria`); `reference` is
    the run's BF16 arm, which calibrates the spike threshold."""
    s, c = arm_summary, criteria
    spike, reward = spike_criterion(s, c, reference), reward_criterion(s, c)
    if reference is not None and s.arm == reference.arm:
        spike, reward = _as_reference(spike), _as_reference(reward)
    return ArmVerdict(arm=s.arm, spike=spike, collapse=collapse_criterion(s, c), reward=reward)


def run_verdicts(summaries: Mapping[str, ArmSummary], criteria: StabilityCriteria = StabilityCriteria(),
                 reference_arm: str = REFERENCE_ARM) -> dict[str, ArmVerdict]:
    """Every arm of a run judged, against the run's `reference_arm` where it has one."""
    reference = summaries.get(reference_arm)
    return {arm: verdict(s, criteria, reference) for arm, s in summaries.items()}


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    """docs/rl.md's claim status: reproduced is None when it cannot be decided (missing arms or
    undecided criteria and no decided failure). `details[arm]` explains each arm's part."""

    reproduced: bool | None
    explanation: str
    details: Mapping[str, str]


def _undecided_text(v: ArmVerdict) -> str:
    return "; ".join(f"{c.name} undecided ({c.reason})" for c in v.criteria if c.passed is None)


def claim_reproduced(verdicts: Mapping[str, ArmVerdict]) -> ClaimResult:
    """The full recipe passes spike, collapse and reward; each leave-one-out arm
    (full-dq, full-46, full-hp) fails at least one of them (docs/rl.md "Stability criteria")."""
    details: dict[str, str] = {}
    decided: list[bool | None] = []
    full = verdicts.get(FULL_ARM)
    if full is None:
        details[FULL_ARM] = "missing: the full recipe was not run"
        decided.append(None)
    else:
        ok = full.passed
        details[FULL_ARM] = {True: "passes spike, collapse and reward (required)",
                             False: f"fails {', '.join(full.failed())} (must pass all)",
                             None: f"no criterion failed, but {_undecided_text(full)}"}[ok]
        decided.append(ok)
    for arm in LEAVE_ONE_OUT_ARMS:
        v = verdicts.get(arm)
        if v is None:
            details[arm] = "missing: this leave-one-out arm was not run"
            decided.append(None)
        elif v.failed():
            details[arm] = f"fails {', '.join(v.failed())} (required: fail at least one)"
            decided.append(True)
        elif v.passed is None:
            details[arm] = f"no criterion failed, but {_undecided_text(v)}"
            decided.append(None)
        else:
            details[arm] = "passes every criterion (required: fail at least one), so this intervention is not needed"
            decided.append(False)
    if False in decided:
        reproduced, head = False, "Not reproduced"
    elif None in decided:
        reproduced, head = None, "Undecided"
    else:
        reproduced, head = True, "Reproduced"
    lines = "; ".join(f"{arm}: {text}" for arm, text in details.items())
    return ClaimResult(reproduced=reproduced, explanation=f"{head}. {lines}.", details=details)
