"""The OpenAI chat completions protocol on top of the completions one (`protocol`).

A chat request is a completions request whose prompt is a conversation: the server renders the
`messages` with the checkpoint's chat template and the generation prompt
(`fp4rl.rl.hf_tokenizer.HFCodec.render_messages`, as RL renders its prompts), then generates
exactly as `/v1/completions` does for that text. So `parse_chat` validates what only chat has
(`messages`, `max_completion_tokens`, boolean `logprobs` with `top_logprobs`) and hands the rest to
`protocol.parse_request`, which validates the shared fields and their ranges the same way.

Messages: a non-empty list of {role, content[, name]} with role system, user or assistant and
content a string or a list of text parts ({"type": "text", "text": ...}, joined). `logprobs: true`
gives each choice `logprobs.content`: per token its text, log-prob (the completions route's, under
the served forward), UTF-8 bytes of its text and the `top_logprobs` (0..5) likeliest alternatives.
`stream: true` answers with `chat.completion.chunk` events (`ChatStream`), sent as the tokens are
decoded, then `data: [DONE]`. Refused, with a 400 naming the field: tool calls and other roles,
image or audio parts, `top_logprobs` without `logprobs: true` or above 5, and every field the chat
API has that the completions route does not implement (`tools`, `response_format`, ...: unknown
parameters).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from fp4rl.serving.decode import TOP_K
from fp4rl.serving.protocol import APIError, Choice, usage_body

ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = ("role", "content", "name")
# The chat fields the completions request shares (validated by protocol.parse_request) ...
SHARED_FIELDS = ("model", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "stream", "stream_options", "user",
                 "logit_bias", "presence_penalty", "frequency_penalty")
# ... and the chat-only ones, handled here.
CHAT_FIELDS = SHARED_FIELDS + ("messages", "max_completion_tokens", "logprobs", "top_logprobs")


def _invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _content(i: int, content) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _invalid(f"messages[{i}].content[{j}]", 'a content part must be {"type": "text", "text": string} '
                               f"(this server takes text only), got {part!r}", "invalid_type")
            texts.append(part["text"])
        return "".join(texts)
    raise _invalid(f"messages[{i}].content", "content must be a string or a non-empty list of text parts, got "
                   f"{content!r}", "invalid_type")


def parse_messages(value) -> list[dict]:
    """The conversation as the chat template takes it: [{role, content[, name]}], text content."""
    if not isinstance(value, list) or not value:
        raise _invalid("messages", f"messages must be a non-empty list of {{role, content}} objects, got {value!r}",
                       "invalid_type")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _invalid(f"messages[{i}]", f"a message must be an object {{role, content}}, got {message!r}",
                           "invalid_type")
        unknown = sorted(set(message) - set(MESSAGE_KEYS))
        if unknown:
            raise _invalid(f"messages[{i}]", f"unknown message field(s) {unknown}; a message has {', '.join(MESSAGE_KEYS)}",
                           "unknown_parameter")
        role = message.get("role")
        if role not in ROLES:
            raise _invalid(f"messages[{i}].role", f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if message.get("content") is None:
            raise _invalid(f"messages[{i}].content", "content is required", "missing_required_parameter")
        parsed = {"role": role, "content": _content(i, message["content"])}
        if message.get("name") is not None:
            if not isinstance(message["name"], str):
                raise _invalid(f"messages[{i}].name", f"name must be a string, got {message['name']!r}", "invalid_type")
            parsed["name"] = message["name"]
        messages.append(parsed)
    return messages


def parse_chat(body: Any) -> tuple[list[dict], dict]:
    """(messages, the completions body without its prompt) of a decoded chat request body; APIError
    (400) names the first bad field. The caller adds the rendered prompt and calls parse_request."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    for name in body:
        if name not in CHAT_FIELDS:
            raise _invalid(name, f"unknown parameter {name!r}", "unknown_parameter")
    if body.get("messages") is None:
        raise _invalid("messages", "messages is required", "missing_required_parameter")
    messages = parse_messages(body["messages"])
    given = {k: v for k, v in body.items() if v is not None}  # null: the field's default
    completion = {k: v for k, v in given.items() if k in SHARED_FIELDS}
    if "max_completion_tokens" in given:
        if "max_tokens" in given and given["max_tokens"] != given["max_completion_tokens"]:
            raise _invalid("max_completion_tokens", f"max_completion_tokens={given['max_completion_tokens']!r} and "
                           f"max_tokens={given['max_tokens']!r} disagree; send one of them")
        completion["max_tokens"] = given["max_completion_tokens"]
    logprobs = given.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise _invalid("logprobs", f"logprobs must be true or false, got {logprobs!r}", "invalid_type")
    if "top_logprobs" in given:
        top = given["top_logprobs"]
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= TOP_K:
            raise _invalid("top_logprobs", f"top_logprobs must be an integer in [0, {TOP_K}] (this server computes at "
                           f"most {TOP_K} alternatives per token), got {top!r}",
                           "invalid_value" if isinstance(top, int) and not isinstance(top, bool) else "invalid_type")
        if not logprobs:
            raise _invalid("top_logprobs", "top_logprobs needs logprobs=true")
    if logprobs:  # the completions route's log-probs with this many alternatives
        completion["logprobs"] = given.get("top_logprobs", 0)
    return messages, completion


def chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def _token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def _content_logprobs(choice: Choice, k: int, start: int = 0, stop: int | None = None) -> list[dict]:
    """`logprobs.content` of tokens start..stop-1: each token (its text as decoded alone, whose
    UTF-8 bytes are `bytes`) with its k likeliest alternatives."""
    stop = len(choice.token_ids) if stop is None else stop
    return [{**_token(choice.pieces[i], choice.logprobs[i]),
             "top_logprobs": [_token(text, value) for text, value in choice.top[i][:k]] if k else []}
            for i in range(start, stop)]


def chat_completion_body(model: str, fingerprint: str, prompt_tokens: int, choices: Sequence[Choice],
                         logprobs: int | None) -> dict:
    """OpenAI's chat.completion object: choice i's message is the assistant's text (the completion
    route's text of the same generation), its finish_reason "stop" (a stop token or string) or
    "length"; logprobs: None, or the alternatives per token (0..5)."""
    return {
        "id": chat_completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": index, "message": {"role": "assistant", "content": c.text},
                     "logprobs": None if logprobs is None else {"content": _content_logprobs(c, logprobs),
                                                                "refusal": None},
                     "finish_reason": c.finish_reason} for index, c in enumerate(choices)],
        "usage": usage_body(prompt_tokens, choices),
    }


class ChatStream:
    """The `chat.completion.chunk` events of a streamed chat completion, as the reference sends
    them: per choice one with `delta: {role: assistant, content: ""}`, one per token with its text
    as `delta.content` (and its `logprobs.content` entry when asked for), one with `delta: {}` and
    the finish_reason; last (include_usage) one with the usage and no choices, every other chunk
    then carrying `usage: null`. A choice's deltas concatenate to its non-streamed message."""

    def __init__(self, model: str, fingerprint: str, logprobs: int | None, include_usage: bool):
        self.id, self.created = chat_completion_id(), int(time.time())
        self.model, self.fingerprint, self.logprobs, self.include_usage = model, fingerprint, logprobs, include_usage

    def _chunk(self, choices: list, usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "system_fingerprint": self.fingerprint, "choices": choices}
        if self.include_usage:
            chunk["usage"] = usage
        return chunk

    def head(self, index: int, choice: Choice) -> list[dict]:
        return [self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])]

    def tokens(self, index: int, choice: Choice, start: int, stop: int) -> list[dict]:
        offsets = choice.text_offset
        def logprobs(k: int) -> dict | None:
            if self.logprobs is None:
                return None
            return {"content": _content_logprobs(choice, self.logprobs, k, k + 1), "refusal": None}

        return [self._chunk([{"index": index,
                              "delta": {"content": choice.text[offsets[k]:offsets[k] + len(choice.pieces[k])]},
                              "logprobs": logprobs(k), "finish_reason": None}]) for k in range(start, stop)]

    def finish(self, index: int, choice: Choice) -> list[dict]:
        return [self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.finish_reason}])]

    def usage_chunk(self, prompt_tokens: int, choices: Sequence[Choice]) -> dict | None:
        return self._chunk([], usage_body(prompt_tokens, choices)) if self.include_usage else None
