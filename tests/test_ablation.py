"""The ablation runner on the smoke preset: all 9 arms, the report, and resume."""

from __future__ import annotations

import time

import pytest

from experiments import ablation
from fp4rl.recipe import ABLATION_ARMS

pytestmark = pytest.mark.slow
# Issue 7 asks for the whole smoke matrix in under 3 minutes on CPU. Measured alone on the
# 2-core machine (session 2, after the trace/compile fixes): 197 s, down from ~300 s; XLA
# compiling ~30 programs dominates (quantized-backward update programs 4-17 s each). That
# target is NOT met and is tracked in issue 7; the time is printed here (pytest -s) rather
# than asserted, so the suite checks behaviour, not a budget.


def test_smoke_ablation_runs_every_arm_reports_and_resumes(tmp_path, capsys):
    out = tmp_path / "ablation"
    start = time.time()
    ablation.main(["--preset", "smoke", f"--out={out}"])
    elapsed = time.time() - start
    for name in ("report.md", "grad_norm.png", "seeds.png", "summary.png"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    for arm in ABLATION_ARMS:
        assert (out / arm / "seed0" / "metrics.jsonl").exists(), arm
        assert f"| {arm} " in report or f"| `{arm}` " in report, arm
    print(f"smoke ablation (9 arms): {elapsed:.0f}s")

    capsys.readouterr()
    ablation.main(["--preset", "smoke", f"--out={out}"])  # a rerun trains nothing
    printed = capsys.readouterr().out
    assert "reusing" in printed
    assert printed.count("finished earlier, skipped") == len(ABLATION_ARMS)
    assert (out / "report.md").read_text() == report
