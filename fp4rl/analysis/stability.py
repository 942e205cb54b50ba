"""The stability criteria in one import: `criteria` (the declared thresholds), `detectors`
(spikes, collapse, power), `statistics` (reward gap, bootstrap intervals, mismatch) and
`verdicts` (PASS / FAIL / UNDECIDED and the claim). The modules depend on each other in that
order only (verdicts reads summaries, which use the detectors and statistics)."""

from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.detectors import (
    CollapseResult, SeedPower, SpikeResult, detect_collapse, detect_spikes, find_spikes, judged_step_count,
    seed_power, spikes_per_100_steps, spiking_step_count,
)
from fp4rl.analysis.statistics import (
    BootstrapCI, MismatchSummary, RewardGap, accuracy_change_ci, accuracy_ci, bootstrap_ci, mismatch_summary,
    paired_gap_series, reward_gap_ci, reward_gap_to_reference, student_t_interval,
)
from fp4rl.analysis.verdicts import (
    ArmVerdict, ClaimResult, CriterionResult, claim_reproduced, collapse_criterion, reward_criterion, spike_criterion,
    verdict,
)

__all__ = [
    "ArmVerdict", "BootstrapCI", "ClaimResult", "CollapseResult", "CriterionResult", "MismatchSummary", "RewardGap",
    "SeedPower", "SpikeResult", "StabilityCriteria", "accuracy_change_ci", "accuracy_ci", "bootstrap_ci",
    "claim_reproduced", "collapse_criterion", "detect_collapse", "detect_spikes", "find_spikes", "judged_step_count",
    "mismatch_summary", "reward_criterion", "reward_gap_ci", "reward_gap_to_reference", "seed_power",
    "spike_criterion", "spikes_per_100_steps", "verdict", "spiking_step_count", "paired_gap_series",
    "student_t_interval",
]
