"""The OpenAI completions protocol: request schema, error bodies, response bodies.

Requests are validated strictly (JSON types as the OpenAI reference states them: a string is not
a number, a float is not an integer; unknown fields are refused), and every refusal is an
OpenAI-style body `{"error": {"message", "type", "param", "code"}}` with a 4xx status.

Supported: `model`, `prompt` (a string, a list of strings, a list of token ids, or a list of
such lists), `max_tokens` (default 16, as in the OpenAI reference), `temperature` (0..2, 0 is
greedy; default 1), `top_p` (0 < p <= 1), `n`, `seed` (0..2^32-1; absent: the server draws one),
`logprobs` (0 only: the sampled tokens' log-probs; the top alternatives are not computed), `user`
(an opaque end-user id, as in the reference: it changes nothing). Refused when set to anything
but their neutral value: `stream`, `echo`, `best_of`, `suffix`, `stop`, `logit_bias`,
`presence_penalty`, `frequency_penalty` (the server does not implement them, so it says so
instead of answering as if it did).
Each choice carries `token_ids` beyond the reference (the only output of a model without a
text tokenizer).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fp4rl.serving.engine import RowResult

MAX_SEED = 2**32 - 1


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


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str
    prompt: Any
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    logprobs: int | None = None
    user: str | None = None
    stream: bool = False
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        """A list of prompts, each a str or a list of int token ids (never bool)."""
        def ids(x):
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        if isinstance(value, str) or (ids(value) and value):
            return [value]
        if isinstance(value, list) and value and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
            return value
        raise ValueError("prompt must be a string, a list of strings, a non-empty list of token ids (integers) "
                         "or a list of such lists")

    def unsupported(self) -> APIError | None:
        """The first option set to something this server does not implement, as an error."""
        neutral = {"stream": False, "echo": False, "suffix": None, "stop": None, "presence_penalty": 0.0,
                   "frequency_penalty": 0.0}
        for name, value in neutral.items():
            if getattr(self, name) != value:
                return APIError(400, f"{name}={getattr(self, name)!r} is not supported by this server", param=name,
                                code="unsupported_parameter")
        if self.logit_bias:
            return APIError(400, "logit_bias is not supported by this server", param="logit_bias",
                            code="unsupported_parameter")
        if self.best_of is not None and self.best_of != self.n:
            return APIError(400, f"best_of={self.best_of} is not supported (only best_of == n, i.e. n samples returned)",
                            param="best_of", code="unsupported_parameter")
        if self.logprobs not in (None, 0):
            return APIError(400, f"logprobs={self.logprobs}: only 0 (the sampled tokens' log-probs) is supported; "
                            "top alternatives are not computed", param="logprobs", code="unsupported_parameter")
        return None


def parse_request(body: Any) -> CompletionRequest:
    """Validate a decoded JSON body; APIError (400) names the first bad parameter."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    try:
        request = CompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = f"unknown parameter {param!r}"
        elif param is not None:
            message = f"{param}: {message}"
        raise APIError(400, message, param=param, code=first["type"]) from None
    error = request.unsupported()
    if error is not None:
        raise error
    return request


def completion_body(model: str, fingerprint: str, prompt_tokens: int, results: list[list[RowResult]],
                    texts: list[list[str]], logprobs: bool) -> dict:
    """The response of a request whose prompt i has choices results[i] (n each, in order)."""
    choices = []
    for i, (prompt_results, prompt_texts) in enumerate(zip(results, texts)):
        for j, (r, text) in enumerate(zip(prompt_results, prompt_texts)):
            choices.append({
                "index": i * len(prompt_results) + j,
                "text": text,
                "token_ids": list(r.token_ids),
                "logprobs": {"token_logprobs": list(r.logprobs), "top_logprobs": None} if logprobs else None,
                "finish_reason": r.finish_reason,
            })
    completion = sum(r.completion_tokens for rs in results for r in rs)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                  "total_tokens": prompt_tokens + completion},
    }
