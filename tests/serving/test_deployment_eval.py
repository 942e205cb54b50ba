"""serve_eval: follow-up questions, config checks, and a smoke run whose greedy scores are the
project's own held-out evaluation (the trainer's sampler) on the same prompts."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import jax
import numpy as np
import pytest

from fp4rl.rl import evaluation, sft
from fp4rl.rl.task import TaskConfig, make_problem
from fp4rl.serving import deployment_eval
from fp4rl.serving.deployment_eval import Followup, ServeEvalConfig
from fp4rl.serving.engine import EngineConfig


def test_followup_feeds_the_answer_back():
    f = Followup.from_problem("a=5. b=a+3. What is b?", 8)
    assert f.prompt(-2) == "a=-2. b=a+3. What is b?" and f.answer(-2) == 1 and f.answer(40) == 43
    # Longer chains, against Python's own arithmetic on the substituted expressions.
    task = TaskConfig(min_ops=1, max_ops=3, digits=2, max_operands=3)
    rng = np.random.default_rng(0)
    for i in range(50):
        p = make_problem(i, 5, task)
        f = Followup.from_problem(p.prompt, p.answer)
        value = int(rng.integers(-200, 200))
        values = {f.given: value}
        for var, expr in f.steps:
            values[var] = eval(expr, {}, dict(values))  # noqa: S307  the oracle: + and - on integers
        assert f.answer(value) == values[f.steps[-1][0]]
        assert f.prompt(value).startswith(f"{f.given}={value}. ")


def test_config_checks():
    with pytest.raises(ValueError, match="followup must use"):
        ServeEvalConfig(followup=TaskConfig(operators="+-*"))
    with pytest.raises(ValueError, match="quantization must be one of"):
        ServeEvalConfig(deployments=("bf16", "fp8"))
    with pytest.raises(ValueError, match="unknown recipe"):
        ServeEvalConfig(deployments=("nvfp4_online:fancy",))
    with pytest.raises(ValueError, match="distinct"):
        ServeEvalConfig(deployments=("bf16", "bf16"))
    assert deployment_eval.parse_deployment("nvfp4_online:nvfp4") == ("nvfp4_online", "nvfp4")
    with pytest.raises(ValueError, match="valid options"):
        ServeEvalConfig(expert_gemm="cutlass")
    # the checkpoint's backend ("") keeps the cache key of results saved before the option; a named one changes it
    key = deployment_eval._cache_key(ServeEvalConfig(), "bf16", "digest")
    legacy = {k: v for k, v in dataclasses.asdict(ServeEvalConfig()).items()
              if k not in ("deployments", "bootstrap", "ci", "out", "expert_gemm")}
    legacy.update(spec="bf16", retest=True, params_sha256="digest")  # bf16: the first deployment, retested
    assert key == hashlib.sha256(json.dumps(legacy, sort_keys=True, default=str).encode()).hexdigest()
    assert deployment_eval._cache_key(ServeEvalConfig(expert_gemm="blocked"), "bf16", "digest") != key


ROWS, WIDTH, T = 16, 48, 24


@pytest.mark.slow
def test_smoke_run(warmup_dir, tmp_path):
    config = ServeEvalConfig(checkpoint=str(warmup_dir), task=TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2),
                             per_level=4, samples=2, engine=EngineConfig(max_batch=ROWS, prompt_buckets=(WIDTH,),
                                                                         max_new_tokens=T),
                             impl="reference", bootstrap=50, out=str(tmp_path))
    messages = []
    result = deployment_eval.run(config, progress=messages.append)
    N = 8
    assert result["n_prompts"] == N and result["levels"] == [1] * 4 + [2] * 4
    names = ["bf16", "bf16 (retest)", "mxfp8", "nvfp4_online"]
    assert list(result["scores"]) == names
    assert set(result["scores"]["bf16 (retest)"]) == set(deployment_eval.SAMPLED)
    for name in names:
        for metric, s in result["scores"][name].items():
            assert len(s) == N and all(0.0 <= v <= 1.0 for v in s)
            assert result["accuracy"][name][metric]["value"] == pytest.approx(np.mean(s))
    assert [d["recipe"] for d in result["deployments"]] == ["bf16", "mxfp8", "full"]
    assert all(d["tokens_per_second"] > 0 for d in result["deployments"])
    pairs = {(p["a"], p["b"], p["metric"]) for p in result["correlations"]}
    assert ("mxfp8", "nvfp4_online", "sampled") in pairs and ("bf16", "bf16 (retest)", "sampled") in pairs
    assert ("bf16 (retest)", "mxfp8", "sampled") not in pairs
    for name in ("serve_eval.json", "report.md", "serve_eval.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "serve_eval.json").read_text())["headline"] == result["headline"]
    assert "NVFP4 (nvfp4_online) vs FP8 (mxfp8)" in (tmp_path / "report.md").read_text()

    # Greedy single-turn scores are the project's held-out evaluation: the trainer's sampler at the
    # same batch shape, on the same prompts, synced under the same recipe.
    graphdef, params, _ = sft.load(warmup_dir)
    problems = [make_problem(i, config.task_seed, dataclasses.replace(config.task, min_ops=ops, max_ops=ops))
                for ops in (1, 2) for i in range(4)]
    recipe = deployment_eval.deployment.deployment_recipe("bf16", "bf16").forward_only()
    run = jax.jit(evaluation.sample_fn(graphdef, recipe, evaluation.sampler_config(T), "reference"))
    greedy = evaluation.solve_rate(run, params, evaluation.prompt_batches(problems, WIDTH, ROWS), temperature=0.0)
    np.testing.assert_array_equal(np.array(result["scores"]["bf16"]["greedy"]), (greedy > 0).astype(float))

    # Rerunning reuses every finished deployment and reproduces the result.
    first = json.loads((tmp_path / "serve_eval.json").read_text())
    messages.clear()
    deployment_eval.run(config, progress=messages.append)
    assert sum("reusing" in m for m in messages) == 3
    again = json.loads((tmp_path / "serve_eval.json").read_text())  # NaN statistics read back as null
    for key in ("scores", "accuracy", "correlations", "deployments"):
        assert again[key] == first[key], key
