"""Detectors of docs/rl.md "Stability criteria": spikes, collapse, and each seed's power.

They work on plain arrays of step *numbers* (the `step` key), not line indices, and know
nothing of files or verdicts: `fp4rl.analysis.summary` feeds them a loaded run, and
`fp4rl.analysis.verdicts` turns their results into PASS / FAIL / UNDECIDED.

A grad-norm *measurement* is one pre-clip global grad norm: per non-empty mini-batch update
(updates.jsonl), or per step for a seed logged without updates.jsonl. The spike window is the
previous `window` finite measurements. Spikes are counted in steps: a step spikes when any of its
updates does (the updates of one step share their rollouts, so their spikes cluster).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping

import numpy as np

from fp4rl.analysis.criteria import StabilityCriteria

# --------------------------------------------------------------------------- spikes


def detect_spikes(
    grad_norm: np.ndarray, steps: np.ndarray, criteria: StabilityCriteria = StabilityCriteria()
) -> tuple[np.ndarray, np.ndarray]:
    """(spike_mask, severe_mask), bool [M], for a series of pre-clip grad norm measurements.

    `steps[m]` is the step of measurement m (repeated when a step has several updates).
    Measurement m is a spike iff steps[m] >= warmup_steps and grad_norm[m] > spike_factor x
    the median of the previous up-to-`window` finite measurements; severe uses
    severe_factor. Severe spikes are also spikes (severe_mask implies spike_mask).
    Non-finite values are never spikes (they are collapses, `detect_collapse`) and are not in
    any window; a measurement with no finite one before it flags nothing. Raw values are in
    the window, earlier spikes included (the median is robust to them).

    Why a short window (the default 10 measurements, 5 steps at 2 updates per step): the
    baseline must follow the grad norm's trend, which keeps moving over an RL run (it rises
    4x over the first 20 steps on the arithmetic task). A running median lags by about half
    its window, so a trend with growth rate r per measurement inflates the ratio by about
    r^(window/2): over 50 measurements the early rise alone put values at 3x their median (16
    of 26 spikes of results/matrix_h200 were such, 1.6-2.8x the median of the previous 10),
    over 10 a smooth trend would have to grow 3x within ~5 measurements, which is a jump, not
    a trend. The price is a noisier baseline: the median of 10 log-normal values with the
    log-sd ~0.3 of those runs is within ~+-12% of the level, small against the factor 3. A
    causal detrended median (residuals from a robust line through a long window) is the
    alternative; it extrapolates the slope past a bend of the trend (a rise, then a plateau),
    raising the baseline where the rise ends, and its slope is one more noisy estimate.
    """
    g = np.asarray(grad_norm, dtype=np.float64)
    steps = np.asarray(steps)
    if g.shape != steps.shape or g.ndim != 1:
        raise ValueError(f"grad_norm {g.shape} and steps {steps.shape} must be equal 1-D shapes")
    w = criteria.window
    finite = np.isfinite(g)
    compact = g[finite]
    # Row k of `windows` is compact[k-w:k] (NaN-padded at the start): the up-to-w finite values
    # before the k-th finite one. A measurement's window is the row of its count of finite predecessors.
    padded = np.concatenate([np.full(w, np.nan), compact])
    windows = np.lib.stride_tricks.sliding_window_view(padded, w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows -> NaN median
        median_by_count = np.nanmedian(windows, axis=1)
    finite_before = np.cumsum(finite) - finite
    median = median_by_count[finite_before]
    eligible = (steps >= criteria.warmup_steps) & finite & np.isfinite(median)
    with np.errstate(invalid="ignore"):
        spike = eligible & (g > criteria.spike_factor * median)
        severe = eligible & (g > criteria.severe_factor * median)
    return spike, severe


def judged_step_count(steps: np.ndarray, criteria: StabilityCriteria = StabilityCriteria()) -> int:
    """Distinct steps >= warmup_steps among the measurements' steps (the judged steps)."""
    s = np.asarray(steps)
    return int(np.unique(s[s >= criteria.warmup_steps]).size)


def spiking_step_count(spike_mask: np.ndarray, steps: np.ndarray) -> int:
    """Distinct steps with at least one spiking measurement (a step spikes when any update does)."""
    return int(np.unique(np.asarray(steps)[np.asarray(spike_mask, bool)]).size)


def spikes_per_100_steps(spike_mask: np.ndarray, steps: np.ndarray, criteria: StabilityCriteria = StabilityCriteria()) -> float:
    """Spiking steps per 100 judged steps: distinct steps with a spike / distinct measurement
    steps >= warmup_steps x 100.

    `steps` are the measurements' steps (as passed to `detect_spikes`). NaN when no step is
    judged. Pass `severe_mask` for the severe rate.
    """
    n = judged_step_count(steps, criteria)
    return float("nan") if n == 0 else 100.0 * spiking_step_count(spike_mask, steps) / n


@dataclasses.dataclass(frozen=True)
class SpikeResult:
    """Every spike of one seed; a step repeats in `spike_steps` when several of its updates spike.

    spike_updates / severe_updates: the update index within the step of each spike (-1 for a
    per-step measurement). judged_steps / judged_updates: distinct steps / measurements at
    steps >= warmup_steps. per_update: measurements are updates (False: per-step means).
    Counts and rates are in steps (`spiking_steps`, `per_100_steps`): a step spikes when any
    of its updates does. `per_100_updates` counts every spiking update, for reference.
    """

    spike_steps: tuple[int, ...]
    spike_updates: tuple[int, ...]
    severe_steps: tuple[int, ...]
    severe_updates: tuple[int, ...]
    judged_steps: int
    judged_updates: int
    per_update: bool

    @staticmethod
    def _rate(count: int, n: int) -> float:
        return float("nan") if n == 0 else 100.0 * count / n

    @property
    def spiking_steps(self) -> int:
        """Distinct steps with a spike."""
        return len(set(self.spike_steps))

    @property
    def severe_spiking_steps(self) -> int:
        """Distinct steps with a severe spike."""
        return len(set(self.severe_steps))

    @property
    def per_100_steps(self) -> float:
        return self._rate(self.spiking_steps, self.judged_steps)

    @property
    def severe_per_100_steps(self) -> float:
        return self._rate(self.severe_spiking_steps, self.judged_steps)

    @property
    def per_100_updates(self) -> float:
        return self._rate(len(self.spike_steps), self.judged_updates)


def find_spikes(
    steps: np.ndarray, grad_norm: np.ndarray, update: np.ndarray | None = None,
    criteria: StabilityCriteria = StabilityCriteria(),
) -> SpikeResult:
    """`detect_spikes` on one seed's measurements, with their counts. `update` (int [M]): each
    measurement's update index within its step; None for per-step measurements."""
    steps = np.asarray(steps)
    idx = np.full(steps.shape, -1, np.int64) if update is None else np.asarray(update, np.int64)
    spike, severe = detect_spikes(grad_norm, steps, criteria)
    return SpikeResult(
        spike_steps=tuple(int(s) for s in steps[spike]), spike_updates=tuple(int(u) for u in idx[spike]),
        severe_steps=tuple(int(s) for s in steps[severe]), severe_updates=tuple(int(u) for u in idx[severe]),
        judged_steps=judged_step_count(steps, criteria),
        judged_updates=int(np.count_nonzero(steps >= criteria.warmup_steps)),
        per_update=update is not None,
    )


# --------------------------------------------------------------------------- collapse


@dataclasses.dataclass(frozen=True)
class CollapseResult:
    """The earliest collapse event of a run, if any.

    early_median: the grad-norm reference of the 100x criterion (NaN when it could not be
    formed, in which case that criterion is not checked and `note` says so). note: anything
    the verdict does not capture (e.g. a reward drop too close to the end of the run to be
    confirmed). kind: the earliest event's rule: "non-finite", "grad norm" (> collapse_grad_factor
    x the early median) or "reward".
    """

    collapsed: bool
    reason: str | None
    step: int | None
    early_median: float = float("nan")
    note: str | None = None
    reward_drop_unconfirmed: bool = False  # the reward fell too close to the end to confirm (see note)
    kind: str | None = None


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
    reward: np.ndarray | None,
    criteria: StabilityCriteria = StabilityCriteria(),
    *,
    grad_steps: np.ndarray | None = None,
    reward_key: str = "population/reward_mean",
    grad_key: str = "grad_norm/global",
    other_metrics: Mapping[str, np.ndarray] | None = None,
    present: Mapping[str, np.ndarray] | None = None,
    nonfinite_flag: np.ndarray | None = None,
    update_metrics: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> CollapseResult:
    """Apply docs/rl.md's three collapse conditions; return the earliest event.

    steps: [T] step numbers; reward: [T] population reward (None when not logged: the reward
    rule is then not checked and `note` says so; a NaN in it is a non-finite value).
    grad_norm: pre-clip grad norm measurements at `grad_steps` ([M]; default: `steps`, one per
    step; `grad_key` names them in reasons); a NaN is a non-finite value (a missing grad norm
    is not a healthy one).
    other_metrics: more [T] series to scan for non-finite values; `present[key]` (bool [T]),
    when given, restricts the scan to the steps where the key was logged, so an optional
    metric's "not logged" NaN is not a collapse (`present[reward_key]` also masks `reward`).
    nonfinite_flag: the trainer's own bool [T] `nonfinite` flag; True anywhere is a collapse.
    update_metrics: {name: (steps [U], values [U])} per-update series (updates.jsonl) scanned
    the same way; a bool series is a flag (True is a collapse).
    """
    c = criteria
    steps = np.asarray(steps)
    g = np.asarray(grad_norm, dtype=np.float64)
    g_steps = steps if grad_steps is None else np.asarray(grad_steps)
    events: list[tuple[int, str, str]] = []  # (step, reason, kind)

    def first_bad(name: str, values: np.ndarray, at: np.ndarray, mask: np.ndarray | None) -> None:
        values = np.asarray(values)
        flag = values.dtype == bool
        bad = values.copy() if flag else ~np.isfinite(values.astype(np.float64))
        if mask is not None:
            bad &= mask
        if bad.any():
            i = int(np.argmax(bad))
            what = f"{name} flagged" if flag else f"non-finite {name} ({values[i]})"
            events.append((int(at[i]), f"{what} at step {int(at[i])}", "non-finite"))

    mask_of = (lambda key: None) if present is None else present.get  # noqa: E731
    first_bad(grad_key, g, g_steps, None)
    r = None if reward is None else np.asarray(reward, dtype=np.float64)
    if r is not None:
        first_bad(reward_key, r, steps, mask_of(reward_key))
    for key, values in (other_metrics or {}).items():
        first_bad(key, np.asarray(values, dtype=np.float64), steps, mask_of(key))
    for key, (at, values) in (update_metrics or {}).items():
        first_bad(key, values, np.asarray(at), None)
    if nonfinite_flag is not None and np.any(nonfinite_flag):
        i = int(np.argmax(np.asarray(nonfinite_flag, dtype=bool)))
        events.append((int(steps[i]), f"trainer flagged a non-finite value (nonfinite=true) at step {int(steps[i])}",
                       "non-finite"))

    notes = []
    early = g[(g_steps < c.warmup_steps) & np.isfinite(g)]
    early_median = float(np.median(early)) if early.size else float("nan")
    if np.isfinite(early_median) and early_median > c.idle_grad_norm:
        with np.errstate(invalid="ignore"):
            big = np.isfinite(g) & (g > c.collapse_grad_factor * early_median)
        if big.any():
            i = int(np.argmax(big))
            events.append((int(g_steps[i]), f"grad norm {g[i]:.3g} > {c.collapse_grad_factor:g}x the early median "
                                            f"{early_median:.3g} at step {int(g_steps[i])}", "grad norm"))
    else:
        why = "no finite grad norm" if not np.isfinite(early_median) else f"early median {early_median:.3g} ~ 0"
        notes.append(f"{why} before step {c.warmup_steps}: the {c.collapse_grad_factor:g}x criterion was not checked")
        early_median = float("nan")

    unconfirmed = False
    if r is None:
        notes.append(f"{reward_key} not logged: the reward rule was not checked")
    else:
        reward_step, reward_reason, reward_note = _reward_collapse(steps, r, c)
        if reward_step is not None:
            events.append((reward_step, reward_reason, "reward"))
        if reward_note:
            notes.append(reward_note)
            unconfirmed = True
    note = "; ".join(notes) or None

    if not events:
        return CollapseResult(False, None, None, early_median, note, unconfirmed)
    step, reason, kind = min(events, key=lambda e: e[0])
    return CollapseResult(True, reason, step, early_median, note, unconfirmed, kind)


# --------------------------------------------------------------------------- power


@dataclasses.dataclass(frozen=True)
class SeedPower:
    """Whether one seed carries enough signal to be judged (see `StabilityCriteria`, power).

    judged_steps / judged_updates: distinct steps / measurements at steps >= warmup_steps.
    idle_steps of steps_after_warmup: steps >= warmup_steps that applied no update or had every
    grad norm ~0. degenerate / underpowered: why the seed is not judged (None: it is).
    """

    judged_steps: int
    judged_updates: int
    steps_after_warmup: int
    idle_steps: int
    degenerate: str | None
    underpowered: str | None

    @property
    def reason(self) -> str | None:
        return "; ".join(r for r in (self.degenerate, self.underpowered) if r) or None

    @property
    def judged(self) -> bool:
        return self.reason is None


def seed_power(
    steps: np.ndarray, idle: np.ndarray, measurement_steps: np.ndarray, accuracy: np.ndarray | None,
    criteria: StabilityCriteria = StabilityCriteria(),
) -> SeedPower:
    """Judge one seed's power.

    steps, idle: [T] every logged step and whether it was idle (no update applied, or every
    grad norm <= idle_grad_norm). measurement_steps: [M] the step of each grad-norm
    measurement. accuracy: the population accuracy at the steps it was logged (None: not
    logged, so that check is skipped).
    """
    c = criteria
    steps, idle = np.asarray(steps), np.asarray(idle, bool)
    ms = np.asarray(measurement_steps)
    after = steps >= c.warmup_steps
    n_after, n_idle = int(after.sum()), int((idle & after).sum())
    judged_steps = judged_step_count(ms, c)
    judged_updates = int(np.count_nonzero(ms >= c.warmup_steps))
    degenerate = []
    if n_after and n_idle > c.max_idle_frac * n_after:
        degenerate.append(f"{n_idle} of {n_after} steps >= {c.warmup_steps} applied no update or had grad norm "
                          f"<= {c.idle_grad_norm:g} (every group dropped: no gradient signal)")
    if accuracy is not None:
        a = np.asarray(accuracy, np.float64)
        a = a[np.isfinite(a)]
        if a.size and np.all(a <= c.saturated_accuracy):
            degenerate.append(f"population accuracy <= {c.saturated_accuracy:g} at every step (no learning signal)")
        elif a.size and np.all(a >= 1.0 - c.saturated_accuracy):
            degenerate.append(f"population accuracy >= {1 - c.saturated_accuracy:g} at every step (no learning signal)")
    underpowered = None
    if judged_steps < c.min_judged_steps:
        underpowered = f"{judged_steps} judged steps, {c.min_judged_steps} needed"
    return SeedPower(judged_steps, judged_updates, n_after, n_idle, "; ".join(degenerate) or None, underpowered)
