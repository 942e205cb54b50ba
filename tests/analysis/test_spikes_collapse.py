"""Spike, collapse and power detection on synthetic series with known answers (docs/rl.md "Stability criteria")."""

import dataclasses

import numpy as np
import pytest

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import (
    detect_collapse, detect_spikes, find_spikes, judged_step_count, seed_power, spikes_per_100_steps,
)

C = StabilityCriteria()


def flat(n=100, level=0.5):
    return np.arange(n), np.full(n, level)


def test_criteria_defaults_are_rl_md_thresholds_and_declared_power():
    assert (C.spike_factor, C.severe_factor, C.window, C.warmup_steps) == (3.0, 10.0, 10, 20)
    assert (C.collapse_grad_factor, C.reward_drop, C.recovery_steps) == (100.0, 0.5, 50)
    assert (C.min_judged_steps, C.min_seeds, C.few_seeds) == (50, 2, 4)
    text = " ".join(C.describe())
    assert "50 judged steps" in text and ">= 2 judged seeds" in text and "UNDECIDED" in text


def test_criteria_frozen_and_validated():
    with pytest.raises(dataclasses.FrozenInstanceError):
        C.window = 10
    with pytest.raises(ValueError, match="spike_factor"):
        StabilityCriteria(spike_factor=12.0)  # a spike threshold above the severe one
    with pytest.raises(ValueError, match="window"):
        StabilityCriteria(window=0)
    with pytest.raises(ValueError, match="min_judged_steps"):
        StabilityCriteria(min_judged_steps=0)
    with pytest.raises(ValueError, match="saturated_accuracy"):
        StabilityCriteria(saturated_accuracy=0.5)


def test_injected_spikes_flagged_exactly_and_warmup_ignored():
    steps, g = flat()
    g[10] *= 12.0  # before step 20: never a spike
    g[30] *= 4.0  # spike, not severe
    g[45] *= 2.9  # below 3x: not a spike
    g[60] *= 12.0  # severe (and a spike)
    spike, severe = detect_spikes(g, steps, C)
    assert np.flatnonzero(spike).tolist() == [30, 60]
    assert np.flatnonzero(severe).tolist() == [60]
    # 2 spikes over the 80 steps at or after the warm-up (20..99).
    assert spikes_per_100_steps(spike, steps, C) == pytest.approx(2.5)
    assert spikes_per_100_steps(severe, steps, C) == pytest.approx(1.25)


def test_window_is_the_previous_10_values_not_whole_history():
    # A sustained 4x level shift at step 60 keeps being a spike until more than half of the
    # previous 10 values are at the new level: the median of x[t-10:t] is still 1 for t <= 64
    # (6+ ones in the window), and (1+4)/2 = 2.5 at t = 65, where 4 < 3 x 2.5.
    steps = np.arange(150)
    g = np.where(steps < 60, 1.0, 4.0)
    spike, severe = detect_spikes(g, steps, C)
    assert np.flatnonzero(spike).tolist() == list(range(60, 65))
    assert not severe.any()


def rising_then_flat(seed=0, n_steps=100, updates=2):
    """A smooth grad-norm trend like the start of RL on the arithmetic task (0.1 at steps 0-12,
    rising linearly to 0.5 at step 30, flat after), 2 updates per step, log-normal noise 0.05."""
    steps = np.repeat(np.arange(n_steps), updates)
    level = np.interp(steps, [0, 12, 30, n_steps - 1], [0.1, 0.1, 0.5, 0.5])
    return steps, level * np.exp(0.05 * np.random.default_rng(seed).standard_normal(steps.size))


@pytest.mark.parametrize("seed", range(5))
def test_a_smooth_rising_trend_is_not_a_spike(seed):
    # A median over 50 measurements (25 steps) lags the rise by ~12 steps: during the rise the
    # values are > 3x that lagging median though nothing but the trend moved. The baseline of
    # the previous 10 measurements follows it.
    steps, g = rising_then_flat(seed)
    lagging, _ = detect_spikes(g, steps, dataclasses.replace(C, window=50))
    assert lagging.any() and set(steps[lagging]) <= set(range(20, 31))  # only the rise
    spike, _ = detect_spikes(g, steps, C)
    assert not spike.any()


def test_an_isolated_4x_spike_on_the_trend_is_flagged_by_both_baselines():
    steps, g = rising_then_flat()
    g[2 * 60 + 1] *= 4.0  # step 60, update 1: on the plateau
    trend_only, _ = detect_spikes(rising_then_flat()[1], steps, dataclasses.replace(C, window=50))
    lagging, _ = detect_spikes(g, steps, dataclasses.replace(C, window=50))
    spike, severe = detect_spikes(g, steps, C)
    assert np.flatnonzero(lagging & ~trend_only).tolist() == [121]
    assert np.flatnonzero(spike).tolist() == [121] and not severe.any()


def test_nonfinite_values_are_not_spikes_and_leave_the_window():
    steps, g = flat()
    g[40:44] = np.nan
    g[50] = np.inf
    g[70] *= 4.0
    spike, _ = detect_spikes(g, steps, C)
    assert np.flatnonzero(spike).tolist() == [70]


def test_window_holds_the_previous_finite_measurements():
    # 60 finite values, then 60 non-finite ones: the window of the measurement after them is
    # still the last 10 finite values (median 1), so a 4x value there is a spike.
    steps = np.arange(121)
    g = np.ones(121)
    g[60:120] = np.nan
    g[120] = 4.0
    spike, _ = detect_spikes(g, steps, C)
    assert np.flatnonzero(spike).tolist() == [120]


def test_spikes_use_step_numbers_for_the_warmup():
    g = np.full(30, 0.5)
    g[5] *= 4.0
    # Steps 15..44: index 5 is step 20, past the warm-up.
    spike, _ = detect_spikes(g, np.arange(15, 45), C)
    assert np.flatnonzero(spike).tolist() == [5]


def per_update_series(n_steps=100, updates=2, level=0.5):
    steps = np.repeat(np.arange(n_steps), updates)
    return steps, np.tile(np.arange(updates), n_steps), np.full(n_steps * updates, level)


def test_a_spike_in_one_update_is_found_although_the_step_mean_hides_it():
    steps, update, g = per_update_series()
    g[2 * 60 + 1] *= 4.0  # step 60, update 1: 4x; the step's mean is 2.5x
    result = find_spikes(steps, g, update, C)
    assert result.spike_steps == (60,) and result.spike_updates == (1,) and result.severe_steps == ()
    assert result.per_update and (result.judged_steps, result.judged_updates) == (80, 160)
    assert result.per_100_steps == pytest.approx(100 / 80) and result.per_100_updates == pytest.approx(100 / 160)
    step_mean = g.reshape(100, 2).mean(axis=1)
    assert step_mean[60] / step_mean[0] == pytest.approx(2.5)
    assert find_spikes(np.arange(100), step_mean, None, C).spike_steps == ()  # the per-step mean misses it


def test_spiking_updates_of_one_step_count_once():
    # Both updates of step 70 spike (they share the step's rollouts): one spiking step, not two.
    steps, update, g = per_update_series()
    g[2 * 70] *= 4.0
    g[2 * 70 + 1] *= 12.0
    result = find_spikes(steps, g, update, C)
    assert result.spike_steps == (70, 70) and result.spike_updates == (0, 1)  # every spiking update listed
    assert result.severe_steps == (70,) and result.severe_updates == (1,)
    assert (result.spiking_steps, result.severe_spiking_steps) == (1, 1)
    assert result.per_100_steps == pytest.approx(100 / 80) and result.per_100_updates == pytest.approx(2 * 100 / 160)
    spike, _ = detect_spikes(g, steps, C)
    assert judged_step_count(steps, C) == 80  # distinct steps, not updates
    assert spikes_per_100_steps(spike, steps, C) == pytest.approx(100 / 80)


def test_collapse_to_nan():
    steps, g = flat()
    g[40:] = np.nan
    result = detect_collapse(steps, g, np.zeros(100), C)
    assert result.collapsed and result.step == 40 and result.kind == "non-finite"
    assert "non-finite grad_norm/global" in result.reason


def test_nonfinite_update_grad_norm_is_a_collapse_at_its_step():
    steps, update, g = per_update_series(50)
    g[2 * 30 + 1] = np.inf
    result = detect_collapse(np.arange(50), g, np.zeros(50), C, grad_steps=steps)
    assert result.collapsed and result.step == 30 and result.kind == "non-finite"
    flags = np.zeros(steps.size, bool)
    flags[2 * 25] = True
    result = detect_collapse(np.arange(50), np.full(steps.size, 0.5), np.zeros(50), C, grad_steps=steps,
                             update_metrics={"nonfinite (updates.jsonl)": (steps, flags)})
    assert result.collapsed and result.step == 25 and "nonfinite (updates.jsonl) flagged" in result.reason


def test_grad_norm_over_100x_early_median_collapses():
    steps, g = flat()
    g[:20] = 1.0  # early median := median of steps < 20 = 1.0
    g[20:] = 0.01
    g[70] = 99.0
    assert not detect_collapse(steps, g, np.zeros(100), C).collapsed
    g[75] = 101.0
    result = detect_collapse(steps, g, np.zeros(100), C)
    assert result.collapsed and result.step == 75 and result.early_median == 1.0 and result.kind == "grad norm"
    assert "100x the early median" in result.reason


def test_a_zero_early_median_is_no_reference():
    steps, g = flat()
    g[:20] = 0.0  # no update applied during the warm-up
    result = detect_collapse(steps, g, np.zeros(100), C)
    assert not result.collapsed and "was not checked" in result.note and np.isnan(result.early_median)


def reward_with_drop(n, drop_at, recover_at, best=0.3, low=-0.3):
    r = np.full(n, best)
    r[drop_at: n if recover_at is None else recover_at] = low
    return r


def test_reward_drop_of_06_recovering_in_30_steps_is_not_collapse():
    steps, g = flat(200)
    result = detect_collapse(steps, g, reward_with_drop(200, 50, 80), C)
    assert not result.collapsed and result.note is None


def test_reward_drop_never_recovering_is_collapse():
    steps, g = flat(200)
    result = detect_collapse(steps, g, reward_with_drop(200, 50, None), C)
    assert result.collapsed and result.step == 50 and result.kind == "reward"
    assert "reward fell" in result.reason


def test_reward_recovering_after_60_steps_is_collapse():
    steps, g = flat(200)
    result = detect_collapse(steps, g, reward_with_drop(200, 50, 110), C)
    assert result.collapsed and result.step == 50


def test_reward_drop_of_04_is_not_collapse():
    steps, g = flat(200)
    assert not detect_collapse(steps, g, reward_with_drop(200, 50, None, low=-0.1), C).collapsed


def test_unrecovered_drop_near_the_end_is_noted_not_judged():
    steps, g = flat(100)
    result = detect_collapse(steps, g, reward_with_drop(100, 80, None), C)
    assert not result.collapsed and result.reward_drop_unconfirmed
    assert "not confirmed" in result.note


def test_reward_not_logged_is_noted_not_a_collapse():
    steps, g = flat()
    result = detect_collapse(steps, g, None, C)
    assert not result.collapsed and "population/reward_mean not logged" in result.note


def test_other_metrics_respect_present_mask_and_flag():
    steps, g = flat()
    r = np.zeros(100)
    eval_acc = np.full(100, np.nan)
    eval_acc[::20] = 0.5
    present = {"eval/accuracy": ~np.isnan(eval_acc)}
    assert not detect_collapse(steps, g, r, C, other_metrics={"eval/accuracy": eval_acc}, present=present).collapsed
    kl = np.full(100, 1e-4)
    kl[33] = np.inf
    result = detect_collapse(steps, g, r, C, other_metrics={"mismatch/kl_k3": kl})
    assert result.collapsed and result.step == 33 and "mismatch/kl_k3" in result.reason
    flag = np.zeros(100, bool)
    flag[12] = True
    result = detect_collapse(steps, g, r, C, nonfinite_flag=flag)
    assert result.collapsed and result.step == 12


def test_earliest_collapse_event_is_reported():
    steps, g = flat(200)
    g[120:] = np.nan
    result = detect_collapse(steps, g, reward_with_drop(200, 30, None), C)
    assert result.step == 30 and "reward" in result.reason


def test_power_of_a_healthy_seed():
    steps = np.arange(100)
    power = seed_power(steps, np.zeros(100, bool), np.repeat(steps, 2), np.linspace(0.3, 0.6, 100), C)
    assert power.judged and (power.judged_steps, power.judged_updates, power.steps_after_warmup) == (80, 160, 80)


def test_too_few_judged_steps_is_underpowered():
    steps = np.arange(60)  # 40 steps at or after step 20
    power = seed_power(steps, np.zeros(60, bool), steps, np.full(60, 0.4), C)
    assert not power.judged and power.degenerate is None
    assert "40 judged steps" in power.underpowered and "50 needed" in power.reason


def test_all_groups_dropped_is_degenerate():
    steps = np.arange(100)
    idle = steps >= 30  # from step 30 on, dynamic sampling dropped every group
    power = seed_power(steps, idle, steps[steps < 30], np.full(100, 0.4), C)
    assert not power.judged and "70 of 80 steps >= 20 applied no update" in power.degenerate
    assert power.underpowered  # and only 10 judged steps


@pytest.mark.parametrize("accuracy, word", [(0.0, "<= 0.02"), (1.0, ">= 0.98")])
def test_saturated_accuracy_is_degenerate(accuracy, word):
    steps = np.arange(100)
    power = seed_power(steps, np.zeros(100, bool), steps, np.full(100, accuracy), C)
    assert not power.judged and word in power.degenerate and "no learning signal" in power.degenerate
    assert seed_power(steps, np.zeros(100, bool), steps, None, C).judged  # not logged: not checked
