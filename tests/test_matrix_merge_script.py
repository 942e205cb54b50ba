"""tools/matrix_merge.sh: a device call's finished runs join the matrix, unfinished ones are named and left out,
and the generated files (packed logs, learning.md, report, status.md) follow."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from fp4rl.analysis.synthetic import make_synthetic_run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "matrix_merge.sh"


def _finish(arm_dir: Path, seeds: list[int]) -> None:
    """What the trainer adds to an arm that the analysis generator does not write: its settings and done.json."""
    config = json.loads((arm_dir / "config.json").read_text())
    config["rl_config"] = {"seed_offset": seeds[0], "seeds": len(seeds)}
    (arm_dir / "config.json").write_text(json.dumps(config))
    (arm_dir / "done.json").write_text(json.dumps({"steps": 300, "seeds": seeds}))


def test_a_call_s_finished_runs_join_the_matrix(tmp_path):
    matrix = tmp_path / "matrix"
    make_synthetic_run(matrix, ["bf16"], [0, 1], 300, initial_eval=True)
    _finish(matrix / "bf16", [0, 1])
    call = tmp_path / "call"
    make_synthetic_run(call / "seeds2", ["bf16", "full"], [2, 3], 300, initial_eval=True, seed=1)
    _finish(call / "seeds2" / "bf16", [2, 3])  # full has no done.json: cut by the call's deadline
    files = tmp_path / "files"
    files.mkdir()
    with tarfile.open(files / "matrix.tgz", "w:gz") as tgz:
        tgz.add(call, arcname=".")
    (files / "log.txt").write_text("the call's log\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(SCRIPT), str(files), str(matrix)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "full in seeds2: not finished, left out" in result.stdout
    assert json.loads((matrix / "bf16" / "done.json").read_text())["seeds"] == [0, 1, 2, 3]
    assert (matrix / "bf16" / "log_seeds2-3.txt").read_text() == "the call's log\n"
    assert not (matrix / "full").exists()
    assert sorted(p.name for p in (matrix / "bf16" / "seed3").iterdir()) == ["metrics.jsonl.gz", "updates.jsonl.gz"]
    assert (matrix / "bf16" / "learning.md").is_file() and (matrix / "report.md").is_file()
    assert "Matrix status" in (matrix / "status.md").read_text()


def test_files_without_a_matrix_tarball_are_refused(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "no matrix.tgz" in result.stderr
