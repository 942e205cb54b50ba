"""Resuming an RL run directory only under the settings it was started with.

`<arm dir>/config.json` records the settings a run trains under, and rerunning the same command
resumes the run from its last checkpoint. A rerun with other settings (another `--optim.lr`,
`--loss.kind`) would continue one run under two configurations while config.json names only the
first. `resume="check"` (the default) refuses that and names every differing setting;
`resume="force"` continues under the new settings, appends the change to `config_changes.jsonl`
and rewrites config.json, so the directory says what each step ran under.

A resume that finds its newest checkpoint steps damaged or unfinished moves them aside
(`fp4rl.rl.checkpoint`) and appends each move to `checkpoint_recovery.jsonl`, so the directory also
says which steps were computed twice and where the bad copies are kept.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fp4rl.run_files import read_json, write_json_atomic

RESUME_OPTIONS = ("check", "force")
CONFIG_FILE = "config.json"
DONE_FILE = "done.json"  # written when a run finished: {"steps", "seeds"}
CHANGES_FILE = "config_changes.jsonl"
RECOVERY_FILE = "checkpoint_recovery.jsonl"  # checkpoint steps moved aside on resume
ABSENT = "<absent>"  # a setting one side does not have (a field added to or removed from the config)

# Settings that may differ on resume without `force`, and why: each changes neither the steps
# already done nor how the remaining ones are computed. The change is still recorded.
MAY_DIFFER = {
    "steps": "extends the run (the steps done are those of a longer run); shrinking below the "
             "checkpoint is refused by the trainer",
    "checkpoint_every": "when the state is saved, not what is computed",
    "out": "where the run directory lies: a moved directory resumes",
    "memory.remat": "the backward recomputes each layer's values instead of keeping them: the same "
                    "values and gradients bit for bit (tests/model/test_memory_options.py)",
    "overlap": "when the host's work runs beside the device's, not what either computes: the same values "
               "bit for bit (tests/rl/test_overlap.py)",
}
# Not compared at all: not a setting of the run.
NOT_COMPARED = {"resume": "how this check itself behaves"}
# Settings that cannot differ even with `force`: the checkpoint's state is shaped by them.
NEVER_DIFFER = {
    "arm": "the checkpoint was trained under its recipe",
    "seeds": "the checkpoint holds one state per seed",
    "seed_offset": "the seed numbers name the seed directories and draw every key",
}


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1}} -> {"optim.lr": 1} (lists are leaves)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every leaf setting that differs (ABSENT for a missing one)."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(set(a) | set(b))
            if k not in ignore and a.get(k, ABSENT) != b.get(k, ABSENT)}


def without_added_at_default(changes: dict[str, tuple[Any, Any]], defaults: dict | None) -> dict[str, tuple[Any, Any]]:
    """`changes` less the settings one side lacks while the other holds the config's default
    (`defaults`, as JSON): a field added to the config after a run started is what that run ran
    under at its default. A field the config no longer has stays a change."""
    default = flatten(defaults or {})
    return {k: (old, new) for k, (old, new) in changes.items()
            if not (k in default and ABSENT in (old, new) and default[k] in (old, new))}


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k}: {json.dumps(old)} -> {json.dumps(new)}" for k, (old, new) in changes.items())


def check(run_dir: str | Path, settings: dict, resume: str, defaults: dict | None = None) -> dict[str, tuple[Any, Any]]:
    """The changes of `settings` (an `RLConfig` as JSON) against the run directory's config.json,
    for a run that resumes from a checkpoint. Raises ValueError when a setting outside MAY_DIFFER
    differs and `resume` is "check", or a NEVER_DIFFER setting differs at all.
    defaults: the config's defaults (as JSON); a setting the record lacks (a field added to the
    config after the run started) is no change when it is at its default, which is what the run
    ran under."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        if resume == "force":
            return {}
        raise ValueError(f"{path} is missing, so the settings of the checkpoint beside it cannot be checked; "
                         "set resume=force (--resume=force; --rl.resume=force in experiments.ablation) to resume "
                         "under this command's settings, or start a new --out")
    recorded = read_json(path)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("rl_config"), dict):
        raise ValueError(f"{path} holds no rl_config object, so the checkpoint's settings cannot be checked; "
                         "restore the file or start a new --out")
    changes = without_added_at_default(differences(recorded["rl_config"], settings, ignore=tuple(NOT_COMPARED)),
                                       defaults)
    fixed = {k: v for k, v in changes.items() if k in NEVER_DIFFER}
    if fixed:
        why = "; ".join(f"{k}: {NEVER_DIFFER[k]}" for k in fixed)
        raise ValueError(f"{path}: cannot resume with {describe(fixed)} ({why}); use the run's values or start a new --out")
    forced = {k: v for k, v in changes.items() if k not in MAY_DIFFER}
    if forced and resume != "force":
        raise ValueError(f"{path}: this run was started with other settings: {describe(forced)}; rerun with its "
                         "settings, set resume=force (--resume=force; --rl.resume=force in experiments.ablation) to "
                         f"continue under the new ones (recorded in {CHANGES_FILE}), or start a new --out")
    return changes


def record(run_dir: str | Path, changes: dict[str, tuple[Any, Any]], step: int, config: dict) -> None:
    """Append the changes taking effect at `step` to config_changes.jsonl and rewrite config.json
    as `config` (the trainer's whole record), so that it names what the run trains under now."""
    run_dir = Path(run_dir)
    line = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "changes": {k: [old, new] for k, (old, new) in changes.items()},
            "forced": sorted(k for k in changes if k not in MAY_DIFFER)}
    with (run_dir / CHANGES_FILE).open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    write_json_atomic(run_dir / CONFIG_FILE, config, indent=2)


def record_recovery(run_dir: str | Path, moved, resumed_from: int | None) -> None:
    """Append each checkpoint step moved aside (`fp4rl.rl.checkpoint.SetAside`: step, moved, to,
    reason) to checkpoint_recovery.jsonl, with the step the run resumed from (None: from the start)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    with (Path(run_dir) / RECOVERY_FILE).open("a", encoding="utf-8") as f:
        for m in moved:
            f.write(json.dumps({"time": now, "step": m.step, "moved": str(m.moved), "to": str(m.to),
                                "reason": m.reason, "resumed_from": resumed_from}) + "\n")
