"""The report writer on a synthetic run directory (RL.md "The report")."""

import pytest

from fp4rl.analysis.report import write_report
from fp4rl.analysis.summary import summarize_run
from fp4rl.analysis.runs import RunLoadWarning, load_run
from fp4rl.analysis.stability import StabilityCriteria, claim_reproduced, verdict
from fp4rl.analysis.synthetic import make_synthetic_run

ARMS4 = ("bf16", "full", "full-dq", "+46")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def table_rows(text):
    section = text.split("## Per-arm results", 1)[1].split("\n\n", 2)[1]
    return {row.split("|")[1].strip().strip("`"): row for row in section.splitlines()[2:]}


def test_write_report_produces_all_files(tmp_path):
    run_dir = make_synthetic_run(tmp_path / "run", ARMS4, seeds=2, steps=60, spiky_arms=("full-dq",))
    with open(run_dir / "full" / "seed1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 60, "grad_n')  # a run killed mid-line
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
    assert "**FAIL**" not in rows["full"]
    assert "Status: UNDECIDED" in text  # full-46 and full-hp were not run
    assert "rl.lr=3e-6" in text and "python -m experiments.ablation" in text
    assert "partially written last line" in text  # what was ignored is reported
    for name in ("grad_norm.png", "seeds.png", "summary.png"):
        assert f"]({name})" in text


def test_write_report_out_dir(tmp_path):
    run_dir = make_synthetic_run(tmp_path / "run", ("full",), seeds=1, steps=40)
    paths = write_report(run_dir, out_dir=tmp_path / "out")
    assert all(p.parent == tmp_path / "out" and p.exists() for p in paths)
    text = paths.report_md.read_text()
    assert "no `bf16` arm" in text and "(1 seed)" in text


def test_claim_on_synthetic_run(tmp_path):
    arms = ("bf16", "full", "full-dq", "full-46", "full-hp")
    run = load_run(make_synthetic_run(tmp_path, arms, seeds=2, steps=60, spiky_arms=arms[2:]))
    verdicts = {arm: verdict(s) for arm, s in summarize_run(run, StabilityCriteria()).items()}
    assert verdicts["full"].passed is True
    assert all(verdicts[a].failed() == ("spike", "reward") for a in arms[2:])
    assert claim_reproduced(verdicts).reproduced is True
