"""RLConfig.generation_chunks: a generation batch's rows sampled in several calls (a smaller KV cache)."""

import dataclasses
import json

import numpy as np
import pytest

from fp4rl import configs
from fp4rl.rl import trainer


def _smoke(warmup_dir, out, **overrides):
    return dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), out=str(out), arm="bf16", **overrides)


def test_chunked_generation_draws_the_same_greedy_tokens_and_runs_a_step(warmup_dir, tmp_path):
    whole = trainer.Trainer(_smoke(warmup_dir, tmp_path / "whole"), progress=False)
    chunked = trainer.Trainer(_smoke(warmup_dir, tmp_path / "chunked", generation_chunks=2), progress=False)
    qparams, _ = whole.programs.sync(whole._initial_state()["params"])
    ids, mask, _ = whole.eval_batches[0]  # a held-out batch, in the rollout's shape
    ids, mask = ids[None].astype(np.int32), mask[None].astype(bool)
    keys = whole.programs.step_keys(0, 0)
    # Greedy decoding uses no key: two calls of half the rows draw what one call of all draws.
    a = whole.programs.generate(qparams, ids, mask, keys, np.float32(0.0))
    b = chunked.programs.generate(qparams, ids, mask, keys, np.float32(0.0))
    for name in a._fields:
        np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
    sampled = chunked.programs.generate(qparams, ids, mask, keys, np.float32(1.0))
    assert sampled.tokens.shape == a.tokens.shape and sampled.router_topk.shape == a.router_topk.shape
    chunked.run()
    lines = (tmp_path / "chunked" / "bf16" / "seed0" / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    assert len(lines) == chunked.config.steps and np.isfinite(last["grad_norm/global"]) and "eval/accuracy" in last


def test_generation_chunks_must_split_the_rows_evenly():
    rows = configs.RL_PRESETS["smoke"].prompts_per_step * configs.RL_PRESETS["smoke"].group_size
    with pytest.raises(ValueError, match=f"generation_chunks=3 must split the {rows} rows.*valid options: 1, 2"):
        dataclasses.replace(configs.RL_PRESETS["smoke"], generation_chunks=3)
