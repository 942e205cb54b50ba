"""The HTTP server with a real client: the OpenAI completions API, errors, and a loopback load test.

The server runs in this process (uvicorn on a thread, a free loopback port), started once for the
module and stopped at its end; the deployment is the smoke warm-up served as nvfp4_online.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from fp4rl import configs
from fp4rl.rl import data
from fp4rl.rl.task import TaskConfig, make_problem
from fp4rl.serving.engine import EngineConfig, RowRequest
from fp4rl.serving.server import BackgroundServer, ServeConfig, create_app, load_service

MAX_BATCH, T = 8, 24
ENGINE = EngineConfig(max_batch=MAX_BATCH, prompt_buckets=(32, 48), max_new_tokens=T)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(warmup_dir):
    config = ServeConfig(checkpoint=str(warmup_dir), quantization="nvfp4_online", impl="reference", engine=ENGINE,
                         max_wait_ms=20.0, model_name="smoke-nvfp4")
    service = load_service(config)
    background = BackgroundServer(create_app(service), "127.0.0.1", _free_port()).start()
    yield background, service
    background.stop()
    service.close()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server[0].url, timeout=60.0) as client:
        yield client


LONG_TASK = TaskConfig(min_ops=3, max_ops=3, digits=1, max_operands=2)  # prompts of 33-48 tokens: the second bucket


def _prompt(i: int, seed: int = 23, task: TaskConfig = configs.SMOKE_TASK) -> str:
    return make_problem(i, seed, task).prompt + data.PROMPT_SEPARATOR


def _complete(client, **body):
    body.setdefault("model", "smoke-nvfp4")
    return client.post("/v1/completions", json=body)


def test_health_and_models(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["quantization"] == "nvfp4_online" and health["recipe"] == "full"
    assert health["trained_recipe"] == "bf16" and health["prompt_buckets"] == [32, 48]
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["smoke-nvfp4"]
    assert models["data"][0]["max_tokens"] == T and models["data"][0]["max_prompt_tokens"] == 48


def test_completion_is_the_engines_result(client, server):
    _, service = server
    prompt = _prompt(0)
    response = _complete(client, prompt=prompt, max_tokens=T, temperature=0, logprobs=0)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == "smoke-nvfp4"
    assert body["system_fingerprint"].startswith("fp4rl-nvfp4_online-full-")
    (choice,) = body["choices"]
    ids = tuple(data.encode_prompt(prompt[:-1]))
    (expected,) = service.engine.run_batch([RowRequest(ids, T)])
    assert tuple(choice["token_ids"]) == expected.token_ids
    assert choice["text"] == service.engine.model.decode(expected.token_ids)
    assert choice["logprobs"]["token_logprobs"] == list(expected.logprobs)
    assert choice["finish_reason"] == expected.finish_reason
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": expected.completion_tokens,
                             "total_tokens": len(ids) + expected.completion_tokens}
    # The same prompt as token ids (BOS included by the client) gives the same completion.
    by_ids = _complete(client, prompt=list(ids), max_tokens=T, temperature=0).json()
    assert by_ids["choices"][0]["token_ids"] == choice["token_ids"]


def test_several_prompts_n_choices_and_seeds(client):
    prompts = [_prompt(1), _prompt(2)]
    greedy = _complete(client, prompt=prompts, max_tokens=8, temperature=0, n=2).json()
    assert [c["index"] for c in greedy["choices"]] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):  # choices i*n .. i*n+n-1 answer prompt i
        alone = _complete(client, prompt=prompt, max_tokens=8, temperature=0).json()["choices"][0]["token_ids"]
        assert [c["token_ids"] for c in greedy["choices"][2 * i:2 * i + 2]] == [alone, alone]
    sampled = _complete(client, prompt=prompts, max_tokens=8, temperature=1.0, top_p=0.95, n=3, seed=5).json()
    again = _complete(client, prompt=prompts, max_tokens=8, temperature=1.0, top_p=0.95, n=3, seed=5).json()
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in sampled["choices"]]
    reseeded = _complete(client, prompt=prompts, max_tokens=8, temperature=1.0, top_p=0.95, n=3, seed=6).json()
    assert [c["token_ids"] for c in reseeded["choices"]] != [c["token_ids"] for c in sampled["choices"]]
    assert all(len(c["token_ids"]) <= 8 for c in sampled["choices"])


BAD_REQUESTS = [
    # (body, status, error type, param)
    ({"model": "gpt-4", "prompt": "a"}, 404, "not_found_error", "model"),
    ({"prompt": "a"}, 400, "invalid_request_error", "model"),
    ({"model": "smoke-nvfp4"}, 400, "invalid_request_error", "prompt"),
    ({"model": "smoke-nvfp4", "prompt": []}, 400, "invalid_request_error", "prompt"),
    ({"model": "smoke-nvfp4", "prompt": [1, "a"]}, 400, "invalid_request_error", "prompt"),
    ({"model": "smoke-nvfp4", "prompt": [1, 500]}, 400, "invalid_request_error", "prompt"),
    ({"model": "smoke-nvfp4", "prompt": "caf\u00e9"}, 400, "invalid_request_error", "prompt"),
    ({"model": "smoke-nvfp4", "prompt": "x" * 48}, 400, "invalid_request_error", "prompt"),
    ({"model": "smoke-nvfp4", "prompt": "a", "temperature": -0.5}, 400, "invalid_request_error", "temperature"),
    ({"model": "smoke-nvfp4", "prompt": "a", "temperature": 2.5}, 400, "invalid_request_error", "temperature"),
    ({"model": "smoke-nvfp4", "prompt": "a", "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ({"model": "smoke-nvfp4", "prompt": "a", "top_p": 0}, 400, "invalid_request_error", "top_p"),
    ({"model": "smoke-nvfp4", "prompt": "a", "n": 0}, 400, "invalid_request_error", "n"),
    ({"model": "smoke-nvfp4", "prompt": "a", "n": MAX_BATCH + 1}, 400, "invalid_request_error", "n"),
    ({"model": "smoke-nvfp4", "prompt": "a", "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "smoke-nvfp4", "prompt": "a", "max_tokens": T + 1}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "smoke-nvfp4", "prompt": "a", "max_tokens": 4.5}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "smoke-nvfp4", "prompt": "a", "seed": -1}, 400, "invalid_request_error", "seed"),
    ({"model": "smoke-nvfp4", "prompt": "a", "stream": True}, 400, "invalid_request_error", "stream"),
    ({"model": "smoke-nvfp4", "prompt": "a", "logprobs": 3}, 400, "invalid_request_error", "logprobs"),
    ({"model": "smoke-nvfp4", "prompt": "a", "stop": ["\n"]}, 400, "invalid_request_error", "stop"),
    ({"model": "smoke-nvfp4", "prompt": "a", "temprature": 0}, 400, "invalid_request_error", "temprature"),
    ([{"model": "smoke-nvfp4", "prompt": "a"}], 400, "invalid_request_error", None),
]


@pytest.mark.parametrize("body, status, kind, param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(client, body, status, kind, param):
    response = client.post("/v1/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind and error["param"] == param and error["message"]


def test_malformed_json_unknown_routes_and_methods(client):
    for response, status in ((client.post("/v1/completions", content=b'{"model": "smoke-nvfp4", '), 400),
                             (client.post("/v1/completions", content=b"\xff\xfe"), 400),
                             (client.get("/v1/chat/completions"), 404),
                             (client.get("/v1/completions"), 405)):
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert _complete(client, prompt="a=1. b=a+1. What is b?\n", max_tokens=4).status_code == 200  # still serving


def test_concurrent_requests_are_neither_lost_nor_mixed_up(server):
    """64 concurrent requests with distinct prompts (greedy and seeded sampling, two prompt buckets)
    plus 8 bad ones: every good answer equals the same request run alone, every bad one gets its
    error, and the batcher did batch them."""
    background, service = server
    good = [{"model": "smoke-nvfp4", "prompt": _prompt(100 + i, task=LONG_TASK if i % 4 < 2 else configs.SMOKE_TASK),
             "max_tokens": T,
             **({"temperature": 0} if i % 2 else {"temperature": 1.0, "seed": 1000 + i})} for i in range(64)]
    bad = [{"model": "nope", "prompt": "a"} if i % 2 else {"model": "smoke-nvfp4", "prompt": "a", "n": 0} for i in range(8)]
    bodies = good[:32] + bad + good[32:]
    batches_before = len(service.batcher.batch_sizes)

    async def fire():
        async with httpx.AsyncClient(base_url=background.url, timeout=60.0) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

    t0 = time.monotonic()
    responses = asyncio.run(asyncio.wait_for(fire(), timeout=60.0))
    elapsed = time.monotonic() - t0
    assert elapsed < 60.0
    by_body = dict(zip(map(id, bodies), responses))
    for b in bad:
        assert by_body[id(b)].status_code in (400, 404) and "error" in by_body[id(b)].json()
    widths = set()
    for b in good:
        response = by_body[id(b)]
        assert response.status_code == 200, response.text
        ids = tuple(data.encode_prompt(b["prompt"][:-1]))
        widths.add(service.engine.bucket_of(len(ids)))
        row = RowRequest(ids, T, b["temperature"], 1.0, b.get("seed", 0), 0)
        (alone,) = service.engine.run_batch([row])
        (choice,) = response.json()["choices"]
        assert tuple(choice["token_ids"]) == alone.token_ids, b["prompt"]
        assert choice["text"] == service.engine.model.decode(alone.token_ids)
    assert widths == {32, 48}  # both buckets were exercised
    sizes = service.batcher.batch_sizes[batches_before:batches_before + 64]
    assert max(sizes) > 1, sizes  # requests were batched together
    assert client_survives(background.url)


def client_survives(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=30.0) as client:
        return client.get("/health").json()["status"] == "ok"
