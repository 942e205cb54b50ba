"""The model-size ladder: `python -m experiments.scaling {plan,fit,collect,status}`.

plan: per rung of `fp4rl.configs.SCALING_LADDER` (or --ladder=A,B,...), in device order: its role, the
  factor it moves from its parent, parameters (total, active), FLOPs per token, the layers selective
  precision keeps in BF16, and the estimated peak memory and time of its warm-up and measurement parts,
  calibrated on the measured rungs' peaks (`fp4rl.analysis.scaling_plan`, `scaling_usage`); writes
  <out>/plan.md and plan.json.
collect: a rung's device results (runs/RUNG, unpacked from the ladder mode's tgz files) into
  results/scaling_h200/RUNG: its warm-up's metadata, the band table, every process's usage with the
  plan's estimates and their ratios (the calibration), and, once every part is measured (merged with
  `fp4rl.studies.gradients`' --merge when in parts), report.md, scaling_point.json and summary.json.
status: results/scaling_h200/status.md (and plan.md): the rules, each rung's state, results and measured
  peaks, and the next device call (`fp4rl.analysis.ladder_status`).
fit: reads every fitted rung's scaling point (results/scaling_h200/RUNG, or --points=DIR,DIR,...), fits
  the rule's quantities against depth and width with tokens per update entering exactly, checks the fit
  off the axes and on the largest rung, extrapolates to the target (--paper.hf_config,
  --paper.tokens_per_update), says where the rule flips, and links the rungs to the dose-response
  (--dose.nvfp4, --dose.dq: the first failing amplifications; `fp4rl.analysis.scaling`); writes
  <out>/report.md, scaling_fit.json and scaling_fit.png.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

from fp4rl import configs
from fp4rl.analysis import ladder_status, scaling, scaling_dose, scaling_plan, scaling_report, scaling_usage
from fp4rl.config_cli import cli

COMMANDS = ("plan", "fit", "collect", "status")
# Fitted rungs a fit needs before it is worth running: the base, one per axis, and one more (a residual).
FIT_MIN_RUNGS = 4


def ladder_spec() -> scaling_plan.Ladder:
    return scaling_plan.Ladder(configs.SCALING_LADDER, configs.LADDER_PARENTS, configs.SCALING_FACTOR_RUNGS,
                               configs.LADDER_PARTS)


def plan_rows(only=(), results: str = configs.LADDER_RESULTS) -> list[dict]:
    """The calibrated plan: every rung's estimates times the factors measured so far under `results`."""
    ladder = ladder_spec()
    params = {r["preset"]: r["params_total"] for r in scaling_plan.plan(ladder, configs.SFT_PRESETS, configs.GRADIENTS_PRESETS)}
    usages = scaling_usage.load_usages(results, ladder.rungs)
    return scaling_plan.plan(ladder, configs.SFT_PRESETS, configs.GRADIENTS_PRESETS,
                             scaling_usage.calibration(usages, params), only)


def infos(rows) -> dict[str, dict]:
    return {r["preset"]: {"role": r["role"], "parent": r["parent"], "moves": r["moves"]} for r in rows}


# ---------------------------------------------------------------------------------- collect
def _copy(source: Path, target: Path) -> None:
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _usage(row: dict, run_dir: Path) -> dict:
    """The usage records of the rung's processes beside the plan's estimates (uncalibrated)."""
    warm = row["warmup"]
    usage = {"warmup": scaling_usage.ratios(scaling_usage.read_record(run_dir / "usage_warmup.json"),
                                            warm["memory_bytes"], warm["seconds_slow"]), "parts": {}}
    for k, part in enumerate(row["measurement"]["parts"], 1):
        record = scaling_usage.read_record(run_dir / f"usage_part{k}.json")
        measured = (run_dir / "gradients" / f"part{k}" / "gradients.json").is_file()
        if record is None and not measured:
            continue
        usage["parts"][str(k)] = {**scaling_usage.ratios(record, part["memory_bytes"], part["seconds_slow"]),
                                  "recipes": part["recipes"], "measured": measured}
    return usage


def collect(rung: str, runs: str = "runs", results: str = configs.LADDER_RESULTS, paper=None) -> Path:
    """Store `rung`'s device results from runs/RUNG under results/RUNG (module docstring)."""
    from fp4rl.studies import gradients

    if rung not in configs.SCALING_LADDER:
        raise SystemExit(f"unknown rung {rung!r}; valid rungs: {', '.join(configs.SCALING_LADDER)}")
    run_dir, out = Path(runs) / rung, Path(results) / rung
    if not run_dir.is_dir():
        raise SystemExit(f"{run_dir} does not exist: unpack the ladder call's ladder_{rung}*.tgz files here first")
    row = scaling_plan.plan(ladder_spec(), configs.SFT_PRESETS, configs.GRADIENTS_PRESETS, only=[rung])[0]
    meta = json.loads((run_dir / "ladder.json").read_text()) if (run_dir / "ladder.json").is_file() else {}
    sft_dir = Path(meta.get("sft_dir") or configs.SFT_PRESETS[rung].out)
    out.mkdir(parents=True, exist_ok=True)
    for source, name in ((sft_dir / "sft_meta.json", "sft_meta.json"), (sft_dir / "accuracy.md", "accuracy.md"),
                         (run_dir / "band.md", "band.md")):
        _copy(source, out / name)
    usage = _usage(row, run_dir)
    (out / scaling_usage.USAGE_FILE).write_text(json.dumps(usage, indent=1))
    state = ladder_status.rung_state(scaling_plan.calibrate(row, scaling_usage.PRIOR, "prior"), out)
    measured = [k for k, e in usage["parts"].items() if e["measured"]]
    if state.state != "measured" or not measured:
        print(f"{rung}: {state.state} ({state.detail}); {len(measured)} of {len(row['measurement']['parts'])} parts measured")
        return out
    parts = [str(run_dir / "gradients" / f"part{k}") for k in measured]
    source = Path(parts[0])
    if len(parts) > 1:
        source = run_dir / "gradients" / "merged"
        gradients.run(dataclasses.replace(configs.GRADIENTS_PRESETS[rung], merge=tuple(parts), out=str(source)))
    for name in ("report.md", scaling.SCALING_POINT_FILE):
        _copy(source / name, out / name)
    headline = scaling.target_groups(["all", "shared_expert", "all_but_shared"], paper or scaling.PaperSetting())[1]
    result = json.loads((source / "gradients.json").read_text())
    (out / ladder_status.SUMMARY_FILE).write_text(json.dumps(ladder_status.summary(result, headline), indent=1))
    print(f"{rung}: measured; results in {out}")
    return out


# ---------------------------------------------------------------------------------- status and fit
def fit_rules() -> str:
    doc = scaling.__doc__
    return doc[doc.index("Fit form"):doc.index("Intervals (95%)")].strip()


def fit_readiness(rows, results: Path) -> str:
    fitted = [r["preset"] for r in rows if r["role"] in scaling.FITTED_ROLES
              and (results / r["preset"] / scaling.SCALING_POINT_FILE).is_file()]
    command = f"python -m experiments.scaling fit --out={results}/fit"
    if len(fitted) < FIT_MIN_RUNGS:
        return (f"Not yet: {len(fitted)} fitted rung(s) measured ({', '.join(fitted) or 'none'}); the fit needs "
                f"{FIT_MIN_RUNGS} (the base, one per axis, one more for a residual), and check (1) needs the off-axis "
                f"rung. Then: `{command}`.")
    return f"{len(fitted)} fitted rungs measured ({', '.join(fitted)}): `{command}` (its report says whether check (1) holds)."


def status(config: scaling.ScalingConfig, argv) -> str:
    results = Path(configs.LADDER_RESULTS)
    rows = plan_rows(results=str(results))
    results.mkdir(parents=True, exist_ok=True)
    scaling_plan.write_plan(rows, results)
    dose_doc = scaling_dose.__doc__
    text = ladder_status.status_markdown(
        rows, results, fit_rules(), dose_doc[dose_doc.index("The dose-response (docs/rl.md"):].strip(), config.dose,
        " ".join(["python -m experiments.scaling", *argv]), fit_readiness(rows, results))
    (results / "status.md").write_text(text)
    return text


def main(argv=None) -> dict | list | str:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        cli(scaling.ScalingConfig, None, ["--help"])  # the options, then exits
    commands = [a for a in argv if a.lstrip("-") in COMMANDS]  # `plan` or `--plan`
    if len(commands) != 1:
        raise SystemExit(f"usage: python -m experiments.scaling {{{','.join(COMMANDS)}}} [--option=value ...]; "
                         f"got {argv or 'no command'} (valid commands: {', '.join(COMMANDS)})")
    command = commands[0].lstrip("-")
    config = cli(scaling.ScalingConfig, None, [a for a in argv if a is not commands[0]])
    unknown = [n for n in config.ladder if n not in configs.SCALING_LADDER]
    if unknown and not (command == "fit" and config.points):
        raise SystemExit(f"unknown rungs {unknown}; valid rungs: {', '.join(configs.SCALING_LADDER)}")
    if command == "plan":
        rows = plan_rows(config.ladder)
        paths = scaling_plan.write_plan(rows, config.out)
        print(paths["report"].read_text())
        print(f"wrote {paths['report']} and {paths['json']}")
        return rows
    if command == "collect":
        if not config.ladder:
            raise SystemExit(f"collect needs --ladder=RUNG[,RUNG...]; valid rungs: {', '.join(configs.SCALING_LADDER)}")
        return [str(collect(rung, paper=config.paper)) for rung in config.ladder]
    if command == "status":
        text = status(config, argv)
        print(text)
        return text
    rows = plan_rows()
    ladder = config.ladder or tuple(r["preset"] for r in rows)
    directories = config.points or tuple(f"{configs.LADDER_RESULTS}/{n}" for n in ladder
                                         if Path(configs.LADDER_RESULTS, n, scaling.SCALING_POINT_FILE).is_file())
    results = scaling_report.run(config, directories, infos(rows))
    print(f"report: {config.out}/{scaling.REPORT_FILE}")
    return results


if __name__ == "__main__":
    main()
