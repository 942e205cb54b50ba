"""The ladder's plan: what each rung moves, its role, its parts, the memory model and its calibration on
measured peaks, and the device runs."""

from __future__ import annotations

import json

import pytest

from experiments import scaling as scaling_experiment
from fp4rl import configs
from fp4rl.analysis import scaling_plan, scaling_usage
from fp4rl.model.config import ModelConfig


@pytest.fixture(scope="module")
def rows():
    return {r["preset"]: r for r in scaling_plan.plan(scaling_experiment.ladder_spec(), configs.SFT_PRESETS,
                                                      configs.GRADIENTS_PRESETS)}


def test_every_rung_keeps_12_to_19_percent_and_names_the_factor_it_moves(rows):
    assert list(rows) == list(configs.SCALING_LADDER)
    assert all(0.12 <= r["kept_share"] <= 0.19 and r["kept_share_in_band"] for r in rows.values())
    axis = {(r["layers"], r["d_model"]) for r in rows.values() if r["role"] in ("base", "depth axis")}
    width = {(r["layers"], r["d_model"]) for r in rows.values() if r["role"] in ("base", "width path")}
    assert axis == {(6, 512), (8, 512), (16, 512), (32, 512)} and width == {(6, 512), (6, 1024), (6, 2048)}
    off_axis = [(n, r["layers"], r["d_model"]) for n, r in rows.items() if r["role"] == "off-axis"]
    assert off_axis == [("ladder-w1024-l16", 16, 1024)]
    assert rows["ladder-w512-l16"]["moves"] == "depth 8 -> 16" and rows["ladder-w1024-l16"]["moves"] == "depth 6 -> 16"
    # a width step moves several factors together, and says which
    assert [m.split(" ")[0] for m in rows["ladder-w1024-l6"]["moves"].split("; ")] == [
        "d_model", "routing", "expert", "attention", "shared"]
    # each single-factor rung moves exactly one factor from the base
    for name in configs.SCALING_FACTOR_RUNGS:
        assert rows[name]["role"] == "factor" and rows[name]["parent"] == "ladder-w512-l6"
        assert ";" not in rows[name]["moves"] and rows[name]["moves"] not in ("base", "nothing"), name
    assert rows["ladder-w512-l6-noshared"]["moves"] == "shared expert (shared_expert_d_ff 512 -> 0)"
    for r in rows.values():  # the counts are ModelConfig's
        mc = ModelConfig.from_name(configs.SFT_PRESETS[r["preset"]].model)
        assert (r["params_total"], r["params_active"]) == tuple(mc.param_count())


def test_the_widest_rung_has_no_shared_expert_and_needs_an_h200(rows):
    widest = rows["ladder-w2048-l6"]
    assert widest["shared_expert_d_ff"] == 0 and "shared expert (shared_expert_d_ff 1024 -> 0)" in widest["moves"]
    assert widest["needs_h200"] and not rows["ladder-w512-l6"]["needs_h200"]
    # the order: the depth axis from its base, then the width path, the off-axis rung, the widest; single factors last
    order = list(configs.SCALING_LADDER)
    assert order.index("ladder-w512-l32") < order.index("ladder-w1024-l6") < order.index("ladder-w1024-l16") \
        < order.index("ladder-w2048-l6") < order.index("ladder-w512-l6-h32")


def test_the_parts_measure_every_ladder_recipe_once(rows):
    for name, r in rows.items():
        recipes = [x for p in r["measurement"]["parts"] for x in p["recipes"]]
        assert sorted(recipes) == sorted(configs.LADDER_RECIPES[1:]), name
    assert len(rows["ladder-w512-l6"]["measurement"]["parts"]) == 1 and len(rows["ladder-w2048-l6"]["measurement"]["parts"]) == 4
    # a part holds BF16 and its straight-through views; nvfp4-pt alone draws two keys
    split = rows["ladder-w1024-l6"]["measurement"]["parts"]
    assert [(p["held_references"], p["key_draws"], p["warm_states"]) for p in split] == [
        (2, 1, 3), (2, 2, 2), (2, 1, 3), (2, 1, 2)]


def test_memory_formula_by_hand_on_tiny():
    mc = ModelConfig.from_name("tiny")  # D 64, 4 heads x 16 (2 kv), F 32, 4 experts top-2, shared 64, V 64, 2 layers
    per_layer = 2 * (6 * 64 + 3 * 64 + 3 * 32 + 3 * 64 + 2 * (2 * 64 + 3 * 32)) + 8 * 4 + 6 * 4 * 10
    assert scaling_plan.activation_bytes_per_token(mc, 10) == 2 * per_layer + 12 * 64
    p = mc.param_count().total
    assert scaling_plan.warmup_memory(mc, 3, 10) == pytest.approx((24 + scaling_plan.C_P) * p
                                                                 + scaling_plan.OVERHEAD * 30 * (2 * per_layer + 12 * 64))
    act = scaling_plan.OVERHEAD * 4 * 10 * (2 * per_layer + 12 * 64)
    # one key: held params, references and states, plus the largest phase (here the gradient program)
    assert scaling_plan.measurement_memory(mc, 4, 10, 1, 0) == pytest.approx((4 + 8) * p + max(4 * p + 8 * p + act, 12 * p))
    two_states = scaling_plan.measurement_memory(mc, 4, 10, 1, 2) - scaling_plan.measurement_memory(mc, 4, 10, 1, 0)
    assert two_states == pytest.approx(16 * p)


def _usage(peak_factor: float, time_factor: float, oom: bool = False) -> dict:
    entry = {"memory_factor": peak_factor, "memory_factor_is_lower_bound": oom, "time_factor": time_factor}
    return {"warmup": entry, "parts": {"1": entry}}


def test_calibration_applies_the_nearest_smaller_measured_rungs_factors(rows):
    params = {n: r["params_total"] for n, r in rows.items()}
    usages = {"ladder-w512-l6": _usage(1.1, 2.0), "ladder-w512-l16": _usage(1.6, 0.5)}
    fn = scaling_usage.calibration(usages, params)
    # before any rung below it is measured: the priors
    assert fn("ladder-w512-l6-noshared", params["ladder-w512-l6-noshared"]) == (scaling_usage.PRIOR, "prior")
    # a rung's own factors once it is measured; above it, the nearest smaller measured rung's
    assert fn("ladder-w512-l6", params["ladder-w512-l6"])[0]["warmup"]["memory"] == 1.1
    factors, source = fn("ladder-w512-l8", params["ladder-w512-l8"])
    assert factors["measurement"] == {"memory": 1.1, "time": 2.0} and source == "ladder-w512-l6"
    assert fn("ladder-w2048-l6", params["ladder-w2048-l6"])[1] == "ladder-w512-l16"
    row = scaling_plan.calibrate(rows["ladder-w512-l32"], *fn("ladder-w512-l32", params["ladder-w512-l32"]))
    assert row["warmup"]["memory_calibrated"] == pytest.approx(1.6 * row["warmup"]["memory_bytes"])
    part = row["measurement"]["parts"][0]
    assert part["seconds_calibrated"] == pytest.approx(0.5 * part["seconds_slow"])
    # the H200 flag follows the calibrated estimate: a factor that puts a rung over one H100 asks for an H200
    small = rows["ladder-w512-l6"]
    assert not scaling_plan.calibrate(small, {"warmup": {"memory": 1, "time": 1}, "measurement": {"memory": 1, "time": 1}},
                                      "x")["needs_h200"]
    big = {"warmup": {"memory": 1, "time": 1}, "measurement": {"memory": 100e9 / small["measurement"]["memory_bytes"], "time": 1}}
    assert scaling_plan.calibrate(small, big, "x")["needs_h200"]


def test_usage_ratios_from_a_record_and_an_out_of_memory_lower_bound():
    ok = {"status": "ok", "peak_bytes": 30e9, "seconds": 600.0, "out_of_memory": False}
    r = scaling_usage.ratios(ok, 20e9, 400.0)
    assert (r["memory_factor"], r["time_factor"], r["memory_factor_is_lower_bound"]) == (1.5, 1.5, False)
    oom = {"status": "failed", "peak_bytes": 70e9, "requested_bytes": 10e9, "seconds": 50.0, "out_of_memory": True}
    r = scaling_usage.ratios(oom, 40e9, 400.0)
    assert r["memory_factor"] == pytest.approx(2.0) and r["memory_factor_is_lower_bound"] and r["time_factor"] is None
    assert scaling_usage.ratios(None, 1.0, 1.0)["memory_factor"] is None  # cut by its time limit: no record
    usage = {"warmup": scaling_usage.ratios(ok, 20e9, 400.0), "parts": {"1": r, "2": scaling_usage.ratios(ok, 60e9, 600)}}
    assert scaling_usage.phase_factors(usage) == {"warmup": {"memory": 1.5, "time": 1.5},
                                                 "measurement": {"memory": 2.0, "time": 1.0}}


def test_device_runs_hold_a_warm_up_and_the_parts_that_fit_one_machine():
    runs = scaling_plan.device_runs(300, [500, 600, 900, 2000])
    assert [r["parts"] for r in runs] == [[1, 2], [3], [4]]
    assert [r["seconds"] for r in runs] == [1400, 1200, 2300]
    assert [r["over_one_machine"] for r in runs] == [False, False, True]


def test_plan_command_writes_the_table(tmp_path):
    rows = scaling_experiment.main(["plan", f"--out={tmp_path}"])
    table = (tmp_path / "plan.md").read_text()
    for r in rows:
        assert f"| {r['preset']} | {r['role']} | {r['moves']} | {r['layers']} | {r['d_model']} |" in table
    assert len(json.loads((tmp_path / "plan.json").read_text())) == len(configs.SCALING_LADDER)
    only = scaling_experiment.main(["plan", "--ladder=ladder-w1024-l16", f"--out={tmp_path}"])
    assert [r["preset"] for r in only] == ["ladder-w1024-l16"] and only[0]["role"] == "off-axis"
    with pytest.raises(SystemExit, match="valid rungs"):
        scaling_experiment.main(["plan", "--ladder=nope"])
