"""The HTTP server with real clients: the official `openai` client (completions, streamed and not,
logprobs, stop strings, n choices, errors), raw HTTP (errors, the event-stream wire format), and a
loopback load test from many client threads. Log-prob alternatives and prompt scoring:
test_scoring.py; tokens streamed as they are decoded: test_streaming.py.

The server (`smoke_server`, tests/serving/conftest.py) runs in this process (a thread, a free
loopback port); the deployment is the smoke warm-up served as nvfp4_online.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import random
import socket
import threading

import httpx
import openai
import pytest

from fp4rl import configs
from fp4rl.serving.engine import RowRequest
from tests.serving.smoke_server import (LONG_TASK, MAX_BATCH, MODEL, T, choices_of, complete, openai_client, prompt_ids,
                                        smoke_prompt, stream_choices)

# One xdist worker for the modules that drive the smoke server (tests/serving/conftest.py): it is built once.
pytestmark = pytest.mark.xdist_group("serving-server")


def test_health_and_models(client, oai):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["quantization"] == "nvfp4_online" and health["recipe"] == "full"
    assert health["trained_recipe"] == "bf16" and health["prompt_buckets"] == [32, 48]
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_tokens"] == T and models["data"][0]["max_prompt_tokens"] == 48
    assert [m.id for m in oai.models.list()] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-4")


def test_completion_is_the_engines_result(client, server):
    _, service = server
    prompt = smoke_prompt(0)
    response = complete(client, prompt=prompt, max_tokens=T, temperature=0, logprobs=0)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["system_fingerprint"].startswith("fp4rl-nvfp4_online-full-")
    (choice,) = body["choices"]
    ids = prompt_ids(prompt)
    (expected,) = service.engine.run_batch([RowRequest(ids, T)])
    text = service.engine.model.decode(expected.token_ids)
    assert tuple(choice["token_ids"]) == expected.token_ids
    assert choice["text"] == text
    assert choice["logprobs"] == {"tokens": list(text), "token_logprobs": list(expected.logprobs), "top_logprobs": None,
                                  "text_offset": list(range(len(text)))}  # one character per token
    assert choice["finish_reason"] == expected.finish_reason
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": expected.completion_tokens,
                             "total_tokens": len(ids) + expected.completion_tokens}
    # The same prompt as token ids (BOS included by the client) gives the same completion.
    by_ids = complete(client, prompt=list(ids), max_tokens=T, temperature=0).json()
    assert by_ids["choices"][0]["token_ids"] == choice["token_ids"] and by_ids["choices"][0]["logprobs"] is None


def test_openai_client_streamed_equals_non_streamed(oai):
    """Under one seed, the streamed events reassemble to the non-streamed completion: text, token
    ids, log-probs (one per token, finite, <= 0), finish reason and usage."""
    request = dict(model=MODEL, prompt=smoke_prompt(3), max_tokens=T, temperature=1.0, top_p=0.9, seed=11, logprobs=0)
    completion = oai.completions.create(**request)
    (whole,) = choices_of(completion)
    lp = whole["logprobs"]
    assert whole["text"] and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(whole["token_ids"])
    assert "".join(lp["tokens"]) == whole["text"] and lp["text_offset"] == list(range(len(whole["text"])))
    assert all(math.isfinite(x) and x <= 0.0 for x in lp["token_logprobs"])
    assert completion.usage.completion_tokens == len(whole["token_ids"]) + (whole["finish_reason"] == "stop")
    chunks, (streamed,) = stream_choices(oai, **request, stream_options={"include_usage": True})
    assert streamed == whole
    assert len(chunks) == len(whole["token_ids"]) + 2  # one event per token, the finish, the usage
    assert chunks[-1].choices == [] and chunks[-1].usage == completion.usage
    assert all(c.usage is None for c in chunks[:-1])
    # Without stream_options there is no usage event; without logprobs none are sent.
    chunks, (plain,) = stream_choices(oai, **{k: v for k, v in request.items() if k != "logprobs"})
    assert plain == {**whole, "logprobs": None} and all(c.choices for c in chunks)


def test_event_stream_wire_format(client):
    """The bytes on the wire: `data: {json}` events separated by blank lines, ending `data: [DONE]`."""
    with client.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": smoke_prompt(4), "max_tokens": 3,
                                                        "temperature": 0, "stream": True}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2]) and len(chunks) >= 2
    assert {c["object"] for c in chunks} == {"text_completion"} and chunks[-1]["choices"][0]["finish_reason"]
    assert complete(client, prompt="a=1. b=a+1. What is b?\n", max_tokens=2).status_code == 200  # connection reused


def test_stop_strings(oai):
    """The text is cut before the earliest occurrence of any stop string; tokens and log-probs are
    those of the text kept; streamed the same."""
    request = dict(model=MODEL, prompt=smoke_prompt(5), max_tokens=T, temperature=0, logprobs=0)
    (full,) = choices_of(oai.completions.create(**request))
    text = full["text"]
    assert len(text) >= 4, text
    stops = ["never in the text \u0000", text[2:4], text[-1]]
    cut, end = min((text.find(s), text.find(s) + len(s)) for s in stops if s in text)
    completion = oai.completions.create(**request, stop=stops)
    (stopped,) = choices_of(completion)
    assert stopped["text"] == text[:cut] and stopped["finish_reason"] == "stop"
    assert stopped["token_ids"] == full["token_ids"][:cut]
    assert stopped["logprobs"] == {key: value and value[:cut] for key, value in full["logprobs"].items()}
    assert completion.usage.completion_tokens == end  # the tokens up to the end of the stop string
    assert stream_choices(oai, **request, stop=stops)[1] == [stopped]
    # A single string works too; a stop string that never occurs changes nothing.
    assert choices_of(oai.completions.create(**request, stop=text[2:4]))[0]["text"] == text[:text.find(text[2:4])]
    assert choices_of(oai.completions.create(**request, stop="never \u0000"))[0] == full


def test_n_choices_and_several_prompts(oai, server):
    """n choices per prompt (prompt i's at i*n .. i*n+n-1), each with its own sample key, the
    same under the same seed, streamed or not."""
    _, service = server
    prompts = [smoke_prompt(6), smoke_prompt(7, task=LONG_TASK)]
    request = dict(model=MODEL, prompt=prompts, max_tokens=8, temperature=1.0, n=2, seed=5, logprobs=0)
    choices = choices_of(oai.completions.create(**request))
    assert len(choices) == 4
    for i, prompt in enumerate(prompts):
        for j in range(2):
            (alone,) = service.engine.run_batch([RowRequest(prompt_ids(prompt), 8, 1.0, 1.0, 5, i * 2 + j)])
            assert tuple(choices[2 * i + j]["token_ids"]) == alone.token_ids
            assert choices[2 * i + j]["logprobs"]["token_logprobs"] == list(alone.logprobs)
    assert choices[0] != choices[1] or choices[2] != choices[3]  # distinct keys: the samples differ
    assert choices_of(oai.completions.create(**request)) == choices
    assert stream_choices(oai, **request)[1] == choices
    assert choices_of(oai.completions.create(**{**request, "seed": 6})) != choices


BAD_REQUESTS = [
    # (body, status, error type, param)
    ({"model": "gpt-4", "prompt": "a"}, 404, "not_found_error", "model"),
    ({"prompt": "a"}, 400, "invalid_request_error", "model"),
    ({"model": MODEL}, 400, "invalid_request_error", "prompt"),
    ({"model": MODEL, "prompt": []}, 400, "invalid_request_error", "prompt"),
    ({"model": MODEL, "prompt": [1, "a"]}, 400, "invalid_request_error", "prompt"),
    ({"model": MODEL, "prompt": [1, 500]}, 400, "invalid_request_error", "prompt"),
    ({"model": MODEL, "prompt": "caf\u00e9"}, 400, "invalid_request_error", "prompt"),
    ({"model": MODEL, "prompt": "x" * 48}, 400, "invalid_request_error", "prompt"),
    ({"model": MODEL, "prompt": "a", "temperature": -0.5}, 400, "invalid_request_error", "temperature"),
    ({"model": MODEL, "prompt": "a", "temperature": 2.5}, 400, "invalid_request_error", "temperature"),
    ({"model": MODEL, "prompt": "a", "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ({"model": MODEL, "prompt": "a", "top_p": 0}, 400, "invalid_request_error", "top_p"),
    ({"model": MODEL, "prompt": "a", "n": 0}, 400, "invalid_request_error", "n"),
    ({"model": MODEL, "prompt": "a", "n": MAX_BATCH + 1}, 400, "invalid_request_error", "n"),
    ({"model": MODEL, "prompt": "a", "n": True}, 400, "invalid_request_error", "n"),
    ({"model": MODEL, "prompt": "a", "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"model": MODEL, "prompt": "a", "max_tokens": T + 1}, 400, "invalid_request_error", "max_tokens"),
    ({"model": MODEL, "prompt": "a", "max_tokens": 4.5}, 400, "invalid_request_error", "max_tokens"),
    ({"model": MODEL, "prompt": "a", "seed": -1}, 400, "invalid_request_error", "seed"),
    ({"model": MODEL, "prompt": "a", "stream": "yes"}, 400, "invalid_request_error", "stream"),
    ({"model": MODEL, "prompt": "a", "stream_options": {"include_usage": True}}, 400, "invalid_request_error",
     "stream_options"),
    ({"model": MODEL, "prompt": "a", "stream": True, "stream_options": {"usage": True}}, 400, "invalid_request_error",
     "stream_options"),
    ({"model": MODEL, "prompt": "a", "logprobs": 6}, 400, "invalid_request_error", "logprobs"),
    ({"model": MODEL, "prompt": "a", "logprobs": True}, 400, "invalid_request_error", "logprobs"),
    ({"model": MODEL, "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_request_error", "stop"),
    ({"model": MODEL, "prompt": "a", "stop": [""]}, 400, "invalid_request_error", "stop"),
    ({"model": MODEL, "prompt": "a", "stop": 7}, 400, "invalid_request_error", "stop"),
    ({"model": MODEL, "prompt": "a", "echo": "yes"}, 400, "invalid_request_error", "echo"),
    ({"model": MODEL, "prompt": "a", "echo": True, "max_tokens": -1}, 400, "invalid_request_error", "max_tokens"),
    ({"model": MODEL, "prompt": "a", "best_of": 2}, 400, "invalid_request_error", "best_of"),
    ({"model": MODEL, "prompt": "a", "presence_penalty": 0.5}, 400, "invalid_request_error", "presence_penalty"),
    ({"model": MODEL, "prompt": "a", "temprature": 0}, 400, "invalid_request_error", "temprature"),
    ([{"model": MODEL, "prompt": "a"}], 400, "invalid_request_error", None),
]


@pytest.mark.parametrize("body, status, kind, param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(client, body, status, kind, param):
    response = client.post("/v1/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind and error["param"] == param and error["message"]


@pytest.mark.parametrize("field, value, message", [
    ("n", MAX_BATCH + 1, f"n must be an integer in [1, {MAX_BATCH}], got {MAX_BATCH + 1}"),
    ("max_tokens", T + 1, f"max_tokens must be an integer in [1, {T}], got {T + 1}"),
    ("stop", ["a"] * 5, "stop must be a string or a list of at most 4 strings"),
    ("logprobs", 9, "logprobs must be an integer in [0, 5], got 9"),
    ("max_tokens", 0, "max_tokens=0 generates nothing: it is only allowed with echo=true"),
])
def test_openai_client_sees_the_field_and_its_range(oai, field, value, message):
    for stream in (False, True):  # a streamed request is refused before any event, with the same error
        with pytest.raises(openai.BadRequestError) as info:
            oai.completions.create(model=MODEL, prompt="a", stream=stream, **{field: value})
        assert info.value.param == field and message in info.value.body["message"]


def test_malformed_json_http_and_unknown_routes(client, server):
    for response, status in ((client.post("/v1/completions", content=b'{"model": "smoke-nvfp4", '), 400),
                             (client.post("/v1/completions", content=b"\xff\xfe"), 400),
                             (client.post("/v1/completions", content=b'{"model": "smoke-nvfp4", "prompt": "a", '
                                                                     b'"temperature": NaN}'), 400),
                             (client.post("/v1/chat/completions", json={"model": MODEL, "messages": []}), 400),
                             # the character tokenizer has no chat template: refused, not answered in an invented format
                             (client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
                                 {"role": "user", "content": "a=1. b=a+1. What is b?"}]}), 400),
                             (client.get("/v1/completions"), 405),
                             (client.get("/nowhere"), 404)):
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    with socket.create_connection(("127.0.0.1", int(server[0].url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        head, _, body = s.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and "error" in json.loads(body)
    assert complete(client, prompt="a=1. b=a+1. What is b?\n", max_tokens=4).status_code == 200  # still serving


# The load test's distinct requests: both prompt buckets, budgets 1..T, greedy and seeded sampling,
# n of 1 and 2, logprobs (0 or 3 alternatives) or not, echo or not, stop strings or not; then the bad ones.
def _load_requests() -> list[dict]:
    good = []
    for i in range(40):
        good.append({"prompt": smoke_prompt(100 + i, task=LONG_TASK if i % 4 < 2 else configs.SMOKE_TASK),
                     "max_tokens": (1, 3, 8, T)[i % 4], "n": 2 if i % 5 == 0 else 1,
                     **({"temperature": 0} if i % 3 == 0 else {"temperature": 1.0, "seed": 1000 + i}),
                     **({"logprobs": (0, 3)[i % 4 // 2]} if i % 2 else {}), **({"echo": True} if i % 8 == 5 else {}),
                     **({"stop": ["=", "\n"]} if i % 7 == 3 else {})})
    bad = [{"prompt": "a", "model": "nope"}, {"prompt": "a", "n": 0}, {"prompt": "x" * 48},
           {"prompt": "a", "max_tokens": T + 1}, {"prompt": "a", "stop": list("abcde")}]
    return good + bad


def _answer(oai, request: dict, streamed: bool):
    """What the client got: (choices, usage) or the error's (status, param)."""
    body = {"model": MODEL, **request}
    try:
        if streamed:
            chunks, choices = stream_choices(oai, stream_options={"include_usage": True}, **body)
            return chunks[0].id, choices, chunks[-1].usage.model_dump()
        completion = oai.completions.create(**body)
        return completion.id, choices_of(completion), completion.usage.model_dump()
    except openai.APIStatusError as e:
        return None, e.status_code, e.param


def test_concurrent_load_is_neither_lost_nor_mixed_up(server, oai):
    """320 requests from 32 client threads (streamed or not, mixed budgets, n, logprobs, echo, stop strings,
    a sixth of them bad): every answer equals the same request sent alone, no answer is lost or
    repeated, every bad request gets its error, and the batcher did batch them."""
    background, service = server
    distinct = _load_requests()
    alone = [_answer(oai, r, streamed=False)[1:] for r in distinct]
    assert sum(isinstance(a[0], int) for a in alone) == 5 and all(isinstance(a[0], list) for a in alone[:40])
    rng = random.Random(0)
    plan = [(k, rng.random() < 0.5) for k in rng.choices(range(len(distinct)), k=320)]
    batches_before = len(service.batcher.batch_sizes)
    local, clients = threading.local(), []

    def fire(item):
        if not hasattr(local, "client"):  # one client (and connection pool) per thread, like separate users
            local.client = openai_client(background.url)
            clients.append(local.client)
        k, stream = item
        return _answer(local.client, distinct[k], stream)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(fire, plan, timeout=120))
    for c in clients:
        c.close()
    assert len(answers) == len(plan)
    ids = [a[0] for a in answers if a[0] is not None]
    assert len(ids) == len(set(ids))  # no response served twice
    for (k, stream), answer in zip(plan, answers):
        assert answer[1:] == alone[k], (distinct[k], stream)
    sizes = service.batcher.batch_sizes[batches_before:]
    assert max(sizes) > 1, sizes  # requests were batched together
    assert client_survives(background.url)


def client_survives(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=30.0) as client:
        return client.get("/health").json()["status"] == "ok"
