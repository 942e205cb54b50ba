"""The notebooks: each is its generator's output (tools/make_*_notebook.py), and is executed
headless with nbclient. Their cells only call the library (docs/design.md practice 9), whose
logic is unit-tested: tests/analysis/test_explore.py, tests/analysis/test_four_over_six.py.

- notebooks/numerics.ipynb (built by tools/make_numerics_notebook.py) is executed by
  tests/test_numerics_study.py::test_notebook_executes (slow), so not a second time here.
- notebooks/ablations.ipynb (built by tools/make_ablations_notebook.py) is executed on a
  synthetic run directory (`fp4rl.analysis.synthetic.make_synthetic_run`) with the edge cases a
  real smoke ablation produces: an arm with one seed, no evaluation, no updates.jsonl, a
  grad-norm group and a mismatch key never logged, a NaN grad norm (a collapse).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fp4rl.analysis.synthetic import make_synthetic_run

REPO = Path(__file__).resolve().parents[1]
ABLATIONS = REPO / "notebooks" / "ablations.ipynb"
# The report's per-arm table header (fp4rl.analysis.report._arm_table), as the notebook shows it.
TABLE_HEADER = ("| arm | recipe | seeds (judged) | steps (min-max) | judged steps (updates) per seed | "
                "spikes/100 steps (mean; max) | spikes/100 updates (max) | severe spikes | spike |")
# 3 report figures + held-out accuracy, per-group grad norms, mismatch, reward vs grad norm, spike sensitivity.
N_FIGURES = 8


def _edge_case_run(root: Path) -> Path:
    """A 4-arm synthetic run; `nvfp4` has one seed, no eval/*, no updates.jsonl, no
    grad_norm/router, no mismatch/routing_flip, and a NaN grad norm at step 50."""
    run_dir = make_synthetic_run(root, ("bf16", "nvfp4", "full", "full-dq"), seeds=2, steps=60, initial_eval=True,
                                 spiky_arms=("full-dq",))
    seed1 = run_dir / "nvfp4" / "seed1"
    for name in ("metrics.jsonl", "updates.jsonl"):
        (seed1 / name).unlink()
    seed1.rmdir()
    (run_dir / "nvfp4" / "seed0" / "updates.jsonl").unlink()
    path = run_dir / "nvfp4" / "seed0" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        for key in ("eval/accuracy", "eval/sampled_accuracy", "eval/n", "grad_norm/router", "mismatch/routing_flip"):
            r.pop(key, None)
        if r["step"] == 50:
            r["grad_norm/global"] = float("nan")
    path.write_text("".join(json.dumps(r) + "\n" for r in records))  # NaN is written as JSON NaN
    return run_dir


def _texts(nb) -> str:
    """Every text output of the executed notebook (streams, markdown, plain text), joined."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            else:
                data = out.get("data", {})
                parts += [data.get("text/markdown", ""), data.get("text/plain", "")]
    return "\n".join(parts)


@pytest.mark.parametrize("name", ["ablations", "numerics"])
def test_notebook_is_generated(tmp_path, name):
    """The committed notebook is what its generator builds (regenerate it after editing the
    tool), outputs stripped, and every code cell is short: the logic lives in the library."""
    nbformat = pytest.importorskip("nbformat", reason="notebook test needs nbformat (dev extra)")
    generator, committed_path, out = (REPO / "tools" / f"make_{name}_notebook.py",
                                      REPO / "notebooks" / f"{name}.ipynb", tmp_path / f"{name}.ipynb")
    subprocess.run([sys.executable, str(generator), str(out)], check=True, capture_output=True, timeout=120)
    fresh, committed = (nbformat.read(p, as_version=4) for p in (out, committed_path))
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in fresh.cells], \
        f"notebooks/{name}.ipynb is stale: run `python tools/make_{name}_notebook.py`"
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert not [c for c in code if c.outputs or c.execution_count]
    long = [c.source for c in code if len(c.source.splitlines()) > 20]
    assert not long, "notebook logic belongs in the library (docs/design.md practice 9)"
    assert not [c.source for c in code if re.search(r"^(def|class) ", c.source, re.M)], "no function in a notebook"


def test_ablations_notebook_parameters_cell():
    nbformat = pytest.importorskip("nbformat", reason="notebook test needs nbformat (dev extra)")
    first = nbformat.read(ABLATIONS, as_version=4).cells[0]
    assert first.cell_type == "code" and 'RUN_DIR = "results/long_h200/chain/matrix"' in first.source
    assert "parameters" in first.metadata.get("tags", [])
    # the default is a committed run directory the notebook can open
    assert list((REPO / "results/long_h200/chain/matrix").glob("*/seed0/metrics.jsonl*"))


@pytest.mark.slow
def test_ablations_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="notebook test needs nbformat (dev extra)")
    nbclient = pytest.importorskip("nbclient", reason="notebook test needs nbclient (dev extra)")
    pytest.importorskip("ipykernel", reason="notebook test needs ipykernel (dev extra)")
    from fp4rl.analysis.report import write_report
    from fp4rl.analysis.runs import RunLoadWarning

    run_dir = _edge_case_run(tmp_path / "run")
    with pytest.warns(RunLoadWarning):  # required keys never logged in nvfp4
        report_md = write_report(run_dir).report_md  # the notebook must reproduce its table
    report_rows = [line for line in report_md.read_text().split("## Per-arm results", 1)[1].split("\n\n")[1].splitlines()
                   if line.startswith("| `")]
    assert len(report_rows) == 4

    nb = nbformat.read(ABLATIONS, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint('jax imported:', 'jax' in sys.modules)"))
    # kernel "python3" launches `python`, which jupyter_client maps to sys.executable (this
    # venv); the kernel inherits os.environ, hence FP4RL_RUN_DIR.
    monkeypatch.setenv("FP4RL_RUN_DIR", str(run_dir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    work = tmp_path / "cwd"  # the kernel's cwd: not the repo, so RUN_DIR's default cannot resolve
    work.mkdir()
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = _texts(nb)
    assert TABLE_HEADER in text
    for row in report_rows:  # same numbers as report.md, row for row
        assert row in text, row
    assert "per-arm table identical to the one above" in text
    assert "### Claim" in text and "**Status: " in text
    assert "| arm | seed | step | kind | global / median |" in text  # spike attribution (full-dq spikes)
    assert "2x: spikes/100 mean (count); spike; verdict" in text and "5x: spikes/100" in text
    assert "| **claim** |" in text
    assert "jax imported: False" in text
    pngs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == N_FIGURES
    assert elapsed < 120, f"notebook took {elapsed:.0f} s (budget: < 60 s on an idle CPU)"
    print(f"ablations.ipynb executed in {elapsed:.1f} s")


def test_committed_h200_matrix_report_is_its_data_judged():
    """results/matrix_h200 (the notebook's default run): its report.md's claim and per-arm table
    are what the current criteria make of its committed metrics, and its README states that status."""
    from fp4rl.analysis import explore
    from fp4rl.analysis.criteria import StabilityCriteria

    run_dir, run = explore.open_run(REPO / "results" / "matrix_h200")
    summaries, verdicts, claim = explore.judge(run, StabilityCriteria())
    sections = explore.rendered_sections(run, summaries, verdicts, claim, StabilityCriteria())
    assert "identical to the one above" in explore.compare_with_report_on_disk(run_dir, sections)
    on_disk = (run_dir / "report.md").read_text(encoding="utf-8")
    assert sections["Claim"] in on_disk
    status = {None: "UNDECIDED", False: "NOT REPRODUCED", True: "REPRODUCED"}[claim.reproduced]
    assert f"**Status: {status}" in (run_dir / "README.md").read_text(encoding="utf-8")
