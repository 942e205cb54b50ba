"""fp4rl.analysis.matrix_status: the matrix's table and the runs still to do, from a synthetic matrix."""

import json

from fp4rl.analysis import matrix_status
from fp4rl.analysis.runs import load_run
from fp4rl.analysis.synthetic import make_synthetic_run
from fp4rl.rl.run_settings import MERGED_KEY


def _matrix(tmp_path):
    root = tmp_path / "matrix"
    make_synthetic_run(root, ["bf16", "full-dq"], 4, 120, spiky_arms=["full-dq"], initial_eval=True)
    make_synthetic_run(root, ["full"], 8, 120, initial_eval=True)  # both halves of a decisive arm
    return root


def test_remaining_runs_follow_the_plan_and_skip_the_halves_on_disk(tmp_path):
    todo = matrix_status.remaining_runs(load_run(_matrix(tmp_path)))
    # seeds on disk count whatever run made them: a 4-seed directory covers two 2-seed runs
    assert not {("bf16", 0), ("bf16", 2), ("full", 0), ("full", 6)} & set(todo)
    # seeds 0-3 of the decisive arms first, then their seeds 4-7
    assert todo[:5] == [("full-46", 0), ("full-46", 2), ("full-hp", 0), ("full-hp", 2), ("bf16", 4)]
    assert len(todo) == len(matrix_status.PLAN) - 8
    command = matrix_status.run_command("bf16", 4, "h200-chain", "abc")
    assert "--rl.seed_offset=4" in command and "SEEDS=2" in command and "WARMUP_SHA256=abc" in command


def test_status_table_judges_each_arm_and_names_the_next_run(tmp_path):
    text = matrix_status.main([str(_matrix(tmp_path)), "--window=60:119", "--reward_cap=0.99@60",
                               "--write", str(tmp_path / "status.md")])
    assert (tmp_path / "status.md").read_text() == text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert "0-7 (8)" in rows["full"] and "0-3 (8)" in rows["bf16"]
    assert "PASS" in rows["full"] and "FAIL" in rows["full-dq"]  # the spiky arm fails spike and reward
    assert "Device runs to go: 28 of 36 (2 seeds each)" in text and "ARMS=full-46" in text


def test_the_timing_is_the_latest_run_s(tmp_path):
    root = _matrix(tmp_path)
    config = root / "full" / "config.json"
    record = json.loads(config.read_text()) if config.is_file() else {}
    record[MERGED_KEY] = [{"seeds": [4, 5], "seed_offset": 4, "source": "a"}, {"seeds": [6, 7], "seed_offset": 6, "source": "b"}]
    config.write_text(json.dumps(record))
    rows = {row.arm: row for row in matrix_status.arm_statuses(load_run(root))}
    assert rows["full"].timed_seeds == 2 and rows["bf16"].timed_seeds == 4
    assert matrix_status.latest_run_seeds(record, range(8)) == (6, 7)

