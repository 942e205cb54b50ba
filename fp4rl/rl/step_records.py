"""A step's logged records, built on the host from its raw outputs (`train_step.StepOutputs`): one
metrics.jsonl record per seed (docs/rl.md, "Metrics, every step") and the seed's updates.jsonl lines.

Timing, with a step's start the dispatch of its weight sync:
- `time/step_s`: from this step's start to the next step's, when the next step started before these
  records were built (`RLConfig.overlap`, not the last step of the process): consecutive steps' times
  then add up to the run's wall time. Otherwise from this step's start to its records' end (the
  loop's writes, evaluation and checkpoint after it are not in it).
- `time/rollout_s`: from the step's first sampler dispatch (under overlap: in the step before, once
  its updates were queued) to its last scored generation batch's responses on the host, the host's
  scoring of the earlier batches included (under overlap it runs while the sampler works).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from fp4rl.rl import rollout, update_stats
from fp4rl.rl.metrics_log import device_memory
from fp4rl.rl.train_step import StepOutputs


def build(outputs: StepOutputs, max_new_tokens: int, next_start: float | None = None) -> tuple[list[dict], list[list[dict]]]:
    """(per-seed records, per-seed updates.jsonl lines) of a step; `next_start`: when the next
    step started, if it did before these records (see the module's docstring). Fetches the
    step's device outputs, so it waits for its updates."""
    update_metrics, stats, trainer_topk, sync_stats = jax.device_get(
        (outputs.update_metrics, outputs.stats, outputs.trainer_topk, outputs.sync_stats))
    train_time = time.time() - outputs.t_train
    trainer_topk = np.concatenate(trainer_topk, axis=2)
    step_time = (time.time() if next_start is None else next_start) - outputs.t_start
    timing = {"time/step_s": step_time, "time/rollout_s": outputs.rollouts.seconds}
    memory = device_memory(jax.local_devices())  # the process's, the same for every seed
    records, lines = [], []
    for k in range(len(outputs.arrays)):
        per_update = update_stats.of_seed(update_metrics, k)
        records.append({
            "step": outputs.step,
            **_rollout_record(outputs, k, max_new_tokens),
            **update_stats.summary(per_update),
            **_mismatch_record(outputs, stats, trainer_topk, k),
            "quant/map4_frac": float(np.asarray(sync_stats["quant/map4_frac"])[k]),
            **timing,
            "throughput/rollout_tok_s": outputs.rollouts.tokens / max(outputs.rollouts.seconds, 1e-9) / len(outputs.arrays),
            "throughput/train_tok_s": float(outputs.valid[k].sum()) / max(train_time, 1e-9),
            "update/columns": int(outputs.valid.shape[2]),
            **memory,
        })
        lines.append(update_stats.lines(outputs.step, per_update))
    return records, lines


def _rollout_record(outputs: StepOutputs, k: int, max_new_tokens: int) -> dict:
    pool, lengths = outputs.rollouts.pools[k], outputs.response_valid[k].sum(1)
    shaped = outputs.arrays[k]["shaped"]
    return {
        # Population: every response sampled this step, before dynamic sampling drops any.
        "population/accuracy": pool.accuracy,
        "population/reward_mean": pool.reward_mean,
        "population/responses": pool.sampled,
        # The training batch: the kept groups (and masked fillers when too few were kept).
        "reward/mean": float(shaped.mean()),
        "reward/std": float(shaped.std()),
        "dapo/dropped_group_frac": pool.dropped / max(pool.generated, 1),
        "dapo/gen_batches": outputs.rollouts.gen_batches,
        "dapo/filled_frac": float(np.mean([g[3] for g in pool.filled()])),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/trunc_rate": float((lengths >= max_new_tokens).mean()),
    }


def _mismatch_record(outputs: StepOutputs, stats: dict, trainer_topk: np.ndarray, k: int) -> dict:
    """Trainer/sampler mismatch of seed k, and the KL to the reference when it was computed."""
    return {
        **({"kl_ref_k3": float(stats["kl_ref_k3"][k])} if "kl_ref_k3" in stats else {}),
        "mismatch/kl_k1": float(stats["mismatch_k1"][k]),
        "mismatch/kl_k3": float(stats["mismatch_k3"][k]),
        "mismatch/max_abs_logp_diff": float(stats["mismatch_abs_max"][k]),
        "mismatch/mean_abs_logp_diff": float(stats["mismatch_abs_mean"][k]),
        "mismatch/mean_exp_abs_diff": float(stats["mismatch_exp_abs_mean"][k]),
        "mismatch/routing_flip": rollout.routing_flip_rate(outputs.arrays[k]["router_topk"], trainer_topk[k],
                                                           outputs.response_valid[k]),
    }
