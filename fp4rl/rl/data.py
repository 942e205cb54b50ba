"""grain pipelines: records -> shuffled, batched, tokenized arrays with checkpointable state.

A *record* is a dict `{"prompt": str, "answer": int, "index": int}` (plus `"solution"` for
generated problems). Two sources produce records as a `grain.MapDataset`:

* `problem_records`: the procedural task; record i is `make_problem(i, task_seed, task)`,
  so it depends only on (task_seed, i) and is recomputed lazily, never stored;
* `file_records`: rows of a local DAPO-Math-17k-style file (`math_file.load_math_rows`).

`prompt_batches` shuffles them by `shuffle_seed` (a new permutation each epoch), repeats,
and batches into left-padded prompt arrays for the sampler; `sft_batches` does the same
with right-padded prompt+solution sequences for the BF16 warm-up. Both are random access:
batch i is the same whoever reads it when. The RL trainer reads a seed's batches by position
(`step_batch_index`), so that what a step samples depends on the step alone. `iterate` returns
a grain iterator (the warm-up's) whose `get_state()` is a small dict (the next batch position)
that a checkpoint can store; `set_state()` on a fresh iterator resumes exactly
(tests/rl/test_data.py).

Token layout shared by SFT and RL, so the warm-up teaches exactly what the sampler sees:
    BOS prompt "\\n" solution EOS
The sampler is given `BOS prompt "\\n"` and generates the rest. Prompt batches take another
`codec.TextCodec` (a Hugging Face checkpoint's chat template: `fp4rl.rl.hf_tokenizer`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import grain
import numpy as np

from fp4rl.rl import tokenizer
from fp4rl.rl import codec as codecs
from fp4rl.rl.codec import CHAR, TextCodec
from fp4rl.rl.math_file import MathRows
from fp4rl.rl.task import TaskConfig, make_problem, noisy_solution

PROMPT_SEPARATOR = codecs.PROMPT_SEPARATOR


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """batch_size: prompts per batch (the sampler draws G responses for each).
    max_len: tokens per row (prompt batches: BOS+prompt+separator; SFT batches: the whole
        sequence); a longer example raises rather than being truncated.
    shuffle_seed: the data order (docs/rl.md: seeds change data order); task_seed: the content of
        generated problems (keep it fixed across seeds so arms see the same problems).
    num_problems: size of the procedural index space (one epoch).
    num_epochs: None repeats forever. num_threads/prefetch: grain ReadOptions; 0/0 reads
        synchronously, which suits cheap in-memory records (no GIL contention).
    """

    batch_size: int = 32
    max_len: int = 128
    shuffle_seed: int = 0
    task_seed: int = 0
    num_problems: int = 1 << 20
    num_epochs: int | None = None
    num_threads: int = 0
    prefetch: int = 0

    def __post_init__(self):
        if self.batch_size < 1 or self.max_len < 3 or self.num_problems < self.batch_size:
            raise ValueError(
                f"need {self.batch_size=} >= 1, {self.max_len=} >= 3, "
                f"{self.num_problems=} >= batch_size"
            )


def problem_records(task: TaskConfig, task_seed: int, num_problems: int, answer_noise: float = 0.0) -> grain.MapDataset:
    """Record i is problem i of stream `task_seed`; with `answer_noise` > 0 its solution's boxed
    answer is wrong with that probability (`task.noisy_solution`: the noisy-teacher warm-up)."""
    def record(i):
        p = make_problem(int(i), task_seed, task)
        solution = noisy_solution(p, int(i), task_seed, answer_noise) if answer_noise else p.solution
        return {"prompt": p.prompt, "answer": p.answer, "index": int(i), "solution": solution}

    return grain.MapDataset.range(num_problems).map(record)


def file_records(rows: MathRows) -> grain.MapDataset:
    return grain.MapDataset.range(len(rows.prompts)).map(
        lambda i: {"prompt": rows.prompts[i], "answer": rows.answers[i], "index": int(i)}
    )


def encode_prompt(prompt: str, codec: TextCodec = CHAR) -> list[int]:
    """The sampler's input for one prompt (the character layout: BOS prompt separator)."""
    return codec.encode_prompt(prompt)


def collate_prompts(records: Sequence[dict], max_len: int, codec: TextCodec = CHAR) -> dict[str, np.ndarray]:
    """prompt_ids_BxT int32 (left-padded with the codec's pad id), prompt_mask_BxT bool, answer_B/index_B int64."""
    prompts = [codec.encode_prompt(r["prompt"]) for r in records]
    ids, mask = tokenizer.pad_batch(prompts, max_len, side="left", pad_id=codec.pad_id)
    return {
        "prompt_ids_BxT": ids,
        "prompt_mask_BxT": mask,
        "answer_B": np.array([r["answer"] for r in records], np.int64),
        "index_B": np.array([r["index"] for r in records], np.int64),
    }


def collate_sft(records: Sequence[dict], max_len: int) -> dict[str, np.ndarray]:
    """ids_BxT int32 (right-padded), mask_BxT (real tokens), loss_mask_BxT, index_B.

    loss_mask is True on the solution tokens and EOS, i.e. on the positions the model must
    predict (the trainer predicts ids[:, t] from ids[:, :t]); the prompt is context only.
    """
    seqs, n_context = [], []
    for r in records:
        context = encode_prompt(r["prompt"])
        seqs.append(context + tokenizer.encode(r["solution"], eos=True))
        n_context.append(len(context))
    ids, mask = tokenizer.pad_batch(seqs, max_len, side="right")
    loss_mask = mask & (np.arange(max_len)[None, :] >= np.array(n_context)[:, None])
    index_B = np.array([r["index"] for r in records], np.int64)
    return {"ids_BxT": ids, "mask_BxT": mask, "loss_mask_BxT": loss_mask, "index_B": index_B}


def _batches(records: grain.MapDataset, cfg: DataConfig, collate) -> grain.MapDataset:
    # shuffle before repeat: grain reseeds the permutation for every epoch.
    ds = records.shuffle(seed=cfg.shuffle_seed).repeat(cfg.num_epochs)
    # drop_remainder: every batch has the same shape, so the jitted step never retraces.
    return ds.batch(
        cfg.batch_size, drop_remainder=True, batch_fn=lambda rs: collate(rs, cfg.max_len)
    )


def prompt_batches(records: grain.MapDataset, cfg: DataConfig, codec: TextCodec = CHAR) -> grain.MapDataset:
    return _batches(records, cfg, functools.partial(collate_prompts, codec=codec))


def sft_batches(records: grain.MapDataset, cfg: DataConfig) -> grain.MapDataset:
    return _batches(records, cfg, collate_sft)


def step_batch_index(step: int, gen_batch: int, max_gen_batches: int) -> int:
    """The position in a seed's prompt batches of generation batch `gen_batch` of RL step `step`.

    Each step owns `max_gen_batches` consecutive positions and reads as many of them as dynamic
    sampling needs; the others are never read. So a seed's prompts depend on (seed, step,
    gen_batch) alone, not on how many batches an earlier step, another seed of the program or
    another arm drew: seed k of every arm sees the same prompts (the ablation pairs them). The
    price: with `max_gen_batches` > 1 the positions a step does not read are skipped, so a data
    file's epoch lasts len(rows) / (prompts_per_step * max_gen_batches) steps, and the rows at
    skipped positions wait for a later epoch's permutation.
    """
    if not 0 <= gen_batch < max_gen_batches:
        raise ValueError(f"generation batch {gen_batch} is outside the step's {max_gen_batches=}")
    if step < 0:
        raise ValueError(f"{step=} must be >= 0")
    return step * max_gen_batches + gen_batch


def iterate(batches: grain.MapDataset, cfg: DataConfig) -> grain.DatasetIterator:
    """An iterator with get_state()/set_state() (a dict: store it in the checkpoint)."""
    options = grain.ReadOptions(num_threads=cfg.num_threads, prefetch_buffer_size=cfg.prefetch)
    return iter(batches.to_iter_dataset(options))
