"""The serving engine: one deployment, fixed batch shapes compiled ahead, batches of row requests.

A row is one sequence to generate (a prompt and one of its n choices). Every batch has
`max_batch` rows and a prompt width from `prompt_buckets` (the smallest that holds the batch's
longest prompt), unused rows being one-token dummies that stop after one step; generation runs
for at most `max_new_tokens` steps, each row to its own budget. Per prompt bucket the server
compiles three programs before the first request (`compile`) and never compiles on a request (a
shape outside them is an error, not a new program): the prefill (the prompts' forward, token 0),
the decode of `decode_chunk` more tokens, called until every row has stopped, the host reading the
new tokens between calls (`run_batch`'s `on_chunk`: a streamed answer gets its tokens as they are
decoded), and the prompt scorer, run for a batch with a row that asks for its prompt's log-probs
(`RowRequest.echo`). The chunked programs give the bytes of the one-program loop
(`decode.generate_rows`, tests/serving/test_engine.py).

Batch invariance: within one bucket, a row's tokens do not depend on the other rows or on its
position (per-token activation scales, dropless routing, per-row keys; `decode`). A prompt's
bucket depends on the batch's longest prompt, so the batcher only batches prompts of one bucket
together (`bucket_of`): a request's result is then a function of the request alone.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
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
    may ask for. The cache holds P + T - 1 slots, at most the model's max_seq_len. decode_chunk:
    tokens decoded per program call; a streamed answer's tokens leave in groups of this many. Inside
    a call the decode loop tests after every token whether every row has stopped (a `while_loop`,
    as the one-program decode does)."""

    max_batch: int = 8
    prompt_buckets: tuple[int, ...] = (32, 64)
    max_new_tokens: int = 48
    decode_chunk: int = 8

    def __post_init__(self):
        if self.max_batch < 1 or self.max_new_tokens < 1 or self.decode_chunk < 1:
            raise ValueError(f"need {self.max_batch=} >= 1, {self.max_new_tokens=} >= 1 and {self.decode_chunk=} >= 1")
        if not self.prompt_buckets or list(self.prompt_buckets) != sorted(set(self.prompt_buckets)) \
                or self.prompt_buckets[0] < 1:
            raise ValueError(f"prompt_buckets={self.prompt_buckets} must be positive, ascending and unique")

    @property
    def max_prompt_tokens(self) -> int:
        return self.prompt_buckets[-1]


@dataclasses.dataclass(frozen=True)
class RowRequest:
    """prompt_ids: the full prompt (BOS included where the model uses one). seed, choice: the row's
    sampling key is fold_in(key(seed), choice) (`decode`); temperature 0 is greedy. echo: also
    score the prompt (`RowResult.prompt`); max_tokens may then be 0 (score only)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    choice: int = 0
    echo: bool = False


@dataclasses.dataclass(frozen=True)
class PromptScores:
    """An echoed prompt: its token ids, and for tokens 1.. (the first has no context to be scored
    in) their log-probs and the TOP_K likeliest ids there with theirs, under softmax(logits /
    temperature) of the served forward (`decode.score_prompts`)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]


@dataclasses.dataclass(frozen=True)
class RowResult:
    """token_ids: the completion without its stop token; logprobs: theirs; completion_tokens: tokens
    generated, the stop token included; finish_reason: "stop" (it ended on one of the model's
    stop ids), "length" (budget), or None in a partial result (`Engine.run_batch`'s on_chunk: the
    row is still decoding). top_ids / top_logprobs: per completion token, the TOP_K likeliest ids
    of the distribution it was drawn from and their log-probs, likeliest first. prompt: the
    prompt's scores when the row asked for them (echo)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    completion_tokens: int
    finish_reason: FinishReason | None
    top_ids: tuple[tuple[int, ...], ...] = ()
    top_logprobs: tuple[tuple[float, ...], ...] = ()
    prompt: PromptScores | None = None


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


@dataclasses.dataclass(frozen=True)
class _Programs:
    """One prompt bucket's compiled programs (`decode`)."""

    prefill: object
    chunk: object
    score: object


class _Rows:
    """The host's copy of a batch's outputs, grown column by column as the decode chunks arrive
    (each value converted once, not at every chunk)."""

    def __init__(self, B: int):
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.logprobs: list[list[float]] = [[] for _ in range(B)]
        self.top_ids: list[list[tuple[int, ...]]] = [[] for _ in range(B)]
        self.top_logprobs: list[list[tuple[float, ...]]] = [[] for _ in range(B)]

    def extend(self, out: decode.Generated) -> None:
        for b, n in enumerate(out.lengths[:len(self.tokens)].tolist()):  # the real rows, not the dummies
            start = len(self.tokens[b])
            if n > start:
                self.tokens[b] += out.tokens[b, start:n].tolist()
                self.logprobs[b] += out.logprobs[b, start:n].tolist()
                self.top_ids[b] += map(tuple, out.top_ids[b, start:n].tolist())
                self.top_logprobs[b] += map(tuple, out.top_logprobs[b, start:n].tolist())


class Engine:
    def __init__(self, deployment: Deployment, config: EngineConfig):
        model = deployment.model
        longest = config.max_prompt_tokens + config.max_new_tokens - 1
        if longest > model.config.max_seq_len:
            raise ValueError(f"the largest prompt bucket ({config.max_prompt_tokens}) + max_new_tokens "
                             f"({config.max_new_tokens}) - 1 = {longest} cache slots exceed the model's "
                             f"max_seq_len={model.config.max_seq_len}: lower one of them")
        if model.config.vocab_size < decode.TOP_K:
            raise ValueError(f"the model's vocabulary ({model.config.vocab_size}) is smaller than the "
                             f"{decode.TOP_K} alternatives kept per token")
        self.deployment, self.config = deployment, config
        self.stats = EngineStats()
        self._compiled: dict[int, _Programs] = {}
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
            lengths[b], budget[b] = n, max(row.max_tokens, 1)  # a score-only row decodes as a dummy
            temperature[b], top_p[b], seed[b], choice[b] = row.temperature, row.top_p, row.seed, row.choice
        return decode.RowParams(prompt, lengths, budget, temperature, top_p, seed, choice)

    def _ids(self):
        return np.asarray(self.model.stop_ids, np.int32), np.int32(self.model.pad_id)

    def _static(self):
        d = self.deployment
        return self.model.graphdef, d.forward_recipe, d.impl, self.config.max_new_tokens

    def compile(self) -> dict[int, float]:
        """Compile the programs of every prompt bucket ahead; returns seconds per bucket."""
        times = {}
        d = self.deployment
        static = self._static()
        for width in self.config.prompt_buckets:
            if width in self._compiled:
                continue
            t0 = time.perf_counter()
            args = (d.qparams, self._arrays([], width), *self._ids())
            prefill = decode.prefill_rows.lower(*static, *args).compile()
            state = jax.eval_shape(lambda *a: decode.prefill_rows(*static, *a), *args)
            chunk = decode.decode_chunk.lower(*static, self.config.decode_chunk, *args, state).compile()
            score = decode.score_prompts.lower(*static[:3], d.qparams, args[1]).compile()
            self._compiled[width] = _Programs(prefill, chunk, score)
            times[width] = time.perf_counter() - t0
        return times

    def run_batch(self, rows: Sequence[RowRequest],
                  on_chunk: Callable[[list[RowResult]], None] | None = None) -> list[RowResult]:
        """One padded batch of rows of one bucket (at most max_batch), in order. on_chunk, when
        given, is called after the prefill and after each decode chunk with every row's result so
        far (finish_reason None while the row decodes); the last call holds the final results."""
        if not 1 <= len(rows) <= self.config.max_batch:
            raise ValueError(f"a batch holds 1..{self.config.max_batch} rows, not {len(rows)}")
        widths = {self.bucket_of(len(r.prompt_ids)) for r in rows}
        if len(widths) != 1:
            raise ValueError(f"rows of one batch must share a prompt bucket, got widths {sorted(widths)}")
        T = self.config.max_new_tokens
        for r in rows:
            if not (0 if r.echo else 1) <= r.max_tokens <= T:
                raise ValueError(f"max_tokens={r.max_tokens} must be in [1, {T}] (0 only for a row that scores "
                                 "its prompt, echo=True)")
        width = widths.pop()
        if width not in self._compiled:
            raise RuntimeError(f"prompt bucket {width} is not compiled: call Engine.compile() first")
        programs, qparams = self._compiled[width], self.deployment.qparams
        with self._lock:
            t0 = time.perf_counter()
            arrays = self._arrays(rows, width)
            prompts = self._scores(rows, width, programs.score(qparams, arrays)) if any(r.echo for r in rows) \
                else [None] * len(rows)
            host = _Rows(len(rows))
            done_B = np.ones(len(rows), bool)
            if any(r.max_tokens for r in rows):
                state = programs.prefill(qparams, arrays, *self._ids())
                while True:
                    t, done = jax.device_get((state.t, state.done_B))
                    finished = bool(done.all()) or int(t) >= T
                    if on_chunk is not None or finished:
                        host.extend(jax.device_get(state.out))
                        done_B = done[:len(rows)]
                    if on_chunk is not None and not finished:
                        on_chunk(self._results(rows, host, done_B, prompts))
                    if finished:
                        break
                    state = programs.chunk(qparams, arrays, *self._ids(), state)
            results = self._results(rows, host, done_B, prompts)
            seconds = time.perf_counter() - t0
            self.stats.batches += 1
            self.stats.rows += len(rows)
            self.stats.tokens += sum(r.completion_tokens for r in results)
            self.stats.seconds += seconds
        if on_chunk is not None:
            on_chunk(results)
        return results

    @staticmethod
    def _scores(rows, width: int, scored: decode.Scored) -> list[PromptScores | None]:
        scored = jax.device_get(scored)
        out = []
        for b, row in enumerate(rows):
            if not row.echo:
                out.append(None)
                continue
            cols = slice(width - len(row.prompt_ids), width - 1)  # column p scores prompt column p + 1
            out.append(PromptScores(row.prompt_ids, tuple(scored.logprobs[b, cols].tolist()),
                                    tuple(map(tuple, scored.top_ids[b, cols].tolist())),
                                    tuple(map(tuple, scored.top_logprobs[b, cols].tolist()))))
        return out

    def _results(self, rows, host: _Rows, done_B, prompts) -> list[RowResult]:
        results = []
        for b, row in enumerate(rows):
            if row.max_tokens == 0:
                results.append(RowResult((), (), 0, "length", prompt=prompts[b]))
                continue
            tokens = host.tokens[b]
            n = len(tokens)
            stopped = n > 0 and tokens[-1] in self.model.stop_ids
            keep = n - 1 if stopped else n
            finish = ("stop" if stopped else "length") if done_B[b] else None
            results.append(RowResult(tuple(tokens[:keep]), tuple(host.logprobs[b][:keep]), n, finish,
                                     tuple(host.top_ids[b][:keep]), tuple(host.top_logprobs[b][:keep]), prompts[b]))
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
