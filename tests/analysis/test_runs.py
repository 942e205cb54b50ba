"""Loading run directories (fp4rl.analysis.runs) and the synthetic generator."""

import json

import numpy as np
import pytest

from fp4rl.analysis.detectors import detect_spikes
from fp4rl.analysis.runs import (
    ARMS, REQUIRED_KEYS, RunLoadWarning, grad_norm_measurements, load_run, load_seed, stack_seeds,
)
from fp4rl.analysis.synthetic import SEVERE_FACTOR, SPIKE_FACTOR, injected_spikes, make_synthetic_run


def write_lines(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def rec(step, **kw):
    """A complete record: every required key 1.0, overridden by kw."""
    return json.dumps({**dict.fromkeys(REQUIRED_KEYS, 1.0), "step": step, **kw})


def upd(step, update, **kw):
    return json.dumps({"step": step, "update": update, "empty": False, "skipped": False, "nonfinite": False,
                       "grad_norm/global": 1.0, **kw})


def test_required_keys_are_the_population_ones():
    assert "accuracy" not in REQUIRED_KEYS
    assert {"population/reward_mean", "population/accuracy", "updates/applied", "updates/empty"} <= set(REQUIRED_KEYS)


def test_partial_last_line_is_ignored_with_a_warning(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [rec(0), rec(1), rec(2), '{"step": 3, "reward/me'])
    with pytest.warns(RunLoadWarning, match="partially written last line"):
        run = load_seed(path, "full", 0)
    assert run.steps.tolist() == [0, 1, 2]
    assert run.updates is None  # no updates.jsonl beside it


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
    assert [a.tolist() for a in run.logged("eval/accuracy")] == [[0, 2], [0.25, 0.5]]
    assert run.metrics["nonfinite"].dtype == bool and run.metrics["nonfinite"].tolist() == [False, False, False]
    assert run.present["nonfinite"].tolist() == [True, False, False]


def test_missing_required_key_warns(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [json.dumps({"step": 0, "reward/mean": 0.0, "accuracy": 0.5,
                                                          "grad_norm/global": 1.0})])
    with pytest.warns(RunLoadWarning, match="never logged: population/reward_mean, population/accuracy, updates/applied"):
        run = load_seed(path, "full", 0)
    assert "mismatch/kl_k3" in run.missing_required() and "step" not in run.missing_required()


def test_updates_jsonl_is_loaded_with_the_same_tolerance(tmp_path):
    metrics = write_lines(tmp_path / "seed0" / "metrics.jsonl", [rec(0), rec(1), rec(2)])
    write_lines(tmp_path / "seed0" / "updates.jsonl", [
        upd(0, 0), upd(0, 1, **{"grad_norm/global": 2.0}), upd(1, 1), upd(1, 0, empty=True, skipped=True),
        upd(1, 1, **{"grad_norm/global": 3.0}),  # re-logged: this record wins
        upd(2, 0), upd(3, 0),  # step 3 is not in metrics.jsonl (killed between the two files)
        '{"step": 3, "update": 1, "grad_n',  # torn last line
    ])
    with pytest.warns(RunLoadWarning) as record:
        run = load_seed(metrics, "full", 0)
    text = " ".join(str(w.message) for w in record)
    assert "updates.jsonl:8: ignoring partially written last line" in text
    assert "1 re-logged update(s)" in text and "1 step(s) not in metrics.jsonl" in text
    u = run.updates
    assert list(zip(u.steps.tolist(), u.update.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert u.metrics["grad_norm/global"].tolist() == [1.0, 2.0, 1.0, 3.0, 1.0]
    assert u.measured().tolist() == [True, True, False, True, True]
    m = grad_norm_measurements(run)  # the empty update is not a measurement
    assert m.per_update and m.steps.tolist() == [0, 0, 1, 2] and m.values.tolist() == [1.0, 2.0, 3.0, 1.0]
    assert m.update.tolist() == [0, 1, 1, 0] and "updates.jsonl" in m.source
    assert m.step_max(np.array([0, 1, 2, 7])).tolist()[:3] == [2.0, 3.0, 1.0] and np.isnan(m.step_max(np.array([7])))[0]


def test_corrupt_updates_line_before_the_last_raises(tmp_path):
    metrics = write_lines(tmp_path / "metrics.jsonl", [rec(0), rec(1)])
    write_lines(tmp_path / "updates.jsonl", [upd(0, 0), "{oops", upd(1, 0)])
    with pytest.raises(ValueError, match=r"updates.jsonl:2"):
        load_seed(metrics, "full", 0)
    write_lines(tmp_path / "updates.jsonl", [upd(0, 0), json.dumps({"step": 1}), upd(1, 0)])
    with pytest.raises(ValueError, match=r"updates.jsonl:2: expected a JSON object with key\(s\) 'step', 'update'"):
        load_seed(metrics, "full", 0)


def test_without_updates_the_per_step_grad_norm_is_measured(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [
        rec(0, **{"grad_norm/global": 0.5}),
        rec(1, **{"grad_norm/global": 0.0, "updates/applied": 0}),  # every mini-batch empty: no measurement
        rec(2, **{"grad_norm/global": 0.7, "updates/applied": 2}),
    ])
    m = grad_norm_measurements(load_seed(path, "full", 0))
    assert not m.per_update and m.steps.tolist() == [0, 2] and m.values.tolist() == [0.5, 0.7]
    assert m.update.tolist() == [-1, -1] and "per-step mean" in m.source


def test_load_run_layout_order_configs_and_alignment(tmp_path):
    make_synthetic_run(tmp_path, ["full", "+dq", "bf16"], seeds=[0, 4], steps=40)
    (tmp_path / "checkpoints").mkdir()  # not an arm: no seed<k>/metrics.jsonl
    write_lines(tmp_path / "nvfp4" / "seed1" / "metrics.jsonl", [rec(s) for s in range(25)])
    run = load_run(tmp_path)
    assert run.arm_names == ("bf16", "nvfp4", "+dq", "full")  # docs/rl.md's table order
    assert list(run.arms["+dq"]) == [0, 4] and run.warnings == ()
    assert len(run.arms["bf16"][4]) == 40 and len(run.arms["bf16"][4].updates) == 80
    assert set(run.configs) == {"bf16", "+dq", "full"}  # nvfp4 has no config.json
    assert run.configs["full"]["recipe"]["keep_last_fraction"] == 0.15
    steps, values = stack_seeds([run.arms["nvfp4"][1], run.arms["full"][0]], "grad_norm/global")
    assert steps.tolist() == list(range(40)) and values.shape == (2, 40)
    assert np.isnan(values[0, 25:]).all() and np.isfinite(values[1]).all()


def test_unreadable_config_warns(tmp_path):
    make_synthetic_run(tmp_path, ["full"], seeds=1, steps=30)
    (tmp_path / "full" / "config.json").write_text("{not json")
    with pytest.warns(RunLoadWarning, match="config.json: unreadable"):
        run = load_run(tmp_path)
    assert run.configs == {}


def test_load_run_without_metrics_raises(tmp_path):
    (tmp_path / "full").mkdir()
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path)


def test_synthetic_run_has_every_key_and_the_injected_spikes(tmp_path):
    make_synthetic_run(tmp_path, ARMS, seeds=2, steps=60, spiky_arms=("nvfp4",))
    run = load_run(tmp_path)
    assert run.arm_names == ARMS and run.warnings == () and set(run.configs) == set(ARMS)
    spike_step, severe_step = injected_spikes(60)
    for sr in run.runs():
        assert sr.missing_required() == ()
        assert {"eval/accuracy", "eval/sampled_accuracy", "eval/n"} <= set(sr.metrics)
        m = grad_norm_measurements(sr)
        spike, severe = detect_spikes(m.values, m.steps)
        expected = [spike_step, severe_step] if sr.arm == "nvfp4" else []
        assert m.steps[spike].tolist() == expected and m.update[spike].tolist() == [0] * len(expected)
        assert m.steps[severe].tolist() == expected[1:]
        assert sr.last_logged("eval/accuracy")[0] == 59 and sr.last_logged("eval/n") == (59, 32.0)
        if sr.arm == "nvfp4":
            # The per-step mean over two updates dilutes the spikes: 4x -> 2.5x (no spike), 12x -> 6.5x (not severe).
            g = sr.metrics["grad_norm/global"]
            base = np.median(g[:spike_step])
            assert g[spike_step] / base == pytest.approx((SPIKE_FACTOR + 1) / 2, rel=0.2)
            assert g[severe_step] / base == pytest.approx((SEVERE_FACTOR + 1) / 2, rel=0.2)
            spike, severe = detect_spikes(g, sr.steps)
            assert sr.steps[spike].tolist() == [severe_step] and not severe.any()


def test_synthetic_run_is_deterministic(tmp_path):
    a = make_synthetic_run(tmp_path / "a", ["full"], 1, 30, seed=7)
    b = make_synthetic_run(tmp_path / "b", ["full"], 1, 30, seed=7)
    for name in ("metrics.jsonl", "updates.jsonl"):
        assert (a / "full/seed0" / name).read_text() == (b / "full/seed0" / name).read_text()


def test_the_analysis_knows_every_arm_of_the_recipe_in_its_order():
    from fp4rl.analysis.plots import ARM_COLORS
    from fp4rl.recipe import ABLATION_ARMS, BASELINE_ARMS

    assert ARMS == ABLATION_ARMS + BASELINE_ARMS
    assert set(ARM_COLORS) == set(ARMS) and len(set(ARM_COLORS.values())) == len(ARMS)
