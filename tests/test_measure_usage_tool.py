"""tools/measure_usage.py: a module run in-process, its usage recorded whether it succeeds or runs out
of memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tool_module import load_tool

TOOL = Path(__file__).resolve().parents[1] / "tools" / "measure_usage.py"
MODULE = """import sys
if "--oom" in sys.argv:
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12884901888 bytes.")
print("ran with", sys.argv[1:])
"""


def _run(tmp_path, *args):
    (tmp_path / "fake_entry.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    out = tmp_path / "usage.json"
    result = subprocess.run([sys.executable, str(TOOL), str(out), "-m", "fake_entry", *args], env=env, capture_output=True,
                            text=True, timeout=120)
    return result, json.loads(out.read_text())


def test_a_module_that_finishes_is_recorded_with_its_arguments(tmp_path):
    result, record = _run(tmp_path, "--preset", "x")
    assert result.returncode == 0 and "ran with ['--preset', 'x']" in result.stdout
    assert record["status"] == "ok" and not record["out_of_memory"] and record["command"].endswith("fake_entry --preset x")
    # XLA:CPU keeps no allocator statistics: no peak, and the record says so rather than guessing
    assert record["peak_bytes"] is None and record["device"] == "1 x cpu" and record["seconds"] >= 0


def test_an_out_of_memory_failure_keeps_its_request_and_exit_status(tmp_path):
    result, record = _run(tmp_path, "--oom")
    assert result.returncode == 1
    assert record["status"] == "failed" and record["out_of_memory"] and record["requested_bytes"] == 12884901888
    assert "RESOURCE_EXHAUSTED" in record["error"]


@pytest.mark.parametrize("text, expected", [
    ("Out of memory while trying to allocate 1024 bytes.", 1024),
    ("RESOURCE_EXHAUSTED: Failed to allocate 2.50GiB", int(2.5 * 2**30)),
    ("nothing about a size", None),
])
def test_requested_bytes_reads_xla_messages(text, expected):
    assert load_tool("measure_usage").requested_bytes(text) == expected
