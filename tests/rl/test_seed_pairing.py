"""Seed pairing: a seed's rollouts are a function of (seed, step, generation batch) alone.

The ablation's reward criterion compares seed k of every arm with bf16's seed k on the premise
that both sample the same prompts with the same keys. That must hold whichever seeds share the
vmapped program (1, 2 or 4; `seed_offset`) and however many generation batches the other seeds,
or the other arm, needed for dynamic sampling. The rollouts are drawn from the warm-up's weights
at every step (no update runs): only the prompts, keys and batch shapes are under test.

Rewards are set per group so that dynamic sampling has something to decide: a group is kept when
its answer is odd (alternating rewards) and dropped otherwise, so each seed needs one or two
generation batches per step depending on its own prompts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fp4rl import configs
from fp4rl.rl import rollout, run_inputs, trainer

pytestmark = pytest.mark.slow
STEPS = 2


def _config(warmup_dir, out, arm="bf16", seeds=1, seed_offset=0):
    return dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), out=str(out), arm=arm, seeds=seeds,
                               seed_offset=seed_offset, eval_every=0)


def _set_rewards(monkeypatch, keep):
    """Replace the verifier's correctness: `keep(answers_P)` -> bool [P] says which groups get
    alternating rewards (kept by dynamic sampling); the others are all wrong (dropped). Every
    generation batch the trainer scores is recorded, in the order scored (per batch, seed by seed)."""
    scored = []
    score = rollout.score

    def scripted(gen, group_size, max_new_tokens, overlong_buffer, codec):
        correct, shaped = score(gen, group_size, max_new_tokens, overlong_buffer, codec)
        alternating = np.tile(np.float32([1.0, -1.0]), group_size // 2)
        scripted_correct = np.where(keep(gen.answers_P)[:, None], alternating, np.float32(-1.0))
        scored.append(gen)
        return scripted_correct, scripted_correct + (shaped - correct)

    monkeypatch.setattr(rollout, "score", scripted)
    return scored


def _rollouts(config, inputs, scored) -> dict[int, dict[tuple[int, int], rollout.Generation]]:
    """{seed: {(step, generation batch): the seed's Generation}} of STEPS steps' rollouts."""
    run = trainer.Trainer(config, progress=False, inputs=inputs)
    qparams, _ = run.programs.sync(run._initial_state()["params"])
    streams = {seed: {} for seed in run.seeds}
    for step in range(STEPS):
        del scored[:]
        _, gen_batches, _, _ = run.stepper.rollouts(qparams, step)
        assert len(scored) == gen_batches * len(run.seeds)
        for i, gen in enumerate(scored):
            streams[run.seeds[i % len(run.seeds)]][step, i // len(run.seeds)] = gen
    return streams


# The sampler's log-probs are f32 values whose last bits XLA:CPU rounds differently with the
# number of vmapped seeds (its rsqrt and reductions are vectorised over the whole batch; docs/rl.md
# "Runs: resuming, checkpoints, reproducibility", tools/seed_axis_bits.py): a few ulps of values
# of magnitude <= ~10 (1.4e-6 seen), which tokens drawn from them do not see.
LOGP_TOLERANCE = 1e-5


def _assert_same_rollouts(alone: dict, beside: dict, what: str) -> None:
    """Every generation batch the seed drew alone, it drew the same beside other seeds (which
    may make it draw more: a seed whose pool is full rides along until every pool is)."""
    assert set(alone) <= set(beside), what
    for at, gen in alone.items():
        other = beside[at]
        for name in ("prompt_ids_NxTp", "prompt_mask_NxTp", "answers_P", "response_NxTr", "lengths_N"):
            np.testing.assert_array_equal(getattr(other, name), getattr(gen, name), err_msg=f"{what}, {at}, {name}")
        np.testing.assert_allclose(other.logp_NxTr, gen.logp_NxTr, rtol=0, atol=LOGP_TOLERANCE, err_msg=f"{what}, {at}")


def test_a_seeds_rollouts_do_not_depend_on_the_seeds_beside_it(warmup_dir, tmp_path, monkeypatch):
    scored = _set_rewards(monkeypatch, lambda answers: answers % 2 == 1)
    inputs = run_inputs.load(_config(warmup_dir, tmp_path))
    alone = _rollouts(_config(warmup_dir, tmp_path / "one"), inputs, scored)
    pair = _rollouts(_config(warmup_dir, tmp_path / "two", seeds=2), inputs, scored)
    four = _rollouts(_config(warmup_dir, tmp_path / "four", seeds=4), inputs, scored)
    last_alone = _rollouts(_config(warmup_dir, tmp_path / "three", seed_offset=3), inputs, scored)
    # The case that matters happened: beside other seeds, seed 0 drew a generation batch it did
    # not need, before the last step (so the steps after it are tested too).
    assert any((step, 1) in four[0] and (step, 1) not in alone[0] for step in range(STEPS - 1)), sorted(alone[0])
    _assert_same_rollouts(alone[0], pair[0], "seed 0 alone and beside seed 1")
    _assert_same_rollouts(alone[0], four[0], "seed 0 alone and beside seeds 1-3")
    _assert_same_rollouts(pair[1], four[1], "seed 1 beside seed 0 and beside seeds 0, 2, 3")
    _assert_same_rollouts(last_alone[3], four[3], "seed 3 alone (seed_offset 3) and beside seeds 0-2")


def test_seed_k_of_two_arms_draws_the_same_prompts_whatever_their_generation_batches(warmup_dir, tmp_path, monkeypatch):
    """bf16 keeps every group (one generation batch per step), nvfp4 none (two per step): the
    arms' seed 0 still sees the same prompts at every (step, generation batch) both drew."""
    keep = {"flag": True}
    scored = _set_rewards(monkeypatch, lambda answers: np.full(len(answers), keep["flag"]))
    inputs = run_inputs.load(_config(warmup_dir, tmp_path))
    every_group_kept = _rollouts(_config(warmup_dir, tmp_path / "bf16"), inputs, scored)[0]
    keep["flag"] = False
    none_kept = _rollouts(_config(warmup_dir, tmp_path / "nvfp4", arm="nvfp4"), inputs, scored)[0]
    assert sorted(every_group_kept) == [(step, 0) for step in range(STEPS)]
    assert sorted(none_kept) == [(step, b) for step in range(STEPS) for b in (0, 1)]
    for at, gen in every_group_kept.items():
        for name in ("prompt_ids_NxTp", "prompt_mask_NxTp", "answers_P"):
            np.testing.assert_array_equal(getattr(none_kept[at], name), getattr(gen, name), err_msg=f"{at}, {name}")
