"""A run's held-out evaluation: its prompt batches, and the accuracy of every seed's policy on them
through the rollout's own compiled sync and sampler (temperature is a runtime value: nothing
recompiles)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.rl import evaluation, failures, run_inputs
from fp4rl.rl.codec import TextCodec, decode_batch
from fp4rl.rl.rl_config import RLConfig
from fp4rl.rl.step_programs import StepPrograms


def batches(config: RLConfig, inputs: run_inputs.RunInputs, codec: TextCodec) -> list:
    """The evaluation's prompt batches, in the rollout's shape (one compiled sampler): the first
    eval_prompts usable rows of eval_file for a data-file run, else the procedural held-out stream;
    none without evaluation."""
    c = config
    rows = c.prompts_per_step * c.group_size
    if not c.eval_every:
        return []
    if c.eval_file:
        if inputs.eval_rows is None:
            raise ValueError(f"eval_file={c.eval_file!r} but the run's inputs hold no eval rows: load them with "
                             "run_inputs.load(config) for this config")
        return evaluation.held_out_file_prompts(inputs.eval_rows, c.eval_prompts, c.prompt_len, rows, codec)
    return evaluation.held_out_prompts(c.task, c.eval_task_seed, c.eval_prompts, c.prompt_len, rows, codec)


def evaluate(programs: StepPrograms, config: RLConfig, codec: TextCodec, eval_batches: list, params_S) -> list[dict]:
    """Held-out accuracy per seed: greedy (`eval/accuracy`, docs/rl.md's final accuracy) and sampled
    at the rollout temperature (`eval/sampled_accuracy`), with the same keys at every evaluation;
    `eval/n` problems each. The wrong responses are split by `fp4rl.rl.failures`
    (`eval/{greedy,sampled}_{miscopied,wrong_chain}`: fractions of all responses)."""
    seeds = programs.seeds
    qparams, _ = programs.sync(params_S)
    n = len(seeds)
    texts = {"greedy": [[] for _ in seeds], "sampled": [[] for _ in seeds]}
    all_answers = []
    for i, (ids, mask, answers) in enumerate(eval_batches):
        keys = jnp.stack([jax.random.fold_in(jax.random.key(config.eval_task_seed), 1000 * s + i) for s in seeds])
        all_answers += answers
        for mode, temperature in (("greedy", 0.0), ("sampled", config.temperature)):
            tokens = np.asarray(programs.generate(qparams, np.stack([ids] * n).astype(np.int32),
                                                  np.stack([mask] * n).astype(bool), programs.put(keys),
                                                  jnp.float32(temperature)).tokens)
            for k in range(n):
                texts[mode][k] += decode_batch(codec, tokens[k][: len(answers)])
    records = []
    for k in range(n):
        greedy, sampled = (failures.fractions(texts[mode][k], all_answers) for mode in ("greedy", "sampled"))
        records.append({"eval/accuracy": greedy["right"], "eval/sampled_accuracy": sampled["right"],
                        "eval/n": len(all_answers),
                        **{f"eval/{mode}_{kind}": fractions[kind] for mode, fractions in
                           (("greedy", greedy), ("sampled", sampled)) for kind in failures.KINDS[1:]}})
    return records
