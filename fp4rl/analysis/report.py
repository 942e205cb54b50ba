"""Write the ablation report of a run directory (RL.md "The report").

`write_report(run_dir)` loads `<run_dir>/<arm>/seed<k>/metrics.jsonl`, judges every arm
against the declared `StabilityCriteria` (RL.md "Stability criteria (declare before
running, report per arm)"), and writes:

- `report.md`: the declared criteria, the claim status, a per-arm table of every criterion
  and the verdict, a per-seed table, the figures, the configuration and the commands, and
  every warning raised while loading ("whatever the outcome, the report says what was
  measured");
- `grad_norm.png`, `seeds.png`, `summary.png` (see `fp4rl.analysis.plots`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from fp4rl.analysis import plots
from fp4rl.analysis.runs import REFERENCE_ARM, RunData, load_run
from fp4rl.analysis.stability import ArmVerdict, ClaimResult, StabilityCriteria, claim_reproduced, verdict
from fp4rl.analysis.summary import ArmSummary, summarize_run


class ReportPaths(NamedTuple):
    report_md: Path
    grad_norm_png: Path
    seeds_png: Path
    summary_png: Path


def _num(x: float, fmt: str = ".3g") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _mark(passed: bool | None) -> str:
    return {True: "PASS", False: "**FAIL**", None: "n/a"}[passed]


def _arm_table(summaries: Mapping[str, ArmSummary], verdicts: Mapping[str, ArmVerdict]) -> list[str]:
    head = ("arm", "seeds", "steps (min-max)", "spikes/100 (mean; max)", "severe spikes", "spike",
            "collapsed seeds", "collapse", "reward gap to BF16 (mean; seeds min..max)", "reward",
            "final held-out acc (mean [CI])", "k3 KL/token (sampler vs trainer)", "routing flip", "verdict")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in summaries.items():
        v = verdicts[arm]
        steps = [x.n_steps for x in s.seeds]
        rates = [x.spikes_per_100 for x in s.seeds]
        finite_rates = [r for r in rates if not math.isnan(r)]
        gaps = [x.reward_gap for x in s.seeds if not math.isnan(x.reward_gap)]
        gap = "n/a" if not gaps else f"{s.reward_gap_mean:+.3f} ({min(gaps):+.3f}..{max(gaps):+.3f})"
        ci = s.final_accuracy
        acc = "n/a" if ci is None else f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]" + (" (1 seed)" if ci.degenerate else "")
        n_col = sum(x.collapse.collapsed for x in s.seeds)
        rate = "n/a" if not finite_rates else f"{sum(finite_rates) / len(finite_rates):.2f}; {max(finite_rates):.2f}"
        row = (f"`{arm}`", str(len(s.seeds)), f"{min(steps)}-{max(steps)}", rate,
               str(sum(len(x.severe_steps) for x in s.seeds)), _mark(v.spike.passed),
               f"{n_col}/{len(s.seeds)}", _mark(v.collapse.passed), gap, _mark(v.reward.passed), acc,
               _num(s.mismatch.kl_k3), _num(s.mismatch.routing_flip), _mark(v.passed))
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def _seed_table(summaries: Mapping[str, ArmSummary]) -> list[str]:
    head = ("arm", "seed", "steps", "last step", "spike steps", "severe steps", "spikes/100", "collapse",
            "reward gap", "final acc (step)", "k3 KL/token", "max abs dlogp", "skipped updates")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in summaries.items():
        for x in s.seeds:
            acc = "n/a" if x.final_accuracy_step is None else f"{_num(x.final_accuracy)} ({x.final_accuracy_step})"
            row = (f"`{arm}`", str(x.seed), str(x.n_steps), str(x.last_step),
                   ", ".join(map(str, x.spike_steps)) or "-", ", ".join(map(str, x.severe_steps)) or "-",
                   _num(x.spikes_per_100, ".2f"), x.collapse.reason or "none", _num(x.reward_gap, "+.3f"),
                   acc, _num(x.mismatch.kl_k3), _num(x.mismatch.max_abs_logp_diff), str(x.skipped_updates))
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def _notes(run: RunData, summaries: Mapping[str, ArmSummary]) -> list[str]:
    notes = [f"- load: {w}" for w in run.warnings]
    if REFERENCE_ARM not in run.arms:
        notes.append(f"- no `{REFERENCE_ARM}` arm in this run: the reward criterion could not be evaluated.")
    for arm, s in summaries.items():
        for x in s.seeds:
            if x.collapse.note:
                notes.append(f"- `{arm}` seed {x.seed}: {x.collapse.note}")
        if s.final_accuracy is not None and s.final_accuracy.note:
            notes.append(f"- `{arm}` final accuracy: {s.final_accuracy.note}")
    return notes or ["- none"]


def render_report(
    run: RunData, summaries: Mapping[str, ArmSummary], verdicts: Mapping[str, ArmVerdict], claim: ClaimResult,
    criteria: StabilityCriteria, figures: Sequence[Path], config_text: str = "", commands: Sequence[str] = (),
) -> str:
    """The report.md text (figures are linked by file name, relative to the report)."""
    status = {True: "REPRODUCED", False: "NOT REPRODUCED", None: "UNDECIDED"}[claim.reproduced]
    out = [
        f"# Ablation report: `{run.root.name}`",
        "",
        f"Run directory: `{run.root}`. Arms: {', '.join(f'`{a}`' for a in run.arms)}.",
        "",
        "## Claim",
        "",
        "RL.md: NVFP4 RL trains as stably as BF16 only with dequantized backward + Four-Over-Six + "
        "selective high precision together. Reproduced when `full` passes the spike, collapse and reward "
        "criteria and each leave-one-out arm (`full-dq`, `full-46`, `full-hp`) fails at least one.",
        "",
        f"**Status: {status}.**",
        "",
        *[f"- `{arm}`: {text}" for arm, text in claim.details.items()],
        "",
        "## Criteria (declared before the run)",
        "",
        *[f"- {line}" for line in criteria.describe()],
        "",
        "## Per-arm results",
        "",
        *_arm_table(summaries, verdicts),
        "",
        "Failing criteria in detail:",
        "",
        *([f"- `{arm}` {c.name}: {c.value} (threshold {c.threshold})"
           for arm, v in verdicts.items() for c in v.criteria if c.passed is False] or ["- none"]),
        "",
        "## Figures",
        "",
        *[f"![{p.stem}]({p.name})\n" for p in figures],
        "## Per-seed results",
        "",
        *_seed_table(summaries),
        "",
        "## Notes",
        "",
        *_notes(run, summaries),
        "",
        "## Configuration",
        "",
        "```",
        config_text.rstrip() or "(not given)",
        "```",
        "",
        "## Commands",
        "",
        "```",
        *(list(commands) or ["(not given)"]),
        "```",
        "",
    ]
    return "\n".join(out)


def write_report(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    config_text: str = "",
    commands: Sequence[str] = (),
    criteria: StabilityCriteria = StabilityCriteria(),
) -> ReportPaths:
    """Load `run_dir`, judge it, and write report.md and the three PNGs into `out_dir`
    (default: `run_dir` itself). Returns the four paths."""
    run = load_run(run_dir)
    out = Path(run_dir) if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize_run(run, criteria)
    verdicts = {arm: verdict(s, criteria) for arm, s in summaries.items()}
    claim = claim_reproduced(verdicts)
    paths = ReportPaths(
        report_md=out / "report.md",
        grad_norm_png=plots.plot_grad_norm(run, out / "grad_norm.png", criteria),
        seeds_png=plots.plot_seeds(run, summaries, out / "seeds.png", criteria),
        summary_png=plots.plot_summary(summaries, out / "summary.png", criteria),
    )
    text = render_report(run, summaries, verdicts, claim, criteria,
                         (paths.grad_norm_png, paths.seeds_png, paths.summary_png), config_text, commands)
    paths.report_md.write_text(text, encoding="utf-8")
    return paths
