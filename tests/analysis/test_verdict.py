"""Reward gap, bootstrap intervals, mismatch, verdicts and the claim on hand-made summaries."""

import numpy as np
import pytest

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import CollapseResult, SeedPower, SpikeResult
from fp4rl.analysis.statistics import (
    MismatchSummary, accuracy_change_ci, accuracy_ci, bootstrap_ci, mismatch_summary, rate_difference,
    reward_gap_ci, reward_gap_to_reference, student_t_interval,
)
from fp4rl.analysis.summary import ArmSummary, SeedSummary
from fp4rl.analysis.verdicts import claim_reproduced, run_verdicts, spike_decision, verdict

C = StabilityCriteria()
NAN = float("nan")
MISMATCH = MismatchSummary(1e-4, 1e-4, 0.5, 0.01)
NONFINITE = CollapseResult(True, "non-finite grad_norm/global (nan) at step 40", 40, kind="non-finite")


def seed(arm, k, spikes=0, severe=0, collapse=None, judged=280, degenerate=None, unconfirmed=False, gap=0.0):
    """A seed with `spikes` spiking steps in its `judged` steps, `severe` of them severe."""
    spikes = SpikeResult(spike_steps=tuple(range(30, 30 + spikes)), spike_updates=(0,) * spikes,
                         severe_steps=tuple(range(30, 30 + severe)), severe_updates=(0,) * severe,
                         judged_steps=judged, judged_updates=2 * judged, per_update=True)
    under = f"{judged} judged steps, {C.min_judged_steps} needed" if judged < C.min_judged_steps else None
    power = SeedPower(judged, 2 * judged, judged, 0, degenerate, under)
    if collapse is None:
        collapse = CollapseResult(False, None, None, note="reward fell ... not confirmed" if unconfirmed else None,
                                  reward_drop_unconfirmed=unconfirmed)
    return SeedSummary(arm=arm, seed=k, n_steps=judged + 20, last_step=judged + 19, spikes=spikes, power=power,
                       collapse=collapse, reward_gap=gap, final_greedy=None, final_sampled=None, first_sampled=None,
                       mismatch=MISMATCH, skipped_updates=0, empty_updates=0)


# BF16 of the chain matrix: 3 spiking steps in 8 x 280 judged steps, one of them severe.
BF16_SPIKES = (0, 0, 0, 1, 0, 0, 2, 0)
BF16_SEVERE = (0, 0, 0, 1, 0, 0, 0, 0)


def arm(name, spikes=(0, 0), severe=None, collapsed=(), gaps=None, reference=True, judged=280,
        degenerate=(), unconfirmed=(), reference_judged=8, rise=0.3):
    """An arm of per-seed spiking steps, severe spiking steps and mean paired gaps to BF16; BF16's
    reward rises by `rise` (the reward margin is 0.1 x rise)."""
    severe = severe or (0,) * len(spikes)
    gaps = gaps if gaps is not None else (0.0,) * len(spikes)
    seeds = tuple(seed(name, k, n, severe[k], NONFINITE if k in collapsed else None, judged,
                       "no learning signal" if k in degenerate else None, k in unconfirmed, gaps[k] if reference else NAN)
                  for k, n in enumerate(spikes))
    judged_gaps = [s.reward_gap for s in seeds if s.power.judged]
    gap_ci = bootstrap_ci(judged_gaps) if reference and judged_gaps else None
    return ArmSummary(arm=name, seeds=seeds, has_reference=reference,
                      reward_gap_mean=float(np.mean(gaps)) if reference else NAN, final_accuracy=None,
                      mismatch=MISMATCH, reward_gap_ci=gap_ci, reference_judged=reference_judged if reference else 0,
                      reference_reward_rise=rise if reference else NAN)


BF16 = arm("bf16", BF16_SPIKES, BF16_SEVERE)


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


# --------------------------------------------------------------------------- the spike rate difference


def test_rate_difference_by_hand():
    # 8 seeds of 2 spikes in 280 steps against BF16's chain counts.
    d = rate_difference([(2, 280)] * 8, [(k, 280) for k in BF16_SPIKES])
    assert d.difference == pytest.approx(13 / 2240)
    # arm: no between-seed spread, so the Jeffreys binomial floor; BF16: the between-seed variance
    floor = 16.5 / 2241 * (1 - 16.5 / 2241) / 2240
    between = 8 / 7 * sum((k - 3 / 8) ** 2 for k in BF16_SPIKES) / 2240**2
    assert d.se == pytest.approx(np.sqrt(floor + between))
    from scipy.stats import t

    assert d.high - d.difference == pytest.approx(t.ppf(0.95, 14) * d.se) and d.df == 14
    with pytest.raises(ValueError):
        rate_difference([(1, 280)], [(0, 280), (0, 280)])  # one seed has no between-seed variance


def test_rate_difference_treats_seeds_not_steps_as_units():
    # The same 8 spikes in 2240 steps: spread over the seeds, or all in one seed.
    spread = rate_difference([(1, 280)] * 8, [(0, 280)] * 8)
    clustered = rate_difference([(8, 280)] + [(0, 280)] * 7, [(0, 280)] * 8)
    assert spread.difference == clustered.difference and clustered.se > 2 * spread.se
    assert spread.low > 0 > clustered.low


# --------------------------------------------------------------------------- verdicts


def judged(summary, reference=BF16):
    return verdict(summary, C, reference)


def test_an_arm_as_stable_as_bf16_passes_every_criterion():
    v = judged(arm("full", BF16_SPIKES, BF16_SEVERE, gaps=(-0.013, -0.01, -0.016, -0.012) * 2))
    assert (v.spike.passed, v.collapse.passed, v.reward.passed, v.passed) == (True, True, True, True)
    assert "3/2240 spiking steps" in v.spike.value and "vs BF16 3/2240" in v.spike.value


def test_the_spike_criterion_always_compares_with_bf16():
    # Reproduction of the defect: BF16's counts with its spikes removed and two 4x spikes per seed
    # added pass an absolute <= 1/100 per seed threshold (2/280 = 0.71/100) with no severe spike, but
    # spike 16/2240 against BF16's 3/2240: not as stable as BF16.
    v = judged(arm("x", (2,) * 8))
    assert v.spike.passed is False and "16/2240" in v.spike.value
    assert judged(arm("x", (2,) * 8), reference=None).spike.passed is None  # without BF16 no spike verdict


def test_one_severe_spike_like_bf16s_does_not_fail_the_arm():
    # BF16 itself has a severe spike in 2240 judged steps: an arm exactly like it passes.
    assert judged(arm("x", BF16_SPIKES, BF16_SEVERE)).spike.passed is True
    assert judged(arm("x", (0, 1, 0, 0, 0, 0, 0, 0), (0, 1, 0, 0, 0, 0, 0, 0))).spike.passed is True
    # Severe spikes significantly more often than BF16 fail, whatever the margin says.
    many = judged(arm("x", (1,) * 8, (1,) * 8))
    assert many.spike.passed is False and "severe" in many.spike.value


def test_spikes_clustered_in_one_seed_are_not_evidence_of_an_arm():
    clustered = judged(arm("x", (8, 0, 0, 0, 0, 0, 0, 0)), arm("bf16", (0,) * 8))
    spread = judged(arm("x", (1,) * 8), arm("bf16", (0,) * 8))
    assert clustered.spike.passed is None and "not below the margin" in clustered.spike.reason
    assert spread.spike.passed is False


def test_the_reference_arm_is_the_yardstick_not_judged():
    v = run_verdicts({"bf16": BF16, "full": arm("full", BF16_SPIKES)}, C)
    assert v["bf16"].spike.passed is None and v["bf16"].reward.passed is None
    assert "the BF16 reference" in v["bf16"].spike.reason and v["full"].spike.passed is True


@pytest.mark.parametrize(
    "summary, failed",
    [
        (arm("x", (3,) * 8), ("spike",)),
        (arm("x", (0,) * 8, collapsed=(1,)), ("collapse",)),
        (arm("x", (0,) * 8, gaps=(-0.06, -0.05, -0.07, -0.055) * 2), ("reward",)),
        (arm("x", (4,) * 8, collapsed=(0,), gaps=(-0.5, -0.6, -0.4, -0.55) * 2), ("spike", "collapse", "reward")),
    ],
)
def test_verdict_failures(summary, failed):
    v = judged(summary)
    assert v.failed() == failed and v.passed is False


def test_the_reward_margin_is_a_fraction_of_bf16s_rise():
    gaps = (-0.02, -0.025, -0.022, -0.024)
    assert judged(arm("x", (0,) * 4, gaps=gaps, rise=0.3)).reward.passed is True  # margin 0.03
    assert judged(arm("x", (0,) * 4, gaps=gaps, rise=0.1)).reward.passed is False  # margin 0.01
    v = judged(arm("x", (0,) * 4, gaps=gaps, rise=-0.05))
    assert v.reward.passed is None and "does not rise" in v.reward.reason
    loose = StabilityCriteria(reward_margin_fraction=0.5)
    assert verdict(arm("x", (0,) * 4, gaps=gaps, rise=0.1), loose, BF16).reward.passed is True


def test_the_reward_decision_uses_the_t_interval_over_seeds():
    # Two seeds: their bootstrap interval is their [min, max], above the margin -0.03; the t
    # interval (1 degree of freedom) is 9x wider and straddles it.
    x = arm("x", (0, 0), gaps=(-0.005, -0.025))
    assert x.reward_gap_ci.low >= -0.03
    v = judged(x)
    assert v.reward.passed is None and "straddles -0.0300" in v.reward.reason and "t [-0.142" in v.reward.value


def test_verdict_without_reference_is_undecided():
    v = verdict(arm("full", reference=False), C)
    assert v.reward.passed is None and v.passed is None and v.reward.reason == "no BF16 reference arm"
    assert v.spike.passed is None and v.spike.reason == "no BF16 reference arm"
    v = judged(arm("full", reference_judged=0))
    assert v.reward.passed is None and "no judged seed in the BF16 reference" in v.reward.reason


def test_too_few_judged_steps_is_undecided_not_fail():
    v = judged(arm("x", (5, 5), severe=(1, 0), judged=40, gaps=(-0.5, -0.6)))
    assert v.failed() == () and v.passed is None
    assert v.undecided() == ("spike", "collapse", "reward")
    assert "0 judged seed(s) here" in v.spike.reason and "40 judged steps, 50 needed" in v.spike.reason


def test_a_nonfinite_collapse_needs_no_power():
    v = judged(arm("x", judged=10, collapsed=(0,)))
    assert v.collapse.passed is False and v.spike.passed is None


def test_degenerate_seeds_are_not_judged():
    v = judged(arm("x", (9, 9), degenerate=(0, 1)))
    assert v.spike.passed is None and "no learning signal" in v.spike.reason
    assert v.collapse.passed is None and v.reward.passed is None


def test_one_judged_seed_decides_no_comparison():
    v = judged(arm("x", (30,), gaps=(-0.5,)))
    assert v.spike.passed is None and "1 judged seed(s) here" in v.spike.reason
    assert v.reward.passed is None and v.collapse.passed is None


def test_unconfirmed_reward_drop_keeps_collapse_undecided():
    v = judged(arm("x", unconfirmed=(1,)))
    assert v.collapse.passed is None and "not confirmed" in v.collapse.reason
    assert judged(arm("x", (0, 0, 0), unconfirmed=(1,))).collapse.passed is True  # 2 clear seeds remain


def loo_verdicts(**overrides):
    summaries = {"bf16": BF16, "full": arm("full", BF16_SPIKES), "full-dq": arm("full-dq", (4,) * 8),
                 "full-46": arm("full-46", (0,) * 8, collapsed=(0,)),
                 "full-hp": arm("full-hp", (0,) * 8, gaps=(-0.3, -0.4, -0.2, -0.35) * 2)}
    summaries.update(overrides)
    return run_verdicts({name: s for name, s in summaries.items() if s is not None}, C)


def test_claim_reproduced():
    claim = claim_reproduced(loo_verdicts())
    assert claim.reproduced is True
    assert "fails collapse" in claim.details["full-46"] and "fails spike" in claim.details["full-dq"]


def test_claim_not_reproduced_when_a_leave_one_out_arm_passes():
    claim = claim_reproduced(loo_verdicts(**{"full-46": arm("full-46", BF16_SPIKES)}))
    assert claim.reproduced is False
    assert "passes every criterion" in claim.details["full-46"]
    assert claim.explanation.startswith("Not reproduced")


def test_claim_not_reproduced_when_full_fails():
    claim = claim_reproduced(loo_verdicts(full=arm("full", BF16_SPIKES, gaps=(-0.2, -0.3, -0.15, -0.25) * 2)))
    assert claim.reproduced is False and "fails reward" in claim.details["full"]


def test_claim_undecided_with_a_missing_arm():
    claim = claim_reproduced(loo_verdicts(**{"full-hp": None}))
    assert claim.reproduced is None and "missing" in claim.details["full-hp"]


def test_claim_undecided_not_refuted_without_power():
    short = {name: arm(name, judged=30) for name in ("full", "full-dq", "full-46", "full-hp")}
    claim = claim_reproduced(run_verdicts({"bf16": BF16, **short}, C))
    assert claim.reproduced is None and claim.explanation.startswith("Undecided")
    assert "spike undecided (0 judged seed(s) here" in claim.details["full"]
    # A leave-one-out arm that passes what it could judge is not a refutation either.
    claim = claim_reproduced(loo_verdicts(**{"full-46": arm("full-46", (0,))}))
    assert claim.reproduced is None and "no criterion failed, but spike undecided" in claim.details["full-46"]


def test_claim_counts_a_failure_even_if_another_criterion_is_undecided():
    spiky_no_reward = arm("full-dq", (4,) * 8, rise=float("nan"))
    assert claim_reproduced(loo_verdicts(**{"full-dq": spiky_no_reward})).reproduced is True


def test_the_bf16_comparison_counts_a_step_whose_updates_both_spike_once():
    # 3 steps per seed spike in both of their updates: 3 spiking steps per seed, not 6 updates.
    import dataclasses

    def twice(x):
        st = tuple(s for s in range(30, 33) for _ in range(2))
        return dataclasses.replace(x, spikes=dataclasses.replace(x.spikes, spike_steps=st, spike_updates=(0, 1) * 3))

    base = arm("x", (0,) * 8)
    clustered = dataclasses.replace(base, seeds=tuple(twice(x) for x in base.seeds))
    assert [x.spikes.spiking_steps for x in clustered.seeds] == [3] * 8
    assert "24/2240 spiking steps" in judged(clustered).spike.value


def test_verdicts_on_fewer_than_4_seeds_are_flagged_few_seeds():
    two = judged(arm("full", (0, 0), gaps=(-0.01, -0.011)))
    assert (two.spike.few_seeds, two.collapse.few_seeds, two.reward.few_seeds) == (2, 2, 2)
    four = judged(arm("full", (0,) * 4, gaps=(0.0, -0.01, 0.01, 0.0)))
    assert four.passed is True and all(c.few_seeds is None for c in four.criteria)
    # An observed collapse fails at any number of seeds: not flagged.
    event = judged(arm("x", (0, 0), collapsed=(0,)))
    assert event.collapse.passed is False and event.collapse.few_seeds is None
    assert verdict(arm("full", (0, 0)), StabilityCriteria(few_seeds=2), BF16).spike.few_seeds is None


def test_spike_decision_on_counts_is_what_the_summary_judges():
    counts = [(2, 280, 0)] * 8
    reference = [(k, 280, s) for k, s in zip(BF16_SPIKES, BF16_SEVERE)]
    assert spike_decision(counts, reference, C) == judged(arm("x", (2,) * 8)).spike


def test_equivalence_of_two_arms_within_the_margins():
    from fp4rl.analysis.verdicts import equivalence

    full = arm("full", BF16_SPIKES, gaps=(-0.013, -0.01, -0.016, -0.012) * 2)
    nvfp4 = arm("nvfp4", (0, 1, 0, 0, 1, 0, 0, 0), gaps=(-0.02, -0.018, -0.022, -0.019) * 2)
    assert equivalence(nvfp4, full, C).passed is True
    lagging = arm("nvfp4", BF16_SPIKES, gaps=(-0.06, -0.058, -0.062, -0.059) * 2)  # 0.047 behind full, margin 0.03
    assert equivalence(lagging, full, C).passed is False
    spiky = arm("nvfp4", (5,) * 8, gaps=(-0.013, -0.01, -0.016, -0.012) * 2)  # 40/2240 against 3/2240
    assert equivalence(spiky, full, C).passed is False
    two = equivalence(arm("nvfp4", (0, 1), gaps=(-0.02, 0.01)), full, C)
    assert two.passed is None and "straddles" in two.reason
