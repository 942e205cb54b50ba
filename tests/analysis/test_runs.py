"""Loading run directories (fp4rl.analysis.runs) and the synthetic generator."""

import json

import numpy as np
import pytest

from fp4rl.analysis.runs import ARMS, REQUIRED_KEYS, RunLoadWarning, load_run, load_seed, stack_seeds
from fp4rl.analysis.stability import detect_spikes
from fp4rl.analysis.synthetic import injected_spikes, make_synthetic_run


def write_lines(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def rec(step, **kw):
    """A complete record: every required key 1.0, overridden by kw."""
    return json.dumps({**dict.fromkeys(REQUIRED_KEYS, 1.0), "step": step, **kw})


def test_partial_last_line_is_ignored_with_a_warning(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [rec(0), rec(1), rec(2), '{"step": 3, "reward/me'])
    with pytest.warns(RunLoadWarning, match="partially written last line"):
        run = load_seed(path, "full", 0)
    assert run.steps.tolist() == [0, 1, 2]


def test_corrupt_line_before_the_last_raises(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [rec(0), "{not json", rec(2)])
    with pytest.raises(ValueError, match=r"m.jsonl:2"):
        load_seed(path, "full", 0)


def test_optional_keys_nonfinite_values_bools_and_relogged_steps(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [
        rec(0, **{"eval/accuracy": 0.25}, nonfinite=False),
        rec(2, **{"grad_norm/global": float("nan")}, nonfinite=True),
        rec(1, **{"grad_norm/global": float("inf")}),
        rec(2, **{"eval/accuracy": 0.5}),  # re-logged step 2: this record wins
        "",
    ])
    with pytest.warns(RunLoadWarning, match="re-logged"):
        run = load_seed(path, "+dq", 3)
    assert run.steps.tolist() == [0, 1, 2]
    g = run.metrics["grad_norm/global"]
    assert g[0] == 1.0 and np.isposinf(g[1]) and g[2] == 1.0
    acc = run.metrics["eval/accuracy"]
    assert acc[0] == 0.25 and np.isnan(acc[1]) and acc[2] == 0.5
    assert run.present["eval/accuracy"].tolist() == [True, False, True]
    assert run.last_logged("eval/accuracy") == (2, 0.5)
    assert run.last_logged("not/a/key") is None
    assert run.metrics["nonfinite"].dtype == bool and run.metrics["nonfinite"].tolist() == [False, False, False]
    assert run.present["nonfinite"].tolist() == [True, False, False]


def test_missing_required_key_warns(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [json.dumps({"step": 0, "reward/mean": 0.0, "grad_norm/global": 1.0})])
    with pytest.warns(RunLoadWarning, match="never logged: accuracy, grad_norm/shared_expert"):
        run = load_seed(path, "full", 0)
    assert "mismatch/kl_k3" in run.missing_required() and "step" not in run.missing_required()


def test_load_run_layout_order_and_alignment(tmp_path):
    make_synthetic_run(tmp_path, ["full", "+dq", "bf16"], seeds=[0, 4], steps=40)
    (tmp_path / "checkpoints").mkdir()  # not an arm: no seed<k>/metrics.jsonl
    write_lines(tmp_path / "nvfp4" / "seed1" / "metrics.jsonl", [rec(s) for s in range(25)])
    run = load_run(tmp_path)
    assert run.arm_names == ("bf16", "nvfp4", "+dq", "full")  # RL.md's table order
    assert list(run.arms["+dq"]) == [0, 4] and run.warnings == ()
    assert len(run.arms["bf16"][4]) == 40
    steps, values = stack_seeds([run.arms["nvfp4"][1], run.arms["full"][0]], "grad_norm/global")
    assert steps.tolist() == list(range(40)) and values.shape == (2, 40)
    assert np.isnan(values[0, 25:]).all() and np.isfinite(values[1]).all()


def test_load_run_without_metrics_raises(tmp_path):
    (tmp_path / "full").mkdir()
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path)


def test_synthetic_run_has_every_key_and_the_injected_spikes(tmp_path):
    make_synthetic_run(tmp_path, ARMS, seeds=2, steps=60, spiky_arms=("nvfp4",))
    run = load_run(tmp_path)
    assert run.arm_names == ARMS and run.warnings == ()
    spike_step, severe_step = injected_spikes(60)
    for sr in run.runs():
        assert sr.missing_required() == ()
        spike, severe = detect_spikes(sr.metrics["grad_norm/global"], sr.steps)
        expected = [spike_step, severe_step] if sr.arm == "nvfp4" else []
        assert sr.steps[spike].tolist() == expected
        assert sr.steps[severe].tolist() == expected[1:]
        assert sr.last_logged("eval/accuracy")[0] == 59


def test_synthetic_run_is_deterministic(tmp_path):
    a = make_synthetic_run(tmp_path / "a", ["full"], 1, 30, seed=7)
    b = make_synthetic_run(tmp_path / "b", ["full"], 1, 30, seed=7)
    assert (a / "full/seed0/metrics.jsonl").read_text() == (b / "full/seed0/metrics.jsonl").read_text()
