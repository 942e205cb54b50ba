"""fp4rl.analysis.matrix_status: the matrix's table, the decision rule and the runs still to do, from
synthetic matrices."""

import json

from experiments import matrix_status as matrix_status_cli
from fp4rl.analysis import matrix_status
from fp4rl.analysis.runs import load_run
from fp4rl.analysis.summary import summarize_run
from fp4rl.analysis.synthetic import make_synthetic_run
from fp4rl.rl.run_settings import MERGED_KEY

STEPS = 160  # 140 judged steps a seed: at 4 seeds enough to pass the spike margin without spikes


def _matrix(tmp_path, nvfp4_spiky=False):
    root = tmp_path / "matrix"
    make_synthetic_run(root, ["bf16", "nvfp4"], 4, STEPS, spiky_arms=["nvfp4"] if nvfp4_spiky else [],
                       initial_eval=True)
    make_synthetic_run(root, ["full"], 8, STEPS, initial_eval=True)  # both halves of the first 4-seed phase
    return root


def test_the_first_phase_runs_the_no_intervention_arms_first():
    first = matrix_status.FIRST_PHASE
    assert first[:4] == (("bf16", 0), ("nvfp4", 0), ("bf16", 2), ("nvfp4", 2))
    arms = [arm for arm, _ in first]
    assert arms.index("nvfp4-pt") < arms.index("nvfp4+attn") < arms.index("nvfp4@4")
    assert {"nvfp4-tensor", "+dq", "nvfp4@16", "+dq@16", "nvfp4@64", "+dq@64"} <= set(arms)


def test_remaining_runs_follow_the_plan_and_skip_the_halves_on_disk(tmp_path):
    run = load_run(_matrix(tmp_path))
    plan = matrix_status.plan_for(None)
    todo = matrix_status.remaining_runs(run, plan)
    # seeds on disk count whatever run made them: a 4-seed directory covers two 2-seed runs
    assert not {("bf16", 0), ("bf16", 2), ("nvfp4", 2), ("full", 0), ("full", 6)} & set(todo)
    assert todo[:3] == [("nvfp4-pt", 0), ("nvfp4-pt", 2), ("nvfp4+attn", 0)]
    assert ("full", 4) not in todo and len(todo) == len(dict.fromkeys(plan)) - 8
    command = matrix_status.run_command([("bf16", 4), ("nvfp4@4", 0)], "h200-chain", "abc")
    assert "ARMS=bf16:4,nvfp4@4:0 " in command and "SEEDS=2" in command and "WARMUP_SHA256=abc" in command


def test_the_decision_rule_picks_the_phase(tmp_path):
    equal, line = matrix_status.decision(summarize_run(load_run(_matrix(tmp_path / "a"))))
    assert equal is True and line.startswith("Decision rule: nvfp4 vs full EQUIVALENT")
    assert matrix_status.plan_for(equal)[-1] == ("full-dq", 6) and ("full-46", 0) not in matrix_status.plan_for(equal)
    spiky, line = matrix_status.decision(summarize_run(load_run(_matrix(tmp_path / "b", nvfp4_spiky=True))))
    assert spiky is False and "NOT EQUIVALENT" in line and ("full-hp", 6) in matrix_status.plan_for(spiky)
    pending, line = matrix_status.decision({})
    assert pending is None and "pending until nvfp4 and full hold 4 judged seeds each (now 0 and 0)" in line


def test_status_table_judges_each_arm_and_names_the_next_run(tmp_path):
    text = matrix_status_cli.main([str(_matrix(tmp_path)), "--window=60:159", "--reward_cap=0.99@60",
                               "--write", str(tmp_path / "status.md")])
    assert (tmp_path / "status.md").read_text() == text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert "0-7 (8)" in rows["full"] and "0-3 (8)" in rows["bf16"]  # the equivalent phase: 8 seeds each
    assert "PASS" in rows["full"] and "PASS" in rows["nvfp4"]
    assert "Decision rule: nvfp4 vs full EQUIVALENT" in text and "ARMS=nvfp4-pt:0 " in text
    four = matrix_status_cli.main([str(_matrix(tmp_path)), "--window=60:159", "--reward_cap=0.99@60", "--gpus=4"])
    assert "ARMS=nvfp4-pt:0,nvfp4-pt:2,nvfp4+attn:0,nvfp4-tensor:0 " in four and "Then: +dq seeds 0-1," in four


def test_the_timing_is_the_latest_run_s(tmp_path):
    root = _matrix(tmp_path)
    config = root / "full" / "config.json"
    record = json.loads(config.read_text()) if config.is_file() else {}
    record[MERGED_KEY] = [{"seeds": [4, 5], "seed_offset": 4, "source": "a"}, {"seeds": [6, 7], "seed_offset": 6, "source": "b"}]
    config.write_text(json.dumps(record))
    rows = {row.arm: row for row in matrix_status.arm_statuses(load_run(root), matrix_status.plan_for(None))}
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
    # equivalent at 4 seeds: the matrix ends with bf16, full, nvfp4 and full-dq at 8
    done = [row(arm, 8) for arm in ("bf16", "full", "nvfp4", "full-dq")]
    assert "no intervention is needed" in matrix_status.claim_line(False, done, equivalent=True)
