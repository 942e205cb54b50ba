"""One RL step of every seed: weight sync -> rollouts -> updates, returning the new state and the
step's raw outputs (`StepOutputs`; `fp4rl.rl.step_records` turns them into the logged records).

Per step: the master weights are quantized once under the recipe (`sync`; the sampler uses those
bytes); groups are sampled with dynamic sampling and scored on the host (`rollouts`); the
trainer's log-probs give the recomputed old policy, the mismatch against the sampler and the
routing flips; then `mini_batches` AdamW updates run (`update`). Nothing here waits for the
updates: the caller fetches the outputs when it builds the records.

A step starts with its `Head`: the sync and the first sampler call, dispatched. JAX dispatch is
asynchronous, so a caller may start step t+1's head before it builds step t's records
(`RLConfig.overlap`, `Trainer.step`); the device then samples while the host builds the records.

Reproducibility: each step's randomness is `fold_in(key(seed), step)`, and a seed's prompts for
generation batch b of a step are read at a fixed position of its shuffled order
(`data.step_batch_index`), so a seed's prompts and keys depend on (seed, step, b) alone: not on the
seeds beside it, nor on how many generation batches they, an earlier step or another arm needed,
nor on when a batch was dispatched (docs/rl.md, "Runs: resuming, checkpoints, reproducibility").
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.rl import column_trim, dapo, data, policy, rollout
from fp4rl.rl.codec import TextCodec
from fp4rl.rl.rl_config import RLConfig
from fp4rl.rl.step_programs import StepPrograms

# The update program's inputs and their dtypes: the programs are compiled ahead for exactly these
# (`StepPrograms.lowerings`).
BATCH_DTYPES = {"tokens": jnp.int32, "valid": bool, "response_mask": bool, "logp_sampler": jnp.float32,
                "advantages": jnp.float32}


@dataclasses.dataclass
class Dispatched:
    """A generation batch handed to the sampler: its host prompts and the sampler's device outputs."""

    ids: np.ndarray  # [seeds, rows, P]
    mask: np.ndarray
    batches: list[dict]  # each seed's prompt batch (its answers score the responses)
    out: Any  # SampleOutput of device arrays, not waited for
    t_dispatch: float


@dataclasses.dataclass
class Head:
    """A step's start: its weight sync and first sampler call, dispatched from `params` at `t_start`.
    `finite`: the per-seed finiteness of `params`, when the caller dispatched it (device array)."""

    step: int
    params: Any
    qparams: Any
    sync_stats: Any
    first: Dispatched
    t_start: float
    finite: Any = None


class Rollouts(NamedTuple):
    """A step's rollouts: each seed's pool of groups, and what they cost."""

    pools: list[rollout.GroupPool]
    gen_batches: int  # generation batches scored
    seconds: float  # first sampler dispatch -> last scored batch's responses on the host
    tokens: float  # response tokens of the scored batches, every seed


@dataclasses.dataclass
class StepOutputs:
    """A step's new state and what its records are built from (device values not yet fetched)."""

    step: int
    state: dict
    rollouts: Rollouts
    arrays: list[dict]  # each seed's training arrays (`rollout.training_arrays`, trimmed)
    valid: np.ndarray  # [seeds, rows, columns] of the update's rows
    response_valid: np.ndarray  # [seeds, rows, response columns]: real response tokens
    update_metrics: list[dict]  # per update, device arrays with a seed axis
    stats: dict  # `dapo.step_stats`, device
    trainer_topk: list  # per mini-batch, device
    sync_stats: Any
    t_start: float
    t_train: float


class StepRunner:
    """The step of one arm's seeds; `prompt_batches[k]`: seed k's prompt batches by position;
    `reference()`: the reference parameters stacked per seed (called only for reference log-probs)."""

    def __init__(self, config: RLConfig, programs: StepPrograms, prompt_batches: list, codec: TextCodec,
                 reference: Callable[[], Any]):
        self.config, self.programs, self.prompt_batches, self.codec = config, programs, prompt_batches, codec
        self.reference = reference

    def run(self, state, head: Head) -> StepOutputs:
        """The step that `head` started from `state`: its rollouts, then its updates, dispatched."""
        rollouts = self.rollouts(head.qparams, head.step, head.first)
        # The synced weights and the first batch's outputs are not read past the rollouts: dropped
        # now, the device frees them before the next step's sync allocates its own.
        head.qparams = head.first = None
        return self.update(state, head, rollouts)

    # ------------------------------------------------------------------ rollouts
    def begin(self, params, step: int) -> Head:
        """Dispatch the step's weight sync and first sampler call."""
        t_start = time.time()
        qparams, sync_stats = self.programs.sync(params)
        return Head(step, params, qparams, sync_stats, self.dispatch(qparams, step, 0), t_start)

    def batch_prompts(self, step: int, b: int) -> list[dict]:
        """Each seed's prompt batch for generation batch `b` of `step`: a pure function of (seed,
        step, b), read by position from the seed's shuffled order (`data.step_batch_index`). A seed
        whose pool is full still rides along in the vmapped sampler (its output is dropped); it
        reads the same batch it would read alone, and its next step starts at its own position."""
        index = data.step_batch_index(step, b, self.config.max_gen_batches)
        return [batches[index] for batches in self.prompt_batches]

    def dispatch(self, qparams, step: int, b: int) -> Dispatched:
        """Hand generation batch `b` of `step` to the sampler; returns without waiting for it."""
        c = self.config
        batches = self.batch_prompts(step, b)
        ids = np.stack([np.repeat(x["prompt_ids_BxT"], c.group_size, 0) for x in batches])
        mask = np.stack([np.repeat(x["prompt_mask_BxT"], c.group_size, 0) for x in batches])
        keys = self.programs.step_keys(step, b)
        t_dispatch = time.time()
        out = self.programs.generate(qparams, ids.astype(np.int32), mask.astype(bool), keys, jnp.float32(c.temperature))
        return Dispatched(ids, mask, batches, out, t_dispatch)

    def rollouts(self, qparams, step: int, first: Dispatched | None = None) -> Rollouts:
        """Generation batches until every seed's pool is full or `max_gen_batches` were drawn.

        With `RLConfig.overlap`, batch b+1 goes to the sampler before batch b's responses are
        fetched and scored, so the device samples while the host scores. When the pools are full
        after batch b, that batch b+1 is discarded unread: device time spent for nothing (a whole
        sampler call; it delays the step's updates behind it), traded for no idle device between
        batches when b+1 is needed. Batch b+1's prompts and keys are those of (seed, step, b+1)
        either way, so the values are the same."""
        c = self.config
        pools = [rollout.GroupPool(c.prompts_per_step) for _ in self.programs.seeds]
        pending = first if first is not None else self.dispatch(qparams, step, 0)
        t_first, tokens = pending.t_dispatch, 0.0
        for b in range(c.max_gen_batches):
            last = b + 1 == c.max_gen_batches
            ahead = self.dispatch(qparams, step, b + 1) if c.overlap and not last else None
            out = jax.device_get(pending.out)
            t_fetched = time.time()
            tokens += float(np.sum(out.lengths))
            for k, pool in enumerate(pools):
                gen = rollout.Generation(pending.ids[k], pending.mask[k], out.tokens[k], out.logprobs[k], out.lengths[k],
                                         out.router_topk[k], pending.batches[k]["answer_B"])
                correct, shaped = rollout.score(gen, c.group_size, c.max_new_tokens, c.overlong_buffer, self.codec)
                pool.add(gen, correct, shaped)
            if last or all(p.full for p in pools):
                break
            pending = ahead if ahead is not None else self.dispatch(qparams, step, b + 1)
        return Rollouts(pools, b + 1, t_fetched - t_first, tokens)

    # ------------------------------------------------------------------ the update
    def update(self, state, head: Head, rollouts: Rollouts) -> StepOutputs:
        """The training batch of the rollouts' pools, its log-prob passes and statistics, and the
        updates from `state`, all dispatched; the outputs hold the device values unfetched."""
        c = self.config
        arrays = [rollout.training_arrays(rollout.balanced(p.filled(), c.mini_batches), c.group_size)
                  for p in rollouts.pools]
        prompt_width, program = c.prompt_len, self.programs.update
        if c.trim_padding:
            window = column_trim.used_window(arrays, c.prompt_len, c.max_new_tokens)
            arrays = [column_trim.trim(a, c.prompt_len, window) for a in arrays]
            prompt_width, program = window.prompt, self.programs.update_program(window.prompt)
        host = {k: np.asarray(np.stack([a[k] for a in arrays]), dtype) for k, dtype in BATCH_DTYPES.items()}
        parts, batches = self._mini_batches(host)
        keys = [self.programs.step_keys(head.step, 1000 + m) for m in range(c.mini_batches)]
        old, logp_ref, batches = self._log_probs(program, state, batches, keys)
        response_valid = host["valid"][:, :, prompt_width:]  # real response tokens, incl. masked-out groups
        stats = dapo.step_stats([o["logp"] for o in old], logp_ref, [p["logp_sampler"] for p in parts],
                                [p["response_mask"] for p in parts], response_valid)
        t_train = time.time()
        params, opt_state, update_metrics = self._apply(program, state, batches, keys)
        return StepOutputs(head.step, {"params": params, "opt_state": opt_state}, rollouts, arrays, host["valid"],
                           response_valid, update_metrics, stats, [o["router_topk"] for o in old], head.sync_stats,
                           head.t_start, t_train)

    def _mini_batches(self, host: dict) -> tuple[list[dict], list[policy.Batch]]:
        """The update's arrays (rows on axis 1; the host keeps the rest, e.g. router_topk), cut
        into mini-batches on the host and placed once each: slicing placed arrays would cost a
        device op (a dispatch and its wait) per field and mini-batch."""
        m_count = self.config.mini_batches
        host = {**host, "unknown": np.zeros_like(host["logp_sampler"])}  # old/reference log-probs, filled in later
        per = host["tokens"].shape[1] // m_count
        parts = [self.programs.put_rows({k: v[:, m * per : (m + 1) * per] for k, v in host.items()})
                 for m in range(m_count)]
        return parts, [policy.Batch(p["tokens"], p["valid"], p["response_mask"], p["unknown"], p["logp_sampler"],
                                    p["unknown"], p["advantages"]) for p in parts]

    def _log_probs(self, program, state, batches, keys):
        """Old and reference log-probs through the update program itself (apply=False: forward
        only), mini-batch by mini-batch: the first update recomputes the old ones bit for bit.
        Returns the old pass's outputs, the reference log-probs (None when
        `RLConfig.reference_logprobs` is off: no loss reads the field, no KL is logged) and the
        batches with both filled in (the old ones in the reference's place when it is off)."""
        off = self.programs.apply_flag(False)

        def forward_pass(params):
            return [program(params, state["opt_state"], b, k, off)[2] for b, k in zip(batches, keys)]

        old = forward_pass(state["params"])
        logp_old = [o["logp"] for o in old]
        reference = self.config.reference_logprobs
        logp_ref = [o["logp"] for o in forward_pass(self.reference())] if reference else logp_old
        put = self.programs.put_rows
        return old, logp_ref if reference else None, [dataclasses.replace(b, logp_old_NxTr=put(lo), logp_ref_NxTr=put(lr))
                                                      for b, lo, lr in zip(batches, logp_old, logp_ref)]

    def _apply(self, program, state, batches, keys):
        """The `mini_batches` updates, queued one after the other; nothing is fetched here (a
        fetch per update would stall the queue)."""
        on = self.programs.apply_flag(True)
        params, opt_state, update_metrics = state["params"], state["opt_state"], []
        for batch, key in zip(batches, keys):
            params, opt_state, metrics = program(params, opt_state, batch, key, on)
            if self.programs.mesh is not None:  # keep the state's placement whatever layout XLA chose for the outputs
                params, opt_state = self.programs.put_state((params, opt_state))
            update_metrics.append({k: v for k, v in metrics.items() if k not in ("logp", "router_topk")})
        return params, opt_state, update_metrics
