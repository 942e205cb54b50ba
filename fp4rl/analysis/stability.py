"""Stability criteria of RL.md ("Stability criteria (declare before running, report per arm)").

RL.md declares, per arm:
- spike: pre-clip grad norm > 3x the median of the previous 50 steps (after step 20);
  severe spike: > 10x; reported as spikes per 100 steps per seed;
- collapse: any non-finite value, a grad norm > 100x the early median, or reward falling
  more than 0.5 below its running best without recovering within 50 steps;
- reward tracking: mean gap to the BF16 median reward over the run, and the final held-out
  (greedy) accuracy with a bootstrap confidence interval over seeds;
- mismatch: k3 KL per token between sampler and trainer.
"The claim is reproduced when the full recipe passes the spike, collapse and reward criteria
and each leave-one-out arm fails at least one."

RL.md gives no pass threshold for the spike rate or the reward gap; `StabilityCriteria`
declares them (`max_spikes_per_100`, `max_severe_spikes`, `reward_gap_tolerance`) so they
are fixed before any run is looked at. Mismatch and final accuracy are reported, not judged:
RL.md attaches no threshold to them.

Everything works on step *numbers* (the `step` key), not on line indices, except the spike
window, which is the previous `window` logged values (the trainer logs every step, so the
two coincide; with gaps the window still holds `window` measurements).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from fp4rl.analysis.runs import FULL_ARM, LEAVE_ONE_OUT_ARMS

if TYPE_CHECKING:  # summary imports this module; verdict only reads an ArmSummary's fields
    from fp4rl.analysis.summary import ArmSummary


@dataclasses.dataclass(frozen=True)
class StabilityCriteria:
    """Thresholds of RL.md "Stability criteria"; the last three are declared here.

    spike_factor, severe_factor, window, warmup_steps: RL.md's spike definition (3x / 10x the
        median of the previous 50 steps, after step 20: steps < warmup_steps are never spikes).
    collapse_grad_factor: collapse when the grad norm exceeds this multiple of the *early
        median*, defined as the median of the finite grad norms logged at steps
        < warmup_steps (the same steps that spike detection skips).
    reward_drop, recovery_steps: collapse when reward falls more than `reward_drop` below its
        running best and does not come back to within `reward_drop` of that best within
        `recovery_steps` steps.
    max_spikes_per_100: declared pass threshold: every seed has at most this many spikes
        (severe ones included) per 100 steps at or after the warm-up.
    max_severe_spikes: declared pass threshold: at most this many severe spikes per arm (all
        seeds together).
    reward_gap_tolerance: declared pass threshold: the arm's mean reward gap to the BF16
        median reward is >= -reward_gap_tolerance. Reward is +1/-1 (RL.md "Task"), so 0.1 of
        reward is 5 points of accuracy.
    """

    spike_factor: float = 3.0
    severe_factor: float = 10.0
    window: int = 50
    warmup_steps: int = 20
    collapse_grad_factor: float = 100.0
    reward_drop: float = 0.5
    recovery_steps: int = 50
    max_spikes_per_100: float = 1.0
    max_severe_spikes: int = 0
    reward_gap_tolerance: float = 0.1

    def __post_init__(self) -> None:
        if not 1.0 < self.spike_factor <= self.severe_factor:
            raise ValueError(f"need 1 < {self.spike_factor=} <= {self.severe_factor=}")
        if self.window < 1:
            raise ValueError(f"{self.window=} must be >= 1")
        if self.warmup_steps < 0 or self.recovery_steps < 1:
            raise ValueError(f"{self.warmup_steps=} must be >= 0 and {self.recovery_steps=} >= 1")
        if self.collapse_grad_factor <= 1.0 or self.reward_drop <= 0.0:
            raise ValueError(f"{self.collapse_grad_factor=} must be > 1 and {self.reward_drop=} > 0")
        if self.max_spikes_per_100 < 0 or self.max_severe_spikes < 0 or self.reward_gap_tolerance < 0:
            raise ValueError("pass thresholds (max_spikes_per_100, max_severe_spikes, reward_gap_tolerance) must be >= 0")

    def describe(self) -> list[str]:
        """The declared criteria as report lines."""
        c = self
        return [
            f"spike: pre-clip grad norm > {c.spike_factor:g}x the median of the previous {c.window} "
            f"finite values, at steps >= {c.warmup_steps}; severe: > {c.severe_factor:g}x.",
            f"spike criterion passes: <= {c.max_spikes_per_100:g} spikes per 100 steps in every seed "
            f"and <= {c.max_severe_spikes} severe spikes in the arm.",
            f"collapse: any non-finite logged value; grad norm > {c.collapse_grad_factor:g}x the early "
            f"median (median of finite grad norms at steps < {c.warmup_steps}); or reward more than "
            f"{c.reward_drop:g} below its running best, not back within {c.reward_drop:g} of it within "
            f"{c.recovery_steps} steps. Passes when no seed collapses.",
            f"reward: mean over seeds of the per-seed mean gap to the BF16 median reward; passes when "
            f">= -{c.reward_gap_tolerance:g}.",
            "mismatch (sampler vs trainer k3 KL per token) and final held-out accuracy: reported, not judged.",
        ]


# --------------------------------------------------------------------------- spikes


def detect_spikes(
    grad_norm: np.ndarray, steps: np.ndarray, criteria: StabilityCriteria = StabilityCriteria()
) -> tuple[np.ndarray, np.ndarray]:
    """(spike_mask, severe_mask), bool [T], for a pre-clip grad norm series.

    Index t is a spike iff steps[t] >= warmup_steps and grad_norm[t] > spike_factor x the
    median of the previous up-to-`window` values; severe uses severe_factor. Severe spikes
    are also spikes (severe_mask implies spike_mask).
    NaN handling: non-finite values are never spikes (they are collapses, `detect_collapse`)
    and are left out of the window's median; a window without any finite value flags nothing.
    Raw values are in the window, earlier spikes included (the median is robust to them).
    """
    g = np.asarray(grad_norm, dtype=np.float64)
    steps = np.asarray(steps)
    if g.shape != steps.shape or g.ndim != 1:
        raise ValueError(f"grad_norm {g.shape} and steps {steps.shape} must be equal 1-D shapes")
    w = criteria.window
    finite = np.isfinite(g)
    x = np.where(finite, g, np.nan)
    padded = np.concatenate([np.full(w, np.nan), x])
    windows = np.lib.stride_tricks.sliding_window_view(padded, w)[: g.size]  # row t: x[t-w:t]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows -> NaN median
        median = np.nanmedian(windows, axis=1) if g.size else np.zeros(0)
    eligible = (steps >= criteria.warmup_steps) & finite & np.isfinite(median)
    with np.errstate(invalid="ignore"):
        spike = eligible & (x > criteria.spike_factor * median)
        severe = eligible & (x > criteria.severe_factor * median)
    return spike, severe


def spikes_per_100_steps(spike_mask: np.ndarray, steps: np.ndarray, criteria: StabilityCriteria = StabilityCriteria()) -> float:
    """Spikes per 100 steps at or after the warm-up (the steps where spikes are detected).

    NaN when the run has no step past the warm-up. Pass `severe_mask` for the severe rate.
    """
    n = int(np.count_nonzero(np.asarray(steps) >= criteria.warmup_steps))
    return float("nan") if n == 0 else 100.0 * int(np.count_nonzero(spike_mask)) / n


# --------------------------------------------------------------------------- collapse


@dataclasses.dataclass(frozen=True)
class CollapseResult:
    """The earliest collapse event of a run, if any.

    early_median: the grad-norm reference of the 100x criterion (NaN when the run logged no
    finite grad norm before `warmup_steps`, in which case that criterion is not checked and
    `note` says so). note: anything the verdict does not capture (e.g. a reward drop too close
    to the end of the run to be confirmed).
    """

    collapsed: bool
    reason: str | None
    step: int | None
    early_median: float = float("nan")
    note: str | None = None
    reward_drop_unconfirmed: bool = False  # the reward fell too close to the end to confirm (see note)


def _reward_collapse(steps: np.ndarray, reward: np.ndarray, c: StabilityCriteria) -> tuple[int | None, str | None, str | None]:
    """(step, reason, note) of the first unrecovered reward drop; non-finite rewards skipped."""
    ok = np.isfinite(reward)
    s, r = steps[ok], reward[ok]
    best = np.maximum.accumulate(r) if r.size else r
    i = 0
    while i < r.size:
        threshold = best[i] - c.reward_drop
        if r[i] >= threshold:
            i += 1
            continue
        # While below the threshold the running best cannot move (r < best), so the
        # threshold is fixed until the first j with r[j] >= threshold.
        j = i + 1
        while j < r.size and r[j] < threshold:
            j += 1
        if j < r.size and s[j] - s[i] <= c.recovery_steps:
            i = j  # recovered in time
            continue
        if j == r.size and s[-1] - s[i] < c.recovery_steps:
            note = (f"reward fell to {r[i]:.3g} (best {best[i]:.3g}) at step {int(s[i])} and had not recovered "
                    f"by the last step {int(s[-1])}: fewer than {c.recovery_steps} steps, so not confirmed")
            return None, None, note
        reason = (f"reward fell to {r[i]:.3g}, more than {c.reward_drop:g} below its running best {best[i]:.3g}, "
                  f"at step {int(s[i])} and did not recover within {c.recovery_steps} steps")
        return int(s[i]), reason, None
    return None, None, None


def detect_collapse(
    steps: np.ndarray,
    grad_norm: np.ndarray,
    reward: np.ndarray,
    criteria: StabilityCriteria = StabilityCriteria(),
    *,
    other_metrics: Mapping[str, np.ndarray] | None = None,
    present: Mapping[str, np.ndarray] | None = None,
    nonfinite_flag: np.ndarray | None = None,
) -> CollapseResult:
    """Apply RL.md's three collapse conditions; return the earliest event.

    steps, grad_norm (pre-clip global), reward (reward/mean): [T] aligned arrays; a NaN in
    grad_norm or reward counts as a non-finite value (a missing grad norm is not a healthy one).
    other_metrics: more [T] series to scan for non-finite values; `present[key]` (bool [T]),
    when given, restricts the scan to the steps where the key was logged, so an optional
    metric's "not logged" NaN is not a collapse. nonfinite_flag: the trainer's own bool [T]
    `nonfinite` flag; True anywhere is a collapse.
    """
    c = criteria
    steps = np.asarray(steps)
    g = np.asarray(grad_norm, dtype=np.float64)
    r = np.asarray(reward, dtype=np.float64)
    events: list[tuple[int, str]] = []

    def first_bad(name: str, values: np.ndarray, mask: np.ndarray | None) -> None:
        bad = ~np.isfinite(values)
        if mask is not None:
            bad &= mask
        if bad.any():
            i = int(np.argmax(bad))
            events.append((int(steps[i]), f"non-finite {name} ({values[i]}) at step {int(steps[i])}"))

    first_bad("grad_norm/global", g, None)
    first_bad("reward/mean", r, None)
    for key, values in (other_metrics or {}).items():
        first_bad(key, np.asarray(values, dtype=np.float64), None if present is None else present.get(key))
    if nonfinite_flag is not None and np.any(nonfinite_flag):
        i = int(np.argmax(np.asarray(nonfinite_flag, dtype=bool)))
        events.append((int(steps[i]), f"trainer flagged a non-finite value (nonfinite=true) at step {int(steps[i])}"))

    note = None
    early = g[(steps < c.warmup_steps) & np.isfinite(g)]
    early_median = float(np.median(early)) if early.size else float("nan")
    if np.isfinite(early_median):
        with np.errstate(invalid="ignore"):
            big = np.isfinite(g) & (g > c.collapse_grad_factor * early_median)
        if big.any():
            i = int(np.argmax(big))
            events.append((int(steps[i]), f"grad norm {g[i]:.3g} > {c.collapse_grad_factor:g}x the early median "
                                          f"{early_median:.3g} at step {int(steps[i])}"))
    else:
        note = f"no finite grad norm before step {c.warmup_steps}: the {c.collapse_grad_factor:g}x criterion was not checked"

    reward_step, reward_reason, reward_note = _reward_collapse(steps, r, c)
    if reward_step is not None:
        events.append((reward_step, reward_reason))
    note = "; ".join(n for n in (note, reward_note) if n) or None

    unconfirmed = reward_note is not None
    if not events:
        return CollapseResult(False, None, None, early_median, note, unconfirmed)
    step, reason = min(events, key=lambda e: e[0])
    return CollapseResult(True, reason, step, early_median, note, unconfirmed)


# --------------------------------------------------------------------------- reward and statistics


Series = tuple[np.ndarray, np.ndarray]  # (steps [T], values [T])


@dataclasses.dataclass(frozen=True)
class RewardGap:
    """per_seed[seed]: mean over the run of (reward - BF16 median reward); mean: over seeds."""

    per_seed: Mapping[int, float]
    mean: float


def reward_gap_to_reference(
    reward_by_seed: Mapping[int, Series], reference_reward_by_seed: Mapping[int, Series]
) -> RewardGap:
    """RL.md "reward tracking": mean gap to the BF16 median reward over the run.

    The reference curve is the median over reference seeds at each step (seeds that did not
    log a step, or logged a non-finite reward there, are left out of that step's median). A
    seed's gap is the mean of reward - reference over the steps both have finite values for
    (NaN if none); `mean` averages the finite per-seed gaps.
    """
    ref_steps = np.unique(np.concatenate([np.asarray(s) for s, _ in reference_reward_by_seed.values()])) \
        if reference_reward_by_seed else np.zeros(0, np.int64)
    ref = np.full((len(reference_reward_by_seed), ref_steps.size), np.nan)
    for i, (s, v) in enumerate(reference_reward_by_seed.values()):
        v = np.asarray(v, dtype=np.float64)
        ref[i, np.searchsorted(ref_steps, s)] = np.where(np.isfinite(v), v, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref_median = np.nanmedian(ref, axis=0) if ref.size else np.zeros(0)
    per_seed: dict[int, float] = {}
    for seed, (s, v) in reward_by_seed.items():
        s, v = np.asarray(s), np.asarray(v, dtype=np.float64)
        idx = np.searchsorted(ref_steps, s)
        idx_ok = idx < ref_steps.size
        common = idx_ok.copy()
        common[idx_ok] = ref_steps[idx[idx_ok]] == s[idx_ok]
        gap = v[common] - ref_median[idx[common]]
        gap = gap[np.isfinite(gap)]
        per_seed[seed] = float(gap.mean()) if gap.size else float("nan")
    gaps = np.array([x for x in per_seed.values() if np.isfinite(x)])
    return RewardGap(per_seed=per_seed, mean=float(gaps.mean()) if gaps.size else float("nan"))


@dataclasses.dataclass(frozen=True)
class BootstrapCI:
    """Percentile bootstrap interval of the mean over seeds; degenerate with one seed."""

    mean: float
    low: float
    high: float
    n: int
    ci: float
    degenerate: bool
    note: str | None = None


def bootstrap_ci(values, n_boot: int = 10_000, ci: float = 0.95, seed: int = 0) -> BootstrapCI:
    """Percentile bootstrap CI of the mean of `values` (one per seed), RL.md "reward tracking".

    Values must be finite (drop missing seeds first and say so). With one value there is
    nothing to resample: the interval is [value, value] and `degenerate`/`note` say so.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"bootstrap_ci needs finite values, got {x}")
    if not 0.0 < ci < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < {ci=} < 1 and {n_boot=} >= 1")
    mean = float(x.mean())
    if x.size == 1:
        return BootstrapCI(mean, mean, mean, 1, ci, True, "one seed: no confidence interval (degenerate)")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    alpha = (1.0 - ci) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return BootstrapCI(mean, float(low), float(high), int(x.size), ci, False)


@dataclasses.dataclass(frozen=True)
class MismatchSummary:
    """Trainer/sampler mismatch over a run (RL.md "Metrics": mismatch; "Stability criteria").

    kl_k3 and kl_k1: mean over steps of the per-token KL; max_abs_logp_diff: the largest per-step
    max |delta logp|; routing_flip: mean routing-flip rate. NaN when the metric was not logged.
    """

    kl_k3: float
    kl_k1: float
    max_abs_logp_diff: float
    routing_flip: float


def _finite(metrics: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    v = np.asarray(metrics[key], dtype=np.float64) if key in metrics else np.zeros(0)
    return v[np.isfinite(v)]


def mismatch_summary(metrics: Mapping[str, np.ndarray]) -> MismatchSummary:
    """Summarise one run's mismatch metrics (finite logged values only)."""
    def agg(key: str, fn) -> float:
        v = _finite(metrics, key)
        return float(fn(v)) if v.size else float("nan")

    return MismatchSummary(
        kl_k3=agg("mismatch/kl_k3", np.mean),
        kl_k1=agg("mismatch/kl_k1", np.mean),
        max_abs_logp_diff=agg("mismatch/max_abs_logp_diff", np.max),
        routing_flip=agg("mismatch/routing_flip", np.mean),
    )


# --------------------------------------------------------------------------- verdicts


@dataclasses.dataclass(frozen=True)
class CriterionResult:
    """passed is None when the criterion could not be evaluated (e.g. no BF16 reference)."""

    name: str
    passed: bool | None
    value: str
    threshold: str


@dataclasses.dataclass(frozen=True)
class ArmVerdict:
    """Pass/fail of the spike, collapse and reward criteria; `passed` is False if any failed,
    None if none failed but one could not be evaluated, True if all passed."""

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


def verdict(arm_summary: ArmSummary, criteria: StabilityCriteria = StabilityCriteria()) -> ArmVerdict:
    """Judge one arm against the declared thresholds (see `StabilityCriteria`)."""
    s, c = arm_summary, criteria
    rates = np.array([x.spikes_per_100 for x in s.seeds])
    n_severe = sum(len(x.severe_steps) for x in s.seeds)
    max_rate = float(np.nanmax(rates)) if np.isfinite(rates).any() else float("nan")
    if np.isnan(max_rate):
        spike = CriterionResult("spike", None, "no step past the warm-up", "")
    else:
        spike = CriterionResult(
            "spike", bool(max_rate <= c.max_spikes_per_100 and n_severe <= c.max_severe_spikes),
            f"max {max_rate:.2f}/100 steps over seeds; {n_severe} severe",
            f"<= {c.max_spikes_per_100:g}/100 per seed; <= {c.max_severe_spikes} severe",
        )
    collapsed = [x for x in s.seeds if x.collapse.collapsed]
    collapse = CriterionResult(
        "collapse", not collapsed,
        "none" if not collapsed else "; ".join(f"seed{x.seed}: {x.collapse.reason}" for x in collapsed),
        "no seed collapses",
    )
    if not s.has_reference or not np.isfinite(s.reward_gap_mean):
        reward = CriterionResult("reward", None, "no BF16 reference" if not s.has_reference else "no common steps",
                                 f">= -{c.reward_gap_tolerance:g}")
    else:
        reward = CriterionResult("reward", bool(s.reward_gap_mean >= -c.reward_gap_tolerance),
                                 f"{s.reward_gap_mean:+.3f}", f">= -{c.reward_gap_tolerance:g}")
    return ArmVerdict(arm=s.arm, spike=spike, collapse=collapse, reward=reward)


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    """RL.md's claim status: reproduced is None when it cannot be decided (missing arms or
    criteria that could not be evaluated). `details[arm]` explains each arm's part."""

    reproduced: bool | None
    explanation: str
    details: Mapping[str, str]


def claim_reproduced(verdicts: Mapping[str, ArmVerdict]) -> ClaimResult:
    """The full recipe passes spike, collapse and reward; each leave-one-out arm
    (full-dq, full-46, full-hp) fails at least one of them (RL.md "Stability criteria")."""
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
                             None: "no criterion failed, but not every criterion could be evaluated"}[ok]
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
            details[arm] = "no criterion failed, but not every criterion could be evaluated"
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
