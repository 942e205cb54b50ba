"""docs/rl.md "Learning-rate pilot", step one: the largest learning rate at which the BF16 arm is stable.

    python -m experiments.lr_sweep runs/pilot/lr1e-4 runs/pilot/lr3e-4   # prints the chosen run dir

Each directory is an ablation run (`<dir>/bf16/seed<k>/metrics.jsonl`) whose name ends in
`lr<value>`. Stable = in no seed a spike (3x rule), a collapse, or a reward drop of docs/rl.md's
collapse size that the run ended too early to confirm or clear (fp4rl.analysis.detectors): a
short pilot run cannot wait 50 steps for a recovery, so choosing an LR treats it as unstable.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import POPULATION_REWARD, load_run
from fp4rl.analysis.summary import summarize_arm


def lr_of(run_dir: str | Path) -> float:
    match = re.search(r"lr([0-9.eE+-]+)$", Path(run_dir).name)
    if not match:
        raise ValueError(f"{run_dir}: the directory name must end in lr<value>, e.g. lr3e-4")
    return float(match.group(1))


def bf16_stability(run_dir: str | Path, criteria: StabilityCriteria = StabilityCriteria()) -> dict:
    """{dir, lr, stable, spikes, collapsed, steps, population reward in the first/last quarter} of one run's bf16 arm."""
    seeds = load_run(run_dir).arms.get("bf16")
    if not seeds:
        return {"dir": str(run_dir), "lr": lr_of(run_dir), "stable": False, "note": "no bf16 arm"}
    summary = summarize_arm("bf16", seeds, None, criteria)
    spikes = sum(len(s.spike_steps) for s in summary.seeds)
    collapsed = any(s.collapse.collapsed for s in summary.seeds)
    reward_drop = any(s.collapse.reward_drop_unconfirmed for s in summary.seeds)
    rewards = [r.logged(POPULATION_REWARD)[1] for r in seeds.values()]
    quarter = lambda r, end: r[-max(1, r.size // 4):] if end else r[: max(1, r.size // 4)]  # noqa: E731
    return {"dir": str(run_dir), "lr": lr_of(run_dir), "stable": spikes == 0 and not collapsed and not reward_drop,
            "spikes": spikes, "collapsed": collapsed, "reward_drop_unconfirmed": reward_drop, "steps": min(len(r) for r in seeds.values()),
            "reward_first_quarter": float(np.mean([np.nanmean(quarter(r, False)) for r in rewards])),
            "reward_last_quarter": float(np.mean([np.nanmean(quarter(r, True)) for r in rewards]))}


def largest_stable_lr(run_dirs, criteria: StabilityCriteria = StabilityCriteria()) -> tuple[dict | None, list[dict]]:
    """The row of the largest LR whose bf16 arm is stable (None if none is), and every run's row."""
    rows = sorted((bf16_stability(d, criteria) for d in run_dirs), key=lambda r: r["lr"])
    stable = [r for r in rows if r["stable"]]
    return (stable[-1] if stable else None), rows
