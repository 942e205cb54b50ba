"""The fit over model sizes (`python -m experiments.scaling fit`): how the quantities the gradient
measurements' decision rule judges scale with depth, width and tokens per update; checked on the
largest rung; extrapolated to the paper's setting.

Inputs: the SCALING_POINT_FILE every gradient measurement writes (`gradient_report.write`), one per
rung of the ladder (`fp4rl.configs.SCALING_LADDER`): the rung's model, its loss tokens per stored
batch T0, its rollout accuracy, and per recipe and parameter group the batch-scaling components
(`fp4rl.analysis.batch_scaling`) with their bootstrap replicates:
  A   = incoherent error / RL noise (does not depend on the update size),
  b2  = coherent bias squared (||E[g_r - g_bf16]||^2 / ||E g_bf16||^2),
  T_s = the BF16 gradient's noise scale in tokens (recipe independent; taken from "bf16").

Fit form, declared before any rung was measured:
  per recipe, group and component q in {A, b2, T_s}, over the rungs (L layers, D = d_model):
      log q = c + p_L log L + p_D log D                          (ordinary least squares)
  and the tokens per update T enter through batch_scaling's exact relations, not a fit:
      noise_fraction(L, D, T) = A + b2 T / T_s,   coherent_bias = sqrt(b2),
      R(L, D, T) = sqrt((1 + T_s / T) / (b2 + A T_s / T))       (the FP4-All-the-Way yardstick).
  A power law in T fitted to the noise fraction itself would be misspecified: it is a constant plus a
  line in T, whose log-log slope runs from 0 to 1; that local slope, b2 T / (T_s noise_fraction), is
  reported beside each prediction.

Intervals (95%), the union of two:
  (1) measurement: the fit repeated on every rung's stored bootstrap replicates (replicate j of each
      rung together; one rung's components share their resampled batches), percentile interval;
  (2) lack of fit: the OLS t interval of the fitted mean in log space (t with n - p degrees of
      freedom), which carries the rungs' scatter around the power law; for a quantity derived from
      the components, the range of its formula over the corners of their intervals (each formula is
      monotone in each component). With n = p there is no (2) and the report says so.

Check: the largest rung (total parameters) is left out, the others fitted, and its components and
its noise fraction at its own T0 predicted: "consistent" when its measured value lies in the
prediction interval, "inconsistent" otherwise.

Extrapolation to the paper's setting (`PaperSetting`): 48 layers of the widest rung's layer (d_model
2048, 128 experts x 768, top-8) and T = 2^20 loss tokens per update, an assumption (e.g. 256 responses
x 4096 tokens; the paper's batch is not known here: pass --paper.tokens_per_update). Per recipe and
group: the components, the noise fraction, the coherent bias and R with intervals, the verdict of the
rule's criteria (1) and (2) (criterion (3), the grad-norm tail, is not extrapolated), the tokens per
update at which the noise fraction reaches the threshold (T*), and the depths at which criteria (1)
and (2) flip at the paper's width and T. An extrapolation is IMPOSSIBLE, reported so with no number,
when the rungs do not vary a coordinate in which the target differs (its exponent is not identified),
when fewer rungs than parameters are usable, or when a rung's value is not positive (e.g. b2 <= 0:
no coherent error detected there); a target beyond FAR times the measured range is flagged.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from scipy.stats import t as student_t

from fp4rl.analysis import batch_scaling
from fp4rl.analysis.gradient_report import SCALING_POINT_FILE, _jsonable
from fp4rl.analysis.gradient_rule import COHERENT_BIAS_MAX, NOISE_FRACTION_MAX
from fp4rl.analysis.plots import arm_color

CI_LEVEL = 0.95
COMPONENTS = ("A", "b2", "Ts")
RL_ACCURACY_BAND = (0.2, 0.45)  # docs/rl.md "Task": the warm-up's sampled accuracy on the RL band
FAR = 10.0  # a target coordinate beyond FAR x the measured range is flagged as a far extrapolation
DEPTH_GRID = np.unique(np.round(np.geomspace(1, 10_000, 120)))  # layers, for where the rule flips
RESULTS_FILE, REPORT_FILE, FIGURE_FILE = "scaling_fit.json", "report.md", "scaling_fit.png"
REFERENCE = "bf16"


@dataclasses.dataclass(frozen=True)
class PaperSetting:
    """The extrapolation target: num_layers x d_model of the widest rung's layer; tokens_per_update:
    loss tokens per optimizer update (an assumption: 2^20, e.g. 256 responses x 4096 tokens)."""

    num_layers: int = 48
    d_model: int = 2048
    tokens_per_update: float = float(2**20)

    def __post_init__(self):
        if self.num_layers < 1 or self.d_model < 1 or not self.tokens_per_update > 0:
            raise ValueError(f"need num_layers >= 1, d_model >= 1, tokens_per_update > 0; got {self}")


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """ladder: rung names, gradient presets (empty: fp4rl.configs.SCALING_LADDER); points:
    measurement directories holding SCALING_POINT_FILE (empty: each rung's --out); paper: the
    extrapolation target; out: where the plan (plan.md, plan.json) or the fit (report.md,
    scaling_fit.json, the figure) go."""

    ladder: tuple[str, ...] = ()
    points: tuple[str, ...] = ()
    paper: PaperSetting = PaperSetting()
    out: str = "runs/scaling"


# ---------------------------------------------------------------------------------- inputs
def load_point(directory: str | Path) -> dict:
    """One rung: SCALING_POINT_FILE under `directory` (a gradient measurement's --out)."""
    path = Path(directory) / SCALING_POINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is {directory} the --out of a gradient measurement "
                                "(python -m experiments.gradients --preset RUNG)?")
    point = json.loads(path.read_text())
    point["dir"] = str(directory)
    return point


def _arr(x) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in x], np.float64)


def rung_summary(point: Mapping) -> dict:
    from fp4rl.model.config import ModelConfig  # param counts of the rung's model

    model = point["model"]
    counts = ModelConfig.from_dict(model).param_count()
    acc = point["accuracy"]
    return {"dir": point.get("dir", ""), "num_layers": model["num_layers"], "d_model": model["d_model"],
            "params_total": counts.total, "params_active": counts.active, "tokens_per_batch": point["tokens_per_batch"],
            "batches": point["batches"], "accuracy": acc,
            "in_band": bool(acc["value"] is not None and RL_ACCURACY_BAND[0] <= acc["value"] <= RL_ACCURACY_BAND[1])}


def component(point: Mapping, recipe: str, group: str, name: str) -> tuple[float, np.ndarray]:
    """(value, replicates) of one component; T_s is the BF16 gradient's (the same for every recipe)."""
    source = point["recipes"][REFERENCE if name == "Ts" and REFERENCE in point["recipes"] else recipe][group][name]
    value = np.nan if source["value"] is None else float(source["value"])
    return value, _arr(source["replicates"])


# ---------------------------------------------------------------------------------- the fit
@dataclasses.dataclass
class LogLogFit:
    """log q = beta . x over the columns `columns` of (1, log L, log D); coordinates the rungs hold
    constant are in `constant` (their exponent is not identified)."""

    columns: tuple[str, ...]
    beta: np.ndarray
    xtx_inv: np.ndarray
    sigma: float  # residual standard deviation (nan without residual degrees of freedom)
    dof: int
    boot: np.ndarray  # [J, p] coefficients per bootstrap replicate (nan rows: unusable replicate)
    constant: dict
    ranges: dict
    error: str = ""  # why no fit (then the other fields are empty)

    @property
    def ok(self) -> bool:
        return not self.error


COORDS = ("L", "D")


def _design(coords: np.ndarray, columns: Sequence[str]) -> np.ndarray:
    cols = [np.ones(len(coords))] + [np.log(coords[:, COORDS.index(c)]) for c in columns[1:]]
    return np.stack(cols, 1)


def fit_loglog(coords, values, replicates) -> LogLogFit:
    """coords [n, 2] (L, D), values [n], replicates [n, J] -> the OLS fit of log value."""
    coords, values = np.asarray(coords, np.float64), np.asarray(values, np.float64)
    reps = np.asarray(replicates, np.float64)
    ranges = {c: (float(coords[:, i].min()), float(coords[:, i].max())) for i, c in enumerate(COORDS)} if len(coords) else {}
    empty = LogLogFit((), np.zeros(0), np.zeros((0, 0)), math.nan, 0, np.zeros((0, 0)), {}, ranges)
    bad = [i for i, v in enumerate(values) if not (np.isfinite(v) and v > 0)]
    if bad:
        return dataclasses.replace(empty, error=f"not positive at {len(bad)} of {len(values)} rungs (rung indices {bad})")
    varied = [c for i, c in enumerate(COORDS) if np.ptp(np.log(coords[:, i])) > 1e-12]
    constant = {c: float(coords[0, i]) for i, c in enumerate(COORDS) if c not in varied}
    columns = ("const", *varied)
    x = _design(coords, columns)
    if len(values) < len(columns) or np.linalg.matrix_rank(x) < len(columns):
        return dataclasses.replace(empty, constant=constant, error=f"{len(values)} usable rungs cannot identify "
                                                                  f"{len(columns)} parameters ({', '.join(columns)})")
    y = np.log(values)
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    dof = len(values) - len(columns)
    sigma = float(np.sqrt(np.sum((y - x @ beta) ** 2) / dof)) if dof > 0 else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        log_reps = np.where(reps > 0, np.log(reps), np.nan)  # a non-positive replicate: unusable
    usable = np.all(np.isfinite(log_reps), 0)
    boot = np.full((reps.shape[1], len(columns)), np.nan)
    if usable.any():
        boot[usable] = (xtx_inv @ x.T @ log_reps[:, usable]).T
    return LogLogFit(columns, beta, xtx_inv, sigma, dof, boot, constant, ranges)


@functools.lru_cache(maxsize=None)
def _t_quantile(dof: int) -> float:
    return float(student_t.ppf((1 + CI_LEVEL) / 2, dof))


def _pct(values: np.ndarray) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if not v.size:
        return math.nan, math.nan
    a = (1 - CI_LEVEL) / 2
    return tuple(float(q) for q in np.quantile(v, [a, 1 - a], method="nearest"))


@dataclasses.dataclass
class Prediction:
    """A fitted quantity at one (L, D): value, interval, the bootstrap replicates of the value (for
    derived quantities) and the t interval alone (for their corners); `error` says why there is none."""

    value: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    boot: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    t_lo: float = math.nan
    t_hi: float = math.nan
    unusable: float = 0.0  # share of bootstrap replicates that could not be fitted
    error: str = ""

    def as_dict(self) -> dict:
        if self.error:
            return {"value": None, "lo": None, "hi": None, "impossible": self.error}
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "unusable_replicates": self.unusable}


def predict(fit: LogLogFit, num_layers: float, d_model: float) -> Prediction:
    if not fit.ok:
        return Prediction(error=fit.error)
    target = {"L": float(num_layers), "D": float(d_model)}
    for c, v in fit.constant.items():
        if not math.isclose(v, target[c], rel_tol=1e-9):
            name = {"L": "depth", "D": "width (d_model)"}[c]
            return Prediction(error=f"the rungs do not vary {name} (all at {v:g}): its exponent is not identified, "
                                    f"and the target's is {target[c]:g}")
    x0 = _design(np.array([[target["L"], target["D"]]]), fit.columns)[0]
    mean = float(x0 @ fit.beta)
    boot = np.exp(fit.boot @ x0)
    b_lo, b_hi = _pct(np.log(boot))
    if fit.dof > 0:
        half = _t_quantile(fit.dof) * fit.sigma * math.sqrt(x0 @ fit.xtx_inv @ x0)
        t_lo, t_hi = mean - half, mean + half
    else:
        t_lo = t_hi = mean
    lo, hi = np.nanmin([b_lo, t_lo]), np.nanmax([b_hi, t_hi])
    return Prediction(math.exp(mean), math.exp(lo), math.exp(hi), boot, math.exp(t_lo), math.exp(t_hi),
                      float(np.mean(~np.isfinite(boot))))


def derived(fn, parts: Mapping[str, Prediction]) -> Prediction:
    """fn(A, b2, Ts) at the components' predictions: value at their values; interval the union of the
    bootstrap percentile interval (replicate by replicate) and fn's range over the corners of the
    components' t intervals."""
    missing = [f"{k}: {p.error}" for k, p in parts.items() if p.error]
    if missing:
        return Prediction(error="; ".join(missing))
    keys = list(parts)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        value = float(fn(*(np.asarray(parts[k].value) for k in keys)))
        n = min(len(parts[k].boot) for k in keys)
        boot = np.asarray(fn(*(parts[k].boot[:n] for k in keys)), np.float64)
        corners = [float(fn(*(np.asarray(c) for c in combo)))
                   for combo in np.array(np.meshgrid(*[[parts[k].t_lo, parts[k].t_hi] for k in keys])).T.reshape(-1, len(keys))]
    b_lo, b_hi = _pct(boot)
    finite = [v for v in corners + [b_lo, b_hi, value] if not math.isnan(v)]
    return Prediction(value, min(finite) if finite else math.nan, max(finite) if finite else math.nan, boot,
                      min(corners), max(corners), float(np.mean(~np.isfinite(boot))) if n else 0.0)


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
def fits_for(points: Sequence[Mapping], recipe: str, group: str) -> dict[str, LogLogFit]:
    coords = np.array([[p["model"]["num_layers"], p["model"]["d_model"]] for p in points], np.float64)
    out = {}
    for name in COMPONENTS:
        values, reps = zip(*(component(p, recipe, group, name) for p in points)) if points else ((), ())
        j = min((len(r) for r in reps), default=0)
        out[name] = fit_loglog(coords, values, np.stack([r[:j] for r in reps]) if reps else np.zeros((0, 0)))
    return out


def _exponents(fit: LogLogFit) -> dict:
    if not fit.ok:
        return {"impossible": fit.error}
    out = {"dof": fit.dof, "residual_sd_log": None if math.isnan(fit.sigma) else fit.sigma}
    for i, c in enumerate(fit.columns):
        b_lo, b_hi = _pct(fit.boot[:, i])
        lo, hi = b_lo, b_hi
        if fit.dof > 0:
            half = _t_quantile(fit.dof) * fit.sigma * math.sqrt(fit.xtx_inv[i, i])
            lo, hi = np.nanmin([lo, fit.beta[i] - half]), np.nanmax([hi, fit.beta[i] + half])
        out[{"const": "log_coefficient", "L": "depth_exponent", "D": "width_exponent"}[c]] = {
            "value": float(fit.beta[i]), "lo": float(lo), "hi": float(hi)}
    for c in fit.constant:
        out[{"L": "depth_exponent", "D": "width_exponent"}[c]] = {"impossible": f"the rungs do not vary {c}"}
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


def flip_depths(fits: Mapping[str, LogLogFit], d_model: float, tokens: float) -> dict:
    """Along depth at the given width and tokens per update: the depths (in DEPTH_GRID) at which the
    point prediction of criterion (1) (noise fraction vs its threshold) and of criterion (2)
    (coherent bias vs its threshold) crosses, and where its interval starts to lie wholly above."""
    parts = [{k: predict(fits[k], L, d_model) for k in COMPONENTS} for L in DEPTH_GRID]
    if any(p[k].error for p in parts[:1] for k in COMPONENTS):
        return {"impossible": "; ".join(f"{k}: {parts[0][k].error}" for k in COMPONENTS if parts[0][k].error)}
    out = {}
    for name, fn, threshold in (("noise_fraction", noise_fraction_fn(tokens), NOISE_FRACTION_MAX),
                                ("coherent_bias", lambda a, b2, ts: np.sqrt(np.maximum(b2, 0.0)), COHERENT_BIAS_MAX)):
        preds = [derived(fn, p) for p in parts]
        value = np.array([p.value for p in preds])
        above = value > threshold
        crossings = [float(DEPTH_GRID[i + 1]) for i in range(len(above) - 1) if above[i] != above[i + 1]]
        surely = [float(L) for L, p in zip(DEPTH_GRID, preds) if p.lo > threshold]
        out[name] = {"crossings": crossings, "first_depth_wholly_above": surely[0] if surely else None,
                     "above_at_1_layer": bool(above[0]), "grid": [float(DEPTH_GRID[0]), float(DEPTH_GRID[-1])]}
    return out


def analyze(points: Sequence[Mapping], paper: PaperSetting = PaperSetting()) -> dict:
    """The fits, the held-out check and the extrapolation of every recipe and group of the rungs."""
    if len(points) < 2:
        raise ValueError(f"need at least 2 rungs to fit; got {len(points)}")
    rungs = [rung_summary(p) for p in points]
    recipes = [r for r in points[0]["recipes"] if r != REFERENCE and all(r in p["recipes"] for p in points)]
    groups = ([g for g in points[0]["recipes"][recipes[0]] if all(g in p["recipes"][r] for p in points for r in recipes)]
              if recipes else [])
    largest = int(np.argmax([r["params_total"] for r in rungs]))
    rest = [p for i, p in enumerate(points) if i != largest]
    held = points[largest]
    coords = np.array([[r["num_layers"], r["d_model"]] for r in rungs], np.float64)
    measured_tokens = [r["tokens_per_batch"] for r in rungs] + [r["tokens_per_batch"] * r["batches"] for r in rungs]
    far = {"num_layers": paper.num_layers / coords[:, 0].max(), "d_model": paper.d_model / coords[:, 1].max(),
           "tokens_per_update": paper.tokens_per_update / max(measured_tokens)}
    out = {"paper": dataclasses.asdict(paper), "rungs": rungs, "recipes": recipes, "groups": groups,
           "held_out": rungs[largest]["dir"], "far_extrapolation": {k: v for k, v in far.items() if v > FAR},
           "extrapolation_ratios": far, "fits": {}}
    for recipe in recipes:
        out["fits"][recipe] = {}
        for group in groups:
            fits = fits_for(points, recipe, group)
            check_fits = fits_for(rest, recipe, group)
            L, D, T0 = held["model"]["num_layers"], held["model"]["d_model"], held["tokens_per_batch"]
            predicted = at_target(check_fits, L, D, T0)
            measured = {k: component(held, recipe, group, k)[0] for k in COMPONENTS}
            measured_nf = float(batch_scaling.noise_fraction_tokens({k: np.asarray(v) for k, v in measured.items()}, T0))
            check = {}
            for name, pred, value in [*((k, predicted["components"][k], measured[k]) for k in COMPONENTS),
                                      ("noise_fraction", predicted["noise_fraction"], measured_nf)]:
                if pred.get("impossible"):
                    check[name] = {"measured": value, "predicted": pred, "result": "impossible"}
                else:
                    inside = pred["lo"] <= value <= pred["hi"]
                    check[name] = {"measured": value, "predicted": pred, "result": "consistent" if inside else "inconsistent"}
            out["fits"][recipe][group] = {
                "exponents": {k: _exponents(f) for k, f in fits.items()},
                "paper": at_target(fits, paper.num_layers, paper.d_model, paper.tokens_per_update),
                "flip_depth": flip_depths(fits, paper.d_model, paper.tokens_per_update),
                "held_out_check": check,
            }
    return out


# ---------------------------------------------------------------------------------- output
def _fmt(c) -> str:
    if c is None:
        return "n/a"
    if c.get("impossible"):
        return "IMPOSSIBLE"
    f = lambda x: "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"  # noqa: E731
    return f"{f(c['value'])} [{f(c['lo'])}, {f(c['hi'])}]"


def _table(header, rows) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def report_markdown(results: Mapping) -> str:
    paper, g = results["paper"], "all" if "all" in results["groups"] else (results["groups"] or ["-"])[0]
    fit_form = __doc__[__doc__.index("Fit form"):__doc__.index("Check: the largest")].strip()
    lines = ["# Gradient error over model sizes: fit, check, extrapolation", "",
             "## Fit form (declared before the data)", "", "```", fit_form, "```", "",
             f"Extrapolation target: {paper['num_layers']} layers, d_model {paper['d_model']}, "
             f"{paper['tokens_per_update']:.0f} loss tokens per update (an assumption; --paper.tokens_per_update).", ""]
    if results["far_extrapolation"]:
        lines += ["**Far extrapolation**: the target exceeds the measured range by "
                  + ", ".join(f"{v:.1f}x in {k}" for k, v in results["far_extrapolation"].items()) + ".", ""]
    lines += ["## Rungs", ""]
    band = f"**NO** ({RL_ACCURACY_BAND[0]}-{RL_ACCURACY_BAND[1]})"
    lines += _table(["measurement", "layers", "d_model", "params", "active", "loss tokens per batch", "rollout accuracy",
                     "in RL band"],
                    [[r["dir"], r["num_layers"], r["d_model"], f"{r['params_total'] / 1e6:,.1f}M",
                      f"{r['params_active'] / 1e6:,.1f}M", f"{r['tokens_per_batch']:.0f}", _fmt(r["accuracy"]),
                      "yes" if r["in_band"] else band] for r in results["rungs"]])
    out_of_band = [r["dir"] for r in results["rungs"] if not r["in_band"]]
    if out_of_band:
        lines += ["", f"Rungs outside the RL band {RL_ACCURACY_BAND}: {', '.join(out_of_band)}; their warm-ups are not at the "
                  "ladder's parameter point (rerun with other --steps)."]
    fits = results["fits"]
    lines += ["", f"## Exponents, group '{g}' (log q = c + p_L log L + p_D log D)", ""]
    rows = []
    for recipe in results["recipes"]:
        e = fits[recipe][g]["exponents"]
        cell = lambda q, k: ("IMPOSSIBLE" if e[q].get("impossible")  # noqa: E731
                             else _fmt(e[q][k]) if not e[q].get(k, {}).get("impossible") else "not identified")
        rows.append([recipe, *(cell(q, k) for q in ("A", "b2") for k in ("depth_exponent", "width_exponent"))])
    lines += _table(["recipe", "A: p_L", "A: p_D", "b^2: p_L", "b^2: p_D"], rows)
    dofs = {e.get("dof") for r in results["recipes"] for e in fits[r][g]["exponents"].values()} - {None}
    if 0 in dofs:
        lines += ["", "Some fits have as many usable rungs as parameters (no residual degrees of freedom): their intervals "
                  "carry the measurement noise only, not the rungs' scatter around the power law."]
    if results["recipes"]:
        ts = fits[results["recipes"][0]][g]["exponents"]["Ts"]
        exps = f"p_L {_fmt(ts.get('depth_exponent'))}, p_D {_fmt(ts.get('width_exponent'))}"
        lines += ["", "T_s (BF16 noise scale): " + ("IMPOSSIBLE: " + ts["impossible"] if ts.get("impossible") else exps) + "."]
    lines += ["", f"## Held-out check: {results['held_out']} (the largest rung) predicted from the others, group '{g}'", ""]
    checked = ("A", "b2", "noise_fraction")
    rows = []
    for recipe in results["recipes"]:
        check = fits[recipe][g]["held_out_check"]
        rows.append([recipe, *(f"{_num(check[k]['measured'])} / {_fmt(check[k]['predicted'])}" for k in checked),
                     ", ".join(sorted({check[k]["result"] for k in checked}))])
    lines += _table(["recipe", *(f"{k}: measured / predicted" for k in checked), "result"], rows)
    lines += ["", f"## Extrapolation to the paper's setting, group '{g}'", ""]
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
    lines += ["", "## Where the rule flips, per recipe (at the paper's width and tokens per update)", ""]
    rows = []
    for recipe in results["recipes"]:
        f = fits[recipe][g]["flip_depth"]
        if f.get("impossible"):
            rows.append([recipe, "IMPOSSIBLE", "IMPOSSIBLE"])
            continue
        rows.append([recipe, *(_flip(f[k]) for k in ("noise_fraction", "coherent_bias"))])
    lines += _table(["recipe", f"(1) noise fraction crosses {NOISE_FRACTION_MAX:g}",
                     f"(2) coherent bias crosses {COHERENT_BIAS_MAX:g}"], rows)
    lines += ["", "## Verdict per group at the paper's setting ((1) / (2))", ""]
    lines += _table(["recipe", *results["groups"]],
                    [[recipe, *(f"{fits[recipe][grp]['paper']['verdict']['noise_fraction']} / "
                                f"{fits[recipe][grp]['paper']['verdict']['coherent_bias']}" for grp in results["groups"])]
                     for recipe in results["recipes"]])
    lines += ["", "Criterion (3), the grad-norm tail, is measured per rung only (not extrapolated).", ""]
    return "\n".join(lines)


def _num(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _flip(f: Mapping) -> str:
    lo, hi = f["grid"]
    if not f["crossings"]:
        return f"no crossing in {lo:g}-{hi:g} layers ({'above' if f['above_at_1_layer'] else 'below'} throughout)"
    text = "at " + ", ".join(f"{L:g}" for L in f["crossings"]) + " layers"
    if f["first_depth_wholly_above"] is not None:
        text += f"; interval wholly above from {f['first_depth_wholly_above']:g}"
    return text


def plot(results: Mapping, points: Sequence[Mapping], path: Path) -> Path:
    """Group 'all': A and b^2 against depth (at the narrowest width) and width (at the shallowest depth
    of the width rungs), measured (points, bootstrap interval) and fitted (lines); the noise fraction
    against tokens per update at the paper's depth and width with its interval and the threshold."""
    g = "all" if "all" in results["groups"] else results["groups"][0]
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
        fits = fits_for(points, recipe, g)
        for row, (axis, mask, fixed) in enumerate((("L", depth_rungs, d_min), ("D", width_rungs, l_width))):
            for col, name in enumerate(("A", "b2")):
                ax = axes[row, col]
                xs = coords[mask, 0 if axis == "L" else 1]
                vals = [component(p, recipe, g, name) for p, m in zip(points, mask) if m]
                v = np.array([x[0] for x in vals])
                lo = np.array([np.nanpercentile(x[1], 2.5) if np.isfinite(x[1]).any() else np.nan for x in vals])
                hi = np.array([np.nanpercentile(x[1], 97.5) if np.isfinite(x[1]).any() else np.nan for x in vals])
                ok = v > 0
                ax.errorbar(xs[ok], v[ok], yerr=[np.clip(v - lo, 0, None)[ok], np.clip(hi - v, 0, None)[ok]], fmt="o",
                            color=color, capsize=2)
                end = paper["num_layers"] if axis == "L" else paper["d_model"]
                grid = np.geomspace(min(xs.min(), end), max(xs.max(), end), 50) if xs.size else np.zeros(0)
                pred = [predict(fits[name], x, fixed) if axis == "L" else predict(fits[name], fixed, x) for x in grid]
                if pred and not pred[0].error:
                    ax.plot(grid, [p.value for p in pred], color=color, linewidth=1, label=recipe)
        ax = axes[0, 2]
        tokens = np.geomspace(1e3, 1e8, 60)
        parts = {k: predict(fits[k], paper["num_layers"], paper["d_model"]) for k in COMPONENTS}
        if not any(p.error for p in parts.values()):
            nf = [derived(noise_fraction_fn(t), parts) for t in tokens]
            ax.plot(tokens, [p.value for p in nf], color=color, label=recipe)
            ax.fill_between(tokens, [p.lo for p in nf], [p.hi for p in nf], color=color, alpha=0.12, linewidth=0)
    titles = {(0, 0): "A (incoherent error / noise) vs depth", (0, 1): "b^2 (coherent bias^2) vs depth",
              (1, 0): "A vs d_model", (1, 1): "b^2 vs d_model"}
    for (r, c), title in titles.items():
        axes[r, c].set_title(title, fontsize=10)
        axes[r, c].set_xlabel("layers" if r == 0 else "d_model")
    ax = axes[0, 2]
    ax.axhline(NOISE_FRACTION_MAX, color="#d62728", linestyle="--", linewidth=1)
    ax.axvline(paper["tokens_per_update"], color="0.4", linestyle=":", linewidth=1)
    ax.set_title(f"Noise fraction at {paper['num_layers']} layers x d_model {paper['d_model']}", fontsize=10)
    ax.set_xlabel("loss tokens per update")
    axes[1, 2].axis("off")
    axes[1, 2].text(0, 0.5, "points: measured rungs (95% bootstrap)\nlines: fitted power laws, extended to the paper's\n"
                    f"depth / width; dashed: the rule's {NOISE_FRACTION_MAX:g};\ndotted: the assumed tokens per update",
                    fontsize=9, va="center")
    for ax in (*axes[:, :2].ravel(), axes[0, 2]):
        if ax.has_data():
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncols=2, frameon=False)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def run(config: ScalingConfig, directories: Sequence[str]) -> dict:
    """Fit the rungs under `directories`, write report.md, scaling_fit.json and the figure under
    config.out; returns the results."""
    points = [load_point(d) for d in directories]
    results = analyze(points, config.paper)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).write_text(json.dumps(_jsonable(results), indent=1))
    clean = json.loads((out / RESULTS_FILE).read_text())
    (out / REPORT_FILE).write_text(report_markdown(clean))
    plot(results, points, out / FIGURE_FILE)
    return clean
