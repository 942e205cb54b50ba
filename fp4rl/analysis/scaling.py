"""The fit over model sizes (`python -m experiments.scaling fit`): how the quantities the gradient
measurements' decision rule judges scale with depth and width; checked off the axes and on the largest
rung before it is used; extrapolated to the model a Hugging Face config.json describes (Qwen3-30B-A3B).

Inputs: the SCALING_POINT_FILE every gradient measurement writes (`gradient_report.write`), one per
rung (`fp4rl.configs.SCALING_LADDER`; `python -m experiments.scaling collect` stores it under
results/scaling_h200/RUNG): the rung's model, its loss tokens per stored batch T0, its rollout
accuracy, and per recipe and parameter group the batch-scaling components
(`fp4rl.analysis.batch_scaling`) with their bootstrap replicates:
  A   = incoherent error / RL noise (does not depend on the update size),
  b2  = coherent bias squared (||E[g_r - g_bf16]||^2 / ||E g_bf16||^2),
  T_s = the BF16 gradient's noise scale in tokens (recipe independent; taken from "bf16").

Rungs and their roles (`fp4rl.analysis.scaling_plan.role`): the base (h200's layer at 6 layers); the
depth axis (h200's layer at 8, 16, 32 layers); the width path (6 layers; each step moves d_model, the
routed experts' count, width and top-k, the heads and the shared expert together, from h200's layer to
the paper's, so D stands for the position on that path and a prediction at D holds for the path's layer
there); the off-axis rung (d_model 1024 at 16 layers); and the single-factor rungs (one factor of the
path moved alone from the base), reported against their parent as ratios of the components, not
fitted. A rung the ladder does not name (`--points`) is fitted as a rung on an axis.

Fit form, declared before any rung was measured:
  per recipe, group and component q in {A, b2, T_s}, over the fitted rungs (L layers, D = d_model):
      log q = c + p_L log L + p_D log D                          (ordinary least squares)
  and the tokens per update T enter through batch_scaling's exact relations, not a fit:
      noise_fraction(L, D, T) = A + b2 T / T_s,   coherent_bias = sqrt(b2),
      R(L, D, T) = sqrt((1 + T_s / T) / (b2 + A T_s / T))       (the FP4-All-the-Way yardstick).
  A power law in T fitted to the noise fraction itself would be misspecified: it is a constant plus a
  line in T, whose log-log slope runs from 0 to 1; that local slope, b2 T / (T_s noise_fraction), is
  reported beside each prediction. The form is additive in log L and log D: depth and width act
  independently. The axes vary depth at d_model 512 only and width at 6 layers only, so a prediction at
  (48, 2048) rests on that assumption, which check (1) tests.

Checks, in this order, each predicting a left-out rung from the others (its components and its noise
fraction at its own T0: "consistent" when the measured value lies in the prediction interval):
  (1) off-axis: each off-axis rung from the rungs on the axes; the fit uses it only after this check.
      The extrapolation is "supported" when the headline group's noise fraction is consistent for every
      recipe, "not supported" (naming the recipes) otherwise, and "unchecked" while no off-axis rung is
      measured;
  (2) largest: the largest fitted rung (total parameters) from the other fitted rungs.

Intervals (95%), the union of two:
  (1) measurement: the fit repeated on every rung's stored bootstrap replicates (replicate j of each
      rung together; one rung's components share their resampled batches), percentile interval;
  (2) lack of fit: the OLS t prediction interval of a new rung in log space, t sigma
      sqrt(1 + x0'(X'X)^-1 x0) (t with n - p degrees of freedom), which carries the rungs' scatter
      around the power law and the new rung's own; for a quantity derived from
      the components, the range of its formula over the corners of their intervals (each formula is
      monotone in each component). With n = p there is no (2) and the report says so.

Extrapolation target (`PaperSetting`): the model of a Hugging Face config.json, read by
`fp4rl.model.hf.config_from_hf` (default: tests/fixtures/hf/qwen3_30b_a3b/config.json, Qwen3-30B-A3B: 48
layers, d_model 2048, 128 routed experts x 768, top-8, no shared expert, 32 query and 4 KV heads of
128; selective precision keeps its last 7 of 48 layers in BF16 and nothing else), at T = 2^20 loss
tokens per update, an assumption (e.g. 256 responses x 4096 tokens: --paper.tokens_per_update). The
target is judged on the group of its own parameters, the headline group: without a shared expert
"all_but_shared" (every parameter but the shared expert's: `gradient_report.DERIVED_GROUPS`), whose
components are exact at every rung; the rungs' "shared_expert" group (fitted over the rungs that have
one) and "all" (which holds it) are reported apart, with no prediction for the target. The target's
layer is compared with the widest fitted rung's (what differs besides depth is reported). Its embedding
and LM head (vocabulary 151,936 against the rungs' 128) are BF16 in every recipe; their share of the
target's parameters is not extrapolated. Per recipe and predicted group: the components, the noise
fraction, the coherent bias and R with intervals, the verdict of the rule's criteria (1) and (2)
(criterion (3), the grad-norm tail, is not extrapolated), the tokens per update at which the noise
fraction reaches the threshold (T*), and the depths at which criteria (1) and (2) flip at the target's
width and T. An extrapolation is IMPOSSIBLE, reported so with no number, when the rungs do not vary a
coordinate in which the target differs (its exponent is not identified), when fewer rungs than
parameters are usable, or when a rung's value is not positive (e.g. b2 <= 0: no coherent error detected
there); a target beyond FAR times the measured range is flagged. The link to the dose-response is
`fp4rl.analysis.scaling_dose`'s; the report and the files are `fp4rl.analysis.scaling_report`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fp4rl.analysis import batch_scaling
from fp4rl.analysis.gradient_report import SCALING_POINT_FILE
from fp4rl.analysis.gradient_rule import COHERENT_BIAS_MAX, NOISE_FRACTION_MAX
from fp4rl.analysis.scaling_loglog import (
    CI_LEVEL, LogLogFit, Prediction, derived, exponents, fit_loglog, predict)

COMPONENTS = ("A", "b2", "Ts")
RL_ACCURACY_BAND = (0.2, 0.45)  # docs/rl.md "Task": the warm-up's sampled accuracy on the RL band
FAR = 10.0  # a target coordinate beyond FAR x the measured range is flagged as a far extrapolation
DEPTH_GRID = np.unique(np.round(np.geomspace(1, 10_000, 120)))  # layers, for where the rule flips
RESULTS_FILE, REPORT_FILE, FIGURE_FILE = "scaling_fit.json", "report.md", "scaling_fit.png"
REFERENCE = "bf16"
TARGET_CONFIG = "tests/fixtures/hf/qwen3_30b_a3b/config.json"
FITTED_ROLES = ("base", "depth axis", "width path", "off-axis", "")  # "": a rung the ladder does not name
_REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class PaperSetting:
    """The extrapolation target. hf_config: a Hugging Face config.json (relative paths are tried from
    the working directory, then from the repository); tokens_per_update: loss tokens per optimizer
    update (an assumption: 2^20, e.g. 256 responses x 4096 tokens)."""

    hf_config: str = TARGET_CONFIG
    tokens_per_update: float = float(2**20)

    def __post_init__(self):
        if not self.tokens_per_update > 0:
            raise ValueError(f"need tokens_per_update > 0; got {self}")

    @functools.cached_property
    def model(self):
        """The target's `ModelConfig` (`fp4rl.model.hf.config_from_hf`)."""
        from fp4rl.model.hf import config_from_hf

        path = Path(self.hf_config)
        if not path.is_absolute() and not path.is_file():
            path = _REPO / path
        if not path.is_file():
            raise FileNotFoundError(f"--paper.hf_config={self.hf_config}: no such config.json (default {TARGET_CONFIG})")
        return config_from_hf(json.loads(path.read_text()), dtype="bfloat16")

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def d_model(self) -> int:
        return self.model.d_model

    def summary(self) -> dict:
        """The target as the report states it: its shape, its parameters, its kept BF16 layers."""
        from fp4rl.recipe import PrecisionRecipe

        m, counts = self.model, self.model.param_count()
        kept = PrecisionRecipe.from_name("full").num_high_precision_layers(m.num_layers)
        return {"hf_config": self.hf_config, "tokens_per_update": self.tokens_per_update, "num_layers": m.num_layers,
                "d_model": m.d_model, "num_experts": m.num_experts, "moe_d_ff": m.moe_d_ff, "top_k": m.top_k,
                "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
                "shared_expert_d_ff": m.shared_expert_d_ff, "vocab_size": m.vocab_size, "params_total": counts.total,
                "params_active": counts.active, "kept_bf16_layers": kept}

    def params_at_depth(self, num_layers: float) -> int:
        """Total parameters of the target's model with `num_layers` layers of its layer."""
        return dataclasses.replace(self.model, num_layers=max(1, int(round(num_layers))), dense_layers=()).param_count().total


DOSE_BASES = {"nvfp4": "nvfp4", "+dq": "dq"}  # the dose-response's base recipes -> their DoseLink fields


@dataclasses.dataclass(frozen=True)
class DoseLink:
    """The dose-response's results the fit links to (`fp4rl.analysis.scaling_dose`). nvfp4 / dq: the
    smallest amplification A at which RL failed in the dose-response's nvfp4@A / +dq@A runs (None: not
    measured). reference: the gradient measurement at the dose-response's setting, a
    rung's name or a directory holding the scaling point (default ladder-w512-l8: the dose-response's
    model, h200, on the RL_TASK band; the dose-response ran on h200-chain's task, whose measurement,
    `experiments.gradients --preset h200-chain`, is the closer reference once it exists).
    reference_tokens_per_update: the dose-response's loss tokens per optimizer update (None: the
    reference's tokens per stored batch)."""

    nvfp4: float | None = None
    dq: float | None = None
    reference: str = "ladder-w512-l8"
    reference_tokens_per_update: float | None = None

    def __post_init__(self):
        for name in ("nvfp4", "dq", "reference_tokens_per_update"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"dose.{name}={value} must be a finite number > 0 (or none: not measured)")

    def first_failing(self, recipe: str) -> float | None:
        return getattr(self, DOSE_BASES[recipe])


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """ladder: rung names (empty: fp4rl.configs.SCALING_LADDER); points: measurement directories holding
    SCALING_POINT_FILE (empty: each rung's results/scaling_h200/RUNG); paper: the extrapolation target;
    dose: the dose-response's first failing amplifications (`scaling_dose`); out: where the plan
    (plan.md, plan.json), the fit (report.md, scaling_fit.json, the figure) or the status go."""

    ladder: tuple[str, ...] = ()
    points: tuple[str, ...] = ()
    paper: PaperSetting = PaperSetting()
    dose: DoseLink = DoseLink()
    out: str = "runs/scaling"


# ---------------------------------------------------------------------------------- inputs
def load_point(directory: str | Path) -> dict:
    """One rung: SCALING_POINT_FILE under `directory`, named after the directory."""
    path = Path(directory) / SCALING_POINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is {directory} a rung's collected results "
                                "(python -m experiments.scaling collect) or a gradient measurement's --out?")
    point = json.loads(path.read_text())
    point["dir"], point["name"] = str(directory), Path(directory).name
    return point


def _arr(x) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in x], np.float64)


def rung_summary(point: Mapping, info: Mapping | None = None) -> dict:
    """The rung as the report lists it; info: its ladder entry ({"role", "parent", "moves"})."""
    from fp4rl.model.config import ModelConfig  # param counts of the rung's model

    model = point["model"]
    counts = ModelConfig.from_dict(model).param_count()
    acc = point["accuracy"]
    info = info or {}
    return {"dir": point.get("dir", ""), "name": point.get("name", ""), "role": info.get("role", ""),
            "parent": info.get("parent", ""), "moves": info.get("moves", ""),
            "num_layers": model["num_layers"], "d_model": model["d_model"],
            "shared_expert": bool(model.get("shared_expert_d_ff")),
            "params_total": counts.total, "params_active": counts.active, "tokens_per_batch": point["tokens_per_batch"],
            "batches": point["batches"], "accuracy": acc,
            "in_band": bool(acc["value"] is not None and RL_ACCURACY_BAND[0] <= acc["value"] <= RL_ACCURACY_BAND[1])}


def component(point: Mapping, recipe: str, group: str, name: str) -> tuple[float, np.ndarray]:
    """(value, replicates) of one component; T_s is the BF16 gradient's (the same for every recipe)."""
    source = point["recipes"][REFERENCE if name == "Ts" and REFERENCE in point["recipes"] else recipe][group][name]
    value = np.nan if source["value"] is None else float(source["value"])
    return value, _arr(source["replicates"])


def component_ci(point: Mapping, recipe: str, group: str, name: str) -> dict:
    """{"value", "lo", "hi"}: one component at one rung with its bootstrap percentile interval."""
    value, reps = component(point, recipe, group, name)
    lo, hi = _pct(reps)
    return {"value": None if not np.isfinite(value) else value, "lo": lo, "hi": hi}


def _pct(values: np.ndarray) -> tuple[float | None, float | None]:
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return None, None
    a = (1 - CI_LEVEL) / 2
    return tuple(float(q) for q in np.quantile(v, [a, 1 - a], method="nearest"))


def noise_fraction_fn(tokens):
    return lambda a, b2, ts: batch_scaling.noise_fraction_tokens({"A": a, "b2": b2, "Ts": ts}, tokens)


def yardstick_fn(tokens):
    return lambda a, b2, ts: batch_scaling.yardstick_tokens({"A": a, "b2": b2, "Ts": ts}, tokens)


def _tokens_to_threshold(a, b2, ts):
    return batch_scaling.tokens_to_threshold({"A": a, "b2": b2, "Ts": ts}, NOISE_FRACTION_MAX)


def _verdict(p: Prediction, threshold: float) -> str:
    if p.error:
        return "IMPOSSIBLE"
    if p.hi < threshold:
        return "passes"
    if p.lo > threshold:
        return "exceeds"
    return "undecided"


# ---------------------------------------------------------------------------------- analysis
def has_group(point: Mapping, group: str) -> bool:
    """Whether the rung's model has the group's parameters (a model without a shared expert has no
    "shared_expert" group: its components are not defined there, and no error of the fit)."""
    return not (group == "shared_expert" and not point["model"].get("shared_expert_d_ff"))


def fits_for(points: Sequence[Mapping], recipe: str, group: str) -> dict[str, LogLogFit]:
    """The log-log fit of each component over the rungs that have the group."""
    points = [p for p in points if has_group(p, group)]
    coords = np.array([[p["model"]["num_layers"], p["model"]["d_model"]] for p in points], np.float64).reshape(-1, 2)
    out = {}
    for name in COMPONENTS:
        values, reps = zip(*(component(p, recipe, group, name) for p in points)) if points else ((), ())
        j = min((len(r) for r in reps), default=0)
        out[name] = fit_loglog(coords, values, np.stack([r[:j] for r in reps]) if reps else np.zeros((0, 0)))
    return out


def at_target(fits: Mapping[str, LogLogFit], num_layers: float, d_model: float, tokens: float) -> dict:
    parts = {k: predict(fits[k], num_layers, d_model) for k in COMPONENTS}
    nf = derived(noise_fraction_fn(tokens), parts)
    bias = derived(lambda a, b2, ts: np.sqrt(np.maximum(b2, 0.0)), parts)
    ratio = derived(yardstick_fn(tokens), parts)
    t_star = derived(_tokens_to_threshold, parts)
    slope = None
    if not nf.error and nf.value > 0:
        slope = float(parts["b2"].value * tokens / parts["Ts"].value / nf.value)
    return {"components": {k: p.as_dict() for k, p in parts.items()}, "noise_fraction": nf.as_dict(),
            "noise_fraction_norm": _sqrt_dict(nf), "coherent_bias": bias.as_dict(), "fp4_ratio": ratio.as_dict(),
            "tokens_to_threshold": t_star.as_dict(), "noise_fraction_loglog_slope_in_tokens": slope,
            "verdict": {"noise_fraction": _verdict(nf, NOISE_FRACTION_MAX), "coherent_bias": _verdict(bias, COHERENT_BIAS_MAX),
                        "fp4_ratio_below_sqrt3": ("IMPOSSIBLE" if ratio.error else "yes" if ratio.hi < batch_scaling.SQRT3
                                                  else "no" if ratio.lo > batch_scaling.SQRT3 else "undecided")}}


def _sqrt_dict(p: Prediction) -> dict:
    if p.error:
        return p.as_dict()
    return {k: (None if v is None or v < 0 else math.sqrt(v)) for k, v in p.as_dict().items() if k in ("value", "lo", "hi")}


def flip_depths(fits: Mapping[str, LogLogFit], d_model: float, tokens: float,
                noise_threshold: float = NOISE_FRACTION_MAX) -> dict:
    """Along depth at the given width and tokens per update: the depths (in DEPTH_GRID) at which the
    point prediction of criterion (1) (noise fraction vs `noise_threshold`) and of criterion (2)
    (coherent bias vs its threshold) crosses, and where its interval starts to lie wholly above."""
    parts = [{k: predict(fits[k], L, d_model) for k in COMPONENTS} for L in DEPTH_GRID]
    if any(p[k].error for p in parts[:1] for k in COMPONENTS):
        return {"impossible": "; ".join(f"{k}: {parts[0][k].error}" for k in COMPONENTS if parts[0][k].error)}
    out = {}
    for name, fn, threshold in (("noise_fraction", noise_fraction_fn(tokens), noise_threshold),
                                ("coherent_bias", lambda a, b2, ts: np.sqrt(np.maximum(b2, 0.0)), COHERENT_BIAS_MAX)):
        preds = [derived(fn, p) for p in parts]
        value = np.array([p.value for p in preds])
        above = value > threshold
        crossings = [float(DEPTH_GRID[i + 1]) for i in range(len(above) - 1) if above[i] != above[i + 1]]
        surely = [float(L) for L, p in zip(DEPTH_GRID, preds) if p.lo > threshold]
        out[name] = {"crossings": crossings, "first_depth_wholly_above": surely[0] if surely else None,
                     "above_at_1_layer": bool(above[0]), "grid": [float(DEPTH_GRID[0]), float(DEPTH_GRID[-1])]}
    return out


def check_rung(fit_points: Sequence[Mapping], held: Mapping, recipe: str, group: str) -> dict:
    """The held-out check of one rung: its components and its noise fraction at its own T0, measured
    against the prediction of the fit over `fit_points`."""
    if not has_group(held, group):
        return {"rung": held.get("name") or held.get("dir", ""), "not_applicable": f"the rung has no {group} group"}
    L, D, T0 = held["model"]["num_layers"], held["model"]["d_model"], held["tokens_per_batch"]
    predicted = at_target(fits_for(fit_points, recipe, group), L, D, T0)
    measured = {k: component(held, recipe, group, k)[0] for k in COMPONENTS}
    measured_nf = float(batch_scaling.noise_fraction_tokens({k: np.asarray(v) for k, v in measured.items()}, T0))
    check = {"rung": held.get("name") or held.get("dir", "")}
    for name, pred, value in [*((k, predicted["components"][k], measured[k]) for k in COMPONENTS),
                              ("noise_fraction", predicted["noise_fraction"], measured_nf)]:
        if pred.get("impossible") or not np.isfinite(value):
            check[name] = {"measured": value, "predicted": pred, "result": "impossible"}
        else:
            inside = pred["lo"] <= value <= pred["hi"]
            check[name] = {"measured": value, "predicted": pred, "result": "consistent" if inside else "inconsistent"}
    return check


def factor_effects(points: Mapping[str, Mapping], infos: Mapping[str, Mapping], recipe: str, group: str) -> dict:
    """Per single-factor rung whose parent is measured: each component's ratio rung / parent, with the
    percentile interval of the ratio of their replicates (independent resamples, paired by index)."""
    out = {}
    for name, info in infos.items():
        parent = info.get("parent", "")
        if info.get("role") != "factor" or name not in points or parent not in points:
            continue
        rung, base = points[name], points[parent]
        if not (has_group(rung, group) and has_group(base, group)):
            continue
        entry = {"parent": parent, "moves": info.get("moves", "")}
        for k in COMPONENTS:
            (v, r), (v0, r0) = component(rung, recipe, group, k), component(base, recipe, group, k)
            n = min(len(r), len(r0))
            with np.errstate(divide="ignore", invalid="ignore"):
                lo, hi = _pct(r[:n] / r0[:n])
                entry[k] = {"value": float(v / v0) if np.isfinite(v / v0) else None, "lo": lo, "hi": hi}
        out[name] = entry
    return out


def target_groups(groups: Sequence[str], paper: PaperSetting) -> tuple[list[str], str, dict]:
    """(the groups predicted for the target, its headline group, the groups reported apart with why)."""
    if paper.model.shared_expert_d_ff:
        return list(groups), "all", {}
    apart = {"shared_expert": "the target has no shared expert",
             "all": "holds the rungs' shared expert, which the target has not: all_but_shared stands for it"}
    if "all_but_shared" not in groups:
        raise ValueError("the target has no shared expert, and the rungs' measurements lack the group all_but_shared: "
                         "analyse them again (python -m experiments.gradients --merge=DIR --out=DIR) to derive it")
    return [g for g in groups if g not in apart], "all_but_shared", {g: why for g, why in apart.items() if g in groups}


def _support(off_axis_checks: Mapping[str, Mapping], recipes: Sequence[str], measured: Sequence[str]) -> dict:
    """Check (1)'s verdict on the headline group (module docstring)."""
    if not measured:
        return {"status": "unchecked", "text": "unchecked: no off-axis rung is measured; the additive form in log L and log D "
                                               "is an untested assumption"}
    failed = sorted({r for r in recipes for rung in measured
                     if off_axis_checks[r][rung]["noise_fraction"]["result"] != "consistent"})
    if failed:
        return {"status": "not supported", "text": "not supported: the off-axis rung's noise fraction lies outside its "
                                                   f"prediction for {', '.join(failed)}", "recipes": failed}
    return {"status": "supported", "text": f"supported: the off-axis rung{'s' if len(measured) > 1 else ''} "
                                           f"({', '.join(measured)}) lie{'' if len(measured) > 1 else 's'} in the "
                                           "prediction of every recipe's noise fraction"}


def target_vs_widest(paper: PaperSetting, points: Sequence[Mapping]) -> str:
    """What the target's layer changes from the widest fitted rung's, besides depth (`scaling_plan.moves`)."""
    from fp4rl.analysis.scaling_plan import moves
    from fp4rl.model.config import ModelConfig

    widest = max(points, key=lambda p: (p["model"]["d_model"], p["model"]["num_layers"]))
    mc = ModelConfig.from_dict(widest["model"])
    target = dataclasses.replace(paper.model, num_layers=mc.num_layers, vocab_size=mc.vocab_size,
                                 max_seq_len=mc.max_seq_len, dtype=mc.dtype, expert_gemm=mc.expert_gemm)
    changed = moves(mc, target)
    return f"{widest.get('name') or widest.get('dir')}: " + ("the same layer" if changed == "nothing" else changed)


def analyze(points: Sequence[Mapping], paper: PaperSetting = PaperSetting(), infos: Mapping[str, Mapping] | None = None) -> dict:
    """The fits, the held-out checks, the extrapolation and the single factors of every recipe and group
    of the rungs; infos: rung name -> its ladder entry ({"role", "parent", "moves"})."""
    infos = infos or {}
    names = [p.get("name") or p.get("dir", str(i)) for i, p in enumerate(points)]
    if len(set(names)) < len(names):
        raise ValueError(f"rungs named twice: {sorted({n for n in names if names.count(n) > 1})}: give each "
                         "measurement its own directory name")
    by_name = dict(zip(names, points))
    role = {n: infos.get(n, {}).get("role", "") for n in by_name}
    fitted = [p for n, p in by_name.items() if role[n] in FITTED_ROLES]
    if len(fitted) < 2:
        raise ValueError(f"need at least 2 rungs to fit; got {len(fitted)} (of {len(points)}: "
                         "single-factor rungs are not fitted)")
    rungs = [rung_summary(p, infos.get(n)) for n, p in by_name.items()]
    recipes = [r for r in points[0]["recipes"] if r != REFERENCE and all(r in p["recipes"] for p in points)]
    groups = ([g for g in points[0]["recipes"][recipes[0]] if all(g in p["recipes"][r] for p in points for r in recipes)]
              if recipes else [])
    predicted_groups, headline, apart = target_groups(groups, paper)
    off_axis = [n for n, p in by_name.items() if role[n] == "off-axis"]
    on_axes = [p for n, p in by_name.items() if role[n] in FITTED_ROLES and role[n] != "off-axis"]
    fitted_names = [n for n in by_name if role[n] in FITTED_ROLES]
    largest = max(fitted_names, key=lambda n: rung_summary(by_name[n])["params_total"])
    coords = np.array([[p["model"]["num_layers"], p["model"]["d_model"]] for p in fitted], np.float64)
    measured_tokens = [r["tokens_per_batch"] for r in rungs] + [r["tokens_per_batch"] * r["batches"] for r in rungs]
    far = {"num_layers": paper.num_layers / coords[:, 0].max(), "d_model": paper.d_model / coords[:, 1].max(),
           "tokens_per_update": paper.tokens_per_update / max(measured_tokens)}
    out = {"paper": paper.summary(), "rungs": rungs, "recipes": recipes, "groups": groups, "headline_group": headline,
           "predicted_groups": predicted_groups, "reported_apart": apart, "fitted": fitted_names,
           "held_out": by_name[largest]["dir"], "held_out_name": largest, "off_axis": off_axis,
           "target_vs_widest": target_vs_widest(paper, fitted),
           "far_extrapolation": {k: v for k, v in far.items() if v > FAR}, "extrapolation_ratios": far, "fits": {},
           "factor_effects": {}}
    for recipe in recipes:
        out["fits"][recipe] = {}
        out["factor_effects"][recipe] = factor_effects(by_name, infos, recipe, headline) if headline in groups else {}
        for group in groups:
            fits = fits_for(fitted, recipe, group)
            entry = {"exponents": {k: exponents(f) for k, f in fits.items()},
                     "per_rung": {n: {k: component_ci(p, recipe, group, k) for k in COMPONENTS}
                                  for n, p in by_name.items() if has_group(p, group)},
                     "off_axis_checks": {n: check_rung(on_axes, by_name[n], recipe, group) for n in off_axis},
                     "held_out_check": check_rung([by_name[n] for n in fitted_names if n != largest], by_name[largest],
                                                  recipe, group)}
            if group in predicted_groups:
                entry["paper"] = at_target(fits, paper.num_layers, paper.d_model, paper.tokens_per_update)
                entry["flip_depth"] = flip_depths(fits, paper.d_model, paper.tokens_per_update)
            else:
                entry["reported_apart"] = apart[group]
            out["fits"][recipe][group] = entry
    checks = {r: out["fits"][r][headline]["off_axis_checks"] for r in recipes} if headline in groups else {}
    out["support"] = _support(checks, recipes, off_axis) if checks else {"status": "unchecked", "text": "no headline group"}
    return out
