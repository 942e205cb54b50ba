"""Synthetic run directories with known answers, for tests and notebooks.

`make_synthetic_run` writes the layout `fp4rl.analysis.runs` reads: per (arm, seed)
`metrics.jsonl` with every key of docs/rl.md "Metrics, every step" that the analysis uses and
`updates.jsonl` with one line per mini-batch update, and per arm a `config.json` (recipe and
model depth). Healthy arms have a flat, slightly noisy per-update grad norm (log-normal,
sigma 0.05: a 3x excursion is a > 20-sigma event, so no spike occurs by chance) and a
population reward that rises from -0.4 to +0.4. A spiky arm additionally gets, in every seed,
the spikes of `injected_spikes` in the first update of their step, and a population reward
lagging 0.2 behind, so it fails the spike and reward criteria while the others pass them.

The training-batch `reward/mean` is the population reward plus `KEPT_BIAS` in every arm, the
lag included: dynamic sampling keeps the groups with mixed rewards, which hides a deficit of
the population, so only the population reward shows the spiky arms' gap. With two updates per
step, the injected 4x spike is 2.5x in the per-step mean `grad_norm/global` (no spike there)
and the 12x severe spike 6.5x (a spike, not severe): only the per-update series shows both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fp4rl.analysis.runs import CONFIG_FILE, GRAD_GROUPS, METRICS_FILE, UPDATES_FILE

SPIKE_FACTOR = 4.0  # a spike that is not severe (3x < 4x < 10x, docs/rl.md "Stability criteria")
SEVERE_FACTOR = 12.0  # a severe spike (> 10x)
REWARD_LAG = 0.2  # spiky arms' population-reward deficit: fails the default 0.1 tolerance
KEPT_BIAS = 0.3  # training-batch reward/mean over the population reward (kept groups)
SAMPLED_DEFICIT = 0.05  # sampled (temperature 1) accuracy below the greedy one
EVAL_EVERY = 20  # eval/* is logged every EVAL_EVERY steps and on the last step
NUM_LAYERS = 8  # model depth written to config.json
SITE_KINDS = ("routed_experts", "shared_expert", "dense_mlp", "attention", "router", "embed", "lm_head")
HIGH_PRECISION_ARMS = ("+hp", "full", "full-dq", "full-46")  # arms keeping the last ~15% in BF16


def injected_spikes(steps: int) -> tuple[int, int]:
    """(spike_step, severe_step) injected into every seed of a spiky arm of `steps` steps.

    Both lie past the warm-up of 20 steps (docs/rl.md: spikes count after step 20); requires
    steps >= 30.
    """
    if steps < 30:
        raise ValueError(f"{steps=} must be >= 30 to place spikes after the 20-step warm-up")
    return 20 + (steps - 20) // 3, 20 + 2 * (steps - 20) // 3


def synthetic_recipe(arm: str) -> dict:
    """A PrecisionRecipe-shaped dict (`PrecisionRecipe.from_json` reads it): `bf16` all BF16;
    other arms NVFP4 MoE linears, with the shared expert and the last 15% of layers BF16 in
    HIGH_PRECISION_ARMS."""
    hp = arm in HIGH_PRECISION_ARMS
    fmt = {k: "bf16" for k in SITE_KINDS}
    if arm != "bf16":
        fmt["routed_experts"] = "nvfp4"
        fmt["shared_expert"] = "bf16" if hp else "nvfp4"
    return {"name": arm, "keep_last_fraction": 0.15 if hp else 0.0, **{k: {"format": f} for k, f in fmt.items()}}


def _write_lines(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def make_synthetic_run(
    out_dir: str | Path,
    arms: Sequence[str],
    seeds: int | Sequence[int],
    steps: int,
    spiky_arms: Sequence[str] = (),
    seed: int = 0,
    updates_per_step: int = 2,
    eval_n: int | None = 32,
    initial_eval: bool = False,
) -> Path:
    """Write a synthetic run directory and return its path.

    arms: arm directory names. seeds: a count (seeds 0..n-1) or explicit seed numbers.
    steps: logged steps per run, numbered 0..steps-1. spiky_arms: arms that get a 4x spike
    and a 12x severe spike at `injected_spikes(steps)` in every seed, and a lagging reward.
    seed: the numpy seed of the noise (the output is a pure function of the arguments).
    updates_per_step: mini-batch updates per step (lines of updates.jsonl per step).
    eval_n: problems per evaluation (`eval/n`; accuracies are multiples of 1/eval_n); None
    logs no `eval/n`.
    initial_eval: also log the trainer's evaluation before any update (`eval/initial_*`, step 0).
    """
    out = Path(out_dir)
    seed_ids = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    unknown = set(spiky_arms) - set(arms)
    if unknown:
        raise ValueError(f"spiky_arms {sorted(unknown)} are not among arms {list(arms)}")
    if updates_per_step < 1:
        raise ValueError(f"{updates_per_step=} must be >= 1")
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    for arm in arms:
        spiky = arm in spiky_arms
        (out / arm).mkdir(parents=True, exist_ok=True)
        config = {"rl_config": {"arm": arm, "steps": steps, "mini_batches": updates_per_step, "eval_prompts": eval_n},
                  "recipe": synthetic_recipe(arm), "model_config": {"num_layers": NUM_LAYERS}}
        (out / arm / CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")
        for k in seed_ids:
            grad = 0.5 * np.exp(0.05 * rng.standard_normal((steps, updates_per_step)))
            reward = -0.4 + 0.8 * t / max(steps - 1, 1) + 0.03 * rng.standard_normal(steps)
            batch_reward = np.minimum(reward + KEPT_BIAS, 1.0)
            if spiky:
                spike_step, severe_step = injected_spikes(steps)
                grad[spike_step, 0] *= SPIKE_FACTOR
                grad[severe_step, 0] *= SEVERE_FACTOR
                reward = reward - REWARD_LAG
            accuracy = np.clip((reward + 1.0) / 2.0, 0.0, 1.0)
            lines, update_lines = [], []
            for i in range(steps):
                g = grad[i]
                record = {
                    "step": int(i),
                    "population/accuracy": float(accuracy[i]),
                    "population/reward_mean": float(reward[i]),
                    "population/responses": 64,
                    "reward/mean": float(batch_reward[i]),
                    "reward/std": 0.9,
                    "updates/applied": updates_per_step,
                    "updates/empty": 0,
                    "grad_norm/global": float(g.mean()),
                    "grad_norm/global_max": float(g.max()),
                    **{f"grad_norm/{name}": float(g.mean() / np.sqrt(len(GRAD_GROUPS))) for name in GRAD_GROUPS},
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
                if initial_eval and i == 0:  # the trainer's evaluation before any update, logged with step 0
                    n = eval_n or 32
                    record["eval/initial_accuracy"] = round(float(accuracy[0]) * n) / n
                    record["eval/initial_sampled_accuracy"] = round(max(float(accuracy[0]) - SAMPLED_DEFICIT, 0.0) * n) / n
                    record["eval/initial_n"] = n
                if i % EVAL_EVERY == 0 or i == steps - 1:
                    n = eval_n or 32
                    record["eval/accuracy"] = round(float(accuracy[i]) * n) / n
                    record["eval/sampled_accuracy"] = round(max(float(accuracy[i]) - SAMPLED_DEFICIT, 0.0) * n) / n
                    if eval_n is not None:
                        record["eval/n"] = eval_n
                lines.append(record)
                update_lines += [{"step": int(i), "update": m, "empty": False, "skipped": False, "nonfinite": False,
                                  "grad_norm/global": float(g[m]), "ratio_mean": 1.0, "ratio_max": 1.2,
                                  "ratio_min": 0.8, "clip_frac_upper": 0.0, "clip_frac_lower": 0.0,
                                  "clip_frac_dual": 0.0, "approx_kl": 1e-4, "loss/policy": 0.0}
                                 for m in range(updates_per_step)]
            _write_lines(out / arm / f"seed{k}" / METRICS_FILE, lines)
            _write_lines(out / arm / f"seed{k}" / UPDATES_FILE, update_lines)
    return out
