"""Measured device usage of the ladder's rungs, and the calibration of the plan's estimates on it.

Every warm-up and measurement process of a ladder device run goes through `tools/measure_usage.py`,
which writes a usage record, also when the process fails: its status, whether it ran out of device
memory (and the request that failed), the allocator's peak bytes in use
(`memory_stats()["peak_bytes_in_use"]`, the largest over the devices), the device and the wall
seconds. `python -m experiments.scaling collect` stores a rung's records beside its measurement
(USAGE_FILE) with the plan's estimates of the same processes (`fp4rl.analysis.scaling_plan`) and
their ratios, per phase (the warm-up; the measurement: the largest over its parts):

  memory factor = peak bytes / estimated bytes   (a process that ran out of memory: (peak + the failed
                                                  request) / estimate, a lower bound, marked so)
  time factor   = seconds / slow estimate         (completed processes only)

The plan multiplies a rung's estimates by the factors of the nearest measured rung no larger than it
(total parameters; the rung itself once measured), phase by phase, or by PRIOR before any is measured:
memory 1.4, a margin over the one shortfall of these estimates measured so far (74.6 GB against 60 GB
estimated, 1.24x: the 4-seed h200-chain RL run, results/long_h200/chain/README.md); time 1.25 (the h200
gradient measurement's parts took 1371 s, results/gradients_h200/README.md, against 1130 s by the slow
estimate of the same parts: 1.21x).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from fp4rl.run_files import read_json

USAGE_FILE = "usage.json"
PHASES = ("warmup", "measurement")
PRIOR = {"warmup": {"memory": 1.4, "time": 1.25}, "measurement": {"memory": 1.4, "time": 1.25}}


def read_record(path: str | Path) -> dict | None:
    """A JSON record (a `tools/measure_usage.py` record, a rung's files), or None where the process left
    none (cut by its time limit); a damaged one raises naming it (`run_files.read_json`)."""
    path = Path(path)
    return read_json(path) if path.is_file() else None


def ratios(record: Mapping | None, memory_bytes: float, seconds_slow: float) -> dict:
    """One process's record beside its estimates: the memory and time factors (module docstring)."""
    out = {"estimate": {"memory_bytes": memory_bytes, "seconds_slow": seconds_slow}, "record": record,
           "memory_factor": None, "memory_factor_is_lower_bound": False, "time_factor": None}
    if record is None:
        return out
    peak = record.get("peak_bytes")
    if peak is not None:
        failed = (record.get("requested_bytes") or 0) if record.get("out_of_memory") else 0
        out["memory_factor"] = (peak + failed) / memory_bytes
        out["memory_factor_is_lower_bound"] = bool(record.get("out_of_memory"))
    if record.get("status") == "ok" and record.get("seconds"):
        out["time_factor"] = record["seconds"] / seconds_slow
    return out


def phase_factors(usage: Mapping) -> dict:
    """{"warmup"|"measurement": {"memory"|"time": factor or None}} of a collected USAGE_FILE; the
    measurement's the largest over its parts."""
    out = {}
    for phase in PHASES:
        entries = [usage["warmup"]] if phase == "warmup" else list(usage.get("parts", {}).values())
        entries = [e for e in entries if e]
        out[phase] = {}
        for key, field in (("memory", "memory_factor"), ("time", "time_factor")):
            values = [e[field] for e in entries if e.get(field) is not None]
            out[phase][key] = max(values) if values else None
    return out


def load_usages(results: str | Path, rungs) -> dict[str, dict]:
    """rung -> its collected USAGE_FILE under results/RUNG (rungs without one are left out)."""
    out = {}
    for rung in rungs:
        path = Path(results) / rung / USAGE_FILE
        if path.is_file():
            out[rung] = json.loads(path.read_text())
    return out


def calibration(usages: Mapping[str, Mapping], params: Mapping[str, int]) -> Callable[[str, int], tuple[dict, str]]:
    """fn(rung, params_total) -> (factors per phase, where each was measured), for `scaling_plan.plan`:
    per phase and quantity, the factor of the measured rung with the most parameters no more than the
    rung's own (the rung itself once measured), else PRIOR's."""
    measured = {rung: (params[rung], phase_factors(u)) for rung, u in usages.items()}

    def fn(rung: str, params_total: int) -> tuple[dict, str]:
        factors, sources = {}, set()
        for phase in PHASES:
            factors[phase] = {}
            for key in ("memory", "time"):
                found = [(p, name, f[phase][key]) for name, (p, f) in measured.items()
                         if f[phase][key] is not None and (p < params_total or name == rung)]
                if found:
                    _, name, value = max(found, key=lambda x: (x[0], x[1] == rung))
                    factors[phase][key] = value
                    sources.add(name)
                else:
                    factors[phase][key] = PRIOR[phase][key]
                    sources.add("prior")
        return factors, ", ".join(sorted(sources))

    return fn


def gb(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x / 1e9:.1f} GB"
