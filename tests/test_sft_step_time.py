"""tools/sft_step_time.py on CPU: one JSON line with the step time of the preset's warm-up step."""

from __future__ import annotations

import json

import pytest

from tests.tool_module import load_tool


def _tool():
    return load_tool("sft_step_time")


def test_prints_the_step_time_on_the_named_backend(capsys):
    _tool().main(["--preset", "smoke", "--steps", "2", "--gemm", "blocked", "--batch_size", "4"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["gemm"] == "blocked" and line["batch_size"] == 4 and line["step_s"] > 0
    assert line["tokens_per_s"] == pytest.approx(4 * line["max_len"] / line["step_s"], rel=0.01)


def test_refuses_no_steps():
    with pytest.raises(SystemExit):
        _tool().main(["--preset", "smoke", "--steps", "0"])
