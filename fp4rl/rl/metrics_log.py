"""One writer for a run's metrics: JSONL (the record of truth, flushed every step) and TensorBoard.

`<run_dir>/metrics.jsonl` holds one JSON object per step. On resume, lines past the restored
checkpoint's step are dropped first, so the re-run steps are logged once and no earlier step
is lost (the steps after the checkpoint are recomputed bit for bit). TensorBoard gets the same:
a resumed writer opens with `purge_step` at the first re-run step, which hides the earlier event
files' scalars from that step on.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


def _jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return value  # json writes NaN/Infinity, which the analysis loader reads back
    return value


def truncate_after(path: Path, step: int) -> None:
    """Keep only the records with `step <= step`. A last line that does not parse is one a kill cut
    short and is dropped; a damaged line before it raises ValueError naming file and line, as
    dropping it would lose a logged step without a word."""
    if not path.exists():
        return
    numbered = [(i + 1, line) for i, line in enumerate(path.read_text().splitlines()) if line.strip()]
    kept = []
    for pos, (lineno, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if pos == len(numbered) - 1:
                continue  # the torn last line of a killed run
            raise ValueError(f"{path}:{lineno}: damaged line ({err.msg}); only a torn last line is repaired on "
                             "resume: fix or delete the line") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{lineno}: expected a JSON object with an integer \"step\"; fix or delete the line")
        if record["step"] <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


class MetricsWriter:
    """Appends records to `<run_dir>/<filename>` (and TensorBoard scalars, when on). `purge_step`:
    the first step a resumed run logs again (see the module docstring)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, filename: str = "metrics.jsonl",
                 purge_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            # tensorboardX names an event file by the second it opens it, and a second writer of the
            # same second would truncate the first's file: a unique, increasing suffix keeps both,
            # in the order TensorBoard reads them (by name).
            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge_step,
                                     filename_suffix=f".{time.time_ns()}.{os.getpid()}")

    def write(self, record: dict) -> None:
        record = {k: _jsonable(v) for k, v in record.items()}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def device_memory(devices) -> dict[str, float]:
    """{"memory/peak_gb": the largest peak of the allocator's bytes in use over `devices` since the
    process began} where the platform reports it (GPUs), {} where it does not (XLA:CPU): the
    measured peak a memory estimate is checked against (`fp4rl.analysis.scaling_plan`)."""
    peaks = [stats["peak_bytes_in_use"] for stats in (d.memory_stats() for d in devices)
             if stats and "peak_bytes_in_use" in stats]
    return {"memory/peak_gb": max(peaks) / 1e9} if peaks else {}
