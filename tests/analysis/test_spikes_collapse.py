"""Spike and collapse detection on synthetic series with known answers (RL.md "Stability criteria")."""

import dataclasses

import numpy as np
import pytest

from fp4rl.analysis.stability import StabilityCriteria, detect_collapse, detect_spikes, spikes_per_100_steps

C = StabilityCriteria()


def flat(n=100, level=0.5):
    return np.arange(n), np.full(n, level)


def test_criteria_defaults_are_rl_md_thresholds():
    assert (C.spike_factor, C.severe_factor, C.window, C.warmup_steps) == (3.0, 10.0, 50, 20)
    assert (C.collapse_grad_factor, C.reward_drop, C.recovery_steps) == (100.0, 0.5, 50)


def test_criteria_frozen_and_validated():
    with pytest.raises(dataclasses.FrozenInstanceError):
        C.window = 10
    with pytest.raises(ValueError, match="spike_factor"):
        StabilityCriteria(spike_factor=12.0)  # a spike threshold above the severe one
    with pytest.raises(ValueError, match="window"):
        StabilityCriteria(window=0)


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


def test_window_is_previous_50_values_not_whole_history():
    # A sustained 4x level shift at step 60 keeps being a spike until more than half of the
    # previous 50 values are at the new level: the median of x[t-50:t] is still 1 for t <= 84
    # (26+ ones in the window), and (1+4)/2 = 2.5 at t = 85, where 4 < 3 x 2.5.
    steps = np.arange(150)
    g = np.where(steps < 60, 1.0, 4.0)
    spike, severe = detect_spikes(g, steps, C)
    assert np.flatnonzero(spike).tolist() == list(range(60, 85))
    assert not severe.any()


def test_nonfinite_values_are_not_spikes_and_leave_the_window():
    steps, g = flat()
    g[40:44] = np.nan
    g[50] = np.inf
    g[70] *= 4.0
    spike, _ = detect_spikes(g, steps, C)
    assert np.flatnonzero(spike).tolist() == [70]


def test_spikes_use_step_numbers_for_the_warmup():
    g = np.full(30, 0.5)
    g[5] *= 4.0
    # Steps 15..44: index 5 is step 20, past the warm-up.
    spike, _ = detect_spikes(g, np.arange(15, 45), C)
    assert np.flatnonzero(spike).tolist() == [5]


def test_collapse_to_nan():
    steps, g = flat()
    g[40:] = np.nan
    result = detect_collapse(steps, g, np.zeros(100), C)
    assert result.collapsed and result.step == 40
    assert "non-finite grad_norm/global" in result.reason


def test_grad_norm_over_100x_early_median_collapses():
    steps, g = flat()
    g[:20] = 1.0  # early median := median of steps < 20 = 1.0
    g[20:] = 0.01
    g[70] = 99.0
    assert not detect_collapse(steps, g, np.zeros(100), C).collapsed
    g[75] = 101.0
    result = detect_collapse(steps, g, np.zeros(100), C)
    assert result.collapsed and result.step == 75 and result.early_median == 1.0
    assert "100x the early median" in result.reason


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
    assert result.collapsed and result.step == 50
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
    assert not result.collapsed
    assert "not confirmed" in result.note


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
