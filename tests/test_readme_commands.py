"""Every `python -m experiments.X` command of README.md and docs/usage.md parses into a valid configuration.

Running them is other tests' work (and minutes); a command whose settings contradict each other
(an override that the preset's other values refuse) would fail for a newcomer at once, so each
one is parsed here with its entry point's own parser and presets.
"""

import shlex
from pathlib import Path

import pytest

from fp4rl import configs, numerics_study
from fp4rl.config_cli import parse
from fp4rl.rl import sft, trainer
from fp4rl.studies import gradients_config
from fp4rl.studies.ablation import AblationConfig
from fp4rl.serving.deployment_eval import ServeEvalConfig
from fp4rl.serving.server import ServeConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", ROOT / "docs" / "usage.md")  # the two commands; every other entry point
# entry point -> (its config class, its presets, its options' root), as its main() calls `cli`
PARSERS = {
    "rl": (trainer.RLConfig, configs.RL_PRESETS, "rl"),
    "ablation": (AblationConfig, configs.ABLATION_PRESETS, None),
    "sft": (sft.SFTConfig, configs.SFT_PRESETS, None),
    "gradients": (gradients_config.GradientsConfig, configs.GRADIENTS_PRESETS, None),
    "numerics": (numerics_study.NumericsConfig, configs.NUMERICS_PRESETS, None),
    "serve": (ServeConfig, configs.SERVE_PRESETS, None),
    "serve_eval": (ServeEvalConfig, configs.SERVE_EVAL_PRESETS, None),
}


def _commands() -> list[tuple[str, list[str]]]:
    """The pages' `python -m experiments.X` commands (continuation lines joined, comments dropped):
    (X, argv)."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES).replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        words = shlex.split(line.strip(), comments=True) if "python -m experiments." in line else []
        for i in range(len(words) - 2):
            if words[i : i + 2] == ["python", "-m"] and words[i + 2].startswith("experiments."):
                rest = words[i + 3 :]
                end = rest.index("&&") if "&&" in rest else len(rest)
                commands.append((words[i + 2].removeprefix("experiments."), rest[:end]))
    return commands


COMMANDS = _commands()


def test_readme_has_its_commands():
    assert {"rl", "ablation", "sft"} <= {name for name, _ in COMMANDS}, "README lost its main commands"


@pytest.mark.parametrize("name,argv", [c for c in COMMANDS if c[0] in PARSERS], ids=lambda c: str(c)[:60])
def test_readme_command_parses(name, argv):
    cls, presets, root = PARSERS[name]
    assert isinstance(parse(cls, argv, presets, root), cls)  # raises on a refused setting


def test_every_readme_entry_point_is_checked_or_has_no_config():
    # experiments.scaling takes a subcommand before its options, and the tools over run directories
    # and checkpoints (report, rl_memory, hf_export, hf_local, learning, band, matrix_status,
    # dose_response, rule_power) plain argparse options; the rest go through PARSERS.
    assert {name for name, _ in COMMANDS} - set(PARSERS) <= {"scaling", "report", "rl_memory", "hf_export", "hf_local",
                                                             "learning", "band", "matrix_status", "dose_response",
                                                             "rule_power"}
