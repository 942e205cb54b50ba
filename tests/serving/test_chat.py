"""POST /v1/chat/completions on a Hugging Face folder with a chat template (fp4rl/model/hf_local.py's
Qwen3-MoE, served bf16): the answer is the completion route's generation for the conversation the
template renders, in OpenAI's chat.completion format (checked with the `openai` client), with the
completion route's log-probs and alternatives, and streamed as chat.completion.chunk events that
reassemble to it; malformed messages and a folder without a template get OpenAI-style 400s naming
the field."""

from __future__ import annotations

import httpx
import openai
import pytest

from fp4rl.rl.hf_tokenizer import HFCodec
from fp4rl.serving.engine import EngineConfig
from fp4rl.serving.server import BackgroundServer, ServeConfig, load_service
from fp4rl.model.hf_local import write_checkpoint

pytestmark = pytest.mark.xdist_group("serving-chat")

MODEL, T = "qwen3-chat", 8
ENGINE = EngineConfig(max_batch=4, prompt_buckets=(48,), max_new_tokens=T)
CONVERSATION = [{"role": "system", "content": "Put the answer in a box."}, {"role": "user", "content": "What is 2 + 2?"}]


def _serve(checkpoint, name):
    service = load_service(ServeConfig(checkpoint=str(checkpoint), quantization="bf16", impl="reference",
                                       engine=ENGINE, max_wait_ms=5.0, model_name=name))
    return service, BackgroundServer(service).start()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("chat") / "qwen3")


@pytest.fixture(scope="module")
def server(checkpoint):
    service, background = _serve(checkpoint, MODEL)
    yield background
    background.stop()
    service.close()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60.0) as client:
        yield client


def test_a_chat_completion_is_the_completion_of_the_rendered_conversation(checkpoint, client, oai):
    rendered = HFCodec.from_dir(checkpoint).render_messages(CONVERSATION)
    assert rendered == ("<|im_start|>system\nPut the answer in a box.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?"
                        "<|im_end|>\n<|im_start|>assistant\n")
    sampling = {"max_tokens": T, "n": 4, "seed": 11, "temperature": 1.0}
    chat = oai.chat.completions.create(model=MODEL, messages=CONVERSATION, **sampling)
    completion = client.post("/v1/completions", json={"model": MODEL, "prompt": rendered, **sampling}).json()
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.model == MODEL
    assert [c.index for c in chat.choices] == [0, 1, 2, 3]
    for got, want in zip(chat.choices, completion["choices"], strict=True):
        assert got.message.role == "assistant" and got.message.content == want["text"]
        # "stop": the row ended on one of the folder's stop ids (left out of the text), before its budget.
        assert got.finish_reason == want["finish_reason"] == ("stop" if len(want["token_ids"]) < T else "length")
    assert {c.finish_reason for c in chat.choices} == {"stop", "length"}  # this seed draws both
    assert chat.usage.model_dump(exclude_none=True) == completion["usage"]
    assert chat.usage.prompt_tokens == len(HFCodec.from_dir(checkpoint).tokenizer.encode(
        rendered, add_special_tokens=False).ids)
    # Content as text parts, and max_completion_tokens for max_tokens: the same request.
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in CONVERSATION]
    again = oai.chat.completions.create(model=MODEL, messages=parts, max_completion_tokens=T, n=4, seed=11)
    assert [c.message.content for c in again.choices] == [c.message.content for c in chat.choices]


def _reassembled(chunks) -> list[dict]:
    """The streamed chat choices, per index: role, content, log-prob entries, finish_reason."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk.choices:
            d = out.setdefault(c.index, {"role": None, "content": "", "logprobs": [], "finish_reason": None})
            if c.delta.role is not None:
                assert d["role"] is None and not d["content"], "the role comes first, once"
                d["role"] = c.delta.role
            d["content"] += c.delta.content or ""
            d["logprobs"] += c.logprobs.content if c.logprobs is not None else []
            if c.finish_reason is not None:
                assert d["finish_reason"] is None
                d["finish_reason"] = c.finish_reason
    return [out[i] for i in sorted(out)]


def test_chat_log_probs_and_stream_are_the_completion_routes(checkpoint, client, oai):
    rendered = HFCodec.from_dir(checkpoint).render_messages(CONVERSATION)
    sampling = {"max_tokens": T, "n": 2, "seed": 7, "temperature": 1.0}
    chat = oai.chat.completions.create(model=MODEL, messages=CONVERSATION, logprobs=True, top_logprobs=2, **sampling)
    completion = client.post("/v1/completions", json={"model": MODEL, "prompt": rendered, "logprobs": 2,
                                                      **sampling}).json()
    for got, want in zip(chat.choices, completion["choices"], strict=True):
        content, lp = got.logprobs.content, want["logprobs"]
        assert "".join(t.token for t in content) == got.message.content == want["text"]
        assert [t.token for t in content] == lp["tokens"] and [t.logprob for t in content] == lp["token_logprobs"]
        for entry, top in zip(content, lp["top_logprobs"], strict=True):
            assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 2
            values = [a.logprob for a in entry.top_logprobs]
            assert values == sorted(values, reverse=True) and values[0] == max(top.values())
            assert all(top[a.token] >= a.logprob for a in entry.top_logprobs)  # a text met twice keeps its likelier
    chunks = list(oai.chat.completions.create(model=MODEL, messages=CONVERSATION, logprobs=True, top_logprobs=2,
                                              stream=True, stream_options={"include_usage": True}, **sampling))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage == chat.usage and all(c.usage is None for c in chunks[:-1])
    assert _reassembled(chunks) == [{"role": "assistant", "content": c.message.content, "logprobs": c.logprobs.content,
                                     "finish_reason": c.finish_reason} for c in chat.choices]
    plain = list(oai.chat.completions.create(model=MODEL, messages=CONVERSATION, stream=True, **sampling))
    assert [d["content"] for d in _reassembled(plain)] == [c.message.content for c in chat.choices]
    assert all(c.logprobs is None for chunk in plain for c in chunk.choices)


USER = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "What is 2 + 2?"}, "messages"),
    ({"messages": ["What is 2 + 2?"]}, "messages[0]"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages[0]"),
    ({"messages": USER, "prompt": "hi"}, "prompt"),
    ({"messages": USER, "logprobs": "yes"}, "logprobs"),
    ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
    ({"messages": USER, "logprobs": True, "top_logprobs": 6}, "top_logprobs"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "temperature": 3}, "temperature"),
    ({"messages": USER, "max_tokens": T + 1}, "max_tokens"),
    ({"messages": USER, "max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "What is 2 + 2? " * 20}]}, "messages"),  # past the 48-token bucket
])
def test_malformed_chat_requests_get_openai_errors_naming_the_field(client, body, param):
    response = client.post("/v1/chat/completions", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]


def test_the_openai_client_sees_a_malformed_message(oai):
    with pytest.raises(openai.BadRequestError, match=r"role must be one of system, user, assistant, got 'robot'"):
        oai.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "hi"}])


def test_a_folder_without_a_chat_template_refuses_chat_and_serves_completions(tmp_path):
    service, background = _serve(write_checkpoint(tmp_path / "plain", template=False), "plain")
    try:
        with httpx.Client(base_url=background.url, timeout=60.0) as client:
            response = client.post("/v1/chat/completions", json={"model": "plain", "messages": USER})
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["code"] == "chat_not_supported" and error["param"] == "messages"
            assert "has no chat template, so it serves /v1/completions only" in error["message"]
            assert client.get("/v1/models").json()["data"][0]["chat"] is False
            completion = client.post("/v1/completions", json={"model": "plain", "prompt": "What is 2 + 2?", "max_tokens": 2})
            assert completion.status_code == 200
    finally:
        background.stop()
        service.close()
