"""The warm-up an entry point trains first follows its --preset, whatever --init says; its
settings errors are one line naming the option."""

from __future__ import annotations

import dataclasses

import pytest

from experiments import gradients as gradients_experiment
from experiments import rl as rl_experiment
from fp4rl import configs
from fp4rl.rl import run_inputs, sft, trainer


from fp4rl.studies import gradients


@pytest.fixture
def trained(monkeypatch):
    """Stubs the warm-up and the run: the list of SFTConfigs a main() would train."""
    trained_configs = []
    monkeypatch.setenv("XLA_FLAGS", __import__("os").environ.get("XLA_FLAGS", ""))  # main() may add a flag
    monkeypatch.setattr(sft, "train", lambda config, progress=True: trained_configs.append(config))
    monkeypatch.setattr(run_inputs, "load", lambda config: run_inputs.RunInputs(*[None] * 5, rows=None))
    monkeypatch.setattr(trainer, "train", lambda config, inputs=None: [[]])
    monkeypatch.setattr(gradients, "run", lambda config: None)
    return trained_configs


@pytest.mark.parametrize("preset", ["smoke", "cpu", "h200", "h200-long"])
def test_rl_trains_the_warm_up_of_its_preset_into_any_init(trained, tmp_path, preset):
    init = tmp_path / "my_warmup"
    rl_experiment.main(["--preset", preset, f"--init={init}", f"--out={tmp_path / 'rl'}"])
    assert trained == [dataclasses.replace(configs.SFT_PRESETS[preset], out=str(init))]


def test_rl_without_a_preset_trains_the_default_warm_up(trained, tmp_path):
    rl_experiment.main([f"--init={tmp_path / 'w'}", f"--out={tmp_path / 'rl'}"])
    assert trained == [sft.SFTConfig(out=str(tmp_path / "w"))]


def test_gradients_trains_the_warm_up_of_its_preset(trained, tmp_path):
    init = tmp_path / "my_warmup"
    gradients_experiment.main(["--preset", "smoke", f"--init={init}", f"--out={tmp_path / 'g'}"])
    assert trained == [dataclasses.replace(configs.SFT_PRESETS["smoke"], out=str(init))]


@pytest.mark.parametrize("preset", ["smoke", "cpu", "h200", "h200-long"])
def test_the_ablation_warm_up_is_its_presets(preset):
    """The runner trains `config.sft` into <out>/sft: the preset's warm-up up to its directory (and,
    on cpu, its length: the main job's time budget takes a 200-step warm-up)."""
    config = configs.ABLATION_PRESETS[preset]
    steps = {"cpu": 200}.get(preset, configs.SFT_PRESETS[preset].steps)
    assert config.sft == dataclasses.replace(configs.SFT_PRESETS[preset], out=sft.SFTConfig().out, steps=steps)


def test_rl_refuses_an_unknown_impl_in_one_line(trained, capsys):
    with pytest.raises(SystemExit) as exit_info:
        rl_experiment.main(["--preset", "smoke", "--impl=cuda"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: impl='cuda'; valid options: ('auto', 'reference', 'triton', 'mosaic')\n"
    assert trained == []


def test_rl_checks_out_before_training_the_warm_up(trained, tmp_path):
    a_file = tmp_path / "out.txt"
    a_file.write_text("")
    with pytest.raises(ValueError, match=f"--out={a_file} is a file"):
        rl_experiment.main(["--preset", "smoke", f"--init={tmp_path / 'w'}", f"--out={a_file}"])
    assert trained == []


ENTRY_POINTS = ("sft", "rl", "gradients", "ablation", "serve", "serve_eval", "numerics")


def test_entry_points_import_no_experiment_and_the_library_none():
    """docs/design.md practice 9: presets live in fp4rl.configs, the entry points are thin."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [root / "experiments" / f"{name}.py" for name in ENTRY_POINTS] + sorted((root / "fp4rl").rglob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "experiments"], f"{path} imports {names}"
