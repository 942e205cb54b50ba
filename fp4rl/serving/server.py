"""An OpenAI-compatible HTTP server for one quantized deployment, on the standard library's
threading HTTP server (the GPU image has no web framework, and one route family needs none).

    POST /v1/completions       the completions API (`protocol`), dynamically batched (`batcher`);
                               `stream: true` answers with server-sent events; `echo` with
                               `max_tokens: 0` scores a prompt
    POST /v1/chat/completions  the chat API (`chat`) for a Hugging Face folder with a chat template:
                               the messages rendered by the template, then the completions route's
                               generation, streamed or not; any other checkpoint answers 400 (no
                               invented template)
    GET  /v1/models            the served model, with its quantization and recipe (`/v1/models/{id}` too)
    GET  /health               liveness plus the deployment and the batcher's counters

Every error is an OpenAI-style JSON body with a 4xx/5xx status (unknown routes and malformed HTTP
included); a bad request never stops the server. Each connection has its own thread (HTTP/1.1
keep-alive); a request's thread waits on its jobs' futures while the batcher's single worker runs
the engine. Streaming: the engine decodes a batch in chunks of `decode_chunk` tokens and hands a
streamed request its rows' results after each (`batcher`'s progress); the handler writes the
events (one per token, in the reference's wire format) of the tokens that became final
(`streaming`), so the first token leaves after the prefill, not with the last.

Start-up loads the checkpoint, quantizes it (`deployment`) and compiles every batch shape
(`engine`) before the port opens, so the first request is as fast as any other.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import faulthandler
import functools
import http.server
import json
import queue
import random
import signal
import sys
import threading
import time
import traceback
import urllib.parse
from pathlib import Path

from fp4rl.rl.sft import params_digest
from fp4rl.serving import chat, checkpoints, deployment
from fp4rl.serving.batcher import Batcher, QueueFull
from fp4rl.serving.engine import Engine, RowRequest, RowResult
from fp4rl.serving.protocol import (APIError, Choice, CompletionRequest, Limits, Stream, completion_body, error_body,
                                    make_choice, parse_request)
from fp4rl.serving.serve_config import ServeConfig
from fp4rl.serving.streaming import ChoiceStream, Events

MAX_BODY_BYTES = 8 << 20
KEEP_ALIVE_S = 30.0  # an idle keep-alive connection's thread ends after this
ROUTES = {"/health": "GET", "/v1/models": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST"}


@dataclasses.dataclass
class Service:
    """A loaded deployment behind a batcher: what the HTTP server serves."""

    name: str
    engine: Engine
    batcher: Batcher
    fingerprint: str
    compile_seconds: dict[int, float]
    started: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self):
        # A token's text, decoded alone (`protocol.Choice.pieces`); cached: a streamed choice is
        # rebuilt after every decode chunk, and top log-probs decode 5 alternatives per token.
        self.piece = functools.lru_cache(maxsize=1 << 16)(lambda token: self.engine.model.decode([token]))

    def close(self) -> None:
        self.batcher.close()


def default_name(checkpoint: str, quantization: str) -> str:
    return f"{Path(checkpoint).resolve().name}-{quantization}"


def load_service(config: ServeConfig) -> Service:
    """Load, quantize at load time, compile every batch shape, start the batcher."""
    model = checkpoints.load(config.checkpoint, config.seed_index, config.expert_gemm)
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
        "chat": dep.model.chat is not None,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "max_tokens": cfg.max_new_tokens,
        "max_batch": cfg.max_batch,
        "prompt_buckets": list(cfg.prompt_buckets),
        "map4_frac": dep.map4_frac,
    }


def _model_entry(service: Service) -> dict:
    return {"id": service.name, "object": "model", "created": int(service.started), "owned_by": "fp4rl",
            **_describe(service)}


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


def _rows(service: Service, body) -> tuple[CompletionRequest, list[list[int]], list[list[RowRequest]]]:
    cfg = service.engine.config
    request = parse_request(body, Limits(max_tokens=cfg.max_new_tokens, max_n=cfg.max_batch))
    if request.model != service.name:
        raise APIError(404, f"the model {request.model!r} does not exist; this server serves {service.name!r}",
                       type="not_found_error", param="model", code="model_not_found")
    if request.stop and not service.engine.model.text:
        raise APIError(400, "stop strings need text, and this model has no text tokenizer (its completions are "
                       "token ids)", param="stop", code="unsupported_parameter")
    seed = random.getrandbits(32) if request.seed is None else request.seed
    prompts = [_prompt_ids(service, p) for p in request.prompt]
    # Choice j of prompt i samples with key fold_in(key(seed), i * n + j): distinct keys, fixed by the seed.
    jobs = [[RowRequest(tuple(ids), request.max_tokens, request.temperature, request.top_p, seed, i * request.n + j,
                        request.echo) for j in range(request.n)] for i, ids in enumerate(prompts)]
    return request, prompts, jobs


def _chat_prompt(service: Service, messages: list[dict]) -> str:
    """The conversation as the text the model continues (its chat template, the generation prompt)."""
    model = service.engine.model
    if model.chat is None:
        raise APIError(400, f"the model {service.name!r} has no chat template, so it serves /v1/completions only: "
                       f"{model.no_chat}", param="messages", code="chat_not_supported")
    try:
        return model.chat.render_messages(messages)
    except ValueError as e:  # the template refused the conversation (raise_exception), e.g. roles out of order
        raise APIError(400, str(e), param="messages", code="invalid_messages") from None


def _top(request: CompletionRequest) -> bool:
    return bool(request.logprobs)  # alternatives asked for: logprobs >= 1


def _choices(service: Service, results: list[RowResult], request: CompletionRequest) -> list[Choice]:
    return [make_choice(r, service.piece, request.stop, _top(request)) for r in results]


def _result(future: concurrent.futures.Future) -> list[RowResult]:
    try:
        return future.result()
    except concurrent.futures.CancelledError:
        raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down") from None


def _put(updates: queue.SimpleQueue, job: int, results: list[RowResult]) -> None:
    updates.put((job, results))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _json_body(raw: bytes):
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection's requests. `service` and `log_requests` are set per server (`create_server`)."""

    service: Service
    log_requests = False
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a garbled request line still gets a status line (not HTTP/0.9's bare body)
    server_version = "fp4rl"
    timeout = KEEP_ALIVE_S
    disable_nagle_algorithm = True  # small responses go out at once, not after the client's delayed ACK

    def do_GET(self):
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _dispatch(self) -> None:
        self._responded = False
        try:
            raw = self._read_body()  # read even when refusing, so the next request on the connection parses
            path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
            route = ROUTES.get(path, "GET" if path.startswith("/v1/models/") else None)
            if route is None:
                raise APIError(404, f"no route {self.command} {path}", type="not_found_error", code="unknown_route")
            if self.command != route:
                raise APIError(405, f"{path} takes {route}, not {self.command}", code="method_not_allowed")
            if path == "/health":
                self._send_json(200, self._health())
            elif path == "/v1/models":
                self._send_json(200, {"object": "list", "data": [_model_entry(self.service)]})
            elif path.startswith("/v1/models/"):
                name = urllib.parse.unquote(path.removeprefix("/v1/models/"))
                if name != self.service.name:
                    raise APIError(404, f"the model {name!r} does not exist; this server serves "
                                   f"{self.service.name!r}", type="not_found_error", param="model",
                                   code="model_not_found")
                self._send_json(200, _model_entry(self.service))
            elif path == "/v1/chat/completions":
                self._chat_completions(raw)
            else:
                self._completions(raw)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: nobody to answer
        except APIError as e:
            self._fail(e.status, e.body())
        except Exception as e:  # noqa: BLE001  the request fails; the server goes on
            traceback.print_exc()
            self._fail(500, error_body(f"{type(e).__name__}: {e}", "server_error"))

    def _read_body(self) -> bytes:
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True
            raise APIError(411, "send the request body with a Content-Length (chunked bodies are not accepted)",
                           code="length_required")
        try:
            length = int(self.headers.get("Content-Length", 0))
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise APIError(400, f"invalid Content-Length {self.headers['Content-Length']!r}") from None
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise APIError(413, f"the request body has {length} bytes; this server accepts at most {MAX_BODY_BYTES}",
                           code="request_too_large")
        return self.rfile.read(length)

    def _health(self) -> dict:
        service = self.service
        stats = service.engine.stats
        return {"status": "ok", "model": service.name, **_describe(service),
                "waiting_rows": service.batcher.waiting_rows, "batches": stats.batches, "rows": stats.rows,
                "tokens": stats.tokens, "tokens_per_second": stats.tokens_per_second,
                "compile_seconds": service.compile_seconds, "uptime_seconds": time.time() - service.started}

    def _submit(self, jobs: list[list[RowRequest]], updates: queue.SimpleQueue | None = None
                ) -> list[concurrent.futures.Future]:
        """Queue the jobs. updates: for a streamed request, gets (job, results so far) after each
        decode chunk and (job, None) once the job's future is done."""
        futures = []
        try:
            for i, rows in enumerate(jobs):
                progress = None if updates is None else functools.partial(_put, updates, i)
                futures.append(self.service.batcher.submit(rows, progress))
                if updates is not None:
                    futures[-1].add_done_callback(lambda _, i=i: updates.put((i, None)))
        except QueueFull as e:
            raise APIError(503, f"{e}; retry later", type="overloaded_error", code="queue_full") from None
        return futures

    def _chat_completions(self, raw: bytes) -> None:
        service = self.service
        messages, body = chat.parse_chat(_json_body(raw))
        try:
            request, prompts, jobs = _rows(service, {**body, "prompt": _chat_prompt(service, messages)})
        except APIError as e:  # the rendered conversation is this route's prompt: name the field the client sent
            if e.param == "prompt":
                e.param = "messages"
            raise
        prompt_tokens = sum(map(len, prompts))
        if request.stream:
            self._stream(jobs, request, prompt_tokens, chat.ChatStream(service.name, service.fingerprint,
                                                                       request.logprobs, request.include_usage))
            return
        choices = [c for f in self._submit(jobs) for c in _choices(service, _result(f), request)]
        self._send_json(200, chat.chat_completion_body(service.name, service.fingerprint, prompt_tokens, choices,
                                                       request.logprobs))

    def _completions(self, raw: bytes) -> None:
        service = self.service
        request, prompts, jobs = _rows(service, _json_body(raw))
        prompt_tokens = sum(map(len, prompts))
        if request.stream:
            self._stream(jobs, request, prompt_tokens, Stream(service.name, service.fingerprint, request.logprobs,
                                                              request.include_usage))
            return
        choices = [c for f in self._submit(jobs) for c in _choices(service, _result(f), request)]
        self._send_json(200, completion_body(service.name, service.fingerprint, prompt_tokens, choices,
                                             request.logprobs))

    def _stream(self, jobs: list[list[RowRequest]], request: CompletionRequest, prompt_tokens: int,
                events: Events) -> None:
        """Server-sent events of the choices' tokens as they become final (`streaming`); a failure
        before the first event gets its status code, a later one an error event."""
        updates: queue.SimpleQueue = queue.SimpleQueue()
        futures = self._submit(jobs, updates)
        n = request.n
        streams = [ChoiceStream(index, events, self.service.piece, request.stop, _top(request))
                   for index in range(len(jobs) * n)]
        pending, started = len(futures), False
        while pending:
            i, results = updates.get()
            if results is None:
                pending -= 1
                try:
                    results = _result(futures[i])
                except Exception as e:  # noqa: BLE001  once the status is sent, the error goes in the stream
                    if not started:
                        raise
                    self._events([e.body() if isinstance(e, APIError) else
                                  error_body(f"{type(e).__name__}: {e}", "server_error")])
                    self._end_events()
                    return
            if not started:
                self._start_events()
                started = True
            self._events([chunk for j, result in enumerate(results) for chunk in streams[i * n + j].update(result)])
        usage = events.usage_chunk(prompt_tokens, [s.choice for s in streams])
        self._events([usage] if usage is not None else [], done=True)
        self._end_events()

    # -- writing responses

    def _send_json(self, status: int, obj: dict, headers: tuple = ()) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self._responded = True
        if self.command != "HEAD":
            self.wfile.write(data)

    def _fail(self, status: int, body: dict) -> None:
        if getattr(self, "_responded", False):  # mid-stream: the status line is gone, only closing is left
            self.close_connection = True
            return
        headers = (("Allow", ROUTES.get(urllib.parse.urlsplit(self.path).path.rstrip("/"), "GET")),) \
            if status == 405 else ()
        try:
            self._send_json(status, body, headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _start_events(self) -> None:
        # HTTP/1.1: chunked, so the connection stays usable; HTTP/1.0: the stream ends with the connection.
        self._chunked = self.request_version != "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self._responded = True

    def _write(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)

    def _events(self, chunks: list[dict], done: bool = False) -> None:
        """Server-sent events `data: {json}` (blank-line separated), then `data: [DONE]` when done."""
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        self._write(data + (b"data: [DONE]\n\n" if done else b""))

    def _end_events(self) -> None:
        if self._chunked:
            self.wfile.write(b"0\r\n\r\n")

    # -- the base class's hooks

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed HTTP (bad request line, unknown method, oversized headers): a JSON error too."""
        if code == 404:
            kind = "not_found_error"
        elif code >= 500 and code != 501:  # 501: a method no route takes, a client's mistake
            kind = "server_error"
        else:
            kind = "invalid_request_error"
        self.close_connection = True
        self._send_json(code, error_body(message or self.responses.get(code, ("error",))[0], kind))

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args) -> None:
        if self.log_requests:
            super().log_message(format, *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # a burst of new connections waits in the listen backlog instead of being reset

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is not the server's error
            super().handle_error(request, client_address)


def create_server(service: Service, host: str = "127.0.0.1", port: int = 0,
                  log_level: str = "warning") -> http.server.ThreadingHTTPServer:
    """The server of `service`, bound and listening (port 0: a free port, see `server_address`)."""
    handler = type("Handler", (_Handler,), {"service": service,
                                            "log_requests": log_level.lower() in ("trace", "debug", "info")})
    return _Server((host, port), handler)


class BackgroundServer:
    """The server on a thread (tests, notebooks); it accepts connections once constructed."""

    def __init__(self, service: Service, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.httpd = create_server(service, host, port, log_level)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="fp4rl-http", daemon=True)

    def start(self) -> "BackgroundServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


SHUTDOWN_WATCHDOG_S = 30


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM stop the server. Installed explicitly: a process started by one that
    ignores SIGINT (a pytest-xdist worker, nohup, a shell's background job) inherits the ignore, and
    Python then leaves SIGINT ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise_interrupt)
        signal.signal(signal.SIGTERM, _raise_interrupt)


def serve(config: ServeConfig) -> None:
    """Load and compile (printing what is served), then serve until interrupted."""
    t0 = time.time()
    service = load_service(config)
    try:
        httpd = create_server(service, config.host, config.port, config.log_level)
    except BaseException:
        service.close()
        raise
    info = _describe(service)
    print(f"serving {service.name!r}: {info['quantization']} (recipe {info['recipe']}, {info['high_precision_layers']}) "
          f"from {info['checkpoint']} [{info['checkpoint_kind']}, trained under {info['trained_recipe']}]; "
          f"ready in {time.time() - t0:.1f}s (compile {service.compile_seconds}) at "
          f"http://{config.host}:{httpd.server_address[1]}",
          flush=True)
    _stop_on_signals()
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        # A shutdown that hangs says where: every thread's stack on stderr, then exit status 1.
        faulthandler.dump_traceback_later(SHUTDOWN_WATCHDOG_S, exit=True)
        httpd.server_close()
        service.close()
        faulthandler.cancel_dump_traceback_later()
