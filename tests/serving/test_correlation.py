"""Correlations and bootstrap intervals against scipy and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fp4rl.serving import correlation


def _scores(seed: int, n: int = 200):
    """Per-prompt accuracies of two related deployments: k/4 with many ties, as in serve_eval."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=n)
    return rng.binomial(4, p) / 4, rng.binomial(4, np.clip(p + rng.normal(0, 0.1, n), 0, 1)) / 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_point_estimates_match_scipy(seed):
    x, y = _scores(seed)
    assert correlation.correlation(x, y, "pearson") == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)
    assert correlation.correlation(x, y, "spearman") == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_hand_computed_values():
    x, y = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]
    assert correlation.correlation(x, y, "pearson") == pytest.approx(0.8)  # cov 1.0 / var 1.25
    assert correlation.correlation(x, y, "spearman") == pytest.approx(0.8)
    assert correlation.correlation(x, [9.0, 8.0, 7.0, 6.0], "spearman") == pytest.approx(-1.0)
    # Monotone but not linear: Spearman 1, Pearson below.
    assert correlation.correlation(x, np.exp(x), "spearman") == pytest.approx(1.0)
    assert correlation.correlation(x, np.exp(x), "pearson") < 0.95


def test_constant_scores_are_undefined():
    x = np.zeros(20)
    y = np.arange(20.0)
    interval = correlation.bootstrap_correlation(x, y, "pearson", n_boot=100)
    assert np.isnan(interval.value) and np.isnan(interval.low) and interval.undefined_frac == 1.0
    assert interval.text() == "undefined (constant scores)"
    # One nonzero score: most resamples miss it and are constant; the share is reported.
    x[3] = 1.0
    sparse = correlation.bootstrap_correlation(x, y, "spearman", n_boot=1000)
    assert np.isfinite(sparse.value)
    assert sparse.undefined_frac == pytest.approx((19 / 20) ** 20, abs=0.05)  # P(a resample misses prompt 3)


def test_bootstrap_intervals_cover_and_shrink():
    x, y = _scores(3, n=100)
    small = correlation.bootstrap_correlation(x, y, "pearson", n_boot=2000, seed=1)
    assert small.low < small.value < small.high and small.n == 100
    xl, yl = _scores(3, n=1600)
    large = correlation.bootstrap_correlation(xl, yl, "pearson", n_boot=2000, seed=1)
    # The width scales like 1/sqrt(n): 16x the prompts, about a quarter of the width.
    assert 0.15 < (large.high - large.low) / (small.high - small.low) < 0.4
    # The percentile interval of a mean of n draws has about the normal half-width 1.96 sd/sqrt(n).
    mean = correlation.bootstrap_mean(xl, n_boot=4000, ci=0.95, seed=2)
    assert mean.value == pytest.approx(xl.mean())
    half = 1.96 * xl.std() / np.sqrt(xl.size)
    assert (mean.high - mean.low) / 2 == pytest.approx(half, rel=0.1)


def test_input_checks():
    with pytest.raises(ValueError, match="paired"):
        correlation.correlation([1.0, 2.0], [1.0, 2.0, 3.0], "pearson")
    with pytest.raises(ValueError, match="finite"):
        correlation.bootstrap_correlation([1.0, np.nan], [1.0, 2.0], "pearson")
    with pytest.raises(ValueError, match="method"):
        correlation.bootstrap_correlation([1.0, 2.0], [1.0, 2.0], "kendall")
    with pytest.raises(ValueError, match="n_boot"):
        correlation.bootstrap_mean([1.0], n_boot=0)
