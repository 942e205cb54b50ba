"""tools/sft_step_time.py on CPU: one JSON line with the step time of the preset's warm-up step."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _tool():
    path = Path(__file__).resolve().parents[1] / "tools" / "sft_step_time.py"
    spec = importlib.util.spec_from_file_location("sft_step_time", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prints_the_step_time_on_the_named_backend(capsys):
    _tool().main(["--preset", "smoke", "--steps", "2", "--gemm", "blocked", "--batch_size", "4"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["gemm"] == "blocked" and line["batch_size"] == 4 and line["step_s"] > 0
    assert line["tokens_per_s"] == pytest.approx(4 * line["max_len"] / line["step_s"], rel=0.01)


def test_refuses_no_steps():
    with pytest.raises(SystemExit):
        _tool().main(["--preset", "smoke", "--steps", "0"])
