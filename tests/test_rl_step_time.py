"""tools/rl_step_time.py on CPU (smoke preset; GPU numbers come from the H200): the table of step,
rollout and update times per arm and backend, and with --profile the kernel table of the last step."""

from __future__ import annotations

import json

import pytest

from tests.tool_module import load_tool


def _tool():
    return load_tool("rl_step_time")


def test_table_of_step_times_and_the_profiled_last_step(tmp_path):
    _tool().main(["--preset", "smoke", "--arms", "bf16", "--gemms", "xla", "--seeds", "1", "--steps", "3",
                  "--profile", str(tmp_path / "trace"), "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "rl_step_time.json").read_text())["rows"]
    assert row["gemm"] == "xla" and row["step_s"] > row["rollout_s"] > 0
    assert row["rest_s"] == pytest.approx(row["step_s"] - row["rollout_s"])
    table = (tmp_path / "rl_step_time.md").read_text()
    assert "| bf16 | xla | " in table and "| 1.00x |" in table
    assert "Where the time of one RL step of `bf16` on `xla` goes" in table and (tmp_path / "trace" / "bf16-xla").is_dir()


def test_profile_needs_a_step_to_time():
    with pytest.raises(SystemExit):
        _tool().main(["--preset", "smoke", "--steps", "2", "--profile", "/tmp/unused"])
