"""Measure every stability criterion of one run or arm (RL.md "Stability criteria").

`summarize_seed` applies `fp4rl.analysis.stability`'s detectors to one (arm, seed) run;
`summarize_arm` adds the reward gap to the BF16 arm and the bootstrap CI of the final
held-out accuracy over seeds; `summarize_run` does every arm of a loaded run directory.
The resulting `ArmSummary` is what `stability.verdict` judges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from fp4rl.analysis.runs import REFERENCE_ARM, RunData, SeedRun
from fp4rl.analysis.stability import (
    BootstrapCI,
    CollapseResult,
    MismatchSummary,
    StabilityCriteria,
    bootstrap_ci,
    detect_collapse,
    detect_spikes,
    mismatch_summary,
    reward_gap_to_reference,
    spikes_per_100_steps,
)


@dataclasses.dataclass(frozen=True)
class SeedSummary:
    """Every criterion's measurement for one (arm, seed) run."""

    arm: str
    seed: int
    n_steps: int
    last_step: int
    spike_steps: tuple[int, ...]
    severe_steps: tuple[int, ...]
    spikes_per_100: float
    severe_per_100: float
    collapse: CollapseResult
    reward_gap: float  # NaN without a reference arm
    final_accuracy: float  # last logged eval/accuracy; NaN if never logged
    final_accuracy_step: int | None
    mismatch: MismatchSummary
    skipped_updates: int


@dataclasses.dataclass(frozen=True)
class ArmSummary:
    """One arm over its seeds. reward_gap_mean is NaN when `has_reference` is False;
    final_accuracy is None when no seed logged a finite eval/accuracy."""

    arm: str
    seeds: tuple[SeedSummary, ...]
    has_reference: bool
    reward_gap_mean: float
    final_accuracy: BootstrapCI | None
    mismatch: MismatchSummary  # means over seeds (max for max_abs_logp_diff)


def summarize_seed(run: SeedRun, criteria: StabilityCriteria = StabilityCriteria(), reward_gap: float = float("nan")) -> SeedSummary:
    """Measure spikes, collapse, final accuracy and mismatch of one run."""
    for key in ("grad_norm/global", "reward/mean"):
        if key not in run.metrics:
            raise ValueError(f"{run.path}: '{key}' was never logged; cannot judge stability")
    g, r = run.metrics["grad_norm/global"], run.metrics["reward/mean"]
    spike, severe = detect_spikes(g, run.steps, criteria)
    numeric = {k: v for k, v in run.metrics.items() if v.dtype != bool}
    collapse = detect_collapse(
        run.steps, g, r, criteria, other_metrics=numeric, present=run.present,
        nonfinite_flag=run.metrics.get("nonfinite"),
    )
    final = run.last_logged("eval/accuracy")
    skipped = run.metrics.get("skipped_update")
    return SeedSummary(
        arm=run.arm, seed=run.seed, n_steps=len(run), last_step=int(run.steps[-1]),
        spike_steps=tuple(int(s) for s in run.steps[spike]),
        severe_steps=tuple(int(s) for s in run.steps[severe]),
        spikes_per_100=spikes_per_100_steps(spike, run.steps, criteria),
        severe_per_100=spikes_per_100_steps(severe, run.steps, criteria),
        collapse=collapse, reward_gap=reward_gap,
        final_accuracy=float("nan") if final is None else final[1],
        final_accuracy_step=None if final is None else final[0],
        mismatch=mismatch_summary(run.metrics),
        skipped_updates=0 if skipped is None else int(np.count_nonzero(skipped & run.present["skipped_update"])),
    )


def summarize_arm(
    arm: str,
    runs: Mapping[int, SeedRun],
    reference_runs: Mapping[int, SeedRun] | None,
    criteria: StabilityCriteria = StabilityCriteria(),
) -> ArmSummary:
    """Summarise one arm's seeds; `reference_runs` are the BF16 arm's seeds (None if absent)."""
    gaps: Mapping[int, float] = {}
    gap_mean = float("nan")
    if reference_runs:
        rg = reward_gap_to_reference(
            {s: (r.steps, r.metrics["reward/mean"]) for s, r in runs.items()},
            {s: (r.steps, r.metrics["reward/mean"]) for s, r in reference_runs.items()},
        )
        gaps, gap_mean = rg.per_seed, rg.mean
    seeds = tuple(summarize_seed(r, criteria, gaps.get(s, float("nan"))) for s, r in runs.items())
    acc = [s.final_accuracy for s in seeds if np.isfinite(s.final_accuracy)]
    ci = bootstrap_ci(acc) if acc else None
    if ci is not None and len(acc) < len(seeds):
        note = f"{len(seeds) - len(acc)} of {len(seeds)} seeds have no finite eval/accuracy and are left out"
        ci = dataclasses.replace(ci, note="; ".join(n for n in (ci.note, note) if n))

    def over_seeds(field: str, fn) -> float:
        v = np.array([getattr(s.mismatch, field) for s in seeds])
        v = v[np.isfinite(v)]
        return float(fn(v)) if v.size else float("nan")

    mismatch = MismatchSummary(
        kl_k3=over_seeds("kl_k3", np.mean), kl_k1=over_seeds("kl_k1", np.mean),
        max_abs_logp_diff=over_seeds("max_abs_logp_diff", np.max), routing_flip=over_seeds("routing_flip", np.mean),
    )
    return ArmSummary(arm=arm, seeds=seeds, has_reference=bool(reference_runs), reward_gap_mean=gap_mean,
                      final_accuracy=ci, mismatch=mismatch)


def summarize_run(
    run: RunData, criteria: StabilityCriteria = StabilityCriteria(), reference_arm: str = REFERENCE_ARM
) -> dict[str, ArmSummary]:
    """Summarise every arm of a loaded run against the `reference_arm`'s reward."""
    reference = run.arms.get(reference_arm)
    return {arm: summarize_arm(arm, seeds, reference, criteria) for arm, seeds in run.arms.items()}
