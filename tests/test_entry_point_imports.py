"""The training and benchmark entry points import without the HTTP serving stack, and they are the
only command lines.

The GPU image has no FastAPI/uvicorn, and the server is built on the standard library's HTTP
server, so no entry point (serving included) may need them. A subprocess hides those packages and
imports every entry point. The library keeps no `main()`: every command line is an experiments/
module (`python -m experiments.<name>`).
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if not p.stem.startswith("_"))

HIDE_HTTP_STACK = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "starlette"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None
sys.meta_path.insert(0, Hide())
"""


def _run(code):
    return subprocess.run([sys.executable, "-c", HIDE_HTTP_STACK + code], cwd=ROOT, capture_output=True, text=True,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})


def test_entry_points_import_without_fastapi_or_uvicorn():
    # one process for all of them (each import of JAX costs seconds); the first failure names its module
    result = _run("".join(f"import experiments.{module}\n" for module in ENTRY_POINTS))
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_hiding_works():
    result = _run("import fastapi\n")
    assert result.returncode != 0 and "hidden by the test" in result.stderr


def test_the_library_keeps_no_command_line():
    found = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
             for path in sorted((ROOT / "fp4rl").rglob("*.py")) for text in [path.read_text(encoding="utf-8")]
             for m in re.finditer(r"^def main\(|^if __name__ == .__main__.:", text, re.M)]
    assert not found, f"command lines belong in experiments/: {found}"
