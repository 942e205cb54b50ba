"""The settings the runs under a run directory ran with, read from their files: the warm-up's
sft_meta.json and each run's config.json.

The ablation runner writes them into its report (`settings_text`) and checks that one matrix runs
on one expert-GEMM backend (`expert_gemm_of`); `python -m experiments.report` rewrites a
report with them. A module of its own, below both: the runner imports the report writer, and the
report's command line needs these settings without the runner.
"""

from __future__ import annotations

import json
from pathlib import Path

from fp4rl.rl import resume, sft
from fp4rl.run_files import MERGED_KEY, read_json


def run_records(out: Path) -> dict[str, dict]:
    """Run name (its directory under `out`) -> its config.json: every arm, then the learning run."""
    out = Path(out)
    dirs = sorted(p for p in out.iterdir() if (p / resume.CONFIG_FILE).is_file())
    if (out / "learning" / "bf16" / resume.CONFIG_FILE).is_file():
        dirs.append(out / "learning" / "bf16")
    return {str(d.relative_to(out)): read_json(d / resume.CONFIG_FILE) for d in dirs}


def expert_gemm_of(record: dict) -> str:
    """The grouped-GEMM backend of the routed experts a run's config.json says it ran on: the run's
    own `expert_gemm`, else ("": keep the warm-up's) its model config's; configs saved before
    the field existed ran on "xla"."""
    return (record.get("rl_config", {}).get("expert_gemm") or record.get("model_config", {}).get("expert_gemm")
            or "xla")


def settings_text(out: Path) -> str:
    """The settings every run under `out` ran with, read from their directories: the warm-up's
    sft_meta.json, and each arm's (and the learning run's) config.json, the settings all share
    once and then each run's own, and the expert-GEMM backend the runs ran on."""
    out = Path(out)
    lines = []
    if sft.is_finished(out / "sft"):
        lines += ["warm-up (sft/sft_meta.json):", json.dumps(read_json(out / "sft" / sft.META_FILE)["sft_config"],
                                                             sort_keys=True), ""]
    records = run_records(out)
    runs = {name: resume.flatten(record["rl_config"]) for name, record in records.items()}
    if not runs:
        return "\n".join(lines + ["(no arm has a config.json)"])
    first = next(iter(runs.values()))
    common = {k: v for k, v in first.items() if all(k in r and r[k] == v for r in runs.values())}
    lines.append(f"RL settings common to {', '.join(runs)} (<run>/config.json):")
    lines += [f"  {k}={json.dumps(v)}" for k, v in common.items()]
    for name, flat in runs.items():
        own = {k: v for k, v in flat.items() if k not in common}
        lines.append(f"{name}: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in own.items()))
        if merged := merged_text(records[name]):
            lines.append(f"  {merged}")
        if (out / name / resume.CHANGES_FILE).is_file():
            lines.append(f"  settings changed on resume: see {name}/{resume.CHANGES_FILE}")
    gemms = {name: expert_gemm_of(record) for name, record in records.items()}
    if len(set(gemms.values())) == 1:
        lines.append(f"routed experts' grouped GEMMs (expert_gemm) of every run: {next(iter(gemms.values()))}")
    else:
        lines.append("routed experts' grouped GEMMs (expert_gemm): "
                     + ", ".join(f"{name} {gemm}" for name, gemm in gemms.items()))
    return "\n".join(lines)


def merged_text(record: dict) -> str:
    """The report's line on seeds merged into an arm ("" when none)."""
    merged = record.get(MERGED_KEY, [])
    return "; ".join(f"seeds {', '.join(map(str, m['seeds']))} merged from {m['source']} (seed_offset "
                     f"{m['seed_offset']}, settings otherwise equal"
                     + (f"; the same warm-up, {m['warmup_sha256'][:16]}..., from another folder" if "warmup_sha256" in m else "")
                     + ")" for m in merged)
