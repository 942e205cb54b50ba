"""The ladder's status: each rung's state from its collected results, the band rule's second warm-up,
out-of-memory runs (again on an H200, or reported with their peak), the next device call, and `collect`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments import scaling as scaling_experiment
from fp4rl.analysis import ladder_status, scaling_dose

REPO = Path(__file__).resolve().parents[2]
H200_META = json.loads((REPO / "results/learning_h200/sft/sft_meta.json").read_text())  # band accuracy 0.414, 400 steps
GB = 1e9


def _meta(accuracy: float, steps: int = 400) -> dict:
    return {**H200_META, "accuracy": [{"difficulty": 2, "sampled": accuracy, "greedy": 1.0, "n": 8}],
            "sft_config": {**H200_META["sft_config"], "steps": steps}}


def _write(results: Path, rung: str, meta=None, usage=None) -> None:
    d = results / rung
    d.mkdir(parents=True, exist_ok=True)
    if meta is not None:
        (d / "sft_meta.json").write_text(json.dumps(meta))
    if usage is not None:
        (d / "usage.json").write_text(json.dumps(usage))


def _record(status="ok", oom=False, limit=80 * GB, peak=50 * GB) -> dict:
    return {"status": status, "out_of_memory": oom, "requested_bytes": 4 * GB if oom else None, "peak_bytes": peak,
            "bytes_limit": limit, "device": "1 x NVIDIA H100" if limit < 100 * GB else "1 x NVIDIA H200", "seconds": 100.0,
            "error": "RESOURCE_EXHAUSTED" if oom else ""}


def _states(results: Path) -> dict:
    rows = scaling_experiment.plan_rows(results=str(results))
    return {r["preset"]: ladder_status.rung_state(r, results / r["preset"]) for r in rows}, rows


def test_nothing_measured_names_the_first_rungs_first_call(tmp_path):
    states, rows = _states(tmp_path)
    first = states["ladder-w512-l6"]
    assert first.state == "to do" and first.parts == [1] and not first.needs_h200
    assert ladder_status.device_command(first) == ("LADDER=ladder-w512-l6 LADDER_PARTS=1 RUN_DIR=/tmp/ladder_ladder-w512-l6_p1 "
                                                   "MODE=ladder bash tools/long_horizon_call.sh")
    assert states["ladder-w2048-l6"].needs_h200
    text = ladder_status.status_markdown(rows, tmp_path, "FIT RULES", "DOSE RULES", scaling_dose.DoseLink(), "cmd", "not yet")
    # the rules come before the rungs, the next call names the device's arguments
    assert text.index("## Rules (declared before any rung runs)") < text.index("FIT RULES") < text.index("## Rungs")
    assert "warm-up into the band" in text and "needs_h200=false" in text and 'carry=[".whl"]' in text
    assert "No rung is measured yet." in text


@pytest.mark.parametrize("accuracy, steps", [(0.1, 800), (0.7, 200)])
def test_a_warm_up_outside_the_band_is_trained_once_more(tmp_path, accuracy, steps):
    _write(tmp_path, "ladder-w512-l6", _meta(accuracy))
    s = _states(tmp_path)[0]["ladder-w512-l6"]
    assert s.state == "retry warm-up" and s.env["LADDER_SFT_STEPS"] == str(steps) and not s.final
    assert f"_s{steps} " in ladder_status.device_command(s) + " "
    _write(tmp_path, "ladder-w512-l6", _meta(accuracy, steps))
    s = _states(tmp_path)[0]["ladder-w512-l6"]
    assert s.state == "out of band" and s.final


def test_out_of_memory_moves_to_an_h200_then_is_reported_with_its_peak(tmp_path):
    _write(tmp_path, "ladder-w512-l6", usage={"warmup": {"record": _record("failed", oom=True)}, "parts": {}})
    s = _states(tmp_path)[0]["ladder-w512-l6"]
    assert s.state == "warm-up failed" and s.needs_h200 and "next on an H200" in s.detail
    _write(tmp_path, "ladder-w512-l6", usage={"warmup": {"record": _record("failed", oom=True, limit=140 * GB, peak=130 * GB)},
                                              "parts": {}})
    states, rows = _states(tmp_path)
    s = states["ladder-w512-l6"]
    assert s.state == "did not fit" and s.final and "peak 130.0 GB before a request of 4.0 GB" in s.detail
    # the ladder goes on with the next rung, and the table shows the measured peak
    text = ladder_status.status_markdown(rows, tmp_path, "", "", scaling_dose.DoseLink(), "cmd", "")
    assert "Next: **ladder-w512-l6-noshared**" in text and "warm-up 130.0 GB" in text


def test_a_rung_in_parts_carries_its_rollouts_and_holds_its_warm_up_to_its_digest(tmp_path):
    parts = {"1": {"record": _record(), "measured": True, "memory_factor": 1.3, "time_factor": 1.0},
             "2": {"record": _record("failed", oom=True, limit=140 * GB, peak=139 * GB), "measured": False}}
    _write(tmp_path, "ladder-w512-l32", _meta(0.3), {"warmup": {"record": _record()}, "parts": parts})
    s = _states(tmp_path)[0]["ladder-w512-l32"]
    assert s.state == "measuring" and s.carry_rollouts and s.env["WARMUP_SHA256"] == H200_META["params_sha256"]
    assert 2 not in s.parts and s.parts[0] == 3 and "part 2: out of memory" in s.detail
    parts.update({k: {"record": _record(), "measured": True} for k in ("3", "4")})
    _write(tmp_path, "ladder-w512-l32", usage={"warmup": {"record": _record()}, "parts": parts})
    s = _states(tmp_path)[0]["ladder-w512-l32"]
    assert s.state == "measured" and s.final and "part 2" in s.detail


def test_summary_reads_a_measurements_numbers():
    gradients = json.loads((REPO / "results/gradients_h200/gradients.json").read_text())
    summary = ladder_status.summary(gradients, "all_but_shared")
    assert summary["headline_group"] == "all"  # measured before the derived group: the stored groups only
    nvfp4 = summary["recipes"]["nvfp4"]
    stored = gradients["recipes"]["nvfp4"]
    assert nvfp4["noise_fraction"]["value"] == pytest.approx(stored["vs_bf16"]["all"]["noise_fraction"]["value"])
    b2 = stored["batch_scaling"]["all"]["coherent_bias_sq"]["value"]
    assert b2 > 0 and nvfp4["b"]["value"] ** 2 == pytest.approx(b2)
    assert nvfp4["mismatch_k3"]["value"] > summary["recipes"]["bf16"]["mismatch_k3"]["value"]
    assert nvfp4["policy_change_kl"]["value"] > 0 and summary["policy_change_lr"] == "3e-05"


def test_collect_stores_a_rungs_small_results_and_its_calibration(tmp_path):
    runs, results, rung = tmp_path / "runs", tmp_path / "results", "ladder-w512-l6"
    run, sft = runs / rung, runs / rung / "sft"
    sft.mkdir(parents=True)
    (sft / "sft_meta.json").write_text(json.dumps(H200_META))
    (run / "ladder.json").write_text(json.dumps({"rung": rung, "sft_dir": str(sft), "sft_steps": None}))
    (run / "band.md").write_text("band table")
    (run / "usage_warmup.json").write_text(json.dumps(_record(peak=20 * GB)))
    part = run / "gradients" / "part1"
    part.mkdir(parents=True)
    for name in ("gradients.json", "report.md", "scaling_point.json"):
        shutil.copyfile(REPO / "results/gradients_h200" / name, part / name)
    (run / "usage_part1.json").write_text(json.dumps(_record(peak=30 * GB)))
    out = scaling_experiment.collect(rung, runs=str(runs), results=str(results))
    assert sorted(p.name for p in out.iterdir()) == ["band.md", "report.md", "scaling_point.json", "sft_meta.json",
                                                     "summary.json", "usage.json"]
    usage = json.loads((out / "usage.json").read_text())
    estimate = usage["warmup"]["estimate"]["memory_bytes"]
    assert usage["warmup"]["memory_factor"] == pytest.approx(20 * GB / estimate) and usage["parts"]["1"]["measured"]
    # the next plan is calibrated on it, and the status counts the rung measured
    states, rows = _states(results)
    assert states[rung].state == "measured"
    row = next(r for r in rows if r["preset"] == "ladder-w512-l8")
    assert row["calibration"]["source"] == rung
    with pytest.raises(SystemExit, match="valid rungs"):
        scaling_experiment.collect("nope", runs=str(runs), results=str(results))
