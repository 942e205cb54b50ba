"""The dose-response's link to the ladder on synthetic rungs with known power laws: error/noise per rung,
its dose equivalent, the tokens per update and the depth at which it reaches the failing level."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp4rl.analysis import scaling, scaling_dose
from fp4rl.config_cli import cli
from tests.analysis.test_scaling_fit import INFOS, LAWS, T0, TS, law, write_rungs


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    return [scaling.load_point(d) for d in write_rungs(tmp_path_factory.mktemp("dose"), noise=0.01)]


def _link(points, **dose):
    results = scaling.analyze(points, infos=INFOS)
    return scaling_dose.link_fit(results, points, scaling.PaperSetting(), scaling_dose.DoseLink(**dose))


def test_without_a_failing_dose_each_rung_reports_its_error_to_noise_and_dose_equivalent(points):
    link = _link(points)
    assert link["first_failing"] == {"nvfp4": None, "+dq": None} and "linear" in link["assumption"]
    nvfp4 = link["bases"]["nvfp4"]
    assert nvfp4["rho_at_failure"] is None and "depth_to_failure" not in nvfp4
    for name, (model, _, _) in {"ladder-w512-l6": ("ladder-w512-l6", 0, 0), "ladder-w512-l32": ("ladder-w512-l32", 0, 0)}.items():
        L, D = (6, 512) if name.endswith("l6") else (32, 512)
        a, b2, ts = law(LAWS["nvfp4"]["A"], L, D), law(LAWS["nvfp4"]["b2"], L, D), law(TS, L, D)
        rung = nvfp4["rungs"][name]
        assert rung["rho"]["value"] == pytest.approx(math.sqrt(a + b2 * T0 / ts), rel=0.05)
        assert "tokens_to_failure" not in rung and "predicted" not in rung
    # the reference rung is its own dose 1; error/noise grows with depth, so the deeper rung is a larger dose
    assert nvfp4["rungs"]["ladder-w512-l8"]["dose_equivalent"]["value"] == pytest.approx(1.0)
    assert nvfp4["rungs"]["ladder-w512-l32"]["dose_equivalent"]["value"] > 1.3


def test_a_failing_dose_gives_tokens_and_depth_to_failure(points):
    a_f = 1.2
    link = _link(points, nvfp4=a_f)
    e = link["bases"]["nvfp4"]
    assert e["rho_at_failure"]["value"] == pytest.approx(a_f * e["rho_reference"]["value"])
    by_name = {p["name"]: p for p in points}
    star2 = e["rho_at_failure"]["value"] ** 2
    for name, rung in e["rungs"].items():
        a, b2, ts = (scaling.component(by_name[name], "nvfp4", "all_but_shared", k)[0] for k in ("A", "b2", "Ts"))
        expected = 0.0 if a >= star2 else ts * (star2 - a) / b2  # 0: above the failing level at any update size
        assert rung["tokens_to_failure"]["value"] == pytest.approx(expected, rel=1e-9)
        eq = rung["dose_equivalent"]
        assert rung["predicted"] == ("fails" if eq["lo"] >= a_f else "holds" if eq["hi"] < a_f else "undecided")
    assert e["rungs"]["ladder-w512-l32"]["predicted"] == "fails" and e["rungs"]["ladder-w512-l6"]["predicted"] == "holds"
    # along the fit at the target's width and tokens per update: where the law reaches the failing level (a
    # larger failing dose, so that the crossing lies where the depth grid is fine)
    e = _link(points, nvfp4=3.0)["bases"]["nvfp4"]
    star2 = e["rho_at_failure"]["value"] ** 2
    paper = scaling.PaperSetting()
    grid = np.geomspace(1, 10_000, 20_000)
    nf = (law(LAWS["nvfp4"]["A"], grid, paper.d_model)
          + law(LAWS["nvfp4"]["b2"], grid, paper.d_model) * paper.tokens_per_update / law(TS, grid, paper.d_model))
    true_depth = grid[np.argmax(nf > star2)]
    flips = e["depth_to_failure"]
    assert len(flips["crossings"]) == 1 and flips["crossings"][0] == pytest.approx(true_depth, rel=0.25)
    assert flips["params_at_crossings"] == [paper.params_at_depth(flips["crossings"][0])]
    assert "depth_to_failure" not in link["bases"]["+dq"]  # +dq@A's failing dose is not measured


def test_a_missing_reference_reports_error_to_noise_only(points):
    link = _link(points, nvfp4=4.0, reference="nowhere")
    assert "nowhere" in link["reference_missing"]
    rung = link["bases"]["nvfp4"]["rungs"]["ladder-w512-l6"]
    assert set(rung) == {"rho"}


def test_the_failing_doses_are_options_with_none_for_not_measured():
    config = cli(scaling.ScalingConfig, None, ["--dose.nvfp4=16", "--dose.dq=none"])
    assert config.dose.first_failing("nvfp4") == 16 and config.dose.first_failing("+dq") is None
    with pytest.raises(ValueError, match="dose.nvfp4=-1"):
        scaling_dose.DoseLink(nvfp4=-1)
