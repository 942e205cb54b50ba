"""The claim rule's operating characteristics by simulation (fp4rl.analysis.power)."""

import math
from pathlib import Path

import numpy as np
import pytest

from experiments import rule_power as rule_power_cli
from fp4rl.analysis import power
from fp4rl.analysis.criteria import StabilityCriteria

REPO = Path(__file__).resolve().parents[2]
C = StabilityCriteria()


def test_the_scenarios_say_what_the_margins_make_of_them():
    noise = power.NoiseModel()
    truths = [s.truth(noise, C) for s in power.default_scenarios(C, noise)]
    # 2x and 4x BF16's 0.13/100 stay inside the 0.5/100 margin: by the rule's own definition the
    # leave-one-out arms are then as stable as BF16, and the claim does not hold.
    assert truths == ["NOT REPRODUCED", "NOT REPRODUCED", "REPRODUCED", "NOT REPRODUCED", "NOT REPRODUCED",
                      "NOT REPRODUCED"]


def test_a_true_claim_is_reproduced_and_a_false_one_is_not():
    noise = power.NoiseModel(dispersion=0.0)
    holds, none_needed, full_spiky = (power.default_scenarios(C, noise)[i] for i in (2, 3, 4))
    p = power.operating_point(holds, seeds=16, steps=300, replicates=200, noise=noise)
    assert p.outcomes["REPRODUCED"] > 0.9 and p.full_spike_pass > 0.9 and p.loo_spike_fail > 0.95
    for truth in (none_needed, full_spiky):
        q = power.operating_point(truth, seeds=8, steps=300, replicates=200, noise=noise)
        assert q.outcomes["REPRODUCED"] < 0.03 and q.outcomes["NOT REPRODUCED"] > 0.8
    assert sum(p.outcomes.values()) == pytest.approx(1.0)


def test_two_seeds_decide_almost_nothing():
    p = power.operating_point(power.default_scenarios()[2], seeds=2, steps=300, replicates=200)
    assert p.outcomes["UNDECIDED"] > 0.9


def test_the_simulation_is_reproducible():
    truth = power.default_scenarios()[1]
    assert power.operating_point(truth, 4, 300, 50, seed=3) == power.operating_point(truth, 4, 300, 50, seed=3)


def test_the_spike_test_keeps_its_level_when_spikes_cluster_in_seeds():
    for dispersion in (0.0, 1.0, 3.0):
        noise = power.NoiseModel(bf16_step_rate=0.01, dispersion=dispersion)
        size = power.false_spike_failure_rate(8, 300, 1000, noise)
        assert size <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 1000)


def test_defaults_are_what_the_chain_matrix_measures():
    m = power.measured_defaults(REPO / "results" / "long_h200" / "chain" / "matrix")
    assert (m["bf16_spiking_steps"], m["bf16_judged_steps"]) == power.CHAIN_BF16_SPIKING_STEPS
    assert m["severe_fraction"] == pytest.approx(power.CHAIN_SEVERE_FRACTION)
    assert m["gap_sd"] == pytest.approx(power.CHAIN_GAP_SD, abs=5e-4)
    assert (m["reward_rise"], m["rise_sd"]) == pytest.approx(power.CHAIN_REWARD_RISE, abs=5e-4)
    assert round(m["dispersion"]) == power.CHAIN_DISPERSION


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


def test_cli_prints_the_rule_and_writes_the_table(tmp_path, capsys):
    rule_power_cli.main(["--seeds", "2,4", "--replicates", "20", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Decision rule, stated before the runs" in out and "non-inferiority margin" in out
    rows = [line for line in out.splitlines() if line.startswith("| leave-one-out arms spike 10x")]
    assert [r.split("|")[3].strip() for r in rows] == ["2", "4"]
    readme = (tmp_path / "README.md").read_text()
    assert "`python -m experiments.rule_power --seeds 2,4 --replicates 20 --out" in readme and "commit" in readme
    rule_power_cli.main(["--seeds", "2", "--replicates", "20", "--dispersion", "0", "--out", str(tmp_path)])
    readme = (tmp_path / "README.md").read_text()
    assert readme.count("\n## ") == 2  # one section per command
    with pytest.raises(SystemExit) as e:
        rule_power_cli.main(["--help"])
    assert e.value.code == 0 and "--spike-margin" in capsys.readouterr().out


def test_a_bf16_only_run_measures_the_rate_and_says_what_it_keeps(tmp_path, capsys):
    from fp4rl.analysis.runs import ARMS
    from fp4rl.analysis.synthetic import make_synthetic_run

    make_synthetic_run(tmp_path, ARMS[:1], seeds=2, steps=120)
    rule_power_cli.main(["--seeds", "4", "--replicates", "10", "--from-run", str(tmp_path)])
    out = capsys.readouterr().out
    assert "not measurable there, so the chain matrix's: severe_fraction" in out and "gap_sd" in out
    make_synthetic_run(tmp_path / "short", ARMS[:1], seeds=2, steps=60)
    with pytest.raises(SystemExit):
        rule_power_cli.main(["--from-run", str(tmp_path / "short")])
    assert "BF16 has no judged step" in capsys.readouterr().err
