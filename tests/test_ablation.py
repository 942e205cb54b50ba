"""The ablation runner on the smoke preset: three arms, the learning run, the report, and resume.

Three of the nine arms (bf16; the full recipe; full-dq, its BF16-backward variant, which shares full's
forward programs): what the runner does (programs shared and compiled ahead, the report, resume)
does not depend on how many arms it runs, and every arm's programs run in the trainer's tests (a
golden step per forward class, `tests/rl/test_trainer.py`) and in the gradient measurements' smoke
run; `--arms=all` runs the nine."""

from __future__ import annotations

import time

import pytest

from experiments import ablation

pytestmark = pytest.mark.slow
# Target: the smoke run in under 3 minutes on a 2-core CPU. What keeps it there: arms
# that share a forward share its programs in process, later arms compile on 2 threads while an
# arm trains (XLA compiles without the GIL), the reference quantizer is traced once per shape,
# and the CLI's smoke preset compiles at O0 like the suite (conftest). Compiling is most of the
# time and the run is CPU-bound, so the time is printed (pytest -s), not asserted: next to
# another test process (pytest -n 2) it comes close to the 180 s target, too close for a bound
# that must not flake.


ARMS = ("bf16", "full", "full-dq")


def test_smoke_ablation_runs_its_arms_reports_and_resumes(tmp_path, capsys):
    out = tmp_path / "ablation"
    start = time.time()
    args = ["--preset", "smoke", f"--out={out}", "--learning_steps=2", f"--arms={','.join(ARMS)}"]
    ablation.main(args)
    elapsed = time.time() - start
    for name in ("report.md", "grad_norm.png", "seeds.png", "summary.png"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    for arm in ARMS:
        assert (out / arm / "seed0" / "metrics.jsonl").exists(), arm
        assert f"| {arm} " in report or f"| `{arm}` " in report, arm
    assert (out / "learning" / "bf16" / "seed0" / "metrics.jsonl").exists()
    assert "## Does RL learn? Learning run: `bf16`" in report and (out / "learning" / "learning.png").exists()
    with capsys.disabled():  # shown with pytest -s (capsys would swallow it)
        print(f"smoke ablation ({len(ARMS)} arms): {elapsed:.0f}s")

    capsys.readouterr()
    ablation.main(args)  # a rerun trains nothing
    printed = capsys.readouterr().out
    assert "reusing" in printed
    assert printed.count("finished earlier, skipped") == len(ARMS)
    assert (out / "report.md").read_text() == report
