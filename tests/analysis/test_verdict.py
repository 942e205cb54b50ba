"""Reward gap, bootstrap CI, mismatch, verdicts and the claim on hand-made summaries."""

import numpy as np
import pytest

from fp4rl.analysis.summary import ArmSummary, SeedSummary
from fp4rl.analysis.stability import (
    CollapseResult,
    MismatchSummary,
    StabilityCriteria,
    bootstrap_ci,
    claim_reproduced,
    mismatch_summary,
    reward_gap_to_reference,
    verdict,
)

C = StabilityCriteria()
NAN = float("nan")
MISMATCH = MismatchSummary(1e-4, 1e-4, 0.5, 0.01)


def seed(arm, k, rate=0.0, severe=(), collapsed=False, gap=0.0):
    collapse = CollapseResult(True, "non-finite grad_norm/global (nan) at step 40", 40) if collapsed \
        else CollapseResult(False, None, None)
    return SeedSummary(arm=arm, seed=k, n_steps=100, last_step=99, spike_steps=tuple(severe), severe_steps=tuple(severe),
                       spikes_per_100=rate, severe_per_100=NAN, collapse=collapse, reward_gap=gap,
                       final_accuracy=0.5, final_accuracy_step=99, mismatch=MISMATCH, skipped_updates=0)


def arm(name, rates=(0.0, 0.0), severe=(), collapsed=(), gap=0.0, reference=True):
    seeds = tuple(seed(name, k, rate, severe if k == 0 else (), k in collapsed, gap) for k, rate in enumerate(rates))
    return ArmSummary(arm=name, seeds=seeds, has_reference=reference, reward_gap_mean=gap if reference else NAN,
                      final_accuracy=None, mismatch=MISMATCH)


def test_reward_gap_to_bf16_median():
    steps = np.arange(10)
    ref = {0: (steps, np.zeros(10)), 1: (steps, np.full(10, 0.2)), 2: (steps, np.ones(10))}  # median 0.2
    # Seed 5 stopped after 4 steps: only common steps count.
    gap = reward_gap_to_reference({3: (steps, np.full(10, 0.1)), 5: (steps[:4], np.full(4, 0.5))}, ref)
    assert gap.per_seed[3] == pytest.approx(-0.1)
    assert gap.per_seed[5] == pytest.approx(0.3)
    assert gap.mean == pytest.approx(0.1)


def test_reward_gap_median_follows_steps():
    ref = {0: (np.arange(4), np.array([0.0, 0.0, 1.0, 1.0]))}
    gap = reward_gap_to_reference({0: (np.array([2, 3]), np.array([1.0, 0.5]))}, ref)
    assert gap.per_seed[0] == pytest.approx(-0.25)


def test_bootstrap_ci_contains_mean_and_shrinks_with_more_seeds():
    rng = np.random.default_rng(1)
    few, many = rng.normal(0.6, 0.05, 4), rng.normal(0.6, 0.05, 64)
    ci_few, ci_many = bootstrap_ci(few), bootstrap_ci(many)
    for ci, x in ((ci_few, few), (ci_many, many)):
        assert ci.low <= x.mean() <= ci.high and ci.mean == pytest.approx(x.mean())
        assert not ci.degenerate
    assert (ci_many.high - ci_many.low) < 0.5 * (ci_few.high - ci_few.low)
    assert bootstrap_ci(few, seed=3) == bootstrap_ci(few, seed=3)  # seeded: reproducible


def test_bootstrap_ci_one_seed_is_degenerate_and_says_so():
    ci = bootstrap_ci([0.42])
    assert (ci.mean, ci.low, ci.high, ci.n, ci.degenerate) == (0.42, 0.42, 0.42, 1, True)
    assert "one seed" in ci.note


@pytest.mark.parametrize("bad", [[], [0.1, np.nan]])
def test_bootstrap_ci_rejects_empty_and_nonfinite(bad):
    with pytest.raises(ValueError):
        bootstrap_ci(bad)


def test_mismatch_summary():
    m = mismatch_summary({"mismatch/kl_k3": np.array([1e-3, 3e-3, np.nan]), "mismatch/max_abs_logp_diff": np.array([0.2, 0.9])})
    assert m.kl_k3 == pytest.approx(2e-3)
    assert m.max_abs_logp_diff == pytest.approx(0.9)
    assert np.isnan(m.kl_k1) and np.isnan(m.routing_flip)  # not logged


def test_verdict_passing_arm():
    v = verdict(arm("full", rates=(1.0, 0.5), gap=-0.1), C)  # both thresholds are inclusive
    assert (v.spike.passed, v.collapse.passed, v.reward.passed, v.passed) == (True, True, True, True)


@pytest.mark.parametrize(
    "summary, failed",
    [
        (arm("x", rates=(0.0, 1.5)), ("spike",)),  # one seed above 1 spike / 100 steps
        (arm("x", severe=(55,), rates=(0.5, 0.0)), ("spike",)),  # a severe spike
        (arm("x", collapsed=(1,)), ("collapse",)),
        (arm("x", gap=-0.15), ("reward",)),
        (arm("x", rates=(3.0, 0.0), collapsed=(0,), gap=-0.5), ("spike", "collapse", "reward")),
    ],
)
def test_verdict_failures(summary, failed):
    v = verdict(summary, C)
    assert v.failed() == failed and v.passed is False


def test_verdict_without_reference_is_undecided():
    v = verdict(arm("full", reference=False), C)
    assert v.reward.passed is None and v.passed is None


def test_declared_thresholds_are_used():
    loose = StabilityCriteria(max_spikes_per_100=2.0, reward_gap_tolerance=0.2)
    assert verdict(arm("x", rates=(1.5, 0.0), gap=-0.15), loose).passed is True


def loo_verdicts(**overrides):
    summaries = {"full": arm("full"), "full-dq": arm("full-dq", rates=(2.0, 0.0)),
                 "full-46": arm("full-46", collapsed=(0,)), "full-hp": arm("full-hp", gap=-0.3)}
    summaries.update(overrides)
    return {name: verdict(s, C) for name, s in summaries.items() if s is not None}


def test_claim_reproduced():
    claim = claim_reproduced(loo_verdicts())
    assert claim.reproduced is True
    assert "fails collapse" in claim.details["full-46"]


def test_claim_not_reproduced_when_a_leave_one_out_arm_passes():
    claim = claim_reproduced(loo_verdicts(**{"full-46": arm("full-46")}))
    assert claim.reproduced is False
    assert "passes every criterion" in claim.details["full-46"]
    assert claim.explanation.startswith("Not reproduced")


def test_claim_not_reproduced_when_full_fails():
    claim = claim_reproduced(loo_verdicts(full=arm("full", gap=-0.2)))
    assert claim.reproduced is False and "fails reward" in claim.details["full"]


def test_claim_undecided_with_a_missing_arm():
    claim = claim_reproduced(loo_verdicts(**{"full-hp": None}))
    assert claim.reproduced is None and "missing" in claim.details["full-hp"]


def test_claim_counts_a_failure_even_if_another_criterion_is_undecided():
    no_ref_but_spiky = arm("full-dq", rates=(2.0, 0.0), reference=False)
    assert claim_reproduced(loo_verdicts(**{"full-dq": no_ref_but_spiky})).reproduced is True
