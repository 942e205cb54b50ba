"""One writer for a run's metrics: JSONL (the record of truth, flushed every step) and TensorBoard.

`<run_dir>/metrics.jsonl` holds one JSON object per step. On resume, lines past the restored
checkpoint's step are dropped first, so the re-run steps are logged once and no earlier step
is lost (the steps after the checkpoint are recomputed bit for bit).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return value  # json writes NaN/Infinity, which the analysis loader reads back
    return value


def truncate_after(path: Path, step: int) -> None:
    """Keep only the records with `step <= step` (and drop a partially written last line)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if record.get("step", -1) <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


class MetricsWriter:
    """Appends records to `<run_dir>/<filename>` (and TensorBoard scalars, when on)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, filename: str = "metrics.jsonl"):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))

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
