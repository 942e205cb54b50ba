"""An OpenAI-compatible HTTP server (FastAPI on uvicorn) for one quantized deployment.

    POST /v1/completions   the completions API (`protocol`), dynamically batched (`batcher`)
    GET  /v1/models        the served model, with its quantization and recipe
    GET  /health           liveness plus the deployment and the batcher's counters

Every error is an OpenAI-style JSON body with a 4xx/5xx status (unknown routes included); a bad
request never stops the server. Start-up loads the checkpoint, quantizes it (`deployment`) and
compiles every batch shape (`engine`) before the port opens, so the first request is as fast as
any other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fp4rl.rl.sft import params_digest
from fp4rl.serving import checkpoints, deployment
from fp4rl.serving.batcher import Batcher, QueueFull
from fp4rl.serving.engine import Engine, RowRequest
from fp4rl.serving.protocol import APIError, error_body, parse_request, completion_body
from fp4rl.serving.serve_config import ServeConfig


@dataclasses.dataclass
class Service:
    """A loaded deployment behind a batcher: what the HTTP app serves."""

    name: str
    engine: Engine
    batcher: Batcher
    fingerprint: str
    compile_seconds: dict[int, float]
    started: float = dataclasses.field(default_factory=time.time)

    def close(self) -> None:
        self.batcher.close()


def default_name(checkpoint: str, quantization: str) -> str:
    return f"{Path(checkpoint).resolve().name}-{quantization}"


def load_service(config: ServeConfig) -> Service:
    """Load, quantize at load time, compile every batch shape, start the batcher."""
    model = checkpoints.load(config.checkpoint, config.seed_index)
    dep = deployment.quantize(model, config.quantization, config.recipe, config.impl)
    engine = Engine(dep, config.engine)
    compile_seconds = engine.compile()
    fingerprint = f"fp4rl-{config.quantization}-{dep.recipe.name}-{params_digest(dep.qparams)[:16]}"
    return Service(config.model_name or default_name(config.checkpoint, config.quantization), engine,
                   Batcher(engine, config.max_wait_ms, config.max_queue), fingerprint, compile_seconds)


def _describe(service: Service) -> dict:
    dep, cfg = service.engine.deployment, service.engine.config
    return {
        "quantization": dep.quantization,
        "recipe": dep.recipe.name,
        "high_precision_layers": (dep.recipe.high_precision_summary(dep.model.config.num_layers)
                                  if deployment.recipe_formats(dep.recipe) else "all (nothing quantized)"),
        "checkpoint": dep.model.path,
        "checkpoint_kind": dep.model.kind,
        "trained_recipe": dep.model.trained_recipe,
        "text_prompts": dep.model.text,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "max_tokens": cfg.max_new_tokens,
        "max_batch": cfg.max_batch,
        "prompt_buckets": list(cfg.prompt_buckets),
        "map4_frac": dep.map4_frac,
    }


def _prompt_ids(service: Service, prompt) -> list[int]:
    model = service.engine.model
    if isinstance(prompt, str):
        try:
            ids = model.encode(prompt)
        except ValueError as e:
            raise APIError(400, str(e), param="prompt", code="invalid_prompt") from None
    else:
        V = model.config.vocab_size
        bad = [t for t in prompt if not 0 <= t < V]
        if bad:
            raise APIError(400, f"token ids {bad[:8]} are outside the vocabulary [0, {V})", param="prompt",
                           code="invalid_prompt")
        ids = list(prompt)
    try:
        service.engine.bucket_of(len(ids))
    except ValueError as e:
        raise APIError(400, str(e), param="prompt", code="context_length_exceeded") from None
    return ids


def _rows(service: Service, body) -> tuple:
    request = parse_request(body)
    if request.model != service.name:
        raise APIError(404, f"the model {request.model!r} does not exist; this server serves {service.name!r}",
                       type="not_found_error", param="model", code="model_not_found")
    cfg = service.engine.config
    if request.max_tokens > cfg.max_new_tokens:
        raise APIError(400, f"max_tokens={request.max_tokens} exceeds this server's limit of {cfg.max_new_tokens}",
                       param="max_tokens", code="invalid_value")
    if request.n > cfg.max_batch:
        raise APIError(400, f"n={request.n} exceeds this server's batch of {cfg.max_batch} rows", param="n",
                       code="invalid_value")
    seed = random.getrandbits(32) if request.seed is None else request.seed
    prompts = [_prompt_ids(service, p) for p in request.prompt]
    jobs = [[RowRequest(tuple(ids), request.max_tokens, request.temperature, request.top_p, seed, i * request.n + j)
             for j in range(request.n)] for i, ids in enumerate(prompts)]
    return request, prompts, jobs


def create_app(service: Service) -> FastAPI:
    app = FastAPI(title="fp4rl serving", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def api_error(_, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(_, exc: Exception):
        return JSONResponse(error_body(f"{type(exc).__name__}: {exc}", "server_error"), status_code=500)

    @app.get("/health")
    async def health():
        stats = service.engine.stats
        return {"status": "ok", "model": service.name, **_describe(service),
                "waiting_rows": service.batcher.waiting_rows, "batches": stats.batches, "rows": stats.rows,
                "tokens": stats.tokens, "tokens_per_second": stats.tokens_per_second,
                "compile_seconds": service.compile_seconds, "uptime_seconds": time.time() - service.started}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.name, "object": "model", "created": int(service.started),
                                            "owned_by": "fp4rl", **_describe(service)}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
        parsed, prompts, jobs = _rows(service, body)
        try:
            futures = [service.batcher.submit(rows) for rows in jobs]
        except QueueFull as e:
            raise APIError(503, f"{e}; retry later", type="overloaded_error", code="queue_full") from None
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        texts = [[service.engine.model.decode(r.token_ids) for r in rs] for rs in results]
        return completion_body(service.name, service.fingerprint, sum(map(len, prompts)), results, texts,
                               parsed.logprobs is not None)

    return app


class BackgroundServer:
    """uvicorn on a thread (tests, notebooks): `start()` returns once the port accepts connections."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "warning"):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
        self.thread = threading.Thread(target=self.server.run, name="fp4rl-uvicorn", daemon=True)
        self.url = f"http://{host}:{port}"

    def start(self, timeout_s: float = 30.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()


def serve(config: ServeConfig) -> None:
    """Load and compile (printing what is served), then serve until interrupted."""
    t0 = time.time()
    service = load_service(config)
    info = _describe(service)
    print(f"serving {service.name!r}: {info['quantization']} (recipe {info['recipe']}, {info['high_precision_layers']}) "
          f"from {info['checkpoint']} [{info['checkpoint_kind']}, trained under {info['trained_recipe']}]; "
          f"ready in {time.time() - t0:.1f}s (compile {service.compile_seconds}) at http://{config.host}:{config.port}")
    try:
        uvicorn.run(create_app(service), host=config.host, port=config.port, log_level=config.log_level)
    finally:
        service.close()
