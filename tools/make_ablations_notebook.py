"""Builds notebooks/ablations.ipynb with nbformat (outputs stripped; tests/test_notebooks.py executes it).

    python tools/make_ablations_notebook.py [OUT.ipynb]   # default: notebooks/ablations.ipynb

The notebook explores an RL ablation run directory (`<run_dir>/<arm>/seed<k>/metrics.jsonl`
and `updates.jsonl`, docs/rl.md "The ablation matrix") through `fp4rl.analysis` only (docs/design.md
practice 9: notebooks import the library, never the experiments): the report's per-arm table
and three figures, then what the report does not show (per-group grad norms, trainer/sampler
mismatch over steps, population reward vs grad norm, sensitivity of the spike verdicts to the
spike threshold).
It needs numpy and matplotlib, not jax, and draws on Agg canvases (no pyplot, no display).

Long because it holds every cell of the notebook as source text (the notebook is generated,
never edited by hand, and a test checks the committed one is this output).
"""

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

md, code = new_markdown_cell, new_code_cell

PARAMETERS = '''\
# Parameters (papermill "parameters" cell). FP4RL_RUN_DIR in the environment overrides RUN_DIR.
RUN_DIR = "runs/cpu/ablation"  # <arm>/seed<k>/metrics.jsonl; relative: to the cwd, else to the repo root
FIG_DIR = None  # where the PNGs go; None: a fresh temporary directory (the run directory is never written)
SPIKE_FACTORS = (2.0, 3.0, 5.0)  # spike thresholds to compare (docs/rl.md declares 3x)'''

SETUP = '''\
import dataclasses
import math
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter

import fp4rl
from fp4rl.analysis import plots
from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import detect_spikes, spikes_per_100_steps
from fp4rl.analysis.report import recipe_summary, render_report
from fp4rl.analysis.runs import (
    GRAD_GROUPS, POPULATION_REWARD, RunLoadWarning, grad_norm_measurements, load_run, stack_seeds,
)
from fp4rl.analysis.summary import summarize_run
from fp4rl.analysis.verdicts import claim_reproduced, verdict

try:
    from IPython import get_ipython
    from IPython.display import Image, Markdown, display
    if get_ipython() is None:
        raise ImportError("not in IPython")
except ImportError:  # run as a plain script: print the tables, only write the figures
    display = None


def show_md(text):
    display(Markdown(text)) if display else print(text)


def show_png(path):
    display(Image(filename=str(path))) if display else print(f"[figure written to {path}]")


def show_fig(fig, name):
    """Render a Figure on the Agg canvas into FIG_DIR/<name>.png and display it."""
    FigureCanvasAgg(fig)
    path = FIG_DIR / f"{name}.png"
    fig.savefig(path, dpi=100)
    show_png(path)


def md_table(head, rows):
    cell = lambda x: str(x).replace("|", "\\\\|").replace("\\n", " ")
    return "\\n".join(["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(map(cell, r)) + " |" for r in rows])


def resolve_run_dir(name):
    p = Path(name).expanduser()
    if p.is_absolute():
        return p
    repo = Path(fp4rl.__file__).resolve().parents[1]
    return next(((b / p).resolve() for b in (Path.cwd(), repo) if (b / p).is_dir()), repo / p)


RUN_DIR = os.environ.get("FP4RL_RUN_DIR") or RUN_DIR
run_dir = resolve_run_dir(RUN_DIR)
if not run_dir.is_dir():
    raise FileNotFoundError(
        f"run directory {run_dir} does not exist: produce it with `python -m experiments.ablation "
        f"--preset cpu` (writes runs/cpu/ablation), or set RUN_DIR / FP4RL_RUN_DIR to a run directory")
FIG_DIR = Path(FIG_DIR) if FIG_DIR else Path(tempfile.mkdtemp(prefix="fp4rl-ablations-"))
FIG_DIR.mkdir(parents=True, exist_ok=True)
CRITERIA = StabilityCriteria()  # the declared criteria (docs/rl.md "Stability criteria")

with warnings.catch_warnings():
    warnings.simplefilter("ignore", RunLoadWarning)  # every load warning is listed below instead
    run = load_run(run_dir)
print(f"run directory: {run_dir}\\nfigures: {FIG_DIR}")'''

OVERVIEW = '''\
rows = []
for arm, seeds in run.arms.items():
    lengths = [len(r) for r in seeds.values()]
    missing = sorted({k for r in seeds.values() for k in r.missing_required()})
    n_eval = sum(int(r.present["eval/accuracy"].sum()) if "eval/accuracy" in r.present else 0 for r in seeds.values())
    n_updates = [len(r.updates) for r in seeds.values() if r.updates is not None]
    updates = f"{sum(n_updates)} in {len(n_updates)} of {len(seeds)} seeds" if n_updates else "none (per-step means)"
    rows.append((f"`{arm}`", recipe_summary(run.configs.get(arm)), ", ".join(map(str, seeds)),
                 f"{min(lengths)}-{max(lengths)}", max(int(r.steps[-1]) for r in seeds.values()), updates, n_eval,
                 ", ".join(missing) or "-"))
show_md(md_table(("arm", "recipe", "seeds", "steps logged (min-max)", "last step", "update records",
                  "eval/accuracy points", "required keys never logged"), rows))
show_md("**Load warnings:**\\n\\n" + ("\\n".join(f"- {w}" for w in run.warnings) or "- none"))
show_md("**Declared criteria:**\\n\\n" + "\\n".join(f"- {line}" for line in CRITERIA.describe()))'''

SUMMARY = '''\
def report_sections(text):
    """report.md's text split at its '## ' headings: {heading: body}."""
    out, head = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            head = line[3:].strip()
            out[head] = []
        elif head is not None:
            out[head].append(line)
    return {h: "\\n".join(body).strip() for h, body in out.items()}


summaries = summarize_run(run, CRITERIA)
verdicts = {arm: verdict(s, CRITERIA) for arm, s in summaries.items()}
claim = claim_reproduced(verdicts)
# The report's own renderer: the table below is report.md's, number for number.
sections = report_sections(render_report(run, summaries, verdicts, claim, CRITERIA, figures=()))
show_md("### Claim\\n\\n" + sections["Claim"])
show_md("### Per-arm results\\n\\n" + sections["Per-arm results"])
on_disk = run_dir / "report.md"
if on_disk.is_file():
    same = report_sections(on_disk.read_text(encoding="utf-8")).get("Per-arm results") == sections["Per-arm results"]
    print(f"{on_disk}: per-arm table " + ("identical to the one above" if same else
          "DIFFERS from the one above (written with other criteria, or the metrics changed since)"))
else:
    print(f"no report.md in {run_dir} (write one with fp4rl.analysis.report.write_report)")'''

REPORT_FIGURES = '''\
report_figures = (
    plots.plot_grad_norm(run, FIG_DIR / "grad_norm.png", CRITERIA),
    plots.plot_seeds(run, summaries, FIG_DIR / "seeds.png", CRITERIA),
    plots.plot_summary(summaries, FIG_DIR / "summary.png", CRITERIA),
)
for path in report_figures:
    show_png(path)'''

DETAILS = '''\
show_md("### Per-seed results\\n\\n" + sections["Per-seed results"] + "\\n\\n### Notes\\n\\n" + sections["Notes"])'''

HELPERS = '''\
class PlainLogFormatter(LogFormatter):
    """Log-axis labels as plain numbers (0.45, 2, 1e+04) instead of 4.5x10^-1."""

    def __call__(self, x, pos=None):
        return f"{x:.3g}" if super().__call__(x, pos) else ""


def log_axis(ax, which="y"):
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    axis.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def arm_stats(seeds, key, log):
    """(steps, median, min, max) over seeds of one metric; non-finite (and, on a log axis,
    non-positive) values are gaps. None when no seed logged a usable value."""
    steps, v = stack_seeds(seeds.values(), key)
    ok = np.isfinite(v) & ((v > 0) if log else True)
    if not ok.any():
        return None
    v = np.where(ok, v, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps no seed logged
        return steps, np.nanmedian(v, 0), np.nanmin(v, 0), np.nanmax(v, 0)


def overlay(ax, key, log=True, ylabel=None):
    """Every arm's median over seeds (line) and min-max band, in the report's arm colours."""
    drawn = False
    for arm, seeds in run.arms.items():
        stats = arm_stats(seeds, key, log)
        if stats is None:
            continue
        steps, med, lo, hi = stats
        color = plots.arm_color(arm)
        ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.plot(steps, med, color=color, linewidth=1.3, label=f"{arm} (n={len(seeds)})")
        drawn = True
    if drawn:
        if log:
            log_axis(ax)
        first, last = min(int(r.steps[0]) for r in run.runs()), max(int(r.steps[-1]) for r in run.runs())
        if CRITERIA.warmup_steps > first:  # the warm-up: no spike detection (clipped to the run)
            ax.axvspan(first, min(CRITERIA.warmup_steps, last), color="0.92", zorder=0)
    else:
        ax.text(0.5, 0.5, f"{key}: not logged", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_title(key, fontsize=10)
    ax.set_ylabel(ylabel or key)
    ax.grid(True, which="major", alpha=0.3)
    return drawn


def legend_below(fig, axes):
    handles = {l: h for ax in axes for h, l in zip(*ax.get_legend_handles_labels())}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(len(handles), 6), frameon=False, fontsize=9)'''

GROUPS = '''\
fig = Figure(figsize=(15, 8), layout="constrained")
axes = fig.subplots(2, 3, sharex=True).ravel()
for ax, group in zip(axes, GRAD_GROUPS):
    overlay(ax, f"grad_norm/{group}", log=True, ylabel="pre-clip grad norm (log)")
for ax in axes[3:]:
    ax.set_xlabel("RL step")
legend_below(fig, axes)
fig.suptitle("Per-group pre-clip grad norm: median over seeds, band = min-max over seeds", fontsize=13)
show_fig(fig, "grad_norm_groups")'''

ATTRIBUTION = '''\
def ratio_to_window(x, i, window):
    """x[i] over the median of the up-to-`window` finite values before it (the spike statistic)."""
    prev = x[:i][np.isfinite(x[:i])][-window:]
    return float(x[i] / np.median(prev)) if prev.size and np.isfinite(x[i]) else math.nan


rows = []
for arm, s in summaries.items():
    for ss in s.seeds:
        sr = run.arms[arm][ss.seed]
        m = grad_norm_measurements(sr)
        severe = set(zip(ss.severe_steps, ss.spikes.severe_updates))
        for step, update in zip(ss.spike_steps, ss.spikes.spike_updates):
            j = int(np.flatnonzero((m.steps == step) & ((m.update == update) if m.per_update else True))[0])
            i = int(np.searchsorted(sr.steps, step))
            # Groups are logged per step (means over the step's updates): each against its own per-step window.
            ratios = {g: ratio_to_window(sr.metrics[f"grad_norm/{g}"], i, CRITERIA.window)
                      for g in GRAD_GROUPS if f"grad_norm/{g}" in sr.metrics}
            finite = {g: r for g, r in ratios.items() if np.isfinite(r)}
            best = max(finite.values(), default=math.nan)
            top = [g for g, r in finite.items() if r >= 0.99 * best]  # within 1% of the largest
            top = "n/a" if not top else "all groups alike" if len(top) == len(GRAD_GROUPS) else ", ".join(top)
            rows.append((f"`{arm}`", ss.seed, step, "severe" if (step, update) in severe else "spike",
                         f"{ratio_to_window(m.values, j, CRITERIA.window):.2f}x",
                         update if m.per_update else "per-step mean", top,
                         ", ".join(f"{g} {r:.2f}x" for g, r in ratios.items())))
show_md(md_table(("arm", "seed", "step", "kind", "global / median", "update", "largest group excursion (per step)",
                  "every group / its own median (per step)"), rows) if rows else "No spike under the declared criteria.")'''

MISMATCH = '''\
fig = Figure(figsize=(15, 4.8), layout="constrained")
ax_kl, ax_flip = fig.subplots(1, 2, sharex=True)
overlay(ax_kl, "mismatch/kl_k3", log=True, ylabel="k3 KL per token (log)")
overlay(ax_flip, "mismatch/routing_flip", log=False, ylabel="routing-flip rate")
for ax in (ax_kl, ax_flip):
    ax.set_xlabel("RL step")
legend_below(fig, (ax_kl, ax_flip))
fig.suptitle("Trainer vs sampler mismatch: median over seeds, band = min-max over seeds", fontsize=13)
show_fig(fig, "mismatch")'''

SCATTER = '''\
def ranks(x):
    return np.argsort(np.argsort(x)).astype(float)


fig = Figure(figsize=(11, 6), layout="constrained")
ax = fig.subplots()
rows = []
for arm, seeds in run.arms.items():
    spike_steps = {ss.seed: set(ss.spike_steps) for ss in summaries[arm].seeds}
    g_all, r_all, g_spk, r_spk = [], [], [], []
    for seed, sr in seeds.items():
        if POPULATION_REWARD not in sr.metrics:
            continue
        g = grad_norm_measurements(sr).step_max(sr.steps)
        r = np.where(sr.present[POPULATION_REWARD], sr.metrics[POPULATION_REWARD], np.nan)
        ok = np.isfinite(g) & np.isfinite(r) & (g > 0)
        spk = ok & np.isin(sr.steps, list(spike_steps[seed]))
        g_all.append(g[ok])
        r_all.append(r[ok])
        g_spk.append(g[spk])
        r_spk.append(r[spk])
    if not g_all:
        continue
    g, r = np.concatenate(g_all), np.concatenate(r_all)
    ax.scatter(g, r, s=10, alpha=0.45, color=plots.arm_color(arm), label=f"{arm} (n={len(seeds)})")
    ax.scatter(np.concatenate(g_spk), np.concatenate(r_spk), **plots.SPIKE_STYLE)
    enough = g.size >= 3 and np.ptp(g) > 0 and np.ptp(r) > 0
    pearson = np.corrcoef(np.log(g), r)[0, 1] if enough else math.nan
    spearman = np.corrcoef(ranks(g), ranks(r))[0, 1] if enough else math.nan
    rows.append((f"`{arm}`", g.size, f"{pearson:+.2f}", f"{spearman:+.2f}"))
log_axis(ax, "x")
ax.set_xlabel("pre-clip global grad norm, largest update of the step (log)")
ax.set_ylabel("population reward mean (every sampled response)")
ax.grid(True, alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="arm (seeds); rings: spike steps")
ax.set_title("Population reward vs grad norm, every logged step of every seed (finite values only)")
show_fig(fig, "reward_vs_grad_norm")
show_md(md_table(("arm", "points", "Pearson r(log grad norm, reward)", "Spearman rho"), rows))'''

SENSITIVITY = '''\
def with_spike_factor(f):
    # severe_factor must stay >= spike_factor; the declared 10x is kept unless f exceeds it.
    return dataclasses.replace(CRITERIA, spike_factor=f, severe_factor=max(f, CRITERIA.severe_factor))


by_factor = {}
for f in SPIKE_FACTORS:
    c = with_spike_factor(f)
    s = summarize_run(run, c)
    v = {arm: verdict(x, c) for arm, x in s.items()}
    by_factor[f] = (s, v, claim_reproduced(v))

mark = {True: "PASS", False: "**FAIL**", None: "UNDECIDED"}
head = ["arm"] + [f"{f:g}x: spikes/100 mean (count); spike; verdict" for f in SPIKE_FACTORS]
rows = []
for arm in run.arms:
    row = [f"`{arm}`"]
    for f in SPIKE_FACTORS:
        s, v, _ = by_factor[f]
        rates = [x.spikes_per_100 for x in s[arm].seeds if np.isfinite(x.spikes_per_100)]
        count = sum(len(x.spike_steps) for x in s[arm].seeds)
        rate = f"{np.mean(rates):.2f}" if rates else "n/a"
        row.append(f"{rate} ({count}); {mark[v[arm].spike.passed]}; {mark[v[arm].passed]}")
    rows.append(row)
status = {True: "REPRODUCED", False: "NOT REPRODUCED", None: "UNDECIDED"}
rows.append(["**claim**"] + [status[by_factor[f][2].reproduced] for f in SPIKE_FACTORS])
show_md(f"Severe spikes stay at > {CRITERIA.severe_factor:g}x (or the spike factor if larger); "
        f"pass threshold {CRITERIA.max_spikes_per_100:g} spikes/100 steps per seed.\\n\\n" + md_table(head, rows))'''

SENSITIVITY_CURVE = '''\
factors = np.geomspace(1.5, 20.0, 24)
fig = Figure(figsize=(11, 5), layout="constrained")
ax = fig.subplots()
for i, (arm, seeds) in enumerate(run.arms.items()):
    curve = []
    for f in factors:
        c = with_spike_factor(float(f))
        series = [grad_norm_measurements(sr) for sr in seeds.values()]
        rates = [spikes_per_100_steps(detect_spikes(m.values, m.steps, c)[0], m.steps, c) for m in series]
        rates = [x for x in rates if np.isfinite(x)]
        curve.append(np.mean(rates) if rates else np.nan)
    width = 1.0 + 3.0 * (len(run.arms) - 1 - i) / max(len(run.arms) - 1, 1)  # overlapping curves stay visible
    ax.plot(factors, curve, "o-", markersize=3, linewidth=width, color=plots.arm_color(arm), label=f"{arm} (n={len(seeds)})")
if not any(r.steps[-1] >= CRITERIA.warmup_steps for r in run.runs()):
    ax.text(0.5, 0.5, f"no step at or past the warm-up (step {CRITERIA.warmup_steps}): no spike is ever detected",
            ha="center", va="center", transform=ax.transAxes, color="0.4")
ax.axvline(CRITERIA.spike_factor, color="0.3", linestyle=":", label=f"declared spike {CRITERIA.spike_factor:g}x")
ax.axvline(CRITERIA.severe_factor, color="#d62728", linestyle=":", label=f"declared severe {CRITERIA.severe_factor:g}x")
ax.axhline(CRITERIA.max_spikes_per_100, color="0.3", linestyle="--", linewidth=1, label="pass threshold")
log_axis(ax, "x")
ax.set_yscale("symlog", linthresh=1.0)
ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
ax.set_ylim(bottom=0)
ax.set_xlabel("spike factor (x the median of the previous window of measurements)")
ax.set_ylabel("spikes per 100 steps (mean over seeds)")
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
ax.set_title(f"Spike rate vs spike factor (window {CRITERIA.window}, after step {CRITERIA.warmup_steps})")
show_fig(fig, "spike_sensitivity")'''

cells = [
    code(PARAMETERS, metadata={"tags": ["parameters"]}),
    md(
        "# RL ablation explorer\n\n"
        "Loads an ablation run directory (`<RUN_DIR>/<arm>/seed<k>/metrics.jsonl` and `updates.jsonl`, written by "
        "`python -m experiments.ablation`) with `fp4rl.analysis.runs.load_run` and judges it with the "
        "declared criteria of docs/rl.md \"Stability criteria\", exactly as `fp4rl.analysis.report.write_report` "
        "does: first the report's per-arm table and its three figures, then what the report does not show. "
        "Set `RUN_DIR` above, or `FP4RL_RUN_DIR` in the kernel's environment. Needs numpy and matplotlib "
        "only (no jax, no GPU); figures are PNGs written to `FIG_DIR` and displayed inline."
    ),
    code(SETUP),
    md("## The run\n\nWhat was loaded (each arm's recipe from its config.json, and whether per-update records "
       "exist), what was missing or repaired while loading, and the declared criteria."),
    code(OVERVIEW),
    md(
        "## The report: per-arm table\n\n"
        "Rendered by the report's own code from the same summaries, so the numbers are report.md's: "
        "each arm's recipe, seeds and judged steps, spike rate and severe spikes (per update), collapse, "
        "population-reward gap to BF16 with its interval, final held-out greedy and sampled accuracy with "
        "hierarchical bootstrap intervals (seeds, then each seed's binomial evaluation error; `n/a` without "
        "evaluations), the change of sampled accuracy, sampler vs trainer k3 KL, and the verdict: PASS, "
        "**FAIL**, or UNDECIDED when the runs lack the declared power (the reasons follow the table)."
    ),
    code(SUMMARY),
    md(
        "## The report: figures\n\n"
        "The grad-norm overlay above the population-reward panel, the per-seed small multiples with every "
        "measurement drawn and spikes marked, "
        "and the per-run summary (`fp4rl.analysis.plots`)."
    ),
    code(REPORT_FIGURES),
    md("The report's per-seed table and notes (spike steps, collapse reasons, what could not be evaluated)."),
    code(DETAILS),
    md(
        "## Beyond the report\n\n"
        "Plot helpers for the cells below: per arm, the median over seeds and the min-max band, in the "
        "report's arm colours; non-finite values (and non-positive ones on log axes) are gaps."
    ),
    code(HELPERS),
    md(
        "### Per-group grad norms\n\n"
        "The pre-clip grad norm of each parameter group (docs/rl.md \"Metrics, every step\"): which part of "
        "the model carries the spikes, and whether selective high precision calms the groups it keeps "
        "in BF16."
    ),
    code(GROUPS),
    md(
        "Every spike of the declared criteria, attributed: the spiking measurement (one update) over the "
        "median of its window, and each group's grad norm at the spike step over the median of its own "
        "previous window (groups are logged per step, as the mean over the step's updates)."
    ),
    code(ATTRIBUTION),
    md(
        "### Trainer vs sampler mismatch\n\n"
        "k3 KL per token between the sampler's and the trainer's log-probs, and the fraction of routed "
        "tokens whose top-k experts differ between the two."
    ),
    code(MISMATCH),
    md(
        "### Population reward vs grad norm\n\n"
        "Does a large gradient come with a low reward? One dot per logged step and seed (the step's largest "
        "update grad norm, the population reward over every sampled response); rings mark steps with a "
        "spike. The table gives the correlations per arm (all seeds pooled)."
    ),
    code(SCATTER),
    md(
        "### Sensitivity of the spike criterion\n\n"
        "docs/rl.md declares a spike at 3x the median of the previous 50 measurements. The table re-runs the whole "
        "judgement with other spike factors (`SPIKE_FACTORS`): spike rate, spike criterion and verdict per "
        "arm, and the claim. A claim that flips between 2x and 5x rests on the threshold, not on the runs."
    ),
    code(SENSITIVITY),
    md("The spike rate as a function of the spike factor, per arm (mean over seeds)."),
    code(SENSITIVITY_CURVE),
]

nb = new_notebook(cells=cells, metadata={
    "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
    "language_info": {"name": "python"},
})
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "notebooks" / "ablations.ipynb"
nbformat.validate(nb)
nbformat.write(nb, out)
print("wrote", out)
