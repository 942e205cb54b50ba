"""Reward gap, bootstrap intervals, mismatch, verdicts and the claim on hand-made summaries."""

import numpy as np
import pytest

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import CollapseResult, SeedPower, SpikeResult
from fp4rl.analysis.statistics import (
    BootstrapCI, MismatchSummary, accuracy_change_ci, accuracy_ci, bootstrap_ci, detectable_rate, fisher_exact_greater,
    fisher_power, mismatch_summary, reward_gap_ci, reward_gap_to_reference, student_t_interval,
)
from fp4rl.analysis.summary import ArmSummary, SeedSummary
from fp4rl.analysis.verdicts import claim_reproduced, run_verdicts, verdict

C = StabilityCriteria()
NAN = float("nan")
MISMATCH = MismatchSummary(1e-4, 1e-4, 0.5, 0.01)
NONFINITE = CollapseResult(True, "non-finite grad_norm/global (nan) at step 40", 40, kind="non-finite")


def seed(arm, k, rate=0.0, severe=0, collapse=None, judged=200, degenerate=None, unconfirmed=False):
    """A seed with `rate` spikes per 100 of its `judged` steps (`severe` of them severe)."""
    n = round(rate * judged / 100)
    spikes = SpikeResult(spike_steps=tuple(range(30, 30 + n)), spike_updates=(0,) * n,
                         severe_steps=tuple(range(30, 30 + severe)), severe_updates=(0,) * severe,
                         judged_steps=judged, judged_updates=2 * judged, per_update=True)
    under = f"{judged} judged steps, {C.min_judged_steps} needed" if judged < C.min_judged_steps else None
    power = SeedPower(judged, 2 * judged, judged, 0, degenerate, under)
    if collapse is None:
        collapse = CollapseResult(False, None, None, note="reward fell ... not confirmed" if unconfirmed else None,
                                  reward_drop_unconfirmed=unconfirmed)
    return SeedSummary(arm=arm, seed=k, n_steps=judged + 20, last_step=judged + 19, spikes=spikes, power=power,
                       collapse=collapse, reward_gap=0.0, final_greedy=None, final_sampled=None, first_sampled=None,
                       mismatch=MISMATCH, skipped_updates=0, empty_updates=0)


def arm(name, rates=(0.0, 0.0), severe=0, collapsed=(), gap=(0.0, -0.02, 0.02), reference=True, judged=200,
        degenerate=(), unconfirmed=(), reference_judged=2):
    seeds = tuple(seed(name, k, rate, severe if k == 0 else 0, NONFINITE if k in collapsed else None, judged,
                       "no learning signal" if k in degenerate else None, k in unconfirmed)
                  for k, rate in enumerate(rates))
    n_judged = sum(s.power.judged for s in seeds)
    gap_ci = BootstrapCI(gap[0], gap[1], gap[2], n_judged, 0.95, False, kind="seeds+steps") \
        if reference and n_judged else None
    return ArmSummary(arm=name, seeds=seeds, has_reference=reference, reward_gap_mean=gap[0] if reference else NAN,
                      final_accuracy=None, mismatch=MISMATCH, reward_gap_ci=gap_ci,
                      reference_judged=reference_judged if reference else 0)


# --------------------------------------------------------------------------- statistics


def test_reward_gap_is_paired_with_the_reference_seed_of_the_same_number():
    steps = np.arange(10)
    ref = {0: (steps, np.zeros(10)), 1: (steps, np.full(10, 0.2)), 2: (steps, np.ones(10))}
    # Seed 1 stopped after 4 steps: only common steps count. Seed 5 has no BF16 seed 5.
    gap = reward_gap_to_reference({0: (steps, np.full(10, 0.1)), 1: (steps[:4], np.full(4, 0.5)),
                                   5: (steps, np.ones(10))}, ref)
    assert gap.per_seed[0] == pytest.approx(0.1)
    assert gap.per_seed[1] == pytest.approx(0.3)
    assert np.isnan(gap.per_seed[5]) and gap.unpaired == (5,) and gap.series[5].size == 0
    assert gap.mean == pytest.approx(0.2)
    assert gap.series[1].shape == (4,) and gap.series[0] == pytest.approx(np.full(10, 0.1))


def test_reward_gap_pairs_steps_and_skips_nonfinite_ones():
    ref = {0: (np.arange(4), np.array([0.0, np.nan, 1.0, 1.0]))}
    gap = reward_gap_to_reference({0: (np.array([1, 2, 3]), np.array([1.0, 1.0, 0.5]))}, ref)
    assert gap.series[0] == pytest.approx([0.0, -0.5]) and gap.per_seed[0] == pytest.approx(-0.25)


def shared_prompt_streams(n_seeds=6, n_steps=100, true_gap=-0.03, seed=0):
    """Reward series of BF16 and an arm whose seeds share each seed's prompt difficulty: seed k
    of both arms moves by the same offset (sd 0.1), the arm sits `true_gap` below BF16, and each
    step adds independent sampling noise (sd 0.02)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n_steps)
    offset = rng.normal(0.0, 0.1, n_seeds)
    ref = {k: (steps, 0.3 + offset[k] + rng.normal(0.0, 0.02, n_steps)) for k in range(n_seeds)}
    arm = {k: (steps, 0.3 + true_gap + offset[k] + rng.normal(0.0, 0.02, n_steps)) for k in range(n_seeds)}
    return arm, ref


def test_paired_gap_interval_is_narrow_and_centred_where_an_unpaired_one_is_not():
    arm, ref = shared_prompt_streams(seed=1)
    gap = reward_gap_to_reference(arm, ref)
    ci = reward_gap_ci(list(gap.series.values()), block=10, n_boot=4000)
    # The offsets cancel: only the sampling noise is left.
    assert ci.low < -0.03 < ci.high and ci.width < 0.02 and ci.mean == pytest.approx(-0.03, abs=0.003)
    assert ci.t_interval[0] < -0.03 < ci.t_interval[1]
    # The unpaired gap (to the median of BF16's seeds) keeps each seed's offset: its interval is
    # an order of magnitude wider, and its centre is off by the seeds' mean offset minus their median.
    median = np.median(np.stack([v for _, v in ref.values()]), axis=0)
    wide = reward_gap_ci([v - median for _, v in arm.values()], block=10, n_boot=4000)
    assert wide.width > 5 * ci.width and abs(wide.mean + 0.03) > 0.01


def test_student_t_interval_matches_scipy():
    from scipy import stats

    x = np.array([0.012, -0.004, 0.007, 0.001])
    expected = stats.t.interval(0.95, df=3, loc=x.mean(), scale=stats.sem(x))
    assert student_t_interval(x) == pytest.approx(expected, rel=1e-12)
    # Two seeds: t_{0.975, 1} = 12.71 times the standard error, far wider than the bootstrap's [min, max].
    two = np.array([0.010, -0.006])
    low, high = student_t_interval(two)
    assert (high - low) / 2 == pytest.approx(12.7062 * two.std(ddof=1) / np.sqrt(2), rel=1e-4)
    boot = bootstrap_ci(two)
    assert (boot.low, boot.high) == pytest.approx((-0.006, 0.010)) and boot.t_interval == (low, high)
    assert student_t_interval([0.3]) is None and bootstrap_ci([0.3]).t_interval is None
    assert student_t_interval(x, ci=0.9) == pytest.approx(stats.t.interval(0.9, 3, x.mean(), stats.sem(x)))


def test_every_seed_level_interval_carries_the_t_interval():
    p, n = [0.40, 0.45, 0.50, 0.55], [32] * 4
    assert accuracy_ci(p, n).t_interval == pytest.approx(student_t_interval(p))
    change = accuracy_change_ci([0.30, 0.35], [32, 32], [0.50, 0.60], [32, 32])
    assert change.t_interval == pytest.approx(student_t_interval([0.20, 0.25]))
    series = [np.full(20, 0.01), np.full(20, -0.02), np.full(20, 0.0)]
    assert reward_gap_ci(series, n_boot=100).t_interval == pytest.approx(student_t_interval([0.01, -0.02, 0.0]))


def test_reward_gap_ci_over_seeds_and_steps():
    rng = np.random.default_rng(0)
    series = [-0.05 + 0.1 * rng.standard_normal(100) for _ in range(4)]
    ci = reward_gap_ci(series, block=10, n_boot=2000)
    assert ci.low < ci.mean < ci.high and ci.kind == "seeds+steps" and ci.n == 4
    assert ci.mean == pytest.approx(np.mean([s.mean() for s in series]))
    one = reward_gap_ci(series[:1], block=10, n_boot=2000)  # one seed: the steps' error only
    assert one.kind == "steps" and one.width > 0 and "one seed" in one.note
    with pytest.raises(ValueError):
        reward_gap_ci([np.array([])])


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


def test_accuracy_ci_one_seed_carries_the_binomial_error():
    ci = accuracy_ci([0.5], [32])
    assert not ci.degenerate and ci.kind == "binomial" and "binomial error only" in ci.note
    # The 95% interval of Binomial(32, 0.5) / 32 is about 0.5 +- 1.96 x sqrt(0.25 / 32) = 0.5 +- 0.17.
    assert ci.low == pytest.approx(0.5 - 0.17, abs=0.04) and ci.high == pytest.approx(0.5 + 0.17, abs=0.04)
    assert accuracy_ci([0.5], [None]).degenerate  # one seed, no eval/n: nothing to resample


def test_accuracy_ci_combines_seeds_and_evaluation_error():
    p = [0.40, 0.45, 0.50, 0.55]
    seeds_only, both = accuracy_ci(p, None), accuracy_ci(p, [32] * 4)
    assert seeds_only.kind == "seeds" and "seeds only" in seeds_only.note
    assert both.kind == "seeds+binomial" and both.note is None
    assert both.width > 1.5 * seeds_only.width  # 32 problems add more error than 4 close seeds
    assert accuracy_ci(p, [32] * 4).width > accuracy_ci(p, [4096] * 4).width
    partial = accuracy_ci(p, [32, None, 32, 32])
    assert partial.kind == "seeds+binomial" and "1 of 4 seeds logged no eval/n" in partial.note
    with pytest.raises(ValueError):
        accuracy_ci([1.2], [32])


def test_accuracy_change_ci():
    ci = accuracy_change_ci([0.30, 0.35], [32, 32], [0.50, 0.55], [32, 32])
    assert ci.mean == pytest.approx(0.2) and ci.low < 0.2 < ci.high and ci.kind == "seeds+binomial"
    assert accuracy_change_ci([0.3], [64], [0.5], [64]).width > 0  # one seed: binomial error of both evaluations


def test_mismatch_summary():
    m = mismatch_summary({"mismatch/kl_k3": np.array([1e-3, 3e-3, np.nan]), "mismatch/max_abs_logp_diff": np.array([0.2, 0.9])})
    assert m.kl_k3 == pytest.approx(2e-3)
    assert m.max_abs_logp_diff == pytest.approx(0.9)
    assert np.isnan(m.kl_k1) and np.isnan(m.routing_flip)  # not logged


# --------------------------------------------------------------------------- verdicts


def test_verdict_passing_arm():
    v = verdict(arm("full", rates=(1.0, 0.5), gap=(-0.05, -0.1, 0.0)), C)  # both thresholds are inclusive
    assert (v.spike.passed, v.collapse.passed, v.reward.passed, v.passed) == (True, True, True, True)


@pytest.mark.parametrize(
    "summary, failed",
    [
        (arm("x", rates=(0.0, 1.5)), ("spike",)),  # one seed above 1 spike / 100 steps
        (arm("x", severe=1, rates=(0.5, 0.0)), ("spike",)),  # a severe spike
        (arm("x", collapsed=(1,)), ("collapse",)),
        (arm("x", gap=(-0.15, -0.2, -0.11)), ("reward",)),
        (arm("x", rates=(3.0, 0.0), collapsed=(0,), gap=(-0.5, -0.6, -0.4)), ("spike", "collapse", "reward")),
    ],
)
def test_verdict_failures(summary, failed):
    v = verdict(summary, C)
    assert v.failed() == failed and v.passed is False


def test_verdict_without_reference_is_undecided():
    v = verdict(arm("full", reference=False), C)
    assert v.reward.passed is None and v.passed is None and v.reward.reason == "no BF16 reference arm"
    v = verdict(arm("full", reference_judged=0), C)
    assert v.reward.passed is None and "no judged seed in the BF16 reference" in v.reward.reason


def test_too_few_judged_steps_is_undecided_not_fail():
    v = verdict(arm("x", rates=(5.0, 5.0), severe=1, judged=40, gap=(-0.5, -0.6, -0.4)), C)
    assert v.failed() == () and v.passed is None
    assert v.undecided() == ("spike", "collapse", "reward")
    assert "0 judged seed(s), 2 needed" in v.spike.reason and "40 judged steps, 50 needed" in v.spike.reason
    assert "4 spiking step(s) in seeds not judged" in v.spike.value


def test_a_nonfinite_collapse_needs_no_power():
    v = verdict(arm("x", judged=10, collapsed=(0,)), C)
    assert v.collapse.passed is False and v.spike.passed is None


def test_degenerate_seeds_are_not_judged():
    v = verdict(arm("x", rates=(9.0, 9.0), degenerate=(0, 1)), C)
    assert v.spike.passed is None and "no learning signal" in v.spike.reason
    assert v.collapse.passed is None and v.reward.passed is None


def test_one_judged_seed_fails_spikes_but_cannot_pass_or_judge_the_reward():
    failing = verdict(arm("x", rates=(3.0,)), C)
    assert failing.spike.passed is False  # a judged seed above the rate fails "every seed"
    quiet = verdict(arm("x", rates=(0.0,), gap=(-0.5, -0.6, -0.4)), C)
    assert quiet.spike.passed is None and "1 judged seed(s), 2 needed" in quiet.spike.reason
    assert quiet.reward.passed is None and quiet.collapse.passed is None


def test_reward_interval_straddling_the_tolerance_is_undecided():
    v = verdict(arm("x", gap=(-0.1, -0.15, -0.05)), C)
    assert v.reward.passed is None and "straddles -0.1" in v.reward.reason


def test_unconfirmed_reward_drop_keeps_collapse_undecided():
    v = verdict(arm("x", unconfirmed=(1,)), C)
    assert v.collapse.passed is None and "not confirmed" in v.collapse.reason
    assert verdict(arm("x", rates=(0, 0, 0), unconfirmed=(1,)), C).collapse.passed is True  # 2 clear seeds remain


def test_declared_thresholds_are_used():
    loose = StabilityCriteria(max_spikes_per_100=2.0, reward_gap_tolerance=0.2)
    assert verdict(arm("x", rates=(1.5, 0.0), gap=(-0.15, -0.19, -0.11)), loose).passed is True
    assert verdict(arm("x", rates=(0.0,)), StabilityCriteria(min_seeds=1)).passed is True


def loo_verdicts(**overrides):
    summaries = {"full": arm("full"), "full-dq": arm("full-dq", rates=(2.0, 0.0)),
                 "full-46": arm("full-46", collapsed=(0,)), "full-hp": arm("full-hp", gap=(-0.3, -0.4, -0.2))}
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
    claim = claim_reproduced(loo_verdicts(full=arm("full", gap=(-0.2, -0.3, -0.15))))
    assert claim.reproduced is False and "fails reward" in claim.details["full"]


def test_claim_undecided_with_a_missing_arm():
    claim = claim_reproduced(loo_verdicts(**{"full-hp": None}))
    assert claim.reproduced is None and "missing" in claim.details["full-hp"]


def test_claim_undecided_not_refuted_without_power():
    short = {name: arm(name, judged=30) for name in ("full", "full-dq", "full-46", "full-hp")}
    claim = claim_reproduced({name: verdict(s, C) for name, s in short.items()})
    assert claim.reproduced is None and claim.explanation.startswith("Undecided")
    assert "spike undecided (0 judged seed(s), 2 needed" in claim.details["full"]
    # A leave-one-out arm that passes what it could judge is not a refutation either.
    claim = claim_reproduced(loo_verdicts(**{"full-46": arm("full-46", rates=(0.0,))}))
    assert claim.reproduced is None and "no criterion failed, but spike undecided" in claim.details["full-46"]


def test_claim_counts_a_failure_even_if_another_criterion_is_undecided():
    no_ref_but_spiky = arm("full-dq", rates=(2.0, 0.0), reference=False)
    assert claim_reproduced(loo_verdicts(**{"full-dq": no_ref_but_spiky})).reproduced is True


# --------------------------------------------------------------------------- calibration by BF16


def test_fisher_exact_greater_on_hand_computed_tables():
    assert fisher_exact_greater(3, 3, 0, 3) == pytest.approx(1 / 20)  # C(3,3) C(3,0) / C(6,3)
    assert fisher_exact_greater(1, 1, 0, 1) == pytest.approx(1 / 2)
    assert fisher_exact_greater(0, 50, 7, 50) == 1.0  # no spike in the arm: nothing to test
    # P(X >= 2), X ~ Hypergeometric(N=10, K=3 spikes, n=5 drawn) = (C(3,2) C(7,3) + C(3,3) C(7,2)) / C(10,5)
    assert fisher_exact_greater(2, 5, 1, 5) == pytest.approx((3 * 35 + 21) / 252)
    with pytest.raises(ValueError):
        fisher_exact_greater(4, 3, 0, 3)


@pytest.mark.parametrize("k, n, k_ref, n_ref", [(5, 160, 2, 160), (2, 160, 2, 160), (12, 320, 3, 320), (0, 7, 0, 9)])
def test_fisher_exact_greater_matches_scipy(k, n, k_ref, n_ref):
    from scipy.stats import fisher_exact

    expected = fisher_exact([[k, n - k], [k_ref, n_ref - k_ref]], alternative="greater").pvalue
    assert fisher_exact_greater(k, n, k_ref, n_ref) == pytest.approx(expected, rel=1e-9)


def test_fisher_power_and_the_detectable_rate():
    # The test's size: at the reference's own rate it rejects at most alpha of the time (Fisher is conservative).
    assert fisher_power(320, 2 / 320, 320, 2 / 320, 0.05) <= 0.05
    # Power at a rate 6x the reference's, 320 measurements each: a Monte Carlo check of the exact sum.
    rng = np.random.default_rng(0)
    k, k_ref = rng.binomial(320, 0.036, 4000), rng.binomial(320, 2 / 320, 4000)
    simulated = np.mean([fisher_exact_greater(int(a), 320, int(b), 320) < 0.05 for a, b in zip(k, k_ref)])
    assert fisher_power(320, 0.036, 320, 2 / 320, 0.05) == pytest.approx(simulated, abs=0.03)
    rate = detectable_rate(320, 2, 320)
    assert fisher_power(320, rate, 320, 2 / 320, 0.05) >= 0.8 > fisher_power(320, rate - 2e-3, 320, 2 / 320, 0.05)
    assert detectable_rate(640, 2, 320) < rate  # more measurements detect smaller rates
    assert detectable_rate(1, 5, 10, alpha=0.001) == float("inf")  # one measurement cannot reach p < 0.001
    with pytest.raises(ValueError):
        detectable_rate(0, 1, 10)


def test_spike_threshold_failed_by_bf16_is_calibrated_against_it():
    bf16 = arm("bf16", rates=(1.5, 1.5))  # fails the absolute <= 1/100 threshold itself
    like_bf16, spiky = arm("x", rates=(1.5, 1.5)), arm("y", rates=(10.0, 10.0))
    v = run_verdicts({"bf16": bf16, "x": like_bf16, "y": spiky}, C)
    assert v["bf16"].spike.passed is None and "BF16 reference fails" in v["bf16"].spike.reason
    assert v["x"].spike.passed is None and "does not spike more often than BF16" in v["x"].spike.reason
    assert "6/400 vs 6/400 spiking steps" in v["x"].spike.value  # judged steps, not updates
    assert v["y"].spike.passed is False and "p = " in v["y"].spike.value
    assert "at 80% power this test detects a rate >= " in v["x"].spike.value
    # Without a failing reference the absolute threshold stands.
    assert verdict(like_bf16, C, arm("bf16")).spike.passed is False
    assert verdict(like_bf16, C).spike.passed is False
    # A severe spike where BF16 has none still fails.
    assert verdict(arm("z", rates=(1.5, 1.5), severe=1), C, bf16).spike.passed is False


def test_claim_undecided_when_full_spikes_like_a_failing_bf16():
    bf16 = arm("bf16", rates=(1.5, 1.5))
    summaries = {"bf16": bf16, "full": arm("full", rates=(1.5, 1.5)), "full-dq": arm("full-dq", rates=(10.0, 10.0)),
                 "full-46": arm("full-46", collapsed=(0,)), "full-hp": arm("full-hp", gap=(-0.3, -0.4, -0.2))}
    claim = claim_reproduced(run_verdicts(summaries, C))
    assert claim.reproduced is None and "spike undecided" in claim.details["full"]
    assert "fails spike" in claim.details["full-dq"]
    # The same runs judged by the absolute threshold alone would call it refuted.
    assert claim_reproduced({k: verdict(s, C) for k, s in summaries.items()}).reproduced is False


def with_spikes_in_both_updates(summary, steps_per_seed):
    """`summary` with each judged seed spiking in both updates of `steps_per_seed` steps."""
    import dataclasses

    def twice(x):
        st = tuple(s for s in range(30, 30 + steps_per_seed) for _ in range(2))
        return dataclasses.replace(x, spikes=dataclasses.replace(x.spikes, spike_steps=st, spike_updates=(0, 1) * steps_per_seed))

    return dataclasses.replace(summary, seeds=tuple(twice(x) for x in summary.seeds))


def test_the_bf16_comparison_counts_a_step_whose_updates_both_spike_once():
    # 6 steps per seed spike in both of their updates, against BF16's 3 steps per seed in one
    # update: 12/400 vs 6/400 spiking steps (p = 0.12), not 24/800 vs 6/800 updates (p < 0.001).
    bf16 = arm("bf16", rates=(1.5, 1.5))
    clustered = with_spikes_in_both_updates(arm("x"), 6)
    assert [x.spikes.spiking_steps for x in clustered.seeds] == [6, 6]
    v = run_verdicts({"bf16": bf16, "x": clustered}, C)["x"].spike
    assert "12/400 vs 6/400 spiking steps" in v.value and v.passed is None
    assert "max 3.00 spiking steps/100" in v.value
    assert fisher_exact_greater(12, 400, 6, 400) > 0.05 > fisher_exact_greater(24, 800, 6, 800)


def test_verdicts_on_fewer_than_4_seeds_are_flagged_few_seeds():
    two = verdict(arm("full", rates=(0.0, 0.0)), C)
    assert (two.spike.few_seeds, two.collapse.few_seeds, two.reward.few_seeds) == (2, 2, 2)
    four = verdict(arm("full", rates=(0.0,) * 4, gap=(0.0, -0.02, 0.02)), C)
    assert four.passed is True and all(c.few_seeds is None for c in four.criteria)
    # An observed event fails at any number of seeds: not flagged.
    event = verdict(arm("x", rates=(3.0, 0.0), collapsed=(0,)), C)
    assert event.spike.passed is False and event.spike.few_seeds is None and event.collapse.few_seeds is None
    undecided = verdict(arm("x", gap=(-0.1, -0.15, -0.05)), C)
    assert undecided.reward.passed is None and undecided.reward.few_seeds is None
    assert verdict(arm("full"), StabilityCriteria(few_seeds=2)).spike.few_seeds is None
