"""Where the model-size ladder stands: per rung its state, its measured peaks against the calibrated
plan, its results, and the device calls still to make, read from the committed results
(`python -m experiments.scaling status` writes results/scaling_h200/status.md).

The rules, stated in the status before any rung runs (`RULES`, plus the fit's form and checks from
`fp4rl.analysis.scaling` and the dose link's from `fp4rl.analysis.scaling_dose`):
- order: the rungs in `fp4rl.configs.SCALING_LADDER`'s order, one rung at a time, each in device runs
  of the plan (`scaling_plan.device_runs`: its warm-up and as many measurement parts as fit one machine);
- warm-up into the band (`fp4rl.analysis.band.BAND_RULE`): a warm-up outside the band is trained once
  more, with twice its steps below the band or half above it; outside again, the rung is reported with
  its accuracy and not measured;
- memory: a call needs an H200 when the rung's calibrated estimate exceeds one H100's memory; a
  process that runs out of memory on an H100 runs again on an H200; one that runs out on an H200 is
  reported with its measured peak and the failed request, and the ladder goes on (a rung without its
  warm-up is not measured; a rung missing a part is fitted without that part's recipes);
- every call is resumable: the status reads what the collected results hold, and names the next call.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from fp4rl.analysis import band, scaling_plan
from fp4rl.analysis.scaling_usage import USAGE_FILE, gb, read_record

SUMMARY_FILE = "summary.json"
RULES = __doc__[__doc__.index("- order:"):].strip()
# A device's memory (the allocator's limit in a usage record) above this is an H200's: an H100 holds ~80 GB.
H200_LIMIT_BYTES = 100e9


@dataclasses.dataclass
class RungState:
    """state: "to do", "warm-up failed", "retry warm-up", "did not fit", "out of band", "measuring" or
    "measured"; final: nothing more to run; env: the next call's variables; parts: the parts it measures."""

    rung: str
    state: str
    detail: str = ""
    final: bool = False
    env: dict = dataclasses.field(default_factory=dict)
    parts: list = dataclasses.field(default_factory=list)
    needs_h200: bool = False
    carry_rollouts: bool = False
    band_accuracy: float | None = None


def _on_h200(record: Mapping) -> bool:
    return (record.get("bytes_limit") or 0) > H200_LIMIT_BYTES


def _oom_text(record: Mapping) -> str:
    request = record.get("requested_bytes")
    return (f"out of memory on {record.get('device', '?')}: peak {gb(record.get('peak_bytes'))}"
            + (f" before a request of {gb(request)}" if request else ""))


def retry_steps(accuracy: float, steps: int) -> int:
    """The band rule's second warm-up: twice the steps below the band, half above it."""
    return 2 * steps if accuracy < band.BAND[0] else max(1, steps // 2)


def _warmup_state(row: Mapping, record: Mapping | None) -> RungState | None:
    """The state of a rung whose warm-up did not finish (None: it never ran)."""
    name = row["preset"]
    if record is None or record.get("status") == "ok":
        return None
    if record.get("out_of_memory") and _on_h200(record):
        return RungState(name, "did not fit", "warm-up " + _oom_text(record), final=True)
    if record.get("out_of_memory"):
        return RungState(name, "warm-up failed", "warm-up " + _oom_text(record) + ": next on an H200", needs_h200=True)
    error = (record.get("error") or "").strip().splitlines()[-1:] or ["?"]
    return RungState(name, "warm-up failed", f"warm-up failed ({error[0][:200]}): run again", needs_h200=row["needs_h200"])


def rung_state(row: Mapping, directory: str | Path) -> RungState:
    """The rung's state from its collected results (`experiments.scaling collect`) and its plan row."""
    d, name = Path(directory), row["preset"]
    usage = read_record(d / USAGE_FILE) or {}
    meta = read_record(d / "sft_meta.json")
    parts = list(range(1, len(row["measurement"]["parts"]) + 1))
    first_run = row["runs"][0]["parts"] if row["runs"] else parts
    if meta is None:
        failed = _warmup_state(row, (usage.get("warmup") or {}).get("record"))
        if failed is not None:
            failed.parts = first_run if not failed.final else []
            failed.env = {"LADDER_PARTS": ",".join(map(str, failed.parts))} if not failed.final else {}
            return failed
        return RungState(name, "to do", env={"LADDER_PARTS": ",".join(map(str, first_run))}, parts=first_run,
                         needs_h200=row["needs_h200"])
    accuracy, steps = band.mean_sampled_accuracy(meta), meta["sft_config"]["steps"]
    retried = steps != row["warmup"]["steps"]
    sha_env = {"WARMUP_SHA256": meta["params_sha256"], **({"LADDER_SFT_STEPS": str(steps)} if retried else {})}
    if band.distance_to_band(accuracy) > 0:
        if retried:
            return RungState(name, "out of band", f"band accuracy {accuracy:.3f} after {steps} steps (and the preset's "
                             f"{row['warmup']['steps']}): not measured", final=True, band_accuracy=accuracy)
        new = retry_steps(accuracy, steps)
        return RungState(name, "retry warm-up", f"band accuracy {accuracy:.3f} after {steps} steps: {new} steps next",
                         env={"LADDER_SFT_STEPS": str(new), "LADDER_PARTS": ",".join(map(str, first_run))},
                         parts=first_run, needs_h200=row["needs_h200"], band_accuracy=accuracy)
    entries = usage.get("parts", {})
    measured = [k for k in parts if (entries.get(str(k)) or {}).get("measured")]
    records = {k: (entries.get(str(k)) or {}).get("record") for k in parts}
    too_big = [k for k in parts if k not in measured and records[k] and records[k].get("out_of_memory") and _on_h200(records[k])]
    needs_h200 = row["needs_h200"] or any(r and r.get("out_of_memory") for r in records.values())
    notes = [f"part {k}: {_oom_text(records[k])}" for k in too_big]
    remaining = [k for k in parts if k not in measured and k not in too_big]
    if not remaining:
        return RungState(name, "measured", "; ".join(notes), final=True, band_accuracy=accuracy)
    seconds = [row["measurement"]["parts"][k - 1]["seconds_calibrated"] for k in remaining]
    run = scaling_plan.device_runs(row["warmup"]["seconds_calibrated"], seconds)[0]
    chosen = [remaining[i - 1] for i in run["parts"]]
    failed = [f"part {k}: failed, to run again" for k in remaining if records[k] and records[k].get("status") == "failed"
              and not records[k].get("out_of_memory")]
    return RungState(name, "measuring", f"{len(measured)} of {len(parts)} parts measured" + "".join(
        "; " + n for n in notes + failed), env={**sha_env, "LADDER_PARTS": ",".join(map(str, chosen))}, parts=chosen,
        needs_h200=needs_h200, carry_rollouts=bool(measured), band_accuracy=accuracy)


def device_command(state: RungState) -> str:
    """The device call's command (tools/long_horizon_call.sh, ladder mode; a run directory per call's parts)."""
    env = {"LADDER": state.rung, **state.env}
    tag = "_".join(filter(None, [state.rung, "p" + "-".join(map(str, state.parts)),
                                 f"s{state.env['LADDER_SFT_STEPS']}" if "LADDER_SFT_STEPS" in state.env else ""]))
    assignments = " ".join(f"{k}={v}" for k, v in env.items())
    return f"{assignments} RUN_DIR=/tmp/ladder_{tag} MODE=ladder bash tools/long_horizon_call.sh"


def _peaks(usage: Mapping | None) -> str:
    if not usage:
        return ""
    cells = []
    for label, entry in [("warm-up", usage.get("warmup")), *((f"part {k}", e) for k, e in usage.get("parts", {}).items())]:
        record = (entry or {}).get("record")
        if not record:
            continue
        factor = entry.get("memory_factor")
        mark = ">=" if entry.get("memory_factor_is_lower_bound") else ""
        cells.append(f"{label} {gb(record.get('peak_bytes'))}" + ("" if factor is None else f" (x{mark}{factor:.2f})")
                     + (" OOM" if record.get("out_of_memory") else ""))
    return "; ".join(cells)


def _fmt(c, digits: int = 3) -> str:
    if not c or c.get("value") is None:
        return "n/a"
    f = lambda x: "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"  # noqa: E731
    return f"{f(c['value'])} [{f(c['lo'])}, {f(c['hi'])}]"


def rung_table(rows: Sequence[Mapping], states: Mapping[str, RungState], results: Path) -> list[str]:
    lines = ["| # | rung | role | moves (from parent) | params | device | warm-up GB / measurement GB (calibrated) | "
             "device runs (min) | state | band accuracy | measured peaks (x estimate) |", "|" + "---|" * 11]
    for i, r in enumerate(rows, 1):
        s = states[r["preset"]]
        device = "H200 (needs_h200)" if s.needs_h200 else "H100 or H200"
        if not r["fits_h200_calibrated"]:
            device += ", over an H200 by the estimate: runs, its peak recorded"
        runs = ", ".join(f"{x['seconds'] / 60:.0f}" + (" (over one machine)" if x["over_one_machine"] else "") for x in r["runs"])
        acc = "" if s.band_accuracy is None else f"{s.band_accuracy:.3f}"
        lines.append(f"| {i} | {r['preset']} | {r['role']} | {r['moves']} | {r['params_total'] / 1e6:,.0f}M | {device} | "
                     f"{r['warmup']['memory_calibrated'] / 1e9:.0f} / {r['measurement']['memory_calibrated'] / 1e9:.0f} | "
                     f"{runs} | **{s.state}**{': ' + s.detail if s.detail else ''} | {acc} | "
                     f"{_peaks(read_record(results / r['preset'] / USAGE_FILE))} |")
    return lines


def results_table(rows: Sequence[Mapping], results: Path, dose) -> list[str]:
    """Per measured rung and recipe, on the headline group: error/noise in norm terms, coherent bias, the
    FP4-All-the-Way ratio, the sampler-trainer k3 KL against BF16's, the policy change, and the dose link."""
    lines = []
    for r in rows:
        summary = read_record(results / r["preset"] / SUMMARY_FILE)
        if not summary:
            continue
        g = summary["headline_group"]
        lines += ["", f"### {r['preset']} (group '{g}'; {summary['tokens_per_batch']:.0f} loss tokens per batch; "
                  f"rollout accuracy {_fmt(summary['accuracy'])}; AdamW warmed on {summary['adam_warmup_batches']} batches)", "",
                  "| recipe | error / noise (norm) | coherent bias | R = ‖g‖/‖error‖ (R < √3?) | A | b | T_s | "
                  "k3 KL sampler-trainer (bf16: floor) | policy change KL | verdict | dose-response A_f |",
                  "|" + "---|" * 11]
        for name, e in summary["recipes"].items():
            a_f = dose.first_failing(name) if name in ("nvfp4", "+dq") else None
            dose_cell = "" if name not in ("nvfp4", "+dq") else ("not measured" if a_f is None else f"{a_f:g}")
            ratio = e.get("fp4_ratio")
            below = "" if not ratio or ratio.get("value") is None else (
                " (yes)" if ratio["hi"] is not None and ratio["hi"] < 3 ** 0.5 else
                " (no)" if ratio["lo"] is not None and ratio["lo"] > 3 ** 0.5 else " (undecided)")
            lines.append(f"| {name} | {_fmt(e.get('noise_fraction_norm'))} | {_fmt(e.get('coherent_bias'))} | "
                         f"{_fmt(ratio)}{below} | {_fmt(e.get('A'))} | {_fmt(e.get('b'))} | {_fmt(e.get('Ts'))} | "
                         f"{_fmt(e.get('mismatch_k3'))}{' (floor)' if name == 'bf16' else ''} | "
                         f"{_fmt(e.get('policy_change_kl'))} | {e.get('verdict', '')} | {dose_cell} |")
    return lines


def next_calls(rows: Sequence[Mapping], states: Mapping[str, RungState], results: str) -> list[str]:
    todo = [states[r["preset"]] for r in rows if not states[r["preset"]].final]
    if not todo:
        return ["Every rung is measured or reported. Next: the fit (below)."]
    s = todo[0]
    carry = [".whl"] + ([f"runs/{s.rung}/gradients/rollouts.npz"] if s.carry_rollouts else [])
    lines = [f"Next: **{s.rung}** ({s.state}; parts {', '.join(map(str, s.parts))}). The device call "
             f"(run with carry={json.dumps(carry)}, needs_h200={'true' if s.needs_h200 else 'false'}, timeout_s=600), "
             "repeated at once until it prints \"=== finished\":", "", "```bash", device_command(s), "```", "",
             "Then, here (the call's files under FILES_AT):", "", "```bash",
             "for f in FILES_AT/ladder_*.tgz; do tar xzf \"$f\"; done   # into runs/ (ignored by git)",
             f"python -m experiments.scaling collect --ladder={s.rung}   # {results}/{s.rung}: the small results, usage, "
             "calibration", "python -m experiments.scaling status", "```"]
    later = [f"{t.rung} ({t.state})" for t in todo[1:]]
    if later:
        lines += ["", "After it: " + ", ".join(later) + "."]
    return lines


def status_markdown(rows: Sequence[Mapping], results: str | Path, fit_rules: str, dose_rules: str, dose, command: str,
                    fit_ready: str) -> str:
    """The status page: rules, rungs, results, the next call, the fit."""
    results = Path(results)
    states = {r["preset"]: rung_state(r, results / r["preset"]) for r in rows}
    lines = ["# Model-size ladder: status", "", f"Written by `{command}` from `{results}/RUNG/` (what "
             "`python -m experiments.scaling collect` stored); the plan's estimates are recomputed with the calibration "
             "of the measured rungs (plan.md beside this file).", "",
             "## Rules (declared before any rung runs)", "", RULES, "", "### The fit", "", "```", fit_rules, "```", "",
             "### The dose-response link", "", "```", dose_rules, "```", "", "## Rungs, in device order", ""]
    lines += rung_table(rows, states, results)
    lines += ["", "## Next device call", ""] + next_calls(rows, states, str(results))
    measured = results_table(rows, results, dose)
    lines += ["", "## Results per measured rung"] + (measured or ["", "No rung is measured yet."])
    lines += ["", "## The fit", "", fit_ready, "",
              "## Raw arrays", "", f"Only the small files of each rung are in git ({results}/RUNG: the warm-up's "
              f"sft_meta.json and accuracy table, band.md, {USAGE_FILE}, report.md, scaling_point.json, {SUMMARY_FILE}). "
              "The raw arrays (stored rollouts, per-part Gram matrices: gradients.npz) stay in runs/RUNG/gradients/ on the "
              "machine that collected them (ignored by git; the device carries the working tree under 64 MiB). To "
              "regenerate them, run the rung's calls again: its warm-up is deterministic (its digest is in sft_meta.json, "
              "held by WARMUP_SHA256) and its rollouts are drawn with the preset's seed.", ""]
    return "\n".join(lines)


def _k3(variants: Mapping, impl: str) -> dict | None:
    """The sampler-trainer k3 KL in bf16 compute with the measurement's quantizer (else the first measured)."""
    measured = {k: v for k, v in variants.items() if isinstance(v, Mapping)}
    return measured.get(f"bfloat16/{impl}") or next(iter(measured.values()), None)


def summary(gradients: Mapping, headline: str) -> dict:
    """The numbers the status shows per recipe, from a measurement's gradients.json (`fp4rl.studies.gradients`)."""
    group = headline if headline in gradients["groups"] else "all"
    config, impl = gradients["config"], gradients["model"]["impl"]
    lr = f"{gradients['lrs'][len(gradients['lrs']) // 2]:g}"
    # a measurement stored before adam_warmup_batches existed ran every policy change from a fresh AdamW state
    out = {"headline_group": group, "tokens_per_batch": gradients["tokens_per_batch"], "batches": gradients["batches"],
           "accuracy": gradients["rollouts"]["accuracy"], "adam_warmup_batches": config.get("adam_warmup_batches", 0),
           "policy_change_lr": lr, "warmup_sha256": gradients.get("warmup_sha256"),
           "rollouts_sha256": gradients.get("rollouts_sha256"), "decision": gradients["decision"]["conclusion"], "recipes": {}}
    verdicts = gradients["decision_by_group"].get(group, {}).get("per_recipe", {})
    for name, e in gradients["recipes"].items():
        bs = e["batch_scaling"][group]
        vs = e["vs_bf16"][group]
        b = {k: (None if v is None else math.sqrt(max(v, 0.0))) for k, v in bs["coherent_bias_sq"].items()}
        out["recipes"][name] = {
            "noise_fraction": vs.get("noise_fraction"), "noise_fraction_norm": vs.get("noise_fraction_norm"),
            "coherent_bias": vs["coherent_bias"], "fp4_ratio": bs["fp4_ratio"], "A": bs["A"], "b": b,
            "Ts": bs["noise_scale_tokens"], "tokens_to_threshold": bs["tokens_to_threshold"],
            "mismatch_k3": _k3(e["mismatch_k3"], impl),
            "policy_change_kl": e["policy_change_kl"].get(lr), "verdict": verdicts.get(name, {}).get("verdict", ""),
            "decision_by_group": {g: d["per_recipe"].get(name, {}).get("verdict", "")
                                  for g, d in gradients["decision_by_group"].items()}}
    return out
