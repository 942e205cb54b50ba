"""Tokens streamed as they are decoded, on the smoke server (tests/serving/conftest.py): the first
token's event leaves while the rest of its batch is still to be decoded, the events are the
non-streamed answer's, and the TTFT benchmark (`fp4rl.serving.ttft`) times a long answer."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from fp4rl.serving import ttft
from tests.serving.smoke_server import ENGINE, MODEL, T, choices_of, smoke_prompt

pytestmark = pytest.mark.xdist_group("serving-server")


@pytest.fixture
def held_decode(server):
    """The server's decode held after the prefill (its chunk program waits for the event) until
    the test releases it; the programs are put back afterwards."""
    _, service = server
    release, calls = threading.Event(), []
    saved = dict(service.engine._compiled)

    def held(program):
        def chunk(*args):
            calls.append(len(calls))
            assert release.wait(timeout=60), "the decode was never released"
            return program(*args)

        return chunk

    for width, programs in saved.items():
        service.engine._compiled[width] = dataclasses.replace(programs, chunk=held(programs.chunk))
    yield release, calls
    release.set()
    service.engine._compiled.update(saved)


def test_the_first_token_leaves_before_the_rest_is_decoded(oai, held_decode):
    """With the decode held after the prefill, the streamed answer's first token arrives (so it
    was sent before the other tokens existed); released, the rest follows, and the whole stream
    is the non-streamed answer, chunk by chunk."""
    release, calls = held_decode
    request = dict(model=MODEL, prompt=smoke_prompt(13), max_tokens=T, temperature=0, logprobs=2)
    events = iter(oai.completions.create(stream=True, **request))
    first = next(events)
    assert first.choices[0].token_ids and first.choices[0].finish_reason is None
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:  # the worker moves on from the prefill to the first chunk
        time.sleep(0.01)
    assert calls == [0]  # ... and waits there: no token after the first one has been decoded yet
    release.set()
    chunks = [first, *events]
    (streamed,) = choices_of(chunks)
    (whole,) = choices_of(oai.completions.create(**request))
    assert streamed == whole and len(whole["token_ids"]) > ENGINE.decode_chunk + 1  # several chunks
    assert len(calls) > 1


def test_ttft_benchmark_times_a_long_answer(server):
    background, service = server
    result = ttft.measure(background.url, MODEL, smoke_prompt(14), T, repeats=2)
    assert result["tokens"] == T  # the smoke warm-up answers to its budget
    for timing in result["streamed"]:
        assert 0 < timing["first_token_s"] < timing["total_s"] and timing["tokens"] == T
    text = ttft.report(result, "cpu", ENGINE.decode_chunk)
    assert "time to first token" in text and "not a performance number" in text


def test_bench_ttft_entry_point(warmup_dir, capsys):
    from experiments import bench_ttft

    bench_ttft.main(["--preset", "smoke", f"--serve.checkpoint={warmup_dir}", "--serve.engine.max_new_tokens=16",
                     "--serve.engine.decode_chunk=4", "--serve.impl=reference", "--repeats=1"])
    out = capsys.readouterr().out
    assert "answer: 16 tokens, decoded 4 per program call" in out and "not a performance number" in out
