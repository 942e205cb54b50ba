"""The ablation runner ignores no option and reports what ran: overrides of fields it sets itself
are refused, a rerun under other settings over finished arms is refused unless forced, and the
report's configuration is read from each arm's config.json.

No training: the arms are a synthetic finished run with real config.json files.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fp4rl import configs
from fp4rl.analysis.synthetic import make_synthetic_run, synthetic_recipe
from fp4rl.config_cli import parse
from fp4rl.rl import sft, trainer

from fp4rl.studies import ablation

STEPS = 30


@pytest.mark.parametrize("option, controls", [
    ("--rl.seeds=3", "--seeds"),
    ("--rl.arm=full", "--arms"),
    ("--rl.init=runs/mine", "--out (the warm-up is <out>/sft)"),
    ("--rl.out=runs/mine", "--out"),
    ("--sft.out=runs/mine", "--out (the warm-up is <out>/sft)"),
    ("--gradients.out=runs/mine", "--out"),
])
def test_options_the_runner_sets_itself_are_refused(option, controls):
    with pytest.raises(ValueError, match=f"^{option.replace('.', '[.]')} is set by the ablation runner itself; "
                                         f"use {controls.replace('(', '[(]').replace(')', '[)]')}"):
        parse(ablation.AblationConfig, ["--preset", "smoke", option], configs.ABLATION_PRESETS)


def _finished_run(out: Path, config: ablation.AblationConfig) -> None:
    """A finished warm-up and finished arms, as `config` would have left them."""
    make_synthetic_run(out, config.arms, seeds=config.seeds, steps=STEPS)
    (out / "sft").mkdir(parents=True)
    (out / "sft" / sft.META_FILE).write_text(json.dumps(
        {"sft_config": sft.settings(dataclasses.replace(config.sft, out=str(out / "sft")))}))
    for arm in config.arms:
        record = {"rl_config": trainer.settings(ablation.arm_config(config, arm)), "recipe": synthetic_recipe(arm),
                  "model_config": {"num_layers": 4}}
        (out / arm / "config.json").write_text(json.dumps(record))
        (out / arm / "done.json").write_text(json.dumps({"steps": STEPS, "seeds": [0]}))


def _config(out: Path, *argv: str) -> ablation.AblationConfig:
    return parse(ablation.AblationConfig, ["--preset", "smoke", f"--out={out}", "--arms=bf16,full",
                                           f"--rl.steps={STEPS}", *argv], configs.ABLATION_PRESETS)


def _configuration_section(report: str) -> str:
    return report.split("## Configuration", 1)[1].split("## Commands", 1)[0]


def test_a_rerun_reports_the_settings_the_arms_ran_with(tmp_path):
    out = tmp_path / "ablation"
    _finished_run(out, _config(out))
    ablation.run(_config(out), progress=False)  # the same settings: nothing to run, the report written
    with pytest.raises(ValueError, match=r"bf16/config.json: this run was started with other settings: "
                                         r"optim.lr: 0.0001 -> 0.001;.*--rl.resume=force"):
        ablation.run(_config(out, "--rl.optim.lr=1e-3"), progress=False)

    result = ablation.run(_config(out, "--rl.optim.lr=1e-3", "--rl.resume=force"), progress=False)
    assert result["status"] == {"sft": "skipped", "bf16": "skipped", "full": "skipped"}
    section = _configuration_section(result["report"].read_text())
    assert "  optim.lr=0.0001\n" in section and "0.001" not in section
    assert f"  steps={STEPS}\n" in section and '  loss.kind="dapo"\n' in section
    assert 'bf16: arm="bf16"' in section and 'full: arm="full"' in section


def test_the_report_shows_settings_that_differ_between_arms(tmp_path):
    out = tmp_path / "ablation"
    _finished_run(out, _config(out))
    record = json.loads((out / "full" / "config.json").read_text())
    record["rl_config"]["optim"]["lr"] = 3e-4  # e.g. an arm resumed with --rl.resume=force
    (out / "full" / "config.json").write_text(json.dumps(record))
    section = _configuration_section(
        ablation.run(_config(out, "--rl.resume=force"), progress=False)["report"].read_text())
    assert 'full: arm="full", optim.lr=0.0003' in section and 'bf16: arm="bf16", optim.lr=0.0001' in section


def test_one_matrix_runs_on_one_expert_gemm_backend(tmp_path):
    """The report names the backend the runs ran on; an arm still to run that would run on another
    backend than a recorded one is refused before anything trains, naming both."""
    out = tmp_path / "ablation"
    config = _config(out)
    _finished_run(out, config)
    meta_path = out / "sft" / sft.META_FILE
    meta = json.loads(meta_path.read_text())
    meta["model_config"] = dataclasses.asdict(sft.model_config(config.sft))  # as a warm-up records it
    assert meta["model_config"]["expert_gemm"] == "xla"  # resolved on this CPU, never "auto"
    meta_path.write_text(json.dumps(meta))
    section = _configuration_section(ablation.run(config, progress=False)["report"].read_text())
    assert "routed experts' grouped GEMMs (expert_gemm) of every run: xla" in section

    record = json.loads((out / "full" / "config.json").read_text())
    record["rl_config"]["expert_gemm"] = "packed"  # e.g. the arm ran in another process, on a GPU
    (out / "full" / "config.json").write_text(json.dumps(record))
    forced = _config(out, "--rl.resume=force")  # a finished arm's other settings are kept, reported
    section = _configuration_section(ablation.run(forced, progress=False)["report"].read_text())
    assert "routed experts' grouped GEMMs (expert_gemm): bf16 xla, full packed" in section
    (out / "bf16" / "done.json").unlink()  # bf16 still to run, here on the warm-up's "xla"
    with pytest.raises(ValueError, match=r"full ran its expert GEMMs on expert_gemm='packed', but this command's runs "
                                         r"would run on 'xla' .*one matrix never mixes backends; pass "
                                         r"--rl.expert_gemm=packed"):
        ablation.run(forced, progress=False)


def test_a_run_without_matrix_arms_reports_what_it_ran_and_what_the_matrix_would_add(tmp_path):
    out = tmp_path / "ablation"
    _finished_run(out, _config(out, "--arms="))  # the warm-up alone: nothing else to run
    result = ablation.run(_config(out, "--arms="), progress=False)
    assert result["status"] == {"sft": "skipped"}
    text = result["report"].read_text()
    assert "No arm of the matrix ran here" in text and "--arms=all" in text
    assert "Status:" not in text  # no claim status from no arm
    assert "warm-up (sft/sft_meta.json):" in _configuration_section(text)


def test_arms_all_names_the_nine_arms_and_a_typo_names_the_valid_ones():
    assert _config(Path("unused"), "--arms=all").arms == configs.ABLATION_ARMS
    assert configs.ABLATION_PRESETS["cpu"].arms == ()  # the main job: no matrix by default
    with pytest.raises(ValueError, match="full-hp.*nvfp4-pt.*mxfp8-q"):
        _config(Path("unused"), "--arms=ful")


def test_arms_baselines_names_the_pretraining_recipe_and_the_mxfp8_validation():
    from fp4rl.recipe import ABLATION_ARMS, BASELINE_ARMS

    assert _config(Path("unused"), "--arms=baselines").arms == ("nvfp4-pt", "mxfp8-q", "mxfp8", "mxfp8+dq")
    assert _config(Path("unused"), "--arms=all,baselines").arms == ABLATION_ARMS + BASELINE_ARMS  # the whole matrix
    assert _config(Path("unused"), "--arms=bf16,nvfp4-pt,all").arms == ("bf16", "nvfp4-pt", *ABLATION_ARMS[1:])


def test_arms_dose_and_controls_name_the_dose_response_and_the_positive_controls():
    assert _config(Path("unused"), "--arms=dose").arms == (
        "nvfp4", "+dq", "nvfp4@4", "+dq@4", "nvfp4@16", "+dq@16", "nvfp4@64", "+dq@64")
    assert _config(Path("unused"), "--arms=controls,nvfp4@2").arms == ("nvfp4+attn", "nvfp4-tensor", "nvfp4@2")
    with pytest.raises(ValueError, match="finite number > 0"):
        _config(Path("unused"), "--arms=+dq@0")


def test_the_cpu_presets_compile_flags_follow_the_preset_the_command_names():
    from experiments import ablation as main_job

    assert main_job._preset([]) == "cpu"  # the default preset
    assert main_job._preset(["--seeds", "2", "--preset", "smoke"]) == "smoke"
    assert main_job._preset(["--preset=h200", "--arms=all"]) == "h200"
    assert set(main_job.PRESET_XLA_FLAGS) == {"smoke", "cpu"}  # never a GPU preset's
