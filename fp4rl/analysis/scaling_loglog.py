"""The log-log fit of one quantity over the rungs (depth L, d_model D) and its predictions, with the
intervals `fp4rl.analysis.scaling` states (its docstring gives the form and why): ordinary least
squares of log q on (1, log L, log D), repeated on every rung's bootstrap replicates (measurement), with
the OLS t interval of the fitted mean (lack of fit); a derived quantity's interval from the
components' replicates and from the corners of their t intervals."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import t as student_t

CI_LEVEL = 0.95


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
        half = _t_quantile(fit.dof) * fit.sigma * math.sqrt(1.0 + x0 @ fit.xtx_inv @ x0)  # a new rung: its own scatter too
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


def exponents(fit: LogLogFit) -> dict:
    """The fitted coefficients with intervals (bootstrap and t, their union); a constant coordinate's
    exponent is not identified."""
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
