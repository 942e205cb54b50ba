"""Write the ablation report of a run directory (docs/rl.md "The report").

`write_report(run_dir)` loads the run directory (`fp4rl.analysis.runs`), judges every arm
against the declared `StabilityCriteria` (docs/rl.md "Stability criteria (declare before
running, report per arm)"), and writes:

- `report.md`: the declared criteria, the claim status, a per-arm table of every criterion
  (with each arm's recipe, seeds, judged steps and updates) and the verdict, every failing
  and every undecided criterion with its reason, a per-seed table, the figures, the
  configuration and the commands, and every warning raised while loading ("whatever the
  outcome, the report says what was measured");
- `grad_norm.png`, `seeds.png`, `summary.png` (see `fp4rl.analysis.plots`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from fp4rl.analysis import plots
from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.runs import REFERENCE_ARM, UPDATES_FILE, RunData, load_run
from fp4rl.analysis.statistics import BootstrapCI
from fp4rl.analysis.summary import ArmSummary, summarize_run
from fp4rl.analysis.verdicts import ArmVerdict, ClaimResult, CriterionResult, claim_reproduced, run_verdicts


class ReportPaths(NamedTuple):
    report_md: Path
    grad_norm_png: Path
    seeds_png: Path
    summary_png: Path


def recipe_summary(config: Mapping | None) -> str:
    """The arm's precision line from its config.json: "all layers BF16" when every site of the
    recipe is BF16, else `PrecisionRecipe.high_precision_summary(num_layers)`'s
    "k of L layers kept in BF16 (p%)". It reads the recipe JSON with the recipe's rounding
    rule (round half up, at least one layer when the fraction is > 0; tests pin it to
    `PrecisionRecipe`) so that the analysis runs without jax."""
    try:
        recipe, num_layers = config["recipe"], int(config["model_config"]["num_layers"])
        fraction = float(recipe["keep_last_fraction"])
        formats = [v["format"] for v in recipe.values() if isinstance(v, Mapping) and "format" in v]
    except (KeyError, TypeError, ValueError):
        return "n/a (no readable config.json)"
    if formats and all(f == "bf16" for f in formats):
        return "all layers BF16"
    k = 0 if fraction == 0.0 else max(1, math.floor(fraction * num_layers + 0.5 + 1e-9))
    return f"{k} of {num_layers} layers kept in BF16 ({100 * k / num_layers:.1f}%)"


def _num(x: float, fmt: str = ".3g") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _mark(passed: bool | None, few_seeds: int | None = None) -> str:
    mark = {True: "PASS", False: "**FAIL**", None: "UNDECIDED"}[passed]
    return mark if passed is None or few_seeds is None else f"{mark} (few seeds: {few_seeds})"


def _criterion_mark(c: CriterionResult) -> str:
    return _mark(c.passed, c.few_seeds)


def _verdict_mark(v: ArmVerdict) -> str:
    """The arm's verdict, marked "few seeds" when what decides it does: a pass rests on every
    criterion's, a failure on its failing criteria's when each of them is flagged."""
    if v.passed is True:
        flagged = [c.few_seeds for c in v.criteria if c.few_seeds is not None]
    elif v.passed is False:
        failing = [c for c in v.criteria if c.passed is False]
        flagged = [c.few_seeds for c in failing] if all(c.few_seeds is not None for c in failing) else []
    else:
        flagged = []
    return _mark(v.passed, min(flagged) if flagged else None)


def _ci(ci: BootstrapCI | None, fmt: str = ".3f") -> str:
    """mean [bootstrap interval] (what it resamples), then the t interval over seeds where there is one."""
    if ci is None:
        return "n/a"
    text = f"{ci.mean:{fmt}} [{ci.low:{fmt}}, {ci.high:{fmt}}] ({ci.kind})"
    if ci.t_interval is not None:
        text += f"; t [{ci.t_interval[0]:{fmt}}, {ci.t_interval[1]:{fmt}}]"
    return text


def _span(values: Sequence[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _arm_table(run: RunData, summaries: Mapping[str, ArmSummary], verdicts: Mapping[str, ArmVerdict]) -> list[str]:
    head = ("arm", "recipe", "seeds (judged)", "steps (min-max)", "judged steps (updates) per seed",
            "spikes/100 steps (mean; max)", "spikes/100 updates (max)", "severe spikes", "spike",
            "collapsed seeds", "collapse", "reward gap to BF16, population, paired by seed (mean [CI]; t [CI])",
            "reward", "final greedy acc (mean [CI]; t [CI])", "final sampled acc (mean [CI]; t [CI])",
            "sampled acc change first-last (mean [CI]; t [CI])",
            "k3 KL/token (sampler vs trainer)", "routing flip", "verdict")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in summaries.items():
        v = verdicts[arm]
        steps = [x.n_steps for x in s.seeds]
        judged = [x.power.judged_steps for x in s.seeds]
        updates = [x.power.judged_updates for x in s.seeds]
        rates = [x.spikes_per_100 for x in s.seeds if not math.isnan(x.spikes_per_100)]
        per_update = [x.spikes.per_100_updates for x in s.seeds if not math.isnan(x.spikes.per_100_updates)]
        rate = "n/a" if not rates else f"{sum(rates) / len(rates):.2f}; {max(rates):.2f}"
        gap = _ci(s.reward_gap_ci, "+.3f") if s.reward_gap_ci is not None else \
            ("n/a" if math.isnan(s.reward_gap_mean) else f"{s.reward_gap_mean:+.3f} (no judged seed)")
        row = (f"`{arm}`", recipe_summary(run.configs.get(arm)), f"{len(s.seeds)} ({len(s.judged_seeds)})",
               _span(steps), f"{_span(judged)} ({_span(updates)})", rate,
               "n/a" if not per_update else f"{max(per_update):.2f}",
               str(sum(x.spikes.severe_spiking_steps for x in s.seeds)), _criterion_mark(v.spike),
               f"{sum(x.collapse.collapsed for x in s.seeds)}/{len(s.seeds)}", _criterion_mark(v.collapse),
               gap, _criterion_mark(v.reward), _ci(s.final_accuracy), _ci(s.final_sampled_accuracy),
               _ci(s.sampled_accuracy_change, "+.3f"), _num(s.mismatch.kl_k3), _num(s.mismatch.routing_flip),
               _verdict_mark(v))
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def _seed_table(summaries: Mapping[str, ArmSummary]) -> list[str]:
    head = ("arm", "seed", "steps", "last step", "judged steps (updates)", "judged", "spike steps (update)",
            "severe steps", "spikes/100 steps", "collapse", "reward gap", "final greedy acc (step, n)",
            "final sampled acc", "k3 KL/token", "max abs dlogp", "empty / skipped updates")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in summaries.items():
        for x in s.seeds:
            g = x.final_greedy
            acc = "n/a" if g is None else f"{_num(g.accuracy)} ({g.step}, n={g.n if g.n is not None else 'n/a'})"
            spikes = ", ".join(f"{st}" + (f" ({u})" if u >= 0 else "")
                               for st, u in zip(x.spikes.spike_steps, x.spikes.spike_updates)) or "-"
            row = (f"`{arm}`", str(x.seed), str(x.n_steps), str(x.last_step),
                   f"{x.power.judged_steps} ({x.power.judged_updates})",
                   "yes" if x.power.judged else f"no: {x.power.reason}", spikes,
                   ", ".join(map(str, x.severe_steps)) or "-", _num(x.spikes_per_100, ".2f"),
                   x.collapse.reason or "none", _num(x.reward_gap, "+.3f"), acc,
                   "n/a" if x.final_sampled is None else _num(x.final_sampled.accuracy), _num(x.mismatch.kl_k3),
                   _num(x.mismatch.max_abs_logp_diff), f"{x.empty_updates} / {x.skipped_updates}")
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def _notes(run: RunData, summaries: Mapping[str, ArmSummary]) -> list[str]:
    notes = [f"- load: {w}" for w in run.warnings]
    if REFERENCE_ARM not in run.arms:
        notes.append(f"- no `{REFERENCE_ARM}` arm in this run: the reward criterion could not be evaluated.")
    for arm, s in summaries.items():
        if arm not in run.configs:
            notes.append(f"- `{arm}`: no readable config.json: its recipe is not reported.")
        fallback = [x.seed for x in s.seeds if not x.spikes.per_update]
        if fallback:
            notes.append(f"- `{arm}` seed(s) {', '.join(map(str, fallback))}: no {UPDATES_FILE}; spikes judged on the "
                         "per-step mean grad_norm/global (a spike in one update can be averaged away).")
        for x in s.seeds:
            if x.collapse.note:
                notes.append(f"- `{arm}` seed {x.seed}: {x.collapse.note}")
        notes += [f"- `{arm}` {n}" for n in s.notes]
        if s.reward_gap_ci is not None and s.reward_gap_ci.note:
            notes.append(f"- `{arm}` reward gap: {s.reward_gap_ci.note}")
    return notes or ["- none"]


def render_report(
    run: RunData, summaries: Mapping[str, ArmSummary], verdicts: Mapping[str, ArmVerdict], claim: ClaimResult,
    criteria: StabilityCriteria, figures: Sequence[Path], config_text: str = "", commands: Sequence[str] = (),
    sections: Sequence[str] = (),
) -> str:
    """The report.md text (figures are linked by file name, relative to the report). `sections`:
    markdown placed after the claim (the ablation runner's learning run and gradient measurements)."""
    status = {True: "REPRODUCED", False: "NOT REPRODUCED", None: "UNDECIDED"}[claim.reproduced]
    out = [
        f"# Ablation report: `{run.root.name}`",
        "",
        f"Run directory: `{run.root}`. Arms: {', '.join(f'`{a}`' for a in run.arms)}.",
        "",
        "## Claim",
        "",
        "docs/rl.md: NVFP4 RL trains as stably as BF16 only with dequantized backward + Four-Over-Six + "
        "selective high precision together. Reproduced when `full` passes the spike, collapse and reward "
        "criteria and each leave-one-out arm (`full-dq`, `full-46`, `full-hp`) fails at least one. "
        "An undecided criterion (too little data) is never counted as a failure.",
        "",
        f"**Status: {status}.**",
        "",
        *[f"- `{arm}`: {text}" for arm, text in claim.details.items()],
        "",
        *_few_seeds_lines(verdicts, criteria),
        *[f"{section.rstrip()}\n" for section in sections],
        "## Criteria (declared before the run)",
        "",
        *[f"- {line}" for line in criteria.describe()],
        "",
        "## Per-arm results",
        "",
        *_arm_table(run, summaries, verdicts),
        "",
        "Failing criteria in detail:",
        "",
        *([f"- `{arm}` {c.name}: {c.value} (threshold {c.threshold})"
           + (f" (few seeds: {c.few_seeds})" if c.few_seeds is not None else "")
           for arm, v in verdicts.items() for c in v.criteria if c.passed is False] or ["- none"]),
        "",
        "Undecided criteria and why:",
        "",
        *([f"- `{arm}` {c.name}: {c.reason} (measured: {c.value})"
           for arm, v in verdicts.items() for c in v.criteria if c.passed is None] or ["- none"]),
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
        *_configuration_and_commands(config_text, commands),
    ]
    return "\n".join(out)


def _few_seeds_lines(verdicts: Mapping[str, ArmVerdict], criteria: StabilityCriteria) -> list[str]:
    """The decided verdicts that rest on fewer than `few_seeds` judged seeds, named."""
    flagged = {arm: [c.name for c in v.criteria if c.few_seeds is not None] for arm, v in verdicts.items()}
    flagged = {arm: names for arm, names in flagged.items() if names}
    if not flagged:
        return []
    listed = "; ".join(f"`{arm}` {', '.join(names)}" for arm, names in flagged.items())
    return [f"Few seeds: these decided verdicts rest on fewer than {criteria.few_seeds} judged seeds, where an interval "
            "over seeds is weak (with 2 seeds the bootstrap's interval is the two seeds' [min, max]; the t interval "
            f"beside it is the honest width) and more seeds could overturn them: {listed}.", ""]


def _configuration_and_commands(config_text: str, commands: Sequence[str]) -> list[str]:
    return ["## Configuration", "", "```", config_text.rstrip() or "(not given)", "```", "",
            "## Commands", "", "```", *(list(commands) or ["(not given)"]), "```", ""]


NO_MATRIX_SECTION = """## The RL ablation matrix

No arm of the matrix ran here (`--arms` was empty), so this run says nothing about stability.
`--arms=all` adds the nine arms; on a CPU preset with a step or two per arm that is a machinery
check (every arm's programs compile and run), whose verdicts are UNDECIDED for lack of steps and
seeds. The matrix with seeds and steps enough to judge runs on a GPU. What the H200 runs found
(results/README.md in the repository): on the `h200` band every arm learned alike and saturated by
step 20, none spiking significantly more often than bf16 (2 seeds: a weak test), a regime that
cannot tell the arms apart (the arms without the dequantized backward then ran the pretraining
recipe's backward, not the paper's); on the
`h200-chain` band bf16 keeps learning through 300 steps (4 seeds; the long-horizon bar is met),
and the matrix runs there (results/long_h200/chain).
"""


def write_sections_report(run_dir: str | Path, sections: Sequence[str], config_text: str = "",
                          commands: Sequence[str] = ()) -> Path:
    """report.md of a run without matrix arms (the main job's default): the runner's `sections`
    (learning run, gradient measurements), what the matrix would add, the settings and commands."""
    out = Path(run_dir)
    text = "\n".join([f"# Ablation runner report: `{out.name}`", "", f"Run directory: `{out}`.", "",
                      *[f"{section.rstrip()}\n" for section in sections], NO_MATRIX_SECTION,
                      *_configuration_and_commands(config_text, commands)])
    path = out / "report.md"
    path.write_text(text, encoding="utf-8")
    return path


def write_report(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    config_text: str = "",
    commands: Sequence[str] = (),
    criteria: StabilityCriteria = StabilityCriteria(),
    sections: Sequence[str] = (),
) -> ReportPaths:
    """Load `run_dir`, judge it, and write report.md and the three PNGs into `out_dir`
    (default: `run_dir` itself). Returns the four paths. `sections`: see `render_report`."""
    run = load_run(run_dir)
    out = Path(run_dir) if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize_run(run, criteria)
    verdicts = run_verdicts(summaries, criteria)
    claim = claim_reproduced(verdicts)
    paths = ReportPaths(
        report_md=out / "report.md",
        grad_norm_png=plots.plot_grad_norm(run, out / "grad_norm.png", criteria),
        seeds_png=plots.plot_seeds(run, summaries, out / "seeds.png", criteria),
        summary_png=plots.plot_summary(summaries, out / "summary.png", criteria),
    )
    text = render_report(run, summaries, verdicts, claim, criteria,
                         (paths.grad_norm_png, paths.seeds_png, paths.summary_png), config_text, commands, sections)
    paths.report_md.write_text(text, encoding="utf-8")
    return paths
