"""The OpenAI completions protocol: request validation, error bodies, response bodies, stream chunks.

Requests are validated strictly (JSON types as the OpenAI reference states them: a string is not
a number, a float is not an integer, a bool is neither; NaN and infinities are refused; unknown
fields are refused), and every refusal is an OpenAI-style body
`{"error": {"message", "type", "param", "code"}}` with a 4xx status whose message names the
field and its valid range. `null` is the field's default, as in the reference.

Supported: `model`, `prompt` (a string, a list of strings, a list of token ids, or a list of
such lists), `max_tokens` (default 16, as in the reference, or the server's limit if lower; 0 with
`echo` scores the prompt without generating), `temperature` (0..2, 0 is greedy; default 1),
`top_p` (0 < p <= 1), `n` (choices per prompt, at most the server's batch), `seed` (0..2^32-1;
absent: the server draws one), `logprobs` (0..5: the tokens' log-probs under the served, quantized
forward, i.e. log softmax(logits / temperature) at the token, temperature 1 when greedy, before the
top-p truncation (`decode`); with k > 0 also `top_logprobs`, per token the k likeliest tokens of
that distribution, plus the token itself when it is not among them, as the reference does), `echo`
(the prompt precedes the completion in the text and in the log-probs, its first token with null
log-probs, the others scored by the served forward over the prompt, the trainer's computation:
`decode.score_prompts`), `stop` (a string or up to 4 non-empty strings), `stream` with
`stream_options.include_usage`, `user` (an opaque end-user id: it changes nothing). Refused when
set to anything but their neutral value: `best_of` (other than n), `suffix`, `logit_bias`,
`presence_penalty`, `frequency_penalty` (the server does not implement them, so it says so
instead of answering as if it did).

Each choice carries `token_ids` beyond the reference (the only output of a model without a text
tokenizer; with echo, the prompt's ids first). A choice's text is the concatenation of its tokens'
texts (`Choice.pieces`: each token decoded alone), which makes `text_offset` (where each token
starts in the choice's text) and the streamed text deltas exact. `top_logprobs` maps token texts
to log-probs, so two alternatives with the same text (two ids decoding to one string) show as one
entry, the likelier. `stop`: the text is cut before the earliest occurrence of any stop string in
the completion; the choice keeps the tokens that start before the cut, and its usage counts the
tokens up to the end of that occurrence (what a server stopping there would have generated).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from fp4rl.serving.decode import TOP_K
from fp4rl.serving.engine import RowResult

MAX_SEED = 2**32 - 1
MAX_STOP = 4  # the reference's limit on stop strings
DEFAULT_MAX_TOKENS = 16  # the reference's


class APIError(Exception):
    """A refused request: HTTP status, OpenAI error type, the offending parameter, a code."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server accepts beyond the reference's ranges: its batch shapes."""

    max_tokens: int
    max_n: int


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A validated request. prompt: one entry per prompt, each a str or a list of token ids."""

    model: str
    prompt: list
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    user: str | None = None


FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "seed", "logprobs", "stop", "stream",
          "stream_options", "user", "echo", "best_of", "suffix", "logit_bias", "presence_penalty",
          "frequency_penalty")


def _invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _integer(name: str, value, lo: int, hi: int | None) -> int:
    in_range = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    if not _is_int(value):
        raise _invalid(name, f"{name} must be an integer {in_range}, got {value!r}", "invalid_type")
    if value < lo or (hi is not None and value > hi):
        raise _invalid(name, f"{name} must be an integer {in_range}, got {value}")
    return value


def _number(name: str, value, lo: float, hi: float, lo_open: bool = False) -> float:
    in_range = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if not (_is_int(value) or isinstance(value, float)):
        raise _invalid(name, f"{name} must be a number in {in_range}, got {value!r}", "invalid_type")
    if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
        raise _invalid(name, f"{name} must be a number in {in_range}, got {value}")
    return float(value)


def _boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise _invalid(name, f"{name} must be true or false, got {value!r}", "invalid_type")
    return value


def _string(name: str, value) -> str:
    if not isinstance(value, str):
        raise _invalid(name, f"{name} must be a string, got {value!r}", "invalid_type")
    return value


def _prompt(value) -> list:
    """A list of prompts, each a str or a non-empty list of int token ids."""
    def ids(x):
        return isinstance(x, list) and bool(x) and all(_is_int(t) for t in x)

    if isinstance(value, str) or ids(value):
        return [value]
    if isinstance(value, list) and value and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
        return value
    raise _invalid("prompt", "prompt must be a string, a list of strings, a non-empty list of token ids (integers) "
                   "or a list of such lists", "invalid_type")


def _stop(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value) or len(value) > MAX_STOP:
        raise _invalid("stop", f"stop must be a string or a list of at most {MAX_STOP} strings, got {value!r}")
    if not all(value):
        raise _invalid("stop", "stop strings must be non-empty")
    return tuple(value)


def _unsupported(name: str, message: str) -> APIError:
    return APIError(400, message, param=name, code="unsupported_parameter")


def parse_request(body: Any, limits: Limits) -> CompletionRequest:
    """Validate a decoded JSON body; APIError (400) names the first bad parameter and its range."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    for name in body:
        if name not in FIELDS:
            raise _invalid(name, f"unknown parameter {name!r}", "unknown_parameter")
    for name in ("model", "prompt"):
        if body.get(name) is None:
            raise _invalid(name, f"{name} is required", "missing_required_parameter")
    given = {k: v for k, v in body.items() if v is not None}  # null: the field's default
    out: dict[str, Any] = {"model": _string("model", given["model"]), "prompt": _prompt(given["prompt"])}
    if "echo" in given:
        out["echo"] = _boolean("echo", given["echo"])
    if "max_tokens" in given:
        if given["max_tokens"] == 0 and _is_int(given["max_tokens"]) and not out.get("echo", False):
            raise _invalid("max_tokens", "max_tokens=0 generates nothing: it is only allowed with echo=true (to score "
                           f"the prompt); otherwise max_tokens must be an integer in [1, {limits.max_tokens}]")
        out["max_tokens"] = _integer("max_tokens", given["max_tokens"], 0 if out.get("echo") else 1, limits.max_tokens)
    else:
        out["max_tokens"] = min(DEFAULT_MAX_TOKENS, limits.max_tokens)
    if "temperature" in given:
        out["temperature"] = _number("temperature", given["temperature"], 0.0, 2.0)
    if "top_p" in given:
        out["top_p"] = _number("top_p", given["top_p"], 0.0, 1.0, lo_open=True)
    if "n" in given:
        out["n"] = _integer("n", given["n"], 1, limits.max_n)
    if "seed" in given:
        out["seed"] = _integer("seed", given["seed"], 0, MAX_SEED)
    if "logprobs" in given:
        out["logprobs"] = _integer("logprobs", given["logprobs"], 0, TOP_K)
    if "stop" in given:
        out["stop"] = _stop(given["stop"])
    if "stream" in given:
        out["stream"] = _boolean("stream", given["stream"])
    if "stream_options" in given:
        options = given["stream_options"]
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _invalid("stream_options", "stream_options must be an object whose only field is include_usage, "
                           f"got {options!r}", "invalid_type")
        if not out.get("stream", False):
            raise _invalid("stream_options", "stream_options is only allowed when stream is true")
        if options.get("include_usage") is not None:
            out["include_usage"] = _boolean("stream_options.include_usage", options["include_usage"])
    if "user" in given:
        out["user"] = _string("user", given["user"])
    request = CompletionRequest(**out)
    _refuse_unsupported(given, request)
    return request


def _refuse_unsupported(given: dict, request: CompletionRequest) -> None:
    if "suffix" in given:
        raise _unsupported("suffix", "suffix is not supported by this server")
    if "best_of" in given and _integer("best_of", given["best_of"], 1, None) != request.n:
        raise _unsupported("best_of", f"best_of={given['best_of']} is not supported (only best_of == n, i.e. the n "
                           "samples returned)")
    if "logit_bias" in given:
        if not isinstance(given["logit_bias"], dict):
            raise _invalid("logit_bias", f"logit_bias must be an object, got {given['logit_bias']!r}", "invalid_type")
        if given["logit_bias"]:
            raise _unsupported("logit_bias", "logit_bias is not supported by this server")
    for name in ("presence_penalty", "frequency_penalty"):
        if name in given and _number(name, given[name], -2.0, 2.0) != 0.0:
            raise _unsupported(name, f"{name}={given[name]} is not supported by this server (only 0)")


Top = tuple[tuple[str, float], ...]  # a position's TOP_K likeliest tokens: (text, log-prob), likeliest first


@dataclasses.dataclass(frozen=True)
class Echo:
    """An echoed prompt: its tokens' ids and texts; for tokens 1.. their log-probs and tops."""

    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]
    logprobs: tuple[float, ...]
    top: tuple[Top, ...]


@dataclasses.dataclass(frozen=True)
class Choice:
    """One choice's content, final or (while streaming) so far. pieces: each token's text (their
    concatenation starts with `text`, the last piece may run past a stop cut); completion_tokens:
    for `usage`; finish_reason None while the row decodes. top: per token, when asked for (else
    empty); echo: the prompt, when asked for."""

    text: str
    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]
    logprobs: tuple[float, ...]
    completion_tokens: int
    finish_reason: str | None
    top: tuple[Top, ...] = ()
    echo: Echo | None = None

    @property
    def text_offset(self) -> list[int]:
        return _starts(self.pieces)


def _starts(pieces: Sequence[str]) -> list[int]:
    """Where each token's text starts in the choice's text."""
    starts, at = [], 0
    for piece in pieces:
        starts.append(at)
        at += len(piece)
    return starts


def _tops(piece: Callable[[int], str], ids, logprobs) -> tuple[Top, ...]:
    return tuple(tuple(zip(map(piece, i), lp)) for i, lp in zip(ids, logprobs))


def make_choice(result: RowResult, piece: Callable[[int], str], stop: Sequence[str], top: bool = False) -> Choice:
    """The choice of an engine row, its tokens' texts given by `piece` (a token id's text), cut at
    the first stop string; `top`: with the top alternatives' texts; the prompt when it was scored."""
    pieces = tuple(map(piece, result.token_ids))
    tops = _tops(piece, result.top_ids, result.top_logprobs) if top else ()
    echo = None
    if result.prompt is not None:
        p = result.prompt
        echo = Echo(p.token_ids, tuple(map(piece, p.token_ids)), p.logprobs,
                    _tops(piece, p.top_ids, p.top_logprobs) if top else ())
    text = "".join(pieces)
    found = [(at, at + len(s)) for s in stop if (at := text.find(s)) >= 0]
    if not found:
        return Choice(text, result.token_ids, pieces, result.logprobs, result.completion_tokens, result.finish_reason,
                      tops, echo)
    cut, end = min(found)
    starts = _starts(pieces)
    keep = bisect.bisect_left(starts, cut)  # tokens that start before the cut
    generated = bisect.bisect_left(starts, end)  # tokens up to the end of the stop string
    return Choice(text[:cut], result.token_ids[:keep], pieces[:keep], result.logprobs[:keep], generated, "stop",
                  tops[:keep], echo)


def top_dict(top: Top, k: int, piece: str, logprob: float) -> dict[str, float]:
    """A position's `top_logprobs` entry: its k likeliest tokens, then the token itself when it is
    not among them (the reference's k + 1); a text met twice keeps its likelier log-prob."""
    entry: dict[str, float] = {}
    for text, value in top[:k]:
        entry.setdefault(text, value)
    entry.setdefault(piece, logprob)
    return entry


def _logprobs(choice: Choice, k: int, sl: slice = slice(None)) -> dict:
    """The `logprobs` object of positions `sl` of a choice: the echoed prompt's tokens, then the
    completion's; text_offset in the choice's whole text."""
    echo = choice.echo
    pieces = (echo.pieces if echo else ()) + choice.pieces
    logprobs = ((None,) + echo.logprobs if echo else ()) + choice.logprobs
    top_logprobs = None
    if k > 0:
        tops = ((None,) + echo.top if echo else ()) + choice.top
        top_logprobs = [None if top is None else top_dict(top, k, p, lp)
                        for top, p, lp in zip(tops[sl], pieces[sl], logprobs[sl])]
    start = sl.indices(len(pieces))[0]  # the offsets of the slice only: a stream asks for one position at a time
    return {"tokens": list(pieces[sl]), "token_logprobs": list(logprobs[sl]), "top_logprobs": top_logprobs,
            "text_offset": [sum(map(len, pieces[:start])) + at for at in _starts(pieces[sl])]}


def usage_body(prompt_tokens: int, choices: Sequence[Choice]) -> dict:
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def _envelope(id: str, model: str, fingerprint: str, created: int, choices: list) -> dict:
    return {"id": id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint, "choices": choices}


def _echo_text(choice: Choice) -> str:
    return "".join(choice.echo.pieces) if choice.echo else ""


def completion_body(model: str, fingerprint: str, prompt_tokens: int, choices: Sequence[Choice],
                    logprobs: int | None) -> dict:
    """The response of a request whose choices are `choices` (prompt i's n choices at i*n .. i*n+n-1)."""
    body = _envelope(completion_id(), model, fingerprint, int(time.time()), [{
        "index": index,
        "text": _echo_text(c) + c.text,
        "token_ids": list(c.echo.token_ids if c.echo else ()) + list(c.token_ids),
        "logprobs": _logprobs(c, logprobs) if logprobs is not None else None,
        "finish_reason": c.finish_reason,
    } for index, c in enumerate(choices)])
    body["usage"] = usage_body(prompt_tokens, choices)
    return body


class Stream:
    """The chunks of a streamed completion. Per choice: its echoed prompt in one chunk (echo), one
    chunk per token, then one with its finish_reason (text ""); last (include_usage) one with the
    usage and no choices. Every chunk shares the response's id; a choice's chunks concatenate (text,
    token_ids, logprobs lists) to its non-streamed choice. `streaming.ChoiceStream` calls head,
    tokens and finish as a choice's tokens become final."""

    def __init__(self, model: str, fingerprint: str, logprobs: int | None, include_usage: bool):
        self.id, self.created = completion_id(), int(time.time())
        self.model, self.fingerprint, self.logprobs, self.include_usage = model, fingerprint, logprobs, include_usage

    def _chunk(self, choices: list, usage: dict | None = None) -> dict:
        chunk = _envelope(self.id, self.model, self.fingerprint, self.created, choices)
        if self.include_usage:
            chunk["usage"] = usage
        return chunk

    def _entry(self, index: int, text: str, token_ids: list, logprobs: dict | None, finish_reason=None) -> dict:
        return {"index": index, "text": text, "token_ids": token_ids,
                "logprobs": logprobs if self.logprobs is not None else None, "finish_reason": finish_reason}

    def head(self, index: int, choice: Choice) -> list[dict]:
        if choice.echo is None:
            return []
        n = len(choice.echo.token_ids)
        return [self._chunk([self._entry(index, _echo_text(choice), list(choice.echo.token_ids),
                                         self._slice(choice, slice(0, n)))])]

    def _slice(self, choice: Choice, sl: slice) -> dict | None:
        return _logprobs(choice, self.logprobs, sl) if self.logprobs is not None else None

    def tokens(self, index: int, choice: Choice, start: int, stop: int) -> list[dict]:
        """Chunks of completion tokens start..stop-1 (their texts as the choice's text has them)."""
        offsets, shift = choice.text_offset, len(choice.echo.token_ids) if choice.echo else 0
        return [self._chunk([self._entry(index, choice.text[offsets[k]:offsets[k] + len(choice.pieces[k])],
                                         [choice.token_ids[k]], self._slice(choice, slice(shift + k, shift + k + 1)))])
                for k in range(start, stop)]

    def finish(self, index: int, choice: Choice) -> list[dict]:
        empty = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if self.logprobs else None, "text_offset": []}
        return [self._chunk([self._entry(index, "", [], empty, choice.finish_reason)])]

    def usage_chunk(self, prompt_tokens: int, choices: Sequence[Choice]) -> dict | None:
        return self._chunk([], usage_body(prompt_tokens, choices)) if self.include_usage else None
