"""Gzip the per-seed JSONL logs of run directories in place, so committed results stay small.

    python -m experiments.pack_logs results/long_h200/chain/matrix

Every `seed<k>/metrics.jsonl` and `seed<k>/updates.jsonl` under the given directories becomes
`<name>.gz` (about 6x smaller); every reader in `fp4rl.analysis` takes either form
(`runs.seed_log`). The gzip stream carries no timestamp or file name, so packing the same log
twice gives the same bytes, and each packed file is read back and compared with the original
before the original is removed. A live run keeps writing plain JSONL: pack only finished runs.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from fp4rl.analysis.runs import METRICS_FILE, PACKED_SUFFIX, UPDATES_FILE, seed_dirs

__all__ = ["pack_file", "pack_tree", "plain_logs"]

PACKED_LOGS = (METRICS_FILE, UPDATES_FILE)


def pack_file(path: Path) -> Path:
    """Replace `path` by `path.gz` (level 9, no timestamp); returns the packed path."""
    packed = path.with_name(path.name + PACKED_SUFFIX)
    if packed.exists():
        raise FileExistsError(f"{packed} exists beside {path}: which one holds the log is ambiguous; remove one")
    raw = path.read_bytes()
    with open(packed, "wb") as sink, gzip.GzipFile(filename="", mode="wb", fileobj=sink, compresslevel=9, mtime=0) as out:
        out.write(raw)
    if gzip.decompress(packed.read_bytes()) != raw:  # never lose a log to a bad write
        packed.unlink()
        raise OSError(f"{packed} does not read back as {path}; original kept")
    path.unlink()
    return packed


def plain_logs(root: str | Path) -> list[Path]:
    """The plain seed logs under `root` (in any `seed<k>/` below it, at any depth)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    parents = [root, *(p for p in root.rglob("*") if p.is_dir())]
    return sorted(d / name for parent in parents for _, d in seed_dirs(parent) for name in PACKED_LOGS
                  if (d / name).is_file())


def pack_tree(root: str | Path) -> list[Path]:
    """Pack every seed log under `root` (any depth); returns the packed paths."""
    return [pack_file(p) for p in plain_logs(root)]
