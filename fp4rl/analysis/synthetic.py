"""Synthetic run directories with known answers, for tests and notebooks.

`make_synthetic_run` writes the layout `fp4rl.analysis.runs` reads
(`<out>/<arm>/seed<k>/metrics.jsonl`, RL.md "The ablation matrix") with every key of RL.md
"Metrics, every step" that the analysis uses. Healthy arms have a flat, slightly noisy
grad norm (log-normal, sigma 0.05: a 3x excursion is a > 20-sigma event, so no spike occurs
by chance) and a reward that rises from -0.4 to +0.4. A spiky arm additionally gets, in every
seed, the spikes of `injected_spikes` and a reward lagging 0.2 behind, so it fails the spike
and reward criteria while the others pass them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fp4rl.analysis.runs import GRAD_GROUPS, METRICS_FILE

SPIKE_FACTOR = 4.0  # a spike that is not severe (3x < 4x < 10x, RL.md "Stability criteria")
SEVERE_FACTOR = 12.0  # a severe spike (> 10x)
REWARD_LAG = 0.2  # spiky arms' reward deficit: fails the default 0.1 tolerance
EVAL_EVERY = 20  # eval/accuracy is logged every EVAL_EVERY steps and on the last step


def injected_spikes(steps: int) -> tuple[int, int]:
    """(spike_step, severe_step) injected into every seed of a spiky arm of `steps` steps.

    Both lie past the warm-up of 20 steps (RL.md: spikes count after step 20); requires
    steps >= 30.
    """
    if steps < 30:
        raise ValueError(f"{steps=} must be >= 30 to place spikes after the 20-step warm-up")
    return 20 + (steps - 20) // 3, 20 + 2 * (steps - 20) // 3


def make_synthetic_run(
    out_dir: str | Path,
    arms: Sequence[str],
    seeds: int | Sequence[int],
    steps: int,
    spiky_arms: Sequence[str] = (),
    seed: int = 0,
) -> Path:
    """Write a synthetic run directory and return its path.

    arms: arm directory names. seeds: a count (seeds 0..n-1) or explicit seed numbers.
    steps: logged steps per run, numbered 0..steps-1. spiky_arms: arms that get a 4x spike
    and a 12x severe spike at `injected_spikes(steps)` in every seed, and a lagging reward.
    seed: the numpy seed of the noise (the output is a pure function of the arguments).
    """
    out = Path(out_dir)
    seed_ids = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    unknown = set(spiky_arms) - set(arms)
    if unknown:
        raise ValueError(f"spiky_arms {sorted(unknown)} are not among arms {list(arms)}")
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    for arm in arms:
        spiky = arm in spiky_arms
        for k in seed_ids:
            grad = 0.5 * np.exp(0.05 * rng.standard_normal(steps))
            reward = -0.4 + 0.8 * t / max(steps - 1, 1) + 0.03 * rng.standard_normal(steps)
            if spiky:
                spike_step, severe_step = injected_spikes(steps)
                grad[spike_step] *= SPIKE_FACTOR
                grad[severe_step] *= SEVERE_FACTOR
                reward = reward - REWARD_LAG
            accuracy = np.clip((reward + 1.0) / 2.0, 0.0, 1.0)
            lines = []
            for i in range(steps):
                record = {
                    "step": int(i),
                    "reward/mean": float(reward[i]),
                    "accuracy": float(accuracy[i]),
                    "grad_norm/global": float(grad[i]),
                    **{f"grad_norm/{g}": float(grad[i] / np.sqrt(len(GRAD_GROUPS))) for g in GRAD_GROUPS},
                    "mismatch/kl_k1": float(1e-4 * (1 + 0.1 * rng.standard_normal())),
                    "mismatch/kl_k3": float(2e-4 * (1 + 0.1 * rng.standard_normal()) * (3.0 if spiky else 1.0)),
                    "mismatch/max_abs_logp_diff": float(abs(0.5 + 0.1 * rng.standard_normal())),
                    "mismatch/routing_flip": float(0.01 * abs(1 + 0.1 * rng.standard_normal())),
                    "entropy": float(0.8 - 0.2 * i / steps),
                    "kl_ref_k3": float(1e-3 * i),
                    "response_length/mean": float(40 + 5 * rng.standard_normal()),
                    "quant/map4_frac": 0.0 if arm == "bf16" else 0.3,
                    "time/step_s": float(1.0 + 0.05 * rng.standard_normal()),
                    "nonfinite": False,
                    "skipped_update": False,
                }
                if i % EVAL_EVERY == 0 or i == steps - 1:
                    record["eval/accuracy"] = float(accuracy[i])
                lines.append(json.dumps(record))
            path = out / arm / f"seed{k}" / METRICS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
