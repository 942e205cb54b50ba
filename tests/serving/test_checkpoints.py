"""Loading what the server serves: an RL arm's seed (the trainer's checkpoint) and a Hugging Face
directory (token ids only, greedy first token = transformers' argmax)."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import pytest

from fp4rl import configs
from fp4rl.rl import trainer
from fp4rl.rl.checkpoint import Checkpointer
from fp4rl.serving import checkpoints, deployment
from fp4rl.serving.engine import Engine, EngineConfig, RowRequest

HF = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf", "qwen3_moe_tiny")


@pytest.mark.slow
def test_rl_arm_checkpoint_serves_the_chosen_seed(warmup_dir, tmp_path):
    config = dataclasses.replace(configs.RL_PRESETS["smoke"], arm="bf16", seeds=2, steps=1, eval_every=0,
                                 init=str(warmup_dir), out=str(tmp_path))
    run = trainer.Trainer(config, progress=False)
    run.run()
    arm = trainer.arm_dir(config)
    ckpt = Checkpointer(arm / "checkpoint")
    state, _ = ckpt.restore(ckpt.latest_step(), run._initial_state())  # the trainer's own state layout
    ckpt.close()
    for seed in (0, 1):
        served = checkpoints.load(arm, seed_index=seed)
        assert served.kind == "rl" and served.trained_recipe == "bf16" and served.text
        expected = jax.tree.leaves(jax.tree.map(lambda x: x[seed], state["params"]))
        for a, b in zip(jax.tree.leaves(served.params), expected, strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    with pytest.raises(ValueError, match="holds 2 seed"):
        checkpoints.load(arm, seed_index=2)


def test_hf_checkpoint_is_served_on_token_ids():
    model = checkpoints.load(HF)
    assert (model.kind, model.text, model.stop_ids, model.trained_recipe) == ("hf", False, (), "bf16")
    with pytest.raises(ValueError, match="no text tokenizer"):
        model.encode("a=1.")
    ref = np.load(os.path.join(HF, "reference_logits.npz"))
    prompt, last = ref["input_ids"][0], ref["logits"][0, -1]
    runner_up, best = np.sort(last)[-2:]
    assert best - runner_up > 1e-3  # the argmax is far beyond f32 noise (logits agree to 1e-5)
    for quantization in ("bf16", "nvfp4_online"):
        engine = Engine(deployment.quantize(model, quantization, impl="reference"),
                        EngineConfig(max_batch=2, prompt_buckets=(16,), max_new_tokens=4))
        engine.compile()
        (result,) = engine.run_batch([RowRequest(tuple(int(t) for t in prompt), 4)])
        # No stop token: every row runs to its budget.
        assert result.completion_tokens == 4 and result.finish_reason == "length" and len(result.token_ids) == 4
        if quantization == "bf16":
            assert result.token_ids[0] == int(np.argmax(last))


def test_unknown_directories_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        checkpoints.load(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="neither an RL run's config nor a Hugging Face config"):
        checkpoints.load(tmp_path)


def test_expert_gemm_override_serves_the_same_parameters_on_another_backend():
    """`load(..., expert_gemm=...)` rebuilds only the graphdef: every MoE computes on the named
    backend, the parameters are the checkpoint's, and the served greedy token is transformers' argmax
    as before; an unknown backend is refused naming the valid ones."""
    from flax import nnx

    from fp4rl.model.moe import MoE

    base, blocked = checkpoints.load(HF), checkpoints.load(HF, expert_gemm="blocked")
    assert base.config.expert_gemm == "xla" and blocked.config.expert_gemm == "blocked"
    model = nnx.merge(blocked.graphdef, blocked.params)
    assert {n.expert_gemm for _, n in nnx.graph.iter_graph(model) if isinstance(n, MoE)} == {"blocked"}
    for a, b in zip(jax.tree.leaves(base.params), jax.tree.leaves(blocked.params), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert checkpoints.with_expert_gemm(base, "") is base
    ref = np.load(os.path.join(HF, "reference_logits.npz"))
    engine = Engine(deployment.quantize(blocked, "bf16", impl="reference"),
                    EngineConfig(max_batch=2, prompt_buckets=(16,), max_new_tokens=1))
    engine.compile()
    (result,) = engine.run_batch([RowRequest(tuple(int(t) for t in ref["input_ids"][0]), 1)])
    assert result.token_ids[0] == int(np.argmax(ref["logits"][0, -1]))
    with pytest.raises(ValueError, match="valid options"):
        checkpoints.load(HF, expert_gemm="cutlass")
