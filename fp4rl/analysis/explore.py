"""The ablation explorer's computations (notebooks/ablations.ipynb; figures in
`fp4rl.analysis.explore_plots`): what the notebook shows beyond report.md, as tables of
(header, rows) the notebook renders with `md_table`.

- `open_run`: resolve and load a run directory (load warnings collected, not raised);
- `overview_table`: per arm, what was loaded (recipe, seeds, steps, update records, evaluations);
- `judge`, `report_sections`, `compare_with_report_on_disk`: the report's own tables, split at
  its `## ` headings, and whether report.md on disk agrees;
- `ratio_to_window`, `spike_attribution`: every spike with each grad-norm group's excursion;
- `reward_grad_points`, `correlation`, `correlation_table`: population reward vs grad norm;
- `with_spike_factor`, `sensitivity_table`, `spike_rate_curve`: the spike verdicts re-judged
  with other spike factors;
- `show_md`, `show_png`: display in IPython, print elsewhere.

Only numpy (and `fp4rl.analysis.report`, hence matplotlib) is imported: no jax.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

import fp4rl
from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import detect_spikes, spikes_per_100_steps
from fp4rl.analysis.report import recipe_summary, render_report
from fp4rl.analysis.runs import (
    GRAD_GROUPS, POPULATION_REWARD, RunData, RunLoadWarning, SeedRun, grad_norm_measurements, load_run, stack_seeds,
)
from fp4rl.analysis.summary import ArmSummary, summarize_run
from fp4rl.analysis.verdicts import ArmVerdict, ClaimResult, claim_reproduced, run_verdicts

Table = tuple[Sequence[str], list[Sequence]]
_MARK = {True: "PASS", False: "**FAIL**", None: "UNDECIDED"}
_STATUS = {True: "REPRODUCED", False: "NOT REPRODUCED", None: "UNDECIDED"}


# --------------------------------------------------------------------------- display


def _ipython_display():
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    return display if get_ipython() is not None else None


def show_md(text: str) -> None:
    """Markdown in a notebook; the plain text elsewhere (a script)."""
    display = _ipython_display()
    if display is None:
        print(text)
    else:
        from IPython.display import Markdown
        display(Markdown(text))


def show_png(path: str | Path) -> None:
    """A PNG inline in a notebook; its path elsewhere."""
    display = _ipython_display()
    if display is None:
        print(f"[figure written to {path}]")
    else:
        from IPython.display import Image
        display(Image(filename=str(path)))


def md_table(head: Sequence, rows: Iterable[Sequence]) -> str:
    """A markdown table; '|' in a cell is escaped and newlines become spaces."""
    cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return "\n".join(["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(map(cell, r)) + " |" for r in rows])


def show_table(table: Table, empty: str = "(no rows)") -> None:
    head, rows = table
    show_md(md_table(head, rows) if rows else empty)


# --------------------------------------------------------------------------- the run


def resolve_run_dir(name: str | Path, cwd: str | Path | None = None) -> Path:
    """An absolute path as is; a relative one against `cwd` (default: the current directory)
    if it exists there, else against the repository root."""
    p = Path(name).expanduser()
    if p.is_absolute():
        return p
    repo = Path(fp4rl.__file__).resolve().parents[1]
    bases = (Path(cwd) if cwd is not None else Path.cwd(), repo)
    return next(((b / p).resolve() for b in bases if (b / p).is_dir()), repo / p)


def open_run(name: str | Path, cwd: str | Path | None = None) -> tuple[Path, RunData]:
    """(run_dir, run): the loaded run directory; every load warning lands in `run.warnings`."""
    run_dir = resolve_run_dir(name, cwd)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} does not exist: produce it with `python -m experiments.ablation "
            f"--preset cpu` (writes runs/cpu/ablation), or set RUN_DIR / FP4RL_RUN_DIR to a run directory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunLoadWarning)  # every load warning is in run.warnings
        return run_dir, load_run(run_dir)


def overview_table(run: RunData) -> Table:
    """Per arm: recipe, seeds, steps logged, last step, update records, eval points, and the
    required keys no seed ever logged."""
    rows = []
    for arm, seeds in run.arms.items():
        lengths = [len(r) for r in seeds.values()]
        missing = sorted({k for r in seeds.values() for k in r.missing_required()})
        n_eval = sum(int(r.present["eval/accuracy"].sum()) for r in seeds.values() if "eval/accuracy" in r.present)
        n_updates = [len(r.updates) for r in seeds.values() if r.updates is not None]
        updates = (f"{sum(n_updates)} in {len(n_updates)} of {len(seeds)} seeds" if n_updates
                   else "none (per-step means)")
        rows.append((f"`{arm}`", recipe_summary(run.configs.get(arm)), ", ".join(map(str, seeds)),
                     f"{min(lengths)}-{max(lengths)}", max(int(r.steps[-1]) for r in seeds.values()), updates,
                     n_eval, ", ".join(missing) or "-"))
    head = ("arm", "recipe", "seeds", "steps logged (min-max)", "last step", "update records",
            "eval/accuracy points", "required keys never logged")
    return head, rows


def bullet_list(title: str, lines: Iterable[str]) -> str:
    return f"**{title}:**\n\n" + ("\n".join(f"- {line}" for line in lines) or "- none")


# --------------------------------------------------------------------------- the report


def judge(run: RunData, criteria: StabilityCriteria
          ) -> tuple[dict[str, ArmSummary], dict[str, ArmVerdict], ClaimResult]:
    """(summaries, verdicts, claim), as `fp4rl.analysis.report.write_report` judges them."""
    summaries = summarize_run(run, criteria)
    verdicts = run_verdicts(summaries, criteria)
    return summaries, verdicts, claim_reproduced(verdicts)


def report_sections(text: str) -> dict[str, str]:
    """report.md's text split at its '## ' headings: {heading: body} (text before the first
    heading is dropped; bodies are stripped)."""
    out: dict[str, list[str]] = {}
    head = None
    for line in text.splitlines():
        if line.startswith("## "):
            head = line[3:].strip()
            out[head] = []
        elif head is not None:
            out[head].append(line)
    return {h: "\n".join(body).strip() for h, body in out.items()}


def rendered_sections(run: RunData, summaries, verdicts, claim, criteria: StabilityCriteria) -> dict[str, str]:
    """The report's sections rendered by the report's own code (no figures)."""
    return report_sections(render_report(run, summaries, verdicts, claim, criteria, figures=()))


def compare_with_report_on_disk(run_dir: str | Path, sections: Mapping[str, str]) -> str:
    """A line saying whether `run_dir`/report.md's per-arm table is the one in `sections`."""
    on_disk = Path(run_dir) / "report.md"
    if not on_disk.is_file():
        return f"no report.md in {run_dir} (write one with fp4rl.analysis.report.write_report)"
    same = report_sections(on_disk.read_text(encoding="utf-8")).get("Per-arm results") == sections["Per-arm results"]
    return f"{on_disk}: per-arm table " + (
        "identical to the one above" if same
        else "DIFFERS from the one above (written with other criteria, or the metrics changed since)")


# --------------------------------------------------------------------------- spike attribution


def ratio_to_window(x: np.ndarray, i: int, window: int) -> float:
    """x[i] over the median of the up-to-`window` finite values before it (the spike
    statistic); NaN when x[i] is not finite or nothing finite precedes it."""
    x = np.asarray(x, np.float64)
    prev = x[:i][np.isfinite(x[:i])][-window:]
    return float(x[i] / np.median(prev)) if prev.size and np.isfinite(x[i]) else math.nan


def group_excursions(sr: SeedRun, step: int, window: int) -> dict[str, float]:
    """Per logged grad-norm group, its value at `step` over the median of its own previous
    window (groups are logged per step, as the mean over the step's updates)."""
    i = int(np.searchsorted(sr.steps, step))
    return {g: ratio_to_window(sr.metrics[f"grad_norm/{g}"], i, window)
            for g in GRAD_GROUPS if f"grad_norm/{g}" in sr.metrics}


def largest_groups(ratios: Mapping[str, float], n_groups: int = len(GRAD_GROUPS)) -> str:
    """The groups within 1% of the largest finite excursion ("all groups alike" when every
    one of the `n_groups` is; "n/a" when none is finite)."""
    finite = {g: r for g, r in ratios.items() if np.isfinite(r)}
    best = max(finite.values(), default=math.nan)
    top = [g for g, r in finite.items() if r >= 0.99 * best]
    return "n/a" if not top else "all groups alike" if len(top) == n_groups else ", ".join(top)


def spike_attribution(run: RunData, summaries: Mapping[str, ArmSummary], criteria: StabilityCriteria) -> Table:
    """One row per spike of the declared criteria: the spiking measurement over the median of
    its window, and every group's excursion at the spike step."""
    rows = []
    for arm, s in summaries.items():
        for ss in s.seeds:
            sr = run.arms[arm][ss.seed]
            m = grad_norm_measurements(sr)
            severe = set(zip(ss.severe_steps, ss.spikes.severe_updates))
            for step, update in zip(ss.spike_steps, ss.spikes.spike_updates):
                j = int(np.flatnonzero((m.steps == step) & ((m.update == update) if m.per_update else True))[0])
                ratios = group_excursions(sr, step, criteria.window)
                rows.append((f"`{arm}`", ss.seed, step, "severe" if (step, update) in severe else "spike",
                             f"{ratio_to_window(m.values, j, criteria.window):.2f}x",
                             update if m.per_update else "per-step mean", largest_groups(ratios),
                             ", ".join(f"{g} {r:.2f}x" for g, r in ratios.items())))
    head = ("arm", "seed", "step", "kind", "global / median", "update", "largest group excursion (per step)",
            "every group / its own median (per step)")
    return head, rows


# --------------------------------------------------------------------------- reward vs grad norm


@dataclasses.dataclass(frozen=True)
class RewardGrad:
    """One arm's pooled (over seeds) finite points: per logged step, the step's largest grad
    norm (> 0) and the population reward; `spike` marks steps with a spike."""

    grad: np.ndarray
    reward: np.ndarray
    spike: np.ndarray  # bool
    n_seeds: int


def reward_grad_points(run: RunData, summaries: Mapping[str, ArmSummary]) -> dict[str, RewardGrad]:
    """Per arm with a logged population reward, its `RewardGrad` points."""
    out = {}
    for arm, seeds in run.arms.items():
        spike_steps = {ss.seed: list(ss.spike_steps) for ss in summaries[arm].seeds}
        g_all, r_all, s_all = [], [], []
        for seed, sr in seeds.items():
            if POPULATION_REWARD not in sr.metrics:
                continue
            g = grad_norm_measurements(sr).step_max(sr.steps)
            r = np.where(sr.present[POPULATION_REWARD], sr.metrics[POPULATION_REWARD], np.nan)
            ok = np.isfinite(g) & np.isfinite(r) & (g > 0)
            g_all.append(g[ok])
            r_all.append(r[ok])
            s_all.append(np.isin(sr.steps[ok], spike_steps.get(seed, [])))
        if g_all:
            out[arm] = RewardGrad(np.concatenate(g_all), np.concatenate(r_all), np.concatenate(s_all), len(seeds))
    return out


def ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(float)


def correlation(grad: np.ndarray, reward: np.ndarray) -> tuple[float, float]:
    """(Pearson r of log grad norm and reward, Spearman rho); NaN with < 3 points or a
    constant variable."""
    grad, reward = np.asarray(grad, np.float64), np.asarray(reward, np.float64)
    if grad.size < 3 or np.ptp(grad) == 0 or np.ptp(reward) == 0:
        return math.nan, math.nan
    return float(np.corrcoef(np.log(grad), reward)[0, 1]), float(np.corrcoef(ranks(grad), ranks(reward))[0, 1])


def correlation_table(points: Mapping[str, RewardGrad]) -> Table:
    rows = []
    for arm, p in points.items():
        pearson, spearman = correlation(p.grad, p.reward)
        rows.append((f"`{arm}`", p.grad.size, f"{pearson:+.2f}", f"{spearman:+.2f}"))
    return ("arm", "points", "Pearson r(log grad norm, reward)", "Spearman rho"), rows


# --------------------------------------------------------------------------- spike-factor sensitivity


def with_spike_factor(criteria: StabilityCriteria, factor: float) -> StabilityCriteria:
    """`criteria` with spike factor `factor`; the severe factor is kept unless `factor` exceeds
    it (severe_factor must stay >= spike_factor)."""
    return dataclasses.replace(criteria, spike_factor=factor, severe_factor=max(factor, criteria.severe_factor))


def sensitivity_table(run: RunData, criteria: StabilityCriteria, factors: Sequence[float]) -> Table:
    """The whole judgement re-run per spike factor: per arm the mean spike rate (count of
    spiking steps), the spike criterion and the verdict; a last row with the claim."""
    judged = {f: judge(run, with_spike_factor(criteria, f)) for f in factors}
    rows = []
    for arm in run.arms:
        row = [f"`{arm}`"]
        for f in factors:
            s, v, _ = judged[f]
            rates = [x.spikes_per_100 for x in s[arm].seeds if np.isfinite(x.spikes_per_100)]
            count = sum(x.spikes.spiking_steps for x in s[arm].seeds)  # steps, as the criterion counts
            rate = f"{np.mean(rates):.2f}" if rates else "n/a"
            row.append(f"{rate} ({count}); {_MARK[v[arm].spike.passed]}; {_MARK[v[arm].passed]}")
        rows.append(row)
    rows.append(["**claim**"] + [_STATUS[judged[f][2].reproduced] for f in factors])
    return ["arm"] + [f"{f:g}x: spikes/100 mean (count); spike; verdict" for f in factors], rows


def sensitivity_note(criteria: StabilityCriteria) -> str:
    return (f"Severe spikes stay at > {criteria.severe_factor:g}x (or the spike factor if larger); "
            f"each arm judged against BF16 with a non-inferiority margin of {criteria.spike_margin_per_100:g} spiking "
            "steps per 100 judged steps (a step spikes when any of its updates does).")


def spike_rate_curve(seeds: Iterable[SeedRun], criteria: StabilityCriteria, factors: Sequence[float]) -> np.ndarray:
    """float [F]: per spike factor, the mean over seeds of spiking steps per 100 judged steps (NaN
    where no seed has a judged step)."""
    series = [grad_norm_measurements(sr) for sr in seeds]
    curve = []
    for f in factors:
        c = with_spike_factor(criteria, float(f))
        rates = [spikes_per_100_steps(detect_spikes(m.values, m.steps, c)[0], m.steps, c) for m in series]
        rates = [x for x in rates if np.isfinite(x)]
        curve.append(np.mean(rates) if rates else np.nan)
    return np.asarray(curve, np.float64)


def arm_stats(seeds: Iterable[SeedRun], key: str, log: bool) -> tuple[np.ndarray, ...] | None:
    """(steps, median, min, max) over seeds of metric `key`; non-finite values (and, when
    `log`, non-positive ones) are gaps (NaN). None when no seed logged a usable value."""
    steps, v = stack_seeds(seeds, key)
    ok = np.isfinite(v) & ((v > 0) if log else True)
    if not ok.any():
        return None
    v = np.where(ok, v, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps no seed logged
        return steps, np.nanmedian(v, 0), np.nanmin(v, 0), np.nanmax(v, 0)
