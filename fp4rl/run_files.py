"""The files of a run directory that both floors touch: `fp4rl.rl` writes them, `fp4rl.analysis`
reads them (and never imports `rl`). JSON files a run reads back (config.json, done.json,
sft_meta.json, checksums) are damaged only by a kill or by hand; an unreadable one is an error that
names it, never a bare JSONDecodeError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MERGED_KEY = "merged_seeds"  # config.json: the seeds `fp4rl.rl.merge_seeds` added to the arm, and from where


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in `path`; a damaged file raises ValueError naming it and the position."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: unreadable JSON ({err.msg} at line {err.lineno} column {err.colno}); "
                         "the file is damaged (cut by a kill?): restore or delete it") from None


def write_json_atomic(path: str | os.PathLike, value: Any, indent: int | None = None) -> None:
    """Write `value` to `path` through a temporary file and a rename: a kill leaves the old
    file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=indent), encoding="utf-8")
    os.replace(tmp, path)
