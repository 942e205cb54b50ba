"""Analysis of RL ablation runs: loading, stability criteria, report (docs/rl.md "Stability
criteria" and "The report").

- `fp4rl.analysis.runs`: load `<run_dir>/<arm>/seed<k>/{metrics,updates}.jsonl` and
  `<arm>/config.json` into numpy arrays;
- `fp4rl.analysis.criteria`: the declared thresholds and power (`StabilityCriteria`);
- `fp4rl.analysis.detectors`: spikes, collapse, each seed's power;
- `fp4rl.analysis.statistics`: reward gap, bootstrap intervals, mismatch;
- `fp4rl.analysis.summary`: every criterion measured per seed and per arm;
- `fp4rl.analysis.verdicts`: PASS / FAIL / UNDECIDED per criterion and arm, and the claim;
- `fp4rl.analysis.power`: the decision rule and each test's power for a planned matrix (its command line:
  `python -m experiments.rule_power`);
- `fp4rl.analysis.stability`: all of the above criteria names in one import;
- `fp4rl.analysis.report`: `write_report(run_dir)` -> report.md + PNGs (imports matplotlib);
- `fp4rl.analysis.plots`: the figures; `fp4rl.analysis.synthetic`: synthetic run directories.
- `fp4rl.analysis.explore`, `fp4rl.analysis.explore_plots`: the tables and figures of
  notebooks/ablations.ipynb beyond the report;
- `fp4rl.analysis.four_over_six`: the 4/6-choice figures of notebooks/numerics.ipynb (imports jax).
- `fp4rl.analysis.batch_scaling`: the gradient measurements' error and noise per update size;
  `fp4rl.analysis.scaling_plan` (with `scaling_usage`, its calibration on measured peaks) and
  `fp4rl.analysis.scaling` (with `scaling_loglog`, `scaling_dose`, `scaling_report`): the model-size
  ladder's plan and the fit over sizes; `fp4rl.analysis.ladder_status`: where the ladder stands
  (`experiments.scaling`).

Only numpy is imported here; import `report`/`plots` explicitly for matplotlib.
"""

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import detect_collapse, detect_spikes
from fp4rl.analysis.runs import ARMS, RunData, SeedRun, load_run, stack_seeds
from fp4rl.analysis.summary import ArmSummary, SeedSummary, summarize_run
from fp4rl.analysis.synthetic import make_synthetic_run
from fp4rl.analysis.verdicts import ArmVerdict, claim_reproduced, verdict

__all__ = [
    "ARMS", "ArmSummary", "ArmVerdict", "SeedSummary", "summarize_run", "RunData", "SeedRun", "StabilityCriteria",
    "claim_reproduced", "detect_collapse", "detect_spikes", "load_run", "make_synthetic_run", "stack_seeds", "verdict",
]
