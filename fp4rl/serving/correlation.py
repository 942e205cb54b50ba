"""Agreement between deployments: correlations of per-prompt scores and means, with bootstrap CIs.

Scores are paired by prompt (every deployment answers the same prompts), so an interval resamples
prompts with replacement and recomputes the statistic on the pairs drawn (percentile bootstrap).
A correlation is undefined (NaN) when either side is constant; a replicate that draws a
constant side is left out of the interval, and the share of such replicates is reported
(`undefined_frac`); with more than half undefined the interval is NaN too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as scipy_stats


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap interval over n paired prompts."""

    value: float
    low: float
    high: float
    n: int
    ci: float
    undefined_frac: float = 0.0

    def text(self, digits: int = 3) -> str:
        if np.isnan(self.value):
            return "undefined (constant scores)"
        interval = "n/a" if np.isnan(self.low) else f"{self.low:.{digits}f}, {self.high:.{digits}f}"
        return f"{self.value:.{digits}f} [{interval}]"


def _check(n_boot: int, ci: float) -> None:
    if n_boot < 1 or not 0.0 < ci < 1.0:
        raise ValueError(f"need n_boot={n_boot} >= 1 and 0 < ci={ci} < 1")


def _pearson_rows(x_RxN: np.ndarray, y_RxN: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair; NaN where a row is constant."""
    x = x_RxN - x_RxN.mean(axis=1, keepdims=True)
    y = y_RxN - y_RxN.mean(axis=1, keepdims=True)
    sxx, syy = np.sum(x * x, axis=1), np.sum(y * y, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.sum(x * y, axis=1) / np.sqrt(sxx * syy)
    r[(sxx == 0) | (syy == 0)] = np.nan
    return np.clip(r, -1.0, 1.0)


def _spearman_rows(x_RxN: np.ndarray, y_RxN: np.ndarray) -> np.ndarray:
    """Spearman rho: Pearson r of the average ranks (ties share their mean rank)."""
    return _pearson_rows(scipy_stats.rankdata(x_RxN, axis=1), scipy_stats.rankdata(y_RxN, axis=1))


METHODS = {"pearson": _pearson_rows, "spearman": _spearman_rows}


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"need two paired 1-D score arrays of >= 2 prompts, got shapes {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("scores must be finite")
    return x, y


def correlation(x, y, method: str) -> float:
    x, y = _paired(x, y)
    return float(METHODS[method](x[None], y[None])[0])


def _percentiles(replicates: np.ndarray, ci: float) -> tuple[float, float, float]:
    finite = replicates[np.isfinite(replicates)]
    undefined = 1.0 - finite.size / replicates.size
    if undefined > 0.5:
        return np.nan, np.nan, undefined
    alpha = (1.0 - ci) / 2.0
    low, high = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(low), float(high), undefined


def bootstrap_correlation(x, y, method: str, n_boot: int = 2000, ci: float = 0.95, seed: int = 0) -> Interval:
    """`method` ("pearson" | "spearman") of the paired scores, with a bootstrap over prompts."""
    _check(n_boot, ci)
    if method not in METHODS:
        raise ValueError(f"method={method!r}; valid options: {tuple(METHODS)}")
    x, y = _paired(x, y)
    idx = np.random.default_rng(seed).integers(0, x.size, (n_boot, x.size))
    value = float(METHODS[method](x[None], y[None])[0])
    low, high, undefined = _percentiles(METHODS[method](x[idx], y[idx]), ci)
    return Interval(value, low, high, x.size, ci, undefined)


def bootstrap_mean(x, n_boot: int = 2000, ci: float = 0.95, seed: int = 0) -> Interval:
    """The mean of per-prompt scores (an accuracy), with a bootstrap over prompts. Samples of one
    prompt stay together, so the interval carries the prompt-to-prompt spread."""
    _check(n_boot, ci)
    x = np.asarray(x, np.float64)
    if x.ndim != 1 or x.size < 1:
        raise ValueError(f"need a 1-D array of >= 1 scores, got shape {x.shape}")
    idx = np.random.default_rng(seed).integers(0, x.size, (n_boot, x.size))
    low, high, _ = _percentiles(x[idx].mean(axis=1), ci)
    return Interval(float(x.mean()), low, high, x.size, ci)
