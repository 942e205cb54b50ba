"""RLConfig.trim_padding: the update on the columns a step uses (`fp4rl.rl.column_trim`)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp4rl import configs
from fp4rl.model import ModelConfig, init
from fp4rl.rl import column_trim, policy, trainer

CFG = ModelConfig.from_name("tiny")
GRAPHDEF, PARAMS = init(CFG, 0)
N, P, TR = 8, 6, 6  # rows and the used prompt / response widths
PAD_P, PAD_TR = 4, 5  # padding columns around them in the untrimmed layout


def test_bucket_rounds_up_to_a_power_of_two_within_the_limit():
    assert [column_trim.bucket(n, 1024) for n in (1, 64, 65, 200, 1024)] == [64, 64, 128, 256, 1024]
    assert column_trim.bucket(700, 7168) == 1024 and column_trim.bucket(5000, 7168) == 7168
    assert column_trim.bucket(3, 48) == 48  # a layout narrower than the smallest bucket stays whole
    with pytest.raises(ValueError, match="do not fit"):
        column_trim.bucket(49, 48)


def _rows(prompt_lengths, response_lengths, prompt_len=10, max_new=12):
    """training_arrays-shaped dict: left-padded prompts, right-padded responses."""
    n = len(prompt_lengths)
    valid = np.zeros((n, prompt_len + max_new), bool)
    for r, (p, t) in enumerate(zip(prompt_lengths, response_lengths)):
        valid[r, prompt_len - p : prompt_len + t] = True
    tokens = np.where(valid, np.arange(prompt_len + max_new)[None] + 100, 0).astype(np.int32)
    resp = valid[:, prompt_len:]
    return {"tokens": tokens, "valid": valid, "response_mask": resp.copy(), "logp_sampler": np.where(resp, -1.0, 0.0),
            "advantages": np.ones(n, np.float32), "router_topk": np.zeros((2, n, max_new, 2), np.int32),
            "shaped": np.zeros(n), "used": np.ones(n, bool)}


def test_trim_keeps_every_real_token_and_cuts_the_padding():
    seeds = [_rows([3, 5], [2, 7]), _rows([4, 1], [9, 1])]
    window = column_trim.used_window(seeds, 10, 12)
    assert window == (10, 12)  # the smallest bucket (64) exceeds this layout: nothing to cut
    small = column_trim.Window(prompt=5, response=9)
    cut = column_trim.trim(seeds[0], 10, small)
    assert cut["tokens"].shape == (2, 14) and cut["response_mask"].shape == (2, 9)
    assert cut["router_topk"].shape == (2, 2, 9, 2)
    np.testing.assert_array_equal(cut["tokens"][cut["valid"]], seeds[0]["tokens"][seeds[0]["valid"]])
    np.testing.assert_array_equal(cut["valid"][:, 5:].sum(1), [2, 7])  # responses still start at the prompt width
    with pytest.raises(AssertionError, match="drops real tokens"):
        column_trim.trim(seeds[0], 10, column_trim.Window(prompt=4, response=9))


def _batch(pad_p: int, pad_tr: int):
    """The same rows laid out with `pad_p` more prompt columns and `pad_tr` more response columns."""
    rng = np.random.default_rng(0)
    valid = np.ones((N, P + TR), bool)
    valid[::3, :2] = False  # some rows' own left padding
    valid[1::2, P + 4:] = False  # short responses
    tokens = rng.integers(3, CFG.vocab_size, (N, P + TR))
    rmask = valid[:, P:] & (rng.random((N, TR)) < 0.9)
    f32 = lambda *shape: rng.normal(-3.0, 0.5, shape).astype(np.float32)  # noqa: E731
    wide = lambda x, value: np.pad(x, ((0, 0), (pad_p, pad_tr)), constant_values=value)  # noqa: E731
    resp = lambda x, value: np.pad(x, ((0, 0), (0, pad_tr)), constant_values=value)  # noqa: E731
    return policy.Batch(jnp.asarray(wide(tokens, 0), jnp.int32), jnp.asarray(wide(valid, False)),
                        jnp.asarray(resp(rmask, False)), jnp.asarray(resp(f32(N, TR), 0.0)),
                        jnp.asarray(resp(f32(N, TR), 0.0)), jnp.asarray(resp(f32(N, TR), 0.0)),
                        jnp.asarray(rng.normal(size=(N,)), jnp.float32))


def _update(recipe: str, pad_p: int, pad_tr: int):
    optimizer = optax.sgd(1.0)  # the step moves each parameter by its gradient (test_micro_batch.py)
    masks = policy.grad_group_masks(PARAMS, CFG.num_layers)
    fns = policy.make_functions(GRAPHDEF, policy.PrecisionRecipe.from_name(recipe), optimizer, policy.LossConfig(),
                                0.01, P + pad_p, masks, "reference")
    update = jax.jit(lambda p, o, b: fns["update"](p, o, b, jax.random.key(1), jnp.asarray(True), True))
    return update(PARAMS, optimizer.init(PARAMS), _batch(pad_p, pad_tr))


@pytest.mark.parametrize("recipe", ["bf16", "full"])
def test_the_update_on_the_used_columns_is_the_update_on_all(recipe):
    # Every real token sees the same keys (padding keys are masked: exact zeros in the softmax sum)
    # and its activations have their own scales, so the two programs differ in the order of f32
    # sums only (bounds as in test_micro_batch.py). Routing and the loss's token set are equal.
    cut, whole = _update(recipe, 0, 0), _update(recipe, PAD_P, PAD_TR)
    np.testing.assert_allclose(np.asarray(cut[2]["logp"]), np.asarray(whole[2]["logp"])[:, :TR], rtol=0, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(cut[2]["router_topk"]), np.asarray(whole[2]["router_topk"])[:, :, :TR])
    for name in ("loss/total", "loss/policy", "loss/aux", "clip_frac_upper", "approx_kl", "ratio_mean", "entropy",
                 "grad_norm/global"):
        np.testing.assert_allclose(np.asarray(cut[2][name]), np.asarray(whole[2][name]), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    assert float(whole[2]["grad_norm/global"]) > 1e-3
    for a, b in zip(jax.tree.leaves(cut[0]), jax.tree.leaves(whole[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def test_a_trimmed_run_trains_on_fewer_columns_and_samples_the_same(warmup_dir, tmp_path, monkeypatch):
    # The smoke layout (32 + 48 columns) is narrower than the smallest bucket (64): a smaller bucket
    # and a wider prompt layout than its prompts need (their left padding is then cut).
    monkeypatch.setattr(column_trim, "SMALLEST", 8)
    smoke = dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), arm="bf16", steps=1, prompt_len=64)
    runs = {}
    for name, trim in (("whole", False), ("cut", True)):
        trainer.Trainer(dataclasses.replace(smoke, out=str(tmp_path / name), trim_padding=trim), progress=False).run()
        lines = (tmp_path / name / "bf16" / "seed0" / "metrics.jsonl").read_text().splitlines()
        runs[name] = [json.loads(line) for line in lines]
    full_width = smoke.prompt_len + smoke.max_new_tokens
    assert all(r["update/columns"] == full_width for r in runs["whole"])
    assert all(r["update/columns"] < full_width for r in runs["cut"])
    first_whole, first_cut = runs["whole"][0], runs["cut"][0]
    # Step 0 samples from the same policy with the same keys: the same responses and rewards.
    for name in ("population/reward_mean", "reward/mean", "response_length/mean", "response_length/max"):
        assert first_cut[name] == first_whole[name], name
    for name in ("loss/policy", "grad_norm/global", "entropy", "mismatch/mean_abs_logp_diff"):
        np.testing.assert_allclose(first_cut[name], first_whole[name], rtol=1e-4, atol=1e-6, err_msg=name)
