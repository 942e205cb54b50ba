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
    command = matrix_status.run_command([("bf16", 4), ("full-46", 0)], "h200-chain", "abc")
    assert "ARMS=bf16:4,full-46:0 " in command and "SEEDS=2" in command and "WARMUP_SHA256=abc" in command


def test_status_table_judges_each_arm_and_names_the_next_run(tmp_path):
    text = matrix_status.main([str(_matrix(tmp_path)), "--window=60:119", "--reward_cap=0.99@60",
                               "--write", str(tmp_path / "status.md")])
    assert (tmp_path / "status.md").read_text() == text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert "0-7 (8)" in rows["full"] and "0-3 (8)" in rows["bf16"]
    assert "PASS" in rows["full"] and "FAIL" in rows["full-dq"]  # the spiky arm fails spike and reward
    assert "Device runs to go: 28 of 36 (2 seeds each)" in text and "ARMS=full-46:0 " in text
    four = matrix_status.main([str(_matrix(tmp_path)), "--window=60:119", "--reward_cap=0.99@60", "--gpus=4"])
    assert "ARMS=full-46:0,full-46:2,full-hp:0,full-hp:2 " in four and "Then: bf16 seeds 4-5," in four


def test_the_timing_is_the_latest_run_s(tmp_path):
    root = _matrix(tmp_path)
    config = root / "full" / "config.json"
    record = json.loads(config.read_text()) if config.is_file() else {}
    record[MERGED_KEY] = [{"seeds": [4, 5], "seed_offset": 4, "source": "a"}, {"seeds": [6, 7], "seed_offset": 6, "source": "b"}]
    config.write_text(json.dumps(record))
    rows = {row.arm: row for row in matrix_status.arm_statuses(load_run(root))}
    assert rows["full"].timed_seeds == 2 and rows["bf16"].timed_seeds == 4
    assert matrix_status.latest_run_seeds(record, range(8)) == (6, 7)


def test_the_claim_waits_for_the_planned_seeds_of_every_decisive_arm():
    def row(arm, n):
        return matrix_status.ArmStatus(arm, tuple(range(n)), 8, 300, {}, n)

    full_plan = [row(arm, 8) for arm in matrix_status.DECISIVE_ARMS]
    assert matrix_status.claim_line(False, full_plan) == "Claim (docs/rl.md): **NOT REPRODUCED**."
    assert matrix_status.claim_line(True, full_plan) == "Claim (docs/rl.md): **REPRODUCED**."
    # a leave-one-out arm passing on 2 seeds reads NOT REPRODUCED, but only provisionally
    early = matrix_status.claim_line(False, [row("bf16", 8), row("full", 4), row("full-dq", 2)])
    assert early.startswith("Claim (docs/rl.md): **UNDECIDED** until every decisive arm holds its 8 planned seeds")
    assert "full 4 of 8, full-dq 2 of 8, full-46 0 of 8, full-hp 0 of 8" in early
    assert "reads NOT REPRODUCED (provisional" in early
