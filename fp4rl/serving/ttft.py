"""Time to first token against total time of a streamed answer, as a client measures it.

A client posts a streamed completion to a running server and timestamps, on its side of the
loopback socket, the request, the first event carrying a token, and `data: [DONE]`. The engine
decodes a batch `decode_chunk` tokens per program call and the server sends each chunk's tokens
when it finishes (`streaming`), so for a long answer the first token should come after the
prefill and one chunk at most, far before the last; a server that sent every token at the end
would show TTFT = total. The same request unstreamed gives the total without streaming's costs.
`python -m experiments.bench_ttft` starts a server in process and prints the table (`report`).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import statistics
import time
import urllib.parse

from fp4rl.serving.serve_config import ServeConfig


@dataclasses.dataclass(frozen=True)
class TTFTConfig:
    """serve: the server started (checkpoint, deployment, batch shapes: `ServeConfig`). prompt: the
    text answered, greedily; max_tokens: the answer's budget (0: the engine's max_new_tokens), long
    so that TTFT and total differ by the decode; repeats: timed requests of each kind, after one
    untimed warm-up request."""

    serve: ServeConfig = ServeConfig()
    prompt: str = "a=3. b=a+4. What is b?\n"
    max_tokens: int = 0
    repeats: int = 5

    def __post_init__(self):
        if self.repeats < 1 or self.max_tokens < 0:
            raise ValueError(f"need repeats={self.repeats} >= 1 and max_tokens={self.max_tokens} >= 0")


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds from sending the request: to the first event with a token (streamed) and to the
    end of the answer; tokens: the answer's completion tokens."""

    first_token_s: float
    total_s: float
    tokens: int


def _post(url: str, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"the server answered {response.status}: {response.read().decode()}")
    return conn, response


def time_streamed(url: str, body: dict) -> Timing:
    """One streamed request (`stream: true`, usage included), timed event by event."""
    t0 = time.perf_counter()
    conn, response = _post(url, {**body, "stream": True, "stream_options": {"include_usage": True}})
    first, tokens = None, 0
    try:
        while (line := response.readline()) != b"":
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the stream failed: {chunk['error']}")
            if first is None and any(c["token_ids"] for c in chunk["choices"]):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        total = time.perf_counter() - t0
    finally:
        conn.close()
    if first is None:
        raise RuntimeError("the streamed answer held no token")
    return Timing(first, total, tokens)


def time_whole(url: str, body: dict) -> Timing:
    """The same request unstreamed: its first token arrives with its last."""
    t0 = time.perf_counter()
    conn, response = _post(url, body)
    try:
        answer = json.loads(response.read())
    finally:
        conn.close()
    total = time.perf_counter() - t0
    return Timing(total, total, answer["usage"]["completion_tokens"])


def measure(url: str, model: str, prompt: str, max_tokens: int, repeats: int) -> dict:
    """Median first-token and total seconds of `repeats` streamed and unstreamed greedy answers to
    `prompt` (one untimed streamed request first), with every timing."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    time_streamed(url, body)
    streamed = [time_streamed(url, body) for _ in range(repeats)]
    whole = [time_whole(url, body) for _ in range(repeats)]
    return {
        "tokens": streamed[0].tokens,
        "streamed_first_token_s": statistics.median(t.first_token_s for t in streamed),
        "streamed_total_s": statistics.median(t.total_s for t in streamed),
        "unstreamed_total_s": statistics.median(t.total_s for t in whole),
        "streamed": [dataclasses.asdict(t) for t in streamed],
        "unstreamed": [dataclasses.asdict(t) for t in whole],
    }


def report(result: dict, platform: str, decode_chunk: int) -> str:
    """The table `experiments.bench_ttft` prints."""
    first, total = result["streamed_first_token_s"], result["streamed_total_s"]
    lines = [f"answer: {result['tokens']} tokens, decoded {decode_chunk} per program call",
             f"streamed:   time to first token {first * 1e3:9.1f} ms, total {total * 1e3:9.1f} ms "
             f"(first token at {first / total:.0%} of the total)",
             f"unstreamed: total {result['unstreamed_total_s'] * 1e3:9.1f} ms"]
    if platform == "cpu":
        lines.append("CPU: a functional check that tokens leave as they are decoded, not a performance number")
    return "\n".join(lines)
