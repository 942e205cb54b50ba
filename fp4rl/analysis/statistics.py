"""Statistics of the reward and accuracy criteria (docs/rl.md "reward tracking") and mismatch.

- `reward_gap_to_reference`: each seed's population-reward gap to BF16's seed of the same number,
  per step (paired: seed k of every arm sees the same prompts);
- `reward_gap_ci`: a two-level bootstrap interval of the mean gap (seeds, then blocks of steps);
- `bootstrap_ci`: percentile bootstrap of a mean over seeds;
- `student_t_interval`: the t interval over seeds that every seed-level interval carries beside its
  bootstrap (with 2 seeds a bootstrap over seeds has 3 distinct resamples: its interval is the
  seeds' [min, max], far narrower than what 2 values can say);
- `accuracy_ci` / `accuracy_change_ci`: hierarchical bootstrap of held-out accuracy: seeds
  resampled with replacement, then each resampled seed's accuracy redrawn from its evaluation's
  Jeffreys posterior Beta(k + 1/2, n_eval - k + 1/2), so a few seeds evaluated on few problems get
  an interval that carries both errors;
- `mismatch_summary`: trainer/sampler mismatch over a run;
- `rate_difference`: an arm's spike rate minus BF16's with one-sided bounds at the seed level
  (seeds are the independent units: spikes cluster inside a seed), which the spike criterion
  judges against zero (more spikes than BF16) and against its non-inferiority margin.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import t as student_t

Series = tuple[np.ndarray, np.ndarray]  # (steps [T], values [T])


@dataclasses.dataclass(frozen=True)
class BootstrapCI:
    """A percentile bootstrap interval of a mean over seeds.

    kind: what the interval resamples: "seeds", "seeds+binomial", "binomial" (one seed),
    "seeds+steps", "steps" (one seed), or "none" (one value and nothing to resample:
    `degenerate`, low == high == mean). note: what the interval leaves out, in words.
    t_interval: (low, high) of the Student t interval over the seeds' values at the same level
    (`student_t_interval`); None with one seed.
    """

    mean: float
    low: float
    high: float
    n: int
    ci: float
    degenerate: bool
    note: str | None = None
    kind: str = "seeds"
    t_interval: tuple[float, float] | None = None

    @property
    def width(self) -> float:
        return self.high - self.low


@functools.lru_cache(maxsize=256)
def t_quantile(q: float, df: int) -> float:
    """Student t quantile, cached: the rule's simulation asks for the same few thousands of times."""
    return float(student_t.ppf(q, df))


def student_t_interval(values, ci: float = 0.95) -> tuple[float, float] | None:
    """The two-sided Student t interval of the mean of `values` (one per seed; n - 1 degrees of
    freedom): mean +- t_{(1+ci)/2, n-1} x sd / sqrt(n). None for fewer than 2 values.

    The seeds' values (a seed's mean reward gap, its final accuracy) already carry each
    seed's step-to-step or evaluation error, so their spread is the whole error of their mean."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError(f"student_t_interval needs finite values, got {x}")
    if x.size < 2:
        return None
    half = t_quantile((1.0 + ci) / 2.0, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return float(x.mean()) - half, float(x.mean()) + half


def _check(n_boot: int, ci: float) -> None:
    if not 0.0 < ci < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < {ci=} < 1 and {n_boot=} >= 1")


def _interval(replicates: np.ndarray, ci: float) -> tuple[float, float]:
    alpha = (1.0 - ci) / 2.0
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha])
    return float(low), float(high)


def bootstrap_ci(values, n_boot: int = 10_000, ci: float = 0.95, seed: int = 0) -> BootstrapCI:
    """Percentile bootstrap CI of the mean of `values` (one per seed).

    Values must be finite (drop missing seeds first and say so). With one value there is
    nothing to resample: the interval is [value, value] and `degenerate`/`note` say so.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"bootstrap_ci needs finite values, got {x}")
    _check(n_boot, ci)
    mean = float(x.mean())
    if x.size == 1:
        return BootstrapCI(mean, mean, mean, 1, ci, True, "one seed: no confidence interval (degenerate)", "none")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    return BootstrapCI(mean, *_interval(means, ci), int(x.size), ci, False, t_interval=student_t_interval(x, ci))


# --------------------------------------------------------------------------- accuracy


def _eval_sizes(p, n) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, np.float64).ravel()
    n = np.array([np.nan if v is None else v for v in n], np.float64).ravel() if n is not None else np.full(p.shape, np.nan)
    if p.size == 0 or p.shape != n.shape:
        raise ValueError(f"need one accuracy and one eval size (or None) per seed, got {p.shape} and {n.shape}")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"accuracies must be finite and in [0, 1], got {p}")
    if np.any(np.isfinite(n) & ((n < 1) | (n != np.round(n)))):
        raise ValueError(f"eval sizes must be positive integers, got {n}")
    return p, n


def _redraw(rng, p: np.ndarray, n: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """[B, S]: the accuracy of resampled seed idx[b, s], redrawn where n is known from
    Beta(k + 1/2, n - k + 1/2) with k = p * n correct (the Jeffreys posterior of the accuracy), kept
    at p where it is not. Unlike a Binomial(n, p) redraw, this does not claim certainty when a
    seed solved none or all of its problems (0 of 8 is not evidence of an accuracy of exactly 0)."""
    pi, ni = p[idx], n[idx]
    known = np.isfinite(ni)
    out = pi.copy()
    k = pi[known] * ni[known]
    out[known] = rng.beta(k + 0.5, ni[known] - k + 0.5)
    return out


def _hierarchical(point: np.ndarray, draw, sizes: np.ndarray, n_boot: int, ci: float, seed: int, what: str) -> BootstrapCI:
    """The two-level bootstrap: seeds resampled, then `draw(rng, idx)` redraws each one's value."""
    _check(n_boot, ci)
    s = point.size
    mean = float(point.mean())
    known = np.isfinite(sizes).all(axis=0)
    if s == 1 and not known.any():
        return BootstrapCI(mean, mean, mean, 1, ci, True, f"one seed and no eval/n: no interval for {what} (degenerate)", "none")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, s, size=(n_boot, s))
    replicates = draw(rng, idx).mean(axis=1) if known.any() else point[idx].mean(axis=1)
    notes = []
    if s == 1:
        kind = "binomial"
        notes.append("one seed: the interval is the evaluation's binomial error only (no seed-to-seed spread)")
    elif known.all():
        kind = "seeds+binomial"
    elif known.any():
        kind = "seeds+binomial"
        notes.append(f"{int((~known).sum())} of {s} seeds logged no eval/n: their evaluation error is not included")
    else:
        kind = "seeds"
        notes.append("no eval/n logged: the interval is over seeds only (evaluation error not included)")
    return BootstrapCI(mean, *_interval(replicates, ci), s, ci, False, "; ".join(notes) or None, kind,
                       student_t_interval(point, ci))


def accuracy_ci(p, n=None, n_boot: int = 10_000, ci: float = 0.95, seed: int = 0) -> BootstrapCI:
    """Hierarchical bootstrap CI of the mean held-out accuracy over seeds.

    p: each seed's accuracy; n: each seed's number of evaluated problems (`eval/n`; None for a
    seed, or for all, when unknown: that seed's value is then taken as exact).
    """
    p, n = _eval_sizes(p, n)
    return _hierarchical(p, lambda rng, idx: _redraw(rng, p, n, idx), n[None], n_boot, ci, seed, "accuracy")


def accuracy_change_ci(p_first, n_first, p_last, n_last, n_boot: int = 10_000, ci: float = 0.95, seed: int = 0) -> BootstrapCI:
    """Hierarchical bootstrap CI of the mean change of accuracy from the first evaluation to the
    last (per seed: last - first). The two evaluations are redrawn independently, which
    overstates their error when they share problems and sampling keys (a conservative interval)."""
    pf, nf = _eval_sizes(p_first, n_first)
    pl, nl = _eval_sizes(p_last, n_last)
    if pf.shape != pl.shape:
        raise ValueError(f"first {pf.shape} and last {pl.shape} evaluations must cover the same seeds")
    draw = lambda rng, idx: _redraw(rng, pl, nl, idx) - _redraw(rng, pf, nf, idx)  # noqa: E731
    return _hierarchical(pl - pf, draw, np.stack([nf, nl]), n_boot, ci, seed, "the accuracy change")


# --------------------------------------------------------------------------- reward gap


@dataclasses.dataclass(frozen=True)
class RewardGap:
    """per_seed[seed]: mean over the run of (reward - BF16's reward of the same seed); mean: over
    seeds. series[seed]: the finite per-step gaps that mean is taken over. unpaired: the seeds
    with no BF16 seed of the same number (NaN gap, empty series)."""

    per_seed: Mapping[int, float]
    mean: float
    series: Mapping[int, np.ndarray] = dataclasses.field(default_factory=dict)
    unpaired: tuple[int, ...] = ()


def paired_gap_series(steps, values, reference_steps, reference_values) -> np.ndarray:
    """values - reference_values at the steps both logged with finite values, in step order."""
    s, v = np.asarray(steps), np.asarray(values, np.float64)
    rs, rv = np.asarray(reference_steps), np.asarray(reference_values, np.float64)
    _, i, j = np.intersect1d(s, rs, return_indices=True)  # first occurrence of each common step
    gap = v[i] - rv[j]
    return gap[np.isfinite(gap)]


def reward_gap_to_reference(
    reward_by_seed: Mapping[int, Series], reference_reward_by_seed: Mapping[int, Series]
) -> RewardGap:
    """docs/rl.md "reward tracking": mean gap to BF16's reward over the run, paired by seed.

    Seed k of every arm samples the same prompt stream, so seed k's gap is taken to BF16's seed
    k, step by step (`paired_gap_series`): the prompts' difficulty, which moves each seed's
    reward together in every arm, cancels. Against a median over BF16's seeds it would stay
    in every gap, with the sign of the seed (2 seeds of results/matrix_h200: every seed-0 gap
    >= 0, every seed-1 gap < 0). A seed's gap is the mean over the steps both logged with finite
    values (NaN if none, or if BF16 has no seed k: `unpaired`); `mean` averages the finite
    per-seed gaps.
    """
    per_seed: dict[int, float] = {}
    series: dict[int, np.ndarray] = {}
    unpaired = []
    for seed, (s, v) in reward_by_seed.items():
        if seed not in reference_reward_by_seed:
            unpaired.append(seed)
            series[seed] = np.zeros(0)
        else:
            series[seed] = paired_gap_series(s, v, *reference_reward_by_seed[seed])
        per_seed[seed] = float(series[seed].mean()) if series[seed].size else float("nan")
    gaps = np.array([x for x in per_seed.values() if np.isfinite(x)])
    return RewardGap(per_seed=per_seed, mean=float(gaps.mean()) if gaps.size else float("nan"), series=series,
                     unpaired=tuple(unpaired))


def _block_means(x: np.ndarray, block: int, n_boot: int, rng) -> np.ndarray:
    """[n_boot] moving-block bootstrap means of the series x (blocks of `block` steps)."""
    length = min(block, x.size)
    n_blocks = -(-x.size // length)
    csum = np.concatenate([[0.0], np.cumsum(x)])
    block_mean = (csum[length:] - csum[:-length]) / length  # one per start 0..T-length
    starts = rng.integers(0, block_mean.size, size=(n_boot, n_blocks))
    return block_mean[starts].mean(axis=1)


def reward_gap_ci(
    series_by_seed: Sequence[np.ndarray], block: int = 10, n_boot: int = 10_000, ci: float = 0.95, seed: int = 0
) -> BootstrapCI:
    """Two-level bootstrap CI of the mean over seeds of each seed's mean per-step gap.

    Seeds are resampled with replacement, and each resampled seed's mean is redrawn by a
    moving-block bootstrap of its per-step gaps (blocks of `block` consecutive steps: the gap
    is correlated from one step to the next). Every series must be non-empty and finite.
    """
    xs = [np.asarray(x, np.float64) for x in series_by_seed]
    if not xs or any(x.size == 0 or not np.all(np.isfinite(x)) for x in xs):
        raise ValueError("reward_gap_ci needs at least one seed, each with a non-empty finite gap series")
    _check(n_boot, ci)
    rng = np.random.default_rng(seed)
    point = np.array([x.mean() for x in xs])
    inner = np.stack([_block_means(x, block, n_boot, rng) for x in xs])  # [S, B]
    idx = rng.integers(0, len(xs), size=(n_boot, len(xs)))
    col = rng.integers(0, n_boot, size=(n_boot, len(xs)))
    replicates = inner[idx, col].mean(axis=1)
    one = len(xs) == 1
    note = "one seed: the interval is the step-to-step error only (no seed-to-seed spread)" if one else None
    return BootstrapCI(float(point.mean()), *_interval(replicates, ci), len(xs), ci, False, note,
                       "steps" if one else "seeds+steps", student_t_interval(point, ci))


# --------------------------------------------------------------------------- mismatch


@dataclasses.dataclass(frozen=True)
class MismatchSummary:
    """Trainer/sampler mismatch over a run (docs/rl.md "Metrics": mismatch; "Stability criteria").

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


@dataclasses.dataclass(frozen=True)
class RateDifference:
    """An arm's event rate (per judged step) minus the reference's, with one-sided bounds.

    difference: pooled rate of the arm minus pooled rate of the reference; low / high: the
    one-sided `level` lower and upper bounds (each alone a one-sided test at 1 - level); se: the
    standard error they use; df: the Student t degrees of freedom (seeds of both arms minus 2).
    Rates are per judged step, so `difference * 100` is events per 100 steps.
    """

    difference: float
    low: float
    high: float
    se: float
    df: int
    level: float


def _pooled_rate_variance(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """(pooled rate K/N, variance of it) over seeds of (events, judged steps).

    The variance is the cluster-robust (between-seed) one, m/(m-1) sum_i (k_i - p n_i)^2 / N^2:
    seeds are the independent units, and events cluster inside a seed (a seed that spikes once
    spikes again more often), which a binomial variance over pooled steps ignores. It is never
    taken below the binomial variance at the Jeffreys rate (K + 1/2) / (N + 1): with few events
    (or none) the between-seed spread is a poor estimate of the error, often zero."""
    k = np.array([c[0] for c in counts], np.float64)
    n = np.array([c[1] for c in counts], np.float64)
    if k.size < 2 or np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need >= 2 seeds with 0 <= events <= judged steps > 0, not {list(counts)}")
    total = n.sum()
    rate = k.sum() / total
    between = k.size / (k.size - 1) * float(np.sum((k - rate * n) ** 2)) / total**2
    jeffreys = (k.sum() + 0.5) / (total + 1.0)
    return float(rate), max(between, jeffreys * (1.0 - jeffreys) / total)


def rate_difference(counts: Sequence[tuple[int, int]], reference: Sequence[tuple[int, int]],
                    level: float = 0.95) -> RateDifference:
    """The arm's event rate minus the reference's at the seed level (`RateDifference`).

    counts / reference: (events, judged steps) per judged seed, each side at least 2 seeds.
    Bounds: difference -/+ t_{level, m + m_ref - 2} x sqrt(var + var_ref), the variances of
    `_pooled_rate_variance`. A one-sided test of "more events than the reference" rejects at
    1 - level when `low` > 0; non-inferiority within a margin d holds when `high` < d. The t
    quantile (not the normal's) widens the bounds where few seeds estimate the variance."""
    if not 0.5 < level < 1.0:
        raise ValueError(f"need 0.5 < {level=} < 1")
    rate, var = _pooled_rate_variance(counts)
    rate_ref, var_ref = _pooled_rate_variance(reference)
    df = len(counts) + len(reference) - 2
    se = math.sqrt(var + var_ref)
    half = t_quantile(level, df) * se
    d = rate - rate_ref
    return RateDifference(d, d - half, d + half, se, df, level)
