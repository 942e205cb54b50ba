"""The report writer and the whole judgement on synthetic run directories (docs/rl.md "The report")."""

import json

import numpy as np
import pytest

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.report import recipe_summary, write_report
from fp4rl.analysis.runs import RunLoadWarning, load_run
from fp4rl.analysis.statistics import reward_gap_to_reference
from fp4rl.analysis.summary import summarize_run
from fp4rl.analysis.synthetic import injected_spikes, make_synthetic_run
from fp4rl.analysis.verdicts import claim_reproduced, run_verdicts

ARMS4 = ("bf16", "full", "full-dq", "+46")
LOO = ("bf16", "full", "full-dq", "full-46", "full-hp")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def table_rows(text):
    section = text.split("## Per-arm results", 1)[1].split("\n\n", 2)[1]
    return {row.split("|")[1].strip().strip("`"): row for row in section.splitlines()[2:]}


def judge(run_dir, criteria=StabilityCriteria()):
    summaries = summarize_run(load_run(run_dir), criteria)
    return summaries, run_verdicts(summaries, criteria)  # every arm against the run's BF16, as the report judges


def rewrite(path, fn):
    """Apply fn to every record of a JSONL file."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(fn(r)) + "\n" for r in records))


def test_write_report_produces_all_files(tmp_path):
    # 4 seeds x 140 judged steps: enough for full to pass the spike margin and for full-dq's
    # 2 spikes per seed to fail it (with 2 seeds of 60 steps neither is decided).
    run_dir = make_synthetic_run(tmp_path / "run", ARMS4, seeds=4, steps=160, spiky_arms=("full-dq",))
    with open(run_dir / "full" / "seed1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 160, "grad_n')  # a run killed mid-line
    with pytest.warns(RunLoadWarning):
        paths = write_report(run_dir, config_text="rl.lr=3e-6\npreset=smoke", commands=["python -m experiments.ablation"])
    assert [p.name for p in paths] == ["report.md", "grad_norm.png", "seeds.png", "summary.png"]
    for p in paths:
        assert p.parent == run_dir and p.stat().st_size > 0
    for p in paths[1:]:
        assert p.read_bytes()[:8] == PNG_MAGIC

    text = paths.report_md.read_text()
    rows = table_rows(text)
    assert set(rows) == set(ARMS4)
    assert rows["full-dq"].count("**FAIL**") == 3  # spike, reward, verdict
    assert "**FAIL**" not in rows["full"] and "UNDECIDED" not in rows["full"]
    assert "all layers BF16" in rows["bf16"] and "1 of 8 layers kept in BF16 (12.5%)" in rows["full"]
    assert "0 of 8 layers kept in BF16 (0.0%)" in rows["+46"]
    assert "| 4 (4) | 160 | 140 (280) |" in rows["full"]  # seeds (judged), steps, judged steps (updates)
    assert "(seeds+binomial)" in rows["full"] and "(seeds+steps)" in rows["full"]
    assert "Status: UNDECIDED" in text  # full-46 and full-hp were not run
    assert "rl.lr=3e-6" in text and "python -m experiments.ablation" in text
    assert "partially written last line" in text  # what was ignored is reported
    for name in ("grad_norm.png", "seeds.png", "summary.png"):
        assert f"]({name})" in text


def test_write_report_out_dir_one_seed(tmp_path):
    run_dir = make_synthetic_run(tmp_path / "run", ("full",), seeds=1, steps=40)
    paths = write_report(run_dir, out_dir=tmp_path / "out")
    assert all(p.parent == tmp_path / "out" and p.exists() for p in paths)
    text = paths.report_md.read_text()
    assert "no `bf16` arm" in text
    assert "(binomial)" in table_rows(text)["full"]  # one seed: the evaluation's binomial error
    assert "one seed: the interval is the evaluation's binomial error only" in text
    assert "`full` spike: no BF16 reference arm; seed0: 20 judged steps" in text


def test_claim_on_synthetic_run(tmp_path):
    _, verdicts = judge(make_synthetic_run(tmp_path, LOO, seeds=4, steps=160, spiky_arms=LOO[2:]))
    assert verdicts["full"].passed is True
    assert all(verdicts[a].failed() == ("spike", "reward") for a in LOO[2:])
    assert claim_reproduced(verdicts).reproduced is True


def test_verdict_uses_population_reward_not_training_batch_reward(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full", "full-dq"), seeds=2, steps=80, spiky_arms=("full-dq",))
    run = load_run(run_dir)
    # The training batch's reward/mean of full-dq tracks BF16: dynamic sampling hides the deficit ...
    batch = reward_gap_to_reference({s: (r.steps, r.metrics["reward/mean"]) for s, r in run.arms["full-dq"].items()},
                                    {s: (r.steps, r.metrics["reward/mean"]) for s, r in run.arms["bf16"].items()})
    assert abs(batch.mean) < 0.02
    # ... which the population reward shows.
    summaries, verdicts = judge(run_dir)
    assert summaries["full-dq"].reward_gap_mean == pytest.approx(-0.2, abs=0.02)
    assert verdicts["full-dq"].reward.passed is False
    # A low training-batch reward with the population on par with BF16 passes.
    for k in (0, 1):
        rewrite(run_dir / "full" / f"seed{k}" / "metrics.jsonl", lambda r: {**r, "reward/mean": -1.0})
    assert judge(run_dir)[1]["full"].reward.passed is True


def test_spikes_are_judged_per_update_and_the_fallback_is_noted(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full-dq"), seeds=2, steps=80, spiky_arms=("full-dq",))
    spike_step, severe_step = injected_spikes(80)
    (run_dir / "full-dq" / "seed1" / "updates.jsonl").unlink()  # a seed logged without updates.jsonl: per-step means only
    summaries, _ = judge(run_dir)
    per_update, per_step = summaries["full-dq"].seeds
    assert per_update.spikes.per_update and per_update.spike_steps == (spike_step, severe_step)
    assert per_update.severe_steps == (severe_step,)
    # The per-step mean halves the spike of one update of two: the 4x one is lost, the 12x one is not severe.
    assert not per_step.spikes.per_update and per_step.spike_steps == (severe_step,) and per_step.severe_steps == ()
    text = write_report(run_dir).report_md.read_text()
    assert "`full-dq` seed(s) 1: no updates.jsonl; spikes judged on the per-step mean grad_norm/global" in text


def test_too_few_steps_give_undecided_not_fail(tmp_path):
    run_dir = make_synthetic_run(tmp_path / "run", LOO, seeds=2, steps=40, spiky_arms=LOO[2:])
    summaries, verdicts = judge(run_dir)
    assert all(not v.failed() for v in verdicts.values())
    assert all(v.spike.passed is None and "20 judged steps" in v.spike.reason for a, v in verdicts.items() if a != "bf16")
    assert claim_reproduced(verdicts).reproduced is None
    text = write_report(run_dir).report_md.read_text()
    assert "Status: UNDECIDED" in text and "**FAIL**" not in text
    assert "- `full-dq` spike: 0 judged seed(s) here and 0 in BF16; 2 needed on each side" in text
    assert "seed0: 20 judged steps" in text
    # The same runs, judged with a declared minimum they meet: the leave-one-out arms fail their
    # reward, but 2 x 20 judged steps without a spike cannot show full within the spike margin.
    short = StabilityCriteria(min_judged_steps=20)
    _, verdicts = judge(run_dir, short)
    assert all(verdicts[a].reward.passed is False for a in LOO[2:])
    assert verdicts["full"].spike.passed is None and "not below the margin" in verdicts["full"].spike.reason
    assert claim_reproduced(verdicts).reproduced is None


def test_all_groups_dropped_gives_undecided(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full", "full-dq"), seeds=2, steps=80, spiky_arms=("full-dq",))

    def dropped(r):  # from step 25 on, dynamic sampling dropped every group: every mini-batch empty
        if r["step"] < 25:
            return r
        if "update" in r:
            return {**r, "empty": True, "skipped": True}
        return {**r, "updates/applied": 0, "updates/empty": 2, "grad_norm/global": 0.0, "grad_norm/global_max": 0.0}

    for k in (0, 1):
        for name in ("metrics.jsonl", "updates.jsonl"):
            rewrite(run_dir / "full-dq" / f"seed{k}" / name, dropped)
    summaries, verdicts = judge(run_dir)
    seed0 = summaries["full-dq"].seeds[0]
    assert not seed0.power.judged and "55 of 60 steps >= 20 applied no update" in seed0.power.degenerate
    assert seed0.spike_steps == ()  # empty updates are not measurements
    v = verdicts["full-dq"]
    assert v.failed() == () and v.undecided() == ("spike", "collapse", "reward")
    assert "every group dropped" in v.spike.reason
    assert "every group dropped" in write_report(run_dir).report_md.read_text()


def test_saturated_accuracy_gives_undecided(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full"), seeds=2, steps=80)
    for k in (0, 1):
        rewrite(run_dir / "full" / f"seed{k}" / "metrics.jsonl", lambda r: {**r, "population/accuracy": 0.0})
    v = judge(run_dir)[1]["full"]
    assert v.passed is None and "no learning signal" in v.spike.reason


def test_accuracy_intervals_and_missing_eval_size(tmp_path):
    run_dir = make_synthetic_run(tmp_path / "a", ("full",), seeds=3, steps=45)
    s = judge(run_dir)[0]["full"]
    assert s.final_accuracy.kind == "seeds+binomial" and s.final_sampled_accuracy.kind == "seeds+binomial"
    first = [x.first_sampled for x in s.seeds]
    assert [p.step for p in first] == [0, 0, 0] and [x.final_sampled.step for x in s.seeds] == [44, 44, 44]
    assert s.sampled_accuracy_change.mean == pytest.approx(np.mean([x.final_sampled.accuracy - p.accuracy
                                                                    for x, p in zip(s.seeds, first)]))
    assert s.sampled_accuracy_change.low < s.sampled_accuracy_change.mean < s.sampled_accuracy_change.high
    no_n = judge(make_synthetic_run(tmp_path / "b", ("full",), seeds=3, steps=45, eval_n=None))[0]["full"]
    assert no_n.final_accuracy.kind == "seeds"
    assert any("no eval/n logged: the interval is over seeds only" in n for n in no_n.notes)
    once = judge(make_synthetic_run(tmp_path / "c", ("full",), seeds=2, steps=1))[0]["full"]  # one evaluation
    assert once.sampled_accuracy_change is None


def test_recipe_summary_matches_the_recipe():
    from fp4rl.recipe import PrecisionRecipe

    for name in PrecisionRecipe.names():
        recipe = PrecisionRecipe.from_name(name)
        for layers in range(1, 49):
            config = {"recipe": json.loads(recipe.to_json()), "model_config": {"num_layers": layers}}
            expected = "all layers BF16" if name == "bf16" else recipe.high_precision_summary(layers)
            assert recipe_summary(config) == expected, (name, layers)
    assert recipe_summary(None).startswith("n/a")


def test_a_nonfinite_update_is_a_decided_collapse_without_power(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full"), seeds=2, steps=40)
    nan_at = lambda r: {**r, "grad_norm/global": float("nan"), "nonfinite": True} \
        if (r["step"], r["update"]) == (30, 1) else r  # noqa: E731
    rewrite(run_dir / "full" / "seed1" / "updates.jsonl", nan_at)
    v = judge(run_dir)[1]["full"]
    assert v.collapse.passed is False and v.spike.passed is None
    assert "seed1: non-finite grad_norm/global (updates.jsonl) (nan) at step 30" in v.collapse.value


def test_report_cli_rewrites_a_gathered_run_directory(tmp_path, capsys):
    from experiments import report

    run_dir = make_synthetic_run(tmp_path / "run", ("bf16", "full"), seeds=2, steps=60)
    report.main([str(run_dir), "--command", "bash tools/gpu_session.sh matrix  # call 1"])
    text = (run_dir / "report.md").read_text()
    assert "bash tools/gpu_session.sh matrix  # call 1" in text.split("## Commands", 1)[1]
    assert "RL settings common to bf16, full" in text.split("## Configuration", 1)[1]  # from their config.json
    assert "[report]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "missing")])


def test_report_marks_verdicts_on_few_seeds_and_gives_the_t_intervals(tmp_path):
    two = make_synthetic_run(tmp_path / "two", LOO, seeds=2, steps=80, spiky_arms=("full-dq",))
    text = write_report(two).report_md.read_text()
    rows = table_rows(text)
    assert "PASS (few seeds: 2)" in rows["full"] and rows["full"].count("; t [") == 4  # gap, 2 accuracies, change
    assert "**FAIL** (few seeds: 2)" in rows["full-dq"]  # its reward interval; its spike failure is an event
    assert "Few seeds: these decided verdicts rest on fewer than 4 judged seeds" in text
    assert "`full` collapse, reward" in text  # its spike margin is not decided on 2 x 60 steps
    four = make_synthetic_run(tmp_path / "four", LOO, seeds=4, steps=80)
    text = write_report(four).report_md.read_text()
    assert "few seeds" not in table_rows(text)["full"] and "Few seeds:" not in text
