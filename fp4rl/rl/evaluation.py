"""Accuracy of a policy on generated problems: sampled (temperature 1) and greedy.

The warm-up is calibrated on the sampled accuracy of the RL difficulty band (docs/rl.md); the
final held-out accuracy of an RL run is greedy, on problems from a task seed the training
data never uses, or, for a run on a data file, on the rows of its eval file.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4rl.model import sampler as model_sampler
from fp4rl.model import sync as model_sync
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import data, tokenizer, verifier
from fp4rl.rl.codec import CHAR, TextCodec
from fp4rl.rl.math_file import MathRows
from fp4rl.rl.task import TaskConfig, make_problem


def sampler_config(max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                   codec: TextCodec = CHAR, prompt_prefill: bool = False) -> model_sampler.SamplerConfig:
    """Rows stop on any of the codec's stop ids."""
    return model_sampler.SamplerConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       eos_id=codec.stop_ids[0], pad_id=codec.pad_id, stop_ids=codec.stop_ids[1:],
                                       prompt_prefill=prompt_prefill)


def sample_fn(graphdef, recipe: PrecisionRecipe, config: model_sampler.SamplerConfig, impl: str,
              seed_axis: str | None = None):
    """(qparams, prompt_ids, prompt_mask, key, temperature) -> SampleOutput; temperature is a
    runtime value, so rollouts (T=1) and greedy evaluation (T=0) share one compiled program.
    seed_axis: the vmap axis it runs under, if any (`sampler.generate`)."""
    return lambda q, ids, mask, key, temperature: model_sampler.generate(
        graphdef, q, ids, recipe, config, key=key, impl=impl, prompt_lengths_B=jnp.sum(mask, axis=1, dtype=jnp.int32),
        temperature=temperature, seed_axis=seed_axis)


@functools.lru_cache(maxsize=16)
def _compiled_sampler(graphdef, recipe_name: str, max_new_tokens: int, impl: str):
    return jax.jit(sample_fn(graphdef, PrecisionRecipe.from_name(recipe_name), sampler_config(max_new_tokens), impl))


def prompt_batches(problems, prompt_len: int, rows: int, codec: TextCodec = CHAR):
    """Fixed-shape prompt batches of `rows` (the last one padded by repeating a prompt, so one
    compiled sampler serves them all): (prompt_ids, prompt_mask, answers of the real rows)."""
    batches = []
    for start in range(0, len(problems), rows):
        chunk = problems[start : start + rows]
        records = [{"prompt": p.prompt, "answer": p.answer, "index": i} for i, p in enumerate(chunk)]
        records += records[-1:] * (rows - len(records))
        cols = data.collate_prompts(records, prompt_len, codec)
        batches.append((cols["prompt_ids_BxT"], cols["prompt_mask_BxT"], [p.answer for p in chunk]))
    return batches


def solve_rate(run, qparams, batches, *, temperature: float, seed: int = 0) -> np.ndarray:
    """+1/-1 correctness per problem (one sample each) with a compiled sampler `run`."""
    correct = []
    for i, (ids, mask, answers) in enumerate(batches):
        out = run(qparams, jnp.asarray(ids), jnp.asarray(mask), jax.random.fold_in(jax.random.key(seed), i),
                  jnp.float32(temperature))
        texts = tokenizer.decode_batch(np.asarray(out.tokens)[: len(answers)])
        correct += [verifier.reward(t, a) for t, a in zip(texts, answers)]
    return np.array(correct, np.float32)


def fitting_prompt_len(problems, minimum: int = 48, multiple: int = 16) -> int:
    """The smallest multiple of `multiple`, at least `minimum`, that holds every encoded prompt
    (BOS prompt separator): one compiled sampler shape for the whole table. The floor keeps the
    short bands' width (and so their sampled tokens) what it has always been."""
    longest = max(len(data.encode_prompt(p.prompt)) for p in problems)
    return max(minimum, -(-longest // multiple) * multiple)


def accuracy_by_difficulty(graphdef, params, recipe, task: TaskConfig, task_seed: int, per_level: int,
                           max_new_tokens: int, seed: int = 0, prompt_len: int | None = None, impl: str = "auto",
                           rows: int = 64) -> list[dict]:
    """Rows {difficulty, sampled, greedy, n} for every number of operations in the task's range.

    The weights are synced once under `recipe`; sampled and greedy decoding share one program.
    prompt_len: the left-padded prompt width; None fits the longest prompt of every level
    (`fitting_prompt_len`), so a harder band never overflows a fixed width.
    """
    recipe = PrecisionRecipe.from_name(recipe) if isinstance(recipe, str) else recipe
    qparams, _ = model_sync.sync_weights_jit(params, nnx.merge(graphdef, params).config, recipe, impl)
    run = _compiled_sampler(graphdef, recipe.name, max_new_tokens, impl)
    levels = {ops: [make_problem(i, task_seed, dataclasses.replace(task, min_ops=ops, max_ops=ops))
                    for i in range(per_level)] for ops in range(task.min_ops, task.max_ops + 1)}
    if prompt_len is None:
        prompt_len = fitting_prompt_len([p for problems in levels.values() for p in problems])
    table = []
    for ops, problems in levels.items():
        batches = prompt_batches(problems, prompt_len, rows)
        sampled = solve_rate(run, qparams, batches, temperature=1.0, seed=seed)
        greedy = solve_rate(run, qparams, batches, temperature=0.0, seed=seed)
        table.append({"difficulty": ops, "sampled": float((sampled > 0).mean()), "greedy": float((greedy > 0).mean()),
                      "n": per_level})
    return table


def accuracy_table_markdown(rows: list[dict]) -> str:
    lines = ["| operations | sampled accuracy (T=1) | greedy accuracy | problems |", "|---|---|---|---|"]
    lines += [f"| {r['difficulty']} | {r['sampled']:.2f} | {r['greedy']:.2f} | {r['n']} |" for r in rows]
    return "\n".join(lines) + "\n"


def held_out_prompts(task: TaskConfig, task_seed: int, num: int, prompt_len: int, rows: int, codec: TextCodec = CHAR):
    """The held-out problems as fixed-shape prompt batches of `rows` (the rollout batch shape)."""
    return prompt_batches([make_problem(i, task_seed, task) for i in range(num)], prompt_len, rows, codec)


@dataclasses.dataclass(frozen=True)
class HeldOutRow:
    """A held-out row of a data file (`math_file.MathRows`): what `prompt_batches` reads of a problem."""

    prompt: str
    answer: int


def held_out_file_prompts(math_rows: MathRows, num: int, prompt_len: int, rows: int, codec: TextCodec):
    """The first `num` usable rows of an eval file, batched as `held_out_prompts` batches problems."""
    chosen = [HeldOutRow(p, a) for p, a in zip(math_rows.prompts[:num], math_rows.answers[:num])]
    return prompt_batches(chosen, prompt_len, rows, codec)
