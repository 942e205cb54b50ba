"""Statistics, decision rule, report and plots of the fixed-parameter gradient measurements
(`fp4rl.studies.gradients`).

Every interval is a 95% percentile bootstrap over the rollout batches (the mismatch: over its
batches): one matrix of resampled batch counts serves every statistic, so the intervals of
quantities measured on the same batches are paired. Definitions, per recipe r, reference ref
(BF16 or the recipe's straight-through view), group of parameters and batch b, with m_b the mean
of the recipe's gradients over its K keys and v_b their variance over keys (unbiased):
- rel_error  = sqrt(sum_b E_k||g_bk - ref_b||^2 / sum_b ||ref_b||^2), where
               E_k||g_bk - ref_b||^2 = ||m_b - ref_b||^2 + (K-1)/K v_b;
- cosine     = mean_b cos(g_b0, ref_b) (the first key: the draw an update sees);
- sr_std     = sqrt(sum_b v_b / sum_b ||ref_b||^2) (0 for a deterministic backward);
- bias       = ||mean_b (m_b - ref_b)|| / ||mean_b ref_b|| (the error of the mean gradient);
- coherent_bias = sqrt(U(d) / U(ref)): U(x) = mean over pairs of distinct batches of <x_b, x_b'>,
               an unbiased estimate of ||E x||^2, so the batch noise left in `bias` cancels;
- noise floor = the batch-to-batch variance of the BF16 gradient, sum_b ||g_b - mean g||^2 / (B-1);
  noise_fraction = mean_b E_k||g_bk - g_bf16,b||^2 / noise floor (both squared norms: variances add);
  every squared ratio is also given in norm terms (its square root, `*_norm`: RMS error / RMS noise),
  and the coherent bias squared (`coherent_bias_sq`);
- per recipe and group, `batch_scaling` (`fp4rl.analysis.batch_scaling`): the noise fraction and the
  FP4-All-the-Way ratio ||g|| / ||g_r - g_bf16|| of an update on k = 1..B stored batches, the
  components A, b^2, T_s that give them at any tokens per update, and T*, the tokens per update at
  which the noise fraction reaches the rule's threshold;
- `decision_by_group`: the decision rule applied to each group on its own;
- derived groups (`DERIVED_GROUPS`): "all_but_shared", every parameter but the shared expert's, the
  group a model without a shared expert is judged on (`fp4rl.analysis.scaling` extrapolates it to
  Qwen3-30B-A3B). Every per-group quantity the measurement stores is a sum over the group's parameters
  (squared norms, dot products, SR variances, and Gram matrices of a projection whose atoms never
  straddle a group: `fp4rl.studies.gradient_programs.Projection`), so a group minus one of its subgroups is
  exact, computed here from the stored arrays (stored measurements gain it when analysed again).

Statistics, decision and report read the same raw arrays and one matrix of bootstrap resamples
(which pairs the intervals of quantities measured on the same batches), so they stay together; the
figures, which read only the finished results, are in `fp4rl.analysis.gradient_plots`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fp4rl.analysis import batch_scaling, gradient_plots
from fp4rl.analysis.batch_scaling import batch_variance, pair_mean, quad  # Gram-matrix estimators
from fp4rl.analysis.gradient_rule import (  # noqa: F401  (re-exported: the rule as the report states it)
    CI_LEVEL, COHERENT_BIAS_MAX, DECISION_GROUP, DECISION_RULE, NOISE_FRACTION_MAX, TAIL_ALPHA, TAIL_FACTOR)

RESULTS_FILE = "gradients.json"  # every number of a run; the ablation runner reads its decision
# Per recipe and group, the batch-scaling components with this many bootstrap replicates, for the
# fit over model sizes (`fp4rl.analysis.scaling` reads it from every preset's measurement).
SCALING_POINT_FILE = "scaling_point.json"
SCALING_REPLICATES = 200
# name -> (group, its subgroup left out): module docstring.
DERIVED_GROUPS = {"all_but_shared": ("all", "shared_expert")}


# ---------------------------------------------------------------------------------- statistics
def ci(value: float, replicates: np.ndarray) -> dict:
    """{"value", "lo", "hi"}: the statistic and the percentile interval of its replicates."""
    alpha = (1.0 - CI_LEVEL) / 2
    reps = np.asarray(replicates, np.float64)
    reps = reps[~np.isnan(reps)]
    # "nearest": order statistics, no interpolation (replicates may be +inf: an undetectable signal)
    lo, hi = np.quantile(reps, [alpha, 1 - alpha], method="nearest") if reps.size else (np.nan, np.nan)
    return {"value": float(value), "lo": float(lo), "hi": float(hi)}


def resample(batches: int, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(index_NxB, counts_NxB): bootstrap resamples of the batches; row 0 is the sample itself."""
    rng = np.random.default_rng(seed)
    index = np.concatenate([np.arange(batches)[None], rng.integers(0, batches, (n_boot, batches))])
    counts = np.stack([np.bincount(row, minlength=batches) for row in index]).astype(np.float64)
    return index, counts


def _ratio(num_B, den_B, counts):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (counts @ num_B) / (counts @ den_B)


def _safe_ratio(num, den):
    """num / den, +inf where den <= 0 (e.g. a signal estimate that is not positive)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)


def _sqrt_ratio(num, den):
    return np.sqrt(np.maximum(_safe_ratio(num, den), 0.0))


def _stat(reps) -> dict:
    return ci(reps[0], reps[1:])


def fisher_exact_greater(a: int, b: int, c: int, d: int) -> float:
    """One-sided Fisher exact test of the 2x2 table [[a, b], [c, d]]: P(X >= a) with X the top-left
    count under the hypergeometric law of fixed margins (row 1 has the higher odds of column 1)."""
    row1, col1, n = a + b, a + c, a + b + c + d
    total = math.comb(n, row1)
    tail = sum(math.comb(col1, x) * math.comb(n - col1, row1 - x) for x in range(a, min(row1, col1) + 1))
    return tail / total


def tail_count(norms, factor: float = TAIL_FACTOR) -> int:
    return int(np.sum(norms > factor * np.median(norms)))


# ---------------------------------------------------------------------------------- analysis
def compare_stats(per_batch: Mapping, ref: str, k: int, gram_diff, gram_ref, counts, floor=None) -> dict:
    """Per group: the statistics of one (source, reference) pair (see the module docstring)."""
    cmp = per_batch["cmp"][ref]
    out = {}
    for g in range(gram_diff.shape[0]):
        total = cmp["err_sq"][:, g] + (k - 1) / k * per_batch["sr_var"][:, g]
        den = np.sqrt(cmp["g0_sq"][:, g] * cmp["ref_sq"][:, g])
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = np.where(den > 0, cmp["dot0"][:, g] / den, np.nan)
        stats = {
            "rel_error": _stat(np.sqrt(_ratio(total, cmp["ref_sq"][:, g], counts))),
            "cosine": _stat(np.nansum(counts * cos, 1) / (counts * ~np.isnan(cos)).sum(1)),
            "sr_std": _stat(np.sqrt(_ratio(per_batch["sr_var"][:, g], cmp["ref_sq"][:, g], counts))),
            "bias": _stat(_sqrt_ratio(quad(gram_diff[g], counts), quad(gram_ref[g], counts))),
            "coherent_bias": _stat(_sqrt_ratio(pair_mean(gram_diff[g], counts), pair_mean(gram_ref[g], counts))),
        }
        if floor is not None:
            fraction = _safe_ratio((counts @ total) / counts.sum(1), floor[g])
            stats["noise_fraction"] = _stat(fraction)
            with np.errstate(invalid="ignore"):
                stats["noise_fraction_norm"] = _stat(np.sqrt(fraction))  # RMS error / RMS noise
        stats["coherent_bias_sq"] = {k: v * v for k, v in stats["coherent_bias"].items()}
        out[g] = stats
    return out


def with_derived_groups(raw: Mapping) -> dict:
    """`raw` with each DERIVED_GROUPS group appended (module docstring) where its two groups are stored
    and it is not; per-group arrays are [..., G] (per batch) or [G, B, B] (Gram matrices)."""
    groups = list(raw["groups"])
    add = [(name, groups.index(whole), groups.index(part)) for name, (whole, part) in DERIVED_GROUPS.items()
           if name not in groups and whole in groups and part in groups]
    if not add:
        return dict(raw)

    def last(x):
        x = np.asarray(x)
        return np.concatenate([x, *(x[..., a:a + 1] - x[..., b:b + 1] for _, a, b in add)], -1)

    def first(x):
        x = np.asarray(x)
        return np.concatenate([x, *(x[a:a + 1] - x[b:b + 1] for _, a, b in add)], 0)

    out = dict(raw, groups=groups + [name for name, _, _ in add])
    out["per_batch"] = {src: {**pb, "cmp": {ref: {k: last(v) for k, v in c.items()} for ref, c in pb["cmp"].items()},
                              "sr_var": last(pb["sr_var"])} for src, pb in raw["per_batch"].items()}
    out["gram_diff"] = {src: {ref: first(g) for ref, g in refs.items()} for src, refs in raw["gram_diff"].items()}
    out["gram_ref"] = {src: first(g) for src, g in raw["gram_ref"].items()}
    sketched = set(raw.get("sketched_groups", []))
    out["sketched_groups"] = [*raw.get("sketched_groups", []),
                              *(name for name, a, b in add if {groups[a], groups[b]} & sketched)]
    return out


def analyze(raw: Mapping, n_boot: int = 1000, seed: int = 0) -> dict:
    """The statistics of `Session.gradients` + `Session.mismatch` raw arrays (with DERIVED_GROUPS), and the decision."""
    raw = with_derived_groups(raw)
    groups, ref = raw["groups"], raw["reference"]
    index, counts = resample(raw["batches"], n_boot, seed)
    gram_bf16 = raw["gram_ref"][ref]
    floor = np.stack([batch_variance(gram_bf16[g], counts) for g in range(len(groups))])
    noise = {}
    for g, group in enumerate(groups):
        share = _safe_ratio(floor[g], counts @ np.diag(gram_bf16[g]) / counts.sum(1))
        to_signal = _safe_ratio(floor[g], pair_mean(gram_bf16[g], counts))
        with np.errstate(invalid="ignore"):  # nan in resamples of a single distinct batch
            noise[group] = {"noise_share": _stat(share), "noise_share_norm": _stat(np.sqrt(share)),
                            "noise_to_signal": _stat(to_signal), "noise_to_signal_norm": _stat(np.sqrt(to_signal))}
    sources = {}
    for src in raw["sources"]:
        pb, k = raw["per_batch"][src], raw["sr_keys"][src]
        entry = {"sr_keys": k, "max_abs_ratio_minus_1": float(np.max(pb["ratio_dev"]))}
        for name, ref_src in raw["refs_of"][src].items():
            by_group = compare_stats(pb, name, k, raw["gram_diff"][src][name], raw["gram_ref"][ref_src], counts,
                                     floor if name == "bf16" else None)
            entry[f"vs_{name}"] = {groups[g]: s for g, s in by_group.items()}
        norms = np.sqrt(pb["cmp"]["bf16"]["g0_sq"][:, groups.index("all")])
        resampled = norms[index]
        tail_rate = np.mean(resampled > TAIL_FACTOR * np.median(resampled, 1, keepdims=True), 1)
        entry["grad_norm"] = {"values": norms.tolist(), "median": _stat(np.median(resampled, 1)),
                              "tail_count": tail_count(norms), "tail_rate": _stat(tail_rate)}
        sources[src] = entry
    ref_norms = np.asarray(sources[ref]["grad_norm"]["values"])
    recipes = {}
    for name in raw["recipes"]:
        entry = sources[name]
        n = len(entry["grad_norm"]["values"])
        t, t_ref = entry["grad_norm"]["tail_count"], tail_count(ref_norms)
        entry["grad_norm"]["fisher_p_vs_bf16"] = fisher_exact_greater(t, n - t, t_ref, len(ref_norms) - t_ref)
        kl = raw["kl"][name]  # the first kl_batches batches: resampled on their own
        kl_counts = counts if len(kl) == raw["batches"] else resample(len(kl), n_boot, seed + 2)[1]
        entry["policy_change_kl"] = {f"{lr:g}": _stat(kl_counts @ kl[:, i] / kl_counts.sum(1))
                                     for i, lr in enumerate(raw["lrs"])}
        entry["forward_class"] = raw["forward_class"][name]
        entry["straight_through"] = raw["refs_of"][name]["ste"]
        recipes[name] = entry
    mismatch = {}
    for cls, variants in raw["mismatch"].items():
        mismatch[cls] = {}
        for variant, k3 in variants.items():
            if isinstance(k3, str):
                mismatch[cls][variant] = k3
                continue
            _, c = resample(len(k3), n_boot, seed + 1)
            mismatch[cls][variant] = _stat(c @ k3 / c.sum(1))
    for name, entry in recipes.items():
        entry["mismatch_k3"] = mismatch.get(entry["forward_class"], {})
    straight = {src: sources[src] for src in raw["sources"] if src not in recipes}
    rollouts = {k: _stat(np.asarray(v, np.float64)[index].mean(1)) for k, v in raw["rollouts"].items()}
    rollouts["batches_without_loss_tokens"] = int(np.sum(np.asarray(raw["rollouts"]["loss_tokens"]) == 0))
    results = {"groups": groups, "batches": raw["batches"], "lrs": raw["lrs"], "sketched_groups": raw["sketched_groups"],
               "ci": f"{CI_LEVEL:.0%} percentile bootstrap over the {raw['batches']} rollout batches ({n_boot} resamples)",
               "rollouts": rollouts, "noise_floor": noise, "recipes": recipes, "straight_through": straight}
    judged = {name: {"noise_fraction": e["vs_bf16"][DECISION_GROUP]["noise_fraction"],
                     "coherent_bias": e["vs_bf16"][DECISION_GROUP]["coherent_bias"],
                     "fisher_p": e["grad_norm"]["fisher_p_vs_bf16"]} for name, e in recipes.items() if name != ref}
    results["decision"] = decide(judged)
    tokens = float(np.mean(raw["rollouts"]["loss_tokens"]))
    results["tokens_per_batch"] = tokens
    replicates = {}
    for name, entry in recipes.items():
        entry["batch_scaling"], replicates[name] = _batch_scaling(raw, name, counts, tokens)
    results["decision_by_group"] = _decide_by_group(raw, recipes, groups)
    # A few hundred bootstrap replicates of the batch-scaling components per recipe and group, for
    # `fp4rl.analysis.scaling` (written to SCALING_POINT_FILE by `write`, not into gradients.json).
    results["scaling_replicates"] = replicates
    return results


def _batch_scaling(raw: Mapping, name: str, counts, tokens: float) -> tuple[dict, dict]:
    """Per group: the batch-scaling components, the noise fraction and the FP4-All-the-Way yardstick
    per effective batch of k stored batches (`batch_scaling`), with intervals; and the components'
    first SCALING_REPLICATES bootstrap replicates."""
    out, reps = {}, {}
    for g, group in enumerate(raw["groups"]):
        with np.errstate(invalid="ignore", divide="ignore"):  # nan/inf in resamples of one distinct batch
            out[group], reps[group] = _batch_scaling_group(raw, name, g, counts, tokens)
    return out, reps


def _batch_scaling_group(raw: Mapping, name: str, g: int, counts, tokens: float) -> tuple[dict, dict]:
    pb, k = raw["per_batch"][name], raw["sr_keys"][name]
    cmp = pb["cmp"]["bf16"]
    error_sq = cmp["err_sq"][:, g] + (k - 1) / k * pb["sr_var"][:, g]
    m = batch_scaling.moments(error_sq, raw["gram_diff"][name]["bf16"][g], raw["gram_ref"][raw["reference"]][g], counts)
    c = batch_scaling.components(m, tokens)
    point = {key: v[:1] for key, v in m.items()}  # the sample alone, for the curve over every k
    every_k = np.arange(1, raw["batches"] + 1)
    curve = {"k": every_k.tolist(), "tokens": (every_k * tokens).tolist()}
    for key, fn in (("error", batch_scaling.error_at), ("noise_floor", batch_scaling.noise_floor_at),
                    ("noise_fraction", batch_scaling.noise_fraction_at), ("fp4_ratio", batch_scaling.yardstick_at)):
        curve[key] = [float(fn(point, kk)[0]) for kk in every_k]
    stats = {
        "A": _stat(c["A"]), "coherent_bias_sq": _stat(c["b2"]), "noise_scale_tokens": _stat(c["Ts"]),
        "tokens_to_threshold": _stat(batch_scaling.tokens_to_threshold(c, NOISE_FRACTION_MAX)),
        "fp4_ratio": _stat(batch_scaling.yardstick_at(m, 1)),
        "fp4_ratio_sq": _stat(batch_scaling.yardstick_at(m, 1) ** 2),
        "at_k": {str(kk): {"tokens": kk * tokens, "noise_fraction": _stat(batch_scaling.noise_fraction_at(m, kk)),
                           "noise_fraction_norm": _stat(np.sqrt(batch_scaling.noise_fraction_at(m, kk))),
                           "fp4_ratio": _stat(batch_scaling.yardstick_at(m, kk))}
                 for kk in batch_scaling.k_grid(raw["batches"])},
        "curve": curve,
    }
    reps = {key: {"value": float(v[0]), "replicates": v[1:1 + SCALING_REPLICATES].tolist()} for key, v in c.items()}
    return stats, reps


def _decide_by_group(raw: Mapping, recipes: Mapping, groups: list[str]) -> dict:
    """DECISION_RULE applied to each parameter group on its own: the error of the group's
    parameters against the group's own noise floor and signal, and the tail of the group's grad
    norm. A group whose BF16 gradient is identically 0 (no such parameters) is left out."""
    ref = raw["reference"]
    out = {}
    for g, group in enumerate(groups):
        ref_norms = np.sqrt(raw["per_batch"][ref]["cmp"]["bf16"]["g0_sq"][:, g])
        if not np.any(ref_norms > 0):
            continue
        judged = {}
        for name, entry in recipes.items():
            if name == ref:
                continue
            norms = np.sqrt(raw["per_batch"][name]["cmp"]["bf16"]["g0_sq"][:, g])
            t, t_ref = tail_count(norms), tail_count(ref_norms)
            judged[name] = {"noise_fraction": entry["vs_bf16"][group]["noise_fraction"],
                            "coherent_bias": entry["vs_bf16"][group]["coherent_bias"],
                            "fisher_p": fisher_exact_greater(t, len(norms) - t, t_ref, len(ref_norms) - t_ref)}
        out[group] = decide(judged)
    return out


# ---------------------------------------------------------------------------------- decision
def _verdict(interval: Mapping, threshold: float) -> str:
    if interval["hi"] < threshold:
        return "pass"
    if interval["lo"] > threshold:
        return "exceeds"
    return "undecided"


def decide(judged: Mapping[str, Mapping]) -> dict:
    """Apply DECISION_RULE to recipe -> {"noise_fraction": ci, "coherent_bias": ci, "fisher_p": p}."""
    per_recipe = {}
    for name, m in judged.items():
        checks = {"noise_fraction": _verdict(m["noise_fraction"], NOISE_FRACTION_MAX),
                  "coherent_bias": _verdict(m["coherent_bias"], COHERENT_BIAS_MAX),
                  "tail": "exceeds" if m["fisher_p"] < TAIL_ALPHA else "pass"}
        verdict = ("EXCEEDS" if "exceeds" in checks.values() else "UNDECIDED" if "undecided" in checks.values() else "PASSES")
        per_recipe[name] = {"verdict": verdict, "checks": checks}
    exceeds = [n for n, v in per_recipe.items() if v["verdict"] == "EXCEEDS"]
    undecided = [n for n, v in per_recipe.items() if v["verdict"] == "UNDECIDED"]
    if exceeds:
        outcome = "operates"
        conclusion = f"The mechanism OPERATES at this scale, for: {', '.join(exceeds)}."
        if undecided:
            conclusion += f" UNDECIDED for: {', '.join(undecided)}."
    elif undecided:
        outcome = "undecided"
        conclusion = f"UNDECIDED: no recipe exceeds a threshold, but the intervals of {', '.join(undecided)} straddle one."
    else:
        outcome = "does not operate"
        conclusion = "The mechanism does NOT operate at this scale: every recipe passes every check."
    return {"rule": DECISION_RULE, "per_recipe": per_recipe, "outcome": outcome, "conclusion": conclusion}


# ---------------------------------------------------------------------------------- output
def _jsonable(x):
    """Plain JSON: numpy scalars to floats, non-finite numbers to None (strict JSON has no inf)."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    return x


def fmt(c) -> str:
    """'value [lo, hi]' with 3 significant digits (n/a for a missing or non-finite value)."""
    if isinstance(c, str):
        return c
    f = lambda x: "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"  # noqa: E731
    return f"{f(c['value'])} [{f(c['lo'])}, {f(c['hi'])}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def report_markdown(results: Mapping) -> str:
    recipes, groups, g = results["recipes"], results["groups"], DECISION_GROUP
    model = results["model"]["config"]
    lines = ["# Fixed-parameter gradient measurements", "",
             f"Warm-up `{results['config']['init']}`: {model['num_layers']} layers, d_model {model['d_model']}, "
             f"{model['num_experts']} experts (top {model['top_k']}), compute {model['dtype']}, backend "
             f"{results['model']['backend']}, quantizer impl {results['model']['impl']}. "
             f"{results['batches']} rollout batches of {results['config']['rollout']['prompts_per_step']} prompts x "
             f"{results['config']['rollout']['group_size']} samples (BF16 sampler, temperature "
             f"{results['config']['rollout']['temperature']}), shared by every recipe; {results['config']['sr_keys']} "
             "stochastic-rounding keys per batch for quantized-backward recipes.",
             "", "Selective high precision: " + ("; ".join(f"{n}: {s}" for n, s in results["model"]["high_precision"].items()
                                                         if not s.startswith("0 of")) or "none") + ".",
             "", f"Intervals: {results['ci']}. Definitions: `fp4rl/analysis/gradient_report.py`.",
             "", "## Decision rule (stated before the results)", "", DECISION_RULE, ""]
    if results["sketched_groups"]:
        lines += [f"Groups measured through a CountSketch of {results['config']['sketch_dim']} buckets (inner products "
                  f"to about 1/sqrt of that): {', '.join(results['sketched_groups'])}.", ""]
    r = results["rollouts"]
    lines += ["## Rollouts", "", f"Population accuracy {fmt(r['accuracy'])}, kept-group fraction {fmt(r['kept_group_frac'])}, "
              f"generation batches per rollout batch {fmt(r['gen_batches'])}, loss tokens per batch {fmt(r['loss_tokens'])}.", ""]
    if r["batches_without_loss_tokens"]:
        lines += [f"**Warning**: {r['batches_without_loss_tokens']} of {results['batches']} batches have no loss token (every "
                  "group's rewards were equal): their gradient is the load-balancing term alone.", ""]
    lines += ["## RL noise floor (BF16, batch to batch)", ""]
    nf = results["noise_floor"]
    lines += _table(["group", "noise share of per-batch energy", "in norm terms", "noise / signal ||E g||^2", "in norm terms"],
                    [[grp, fmt(nf[grp]["noise_share"]), fmt(nf[grp]["noise_share_norm"]), fmt(nf[grp]["noise_to_signal"]),
                      fmt(nf[grp]["noise_to_signal_norm"])] for grp in groups])
    lines += ["", f"## Gradient error, group '{g}'", ""]
    header = ["recipe", "rel. error vs bf16", "cosine vs bf16", "bias vs bf16", "coherent bias vs bf16", "noise fraction",
              "SR std", "rel. error vs STE", "cosine vs STE", "coherent bias vs STE"]
    rows = []
    for name, e in recipes.items():
        b, s = e["vs_bf16"][g], e["vs_ste"][g]
        rows.append([name, fmt(b["rel_error"]), fmt(b["cosine"]), fmt(b["bias"]), fmt(b["coherent_bias"]),
                     fmt(b["noise_fraction"]), fmt(b["sr_std"]), fmt(s["rel_error"]), fmt(s["cosine"]), fmt(s["coherent_bias"])])
    lines += _table(header, rows)
    lines += ["", "A coherent-bias interval ending in n/a: the BF16 signal ||E g||^2 is not positive in some resamples "
              "(not detectable from these batches), so the ratio is unbounded there."]
    lines += ["", "## Noise fraction per group (error vs bf16 / RL noise floor)", ""]
    per_group = lambda key: [[n, *(fmt(e["vs_bf16"][grp][key]) for grp in groups)] for n, e in recipes.items()]  # noqa: E731
    lines += _table(["recipe", *groups], per_group("noise_fraction"))
    lines += ["", "## Noise fraction per group in norm terms (RMS error / RMS noise; the rule's 5% is "
              f"{math.sqrt(NOISE_FRACTION_MAX):.3f})", ""]
    lines += _table(["recipe", *groups], per_group("noise_fraction_norm"))
    lines += ["", "## Relative error vs bf16 per group", ""]
    lines += _table(["recipe", *groups], per_group("rel_error"))
    lines += ["", f"## Ratios in norm terms and squared, group '{g}'", "",
              "The noise fraction is a ratio of squared norms (variances add); the coherent bias and the relative error "
              f"are ratios of norms. Thresholds: noise fraction {NOISE_FRACTION_MAX:g} squared = "
              f"{math.sqrt(NOISE_FRACTION_MAX):.3f} in norm terms; coherent bias {COHERENT_BIAS_MAX:g} in norm terms = "
              f"{COHERENT_BIAS_MAX**2:g} squared.", ""]
    lines += _table(["recipe", "noise fraction (squared)", "noise fraction (norm)", "coherent bias (norm)",
                     "coherent bias (squared)"],
                    [[n, fmt(e["vs_bf16"][g]["noise_fraction"]), fmt(e["vs_bf16"][g]["noise_fraction_norm"]),
                      fmt(e["vs_bf16"][g]["coherent_bias"]), fmt(e["vs_bf16"][g]["coherent_bias_sq"])]
                     for n, e in recipes.items()])
    lines += _scaling_sections(results)
    lines += ["", "## Straight-through views vs bf16 (the forward's quantization alone)", ""]
    lines += _table(["view", "rel. error", "cosine", "coherent bias", "noise fraction"],
                    [[n, fmt(e["vs_bf16"][g]["rel_error"]), fmt(e["vs_bf16"][g]["cosine"]), fmt(e["vs_bf16"][g]["coherent_bias"]),
                      fmt(e["vs_bf16"][g]["noise_fraction"])] for n, e in results["straight_through"].items()])
    lines += ["", f"## Pre-clip global grad norm over the batches (tail: > {TAIL_FACTOR:g}x the recipe's median)", ""]
    lines += _table(["recipe", "median", "tail count", "tail rate", "Fisher p (tail > bf16's)", "max |ratio - 1|"],
                    [[n, fmt(e["grad_norm"]["median"]), f"{e['grad_norm']['tail_count']}/{len(e['grad_norm']['values'])}",
                      fmt(e["grad_norm"]["tail_rate"]), f"{e['grad_norm']['fisher_p_vs_bf16']:.3g}",
                      f"{e['max_abs_ratio_minus_1']:.2g}"] for n, e in recipes.items()])
    lines += ["", "## Policy change KL(old || new) of one AdamW update (k3, response tokens)", ""]
    lrs = [f"{lr:g}" for lr in results["lrs"]]
    kl_batches, warm = results["config"]["kl_batches"], results["config"].get("adam_warmup_batches", 0)
    if warm:
        lines += [f"AdamW state warmed on the first {warm} batches (each recipe's own gradients, parameters unchanged); "
                  f"the update is measured on the {kl_batches or results['batches'] - warm} batches after them.", ""]
    else:
        lines += ["From a fresh AdamW state: its first update is about -lr * sign(g) per parameter whatever the "
                  "gradient's error, so equal KL across recipes is built into this measurement "
                  "(`--adam_warmup_batches=N` warms the state first).", ""]
        if kl_batches is not None:
            lines += [f"Measured on the first {kl_batches} of the {results['batches']} batches.", ""]
    lines += _table(["recipe", *(f"lr {lr}" for lr in lrs)],
                    [[n, *(fmt(e["policy_change_kl"][lr]) for lr in lrs)] for n, e in recipes.items()])
    lines += ["", "## Sampler vs trainer k3 KL at the warm-up policy, per forward class", ""]
    mismatch = {e["forward_class"]: e["mismatch_k3"] for e in recipes.values()}
    variants = list(next(iter(mismatch.values())))
    if variants:
        lines += [f"Over {results['config']['mismatch_batches']} batch(es) of the rollout prompts; compute dtype / quantizer "
                  "implementation.", ""]
        lines += _table(["forward class", *variants], [[cls, *(fmt(m[v]) for v in variants)] for cls, m in mismatch.items()])
    else:
        c = results["config"]
        lines += ["Not measured yet (this report was written before the mismatch measurement finished)."
                  if c["dtypes"] and c["impls"] else "Not measured (no compute dtype or implementation configured)."]
    d = results["decision"]
    lines += ["", "## Decision", ""]
    lines += _table(["recipe", "noise fraction", "coherent bias", "tail", "verdict"],
                    [[n, v["checks"]["noise_fraction"], v["checks"]["coherent_bias"], v["checks"]["tail"], f"**{v['verdict']}**"]
                     for n, v in d["per_recipe"].items()])
    lines += ["", f"**{d['conclusion']}**", ""]
    by_group = results.get("decision_by_group", {})
    if by_group:
        lines += ["## Decision per parameter group", "",
                  "The same rule with each group's error against that group's own noise floor and signal, and the tail "
                  "of that group's grad norm (a group without parameters is left out). The decision above judges 'all'.", ""]
        lines += _table(["recipe", *by_group], [[n, *(by_group[grp]["per_recipe"][n]["verdict"] for grp in by_group)]
                                                 for n in d["per_recipe"]])
        lines += [""] + [f"- {grp}: {by_group[grp]['conclusion']}" for grp in by_group] + [""]
    lines += ["## Timings", ""]
    parts = results.get("merged_from")
    if parts:  # one line per device call / process that measured a part
        lines += [f"Merged from {len(parts)} measurements on the same rollout batches (SHA-256 "
                  f"`{results['rollouts_sha256'][:16]}...`, warm-up parameters `{results['warmup_sha256'][:16]}...`):", ""]
        lines += [f"- `{d}` ({', '.join(recipes_of)}): {_timing_line(results['timings'][d])}" for d, recipes_of in parts.items()]
        drift = results["reference_drift"]
        lines += ["", f"The BF16 reference, measured again in each part, differs between parts by {drift['median']:.2g} "
                  f"(median) and {drift['max']:.2g} (max) in relative per-batch norm: GPU atomics reorder BF16 sums; "
                  "each recipe is compared with the reference measured in its own part."]
    else:
        lines += [_timing_line(results["timings"])]
    lines += [""]
    return "\n".join(lines)


def _scaling_sections(results: Mapping) -> list[str]:
    """The FP4-All-the-Way yardstick and the batch scaling (`batch_scaling`), per recipe and group."""
    recipes = {n: e for n, e in results["recipes"].items() if n != "bf16"}
    groups, g, b = results["groups"], DECISION_GROUP, results["batches"]
    tokens = results["tokens_per_batch"]
    ks = list(next(iter(recipes.values()))["batch_scaling"][g]["at_k"]) if recipes else []
    lines = ["", "## FP4 All the Way yardstick: ||g_bf16|| / ||g_r - g_bf16|| per update", "",
             "Chmiel et al. 2025 (arXiv 2505.19115): quantized training stops being effective once the gradient norm "
             f"falls below about sqrt(3) = {batch_scaling.SQRT3:.3f} times the quantization noise. Here the norm of an "
             "update's BF16 gradient (noise included) over the norm of the recipe's error of that update (vs BF16), as "
             f"root mean squares; one stored batch is {tokens:.0f} loss tokens (= 1 / rel. error). Below sqrt(3): the "
             "recipe's gradient is more error than gradient by that criterion. Squared, the line is 3.", ""]
    for label, k in (("one batch", "1"), (f"{b} batches", str(b))):
        lines += [f"At {label} ({float(k) * tokens:.0f} tokens per update):", ""]
        lines += _table(["recipe", *groups], [[n, *(fmt(e["batch_scaling"][grp]["at_k"][k]["fp4_ratio"]) for grp in groups)]
                                               for n, e in recipes.items()]) + [""]
    lines += [f"## Batch scaling from the stored batches, group '{g}'", "",
              "An update on k stored batches (their mean gradient) without new rollouts: the noise floor falls as 1/k, the "
              "coherent error does not (`fp4rl/analysis/batch_scaling.py`). A = incoherent error / noise (independent of "
              "the update size), b^2 = coherent bias squared, T_s = the noise scale in tokens (noise = signal there); "
              "noise fraction(T) = A + b^2 T / T_s. T*: tokens per update at which the noise fraction reaches the rule's "
              f"{NOISE_FRACTION_MAX:g} (0: above it at any size; n/a or inf: never).", ""]
    header = ["recipe", "A", "b^2", "T_s (tokens)", *(f"noise fraction, k={k}" for k in ks), "T* (tokens)"]
    rows = []
    for n, e in recipes.items():
        s = e["batch_scaling"][g]
        rows.append([n, fmt(s["A"]), fmt(s["coherent_bias_sq"]), fmt(s["noise_scale_tokens"]),
                     *(fmt(s["at_k"][k]["noise_fraction"]) for k in ks), fmt(s["tokens_to_threshold"])])
    lines += _table(header, rows)
    lines += ["", "In norm terms (RMS error / RMS noise; the rule's line is "
              f"{math.sqrt(NOISE_FRACTION_MAX):.3f}):", ""]
    lines += _table(["recipe", *(f"k={k}" for k in ks)],
                    [[n, *(fmt(e["batch_scaling"][g]["at_k"][k]["noise_fraction_norm"]) for k in ks)]
                     for n, e in recipes.items()])
    lines += ["", "T* per group (tokens per update at which the group's noise fraction reaches "
              f"{NOISE_FRACTION_MAX:g}):", ""]
    lines += _table(["recipe", *groups], [[n, *(fmt(e["batch_scaling"][grp]["tokens_to_threshold"]) for grp in groups)]
                                           for n, e in recipes.items()])
    return lines


def _timing_line(t: Mapping) -> str:
    mismatch_s = f"{t['mismatch_s']:.1f} s" if "mismatch_s" in t else "not run"
    return (f"Total {t['total_s']:.1f} s: rollouts {t['rollouts_s']:.1f} s, gradients {t['gradients_s']:.1f} s, mismatch "
            f"{mismatch_s} (compiling included); compile time summed over {len(t['compile_s'])} programs "
            f"{t['compile_total_s']:.1f} s (per program: gradients.json).")


def write(results: Mapping, out: str | Path) -> dict[str, Path]:
    """gradients.json (every number but the bootstrap replicates), SCALING_POINT_FILE (this
    measurement as one point of the fit over model sizes: the model, the tokens per batch and the
    batch-scaling components with their replicates), report.md and four PNGs under `out`; returns
    their paths. The raw arrays are written beside them by `fp4rl.studies.gradient_store.save_raw`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / RESULTS_FILE, "report": out / "report.md", "scaling_point": out / SCALING_POINT_FILE}
    replicates = results.get("scaling_replicates", {})
    paths["json"].write_text(json.dumps(_jsonable({k: v for k, v in results.items() if k != "scaling_replicates"}), indent=1))
    clean = json.loads(paths["json"].read_text())
    point = {"model": clean["model"]["config"], "tokens_per_batch": clean["tokens_per_batch"],
             "samples_per_batch": clean["config"]["rollout"]["prompts_per_step"] * clean["config"]["rollout"]["group_size"],
             "batches": clean["batches"], "accuracy": clean["rollouts"]["accuracy"], "init": clean["config"]["init"],
             "warmup_sha256": clean.get("warmup_sha256"), "recipes": replicates}
    paths["scaling_point"].write_text(json.dumps(_jsonable(point)))
    paths["report"].write_text(report_markdown(clean))
    paths["errors_png"] = gradient_plots.plot_errors(clean, out / "gradient_error.png")
    paths["grad_norms_png"] = gradient_plots.plot_grad_norms(clean, out / "grad_norms.png")
    paths["policy_change_png"] = gradient_plots.plot_policy_change(clean, out / "policy_change.png")
    paths["batch_scaling_png"] = gradient_plots.plot_batch_scaling(clean, out / "batch_scaling.png")
    return paths
