"""`fp4rl.analysis.learning`: curves from the trainer's evaluations, the slope, the decision rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import learning as learning_cli
from fp4rl.analysis import learning
from fp4rl.analysis.statistics import BootstrapCI


def _write_seed(path, initial, later, n=256):
    """metrics.jsonl of one seed: eval/initial_* with step 0, then evaluations after steps 10, 20..."""
    path.mkdir(parents=True)
    lines = []
    for step in range(10 * len(later)):
        record = {"step": step}
        if step == 0:
            record.update({"eval/initial_sampled_accuracy": initial, "eval/initial_accuracy": 0.9, "eval/initial_n": n})
        if (step + 1) % 10 == 0:
            acc = later[(step + 1) // 10 - 1]
            record.update({"eval/sampled_accuracy": acc, "eval/accuracy": 0.9, "eval/n": n})
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_clear_gain_is_learning(tmp_path):
    for seed, start in ((0, 0.40), (1, 0.42)):
        _write_seed(tmp_path / "bf16" / f"seed{seed}", start, [0.6, 0.7, 0.75])
    result = learning.summarize(tmp_path / "bf16")
    assert [c.steps.tolist() for c in result.curves] == [[0, 10, 20, 30]] * 2
    assert result.change.mean == pytest.approx(0.75 - 0.41)
    assert result.verdict == "learns" and result.change.low > 0
    assert result.slope_per_100 > 0 and result.slope_t > 2
    text = learning.markdown(result)
    assert "verdict: learns" in text and learning.LEARNING_RULE in text
    # Two seeds, +0.35 and +0.33: the t interval over seeds, 0.34 +- 12.71 x 0.01, is reported beside the bootstrap's.
    assert result.change.t_interval == pytest.approx((0.34 - 0.12706, 0.34 + 0.12706), abs=1e-5)
    assert "t interval over seeds [+0.213, +0.467]" in text
    assert learning.plot(result, tmp_path / "l.png").stat().st_size > 0


def test_no_change_on_few_problems_is_undecided_not_a_failure(tmp_path):
    """0 of 8 before and after: the Jeffreys redraw keeps the interval wide, so no verdict."""
    for seed in (0, 1):
        _write_seed(tmp_path / "bf16" / f"seed{seed}", 0.0, [0.0], n=8)
    result = learning.summarize(tmp_path / "bf16")
    assert result.verdict == "UNDECIDED", result.reason
    assert result.change.low < 0 < result.change.high


def test_decision_rule_outcomes():
    ci = lambda mean, low, high: BootstrapCI(mean, low, high, 2, 0.95, False)  # noqa: E731
    assert learning.decide(ci(0.2, 0.05, 0.3))[0] == "learns"
    assert learning.decide(ci(0.2, -0.01, 0.3))[0] == "UNDECIDED"  # CI touches 0
    assert learning.decide(ci(0.05, 0.01, 0.08))[0] == "does not learn"  # CI below the 0.10 gain
    assert learning.decide(ci(0.08, 0.01, 0.15))[0] == "UNDECIDED"


def test_pooled_slope_removes_seed_offsets():
    curves = [learning.SeedCurve(s, np.array([0, 10, 20]), np.array([0.1, 0.2, 0.3]) + s, np.zeros(3), np.full(3, 64))
              for s in (0, 1)]
    slope, t = learning.pooled_slope(curves)
    assert slope == pytest.approx(0.01) and t > 1e6  # a perfect line: no residual but rounding


def test_a_run_without_the_initial_evaluation_is_refused(tmp_path):
    seed = tmp_path / "bf16" / "seed0"
    seed.mkdir(parents=True)
    (seed / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    with pytest.raises(ValueError, match="eval/initial_sampled_accuracy"):
        learning.summarize(tmp_path / "bf16")
    with pytest.raises(FileNotFoundError):
        learning.summarize(tmp_path / "missing")


def _write_long_seed(path, accuracies, reward, every=25, n=512):
    """metrics.jsonl of a long run: evaluations after steps 25, 50...; population reward every step."""
    path.mkdir(parents=True)
    lines = []
    for step in range(every * (len(accuracies) - 1)):
        record = {"step": step, "population/reward_mean": reward(step)}
        if step == 0:
            record.update({"eval/initial_sampled_accuracy": accuracies[0], "eval/initial_accuracy": 0.5, "eval/initial_n": n})
        if (step + 1) % every == 0:
            record.update({"eval/sampled_accuracy": accuracies[(step + 1) // every], "eval/accuracy": 0.5, "eval/n": n})
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _long_run(tmp_path, late_gain, reward=lambda step: -0.2 + step / 400):
    for seed in (0, 1):
        acc = [0.30 + 0.1 * k / 6 if k <= 6 else 0.40 + late_gain * (k - 6) / 6 for k in range(13)]
        _write_long_seed(tmp_path / "bf16" / f"seed{seed}", acc, reward)
    return tmp_path / "bf16"


def test_the_long_horizon_bar_needs_a_late_gain(tmp_path):
    bar = learning.long_horizon_bar(_long_run(tmp_path / "a", late_gain=0.15), (150, 300), 0.8, 150)
    assert bar.verdict == "keeps learning" and bar.steps == ((150, 300), (150, 300))
    assert bar.change.mean == pytest.approx(0.15) and bar.max_reward_before < 0.8
    flat = learning.long_horizon_bar(_long_run(tmp_path / "b", late_gain=0.0), (150, 300), 0.8, 150)
    assert flat.verdict == "UNDECIDED"  # no gain: the CI spans 0
    falling = learning.long_horizon_bar(_long_run(tmp_path / "c", late_gain=-0.2), (150, 300), 0.8, 150)
    assert falling.verdict == "does not keep learning"
    assert "Long-horizon bar" in learning.window_markdown(bar) and learning.LONG_HORIZON_RULE in learning.window_markdown(bar)


def test_the_long_horizon_bar_fails_a_task_solved_early(tmp_path):
    bar = learning.long_horizon_bar(_long_run(tmp_path, late_gain=0.15, reward=lambda step: 0.9), (150, 300), 0.8, 150)
    assert bar.verdict == "does not keep learning" and "reached 0.900" in bar.reason


def test_the_window_needs_two_evaluations_per_seed(tmp_path):
    with pytest.raises(ValueError, match="fewer than two evaluations in steps 290..300"):
        learning.long_horizon_bar(_long_run(tmp_path, late_gain=0.1), (290, 300), 0.8, 150)


def test_the_cli_judges_the_window_and_refuses_bad_options(tmp_path, capsys):
    arm = _long_run(tmp_path, late_gain=0.15)
    learning_cli.main([str(arm), "--window=150:300", "--reward_cap=0.8@150"])
    assert "verdict: keeps learning" in capsys.readouterr().out and (arm / "learning.md").exists()
    for bad in (["--window=300:150"], ["--window=a"], ["--reward_cap=0.8"]):
        with pytest.raises(SystemExit):
            learning_cli.main([str(arm), *bad])


def _add_failure_split(path, initial: dict, last: dict):
    """Add the evaluations' failure split ({"greedy_wrong_chain": ...}) to a seed written by `_write_seed`."""
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        if "eval/initial_n" in record:
            record.update({f"eval/initial_{k}": v for k, v in initial.items()})
        if "eval/n" in record:
            record.update({f"eval/{k}": v for k, v in last.items()})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def test_the_report_says_which_failures_grew_when_greedy_falls(tmp_path):
    initial = {"sampled_miscopied": 0.27, "sampled_wrong_chain": 0.40, "greedy_miscopied": 0.0, "greedy_wrong_chain": 0.16}
    last = {"sampled_miscopied": 0.10, "sampled_wrong_chain": 0.42, "greedy_miscopied": 0.0, "greedy_wrong_chain": 0.25}
    for seed in (0, 1):
        _write_seed(tmp_path / "bf16" / f"seed{seed}", 0.30, [0.40, 0.45])
        _add_failure_split(tmp_path / "bf16" / f"seed{seed}", initial, last)
    # the greedy accuracy of `_write_seed` is 0.9 throughout: make it fall
    for seed in (0, 1):
        metrics = tmp_path / "bf16" / f"seed{seed}" / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        records[-1]["eval/accuracy"] = 0.75
        metrics.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = learning.summarize(tmp_path / "bf16")
    assert result.failures[("sampled", "miscopied")] == pytest.approx((0.27, 0.10))
    text = learning.markdown(result)
    assert "| sampled | 0.270 -> 0.100 | 0.400 -> 0.420 |" in text
    assert "Greedy accuracy fell (0.900 -> 0.750)" in text and "the scratchpad's arithmetic" in text


def test_runs_without_the_failure_split_report_none(tmp_path):
    for seed in (0, 1):
        _write_seed(tmp_path / "bf16" / f"seed{seed}", 0.30, [0.40])
    result = learning.summarize(tmp_path / "bf16")
    assert result.failures is None and "Wrong responses by kind" not in learning.markdown(result)


def test_the_wrong_kinds_read_are_those_the_trainer_logs():
    from fp4rl.rl import failures

    assert learning.WRONG_KINDS == failures.KINDS[1:]
