"""What a step's updates log: one line per mini-batch update (`updates.jsonl`, which spike
detection judges) and their reduction per seed (the update part of `metrics.jsonl`)."""

from __future__ import annotations

import jax
import numpy as np

from fp4rl.rl.policy import GRAD_GROUPS

# Per mini-batch update, one line each in <arm>/seed<k>/updates.jsonl.
UPDATE_KEYS = ("empty", "skipped", "nonfinite", "grad_norm/global", "ratio_mean", "ratio_max", "ratio_min",
               "clip_frac_upper", "clip_frac_lower", "clip_frac_dual", "approx_kl", "loss/policy")


def of_seed(update_metrics: list[dict], k: int) -> list[dict]:
    """Seed k's metrics of each update, from the updates' host metrics (arrays with a seed axis)."""
    return [jax.tree.map(lambda x: np.asarray(x)[k], um) for um in update_metrics]


def summary(per_update: list[dict]) -> dict:
    """One seed's updates reduced for its step record: means over the updates that had loss tokens
    (an empty mini-batch runs no update), the first such update's importance ratios, counts and flags."""
    ran = [u for u in per_update if not u["empty"]]
    mean = lambda key: float(np.mean([u[key] for u in ran])) if ran else 0.0  # noqa: E731
    first = ran[0] if ran else per_update[0]
    return {
        "entropy": mean("entropy"),
        "clip_frac/upper": mean("clip_frac_upper"),
        "clip_frac/lower": mean("clip_frac_lower"),
        "clip_frac/dual": mean("clip_frac_dual"),
        "approx_kl": mean("approx_kl"),
        "ratio/first_minibatch_mean": float(first["ratio_mean"]),
        "ratio/first_minibatch_max": float(first["ratio_max"]),
        "ratio/first_minibatch_min": float(first["ratio_min"]),
        "loss/policy": mean("loss/policy"),
        "loss/aux": mean("loss/aux"),
        # Pre-clip norms of the updates that ran (per update: updates.jsonl).
        "updates/applied": sum(not u["skipped"] for u in per_update),
        "updates/empty": sum(bool(u["empty"]) for u in per_update),
        "grad_norm/global": mean("grad_norm/global"),
        "grad_norm/global_max": max((float(u["grad_norm/global"]) for u in ran), default=0.0),
        **{f"grad_norm/{g}": mean(f"grad_norm/{g}") for g in GRAD_GROUPS},
        "nonfinite": bool(any(u["nonfinite"] for u in ran)),
        "skipped_update": bool(any(u["skipped"] and not u["empty"] for u in per_update)),
    }


def lines(step: int, per_update: list[dict]) -> list[dict]:
    """One seed's updates.jsonl lines for `step`."""
    return [{"step": step, "update": m, **{key: u[key] for key in UPDATE_KEYS}} for m, u in enumerate(per_update)]
