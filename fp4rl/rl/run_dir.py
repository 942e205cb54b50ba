"""Run directories: the output check made before any work, and `train.log` (their JSON files:
`fp4rl.run_files`).

Every run (warm-up, RL arm, ablation) writes into a directory named by an `out` option. It is
checked before anything is computed, so a path that is a file or cannot be written fails in
the first second instead of after the first checkpoint.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

LOG_FILE = "train.log"


def prepare_out(path: str | os.PathLike, option: str = "--out") -> Path:
    """Create the output directory `path` (and its parents); a path that is a file, lies under a
    file or cannot be written raises ValueError naming `option`."""
    path = Path(path)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise ValueError(f"{option}={path} {where}; give a directory path")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{option}={path} is not writable ({existing}: {err.strerror}); give a writable directory") from None
    return path


class RunLog:
    """The progress messages of a run, appended with a timestamp to `<run dir>/train.log` (the
    record a detached run leaves behind) and, when `echo`, printed above the progress bar."""

    def __init__(self, run_dir: str | os.PathLike, echo: bool = True):
        self.path = Path(run_dir) / LOG_FILE
        self.echo = echo
        self._file = self.path.open("a", encoding="utf-8")

    def __call__(self, message: str, echo: bool = True) -> None:
        self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
        self._file.flush()
        if self.echo and echo:
            tqdm.write(message)

    def close(self) -> None:
        self._file.close()
