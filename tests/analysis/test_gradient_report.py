"""Statistics and decision rule of the gradient measurements, on hand-computed and synthetic inputs."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from fp4rl.analysis import gradient_report as gr


@pytest.mark.parametrize("table, expected", [
    # Fisher's tea-tasting table: P(X >= 3) = (C(4,3) C(4,1) + C(4,4) C(4,0)) / C(8,4) = 17/70.
    (((3, 1), (1, 3)), Fraction(17, 70)),
    # 3 tails of 10 vs 0 of 10: P(X = 3) = C(3,3) C(17,7) / C(20,10) = 19448/184756 = 2/19.
    (((3, 7), (0, 10)), Fraction(2, 19)),
    # 1 of 2 vs 1 of 2: 1 - P(X = 0) = 1 - C(2,0) C(2,2) / C(4,2) = 5/6.
    (((1, 1), (1, 1)), Fraction(5, 6)),
    # no tails anywhere: nothing to reject.
    (((0, 8), (0, 8)), Fraction(1)),
    # 2 of 5 vs 0 of 100: P(X = 2) = C(2,2) C(103,3) / C(105,5).
    (((2, 3), (0, 100)), Fraction(math.comb(103, 3), math.comb(105, 5))),
])
def test_fisher_exact_greater_matches_hand_computed_hypergeometric(table, expected):
    (a, b), (c, d) = table
    assert gr.fisher_exact_greater(a, b, c, d) == pytest.approx(float(expected), rel=1e-12)


def test_fisher_is_one_sided():
    assert gr.fisher_exact_greater(0, 10, 3, 7) == 1.0  # fewer tails than the reference: p = 1
    assert gr.fisher_exact_greater(6, 4, 0, 10) < 0.05


def test_gram_statistics_match_direct_computation():
    rng = np.random.default_rng(0)
    x_BxD = rng.normal(size=(7, 50)) + 0.3
    gram = x_BxD @ x_BxD.T
    ones = np.ones((1, 7))
    distinct = [x_BxD[i] @ x_BxD[j] for i in range(7) for j in range(7) if i != j]
    assert gr.pair_mean(gram, ones)[0] == pytest.approx(np.mean(distinct))
    assert gr.batch_variance(gram, ones)[0] == pytest.approx(np.var(x_BxD, axis=0, ddof=1).sum())
    # a resample that repeats batch 0: the pair mean uses pairs of distinct batches only
    counts = np.array([[2.0, 1, 0, 0, 0, 0, 0]])
    assert gr.pair_mean(gram, counts)[0] == pytest.approx(x_BxD[0] @ x_BxD[1])


def test_resample_row_zero_is_the_sample():
    index, counts = gr.resample(5, 100, seed=3)
    np.testing.assert_array_equal(index[0], np.arange(5))
    np.testing.assert_array_equal(counts.sum(1), 5)
    assert counts.shape == (101, 5)


def _ci(value, lo, hi):
    return {"value": value, "lo": lo, "hi": hi}


PASS = {"noise_fraction": _ci(0.01, 0.005, 0.02), "coherent_bias": _ci(0.02, 0.01, 0.05), "fisher_p": 0.6}


def test_decision_every_recipe_passes():
    d = gr.decide({"a": PASS, "b": PASS})
    assert d["outcome"] == "does not operate"
    assert {v["verdict"] for v in d["per_recipe"].values()} == {"PASSES"}


@pytest.mark.parametrize("change", [
    {"noise_fraction": _ci(0.2, 0.1, 0.3)},
    {"coherent_bias": _ci(0.3, 0.2, 0.5)},
    {"fisher_p": 0.01},
])
def test_decision_any_exceeding_check_operates(change):
    d = gr.decide({"a": PASS, "b": {**PASS, **change}})
    assert d["outcome"] == "operates"
    assert d["per_recipe"]["b"]["verdict"] == "EXCEEDS" and d["per_recipe"]["a"]["verdict"] == "PASSES"
    assert "b" in d["conclusion"] and "a" not in d["conclusion"].split(":")[-1]


@pytest.mark.parametrize("change", [
    {"noise_fraction": _ci(0.04, 0.02, 0.09)},
    {"coherent_bias": _ci(0.08, 0.05, float("inf"))},  # a signal estimate that is not positive: inf
])
def test_decision_straddling_interval_is_undecided(change):
    d = gr.decide({"a": PASS, "b": {**PASS, **change}})
    assert d["outcome"] == "undecided"
    assert d["per_recipe"]["b"]["verdict"] == "UNDECIDED"
    assert d["conclusion"].startswith("UNDECIDED")


def test_exceeding_wins_over_undecided():
    d = gr.decide({"a": {**PASS, "fisher_p": 0.001}, "b": {**PASS, "coherent_bias": _ci(0.1, 0.05, 0.2)}})
    assert d["outcome"] == "operates"
    assert "UNDECIDED for: b" in d["conclusion"]


def test_rule_states_its_thresholds():
    for number in (f"{gr.NOISE_FRACTION_MAX:.0%}", str(gr.COHERENT_BIAS_MAX), str(gr.TAIL_ALPHA), f"{gr.TAIL_FACTOR:g}x"):
        assert number in gr.DECISION_RULE


def _raw_from_atoms(template, atoms_by_source, atom_groups):
    """A raw measurement of `template`'s structure whose per-batch arrays and Gram matrices are those of the
    given per-atom gradients (source -> [atom][B, dim]), summed per group as the measurement sums them."""
    n_groups = len(template["groups"])

    def per_group(fn):  # [B, G]: fn(atom index) -> [B] summed over each group's atoms
        out = np.zeros((template["batches"], n_groups))
        for a, member in enumerate(atom_groups):
            for g in member:
                out[:, g] += fn(a)
        return out

    def gram(vectors):
        out = np.zeros((n_groups, template["batches"], template["batches"]))
        for v, member in zip(vectors, atom_groups):
            for g in member:
                out[g] += v @ v.T
        return out

    raw = dict(template)
    raw["per_batch"], raw["gram_diff"], raw["gram_ref"] = {}, {}, {}
    for src, refs in template["refs_of"].items():
        g = atoms_by_source[src]
        cmp = {}
        for ref, ref_src in refs.items():
            r = atoms_by_source[ref_src]
            cmp[ref] = {"err_sq": per_group(lambda a: ((g[a] - r[a]) ** 2).sum(1)),
                        "dot0": per_group(lambda a: (g[a] * r[a]).sum(1)),
                        "g0_sq": per_group(lambda a: (g[a] ** 2).sum(1)), "ref_sq": per_group(lambda a: (r[a] ** 2).sum(1))}
            raw["gram_diff"].setdefault(src, {})[ref] = gram([x - y for x, y in zip(g, r)])
        raw["per_batch"][src] = {"cmp": cmp, "sr_var": np.zeros((template["batches"], n_groups)),
                                 "ratio_dev": np.zeros(template["batches"])}
        raw["gram_ref"][src] = gram(g)
    raw["sketched_groups"] = []
    return raw


def test_all_but_shared_is_the_measurement_of_a_model_without_the_shared_expert():
    from fp4rl.studies import gradient_store

    # a measured part's layout (groups, batches, sources, refs_of, ...) from its raw.json: its arrays stay out
    # of the tree (tools/data_files.py), and the ones read here are built below
    template, _ = gradient_store.load_meta(Path(__file__).resolve().parents[2] / "results/gradients_h200/parts/nvfp4")
    assert template["groups"] == ["routed_experts", "shared_expert", "attention", "last_layers", "all"]
    rng = np.random.default_rng(0)
    B = template["batches"]
    template["kl"] = {name: np.zeros((B, len(template["lrs"]))) for name in template["recipes"]}  # not compared
    # atoms: routed experts, shared expert, attention, the last layer's routed experts; each in "all"
    atom_groups = [(0, 4), (1, 4), (2, 4), (0, 3, 4)]
    signal = [rng.normal(size=8) for _ in atom_groups]
    sources = {src: [s + rng.normal(size=(B, 8)) * (1 + i) for i, s in enumerate(signal)] for src in template["refs_of"]}
    for src in sources:  # a recipe's error: a coherent part and noise, per atom
        if src != "bf16":
            sources[src] = [x + 0.3 * s + 0.2 * rng.normal(size=x.shape) for x, s in zip(sources["bf16"], signal)]
    with_shared = gr.analyze(_raw_from_atoms(template, sources, atom_groups), n_boot=50)
    without = {src: [v if a != 1 else np.zeros_like(v) for a, v in enumerate(vs)] for src, vs in sources.items()}
    no_shared = gr.analyze(_raw_from_atoms(template, without, atom_groups), n_boot=50)
    assert with_shared["groups"][-1] == "all_but_shared"
    for name in ("nvfp4", "+dq"):
        a, b = with_shared["recipes"][name], no_shared["recipes"][name]
        for stat in ("noise_fraction", "coherent_bias", "rel_error"):
            assert a["vs_bf16"]["all_but_shared"][stat] == pytest.approx(b["vs_bf16"]["all"][stat], rel=1e-9), (name, stat)
        for comp in ("A", "coherent_bias_sq", "noise_scale_tokens"):
            assert a["batch_scaling"]["all_but_shared"][comp] == pytest.approx(b["batch_scaling"]["all"][comp], rel=1e-9)
    # and the shared expert counts in "all": with it, "all" differs
    assert with_shared["recipes"]["nvfp4"]["vs_bf16"]["all"]["noise_fraction"]["value"] != pytest.approx(
        with_shared["recipes"]["nvfp4"]["vs_bf16"]["all_but_shared"]["noise_fraction"]["value"], rel=1e-3)
    assert set(with_shared["decision_by_group"]) == set(with_shared["groups"])
