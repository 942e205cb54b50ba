"""Batch scaling, the FP4-All-the-Way yardstick, norm terms and the per-group rule of the gradient
measurements, on synthetic per-batch gradients whose Gram matrices are exact."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from fp4rl.analysis import batch_scaling as bs
from fp4rl.analysis import gradient_report as gr

GROUPS = ["experts", "rest", "all"]


def synthetic_raw(batches=24, dim=400, noise=1.0, signal=0.3, coherent=None, incoherent=None, seed=0, tokens=1000):
    """A measurement of "bf16" and recipes "r" + named ones whose per-batch gradients are known:
    g_b = mu + xi_b (BF16), e_b = c + eps_b (the recipe's error), in two disjoint groups of `dim`
    coordinates ("experts", "rest") and their union ("all"). coherent / incoherent: recipe ->
    (experts, rest) scales of c and eps."""
    coherent = {"r": (0.05, 0.05)} if coherent is None else coherent
    incoherent = {"r": (0.1, 0.1)} if incoherent is None else incoherent
    rng = np.random.default_rng(seed)
    mu = signal * rng.normal(size=2 * dim) / math.sqrt(2 * dim)
    g = mu + noise * rng.normal(size=(batches, 2 * dim)) / math.sqrt(2 * dim)
    halves = [slice(0, dim), slice(dim, 2 * dim), slice(0, 2 * dim)]

    def gram(x):
        return np.stack([x[:, h] @ x[:, h].T for h in halves])

    def sq(x):
        return np.stack([np.sum(x[:, h] ** 2, 1) for h in halves], 1)

    def dots(x, y):
        return np.stack([np.sum(x[:, h] * y[:, h], 1) for h in halves], 1)

    def entry(grad, ref):
        return {"cmp": {"bf16": {"err_sq": sq(grad - ref), "dot0": dots(grad, ref), "g0_sq": sq(grad), "ref_sq": sq(ref)},
                        "ste": {"err_sq": np.zeros((batches, 3)), "dot0": sq(grad), "g0_sq": sq(grad), "ref_sq": sq(grad)}},
                "sr_var": np.zeros((batches, 3)), "ratio_dev": np.zeros(batches)}

    names = list(coherent)
    per_batch, gram_diff = {"bf16": entry(g, g)}, {"bf16": {"bf16": gram(g - g), "ste": gram(g - g)}}
    for name in names:
        scale = np.r_[np.full(dim, coherent[name][0]), np.full(dim, coherent[name][1])]
        iscale = np.r_[np.full(dim, incoherent[name][0]), np.full(dim, incoherent[name][1])]
        c = scale * rng.normal(size=2 * dim) / math.sqrt(dim)
        e = c + iscale * rng.normal(size=(batches, 2 * dim)) / math.sqrt(dim)
        per_batch[name] = entry(g + e, g)
        gram_diff[name] = {"bf16": gram(e), "ste": gram(np.zeros_like(e))}
    sources = ["bf16", *names]
    return {"groups": GROUPS, "reference": "bf16", "batches": batches, "lrs": [1e-5, 1e-4], "recipes": sources,
            "sources": sources, "refs_of": {s: {"bf16": "bf16", "ste": s} for s in sources},
            "sr_keys": {s: 1 for s in sources}, "forward_class": {s: s for s in sources},
            "per_batch": per_batch, "gram_diff": gram_diff, "gram_ref": {s: gram(g if s == "bf16" else g + 0) for s in sources},
            "kl": {s: np.tile([1e-3, 3e-3], (batches, 1)) for s in sources}, "mismatch": {}, "sketched_groups": [],
            "rollouts": {"accuracy": [0.4] * batches, "loss_tokens": [tokens] * batches, "gen_batches": [1] * batches,
                         "kept_group_frac": [1.0] * batches}}, g, {n: per_batch[n] for n in names}


def test_mean_of_k_batches_matches_every_k_subset():
    """The closed forms average (1/k^2) sum_ij <x_i, x_j> over every k-subset of the B batches exactly."""
    rng = np.random.default_rng(1)
    e, g = rng.normal(size=(6, 30)) + 0.2, rng.normal(size=(6, 30)) + 0.5
    m = bs.moments(np.sum(e**2, 1), e @ e.T, g @ g.T, np.ones((1, 6)))
    for k in range(1, 7):
        subsets = list(itertools.combinations(range(6), k))
        err = np.mean([np.sum(e[list(s)].mean(0) ** 2) for s in subsets])
        sig = np.mean([np.sum(g[list(s)].mean(0) ** 2) for s in subsets])
        assert bs.error_at(m, k)[0] == pytest.approx(err, rel=1e-12), k
        assert bs.yardstick_at(m, k)[0] ** 2 == pytest.approx(sig / err, rel=1e-12), k
    # the noise floor of k batches: the unbiased variance of one batch over k
    assert bs.noise_floor_at(m, 3)[0] == pytest.approx(np.var(g, 0, ddof=1).sum() / 3)
    assert m["Sd"][0] == pytest.approx(m["S"][0] + m["V"][0])


def test_components_reproduce_the_curves_and_threshold_crossing():
    rng = np.random.default_rng(2)
    e, g = rng.normal(size=(10, 50)) * 0.3 + 0.1, rng.normal(size=(10, 50)) + 0.4
    m = bs.moments(np.sum(e**2, 1), e @ e.T, g @ g.T, np.ones((1, 10)))
    c = bs.components(m, tokens_per_batch=500.0)
    for k in (1, 3, 10, 40):
        assert bs.noise_fraction_tokens(c, 500.0 * k)[0] == pytest.approx(bs.noise_fraction_at(m, k)[0], rel=1e-9)
        assert bs.yardstick_tokens(c, 500.0 * k)[0] == pytest.approx(bs.yardstick_at(m, k)[0], rel=1e-9)
    t_star = bs.tokens_to_threshold(c, 0.5)[0]
    assert bs.noise_fraction_tokens(c, t_star)[0] == pytest.approx(0.5, rel=1e-9)
    assert bs.tokens_to_threshold({"A": np.array([0.6]), "b2": np.array([0.1]), "Ts": np.array([1.0])}, 0.5)[0] == 0
    assert bs.tokens_to_threshold({"A": np.array([0.1]), "b2": np.array([-0.01]), "Ts": np.array([1.0])}, 0.5)[0] == np.inf
    assert bs.k_grid(128) == [1, 2, 4, 8, 16, 32, 64, 128] and bs.k_grid(3) == [1, 2, 3]


@pytest.fixture(scope="module")
def analysed():
    raw, _, _ = synthetic_raw(coherent={"r": (0.05, 0.05), "experts-only": (0.6, 0.0)},
                              incoherent={"r": (0.1, 0.1), "experts-only": (0.1, 0.0)})
    return raw, gr.analyze(raw, 300, 0)


def test_batch_scaling_agrees_with_the_rule_statistics(analysed):
    raw, results = analysed
    for name in ("r", "experts-only"):
        for group in GROUPS:
            stats, scaling = results["recipes"][name]["vs_bf16"][group], results["recipes"][name]["batch_scaling"][group]
            assert scaling["at_k"]["1"]["noise_fraction"] == pytest.approx(stats["noise_fraction"], rel=1e-9)
            rel = stats["rel_error"]["value"]
            assert scaling["fp4_ratio"]["value"] == (pytest.approx(1 / rel, rel=1e-9) if rel > 0 else np.inf)
            assert scaling["coherent_bias_sq"]["value"] == pytest.approx(stats["coherent_bias"]["value"] ** 2, rel=1e-9)
            for key in ("value", "lo", "hi"):  # norm terms: the square root of the squared ratio, bound by bound
                assert stats["noise_fraction_norm"][key] == pytest.approx(math.sqrt(stats["noise_fraction"][key]))
            curve = scaling["curve"]
            assert len(curve["k"]) == raw["batches"] and curve["tokens"][3] == 4 * 1000
            # the noise floor falls as 1/k; the coherent error does not: the noise fraction grows with k
            assert curve["noise_floor"][7] == pytest.approx(curve["noise_floor"][0] / 8)
            if rel > 0:
                assert curve["noise_fraction"][-1] > curve["noise_fraction"][0]
    assert results["tokens_per_batch"] == 1000
    reps = results["scaling_replicates"]["r"]["all"]
    assert set(reps) == {"A", "b2", "Ts"} and len(reps["A"]["replicates"]) == min(300, gr.SCALING_REPLICATES)


def test_the_rule_per_group_finds_the_group_where_the_error_lives(analysed):
    _, results = analysed
    by_group = results["decision_by_group"]
    assert set(by_group) == set(GROUPS)
    assert by_group["all"]["per_recipe"] == results["decision"]["per_recipe"]
    verdicts = {grp: by_group[grp]["per_recipe"]["experts-only"]["verdict"] for grp in GROUPS}
    assert verdicts["experts"] == "EXCEEDS" and verdicts["rest"] == "PASSES"
    assert by_group["rest"]["per_recipe"]["experts-only"]["checks"]["coherent_bias"] == "pass"


def test_write_keeps_replicates_out_of_gradients_json(analysed, tmp_path):
    raw, results = analysed
    results = {**results, "config": {"init": "x", "rollout": {"prompts_per_step": 2, "group_size": 4, "temperature": 1.0},
                                     "sr_keys": 1, "kl_batches": None, "adam_warmup_batches": 0, "mismatch_batches": 1,
                                     "dtypes": [], "impls": [], "sketch_dim": 0},
               "model": {"config": {"num_layers": 2, "d_model": 64, "num_experts": 4, "top_k": 2, "dtype": "float32"},
                         "backend": "cpu", "impl": "reference", "high_precision": {}},
               "timings": {"total_s": 1.0, "rollouts_s": 0.0, "gradients_s": 1.0, "compile_s": {}, "compile_total_s": 0.0},
               "rollouts_sha256": "0" * 64, "warmup_sha256": "1" * 64}
    paths = gr.write(results, tmp_path)
    assert "scaling_replicates" not in json.loads(paths["json"].read_text())
    point = json.loads(paths["scaling_point"].read_text())
    assert point["tokens_per_batch"] == 1000 and point["samples_per_batch"] == 8
    measured = results["recipes"]["r"]["batch_scaling"]["all"]["A"]["value"]
    assert point["recipes"]["r"]["all"]["A"]["value"] == pytest.approx(measured)
    report = paths["report"].read_text()
    for title in ("## FP4 All the Way yardstick", "## Batch scaling from the stored batches", "## Decision per parameter group",
                  "## Ratios in norm terms and squared", "fresh AdamW state"):
        assert title in report, title
    assert paths["batch_scaling_png"].stat().st_size > 0
