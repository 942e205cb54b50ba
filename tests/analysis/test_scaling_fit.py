"""The fit over model sizes on synthetic rungs with known power laws: exponents, the off-axis and
largest-rung checks, the target read from Qwen3-30B-A3B's config.json, its shared-expert group reported
apart, the single factors, and the report."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from experiments import scaling as scaling_experiment
from fp4rl.analysis import scaling, scaling_report
from fp4rl.analysis.gradient_report import NOISE_FRACTION_MAX, SCALING_POINT_FILE, _jsonable
from fp4rl.model.config import ModelConfig

# rung -> (model preset, role, parent); (L, D) from the model
RUNGS = {"ladder-w512-l6": ("ladder-w512-l6", "base", ""),
         "ladder-w512-l8": ("h200", "depth axis", "ladder-w512-l6"),
         "ladder-w512-l16": ("ladder-w512-l16", "depth axis", "ladder-w512-l8"),
         "ladder-w512-l32": ("ladder-w512-l32", "depth axis", "ladder-w512-l16"),
         "ladder-w1024-l6": ("ladder-w1024-l6", "width path", "ladder-w512-l6"),
         "ladder-w1024-l16": ("ladder-w1024-l16", "off-axis", "ladder-w1024-l6"),
         "ladder-w2048-l6": ("ladder-w2048-l6", "width path", "ladder-w1024-l6"),
         "ladder-w512-l6-noshared": ("ladder-w512-l6-noshared", "factor", "ladder-w512-l6")}
INFOS = {n: {"role": role, "parent": parent, "moves": ""} for n, (_, role, parent) in RUNGS.items()}
GROUPS = ("all", "all_but_shared", "routed_experts", "shared_expert")
T0 = 10_000.0
# q = c (L / 8)^p_L (D / 512)^p_D per recipe and component (T_s: BF16's, shared)
LAWS = {"nvfp4": {"A": (0.01, 0.5, -0.3), "b2": (0.002, 1.0, 0.4)},
        "+dq": {"A": (0.004, 0.2, 0.1), "b2": (0.0005, 0.7, -0.5)}}
TS = (2e4, -0.2, 0.8)
NOSHARED_B2 = 0.5  # the single-factor rung's b2 relative to its parent's


def law(params, L, D):
    c, pl, pd = params
    return c * (L / 8) ** pl * (D / 512) ** pd


def write_rungs(tmp_path, names=tuple(RUNGS), scale=None, noise=0.03, seed=0):
    """One scaling point per rung under tmp_path/RUNG: each component measured as its law times a
    log-normal error of sd `noise`, replicates scattered by the same around it; scale: rung -> factor
    on every b2 (a rung off the law); a group the model lacks (its shared expert) has no values."""
    rng = np.random.default_rng(seed)
    dirs = []
    for name in names:
        mc = ModelConfig.from_name(RUNGS[name][0])
        L, D = mc.num_layers, mc.d_model

        def entry(true):
            if true is None:
                return {"value": None, "replicates": [None] * 100}
            value = true * math.exp(noise * rng.normal())
            return {"value": value, "replicates": (value * np.exp(noise * rng.normal(size=100))).tolist()}

        def groups(a, b2, ts):
            return {g: {k: entry(None if g == "shared_expert" and not mc.shared_expert_d_ff else v)
                        for k, v in (("A", a), ("b2", b2), ("Ts", ts))} for g in GROUPS}

        ts = law(TS, L, D)
        recipes = {"bf16": groups(1e-9, 1e-9, ts)}
        factor = (scale or {}).get(name, NOSHARED_B2 if name == "ladder-w512-l6-noshared" else 1.0)
        for recipe, laws in LAWS.items():
            recipes[recipe] = groups(law(laws["A"], L, D), factor * law(laws["b2"], L, D), ts)
        point = {"model": dataclasses.asdict(mc), "tokens_per_batch": T0, "samples_per_batch": 256, "batches": 128,
                 "accuracy": {"value": 0.6 if name == "ladder-w512-l32" else 0.3, "lo": 0.29, "hi": 0.31}, "recipes": recipes}
        d = tmp_path / name
        d.mkdir(parents=True)
        (d / SCALING_POINT_FILE).write_text(json.dumps(point))
        dirs.append(str(d))
    return dirs


def analyze(dirs, **kwargs):
    return scaling.analyze([scaling.load_point(d) for d in dirs], infos=INFOS, **kwargs)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    dirs = write_rungs(out / "rungs")
    return dirs, scaling_report.run(scaling.ScalingConfig(out=str(out / "fit")), dirs, INFOS), out / "fit"


def test_fit_recovers_the_exponents_with_intervals_that_cover_them(fitted):
    _, results, _ = fitted
    for recipe, laws in LAWS.items():
        for q in ("A", "b2"):
            e = results["fits"][recipe]["all_but_shared"]["exponents"][q]
            for key, true in (("depth_exponent", laws[q][1]), ("width_exponent", laws[q][2])):
                assert e[key]["value"] == pytest.approx(true, abs=0.1), (recipe, q, key)
                assert e[key]["lo"] <= true <= e[key]["hi"], (recipe, q, key, e[key])
    ts = results["fits"]["nvfp4"]["all_but_shared"]["exponents"]["Ts"]
    assert ts["width_exponent"]["lo"] <= TS[2] <= ts["width_exponent"]["hi"]
    # the single-factor rung is not fitted; every other rung is
    assert "ladder-w512-l6-noshared" not in results["fitted"] and len(results["fitted"]) == 7


def test_the_target_is_qwen3_30b_a3b_without_a_shared_expert(fitted):
    _, results, _ = fitted
    p = results["paper"]
    assert (p["num_layers"], p["d_model"], p["num_experts"], p["moe_d_ff"], p["top_k"]) == (48, 2048, 128, 768, 8)
    assert (p["shared_expert_d_ff"], p["kept_bf16_layers"], p["num_heads"], p["num_kv_heads"]) == (0, 7, 32, 4)
    # judged on every parameter but the shared expert's; the shared expert and "all" reported apart, not predicted
    assert results["headline_group"] == "all_but_shared"
    assert set(results["reported_apart"]) == {"shared_expert", "all"}
    assert set(results["predicted_groups"]) == {"all_but_shared", "routed_experts"}
    shared = results["fits"]["nvfp4"]["shared_expert"]
    assert "paper" not in shared and "no shared expert" in shared["reported_apart"]
    # the shared expert's group is fitted over the rungs that have one (not the widest)
    assert "ladder-w2048-l6" not in shared["per_rung"] and "ladder-w512-l6" in shared["per_rung"]
    assert shared["exponents"]["A"]["depth_exponent"]["value"] == pytest.approx(LAWS["nvfp4"]["A"][1], abs=0.1)
    # the widest rung's layer is the target's but for Qwen3's RMSNorm on q and k (the rungs keep h200's attention)
    assert results["target_vs_widest"] == "ladder-w2048-l6: attention norms and biases (qk_norm False -> True)"


def test_extrapolation_matches_the_laws_and_the_flip(fitted):
    _, results, _ = fitted
    paper = scaling.PaperSetting()
    L, D, T = paper.num_layers, paper.d_model, paper.tokens_per_update
    for recipe, laws in LAWS.items():
        a, b2, ts = law(laws["A"], L, D), law(laws["b2"], L, D), law(TS, L, D)
        p = results["fits"][recipe]["all_but_shared"]["paper"]
        nf = a + b2 * T / ts
        assert p["noise_fraction"]["lo"] <= nf <= p["noise_fraction"]["hi"]
        assert p["noise_fraction"]["value"] == pytest.approx(nf, rel=0.2)
        t_star = ts * (NOISE_FRACTION_MAX - a) / b2
        t_pred = p["tokens_to_threshold"]
        assert t_pred["lo"] <= t_star <= t_pred["hi"] and t_pred["value"] == pytest.approx(t_star, rel=0.25)
        assert p["verdict"]["noise_fraction"] == ("exceeds" if nf > NOISE_FRACTION_MAX else "passes")
    grid = np.geomspace(1, 10_000, 20_000)
    nf = law(LAWS["nvfp4"]["A"], grid, D) + law(LAWS["nvfp4"]["b2"], grid, D) * T / law(TS, grid, D)
    true_depth = grid[np.argmax(nf > NOISE_FRACTION_MAX)]
    crossings = results["fits"]["nvfp4"]["all_but_shared"]["flip_depth"]["noise_fraction"]["crossings"]
    assert len(crossings) == 1 and crossings[0] == pytest.approx(true_depth, rel=0.25)


def test_intervals_carry_both_measurement_noise_and_lack_of_fit():
    coords = np.array([(6, 512), (8, 512), (16, 512), (32, 512), (6, 1024), (6, 2048)], np.float64)
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


def test_the_off_axis_rung_checks_the_additive_form_before_it_is_used(fitted, tmp_path):
    _, results, _ = fitted
    check = results["fits"]["nvfp4"]["all_but_shared"]["off_axis_checks"]["ladder-w1024-l16"]
    assert {check[k]["result"] for k in ("A", "b2", "Ts", "noise_fraction")} == {"consistent"}
    assert results["support"]["status"] == "supported" and results["off_axis"] == ["ladder-w1024-l16"]
    # depth and width interact: the off-axis rung's b2 is 10x the additive prediction, and the check says so
    off = analyze(write_rungs(tmp_path / "interact", scale={"ladder-w1024-l16": 10.0}))
    check = off["fits"]["nvfp4"]["all_but_shared"]["off_axis_checks"]["ladder-w1024-l16"]
    assert check["b2"]["result"] == check["noise_fraction"]["result"] == "inconsistent"
    assert check["A"]["result"] == "consistent"
    assert off["support"]["status"] == "not supported" and off["support"]["recipes"] == ["+dq", "nvfp4"]
    report = scaling_report.report_markdown(json.loads(json.dumps(_jsonable(off))))
    assert "Extrapolation to the target, group 'all_but_shared' (not supported)" in report
    # without an off-axis rung the assumption is unchecked
    no_off = analyze(write_rungs(tmp_path / "axes", names=[n for n in RUNGS if n != "ladder-w1024-l16"]))
    assert no_off["support"]["status"] == "unchecked" and not no_off["off_axis"]


def test_held_out_check_of_the_largest_rung_passes_on_the_law_and_fails_off_it(fitted, tmp_path):
    dirs, results, _ = fitted
    assert results["held_out"].endswith("ladder-w2048-l6")  # the largest fitted rung
    check = results["fits"]["nvfp4"]["all_but_shared"]["held_out_check"]
    assert {check[k]["result"] for k in ("A", "b2", "Ts", "noise_fraction")} == {"consistent"}
    # the widest rung has no shared expert: its shared-expert group is not checked
    assert "no shared_expert group" in results["fits"]["nvfp4"]["shared_expert"]["held_out_check"]["not_applicable"]
    off = analyze(write_rungs(tmp_path, scale={"ladder-w2048-l6": 20.0}))
    check = off["fits"]["nvfp4"]["all_but_shared"]["held_out_check"]
    assert check["b2"]["result"] == check["noise_fraction"]["result"] == "inconsistent"
    assert check["A"]["result"] == "consistent"


def test_a_single_factor_is_reported_as_a_ratio_to_its_parent(fitted):
    _, results, _ = fitted
    effect = results["factor_effects"]["nvfp4"]["ladder-w512-l6-noshared"]
    assert effect["parent"] == "ladder-w512-l6"
    assert effect["b2"]["lo"] <= NOSHARED_B2 <= effect["b2"]["hi"]
    assert effect["b2"]["value"] == pytest.approx(NOSHARED_B2, rel=0.15)
    assert effect["A"]["lo"] <= 1.0 <= effect["A"]["hi"]


def test_impossible_extrapolations_are_reported_as_such(tmp_path):
    depth = [n for n in RUNGS if RUNGS[n][1] in ("base", "depth axis")]
    depth_only = analyze(write_rungs(tmp_path / "depth", names=depth))
    p = depth_only["fits"]["nvfp4"]["all_but_shared"]["paper"]
    assert "width" in p["noise_fraction"]["impossible"] and p["verdict"]["noise_fraction"] == "IMPOSSIBLE"
    assert depth_only["fits"]["nvfp4"]["all_but_shared"]["exponents"]["A"]["width_exponent"] == {
        "impossible": "the rungs do not vary D"}
    report = scaling_report.report_markdown(json.loads(json.dumps(_jsonable(depth_only))))
    assert "IMPOSSIBLE" in report and "do not vary width" in report
    undetected = analyze(write_rungs(tmp_path / "zero", scale={"ladder-w512-l32": -1.0}))
    p = undetected["fits"]["nvfp4"]["all_but_shared"]["paper"]
    assert "not positive" in p["noise_fraction"]["impossible"] and p["coherent_bias"]["value"] is None
    assert p["components"]["A"]["value"] is not None  # A is still fitted
    with pytest.raises(ValueError, match="at least 2 rungs"):
        analyze(write_rungs(tmp_path / "one", names=["ladder-w512-l6", "ladder-w512-l6-noshared"]))


def test_rungs_measured_before_the_derived_group_are_refused_with_the_fix(tmp_path):
    dirs = write_rungs(tmp_path)
    for d in dirs:
        point = json.loads((tmp_path / d / SCALING_POINT_FILE).read_text())
        for recipe in point["recipes"].values():
            del recipe["all_but_shared"]
        (tmp_path / d / SCALING_POINT_FILE).write_text(json.dumps(point))
    with pytest.raises(ValueError, match="lack the group all_but_shared: analyse them again"):
        analyze(dirs)


def test_fit_writes_report_json_and_figure_and_marks_rungs_out_of_band(fitted):
    dirs, results, out = fitted
    report = (out / scaling.REPORT_FILE).read_text()
    assert "## Fit form and checks (declared before the data)" in report and "log q = c + p_L log L + p_D log D" in report
    for section in ("## A, b and T_s per rung, group 'all_but_shared'", "## Check (1), off the axes",
                    "## Group 'shared_expert', reported apart", "## Single factors", "## Link to the dose-response",
                    "48 layers, d_model 2048, 128 routed experts x 768, top-8, no shared expert"):
        assert section in report, section
    assert (out / scaling.FIGURE_FILE).stat().st_size > 0
    assert json.loads((out / scaling.RESULTS_FILE).read_text())["held_out"] == results["held_out"]
    assert [r["name"] for r in results["rungs"] if not r["in_band"]] == ["ladder-w512-l32"]  # its accuracy 0.6
    assert "ladder-w512-l32" in report.split("Rungs outside the RL band")[1]


def test_the_fit_command_reads_the_points(fitted, tmp_path):
    dirs, _, _ = fitted
    scaling_experiment.main(["fit", f"--points={','.join(dirs)}", f"--out={tmp_path}"])
    assert (tmp_path / scaling.REPORT_FILE).is_file()
    with pytest.raises(SystemExit, match="valid commands: plan, fit, collect, status"):
        scaling_experiment.main(["fitt"])
    with pytest.raises(FileNotFoundError, match="collected results"):
        scaling.load_point(tmp_path / "nowhere")
    with pytest.raises(SystemExit, match="valid rungs: ladder-w512-l6, "):
        scaling_experiment.main(["fit", "--ladder=nope"])
    with pytest.raises(ValueError, match="tokens_per_update > 0"):
        scaling.PaperSetting(tokens_per_update=0)
    with pytest.raises(FileNotFoundError, match="no such config.json"):
        _ = scaling.PaperSetting(hf_config="nowhere/config.json").model
