"""The serving engine: load-time quantization is the trainer's sync byte for byte; generation is the
sampler's (greedy rows bitwise), and decoded in chunks it is the one-program loop's bytes, handed
out chunk by chunk; a row's result does not depend on its batch, shapes are fixed."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import configs
from fp4rl.model import flat_params
from fp4rl.model.config import ModelConfig
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import data, evaluation, sft, step_programs
from fp4rl.rl.task import make_problem
from fp4rl.serving import checkpoints, decode, deployment
from fp4rl.serving.engine import Engine, EngineConfig, RowRequest

IMPL = "reference"
B, P, T = 4, 32, 16  # one shape for the sampler comparison and the engine tests: each compiles once
CHUNK = 3  # tokens per decode call: a 16-token answer arrives in 6 pieces


def _packed_sites(qparams) -> set[str]:
    """Weights the sync replaced by packed tensors (NVFP4 codes / MX elements), by name."""
    return {name.rsplit("/", 1)[0] for name in flat_params(qparams) if name.endswith(("/codes", "/elements"))}


@pytest.mark.parametrize("quantization, recipe, packed", [
    # `full` on the 2-layer model: routed experts of layer 0 only (shared expert and last layer in BF16).
    ("nvfp4_online", "full", {"layers/0/mlp/gate_up", "layers/0/mlp/down"}),
    ("mxfp8", "mxfp8", {f"layers/{i}/mlp/{s}" for i in (0, 1) for s in ("gate_up", "down", "shared/gate_up", "shared/down")}),
])
def test_served_weights_are_the_trainers_sync_bytes(warmup_dir, quantization, recipe, packed):
    served = deployment.quantize(checkpoints.load(warmup_dir), quantization, impl=IMPL)
    assert served.recipe.name == recipe
    assert _packed_sites(served.qparams) == packed
    # The trainer's path: its own checkpoint loader, its rollout sync program (jitted, vmapped over seeds).
    graphdef, params, meta = sft.load(warmup_dir)
    sync, _ = step_programs.forward_programs(graphdef, ModelConfig(**meta["model_config"]),
                                        PrecisionRecipe.from_name(recipe).forward_only(), evaluation.sampler_config(T), IMPL)
    qparams_S, _ = sync(jax.tree.map(lambda x: jnp.stack([x, x]), params))
    expected = jax.tree.map(lambda x: x[1], qparams_S)
    served_leaves, served_def = jax.tree.flatten(served.qparams)
    expected_leaves, expected_def = jax.tree.flatten(expected)
    assert served_def == expected_def
    for a, b in zip(served_leaves, expected_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert a.tobytes() == b.tobytes()


def test_deployment_recipe_mapping():
    recipe = deployment.deployment_recipe
    assert recipe("bf16", "bf16").name == "bf16"
    assert recipe("mxfp8", "full").name == "mxfp8"
    assert recipe("nvfp4_online", "bf16").name == "full"  # a BF16-trained checkpoint: the seed's recipe
    assert recipe("nvfp4_online", "nvfp4").name == "nvfp4"  # an NVFP4-trained arm: its own forward
    assert recipe("nvfp4_online", "full-dq").name == "full-dq"
    assert recipe("nvfp4_online", "mxfp8").name == "full"  # trained in MXFP8: not an NVFP4 recipe
    assert recipe("nvfp4_online", "bf16", "nvfp4").name == "nvfp4"
    with pytest.raises(ValueError, match="not in what quantization='nvfp4_online' serves"):
        recipe("nvfp4_online", "bf16", "mxfp8")
    with pytest.raises(ValueError, match="quantization='bf16'"):
        recipe("bf16", "bf16", "full")
    with pytest.raises(ValueError, match="valid options"):
        recipe("fp8", "bf16")


@pytest.fixture(scope="module")
def served(warmup_dir):
    return deployment.quantize(checkpoints.load(warmup_dir), "nvfp4_online", impl=IMPL)


@pytest.fixture(scope="module")
def engine(served):
    engine = Engine(served, EngineConfig(max_batch=B, prompt_buckets=(P,), max_new_tokens=T, decode_chunk=CHUNK))
    engine.compile()
    return engine


def _problems(n, seed=11):
    return [make_problem(i, seed, configs.SMOKE_TASK) for i in range(n)]


def test_greedy_rows_are_the_samplers_tokens_bitwise(served):
    ids, mask, _ = evaluation.prompt_batches(_problems(B), P, B)[0]
    model = served.model
    run = jax.jit(evaluation.sample_fn(model.graphdef, served.forward_recipe, evaluation.sampler_config(T), IMPL))
    expected = run(served.qparams, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), jnp.float32(0.0))
    rows = decode.RowParams(ids, mask.sum(1).astype(np.int32), np.full(B, T, np.int32), np.zeros(B, np.float32),
                            np.ones(B, np.float32), np.arange(7, 7 + B, dtype=np.uint32), np.zeros(B, np.uint32))
    got = decode.generate_rows(model.graphdef, served.forward_recipe, IMPL, T, served.qparams, rows,
                               np.asarray(model.stop_ids, np.int32), np.int32(model.pad_id))
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expected.tokens))
    np.testing.assert_array_equal(np.asarray(got.logprobs), np.asarray(expected.logprobs))
    np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(expected.lengths))


def _row(problem, **kw):
    return RowRequest(tuple(data.encode_prompt(problem.prompt)), **kw)


def test_a_rows_result_does_not_depend_on_its_batch(engine):
    problems = _problems(6)
    rows = [_row(p, max_tokens=T, temperature=1.0, top_p=0.9, seed=100 + i, choice=i % 2) for i, p in enumerate(problems)]
    first = engine.run_batch(rows[:4])
    # Other companions, other positions, and alone: the same tokens and log-probs.
    second = engine.run_batch([rows[5], rows[2], rows[4], rows[0]])
    assert second[1] == first[2] and second[3] == first[0]
    assert engine.run_batch([rows[1]])[0] == first[1]
    # The key follows the request: another seed or choice draws other tokens (the prompt is the same).
    other = [dataclasses.replace(rows[0], seed=999), dataclasses.replace(rows[0], choice=5)]
    assert all(r.token_ids != first[0].token_ids for r in engine.run_batch(other))


def test_chunked_decode_is_the_one_program_loop_and_is_handed_out_as_it_goes(engine, served):
    """run_batch's prefill + decode chunks give the bytes of `decode.generate_rows` (tokens,
    log-probs, top alternatives, lengths), greedy and sampled, short and long budgets; on_chunk sees
    every row grow by at most CHUNK tokens per call, unfinished until it stops, then the final rows."""
    problems = _problems(3)
    rows = [_row(problems[0], max_tokens=T), _row(problems[1], max_tokens=T, temperature=1.0, top_p=0.9, seed=5),
            _row(problems[2], max_tokens=4, temperature=0.7, seed=6, choice=1)]
    seen: list[list] = []
    results = engine.run_batch(rows, seen.append)
    model = served.model
    whole = jax.device_get(decode.generate_rows(model.graphdef, served.forward_recipe, IMPL, T, served.qparams,
                                                engine._arrays(rows, P), np.asarray(model.stop_ids, np.int32),
                                                np.int32(model.pad_id)))
    for b, r in enumerate(results):
        n = int(whole.lengths[b])
        assert r.completion_tokens == n and len(r.token_ids) in (n, n - 1)
        keep = len(r.token_ids)
        assert r.token_ids == tuple(whole.tokens[b, :keep].tolist())
        assert np.asarray(r.logprobs, np.float32).tobytes() == whole.logprobs[b, :keep].tobytes()
        for name, dtype in (("top_ids", np.int32), ("top_logprobs", np.float32)):
            got = np.asarray(getattr(r, name), dtype).reshape(keep, decode.TOP_K)
            assert got.tobytes() == getattr(whole, name)[b, :keep].tobytes(), name
    assert seen[-1] == results and len(seen) >= 1 + T // CHUNK  # the prefill, the chunks, the final rows
    for before, after in zip(seen, seen[1:]):
        for x, y in zip(before, after):
            assert y.token_ids[:len(x.token_ids)] == x.token_ids and y.logprobs[:len(x.logprobs)] == x.logprobs
            assert x.finish_reason is not None or len(y.token_ids) - len(x.token_ids) <= CHUNK
            assert x.finish_reason is None or y == x  # a finished row changes no more
    assert seen[0][0].finish_reason is None and len(seen[0][0].token_ids) == 1  # after the prefill: token 0


def test_budgets_and_finish_reasons(engine, served):
    problems = _problems(3)
    results = engine.run_batch([_row(problems[0], max_tokens=3), _row(problems[0], max_tokens=T),
                                _row(problems[2], max_tokens=1, temperature=1.0, seed=3)])
    assert 1 <= results[0].completion_tokens <= 3 and results[2].completion_tokens == 1
    for r in results:
        assert len(r.logprobs) == len(r.token_ids)
        assert not set(served.model.stop_ids) & set(r.token_ids)  # the stop token is not part of the completion
        assert r.finish_reason == ("stop" if len(r.token_ids) < r.completion_tokens else "length")
    # The longer budget is the prefix-compatible continuation of the shorter one (greedy).
    assert results[1].token_ids[:len(results[0].token_ids)] == results[0].token_ids


def test_shapes_are_fixed(engine, served):
    with pytest.raises(ValueError, match="accepts at most 32"):
        engine.bucket_of(P + 1)
    with pytest.raises(ValueError, match="1..4 rows"):
        engine.run_batch([])
    with pytest.raises(ValueError, match=r"max_tokens=17 must be in \[1, 16\]"):
        engine.run_batch([RowRequest((1, 5), max_tokens=T + 1)])
    with pytest.raises(ValueError, match="max_seq_len=128"):
        Engine(served, EngineConfig(prompt_buckets=(64, 100), max_new_tokens=48))
    uncompiled = Engine(served, EngineConfig(max_batch=B, prompt_buckets=(P, 48), max_new_tokens=T))
    with pytest.raises(RuntimeError, match="not compiled"):
        uncompiled.run_batch([RowRequest((1, 5), max_tokens=2)])
