"""RLConfig.reference_logprobs: DAPO without the initial policy's forward pass."""

import dataclasses
import json

import jax

import pytest

from fp4rl import configs
from fp4rl.rl import policy, trainer


def test_dapo_trains_the_same_without_reference_logprobs(warmup_dir, tmp_path):
    smoke = dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), arm="bf16", steps=2, eval_every=0)
    records, runs = {}, {}
    for name, reference in (("with", True), ("without", False)):
        run = trainer.Trainer(dataclasses.replace(smoke, out=str(tmp_path / name), reference_logprobs=reference),
                              progress=False)
        run.run()
        runs[name] = run
        lines = (tmp_path / name / "bf16" / "seed0" / "metrics.jsonl").read_text().splitlines()
        records[name] = [json.loads(line) for line in lines]
    # DAPO's loss never reads the reference log-probs: the same updates, bit for bit (step 1
    # samples from the parameters step 0 left).
    for a, b in zip(records["with"], records["without"]):
        assert "kl_ref_k3" in a and "kl_ref_k3" not in b
        for key in ("loss/policy", "grad_norm/global", "reward/mean", "entropy", "population/reward_mean"):
            assert a[key] == b[key], key
    # Without them the devices hold no copy of the initial weights beside the state: none stacked
    # per seed, and the trainer's own released to their shapes once the state is built.
    assert "ref_params_S" in vars(runs["with"]) and "ref_params_S" not in vars(runs["without"])
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(runs["with"].ref_params))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(runs["without"].ref_params))
    for _, _, lower in runs["without"].lowerings():  # the shapes are all the programs need
        lower()


def test_grpo_with_a_kl_term_needs_them():
    with pytest.raises(ValueError, match="loss.kl_coef=0.1 needs the reference log-probs"):
        dataclasses.replace(configs.RL_PRESETS["smoke"], reference_logprobs=False,
                            loss=policy.LossConfig(kind="grpo", kl_coef=0.1))
    dataclasses.replace(configs.RL_PRESETS["smoke"], reference_logprobs=False, loss=policy.LossConfig(kind="grpo"))
