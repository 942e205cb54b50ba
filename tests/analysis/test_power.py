"""The power of a planned matrix's tests, stated before it runs (fp4rl.analysis.power)."""

import math
from pathlib import Path

import numpy as np
import pytest

from fp4rl.analysis import power
from fp4rl.analysis.statistics import detectable_rate, fisher_power

REPO = Path(__file__).resolve().parents[2]


def test_planned_matrix_counts_judged_steps_not_updates():
    plan = power.PlannedMatrix(seeds=8, steps=300, updates_per_step=2)
    assert (plan.judged_steps, plan.reference_judged_steps) == (8 * 280, 8 * 280)
    assert power.PlannedMatrix(4, 300, reference_seeds=8).reference_judged_steps == 8 * 280
    with pytest.raises(ValueError):
        power.PlannedMatrix(seeds=2, steps=20)  # nothing judged after the 20-step warm-up


def test_step_rate_from_independent_updates():
    assert power.step_rate_from_update_rate(0.01, 2) == pytest.approx(1 - 0.99**2)
    assert power.step_rate_from_update_rate(0.01, 1) == pytest.approx(0.01)


@pytest.mark.parametrize("seeds, gap", [(3, 0.003), (4, 0.002), (8, 0.0015)])
def test_paired_t_power_is_the_noncentral_t_law(seeds, gap):
    from scipy.stats import nct, t

    sd, crit = 0.002, t.ppf(0.975, seeds - 1)
    nc = gap * math.sqrt(seeds) / sd
    expected = nct.sf(crit, seeds - 1, nc) + nct.cdf(-crit, seeds - 1, nc)
    assert power.paired_t_power(gap, sd, seeds) == pytest.approx(expected, rel=1e-6)
    assert power.paired_t_power(0.0, sd, seeds) == pytest.approx(0.05, rel=1e-6)  # the test's size


def test_paired_t_power_by_simulation_with_two_seeds():
    # 1 degree of freedom, where scipy's noncentral t fails at large nc: a Monte Carlo check.
    rng = np.random.default_rng(0)
    x = rng.normal(0.02, 0.002, size=(20000, 2))
    half = 12.7062 * x.std(axis=1, ddof=1) / math.sqrt(2)
    simulated = np.mean(np.abs(x.mean(axis=1)) > half)
    assert power.paired_t_power(0.02, 0.002, 2) == pytest.approx(simulated, abs=0.01)


def test_detectable_gap_is_where_the_power_reaches_80_percent():
    gap = power.detectable_paired_gap(0.002, 8)
    assert power.paired_t_power(gap, 0.002, 8) == pytest.approx(0.8, abs=1e-6)
    assert power.detectable_paired_gap(0.002, 4) > gap  # fewer seeds detect only larger gaps
    assert power.detectable_paired_gap(0.002, 1) == math.inf
    from scipy.stats import t

    assert power.t_half_width(0.002, 8) == pytest.approx(t.ppf(0.975, 7) * 0.002 / math.sqrt(8))


def test_detectable_spike_rate_of_a_plan():
    plan = power.PlannedMatrix(seeds=4, steps=300)
    p = power.plan_power(plan, baseline_step_rate=1 / 160, gap_sd=0.002)
    n = plan.judged_steps
    assert fisher_power(n, p.detectable_step_rate, n, 1 / 160, 0.05) >= 0.8
    assert fisher_power(n, p.detectable_step_rate - 5e-4, n, 1 / 160, 0.05) < 0.8
    more = power.plan_power(power.PlannedMatrix(seeds=8, steps=300), 1 / 160, 0.002)
    assert more.detectable_step_rate < p.detectable_step_rate and more.detectable_gap < p.detectable_gap
    # The measured-reference form is the same bisection at the measured rate.
    assert detectable_rate(320, 2, 320) == power.detectable_rate_at(320, 320, 2 / 320)


def test_defaults_are_what_matrix_h200_measures():
    (k, n), sd = power.measured_defaults(REPO / "results" / "matrix_h200")
    assert (k, n) == power.MATRIX_H200_BF16_SPIKING_STEPS
    assert sd == pytest.approx(power.MATRIX_H200_GAP_SD, abs=5e-5)


def test_cli_prints_the_rule_and_one_row_per_seed_count(capsys):
    power.main(["--seeds", "8,4", "--steps", "300"])
    out = capsys.readouterr().out
    assert "Decision rule, stated before the runs" in out and "one-sided Fisher exact test" in out
    rows = [line for line in out.splitlines() if line.startswith("| 8 |") or line.startswith("| 4 |")]
    assert len(rows) == 2 and "| 2240 (2240) |" in rows[0] and "| 1120 (1120) |" in rows[1]
    assert "1/160 steps, sd 0.002" in out  # the defaults say where they come from
    power.main(["--seeds", "4", "--steps", "300", "--baseline-update-rate", "0.005", "--gap-sd", "0.01"])
    out = capsys.readouterr().out
    assert "| 1.00% |" in out and "| 0.0100 |" in out  # 1 - 0.995^2 = 0.9975%
    with pytest.raises(SystemExit) as e:
        power.main(["--help"])
    assert e.value.code == 0 and "--baseline-step-rate" in capsys.readouterr().out


def test_a_bf16_only_run_gives_the_rate_and_says_whose_gap_sd_is_assumed(tmp_path, capsys):
    from fp4rl.analysis.runs import ARMS
    from fp4rl.analysis.synthetic import make_synthetic_run

    make_synthetic_run(tmp_path, ARMS[:1], seeds=2, steps=120)
    power.main(["--seeds", "4", "--steps", "300", "--from-run", str(tmp_path)])
    out = capsys.readouterr().out
    assert "no other arm with 2+ seeds there, so the gap sd is results/matrix_h200's 0.002" in out
    make_synthetic_run(tmp_path / "short", ARMS[:1], seeds=2, steps=60)
    with pytest.raises(SystemExit):
        power.main(["--from-run", str(tmp_path / "short")])
    assert "BF16 has no judged step" in capsys.readouterr().err
