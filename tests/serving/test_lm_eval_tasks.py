"""tools/lm_eval's tasks (run by tools/lm_eval/run.sh with lm-evaluation-harness, which is not a
dependency of this project): each names a local JSON file that exists, whose rows it can read, so
the run needs no download."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = sorted((ROOT / "tools" / "lm_eval").glob("*.yaml"))


def test_run_script_runs_every_task():
    script = (ROOT / "tools" / "lm_eval" / "run.sh").read_text()
    assert {p.stem for p in TASKS} == {"fp4rl_arith_mc", "fp4rl_arith_gen"}
    assert "--tasks fp4rl_arith_mc,fp4rl_arith_gen --include_path tools/lm_eval" in script


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.stem)
def test_a_task_reads_a_local_json_file(path):
    task = yaml.safe_load(path.read_text())
    assert task["task"] == path.stem and task["dataset_path"] == "json"
    data = ROOT / task["dataset_kwargs"]["data_files"][task["test_split"]]  # relative to the repository root
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert rows and all(0 <= r["answer"] < len(r["choices"]) and r["question"] for r in rows)
