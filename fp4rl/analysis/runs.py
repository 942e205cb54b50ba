"""Load an RL ablation run directory into per-arm, per-seed numpy arrays.

A run directory holds one sub-directory per arm of docs/rl.md's ablation matrix ("The ablation
matrix") and one per seed below it. The trainer writes, per (arm, seed), one JSON object per
line:

    <run_dir>/<arm>/seed<k>/metrics.jsonl   one record per RL step (docs/rl.md "Metrics, every step")
    <run_dir>/<arm>/seed<k>/updates.jsonl   one record per mini-batch update ({"step", "update", ...})
    <run_dir>/<arm>/config.json             {"rl_config", "recipe", "model_config"} of the arm

The loader is deliberately forgiving about what a live or crashed run leaves behind, and
loud about it (every tolerance emits a `RunLoadWarning` and is recorded in
`RunData.warnings`, so the report can say what was ignored):

- a last line that does not parse (the writer was killed mid-line) is dropped; an
  unparseable line anywhere else is corruption and raises `ValueError` naming file and line;
- a step (or a step's update) logged twice (a resumed run re-logs steps after its last
  checkpoint): the last record wins, because it is the one the surviving run produced;
- update records of steps that metrics.jsonl does not hold (the writer was killed between the
  two files) are dropped; a seed without updates.jsonl loads with `SeedRun.updates` None;
- a key missing on some lines (`eval/accuracy` is only logged on evaluation steps) is
  NaN (numeric keys) or False (boolean keys) there, and `present[key]` says where it was
  really logged, so a logged NaN (a collapse, docs/rl.md "Stability criteria") is never
  confused with "not logged";
- JSON `NaN`/`Infinity`/`-Infinity` (what Python's json module writes) load as floats;
- a config.json that does not parse is ignored (the arm's recipe is then unknown).

About 400 lines because each tolerance above is handled, warned about and recorded next to the
parsing it concerns; split, the rules would be read apart from the lines they govern.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

# docs/rl.md "The ablation matrix", in the table's order (used for tables, legends and colours):
# `recipe.ABLATION_ARMS` then `recipe.BASELINE_ARMS` (not imported: the analysis reads runs without jax).
ARMS: tuple[str, ...] = ("bf16", "nvfp4", "+dq", "+46", "+hp", "full", "full-dq", "full-46", "full-hp",
                         "nvfp4-pt", "mxfp8-q", "mxfp8", "mxfp8+dq")
# The arm every other arm's reward is compared with (docs/rl.md "reward tracking").
REFERENCE_ARM = "bf16"
# The full recipe and its leave-one-out arms (docs/rl.md "The claim under test").
FULL_ARM = "full"
LEAVE_ONE_OUT_ARMS: tuple[str, ...] = ("full-dq", "full-46", "full-hp")

# Parameter groups with their own pre-clip grad norm (docs/rl.md "Metrics, every step").
GRAD_GROUPS: tuple[str, ...] = (
    "shared_expert", "routed_experts", "router", "attention", "last_layers", "embed_head",
)
# The reward and accuracy the verdicts use: over every response sampled at a step, before
# dynamic sampling drops any group (`reward/mean` is the kept groups only, biased upward).
POPULATION_REWARD = "population/reward_mean"
POPULATION_ACCURACY = "population/accuracy"
# Logged on every step; a file without one of them gets a warning, not an error.
REQUIRED_KEYS: tuple[str, ...] = (
    "step", POPULATION_REWARD, POPULATION_ACCURACY, "reward/mean", "grad_norm/global",
    "updates/applied", "updates/empty",
    *(f"grad_norm/{g}" for g in GRAD_GROUPS),
    "mismatch/kl_k1", "mismatch/kl_k3", "mismatch/max_abs_logp_diff", "mismatch/routing_flip",
    "entropy", "response_length/mean", "quant/map4_frac", "time/step_s",
)
# Logged on evaluation steps only (eval/*) or only by some trainers.
OPTIONAL_KEYS: tuple[str, ...] = (
    "eval/accuracy", "eval/sampled_accuracy", "eval/n", "grad_norm/global_max", "nonfinite", "skipped_update",
    "kl_ref_k3",  # not by a run without reference log-probs (`RLConfig.reference_logprobs`)
)
# Every line of updates.jsonl carries "step" and "update" and these.
UPDATE_REQUIRED_KEYS: tuple[str, ...] = ("empty", "skipped", "nonfinite", "grad_norm/global")

METRICS_FILE = "metrics.jsonl"
UPDATES_FILE = "updates.jsonl"
CONFIG_FILE = "config.json"
PACKED_SUFFIX = ".gz"  # committed results keep their logs gzipped (`pack_logs`); readers take either form
_SEED_DIR = re.compile(r"^seed(\d+)$")


class RunLoadWarning(RuntimeWarning):
    """Something in a run directory was ignored or repaired while loading it."""


@dataclasses.dataclass(frozen=True)
class UpdateLog:
    """One seed's updates.jsonl: one row per mini-batch update, sorted by (step, update).

    `steps` and `update` are int64 [U]; `metrics[key]` [U] and `present[key]` bool [U] follow
    `SeedRun`'s conventions.
    """

    path: Path
    steps: np.ndarray
    update: np.ndarray
    metrics: Mapping[str, np.ndarray]
    present: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def measured(self) -> np.ndarray:
        """bool [U]: updates with a loss token (`empty` not true); an empty mini-batch's
        gradient is the auxiliary loss's alone, so its grad norm is not a measurement."""
        empty = self.metrics.get("empty")
        return np.ones(len(self), bool) if empty is None else ~np.asarray(empty, bool)

    def applied(self) -> np.ndarray:
        """bool [U]: updates that changed the weights (not skipped)."""
        skipped = self.metrics.get("skipped")
        return self.measured() if skipped is None else ~np.asarray(skipped, bool)


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """One (arm, seed) run, every metric aligned on `steps`.

    `steps` is int64 [T], sorted and unique. `metrics[key]` is [T]: float64 for numeric keys
    (NaN where not logged) or bool for keys whose every logged value is a bool (False where
    not logged). `present[key]` is bool [T], True where the key was logged at that step.
    Non-scalar and string values are not loaded. `updates` is the seed's updates.jsonl
    (None when the seed has none).
    """

    arm: str
    seed: int
    path: Path
    steps: np.ndarray
    metrics: Mapping[str, np.ndarray]
    present: Mapping[str, np.ndarray]
    updates: UpdateLog | None = None

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def missing_required(self) -> tuple[str, ...]:
        """Required keys (REQUIRED_KEYS) that never appear in this run's file."""
        return tuple(k for k in REQUIRED_KEYS if k != "step" and k not in self.metrics)

    def logged(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) where `key` was logged (empty arrays if never)."""
        if key not in self.present:
            return np.zeros(0, np.int64), np.zeros(0)
        mask = self.present[key]
        return self.steps[mask], np.asarray(self.metrics[key], np.float64)[mask]

    def last_logged(self, key: str) -> tuple[int, float] | None:
        """(step, value) of the last step where `key` was logged, or None if never logged."""
        steps, values = self.logged(key)
        return None if steps.size == 0 else (int(steps[-1]), float(values[-1]))


@dataclasses.dataclass(frozen=True)
class RunData:
    """A loaded run directory: `arms[arm][seed] -> SeedRun`, arms in `arm_sort_key` order;
    `configs[arm]`: the arm's parsed config.json (arms without a readable one are absent)."""

    root: Path
    arms: Mapping[str, Mapping[int, SeedRun]]
    warnings: tuple[str, ...]
    configs: Mapping[str, Mapping] = dataclasses.field(default_factory=dict)

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(self.arms)

    def runs(self) -> Iterable[SeedRun]:
        for seeds in self.arms.values():
            yield from seeds.values()


def arm_sort_key(arm: str) -> tuple[int, str]:
    """Known arms in docs/rl.md's table order, then any other arm alphabetically."""
    return (ARMS.index(arm), "") if arm in ARMS else (len(ARMS), arm)


def _warn(message: str, sink: list[str]) -> None:
    sink.append(message)
    warnings.warn(message, RunLoadWarning, stacklevel=3)


def seed_dirs(arm_dir: str | Path) -> list[tuple[int, Path]]:
    """The `seed<k>/` directories of an arm directory as (k, path), by k."""
    return sorted((int(m.group(1)), p) for p in Path(arm_dir).iterdir()
                  if p.is_dir() and (m := _SEED_DIR.match(p.name)))


def seed_log(seed_dir: str | Path, name: str) -> Path | None:
    """`seed_dir/name`, else its gzipped form `name.gz`, else None (neither exists)."""
    for candidate in (Path(seed_dir) / name, Path(seed_dir) / (name + PACKED_SUFFIX)):
        if candidate.is_file():
            return candidate
    return None


def read_jsonl(path: str | Path, sink: list[str] | None = None, keys: tuple[str, ...] = ("step",)) -> list[dict]:
    """Parse a JSONL log (gzipped when its name ends in .gz) into a list of dicts (blank lines
    skipped); each must hold `keys`.

    A last line that does not parse is dropped with a `RunLoadWarning` (a partially written
    record); a bad line before the last raises `ValueError` naming file and line.
    """
    path = Path(path)
    sink = [] if sink is None else sink
    if path.name.endswith(PACKED_SUFFIX):
        with gzip.open(path, "rt", encoding="utf-8") as packed:
            lines = packed.read().splitlines()
    else:
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
            raise ValueError(f"{path}:{lineno}: unparseable line: {err}") from err
        if not isinstance(record, dict) or any(k not in record for k in keys):
            raise ValueError(f"{path}:{lineno}: expected a JSON object with key(s) {', '.join(map(repr, keys))}")
        records.append(record)
    return records


def _scalar(value: object) -> bool | float | None:
    """A loadable scalar: bools stay bools (checked first: bool is an int), numbers -> float."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _columns(records: list[dict], skip: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(metrics, present) column arrays of `records` (see `SeedRun` for the conventions)."""
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(k for k in record if k not in skip))
    metrics: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    for key in keys:
        values = [_scalar(r[key]) if key in r else None for r in records]
        mask = np.array([v is not None for v in values], dtype=bool)
        if not mask.any():
            continue  # only strings/lists/null under this key: not a metric series
        if all(isinstance(v, bool) for v in values if v is not None):
            metrics[key] = np.array([bool(v) for v in values], dtype=bool)  # None -> False
        else:
            metrics[key] = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        present[key] = mask
    return metrics, present


def load_updates(path: str | Path, steps: np.ndarray, sink: list[str] | None = None) -> UpdateLog:
    """Load an updates.jsonl, keeping the updates of `steps` (the steps metrics.jsonl holds)."""
    path = Path(path)
    sink = [] if sink is None else sink
    records = read_jsonl(path, sink, keys=("step", "update"))
    by_key: dict[tuple[int, int], dict] = {}
    for record in records:
        by_key[(int(record["step"]), int(record["update"]))] = record  # re-logged: the last wins
    if len(by_key) < len(records):
        _warn(f"{path}: {len(records) - len(by_key)} re-logged update(s); kept the last record of each", sink)
    known = set(int(s) for s in steps)
    orphans = sorted({s for s, _ in by_key if s not in known})
    if orphans:
        _warn(f"{path}: dropped the updates of {len(orphans)} step(s) not in {METRICS_FILE} (first: {orphans[0]})", sink)
    ordered_keys = sorted(k for k in by_key if k[0] in known)
    ordered = [by_key[k] for k in ordered_keys]
    without = sorted(known - {s for s, _ in ordered_keys})
    if without:
        _warn(f"{path}: {len(without)} step(s) of {METRICS_FILE} have no update record (first: {without[0]})", sink)
    metrics, present = _columns(ordered, skip=("step", "update"))
    missing = [k for k in UPDATE_REQUIRED_KEYS if k not in metrics]
    if missing and ordered:
        _warn(f"{path}: required update key(s) never logged: {', '.join(missing)}", sink)
    return UpdateLog(path=path, steps=np.array([k[0] for k in ordered_keys], np.int64),
                     update=np.array([k[1] for k in ordered_keys], np.int64), metrics=metrics, present=present)


def load_seed(path: str | Path, arm: str, seed: int, sink: list[str] | None = None) -> SeedRun:
    """Load one metrics.jsonl (and the updates.jsonl beside it; either may be gzipped) into a `SeedRun`."""
    path = Path(path)
    sink = [] if sink is None else sink
    records = read_jsonl(path, sink)
    by_step: dict[int, dict] = {}
    for record in records:
        by_step[int(record["step"])] = record  # a re-logged step: the last record wins
    if len(by_step) < len(records):
        _warn(f"{path}: {len(records) - len(by_step)} re-logged step(s); kept the last record of each", sink)
    steps = np.array(sorted(by_step), dtype=np.int64)
    metrics, present = _columns([by_step[int(s)] for s in steps], skip=("step",))
    updates_path = seed_log(path.parent, UPDATES_FILE)
    updates = load_updates(updates_path, steps, sink) if updates_path else None
    run = SeedRun(arm=arm, seed=seed, path=path, steps=steps, metrics=metrics, present=present, updates=updates)
    missing = run.missing_required()
    if missing and len(run):
        _warn(f"{path}: required metric(s) never logged: {', '.join(missing)}", sink)
    return run


def load_config(path: str | Path, sink: list[str] | None = None) -> dict | None:
    """An arm's config.json as a dict; None (with a warning) if it does not parse."""
    path = Path(path)
    sink = [] if sink is None else sink
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        _warn(f"{path}: unreadable ({err}); the arm's recipe is not reported", sink)
        return None
    if not isinstance(config, dict):
        _warn(f"{path}: not a JSON object; the arm's recipe is not reported", sink)
        return None
    return config


def has_arm_metrics(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds any `<arm>/seed<k>/metrics.jsonl` (what `load_run` needs)."""
    root = Path(run_dir)
    return root.is_dir() and any(
        seed_log(seed_dir, METRICS_FILE) is not None for arm_dir in root.iterdir() if arm_dir.is_dir()
        for _, seed_dir in seed_dirs(arm_dir))


def load_run(run_dir: str | Path) -> RunData:
    """Load every `<arm>/seed<k>/metrics.jsonl` (with updates.jsonl) and `<arm>/config.json`.

    A sub-directory counts as an arm when it holds at least one `seed<k>/metrics.jsonl`;
    others (checkpoints, logs) are ignored. Any directory name is an arm name (`+dq` is a
    legal one). Raises `FileNotFoundError` if `run_dir` holds no metrics at all.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"run directory {root} does not exist")
    sink: list[str] = []
    arms: dict[str, dict[int, SeedRun]] = {}
    configs: dict[str, dict] = {}
    for arm_dir in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: arm_sort_key(p.name)):
        seeds: dict[int, SeedRun] = {}
        for seed, seed_dir in seed_dirs(arm_dir):
            file = seed_log(seed_dir, METRICS_FILE)
            if file is None:
                _warn(f"{seed_dir}: no {METRICS_FILE}; seed skipped", sink)
                continue
            run = load_seed(file, arm_dir.name, seed, sink)
            if len(run) == 0:
                _warn(f"{file}: no complete record; seed skipped", sink)
                continue
            seeds[seed] = run
        if seeds:
            arms[arm_dir.name] = seeds
            if (arm_dir / CONFIG_FILE).is_file() and (config := load_config(arm_dir / CONFIG_FILE, sink)) is not None:
                configs[arm_dir.name] = config
    if not arms:
        raise FileNotFoundError(f"no <arm>/seed<k>/{METRICS_FILE} under {root}")
    return RunData(root=root, arms=arms, warnings=tuple(sink), configs=configs)


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


# --------------------------------------------------------------------------- grad-norm measurements


@dataclasses.dataclass(frozen=True)
class GradNormSeries:
    """The pre-clip global grad norms spike detection judges, one per measurement.

    per_update True: one per non-empty update of updates.jsonl (`update` its index within the
    step); False: the per-step `grad_norm/global` of metrics.jsonl (a seed without
    updates.jsonl; `update` is -1), which is the mean over the step's updates.
    """

    steps: np.ndarray  # int64 [M]
    update: np.ndarray  # int64 [M]
    values: np.ndarray  # float64 [M]
    per_update: bool

    @property
    def source(self) -> str:
        return (f"{UPDATES_FILE} (per update)" if self.per_update
                else f"{METRICS_FILE} grad_norm/global (per-step mean; no {UPDATES_FILE})")

    def step_max(self, steps: np.ndarray) -> np.ndarray:
        """float64 [T]: per step of `steps`, the largest measurement (non-finite ones win:
        a NaN or Inf at a step shows); NaN at steps without a measurement."""
        out = np.full(np.asarray(steps).shape, np.nan)
        for i, s in enumerate(np.asarray(steps)):
            v = self.values[self.steps == s]
            if v.size:
                out[i] = v[~np.isfinite(v)][0] if not np.isfinite(v).all() else v.max()
        return out


def grad_norm_measurements(run: SeedRun) -> GradNormSeries:
    """The seed's grad-norm measurements: per non-empty update from updates.jsonl, or the
    per-step `grad_norm/global` when the seed has no updates.jsonl (a step that applied no
    update and logged a 0.0 norm is then not a measurement)."""
    u = run.updates
    if u is not None and "grad_norm/global" in u.metrics:
        keep = u.measured()
        return GradNormSeries(u.steps[keep], u.update[keep],
                              np.asarray(u.metrics["grad_norm/global"], np.float64)[keep], True)
    steps, g = run.logged("grad_norm/global")
    keep = np.ones(steps.size, bool)
    if "updates/applied" in run.metrics:
        idx = np.searchsorted(run.steps, steps)
        applied = np.where(run.present["updates/applied"], run.metrics["updates/applied"], math.inf)[idx]
        keep = ~((applied == 0) & (g == 0.0))
    return GradNormSeries(steps[keep], np.full(int(keep.sum()), -1, np.int64), g[keep], False)
