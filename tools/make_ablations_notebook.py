"""Builds notebooks/ablations.ipynb with nbformat (outputs stripped; tests/test_notebooks.py executes it).

    python tools/make_ablations_notebook.py [OUT.ipynb]   # default: notebooks/ablations.ipynb

The notebook explores an RL ablation run directory (`<run_dir>/<arm>/seed<k>/metrics.jsonl`
and `updates.jsonl`, docs/rl.md "The ablation matrix") through `fp4rl.analysis` only (docs/design.md
practice 9: notebooks import the library, never the experiments): the report's per-arm table
and three figures, then what the report does not show (per-group grad norms, trainer/sampler
mismatch over steps, population reward vs grad norm, sensitivity of the spike verdicts to the
spike threshold).
It needs numpy and matplotlib, not jax, and draws on Agg canvases (no pyplot, no display).

Every cell is a few lines calling the library: the tables are computed by
`fp4rl.analysis.explore`, the figures drawn by `fp4rl.analysis.explore_plots` (both
unit-tested in tests/analysis/test_explore.py). The notebook is generated, never edited by
hand, and tests/test_notebooks.py checks the committed one is this output.
"""

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

md, code = new_markdown_cell, new_code_cell

PARAMETERS = '''\
# Parameters (papermill "parameters" cell). FP4RL_RUN_DIR in the environment overrides RUN_DIR.
RUN_DIR = "results/long_h200/chain/matrix"  # the committed long-horizon H200 matrix (results/matrix_h200: the 100-step one); any <arm>/seed<k>/metrics.jsonl directory (relative: to the cwd, else to the repo root)
FIG_DIR = None  # where the PNGs go; None: a fresh temporary directory (the run directory is never written)
SPIKE_FACTORS = (2.0, 3.0, 5.0)  # spike thresholds to compare (docs/rl.md declares 3x)'''

SETUP = '''\
import os
import tempfile
from pathlib import Path

from fp4rl.analysis import explore, explore_plots, plots
from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.explore import show_md, show_png, show_table

run_dir, run = explore.open_run(os.environ.get("FP4RL_RUN_DIR") or RUN_DIR)
FIG_DIR = Path(FIG_DIR) if FIG_DIR else Path(tempfile.mkdtemp(prefix="fp4rl-ablations-"))
FIG_DIR.mkdir(parents=True, exist_ok=True)
CRITERIA = StabilityCriteria()  # the declared criteria (docs/rl.md "Stability criteria")
print(f"run directory: {run_dir}\\nfigures: {FIG_DIR}")'''

OVERVIEW = '''\
show_table(explore.overview_table(run))
show_md(explore.bullet_list("Load warnings", run.warnings))
show_md(explore.bullet_list("Declared criteria", CRITERIA.describe()))'''

SUMMARY = '''\
summaries, verdicts, claim = explore.judge(run, CRITERIA)
# The report's own renderer: the table below is report.md's, number for number.
sections = explore.rendered_sections(run, summaries, verdicts, claim, CRITERIA)
show_md("### Claim\\n\\n" + sections["Claim"])
show_md("### Per-arm results\\n\\n" + sections["Per-arm results"])
print(explore.compare_with_report_on_disk(run_dir, sections))'''

REPORT_FIGURES = '''\
show_png(plots.plot_grad_norm(run, FIG_DIR / "grad_norm.png", CRITERIA))
show_png(plots.plot_seeds(run, summaries, FIG_DIR / "seeds.png", CRITERIA))
show_png(plots.plot_summary(summaries, FIG_DIR / "summary.png", CRITERIA))'''

DETAILS = '''\
show_md("### Per-seed results\\n\\n" + sections["Per-seed results"] + "\\n\\n### Notes\\n\\n" + sections["Notes"])'''

LEARNING = '''\
explore_plots.show(explore_plots.learning_figure(run), FIG_DIR / "learning.png")'''

GROUPS = '''\
explore_plots.show(explore_plots.grad_norm_groups_figure(run, CRITERIA), FIG_DIR / "grad_norm_groups.png")'''

ATTRIBUTION = '''\
show_table(explore.spike_attribution(run, summaries, CRITERIA), empty="No spike under the declared criteria.")'''

MISMATCH = '''\
explore_plots.show(explore_plots.mismatch_figure(run, CRITERIA), FIG_DIR / "mismatch.png")'''

SCATTER = '''\
points = explore.reward_grad_points(run, summaries)
explore_plots.show(explore_plots.reward_vs_grad_norm_figure(points), FIG_DIR / "reward_vs_grad_norm.png")
show_table(explore.correlation_table(points))'''

SENSITIVITY = '''\
table = explore.sensitivity_table(run, CRITERIA, SPIKE_FACTORS)
show_md(explore.sensitivity_note(CRITERIA) + "\\n\\n" + explore.md_table(*table))'''

SENSITIVITY_CURVE = '''\
explore_plots.show(explore_plots.spike_sensitivity_figure(run, CRITERIA), FIG_DIR / "spike_sensitivity.png")'''

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
        "each arm's recipe, seeds and judged steps, spike rate and severe spikes (spiking steps: a step spikes when any of its updates does), collapse, "
        "population-reward gap to BF16 (paired by seed) with its bootstrap and t intervals, final held-out greedy and sampled accuracy with "
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
    md("## Beyond the report\n\n"
       "Per arm, the median over seeds and the min-max band, in the report's arm colours "
       "(`fp4rl.analysis.explore_plots`); non-finite values (and non-positive ones on log axes) are gaps."),
    md(
        "### Held-out accuracy\n\n"
        "Whether and how fast each arm learns: the held-out sampled and greedy accuracy after every "
        "evaluation (`eval_every` steps; `fp4rl.analysis.learning` judges one arm's change with its CI)."
    ),
    code(LEARNING),
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
        "docs/rl.md declares a spike at 3x the median of the previous 10 measurements. The table re-runs the whole "
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
