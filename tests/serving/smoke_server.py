"""The smoke server that tests/serving/test_server.py, test_scoring.py and test_streaming.py drive
(its fixtures: tests/serving/conftest.py): the smoke warm-up served as nvfp4_online, in batches of
8 rows, prompt buckets of 32 and 48 tokens, up to 24 new tokens decoded 4 per program call (so a
long answer arrives in several chunks). Helpers to build its prompts and read its answers."""

from __future__ import annotations

import openai

from fp4rl import configs
from fp4rl.rl import data
from fp4rl.rl.task import TaskConfig, make_problem
from fp4rl.serving.engine import EngineConfig

MAX_BATCH, T = 8, 24
ENGINE = EngineConfig(max_batch=MAX_BATCH, prompt_buckets=(32, 48), max_new_tokens=T, decode_chunk=4)
MODEL = "smoke-nvfp4"
LONG_TASK = TaskConfig(min_ops=3, max_ops=3, digits=1, max_operands=2)  # prompts of 33-48 tokens: the second bucket


def openai_client(url: str) -> openai.OpenAI:
    # No retries: a lost or failed response must show, not be papered over by a second attempt.
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)


def smoke_prompt(i: int, seed: int = 23, task: TaskConfig = configs.SMOKE_TASK) -> str:
    return make_problem(i, seed, task).prompt + data.PROMPT_SEPARATOR


def prompt_ids(prompt: str) -> tuple[int, ...]:
    """The ids the server encodes `prompt` to (BOS, then one per character)."""
    return tuple(data.encode_prompt(prompt[:-1]))


def complete(client, **body):
    body.setdefault("model", MODEL)
    return client.post("/v1/completions", json=body)


def choices_of(completion) -> list[dict]:
    """A completion's choices (an openai response, or the chunks of a streamed one reassembled) as
    plain dicts, in index order."""
    out: dict[int, dict] = {}
    for chunk in completion if isinstance(completion, list) else [completion]:
        for c in chunk.choices:
            d = out.setdefault(c.index, {"text": "", "token_ids": [], "logprobs": None, "finish_reason": None})
            d["text"] += c.text
            d["token_ids"] += c.token_ids
            if c.logprobs is not None:
                lp = d["logprobs"] or {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": None}
                for key in ("tokens", "token_logprobs", "text_offset"):
                    lp[key] += getattr(c.logprobs, key)
                if c.logprobs.top_logprobs is not None:
                    lp["top_logprobs"] = (lp["top_logprobs"] or []) + c.logprobs.top_logprobs
                d["logprobs"] = lp
            if c.finish_reason is not None:
                assert d["finish_reason"] is None, "two finish_reasons for one choice"
                d["finish_reason"] = c.finish_reason
    assert sorted(out) == list(range(len(out)))
    return [out[i] for i in range(len(out))]


def stream_choices(oai, **body) -> tuple[list, list[dict]]:
    """(the chunks, the choices they reassemble to) of a streamed completion."""
    body.setdefault("model", MODEL)
    chunks = list(oai.completions.create(stream=True, **body))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "text_completion" for c in chunks)
    return chunks, choices_of(chunks)
