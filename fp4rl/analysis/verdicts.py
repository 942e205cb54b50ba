"""Verdicts of docs/rl.md "Stability criteria": PASS, FAIL or UNDECIDED per criterion and arm,
and the claim status.

"The claim is reproduced when the full recipe passes the spike, collapse and reward criteria
and each leave-one-out arm fails at least one." A verdict needs power (`StabilityCriteria`):
a criterion without it is UNDECIDED with its reason, never FAIL, so the claim is NOT
REPRODUCED only on a decided failure (the full recipe failing a criterion, or a leave-one-out
arm passing every one), and UNDECIDED when the runs cannot tell.

- spike: judged on the judged seeds only (enough judged steps, not degenerate). Any judged
  seed above the rate, or severe spikes in judged seeds above the count, is a FAIL; a PASS
  needs `min_seeds` judged seeds. Calibration: the claim is "as stable as BF16", so when the
  run's BF16 arm fails the same absolute threshold, the threshold cannot separate an arm from
  BF16; a failing arm then FAILs only if it spikes more often than BF16 (one-sided Fisher exact
  test on spiking / judged steps, pooled over judged seeds, p < reference_spike_alpha),
  or has severe spikes where BF16 has none, and is UNDECIDED otherwise.
- collapse: a collapse event is decided in any seed (a non-finite value needs no power, the
  reward rule is only confirmed after `recovery_steps` observed steps, the grad-norm rule is
  an event against a non-zero early median); a PASS needs `min_seeds` judged seeds without
  an unconfirmed reward drop.
- reward: the bootstrap interval of the mean population-reward gap, paired by seed, over the
  judged seeds, against -reward_gap_tolerance; both PASS and FAIL need `min_seeds` judged seeds
  and a judged BF16 seed.

A decided verdict that more seeds could overturn (a pass, a comparison with BF16, an interval)
and that rests on fewer than `few_seeds` judged seeds carries `few_seeds` (the report marks it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import FULL_ARM, LEAVE_ONE_OUT_ARMS, REFERENCE_ARM
from fp4rl.analysis.statistics import detectable_rate, fisher_exact_greater
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


def _too_few(n: int, c: StabilityCriteria, seeds: tuple[SeedSummary, ...]) -> str:
    return "; ".join([f"{n} judged seed(s), {c.min_seeds} needed", *_not_judged(seeds)])


def spike_counts(s: ArmSummary) -> tuple[int, int, int]:
    """(spiking steps, judged steps, steps with a severe spike) over the arm's judged seeds.

    Steps, not updates: the updates of one step share their rollouts, so a spike in one makes
    one in the other likelier, and the Fisher test and its power assume independent units."""
    judged = s.judged_seeds
    return (sum(x.spikes.spiking_steps for x in judged), sum(x.spikes.judged_steps for x in judged),
            sum(x.spikes.severe_spiking_steps for x in judged))


def spike_criterion(s: ArmSummary, c: StabilityCriteria = StabilityCriteria(),
                    reference: ArmSummary | None = None) -> CriterionResult:
    """The absolute rule; where it fails and the BF16 `reference` fails it too, the comparison
    with the reference decides (module docstring)."""
    absolute = _absolute_spike_criterion(s, c)
    if absolute.passed is not False or reference is None or _absolute_spike_criterion(reference, c).passed is not False:
        return absolute
    k, n, severe = spike_counts(s)
    k_ref, n_ref, severe_ref = spike_counts(reference)
    why = (f"the BF16 reference fails the same absolute threshold ({k_ref} spiking step(s) in {n_ref} judged steps, "
           f"{severe_ref} severe), so it cannot separate an arm from BF16")
    if s.arm == reference.arm:
        return dataclasses.replace(absolute, passed=None, reason=why)
    p = fisher_exact_greater(k, n, k_ref, n_ref)
    detectable = detectable_rate(n, k_ref, n_ref, c.reference_spike_alpha, c.reference_spike_power)
    value = (f"{absolute.value}; vs BF16: {k}/{n} vs {k_ref}/{n_ref} spiking steps, one-sided Fisher p = {p:.3g}; "
             f"at {c.reference_spike_power:.0%} power this test detects a rate >= {detectable:.1%} (BF16 {k_ref / n_ref:.1%})")
    threshold = f"{absolute.threshold}; BF16 fails it too: more spikes than BF16 at p < {c.reference_spike_alpha:g}"
    if p < c.reference_spike_alpha or (severe > c.max_severe_spikes and severe_ref <= c.max_severe_spikes):
        # A comparison with BF16: more seeds of either arm could overturn it.
        return _rests_on(CriterionResult("spike", False, value, threshold), min(len(s.judged_seeds),
                                                                                len(reference.judged_seeds)), c)
    return CriterionResult("spike", None, value, threshold,
                           f"{why}; this arm does not spike more often than BF16 (p = {p:.3g} >= {c.reference_spike_alpha:g})")


def _absolute_spike_criterion(s: ArmSummary, c: StabilityCriteria) -> CriterionResult:
    """Spikes per 100 judged steps in every judged seed, and severe spikes in the arm."""
    threshold = f"<= {c.max_spikes_per_100:g}/100 steps per seed; <= {c.max_severe_spikes} severe; >= {c.min_seeds} seeds"
    judged = s.judged_seeds
    others = sum(x.spikes.spiking_steps for x in s.seeds if not x.power.judged)
    extra = f"; {others} spiking step(s) in seeds not judged" if others else ""
    if not judged:
        return CriterionResult("spike", None, "no judged seed" + extra, threshold, _too_few(0, c, s.seeds))
    max_rate = max(x.spikes.per_100_steps for x in judged)
    n_severe = sum(x.spikes.severe_spiking_steps for x in judged)
    value = f"max {max_rate:.2f} spiking steps/100 over {len(judged)} judged seed(s); {n_severe} severe" + extra
    if max_rate > c.max_spikes_per_100 or n_severe > c.max_severe_spikes:
        return CriterionResult("spike", False, value, threshold)
    if len(judged) < c.min_seeds:
        return CriterionResult("spike", None, value, threshold, _too_few(len(judged), c, s.seeds))
    return _rests_on(CriterionResult("spike", True, value, threshold), len(judged), c)


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


def reward_criterion(s: ArmSummary, c: StabilityCriteria = StabilityCriteria()) -> CriterionResult:
    """The interval of the mean population-reward gap to BF16 against -reward_gap_tolerance."""
    threshold = f"interval >= -{c.reward_gap_tolerance:g}; >= {c.min_seeds} seeds"
    if not s.has_reference:
        return CriterionResult("reward", None, "n/a", threshold, "no BF16 reference arm")
    if s.reference_judged == 0:
        return CriterionResult("reward", None, "n/a", threshold, "no judged seed in the BF16 reference arm")
    ci = s.reward_gap_ci
    if ci is None:
        return CriterionResult("reward", None, "n/a", threshold, "; ".join(
            ["no judged seed with a population reward on steps the BF16 reference logged", *_not_judged(s.seeds)]))
    value = f"{ci.mean:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}] over {ci.n} judged seed(s)"
    if ci.t_interval is not None:
        value += f"; t interval [{ci.t_interval[0]:+.3f}, {ci.t_interval[1]:+.3f}]"
    if ci.n < c.min_seeds:
        return CriterionResult("reward", None, value, threshold, _too_few(ci.n, c, s.seeds))
    if ci.low >= -c.reward_gap_tolerance:
        return _rests_on(CriterionResult("reward", True, value, threshold), ci.n, c)
    if ci.high < -c.reward_gap_tolerance:
        return _rests_on(CriterionResult("reward", False, value, threshold), ci.n, c)
    return CriterionResult("reward", None, value, threshold,
                           f"the {ci.ci:.0%} interval straddles -{c.reward_gap_tolerance:g}")


def verdict(arm_summary: ArmSummary, criteria: StabilityCriteria = StabilityCriteria(),
            reference: ArmSummary | None = None) -> ArmVerdict:
    """Judge one arm against the declared thresholds (see `StabilityCriteria`); `reference` is
    the run's BF16 arm, which calibrates the spike threshold."""
    s, c = arm_summary, criteria
    return ArmVerdict(arm=s.arm, spike=spike_criterion(s, c, reference), collapse=collapse_criterion(s, c),
                      reward=reward_criterion(s, c))


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
