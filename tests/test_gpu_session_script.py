"""tools/gpu_session.sh: a mistyped mode is refused with the list of the modes it has."""

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_session.sh"


def test_unknown_mode_names_every_mode(tmp_path):
    modes = re.findall(r"^  ([a-z_]+)\)$", SCRIPT.read_text(), flags=re.M)
    assert len(modes) > 10
    result = subprocess.run(["bash", str(SCRIPT), "no_such_mode"], cwd=tmp_path, env={"OUT": str(tmp_path / "out"),
                            "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    listed = result.stdout.split("choose from ", 1)[1].strip().split(", ")
    assert listed == modes
