"""Analysis of RL ablation runs: loading, stability criteria, report (RL.md "Stability
criteria" and "The report").

- `fp4rl.analysis.runs`: load `<run_dir>/<arm>/seed<k>/metrics.jsonl` into numpy arrays;
- `fp4rl.analysis.stability`: spikes, collapse, reward gap, bootstrap CI, verdicts, claim;
- `fp4rl.analysis.summary`: every criterion measured per seed and per arm;
- `fp4rl.analysis.report`: `write_report(run_dir)` -> report.md + PNGs (imports matplotlib);
- `fp4rl.analysis.plots`: the figures; `fp4rl.analysis.synthetic`: synthetic run directories.

Only numpy is imported here; import `report`/`plots` explicitly for matplotlib.
"""

from fp4rl.analysis.runs import ARMS, RunData, SeedRun, load_run, stack_seeds
from fp4rl.analysis.stability import (
    ArmVerdict,
    StabilityCriteria,
    claim_reproduced,
    detect_collapse,
    detect_spikes,
    verdict,
)
from fp4rl.analysis.summary import ArmSummary, SeedSummary, summarize_run
from fp4rl.analysis.synthetic import make_synthetic_run

__all__ = [
    "ARMS", "ArmSummary", "ArmVerdict", "SeedSummary", "summarize_run", "RunData", "SeedRun", "StabilityCriteria", "claim_reproduced", "detect_collapse",
    "detect_spikes", "load_run", "make_synthetic_run", "stack_seeds", "verdict",
]
