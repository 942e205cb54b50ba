"""The serving engine: one deployment, fixed batch shapes compiled ahead, batches of row requests.

A row is one sequence to generate (a prompt and one of its n choices). Every batch has
`max_batch` rows and a prompt width from `prompt_buckets` (the smallest that holds the batch's
longest prompt), unused rows being one-token dummies that stop after one step; generation runs
for at most `max_new_tokens` steps, each row to its own budget. So the server runs
len(prompt_buckets) programs, compiled before the first request (`compile`), and never compiles
on a request: a shape outside them is an error, not a new program.

Batch invariance: within one bucket, a row's tokens do not depend on the other rows or on its
position (per-token activation scales, dropless routing, per-row keys; `decode`). A prompt's
bucket depends on the batch's longest prompt, so the batcher only batches prompts of one bucket
together (`bucket_of`): a request's result is then a function of the request alone.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Literal

import jax
import numpy as np

from fp4rl.serving import decode
from fp4rl.serving.deployment import Deployment

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """max_batch: rows per batch (B). prompt_buckets: the prompt widths P compiled, ascending; the
    largest is the longest prompt accepted. max_new_tokens: T, the largest `max_tokens` a request
    may ask for. The cache holds P + T - 1 slots, at most the model's max_seq_len."""

    max_batch: int = 8
    prompt_buckets: tuple[int, ...] = (32, 64)
    max_new_tokens: int = 48

    def __post_init__(self):
        if self.max_batch < 1 or self.max_new_tokens < 1:
            raise ValueError(f"need {self.max_batch=} >= 1 and {self.max_new_tokens=} >= 1")
        if not self.prompt_buckets or list(self.prompt_buckets) != sorted(set(self.prompt_buckets)) \
                or self.prompt_buckets[0] < 1:
            raise ValueError(f"prompt_buckets={self.prompt_buckets} must be positive, ascending and unique")

    @property
    def max_prompt_tokens(self) -> int:
        return self.prompt_buckets[-1]


@dataclasses.dataclass(frozen=True)
class RowRequest:
    """prompt_ids: the full prompt (BOS included where the model uses one). seed, choice: the row's
    sampling key is fold_in(key(seed), choice) (`decode`); temperature 0 is greedy."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    choice: int = 0


@dataclasses.dataclass(frozen=True)
class RowResult:
    """token_ids: the completion without its stop token; logprobs: theirs; completion_tokens: tokens
    generated, the stop token included; finish_reason: "stop" (it ended on one of the model's
    stop ids) or "length" (budget)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    completion_tokens: int
    finish_reason: FinishReason


@dataclasses.dataclass
class EngineStats:
    """Totals over the batches run: real rows, generated tokens (real rows only), seconds."""

    batches: int = 0
    rows: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Engine:
    def __init__(self, deployment: Deployment, config: EngineConfig):
        model = deployment.model
        longest = config.max_prompt_tokens + config.max_new_tokens - 1
        if longest > model.config.max_seq_len:
            raise ValueError(f"the largest prompt bucket ({config.max_prompt_tokens}) + max_new_tokens "
                             f"({config.max_new_tokens}) - 1 = {longest} cache slots exceed the model's "
                             f"max_seq_len={model.config.max_seq_len}: lower one of them")
        self.deployment, self.config = deployment, config
        self.stats = EngineStats()
        self._compiled: dict[int, object] = {}
        self._lock = threading.Lock()  # one batch at a time: the in-process and HTTP paths may share an engine

    @property
    def model(self):
        return self.deployment.model

    def bucket_of(self, prompt_len: int) -> int:
        """The prompt width a prompt of `prompt_len` tokens runs at; ValueError when too long."""
        if prompt_len < 1:
            raise ValueError("a prompt needs at least one token")
        for width in self.config.prompt_buckets:
            if prompt_len <= width:
                return width
        raise ValueError(f"the prompt has {prompt_len} tokens; this server accepts at most "
                         f"{self.config.max_prompt_tokens}")

    def _arrays(self, rows: Sequence[RowRequest], width: int) -> decode.RowParams:
        B, pad = self.config.max_batch, self.model.pad_id
        prompt = np.full((B, width), pad, np.int32)
        lengths, budget = np.ones(B, np.int32), np.ones(B, np.int32)  # dummies: one token, then stop
        temperature, top_p = np.zeros(B, np.float32), np.ones(B, np.float32)
        seed, choice = np.zeros(B, np.uint32), np.zeros(B, np.uint32)
        for b, row in enumerate(rows):
            n = len(row.prompt_ids)
            prompt[b, width - n:] = row.prompt_ids
            lengths[b], budget[b] = n, row.max_tokens
            temperature[b], top_p[b], seed[b], choice[b] = row.temperature, row.top_p, row.seed, row.choice
        return decode.RowParams(prompt, lengths, budget, temperature, top_p, seed, choice)

    def _ids(self):
        return np.asarray(self.model.stop_ids, np.int32), np.int32(self.model.pad_id)

    def compile(self) -> dict[int, float]:
        """Compile the program of every prompt bucket ahead; returns seconds per bucket."""
        times = {}
        d = self.deployment
        for width in self.config.prompt_buckets:
            if width in self._compiled:
                continue
            t0 = time.perf_counter()
            lowered = decode.generate_rows.lower(self.model.graphdef, d.forward_recipe, d.impl, self.config.max_new_tokens,
                                                 d.qparams, self._arrays([], width), *self._ids())
            self._compiled[width] = lowered.compile()
            times[width] = time.perf_counter() - t0
        return times

    def run_batch(self, rows: Sequence[RowRequest]) -> list[RowResult]:
        """One padded batch of rows of one bucket (at most max_batch), in order."""
        if not 1 <= len(rows) <= self.config.max_batch:
            raise ValueError(f"a batch holds 1..{self.config.max_batch} rows, not {len(rows)}")
        widths = {self.bucket_of(len(r.prompt_ids)) for r in rows}
        if len(widths) != 1:
            raise ValueError(f"rows of one batch must share a prompt bucket, got widths {sorted(widths)}")
        for r in rows:
            if not 1 <= r.max_tokens <= self.config.max_new_tokens:
                raise ValueError(f"max_tokens={r.max_tokens} must be in [1, {self.config.max_new_tokens}]")
        width = widths.pop()
        if width not in self._compiled:
            raise RuntimeError(f"prompt bucket {width} is not compiled: call Engine.compile() first")
        with self._lock:
            t0 = time.perf_counter()
            out = jax.device_get(self._compiled[width](self.deployment.qparams, self._arrays(rows, width), *self._ids()))
            seconds = time.perf_counter() - t0
            results = self._results(rows, out)
            self.stats.batches += 1
            self.stats.rows += len(rows)
            self.stats.tokens += sum(r.completion_tokens for r in results)
            self.stats.seconds += seconds
        return results

    def _results(self, rows, out) -> list[RowResult]:
        results = []
        for b, row in enumerate(rows):
            n = int(out.lengths[b])
            tokens = [int(t) for t in out.tokens[b, :n]]
            stopped = n > 0 and tokens[-1] in self.model.stop_ids
            keep = n - 1 if stopped else n
            results.append(RowResult(tuple(tokens[:keep]), tuple(float(x) for x in out.logprobs[b, :keep]), n,
                                     "stop" if stopped else "length"))
        return results

    def generate(self, rows: Sequence[RowRequest]) -> list[RowResult]:
        """Any number of rows, in order: grouped by bucket, run in batches of max_batch."""
        by_width: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_width.setdefault(self.bucket_of(len(r.prompt_ids)), []).append(i)
        results: list[RowResult | None] = [None] * len(rows)
        B = self.config.max_batch
        for indices in by_width.values():
            for start in range(0, len(indices), B):
                chunk = indices[start:start + B]
                for i, res in zip(chunk, self.run_batch([rows[i] for i in chunk])):
                    results[i] = res
        return results
