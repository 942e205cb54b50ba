"""Log-probs beyond the sampled token, on the smoke server (tests/serving/conftest.py): the top
alternatives of each generated token (`logprobs: k`), and the prompt's own log-probs (`echo`, with
`max_tokens: 0` to score without generating), checked against the trainer's log-probs of the same
checkpoint and recipe, and read as lm-evaluation-harness's `local-completions` reads them."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from fp4rl.rl import policy
from fp4rl.serving.engine import RowRequest
from tests.serving.smoke_server import MODEL, T, choices_of, prompt_ids, smoke_prompt, stream_choices

pytestmark = pytest.mark.xdist_group("serving-server")


def _expected_top(service, top_ids, top_logprobs, k: int, token: int, logprob: float) -> dict:
    """The reference's top_logprobs entry: the k likeliest texts, then the token's own."""
    entry = {}
    for i, value in zip(top_ids[:k], top_logprobs[:k]):
        entry.setdefault(service.piece(i), value)
    entry.setdefault(service.piece(token), logprob)
    return entry


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=3)])
def test_top_logprobs_are_the_engines_alternatives(oai, server, sampling):
    """logprobs=3: each token's three likeliest alternatives (plus itself when not among them), the
    engine's values; greedy, the token is the likeliest and its log-prob the largest exactly.
    Streamed, the same lists."""
    _, service = server
    prompt = smoke_prompt(8)
    request = dict(model=MODEL, prompt=prompt, max_tokens=T, logprobs=3, **sampling)
    (choice,) = choices_of(oai.completions.create(**request))
    (row,) = service.engine.run_batch([RowRequest(prompt_ids(prompt), T, sampling["temperature"], 1.0,
                                                  sampling.get("seed", 0))])
    lp = choice["logprobs"]
    assert tuple(choice["token_ids"]) == row.token_ids and lp["token_logprobs"] == list(row.logprobs)
    for k, (token, top) in enumerate(zip(row.token_ids, lp["top_logprobs"], strict=True)):
        assert top == _expected_top(service, row.top_ids[k], row.top_logprobs[k], 3, token, row.logprobs[k])
        values = row.top_logprobs[k]
        assert list(values) == sorted(values, reverse=True) and len(set(row.top_ids[k])) == len(values)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-6  # probabilities of distinct tokens of one distribution
        if token in row.top_ids[k]:  # the token's log-prob is read from the array its alternatives come from
            assert values[row.top_ids[k].index(token)] == row.logprobs[k]
        if sampling["temperature"] == 0:
            assert max(top.values()) == lp["token_logprobs"][k] == values[0] and row.top_ids[k][0] == token
    assert stream_choices(oai, **request)[1] == [choice]


_FORWARDS: dict = {}


def _trainer_forward(dep, temperature: float):
    """Jitted once per temperature: a new closure would compile again."""
    key = (id(dep), temperature)
    if key not in _FORWARDS:
        _FORWARDS[key] = jax.jit(policy._response_forward(dep.model.graphdef, dep.recipe.forward_only(), 1, dep.impl,
                                                          temperature))
    return _FORWARDS[key]


def _trainer_logprobs(service, ids: tuple[int, ...], temperature: float):
    """The trainer's log-probs of prompt tokens 1.. and its argmax ids there: `policy`'s forward
    (the one its update and `response_logprobs_fn` go through, the master weights quantized inside
    it), with the sequence in the padded batch the engine runs it in: XLA tiles the GEMMs by the
    batch's shape, so a batch of another shape agrees only to rounding (one row alone: ~3e-6 here)."""
    engine, dep = service.engine, service.engine.deployment
    width = engine.bucket_of(len(ids))
    rows = engine._arrays([RowRequest(ids, 1, echo=True)], width)
    valid = np.arange(width)[None, :] >= width - rows.prompt_lengths_B[:, None]
    (logp, _), (logits, _) = _trainer_forward(dep, temperature)(dep.model.params, rows.prompt_BxP, valid, None)
    cols = slice(width - len(ids), width - 1)  # column p scores token p + 1
    return np.asarray(logp)[0, cols].tolist(), np.asarray(logits)[0, cols].argmax(-1).tolist()


def _lm_eval(choice: dict, ctxlen: int, generated: int) -> tuple[float, bool]:
    """lm-evaluation-harness's reading of a scored prompt (LocalCompletionsAPI.parse_logprobs,
    lm_eval 0.4.13): the continuation's log-probs summed, and greedy when each is its position's
    largest top_logprobs value; `generated` tokens at the end are left out."""
    end = len(choice["logprobs"]["token_logprobs"]) - generated
    logprobs = choice["logprobs"]["token_logprobs"][ctxlen:end]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:end]
    return sum(logprobs), all(tok == max(top.values()) for tok, top in zip(logprobs, tops, strict=True))


def test_echo_scores_a_continuation_as_the_trainer_does(client, oai, server):
    """A log-likelihood request as lm-evaluation-harness sends it (prompt = context + continuation
    as token ids, echo, logprobs=1, temperature 0; max_tokens 1 as lm_eval 0.4.13 sends it, or 0):
    the continuation's log-probs are the trainer's bit for bit, and is_greedy read from top_logprobs
    is whether the trainer's forward puts each continuation token first."""
    _, service = server
    context = prompt_ids(smoke_prompt(9))
    (greedy,) = service.engine.run_batch([RowRequest(context, 6)])
    greedy_ids = greedy.token_ids[:4]
    other = greedy_ids[:1] + (greedy_ids[1] % 90 + 5,) + greedy_ids[2:]  # its second token is not the argmax
    greedy_flags = []
    for continuation in (greedy_ids, other):
        ids = context + continuation
        logp, argmax = _trainer_logprobs(service, ids, 0.0)
        expected_greedy = list(continuation) == argmax[len(context) - 1:]
        greedy_flags.append(expected_greedy)
        for max_tokens in (1, 0):
            body = {"model": MODEL, "prompt": [list(ids)], "temperature": 0, "max_tokens": max_tokens, "logprobs": 1,
                    "seed": 1234, "echo": True}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            (choice,) = response.json()["choices"]
            lp = choice["logprobs"]
            assert choice["token_ids"][:len(ids)] == list(ids) and len(choice["token_ids"]) == len(ids) + max_tokens
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing to score it in
            assert lp["token_logprobs"][1:len(ids)] == logp  # the trainer's log-probs, bit for bit
            assert all(len(top) <= 2 for top in lp["top_logprobs"][1:])  # the likeliest and the token itself
            total, is_greedy = _lm_eval(choice, len(context), max_tokens)
            assert total == sum(logp[len(context) - 1:]) and is_greedy == expected_greedy
        assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == 0
    assert greedy_flags == [True, False]  # the engine's greedy answer is the trainer's argmax; the other is not
    # The openai client, on text: the same prompt scores, another temperature scales the distribution.
    text = smoke_prompt(9)
    scored = oai.completions.create(model=MODEL, prompt=text, echo=True, max_tokens=0, logprobs=2, temperature=1.0)
    (choice,) = choices_of(scored)
    assert choice["text"] == text and choice["token_ids"] == list(context)  # BOS (no text), then each character
    assert choice["logprobs"]["token_logprobs"][1:] == _trainer_logprobs(service, context, 1.0)[0]
    assert scored.usage.prompt_tokens == len(context) and scored.usage.completion_tokens == 0


def test_echo_with_generation_and_its_stream(oai, server):
    """echo with max_tokens > 0: the prompt, then the completion (text, ids, log-probs, offsets);
    the completion part is the request's without echo; streamed, the prompt comes as one chunk."""
    text = smoke_prompt(10)
    request = dict(model=MODEL, prompt=text, max_tokens=6, temperature=1.0, seed=4, logprobs=2)
    (plain,) = choices_of(oai.completions.create(**request))
    (echoed,) = choices_of(oai.completions.create(**request, echo=True))
    n = len(prompt_ids(text))
    lp, plain_lp = echoed["logprobs"], plain["logprobs"]
    assert echoed["text"] == text + plain["text"] and echoed["token_ids"][n:] == plain["token_ids"]
    assert lp["tokens"][n:] == plain_lp["tokens"] and lp["token_logprobs"][n:] == plain_lp["token_logprobs"]
    assert lp["top_logprobs"][n:] == plain_lp["top_logprobs"]
    assert lp["text_offset"] == [0] + list(range(len(text))) + [len(text) + o for o in plain_lp["text_offset"]]
    chunks, streamed = stream_choices(oai, **request, echo=True)
    assert streamed == [echoed] and chunks[0].choices[0].text == text


def test_score_only_rows_share_batches_with_generating_ones(server):
    """max_tokens=0 rows (score only) and generating rows in one batch: each gets what it gets alone."""
    _, service = server
    a, b = prompt_ids(smoke_prompt(11)), prompt_ids(smoke_prompt(12))
    rows = [RowRequest(a, 0, echo=True), RowRequest(b, 5, 1.0, 1.0, 9), RowRequest(b, 3, echo=True)]
    together = service.engine.run_batch(rows)
    assert together == [service.engine.run_batch([r])[0] for r in rows]
    assert together[0].token_ids == () and together[0].completion_tokens == 0
    assert len(together[0].prompt.logprobs) == len(a) - 1
    assert together[1].prompt is None and together[2].prompt.token_ids == b
    with pytest.raises(ValueError, match=r"max_tokens=0 must be in \[1, 24\] \(0 only for a row that scores"):
        service.engine.run_batch([RowRequest(a, 0)])
