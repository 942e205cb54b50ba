"""Load an RL ablation run directory into per-arm, per-seed numpy arrays.

A run directory holds one sub-directory per arm of RL.md's ablation matrix ("The ablation
matrix") and one per seed below it, each with the metrics the trainer logs every step
(RL.md "Metrics, every step"), one JSON object per line:

    <run_dir>/<arm>/seed<k>/metrics.jsonl

The loader is deliberately forgiving about what a live or crashed run leaves behind, and
loud about it (every tolerance emits a `RunLoadWarning` and is recorded in
`RunData.warnings`, so the report can say what was ignored):

- a last line that does not parse (the writer was killed mid-line) is dropped; an
  unparseable line anywhere else is corruption and raises `ValueError`;
- a step logged twice (a resumed run re-logs steps after its last checkpoint): the last
  record wins, because it is the one the surviving run produced;
- a key missing on some lines (`eval/accuracy` is only logged on evaluation steps) is
  NaN (numeric keys) or False (boolean keys) there, and `SeedRun.present[key]` says where it
  was really logged, so a logged NaN (a collapse, RL.md "Stability criteria") is never
  confused with "not logged";
- JSON `NaN`/`Infinity`/`-Infinity` (what Python's json module writes) load as floats.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

# RL.md "The ablation matrix", in the table's order (used for tables, legends and colours).
ARMS: tuple[str, ...] = ("bf16", "nvfp4", "+dq", "+46", "+hp", "full", "full-dq", "full-46", "full-hp")
# The arm every other arm's reward is compared with (RL.md "reward tracking").
REFERENCE_ARM = "bf16"
# The full recipe and its leave-one-out arms (RL.md "The claim under test").
FULL_ARM = "full"
LEAVE_ONE_OUT_ARMS: tuple[str, ...] = ("full-dq", "full-46", "full-hp")

# Parameter groups with their own pre-clip grad norm (RL.md "Metrics, every step").
GRAD_GROUPS: tuple[str, ...] = (
    "shared_expert", "routed_experts", "router", "attention", "last_layers", "embed_head",
)
# Logged on every step; a file without one of them gets a warning, not an error.
REQUIRED_KEYS: tuple[str, ...] = (
    "step", "reward/mean", "accuracy", "grad_norm/global",
    *(f"grad_norm/{g}" for g in GRAD_GROUPS),
    "mismatch/kl_k1", "mismatch/kl_k3", "mismatch/max_abs_logp_diff", "mismatch/routing_flip",
    "entropy", "kl_ref_k3", "response_length/mean", "quant/map4_frac", "time/step_s",
)
# Logged on some steps only (eval/accuracy) or only by some trainers.
OPTIONAL_KEYS: tuple[str, ...] = ("eval/accuracy", "nonfinite", "skipped_update")

METRICS_FILE = "metrics.jsonl"
_SEED_DIR = re.compile(r"^seed(\d+)$")


class RunLoadWarning(RuntimeWarning):
    """Something in a run directory was ignored or repaired while loading it."""


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """One (arm, seed) run, every metric aligned on `steps`.

    `steps` is int64 [T], sorted and unique. `metrics[key]` is [T]: float64 for numeric keys
    (NaN where not logged) or bool for keys whose every logged value is a bool (False where
    not logged). `present[key]` is bool [T], True where the key was logged at that step.
    Non-scalar and string values are not loaded.
    """

    arm: str
    seed: int
    path: Path
    steps: np.ndarray
    metrics: Mapping[str, np.ndarray]
    present: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def missing_required(self) -> tuple[str, ...]:
        """Required keys (REQUIRED_KEYS) that never appear in this run's file."""
        return tuple(k for k in REQUIRED_KEYS if k != "step" and k not in self.metrics)

    def last_logged(self, key: str) -> tuple[int, float] | None:
        """(step, value) of the last step where `key` was logged, or None if never logged."""
        if key not in self.present:
            return None
        idx = np.flatnonzero(self.present[key])
        if idx.size == 0:
            return None
        i = int(idx[-1])
        return int(self.steps[i]), float(self.metrics[key][i])


@dataclasses.dataclass(frozen=True)
class RunData:
    """A loaded run directory: `arms[arm][seed] -> SeedRun`, arms in `arm_sort_key` order."""

    root: Path
    arms: Mapping[str, Mapping[int, SeedRun]]
    warnings: tuple[str, ...]

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(self.arms)

    def runs(self) -> Iterable[SeedRun]:
        for seeds in self.arms.values():
            yield from seeds.values()


def arm_sort_key(arm: str) -> tuple[int, str]:
    """Known arms in RL.md's table order, then any other arm alphabetically."""
    return (ARMS.index(arm), "") if arm in ARMS else (len(ARMS), arm)


def _warn(message: str, sink: list[str]) -> None:
    sink.append(message)
    warnings.warn(message, RunLoadWarning, stacklevel=3)


def read_metrics_jsonl(path: str | Path, sink: list[str] | None = None) -> list[dict]:
    """Parse a metrics.jsonl file into a list of dicts (blank lines skipped).

    A last line that does not parse is dropped with a `RunLoadWarning` (a partially written
    record); a bad line before the last raises `ValueError` naming file and line.
    """
    path = Path(path)
    sink = [] if sink is None else sink
    lines = path.read_text(encoding="utf-8").splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    records: list[dict] = []
    for pos, (lineno, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if pos == len(numbered) - 1:
                _warn(f"{path}:{lineno}: ignoring partially written last line ({err.msg})", sink)
                break
            raise ValueError(f"{path}:{lineno}: unparseable metrics line: {err}") from err
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}:{lineno}: expected a JSON object with a 'step' key")
        records.append(record)
    return records


def _scalar(value: object) -> bool | float | None:
    """A loadable scalar: bools stay bools (checked first: bool is an int), numbers -> float."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return None


def load_seed(path: str | Path, arm: str, seed: int, sink: list[str] | None = None) -> SeedRun:
    """Load one metrics.jsonl into a `SeedRun` (see the module docstring for the rules)."""
    path = Path(path)
    sink = [] if sink is None else sink
    records = read_metrics_jsonl(path, sink)
    by_step: dict[int, dict] = {}
    for record in records:
        by_step[int(record["step"])] = record  # a re-logged step: the last record wins
    if len(by_step) < len(records):
        _warn(f"{path}: {len(records) - len(by_step)} re-logged step(s); kept the last record of each", sink)
    steps = np.array(sorted(by_step), dtype=np.int64)
    ordered = [by_step[int(s)] for s in steps]

    keys: dict[str, None] = {}
    for record in ordered:
        keys.update(dict.fromkeys(k for k in record if k != "step"))
    metrics: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    for key in keys:
        values = [_scalar(r[key]) if key in r else None for r in ordered]
        mask = np.array([v is not None for v in values], dtype=bool)
        if not mask.any():
            continue  # only strings/lists/null under this key: not a metric series
        if all(isinstance(v, bool) for v in values if v is not None):
            metrics[key] = np.array([bool(v) for v in values], dtype=bool)  # None -> False
        else:
            metrics[key] = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        present[key] = mask

    run = SeedRun(arm=arm, seed=seed, path=path, steps=steps, metrics=metrics, present=present)
    missing = run.missing_required()
    if missing and len(run):
        _warn(f"{path}: required metric(s) never logged: {', '.join(missing)}", sink)
    return run


def load_run(run_dir: str | Path) -> RunData:
    """Load every `<arm>/seed<k>/metrics.jsonl` under `run_dir`.

    A sub-directory counts as an arm when it holds at least one `seed<k>/metrics.jsonl`;
    others (checkpoints, logs) are ignored. Any directory name is an arm name (`+dq` is a
    legal one). Raises `FileNotFoundError` if `run_dir` holds no metrics at all.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"run directory {root} does not exist")
    sink: list[str] = []
    arms: dict[str, dict[int, SeedRun]] = {}
    for arm_dir in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: arm_sort_key(p.name)):
        seeds: dict[int, SeedRun] = {}
        seed_dirs = [(int(m.group(1)), p) for p in arm_dir.iterdir() if p.is_dir() and (m := _SEED_DIR.match(p.name))]
        for seed, seed_dir in sorted(seed_dirs):
            file = seed_dir / METRICS_FILE
            if not file.is_file():
                _warn(f"{seed_dir}: no {METRICS_FILE}; seed skipped", sink)
                continue
            run = load_seed(file, arm_dir.name, seed, sink)
            if len(run) == 0:
                _warn(f"{file}: no complete record; seed skipped", sink)
                continue
            seeds[seed] = run
        if seeds:
            arms[arm_dir.name] = seeds
    if not arms:
        raise FileNotFoundError(f"no <arm>/seed<k>/{METRICS_FILE} under {root}")
    return RunData(root=root, arms=arms, warnings=tuple(sink))


def stack_seeds(runs: Iterable[SeedRun], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Align one metric of several seeds on the union of their steps.

    Returns (steps [T], values [S, T]); NaN where a seed did not log `key` at a step (a seed
    that stopped early, or a key that is absent). Non-finite logged values are kept as is.
    """
    runs = list(runs)
    if not runs:
        return np.zeros(0, np.int64), np.zeros((0, 0))
    steps = np.unique(np.concatenate([r.steps for r in runs]))
    values = np.full((len(runs), steps.size), np.nan)
    for i, r in enumerate(runs):
        if key not in r.metrics:
            continue
        col = np.searchsorted(steps, r.steps)
        values[i, col] = np.where(r.present[key], r.metrics[key].astype(np.float64), np.nan)
    return steps, values
