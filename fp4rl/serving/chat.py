"""The OpenAI chat completions protocol on top of the completions one (`protocol`).

A chat request is a completions request whose prompt is a conversation: the server renders the
`messages` with the checkpoint's chat template and the generation prompt
(`fp4rl.rl.hf_tokenizer.HFCodec.render_messages`, as RL renders its prompts), then generates
exactly as `/v1/completions` does for that text. So `parse_chat` validates what only chat has
(`messages`, `max_completion_tokens`, boolean `logprobs`) and hands the rest to
`protocol.parse_request`, which validates the shared fields and their ranges the same way.

Messages: a non-empty list of {role, content[, name]} with role system, user or assistant and
content a string or a list of text parts ({"type": "text", "text": ...}, joined). Refused, with a
400 naming the field: tool calls and other roles, image or audio parts, `logprobs: true` and
`top_logprobs` (the chat format's per-token log-probs are not built), `stream: true` (the chat
chunk format is not built; `/v1/completions` streams), and every field the chat API has that the
completions route does not implement (`tools`, `response_format`, ...: unknown parameters).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

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


def _unsupported(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


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
    if "logprobs" in given:
        if not isinstance(given["logprobs"], bool):
            raise _invalid("logprobs", f"logprobs must be true or false, got {given['logprobs']!r}", "invalid_type")
        if given["logprobs"]:
            raise _unsupported("logprobs", "logprobs=true is not supported on /v1/chat/completions; /v1/completions "
                               "returns the sampled tokens' log-probs (logprobs: 0)")
    if "top_logprobs" in given:
        raise _unsupported("top_logprobs", "top_logprobs is not supported by this server")
    if given.get("stream") is True:
        raise _unsupported("stream", "stream=true is not supported on /v1/chat/completions; /v1/completions streams")
    return messages, completion


def chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chat_completion_body(model: str, fingerprint: str, prompt_tokens: int, choices: Sequence[Choice]) -> dict:
    """OpenAI's chat.completion object: choice i's message is the assistant's text (the completion
    route's text of the same generation), its finish_reason "stop" (a stop token or string) or
    "length"."""
    return {
        "id": chat_completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": index, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                     "finish_reason": c.finish_reason} for index, c in enumerate(choices)],
        "usage": usage_body(prompt_tokens, choices),
    }
