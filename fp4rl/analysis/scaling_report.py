"""The fit over model sizes (`fp4rl.analysis.scaling` computes it) linked to the dose-response
(`fp4rl.analysis.scaling_dose`), as markdown, a figure and scaling_fit.json."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fp4rl.analysis import batch_scaling, scaling, scaling_dose
from fp4rl.analysis.gradient_report import _jsonable
from fp4rl.analysis.gradient_rule import COHERENT_BIAS_MAX, NOISE_FRACTION_MAX
from fp4rl.analysis.plots import arm_color


def _fmt(c) -> str:
    if c is None:
        return "n/a"
    if c.get("impossible"):
        return "IMPOSSIBLE"
    f = lambda x: "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"  # noqa: E731
    return f"{f(c['value'])} [{f(c['lo'])}, {f(c['hi'])}]"


def _num(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _table(header, rows) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def _sqrt(c):
    if c is None or c.get("value") is None:
        return None
    return {k: None if c.get(k) is None else float(np.sqrt(max(c[k], 0))) for k in ("value", "lo", "hi")}


def _target(results: Mapping) -> list[str]:
    p = results["paper"]
    shared = f"a shared expert of width {p['shared_expert_d_ff']}" if p["shared_expert_d_ff"] else "no shared expert"
    lines = [f"Extrapolation target (`{p['hf_config']}`): {p['num_layers']} layers, d_model {p['d_model']}, "
             f"{p['num_experts']} routed experts x {p['moe_d_ff']}, top-{p['top_k']}, {shared}, {p['num_heads']} query and "
             f"{p['num_kv_heads']} KV heads of {p['head_dim']}; {p['params_total'] / 1e9:.1f}B parameters "
             f"({p['params_active'] / 1e9:.2f}B active); selective precision keeps {p['kept_bf16_layers']} of "
             f"{p['num_layers']} layers in BF16" + ("" if p["shared_expert_d_ff"] else " and nothing else") + f"; "
             f"{p['tokens_per_update']:.0f} loss tokens per update (an assumption; --paper.tokens_per_update).", "",
             f"The target's layer against the widest fitted rung's, {results['target_vs_widest']}. Its embedding and LM head "
             f"(vocabulary {p['vocab_size']:,}) are BF16 in every recipe; their share of its parameters is not extrapolated.", "",
             f"Headline group: `{results['headline_group']}`."]
    for group, why in results["reported_apart"].items():
        lines.append(f"Reported apart, no prediction for the target: `{group}` ({why}).")
    return lines + [""]


def _rungs(results: Mapping) -> list[str]:
    band = f"**NO** ({scaling.RL_ACCURACY_BAND[0]}-{scaling.RL_ACCURACY_BAND[1]})"
    lines = ["## Rungs", ""]
    lines += _table(["rung", "role", "moves", "layers", "d_model", "shared expert", "params", "active",
                     "loss tokens per batch", "rollout accuracy", "in RL band"],
                    [[r["name"] or r["dir"], r["role"] or "(not in the ladder: fitted)", r["moves"] or "", r["num_layers"],
                      r["d_model"], "yes" if r["shared_expert"] else "no", f"{r['params_total'] / 1e6:,.1f}M",
                      f"{r['params_active'] / 1e6:,.1f}M", f"{r['tokens_per_batch']:.0f}", _fmt(r["accuracy"]),
                      "yes" if r["in_band"] else band] for r in results["rungs"]])
    out_of_band = [r["name"] or r["dir"] for r in results["rungs"] if not r["in_band"]]
    if out_of_band:
        lines += ["", f"Rungs outside the RL band {scaling.RL_ACCURACY_BAND}: {', '.join(out_of_band)}; their warm-ups are not "
                  "at the ladder's parameter point."]
    return lines


def _per_rung(results: Mapping, g: str) -> list[str]:
    lines = ["", f"## A, b and T_s per rung, group '{g}' (noise_fraction(T) = A + b^2 T / T_s)", ""]
    names = [r["name"] or r["dir"] for r in results["rungs"]]
    rows = []
    for recipe in results["recipes"]:
        per = results["fits"][recipe][g]["per_rung"]
        for n in names:
            if n in per:
                c = per[n]
                rows.append([recipe, n, _fmt(c["A"]), _fmt(_sqrt(c["b2"])), _fmt(c["Ts"])])
    return lines + _table(["recipe", "rung", "A", "b", "T_s (tokens)"], rows)


def _exponents(results: Mapping, g: str) -> list[str]:
    fits = results["fits"]
    lines = ["", f"## Exponents, group '{g}' (log q = c + p_L log L + p_D log D, over the fitted rungs)", ""]
    rows = []
    for recipe in results["recipes"]:
        e = fits[recipe][g]["exponents"]
        cell = lambda q, k: ("IMPOSSIBLE" if e[q].get("impossible")  # noqa: E731
                             else _fmt(e[q][k]) if not e[q].get(k, {}).get("impossible") else "not identified")
        rows.append([recipe, *(cell(q, k) for q in scaling.COMPONENTS for k in ("depth_exponent", "width_exponent"))])
    lines += _table(["recipe", "A: p_L", "A: p_D", "b^2: p_L", "b^2: p_D", "T_s: p_L", "T_s: p_D"], rows)
    dofs = {e.get("dof") for r in results["recipes"] for e in fits[r][g]["exponents"].values()} - {None}
    if 0 in dofs:
        lines += ["", "Some fits have as many usable rungs as parameters (no residual degrees of freedom): their intervals "
                  "carry the measurement noise only, not the rungs' scatter around the power law."]
    return lines


CHECKED = ("A", "b2", "Ts", "noise_fraction")


def _check_rows(results: Mapping, g: str, pick) -> list[list[str]]:
    rows = []
    for recipe in results["recipes"]:
        for check in pick(results["fits"][recipe][g]):
            if check.get("not_applicable"):
                rows.append([recipe, check["rung"], *(["n/a"] * len(CHECKED)), check["not_applicable"]])
                continue
            rows.append([recipe, check["rung"], *(f"{_num(check[k]['measured'])} / {_fmt(check[k]['predicted'])}"
                                                  for k in CHECKED),
                         ", ".join(sorted({check[k]["result"] for k in CHECKED}))])
    return rows


def _checks(results: Mapping, g: str) -> list[str]:
    header = ["recipe", "rung", *(f"{k}: measured / predicted" for k in CHECKED), "result"]
    lines = ["", f"## Check (1), off the axes: each off-axis rung predicted from the rungs on the axes, group '{g}'", "",
             f"Extrapolation: **{results['support']['text']}**.", ""]
    if results["off_axis"]:
        lines += _table(header, _check_rows(results, g, lambda f: f["off_axis_checks"].values()))
    lines += ["", f"## Check (2): {results['held_out_name']} (the largest fitted rung) predicted from the other fitted rungs, "
              f"group '{g}'", ""]
    return lines + _table(header, _check_rows(results, g, lambda f: [f["held_out_check"]]))


def _extrapolation(results: Mapping, g: str) -> list[str]:
    fits, support = results["fits"], results["support"]["status"]
    mark = "" if support == "supported" else f" ({support})"
    lines = ["", f"## Extrapolation to the target, group '{g}'{mark}", ""]
    rows = []
    for recipe in results["recipes"]:
        p = fits[recipe][g]["paper"]
        rows.append([recipe, _fmt(p["noise_fraction"]), _fmt(p["noise_fraction_norm"]), _fmt(p["coherent_bias"]),
                     _fmt(p["fp4_ratio"]), _fmt(p["tokens_to_threshold"]), p["verdict"]["noise_fraction"],
                     p["verdict"]["coherent_bias"], p["verdict"]["fp4_ratio_below_sqrt3"]])
    lines += _table(["recipe", "noise fraction", "(norm)", "coherent bias", "R = ||g|| / ||error||", "T* (tokens)",
                     f"(1) vs {NOISE_FRACTION_MAX:g}", f"(2) vs {COHERENT_BIAS_MAX:g}", "R < sqrt(3)"], rows)
    impossible = sorted({p["noise_fraction"]["impossible"] for r in results["recipes"]
                         if (p := fits[r][g]["paper"])["noise_fraction"].get("impossible")})
    if impossible:
        lines += ["", "IMPOSSIBLE extrapolations: " + " | ".join(impossible)]
    lines += ["", "Components at the target (A, b, T_s):", ""]
    lines += _table(["recipe", "A", "b", "T_s"],
                    [[r, _fmt(c["A"]), "IMPOSSIBLE" if c["b2"].get("impossible") else _fmt(_sqrt(c["b2"])), _fmt(c["Ts"])]
                     for r in results["recipes"] for c in [fits[r][g]["paper"]["components"]]])
    lines += ["", "## Where the rule flips, per recipe (at the target's width and tokens per update)", ""]
    rows = []
    for recipe in results["recipes"]:
        f = fits[recipe][g]["flip_depth"]
        rows.append([recipe, "IMPOSSIBLE", "IMPOSSIBLE"] if f.get("impossible")
                    else [recipe, *(_flip(f[k]) for k in ("noise_fraction", "coherent_bias"))])
    return lines + _table(["recipe", f"(1) noise fraction crosses {NOISE_FRACTION_MAX:g}",
                           f"(2) coherent bias crosses {COHERENT_BIAS_MAX:g}"], rows)


def _apart(results: Mapping) -> list[str]:
    lines = []
    for group, why in results["reported_apart"].items():
        lines += ["", f"## Group '{group}', reported apart ({why})", ""]
        rows = []
        for recipe in results["recipes"]:
            f = results["fits"][recipe][group]
            e = f["exponents"]
            exps = ("IMPOSSIBLE: " + e["A"]["impossible"] if e["A"].get("impossible")
                    else f"A: p_L {_fmt(e['A'].get('depth_exponent'))}, p_D {_fmt(e['A'].get('width_exponent'))}")
            per = "; ".join(f"{n}: A {_fmt(c['A'])}, b {_fmt(_sqrt(c['b2']))}" for n, c in f["per_rung"].items())
            rows.append([recipe, exps, per])
        lines += _table(["recipe", "fit over the rungs that have it", "per rung"], rows)
    return lines


def _factors(results: Mapping, g: str) -> list[str]:
    effects = results["factor_effects"]
    if not any(effects.values()):
        return []
    lines = ["", f"## Single factors, group '{g}': component ratios rung / parent", ""]
    rows = [[recipe, name, e["moves"], *(_fmt(e[k]) for k in scaling.COMPONENTS)]
            for recipe, per in effects.items() for name, e in per.items()]
    return lines + _table(["recipe", "rung", "moves (from its parent)", "A ratio", "b^2 ratio", "T_s ratio"], rows)


def _dose(results: Mapping) -> list[str]:
    if "dose_link" not in results:  # `scaling.analyze` alone: `run` adds the link
        return []
    d = results["dose_link"]
    lines = ["", f"## Link to the dose-response, group '{d['group']}'", "",
             f"Assumption: {d['assumption']}: error/noise at dose A = A x error/noise at A = 1. Reference: `{d['reference']}` "
             f"at {_num(d['reference_tokens_per_update'])} loss tokens per update.", ""]
    if d.get("reference_missing"):
        lines += [d["reference_missing"] + ".", ""]
    for base, e in d["bases"].items():
        a_f = e["first_failing"]
        lines += [f"**{base}@A**: RL first fails at A = " + ("not measured" if a_f is None else f"{a_f:g}") + "; error/noise "
                  f"(norm) at the reference {_fmt(e['rho_reference'])}" + ("" if e["rho_at_failure"] is None else
                                                                          f", at failure {_fmt(e['rho_at_failure'])}") + ".", ""]
        rows = [[n, _fmt(r["rho"]), _fmt(r.get("dose_equivalent")), "not measured" if a_f is None else f"{a_f:g}",
                 _fmt(r.get("tokens_to_failure")), r.get("predicted", "n/a")] for n, r in e["rungs"].items()]
        lines += _table(["rung", "error/noise (norm) at its T0", "dose equivalent A_eq (at T_ref)", "A_f (first failing)",
                         "tokens per update to failure", "RL at the rung"], rows)
        if "depth_to_failure" in e:
            f = e["depth_to_failure"]
            text = ("IMPOSSIBLE: " + f["impossible"] if f.get("impossible") else _flip(f) + (
                "; parameters there: " + ", ".join(f"{p / 1e9:.1f}B" for p in f["params_at_crossings"])
                if f["params_at_crossings"] else ""))
            lines += ["", f"Depth at which the target's error/noise reaches the failing level (at its width and tokens per "
                      f"update): {text}."]
        lines.append("")
    return lines


def report_markdown(results: Mapping) -> str:
    g = results["headline_group"]
    fit_form = scaling.__doc__[scaling.__doc__.index("Fit form"):scaling.__doc__.index("Intervals (95%)")].strip()
    lines = ["# Gradient error over model sizes: fit, checks, extrapolation", "",
             "## Fit form and checks (declared before the data)", "", "```", fit_form, "```", ""]
    lines += _target(results)
    if results["far_extrapolation"]:
        lines += ["**Far extrapolation**: the target exceeds the measured range by "
                  + ", ".join(f"{v:.1f}x in {k}" for k, v in results["far_extrapolation"].items()) + ".", ""]
    lines += _rungs(results)
    if g in results["groups"]:
        lines += _per_rung(results, g) + _exponents(results, g) + _checks(results, g) + _extrapolation(results, g)
    lines += _apart(results) + _factors(results, g) + _dose(results)
    lines += ["## Verdict per predicted group at the target ((1) / (2))", ""]
    lines += _table(["recipe", *results["predicted_groups"]],
                    [[recipe, *(f"{results['fits'][recipe][grp]['paper']['verdict']['noise_fraction']} / "
                                f"{results['fits'][recipe][grp]['paper']['verdict']['coherent_bias']}"
                                for grp in results["predicted_groups"])] for recipe in results["recipes"]])
    lines += ["", "Criterion (3), the grad-norm tail, is measured per rung only (not extrapolated).", ""]
    return "\n".join(lines)


def _flip(f: Mapping) -> str:
    lo, hi = f["grid"]
    if not f["crossings"]:
        return f"no crossing in {lo:g}-{hi:g} layers ({'above' if f['above_at_1_layer'] else 'below'} throughout)"
    text = "at " + ", ".join(f"{L:g}" for L in f["crossings"]) + " layers"
    if f["first_depth_wholly_above"] is not None:
        text += f"; interval wholly above from {f['first_depth_wholly_above']:g}"
    return text


def plot(results: Mapping, points: Sequence[Mapping], path: Path) -> Path:
    """The headline group: A and b^2 against depth (at the narrowest width) and width (at the shallowest
    depth of the width rungs), measured (points, bootstrap interval) and fitted (lines); the noise fraction
    against tokens per update at the target's depth and width with its interval and the threshold."""
    g = results["headline_group"]
    coords = np.array([[p["model"]["num_layers"], p["model"]["d_model"]] for p in points], np.float64)
    fig = Figure(figsize=(15, 8.5), layout="constrained")
    axes = fig.subplots(2, 3)
    d_min = coords[:, 1].min()
    depth_rungs = coords[:, 1] == d_min
    l_width = coords[~depth_rungs, 0].min() if np.any(~depth_rungs) else coords[:, 0].min()
    width_rungs = coords[:, 0] == l_width
    paper = results["paper"]
    for recipe in results["recipes"]:
        color = arm_color(recipe)
        fits = scaling.fits_for(points, recipe, g)
        for row, (axis, mask, fixed) in enumerate((("L", depth_rungs, d_min), ("D", width_rungs, l_width))):
            for col, name in enumerate(("A", "b2")):
                ax = axes[row, col]
                xs = coords[mask, 0 if axis == "L" else 1]
                vals = [scaling.component(p, recipe, g, name) for p, m in zip(points, mask) if m]
                v = np.array([x[0] for x in vals])
                lo = np.array([np.nanpercentile(x[1], 2.5) if np.isfinite(x[1]).any() else np.nan for x in vals])
                hi = np.array([np.nanpercentile(x[1], 97.5) if np.isfinite(x[1]).any() else np.nan for x in vals])
                ok = v > 0
                ax.errorbar(xs[ok], v[ok], yerr=[np.clip(v - lo, 0, None)[ok], np.clip(hi - v, 0, None)[ok]], fmt="o",
                            color=color, capsize=2)
                end = paper["num_layers"] if axis == "L" else paper["d_model"]
                grid = np.geomspace(min(xs.min(), end), max(xs.max(), end), 50) if xs.size else np.zeros(0)
                pred = [scaling.predict(fits[name], x, fixed) if axis == "L" else scaling.predict(fits[name], fixed, x)
                        for x in grid]
                if pred and not pred[0].error:
                    ax.plot(grid, [p.value for p in pred], color=color, linewidth=1, label=recipe)
        ax = axes[0, 2]
        tokens = np.geomspace(1e3, 1e8, 60)
        parts = {k: scaling.predict(fits[k], paper["num_layers"], paper["d_model"]) for k in scaling.COMPONENTS}
        if not any(p.error for p in parts.values()):
            nf = [scaling.derived(scaling.noise_fraction_fn(t), parts) for t in tokens]
            ax.plot(tokens, [p.value for p in nf], color=color, label=recipe)
            ax.fill_between(tokens, [p.lo for p in nf], [p.hi for p in nf], color=color, alpha=0.12, linewidth=0)
    titles = {(0, 0): "A (incoherent error / noise) vs depth", (0, 1): "b^2 (coherent bias^2) vs depth",
              (1, 0): "A vs d_model", (1, 1): "b^2 vs d_model"}
    for (r, c), title in titles.items():
        axes[r, c].set_title(f"{title} ({g})", fontsize=10)
        axes[r, c].set_xlabel("layers" if r == 0 else "d_model")
    ax = axes[0, 2]
    ax.axhline(NOISE_FRACTION_MAX, color="#d62728", linestyle="--", linewidth=1)
    ax.axvline(paper["tokens_per_update"], color="0.4", linestyle=":", linewidth=1)
    ax.set_title(f"Noise fraction at {paper['num_layers']} layers x d_model {paper['d_model']}", fontsize=10)
    ax.set_xlabel("loss tokens per update")
    axes[1, 2].axis("off")
    axes[1, 2].text(0, 0.5, "points: measured rungs (95% bootstrap)\nlines: fitted power laws, extended to the target's\n"
                    f"depth / width; dashed: the rule's {NOISE_FRACTION_MAX:g};\ndotted: the assumed tokens per update;\n"
                    f"R < sqrt(3) = {batch_scaling.SQRT3:.3f}: the FP4-All-the-Way line", fontsize=9, va="center")
    for ax in (*axes[:, :2].ravel(), axes[0, 2]):
        if ax.has_data():
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncols=2, frameon=False)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def run(config: scaling.ScalingConfig, directories: Sequence[str], infos: Mapping[str, Mapping] | None = None) -> dict:
    """Fit the rungs under `directories` (`scaling.analyze`), link them to the dose-response
    (`scaling_dose`), write report.md, scaling_fit.json and the figure under config.out; returns the results."""
    points = [scaling.load_point(d) for d in directories]
    results = scaling.analyze(points, config.paper, infos)
    results["dose_link"] = scaling_dose.link_fit(results, points, config.paper, config.dose)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / scaling.RESULTS_FILE).write_text(json.dumps(_jsonable(results), indent=1))
    clean = json.loads((out / scaling.RESULTS_FILE).read_text())
    (out / scaling.REPORT_FILE).write_text(report_markdown(clean))
    plot(results, [p for p in points if p["name"] in clean["fitted"]], out / scaling.FIGURE_FILE)
    return clean
