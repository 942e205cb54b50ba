"""The fit over model sizes on synthetic rungs with known power laws, and the ladder's plan."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from experiments import scaling as scaling_experiment
from fp4rl import configs
from fp4rl.analysis import scaling, scaling_plan
from fp4rl.analysis.gradient_report import NOISE_FRACTION_MAX, SCALING_POINT_FILE
from fp4rl.model.config import ModelConfig

RUNGS = [(8, 512), (16, 512), (32, 512), (6, 512), (6, 1024), (6, 2048)]
MODELS = {(8, 512): "h200", (16, 512): "ladder-w512-l16", (32, 512): "ladder-w512-l32", (6, 512): "ladder-w512-l6",
          (6, 1024): "ladder-w1024-l6", (6, 2048): "ladder-w2048-l6"}
T0 = 10_000.0
# q = c (L / 8)^p_L (D / 512)^p_D per recipe and component (T_s: BF16's, shared)
LAWS = {"r1": {"A": (0.01, 0.5, -0.3), "b2": (0.002, 1.0, 0.4)},
        "r2": {"A": (0.004, 0.2, 0.1), "b2": (0.0005, 0.7, -0.5)}}
TS = (2e4, -0.2, 0.8)


def law(params, L, D):
    c, pl, pd = params
    return c * (L / 8) ** pl * (D / 512) ** pd


def write_rungs(tmp_path, rungs=RUNGS, scale=None, noise=0.03, seed=0):
    """One scaling point per rung: each component measured as its law times a log-normal error of sd
    `noise`, with replicates scattered by the same around that measurement; scale: rung index ->
    factor on every b2 (a rung off the law)."""
    rng = np.random.default_rng(seed)
    dirs = []
    for i, (L, D) in enumerate(rungs):
        model = dataclasses.asdict(ModelConfig.from_name(MODELS[L, D]))

        def entry(true):
            value = true * math.exp(noise * rng.normal())
            return {"value": value, "replicates": (value * np.exp(noise * rng.normal(size=100))).tolist()}

        ts = law(TS, L, D)
        recipes = {"bf16": {g: {"A": entry(1e-9), "b2": entry(1e-9), "Ts": entry(ts)} for g in ("all", "routed_experts")}}
        for name, laws in LAWS.items():
            factor = (scale or {}).get(i, 1.0)
            recipes[name] = {g: {"A": entry(law(laws["A"], L, D)), "b2": entry(factor * law(laws["b2"], L, D)), "Ts": entry(ts)}
                             for g in ("all", "routed_experts")}
        point = {"model": model, "tokens_per_batch": T0, "samples_per_batch": 256, "batches": 128,
                 "accuracy": {"value": 0.3 if i else 0.6, "lo": 0.29, "hi": 0.31}, "recipes": recipes}
        d = tmp_path / f"rung{i}"
        d.mkdir(parents=True)
        (d / SCALING_POINT_FILE).write_text(json.dumps(point))
        dirs.append(str(d))
    return dirs


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    dirs = write_rungs(out / "rungs")
    return dirs, scaling.run(scaling.ScalingConfig(out=str(out / "fit")), dirs), out / "fit"


def test_fit_recovers_the_exponents_with_intervals_that_cover_them(fitted):
    _, results, _ = fitted
    for recipe, laws in LAWS.items():
        for q in ("A", "b2"):
            e = results["fits"][recipe]["all"]["exponents"][q]
            for key, true in (("depth_exponent", laws[q][1]), ("width_exponent", laws[q][2])):
                assert e[key]["value"] == pytest.approx(true, abs=0.1), (recipe, q, key)
                assert e[key]["lo"] <= true <= e[key]["hi"], (recipe, q, key, e[key])
    ts = results["fits"]["r1"]["all"]["exponents"]["Ts"]
    assert ts["width_exponent"]["lo"] <= TS[2] <= ts["width_exponent"]["hi"]


def test_extrapolation_matches_the_laws_and_the_flip(fitted):
    _, results, _ = fitted
    paper = scaling.PaperSetting()
    L, D, T = paper.num_layers, paper.d_model, paper.tokens_per_update
    for recipe, laws in LAWS.items():
        a, b2, ts = law(laws["A"], L, D), law(laws["b2"], L, D), law(TS, L, D)
        p = results["fits"][recipe]["all"]["paper"]
        nf = a + b2 * T / ts
        assert p["noise_fraction"]["lo"] <= nf <= p["noise_fraction"]["hi"]
        assert p["noise_fraction"]["value"] == pytest.approx(nf, rel=0.2)
        t_star = ts * (NOISE_FRACTION_MAX - a) / b2
        t_pred = p["tokens_to_threshold"]
        assert t_pred["lo"] <= t_star <= t_pred["hi"] and t_pred["value"] == pytest.approx(t_star, rel=0.25)
        assert p["verdict"]["noise_fraction"] == ("exceeds" if nf > NOISE_FRACTION_MAX else "passes")
    # r1's noise fraction at the paper's width and T grows with depth: it crosses the threshold where
    # the laws say (to the depth grid's resolution)
    grid = np.geomspace(1, 10_000, 20_000)
    nf = law(LAWS["r1"]["A"], grid, D) + law(LAWS["r1"]["b2"], grid, D) * T / law(TS, grid, D)
    true_depth = grid[np.argmax(nf > NOISE_FRACTION_MAX)]
    crossings = results["fits"]["r1"]["all"]["flip_depth"]["noise_fraction"]["crossings"]
    assert len(crossings) == 1 and crossings[0] == pytest.approx(true_depth, rel=0.25)


def test_intervals_carry_both_measurement_noise_and_lack_of_fit():
    coords = np.array(RUNGS, np.float64)
    exact = law((0.01, 0.5, -0.3), coords[:, 0], coords[:, 1])
    rng = np.random.default_rng(3)
    scattered = exact * np.exp(0.2 * rng.normal(size=len(exact)))
    noisy_reps = exact[:, None] * np.exp(0.1 * rng.normal(size=(len(exact), 200)))
    # on the law, replicates scattered: the interval is the bootstrap's (the t interval has zero width)
    p = scaling.predict(scaling.fit_loglog(coords, exact, noisy_reps), 48, 2048)
    assert p.t_lo == pytest.approx(p.t_hi) and p.hi / p.lo > 1.2
    # off the law, no replicate scatter: the interval is the t interval's (the bootstrap has zero width)
    p = scaling.predict(scaling.fit_loglog(coords, scattered, np.repeat(scattered[:, None], 200, 1)), 48, 2048)
    assert p.hi / p.lo > 1.2 and (p.lo, p.hi) == pytest.approx((p.t_lo, p.t_hi))
    # as many rungs as parameters: no residual degrees of freedom, no t interval
    fit = scaling.fit_loglog(coords[[0, 1, 5]], scattered[[0, 1, 5]], noisy_reps[[0, 1, 5]])
    assert fit.dof == 0 and math.isnan(fit.sigma)


def test_held_out_check_passes_on_the_law_and_fails_off_it(fitted, tmp_path):
    dirs, results, _ = fitted
    assert results["held_out"] == dirs[-1]  # the largest rung: d_model 2048
    check = results["fits"]["r1"]["all"]["held_out_check"]
    assert {check[k]["result"] for k in ("A", "b2", "Ts", "noise_fraction")} == {"consistent"}
    off = scaling.analyze([scaling.load_point(d) for d in write_rungs(tmp_path, scale={5: 20.0})])
    check = off["fits"]["r1"]["all"]["held_out_check"]
    assert check["b2"]["result"] == check["noise_fraction"]["result"] == "inconsistent"
    assert check["A"]["result"] == "consistent"


def test_impossible_extrapolations_are_reported_as_such(tmp_path):
    depth_only = scaling.analyze([scaling.load_point(d) for d in write_rungs(tmp_path / "depth", rungs=RUNGS[:4])])
    p = depth_only["fits"]["r1"]["all"]["paper"]
    assert "width" in p["noise_fraction"]["impossible"] and p["verdict"]["noise_fraction"] == "IMPOSSIBLE"
    assert depth_only["fits"]["r1"]["all"]["exponents"]["A"]["width_exponent"] == {"impossible": "the rungs do not vary D"}
    report = scaling.report_markdown(json.loads(json.dumps(scaling._jsonable(depth_only))))
    assert "IMPOSSIBLE" in report and "do not vary width" in report
    undetected = scaling.analyze([scaling.load_point(d) for d in write_rungs(tmp_path / "zero", scale={2: -1.0})])
    p = undetected["fits"]["r1"]["all"]["paper"]
    assert "not positive" in p["noise_fraction"]["impossible"] and p["coherent_bias"]["value"] is None
    assert undetected["fits"]["r1"]["all"]["paper"]["components"]["A"]["value"] is not None  # A is still fitted
    with pytest.raises(ValueError, match="at least 2 rungs"):
        scaling.analyze([])


def test_fit_writes_report_json_and_figure_and_marks_rungs_out_of_band(fitted):
    dirs, results, out = fitted
    report = (out / scaling.REPORT_FILE).read_text()
    assert "## Fit form (declared before the data)" in report and "log q = c + p_L log L + p_D log D" in report
    assert (out / scaling.FIGURE_FILE).stat().st_size > 0
    assert json.loads((out / scaling.RESULTS_FILE).read_text())["held_out"] == dirs[-1]
    assert [r["in_band"] for r in results["rungs"]] == [False] + [True] * 5  # rung 0's accuracy 0.6
    assert f"{dirs[0]}" in report.split("Rungs outside the RL band")[1]


def test_the_fit_reads_the_measurements_point_files(fitted, tmp_path, capsys):
    dirs, _, _ = fitted
    scaling_experiment.main(["fit", f"--points={','.join(dirs)}", f"--out={tmp_path}"])
    assert (tmp_path / scaling.REPORT_FILE).is_file()
    with pytest.raises(SystemExit, match="valid commands: plan, fit"):
        scaling_experiment.main(["fitt"])
    with pytest.raises(FileNotFoundError, match="--out of a gradient measurement"):
        scaling.load_point(tmp_path / "nowhere")
    with pytest.raises(SystemExit, match="valid gradient presets: smoke, cpu"):
        scaling_experiment.main(["fit", "--ladder=nope"])
    with pytest.raises(ValueError, match="tokens_per_update > 0"):
        scaling.PaperSetting(tokens_per_update=0)


# ---------------------------------------------------------------------------------- the plan
def test_every_rung_keeps_12_to_19_percent_and_the_widest_is_the_papers_layer():
    rows = scaling_plan.plan(configs.SCALING_LADDER, configs.SFT_PRESETS, configs.GRADIENTS_PRESETS)
    assert all(0.12 <= r["kept_share"] <= 0.19 and r["kept_share_in_band"] for r in rows)
    depth = {r["layers"] for r in rows if r["d_model"] == 512 and r["layers"] >= 8}
    width = {r["d_model"] for r in rows if r["layers"] == 6}
    assert depth == {8, 16, 32} and width == {512, 1024, 2048}
    widest = ModelConfig.from_name(configs.SFT_PRESETS["ladder-w2048-l6"].model)
    assert (widest.d_model, widest.num_experts, widest.moe_d_ff, widest.top_k) == (2048, 128, 768, 8)
    for r in rows:  # the counts are ModelConfig's; every warm-up and measurement fits one H200 by the estimate
        mc = ModelConfig.from_name(configs.SFT_PRESETS[r["preset"]].model)
        assert (r["params_total"], r["params_active"]) == tuple(mc.param_count())
        assert r["warmup"]["fits_h200"] and r["measurement"]["fits_h200"], r["preset"]
    with pytest.raises(ValueError, match="valid names"):
        scaling_plan.plan(["nope"], configs.SFT_PRESETS, configs.GRADIENTS_PRESETS)


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


def test_plan_command_writes_the_table(tmp_path, capsys):
    rows = scaling_experiment.main(["plan", f"--out={tmp_path}"])
    table = (tmp_path / "plan.md").read_text()
    for r in rows:
        assert f"| {r['preset']} | {r['layers']} | {r['d_model']} |" in table
    assert len(json.loads((tmp_path / "plan.json").read_text())) == len(configs.SCALING_LADDER)
