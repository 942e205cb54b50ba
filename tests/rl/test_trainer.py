"""The DAPO trainer end to end on the smoke preset: runs, golden metrics, invariants, resume.

The smoke warm-up is trained once per session (module fixture) and shared by every test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import configs
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import policy, sft, trainer

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# Keys that measure wall time: they legitimately differ between two identical runs.
TIMING_KEYS = ("time/", "throughput/")


def _smoke(warmup_dir, out, **overrides):
    return dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), out=str(out), **overrides)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_KEYS)}


def test_warmup_writes_checkpoint_config_and_accuracy_table(warmup_dir):
    meta = json.loads((warmup_dir / "sft_meta.json").read_text())
    assert meta["recipe"] == PrecisionRecipe.from_name("bf16").to_json()
    assert [row["difficulty"] for row in meta["accuracy"]] == [1, 2]
    assert (warmup_dir / "accuracy.md").exists()
    graphdef, params, _ = sft.load(warmup_dir)
    assert jax.tree.leaves(params)


def test_rl_smoke_logs_every_required_metric_per_seed(warmup_dir, tmp_path):
    config = _smoke(warmup_dir, tmp_path, arm="full", seeds=2)
    run = trainer.Trainer(config, progress=False)
    names = ("_sync", "_sample", "_update")
    before = {name: getattr(run, name)._cache_size() for name in names}  # forward programs are shared
    run.run()
    # Every program compiled at most once for the whole run (2 steps, 2 mini-batches, eval, old and
    # reference log-probs): a second entry means a retrace or re-lowering, e.g. from uncommitted inputs.
    for name in names:
        assert getattr(run, name)._cache_size() - before[name] <= 1, name
    required = ["step", "reward/mean", "population/accuracy", "population/reward_mean", "grad_norm/global",
                "updates/applied", "updates/empty", "ratio/first_minibatch_min", "clip_frac/dual", "mismatch/kl_k1", "mismatch/kl_k3",
                "mismatch/max_abs_logp_diff", "mismatch/routing_flip", "entropy", "clip_frac/upper", "clip_frac/lower",
                "kl_ref_k3", "response_length/mean", "quant/map4_frac", "time/step_s", "throughput/rollout_tok_s"]
    required += [f"grad_norm/{g}" for g in policy.GRAD_GROUPS]
    for seed in (0, 1):
        records = _records(tmp_path / "full" / f"seed{seed}" / "metrics.jsonl")
        assert [r["step"] for r in records] == [0, 1]
        for r in records:
            missing = [k for k in required if k not in r]
            assert not missing, missing
            assert np.isfinite(r["grad_norm/global"])
        assert {"eval/accuracy", "eval/sampled_accuracy", "eval/n"} <= set(records[-1])
        assert records[-1]["eval/n"] == config.eval_prompts
        updates = _records(tmp_path / "full" / f"seed{seed}" / trainer.UPDATES_FILE)
        assert [(u["step"], u["update"]) for u in updates] == [(s, m) for s in (0, 1) for m in range(config.mini_batches)]
        assert all(set(trainer.UPDATE_KEYS) <= set(u) for u in updates)
    assert (tmp_path / "full" / "config.json").exists() and (tmp_path / "full" / "done.json").exists()
    a, b = (_records(tmp_path / "full" / f"seed{s}" / "metrics.jsonl")[0] for s in (0, 1))
    assert a["reward/mean"] != b["reward/mean"] or a["response_length/mean"] != b["response_length/mean"]


def test_compile_tasks_compile_what_the_run_calls(warmup_dir, tmp_path):
    """After `compile_tasks` (the ablation runner runs them ahead, on other threads), a run with
    its eval compiles none of the four programs again: the abstract arguments match the real ones."""
    run = trainer.Trainer(_smoke(warmup_dir, tmp_path, arm="bf16", steps=1), progress=False)
    tasks = run.compile_tasks()
    assert len({key for key, _ in tasks}) == 3
    for _, task in tasks:
        task()
    compiled = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        run.run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert not {"jit(sync)", "jit(sample)", "jit(update)"} & set(compiled), compiled


def _mix_rewards(monkeypatch):
    """Score responses alternately right and wrong (overlong shaping kept): the smoke warm-up
    solves nothing, and a step whose groups are all dropped runs no update at all."""
    rewards = iter(np.tile(np.float32([1.0, -1.0]), 100_000))
    score = trainer.rollout.score

    def mixed_score(gen, group_size, max_new_tokens, overlong_buffer):
        correct, shaped = score(gen, group_size, max_new_tokens, overlong_buffer)
        mixed = np.array([next(rewards) for _ in range(correct.size)], np.float32).reshape(correct.shape)
        return mixed, mixed + (shaped - correct)

    monkeypatch.setattr(trainer.rollout, "score", mixed_score)


FORWARD_CLASSES = ("bf16", "nvfp4", "+46", "+hp", "full")  # one arm per distinct forward of the nine


def _first_step(warmup, out, monkeypatch, arm):
    """One trainer step of the smoke preset from `warmup` (rewards alternating): (records, updates)."""
    run = trainer.Trainer(_smoke(warmup, out, arm=arm, steps=1), progress=False)
    _mix_rewards(monkeypatch)
    _, records, updates = run.step(run._initial_state(), 0)
    return records, updates


def _assert_first_minibatch_on_policy(records, updates):
    first = updates[0][0]
    assert not first["empty"]
    assert first["ratio_max"] == 1.0 and first["ratio_min"] == 1.0, first
    assert records[0]["ratio/first_minibatch_mean"] == 1.0


@pytest.mark.parametrize("arm", FORWARD_CLASSES)
def test_golden_first_step_per_forward_class(warmup_dir, tmp_path, monkeypatch, arm):
    """Pins one RL step of the smoke preset per forward class (seed 0, rewards alternating, the
    warm-up's f32 compute) on CPU. f32, not bf16: bf16 compute rounds each partial sum, so its
    metrics move by ~1e-4 with the CPU's vector width and XLA:CPU's dot library (seen between two
    x86 machines), while f32 metrics agree to 1e-5 wherever XLA:CPU runs.

    If this fails after an INTENDED change to the model, quantizers, sampler, task, trainer or
    presets, update the numbers below (printed by the failing run); never to make a flaky run pass.
    """
    records, updates = _first_step(warmup_dir, tmp_path, monkeypatch, arm)
    _assert_first_minibatch_on_policy(records, updates)
    got = {k: records[0][k] for k in GOLDEN_KEYS}
    print(arm, got)
    for key in GOLDEN_KEYS:
        assert got[key] == pytest.approx(GOLDEN_BY_CLASS[arm][key], rel=1e-5, abs=1e-7), (arm, key, got[key])


GOLDEN_KEYS = ("reward/mean", "response_length/mean", "grad_norm/global", "loss/aux")
GOLDEN_BY_CLASS = {  # one RL step per forward class, f32 compute, rewards alternating
    "bf16": {"reward/mean": -0.375, "response_length/mean": 32.5, "grad_norm/global": 0.8601115942001343,
             "loss/aux": 1.062241554260254},
    "nvfp4": {"reward/mean": -0.375, "response_length/mean": 33.75, "grad_norm/global": 0.8736987113952637,
              "loss/aux": 1.060981035232544},
    "+46": {"reward/mean": -0.375, "response_length/mean": 35.125, "grad_norm/global": 0.802415132522583,
            "loss/aux": 1.0706920623779297},
    "+hp": {"reward/mean": -0.375, "response_length/mean": 33.75, "grad_norm/global": 0.8264734745025635,
            "loss/aux": 1.0627294778823853},
    "full": {"reward/mean": -0.25, "response_length/mean": 31.5, "grad_norm/global": 0.8610864877700806,
             "loss/aux": 1.0655304193496704},
}


# bf16: no quantizer; nvfp4: the plain NVFP4 quantizers; full: the 4/6 quantizers and the BF16 layers
# (the forwards of +46 and +hp are parts of full's, whose golden f32 step above pins them too)
BF16_RATIO_CLASSES = ("bf16", "nvfp4", "full")


@pytest.mark.parametrize("arm", BF16_RATIO_CLASSES)
def test_importance_ratio_is_exactly_one_on_the_first_minibatch_in_bf16(warmup_dir, tmp_path, monkeypatch, arm):
    """On-policy: the first update's forward recomputes exactly the old log-probs (ratio == 1 on
    every token), with bf16 compute: the old log-probs come from the update program itself, at the
    mini-batch's shapes. One trainer step on a warm-up whose model computes in bf16."""
    bf16_dir = tmp_path / "warmup_bf16"
    bf16_dir.mkdir()
    meta = json.loads((warmup_dir / "sft_meta.json").read_text())
    meta["model_config"]["dtype"] = "bfloat16"
    (bf16_dir / "sft_meta.json").write_text(json.dumps(meta))
    (bf16_dir / "checkpoint").symlink_to(warmup_dir / "checkpoint")
    _assert_first_minibatch_on_policy(*_first_step(bf16_dir, tmp_path / "rl", monkeypatch, arm))


def test_an_empty_mini_batch_leaves_weights_and_optimizer_untouched(warmup_dir, tmp_path):
    """The smoke warm-up solves nothing, so dynamic sampling drops every group and both
    mini-batches are empty: no update may run (Adam would otherwise step on the load-balancing
    loss and its momentum alone)."""
    run = trainer.Trainer(_smoke(warmup_dir, tmp_path, arm="bf16", steps=1), progress=False)
    state = run._initial_state()
    new_state, records, updates = run.step(state, 0)
    assert records[0]["population/accuracy"] == 0.0
    assert records[0]["updates/applied"] == 0 and records[0]["updates/empty"] == 2
    assert all(u["empty"] and u["skipped"] for u in updates[0])
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sampler_and_trainer_log_probs_agree_at_a_temperature(warmup_dir):
    """Both score softmax(logits / T): at T = 0.5 the sampler's log-probs of its own tokens are the
    trainer's (f32 compute: up to reduction order), and far from the T = 1 log-probs."""
    from fp4rl.model import sampler as model_sampler

    graphdef, params, _ = sft.load(warmup_dir)
    recipe = PrecisionRecipe.from_name("bf16")
    prompt_len, new = 8, 12
    prompts = jax.random.randint(jax.random.key(0), (4, prompt_len), 3, 60)
    cfg = model_sampler.SamplerConfig(max_new_tokens=new, temperature=0.5, top_p=1.0, eos_id=2, pad_id=0)
    out = model_sampler.generate(graphdef, params, prompts, recipe, cfg, key=jax.random.key(1),
                                 prompt_lengths_B=jnp.full(4, prompt_len))
    tokens = jnp.concatenate([prompts, out.tokens], 1)
    valid = jnp.concatenate([jnp.ones_like(prompts, bool), jnp.arange(new)[None] < out.lengths[:, None]], 1)
    mask = np.asarray(valid[:, prompt_len:])
    at_half, _ = policy.response_logprobs_fn(graphdef, recipe, prompt_len, temperature=0.5)(params, tokens, valid)
    at_one, _ = policy.response_logprobs_fn(graphdef, recipe, prompt_len, temperature=1.0)(params, tokens, valid)
    np.testing.assert_allclose(np.asarray(at_half)[mask], np.asarray(out.logprobs)[mask], atol=1e-5)
    assert np.abs(np.asarray(at_one)[mask] - np.asarray(out.logprobs)[mask]).max() > 1e-2


def test_resume_refuses_a_checkpoint_of_another_recipe(warmup_dir, tmp_path):
    config = _smoke(warmup_dir, tmp_path, arm="full", steps=2)
    first = trainer.Trainer(dataclasses.replace(config, steps=1), progress=False)
    first.run()
    resumed = trainer.Trainer(config, progress=False)
    resumed.recipe = dataclasses.replace(resumed.recipe, keep_last_fraction=0.3)
    with pytest.raises(ValueError, match="trained under recipe.*but this run asks for"):
        resumed.run()


# The resumed state (parameters, optimizer, data and sampling RNG, step, logs) is the same for every
# arm; bf16 compiles fastest, and its smoke programs are those of the other bf16 smoke tests (the
# session's persistent compilation cache serves them to the subprocesses).
RESUME_ARM = "bf16"


def _rl_command(warmup_dir, out, steps):
    return [sys.executable, "-m", "experiments.rl", "--preset", "smoke", f"--init={warmup_dir}", f"--out={out}",
            "--arm", RESUME_ARM, f"--steps={steps}", "--checkpoint_every=1"]


def test_kill_and_resume_reproduces_an_uninterrupted_run(warmup_dir, tmp_path):
    """A real SIGKILL mid-run; the restarted command continues, loses no step, logs none twice,
    and its metrics equal an uninterrupted run's (bitwise on CPU, timing keys aside)."""
    steps = 4
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    reference = tmp_path / "uninterrupted"
    subprocess.run(_rl_command(warmup_dir, reference, steps), cwd=REPO, env=env, check=True, capture_output=True)

    resumed = tmp_path / "resumed"
    metrics = resumed / RESUME_ARM / "seed0" / "metrics.jsonl"
    proc = subprocess.Popen(_rl_command(warmup_dir, resumed, steps), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be killed; lengthen it"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (resumed / RESUME_ARM / "done.json").exists()
    subprocess.run(_rl_command(warmup_dir, resumed, steps), cwd=REPO, env=env, check=True, capture_output=True)

    want = [_without_timing(r) for r in _records(reference / RESUME_ARM / "seed0" / "metrics.jsonl")]
    got = [_without_timing(r) for r in _records(metrics)]
    assert [r["step"] for r in got] == list(range(steps))
    assert got == want


def test_expert_gemm_override_rebuilds_the_model_structure_only(warmup_dir, tmp_path):
    """`expert_gemm` swaps the grouped-GEMM backend of the warm-up's model (its parameters fit as
    they are); a typo names the valid backends."""
    with pytest.raises(ValueError, match="valid options"):
        _smoke(warmup_dir, tmp_path, expert_gemm="cutlass")
    default = trainer.Trainer(_smoke(warmup_dir, tmp_path / "a"), progress=False)
    run = trainer.Trainer(_smoke(warmup_dir, tmp_path / "b", expert_gemm="mosaic_interpret"), progress=False)
    assert default.model_config.expert_gemm == "xla" and run.model_config.expert_gemm == "mosaic_interpret"
    gemms = lambda graphdef: {n.expert_gemm for _, n in nnx.graph.iter_graph(nnx.merge(graphdef, run.ref_params))  # noqa: E731
                              if hasattr(n, "expert_gemm")}
    assert gemms(default.graphdef) == {"xla"} and gemms(run.graphdef) == {"mosaic_interpret"}
