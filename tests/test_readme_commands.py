"""Every `python -m experiments.rl` command of README.md parses into a valid configuration.

Running them is other tests' work (and minutes); a command whose settings contradict each other
(an override that the preset's other values refuse) would fail for a newcomer at once, so each
one is parsed here with the entry point's own parser.
"""

import shlex
from pathlib import Path

from fp4rl import configs
from fp4rl.config_cli import parse
from fp4rl.rl import trainer

README = Path(__file__).resolve().parents[1] / "README.md"
PREFIX = "python -m experiments.rl "


def _rl_commands() -> list[list[str]]:
    """README's `experiments.rl` commands (continuation lines joined, comments dropped), as argv."""
    text = README.read_text(encoding="utf-8").replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(PREFIX):
            commands.append(shlex.split(line[len(PREFIX):], comments=True))
    return commands


def test_readme_rl_commands_parse():
    commands = _rl_commands()
    assert len(commands) >= 3, "README lost its experiments.rl commands"
    for argv in commands:
        config = parse(trainer.RLConfig, argv, configs.RL_PRESETS, "rl")  # raises on a refused setting
        assert isinstance(config, trainer.RLConfig), argv
