"""Resuming an RL run: refused under other settings unless forced (and then recorded), never
shortened, logged to train.log and TensorBoard without lost or doubled steps; non-finite weights
are never trained from or saved; a bad --out fails before any work.

The smoke warm-up is trained once for the module; eval is off in every run (it is not what is tested).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import configs
from fp4rl.config_cli import parse
from fp4rl.rl import policy, resume, sft, trainer
from fp4rl.rl.checkpoint import Checkpointer
from tests.rl.test_metrics_log import tensorboard_scalars

pytestmark = pytest.mark.slow


def _smoke(warmup_dir, out, **overrides):
    return dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), out=str(out), eval_every=0,
                               **overrides)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_resume_checks_records_and_logs_setting_changes(warmup_dir, tmp_path):
    config = _smoke(warmup_dir, tmp_path, arm="bf16", steps=1)
    trainer.Trainer(config, progress=False).run()
    arm = tmp_path / "bf16"
    before = json.loads((arm / "config.json").read_text())

    # Other settings: refused before anything compiles, every differing setting named.
    changed = dataclasses.replace(config, steps=2, optim=dataclasses.replace(config.optim, lr=1e-3),
                                  loss=dataclasses.replace(config.loss, kind="grpo"))
    with pytest.raises(ValueError, match=r"loss\.kind: \"dapo\" -> \"grpo\", optim\.lr: 0\.0001 -> 0\.001;.*resume=force"):
        trainer.Trainer(changed, progress=False)
    # The seeds shape the checkpoint: not even force may change them.
    with pytest.raises(ValueError, match=r"cannot resume with seeds: 1 -> 2 \(seeds: the checkpoint holds one state per seed\)"):
        trainer.Trainer(dataclasses.replace(changed, seeds=2, resume="force"), progress=False)
    assert json.loads((arm / "config.json").read_text()) == before

    # Forced: the run continues under the new settings and the directory says so.
    forced = dataclasses.replace(changed, loss=config.loss, resume="force")
    trainer.Trainer(forced, progress=False).run()
    assert json.loads((arm / "config.json").read_text())["rl_config"] == trainer.settings(forced)
    (line,) = [json.loads(x) for x in (arm / resume.CHANGES_FILE).read_text().splitlines()]
    assert line["step"] == 1 and line["forced"] == ["optim.lr"]
    assert line["changes"] == {"optim.lr": [1e-4, 1e-3], "steps": [1, 2]}
    assert _steps(arm / "seed0" / "metrics.jsonl") == [0, 1]
    # TensorBoard: every step once (the resumed writer purges from step 1 on).
    assert [s for s, _ in tensorboard_scalars(arm / "seed0" / "tb", "reward/mean")] == [0, 1]
    log = (arm / "train.log").read_text()
    assert "step 0: the first step of this process compiles" in log
    assert "resuming from step 1 (checkpoint of step 0" in log and "step 1: the first step of this process compiles" in log
    assert "settings changed on resume" in log and "optim.lr: 0.0001 -> 0.001" in log

    # A run is never shortened below its checkpoint (the steps past it would stay in the record).
    with pytest.raises(ValueError, match="steps=1 is fewer than the 2 steps of the checkpoint"):
        trainer.Trainer(dataclasses.replace(forced, steps=1), progress=False).run()


def test_seeds_differing_from_the_run_directory_are_named(warmup_dir, tmp_path):
    config = _smoke(warmup_dir, tmp_path, arm="bf16", steps=1)
    run = trainer.Trainer(config, progress=False)
    state = run._initial_state()
    run.ckpt.save(0, state, {"step": 0, "recipe": run.recipe.to_json()})
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(run._config_record()))
    with pytest.raises(ValueError, match=r"config\.json: cannot resume with seeds: 1 -> 3"):
        trainer.Trainer(dataclasses.replace(config, seeds=3), progress=False)


def test_a_checkpoint_with_data_iterator_states_resumes_and_says_they_are_not_read(warmup_dir, tmp_path):
    """A checkpoint may hold the positions of data iterators (`data_states`), which the trainer
    does not read: a seed's prompts are read at each step's own positions (data.step_batch_index).
    Such a checkpoint resumes, and train.log says that its positions are not read."""
    config = _smoke(warmup_dir, tmp_path, arm="bf16", steps=1)
    run = trainer.Trainer(config, progress=False)
    positions = [{"next_index": 2}]  # grain's iterator state: the next batch position
    run.ckpt.save(0, run._initial_state(), {"step": 0, "data_states": positions, "recipe": run.recipe.to_json(),
                                            "layer_map": run.layer_map})
    run.ckpt.close()
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(run._config_record()))
    trainer.Trainer(dataclasses.replace(config, steps=2), progress=False).run()
    assert _steps(tmp_path / "bf16" / "seed0" / "metrics.jsonl") == [1]
    log = (tmp_path / "bf16" / "train.log").read_text()
    assert "checkpoint step 0 holds data-iterator positions, which this trainer does not read" in log, log
    assert "resuming from step 1" in log


def _nan_warmup(warmup_dir: Path, out: Path) -> Path:
    graphdef, params, meta = sft.load(warmup_dir)
    first = jax.tree.leaves(params)[0]
    params = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan) if x is first else x, params)
    ckpt = Checkpointer(out / "checkpoint")
    ckpt.save(1, params, {"kind": "sft"})
    ckpt.close()
    (out / sft.META_FILE).write_text(json.dumps(meta))
    return out


def test_a_non_finite_warm_up_is_refused_before_training(warmup_dir, tmp_path):
    init = _nan_warmup(warmup_dir, tmp_path / "nan_sft")
    run = trainer.Trainer(_smoke(init, tmp_path / "rl", arm="bf16", steps=1), progress=False)
    with pytest.raises(FloatingPointError, match=f"non-finite parameters in the warm-up {init}"):
        run.run()
    assert not run.ckpt.steps()


def test_non_finite_weights_after_a_step_stop_the_run_unsaved(warmup_dir, tmp_path, monkeypatch):
    """Whatever on_nonfinite says ("skip" keeps finite weights finite), a step that leaves a
    non-finite weight stops the run before its checkpoint; its metrics line is kept."""
    def poisoned_step(self, state, step):
        params = jax.tree.map(lambda x: x * jnp.nan, state["params"])
        record = {"step": step, "reward/mean": 0.0, "grad_norm/global": math.nan, "time/step_s": 0.0, "nonfinite": True}
        return {"params": params, "opt_state": state["opt_state"]}, [record], [[]]

    monkeypatch.setattr(trainer.Trainer, "step", poisoned_step)
    run = trainer.Trainer(_smoke(warmup_dir, tmp_path, arm="bf16", steps=2, on_nonfinite="skip"), progress=False)
    with pytest.raises(FloatingPointError, match=r"non-finite parameters in the weights after step 0 \(arm bf16, seed\(s\) \[0\]\)"):
        run.run()
    assert not run.ckpt.steps() and not (tmp_path / "bf16" / "done.json").exists()
    assert _steps(tmp_path / "bf16" / "seed0" / "metrics.jsonl") == [0]
    assert "stopped: FloatingPointError" in (tmp_path / "bf16" / "train.log").read_text()


def test_an_out_that_is_a_file_or_not_writable_fails_at_start(warmup_dir, tmp_path):
    a_file = tmp_path / "results.txt"
    a_file.write_text("")
    with pytest.raises(ValueError, match=f"--out={a_file} is a file"):
        trainer.Trainer(_smoke(warmup_dir, a_file), progress=False)
    with pytest.raises(ValueError, match=f"--out={a_file / 'rl'} lies under the file {a_file}"):
        trainer.Trainer(_smoke(warmup_dir, a_file / "rl"), progress=False)
    # /proc refuses new entries even to root, so this holds whoever runs the tests.
    with pytest.raises(ValueError, match="--out=/proc/fp4rl_out is not writable"):
        trainer.Trainer(_smoke(warmup_dir, "/proc/fp4rl_out"), progress=False)


@pytest.mark.parametrize("option, message", [
    ("--optim.lr=nan", "optim.lr=nan must be a finite number > 0"),
    ("--optim.lr=0", "optim.lr=0.0 must be a finite number > 0"),
    ("--impl=cuda", "impl='cuda'; valid options: ('auto', 'reference', 'triton', 'mosaic')"),
    ("--temperature=-1", "temperature=-1.0 must be a finite number > 0"),
    ("--resume=always", "--resume='always'; valid options: check, force"),
])
def test_bad_settings_are_refused_when_the_config_is_built(option, message):
    with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}"):
        parse(trainer.RLConfig, ["--preset", "smoke", option], configs.RL_PRESETS)


def test_the_warm_up_refuses_a_nan_learning_rate():
    with pytest.raises(ValueError, match="lr=nan must be a finite number > 0"):
        parse(sft.SFTConfig, ["--lr=nan"])


def test_an_update_with_a_non_finite_learning_rate_is_flagged_and_skipped(warmup_dir, tmp_path, monkeypatch):
    """The update's own check covers the update, not only loss and gradient: with a NaN LR
    (OptimConfig refuses one; here the optimizer is built around it) the loss and gradient are
    finite, the update is not, and it is skipped."""
    make = policy.make_optimizer
    monkeypatch.setattr(policy, "make_optimizer", lambda lr, *args: make(float("nan"), *args))
    run = trainer.Trainer(_smoke(warmup_dir, tmp_path, arm="bf16", steps=1), progress=False)
    from tests.rl.test_trainer import _mix_rewards

    _mix_rewards(monkeypatch)  # the smoke warm-up solves nothing: without mixed rewards no update runs
    state = run._initial_state()
    new_state, records, updates = run.step(state, 0)
    ran = [u for u in updates[0] if not u["empty"]]
    assert ran and all(u["nonfinite"] and u["skipped"] for u in ran)
    assert all(np.isfinite(u["loss/policy"]) and np.isfinite(u["grad_norm/global"]) for u in ran)
    for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(new_state["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
