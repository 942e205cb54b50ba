"""The dose-response's link to the ladder: at which model size or tokens per update the gradient error
reaches the level at which RL failed in the dose-response.

The dose-response (docs/rl.md "Precision recipes": nvfp4@A, +dq@A) runs RL with the NVFP4 forward's
error amplified A times: w_a = w + A (DQ(Q(w)) - w), x_a likewise. The gradient's error against BF16
is, to first order in that error, linear in it, so in norm terms

    rho(A) = ||g_A - g_bf16|| / ||RL noise|| = A rho(1)      (the noise fraction at dose A: A^2 times)

(first order is the assumption this link rests on). If RL first fails at the amplification A_f (the
smallest failing dose of the base recipe: an input, None while not measured), the error/noise at which
it fails is

    rho* = A_f rho_ref,   rho_ref = sqrt(A + b2 T_ref / T_s) of the base recipe at the reference

(the gradient measurement at the dose-response's setting, `DoseLink.reference`, T_ref the dose-response's
loss tokens per update). Per rung and base recipe (nvfp4 for nvfp4@A, +dq for +dq@A), on the fit's
headline group:

    rho(T0) = sqrt(A + b2 T0 / T_s)   the rung's error/noise in norm terms at its tokens per batch;
    A_eq = rho(T_ref) / rho_ref       the dose at the reference that gives the rung's error/noise at the
                                      same tokens per update: RL is predicted to fail at the rung where
                                      A_eq >= A_f;
    T_fail = T_s (rho*^2 - A) / b2    the tokens per update at which the rung's rho reaches rho* (0 where
                                      A >= rho*^2, infinite where b2 <= 0);

and along the fit, at the target's width and tokens per update, the depth at which the predicted rho
reaches rho* and the target model's parameters at that depth. Intervals: 95% percentile intervals over
the bootstrap replicates (the rung's and the reference's, independent, paired by index).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fp4rl.analysis import batch_scaling
from fp4rl.analysis.gradient_report import SCALING_POINT_FILE
from fp4rl.analysis.scaling import (
    COMPONENTS, DOSE_BASES, DoseLink, component, fits_for, flip_depths, load_point)

def _ci(value: float, replicates: np.ndarray) -> dict:
    reps = np.asarray(replicates, np.float64)
    reps = reps[np.isfinite(reps)]
    lo, hi = np.quantile(reps, [0.025, 0.975], method="nearest") if reps.size else (math.nan, math.nan)
    return {"value": float(value), "lo": float(lo), "hi": float(hi)}


def error_to_noise(point: Mapping, recipe: str, group: str, tokens: float | None = None) -> tuple[float, np.ndarray]:
    """(rho, its replicates) of a rung at `tokens` per update (default: its tokens per batch)."""
    tokens = point["tokens_per_batch"] if tokens is None else tokens
    parts = [component(point, recipe, group, k) for k in COMPONENTS]
    n = min(len(r) for _, r in parts)
    value = batch_scaling.noise_fraction_tokens({k: np.asarray(v) for k, (v, _) in zip(COMPONENTS, parts)}, tokens)
    reps = batch_scaling.noise_fraction_tokens({k: r[:n] for k, (_, r) in zip(COMPONENTS, parts)}, tokens)
    return float(np.sqrt(max(float(value), 0.0))), np.sqrt(np.maximum(reps, 0.0))


def _reference(points: Mapping[str, Mapping], dose: DoseLink) -> Mapping | None:
    if dose.reference in points:
        return points[dose.reference]
    return load_point(dose.reference) if (Path(dose.reference) / SCALING_POINT_FILE).is_file() else None


def _fails(a_eq: Mapping, a_f: float) -> str:
    if a_eq["lo"] >= a_f:
        return "fails"
    if a_eq["hi"] < a_f:
        return "holds"
    return "undecided"


def rung_link(point: Mapping, recipe: str, group: str, rho_ref: tuple[float, np.ndarray] | None,
              a_f: float | None, t_ref: float | None) -> dict:
    """rho(T0), A_eq, T_fail and the predicted outcome of one rung (module docstring)."""
    out = {"rho": _ci(*error_to_noise(point, recipe, group))}
    if rho_ref is None:
        return out
    rho, rho_reps = error_to_noise(point, recipe, group, t_ref)
    n = min(len(rho_reps), len(rho_ref[1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        out["dose_equivalent"] = _ci(rho / rho_ref[0], rho_reps[:n] / rho_ref[1][:n])
    if a_f is None:
        return out
    comps = {k: component(point, recipe, group, k) for k in ("A", "b2", "Ts")}
    m = min(n, *(len(r) for _, r in comps.values()))
    t_fail = batch_scaling.tokens_to_threshold({k: np.asarray(v) for k, (v, _) in comps.items()}, (a_f * rho_ref[0]) ** 2)
    reps = batch_scaling.tokens_to_threshold({k: r[:m] for k, (_, r) in comps.items()}, (a_f * rho_ref[1][:m]) ** 2)
    out["tokens_to_failure"] = _ci(float(t_fail), reps)
    out["predicted"] = _fails(out["dose_equivalent"], a_f)
    return out


def link_fit(results: Mapping, points: Sequence[Mapping], paper, dose: DoseLink) -> dict:
    """`link` for the rungs of a fit (`scaling.analyze`'s results on `points`)."""
    by_name = {p["name"]: p for p in points}
    return link(by_name, [by_name[n] for n in results["fitted"]], results["recipes"], results["headline_group"], paper, dose)


def link(points: Mapping[str, Mapping], fitted: Sequence[Mapping], recipes: Sequence[str], group: str, paper,
         dose: DoseLink) -> dict:
    """The module docstring's quantities for every base recipe the rungs measured."""
    ref = _reference(points, dose)
    out = {"group": group, "reference": dose.reference, "assumption": "rho(A) = A rho(1): the gradient error is linear "
           "in the amplified forward error (first order)", "first_failing": {b: dose.first_failing(b) for b in DOSE_BASES},
           "bases": {}}
    if ref is None:
        out["reference_missing"] = (f"{dose.reference} is neither a measured rung nor a directory with a scaling point: "
                                    "the rungs' error/noise is reported, not its dose equivalent")
    t_ref = dose.reference_tokens_per_update or (ref["tokens_per_batch"] if ref is not None else None)
    out["reference_tokens_per_update"] = t_ref
    for base in (b for b in DOSE_BASES if b in recipes):
        a_f = dose.first_failing(base)
        rho_ref = error_to_noise(ref, base, group, t_ref) if ref is not None else None
        entry = {"first_failing": a_f, "rho_reference": None if rho_ref is None else _ci(*rho_ref),
                 "rho_at_failure": None if rho_ref is None or a_f is None else _ci(a_f * rho_ref[0], a_f * rho_ref[1]),
                 "rungs": {name: rung_link(p, base, group, rho_ref, a_f, t_ref) for name, p in points.items()}}
        if rho_ref is not None and a_f is not None:
            flips = flip_depths(fits_for(fitted, base, group), paper.d_model, paper.tokens_per_update,
                                noise_threshold=(a_f * rho_ref[0]) ** 2)
            if "impossible" not in flips:
                flips = flips["noise_fraction"]
                flips["params_at_crossings"] = [paper.params_at_depth(L) for L in flips["crossings"]]
            entry["depth_to_failure"] = flips
        out["bases"][base] = entry
    return out
