"""RLConfig.overlap changes when the host's work runs beside the device's, never a value.

Overlap dispatches generation batch b+1 before batch b is scored (discarded when the pools are full
after b) and the next step's sync and first sampler call before this step's records are built.
Each arm runs 4 steps x 2 seeds of the smoke preset with overlap on and off: every metric but the
timings, every updates.jsonl line and the final state (params and optimizer) must be the same bytes,
with evaluations (steps 1 and 3, and the initial one) and a checkpoint after every step between.
`on_nonfinite=stop` still stops before the next step's update: overlap starts that step's
sync and sampler, never its update, before the records that decide.

Rewards are scripted per group (`test_seed_pairing._set_rewards`) so that dynamic sampling has
something to decide: with up to 3 generation batches, step 0 fills every pool from its first batch
(the speculative second one is discarded), steps 1 and 2 from their second (the third is
discarded), and step 3 draws all three and still has a pool short (nothing to speculate on).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from fp4rl import configs
from fp4rl.rl import policy, trainer
from fp4rl.rl.checkpoint import Checkpointer
from tests.rl.test_seed_pairing import _set_rewards

pytestmark = pytest.mark.slow
STEPS, MAX_GEN_BATCHES = 4, 3
TIMING_KEYS = ("time/", "throughput/")  # wall time differs between two identical runs


def _config(warmup_dir, out, arm, overlap):
    return dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), out=str(out), arm=arm, seeds=2,
                               steps=STEPS, max_gen_batches=MAX_GEN_BATCHES, overlap=overlap)


def _lines(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING_KEYS)}
            for line in path.read_text().splitlines()]


def _run(config, monkeypatch):
    """(history, events, sampler dispatches, final state) of a whole run. `events`: ("begin", step)
    when a step's sync and first sampler call were dispatched, ("records", step) when its records
    were built."""
    run = trainer.Trainer(config, progress=False)
    events, dispatches = [], []
    begin, dispatch, build = run.begin_step, run.stepper.dispatch, trainer.step_records.build

    def logged_begin(params, step):
        events.append(("begin", step))
        return begin(params, step)

    def logged_build(outputs, *args):
        events.append(("records", outputs.step))
        return build(outputs, *args)

    def counted_dispatch(qparams, step, b):
        dispatches.append((step, b))
        return dispatch(qparams, step, b)

    run.begin_step, run.stepper.dispatch = logged_begin, counted_dispatch
    with monkeypatch.context() as patch:
        patch.setattr(trainer.step_records, "build", logged_build)
        history = run.run()
    ckpt = Checkpointer(run.dir / "checkpoint")
    state, _ = ckpt.restore(STEPS - 1, run._initial_state())
    ckpt.close()
    return history, events, dispatches, state


@pytest.mark.parametrize("arm", ["bf16", "nvfp4"])
def test_overlap_computes_what_a_run_without_it_computes(warmup_dir, tmp_path, monkeypatch, arm):
    scored = _set_rewards(monkeypatch, lambda answers: np.isin(answers % 5, (1, 2, 3)))
    runs = {overlap: _run(_config(warmup_dir, tmp_path / str(overlap), arm, overlap), monkeypatch)
            for overlap in (False, True)}
    (plain, plain_events, plain_dispatches, plain_state), (ahead, events, dispatches, state) = runs[False], runs[True]

    gen_batches = [r["dapo/gen_batches"] for r in plain[0]]
    assert gen_batches == [1, 2, 2, 3], "the scripted rewards no longer exercise every way a step's rollouts end"
    assert plain[0][3]["dapo/filled_frac"] < 1 or plain[1][3]["dapo/filled_frac"] < 1
    assert len(scored) == 2 * 2 * sum(gen_batches)  # both runs, both seeds: a discarded batch is never scored
    # Without overlap each batch is dispatched when needed; with it, one more per step unless the
    # step drew its last allowed batch, and the next step starts before this step's records.
    assert plain_dispatches == [(s, b) for s, n in enumerate(gen_batches) for b in range(n)]
    assert dispatches == [(s, b) for s, n in enumerate(gen_batches) for b in range(min(n + 1, MAX_GEN_BATCHES))]
    assert plain_events == [(kind, s) for s in range(STEPS) for kind in ("begin", "records")]
    assert events == [("begin", 0)] + [e for s in range(STEPS) for e in
                                       ([("begin", s + 1)] if s + 1 < STEPS else []) + [("records", s)]]

    for seed in (0, 1):
        for name in ("metrics.jsonl", trainer.UPDATES_FILE):
            want = _lines(tmp_path / "False" / arm / f"seed{seed}" / name)
            assert _lines(tmp_path / "True" / arm / f"seed{seed}" / name) == want, (seed, name)
        assert [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in ahead[seed]] == \
            [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in plain[seed]]
        assert "eval/accuracy" in ahead[seed][1] and "eval/initial_accuracy" in ahead[seed][0]
        for record in ahead[seed] + plain[seed]:
            assert 0 < record["time/rollout_s"] <= record["time/step_s"]
    want, got = jax.tree.leaves(plain_state), jax.tree.leaves(state)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("overlap", [False, True])
def test_on_nonfinite_stop_stops_before_the_next_steps_update(warmup_dir, tmp_path, monkeypatch, overlap):
    """A NaN learning rate (OptimConfig refuses one; the optimizer is built around it here) makes
    step 0's updates non-finite; under `stop` they are applied and the run stops after the step's
    records, with no update of step 1 queued, its metrics line kept and nothing saved."""
    make = policy.make_optimizer
    monkeypatch.setattr(policy, "make_optimizer", lambda lr, *args: make(float("nan"), *args))
    _set_rewards(monkeypatch, lambda answers: np.ones(len(answers), bool))  # every group kept: updates run
    config = dataclasses.replace(_config(warmup_dir, tmp_path, "bf16", overlap), seeds=1, steps=2, eval_every=0,
                                 on_nonfinite="stop")
    run = trainer.Trainer(config, progress=False)
    update, begun, applied = run.programs.update, [], []

    def counted_update(params, opt_state, batch, key, apply):
        applied.append(bool(apply))
        return update(params, opt_state, batch, key, apply)

    begin = run.begin_step
    run.programs.update = counted_update
    run.begin_step = lambda params, step: begun.append(step) or begin(params, step)
    with pytest.raises(FloatingPointError, match="non-finite loss, gradient or update at step 0 of arm bf16"):
        run.run()
    assert applied.count(True) == config.mini_batches  # step 0's updates only
    assert begun == ([0, 1] if overlap else [0])  # under overlap step 1 was started, not updated
    assert not run.ckpt.steps()
    assert [r["step"] for r in _lines(tmp_path / "bf16" / "seed0" / "metrics.jsonl")] == [0]
