"""The decision rule of the fixed-parameter gradient measurements: its thresholds and its text
(read by the report, `fp4rl.analysis.gradient_report`, and by its figures)."""

from __future__ import annotations

import math

CI_LEVEL = 0.95
NOISE_FRACTION_MAX = 0.05
COHERENT_BIAS_MAX = 0.1
TAIL_FACTOR = 3.0
TAIL_ALPHA = 0.05
DECISION_GROUP = "all"
DECISION_RULE = (
    f"Judged on the parameter group '{DECISION_GROUP}', with {CI_LEVEL:.0%} bootstrap intervals over batches. "
    f"A recipe PASSES when (1) its gradient error vs BF16 is below {NOISE_FRACTION_MAX:.0%} of the RL noise floor "
    "(noise_fraction: mean squared error over batches and SR keys / batch-to-batch variance of the BF16 gradient), "
    f"(2) its coherent bias ||E[g_r - g_bf16]|| is below {COHERENT_BIAS_MAX} of the BF16 signal ||E[g_bf16]||, and "
    f"(3) its grad-norm tail rate (fraction of batches above {TAIL_FACTOR:g}x its median) does not exceed BF16's "
    f"(one-sided Fisher exact test, p >= {TAIL_ALPHA}). It EXCEEDS when an interval lies wholly above threshold (1) "
    f"or (2), or the test gives p < {TAIL_ALPHA}; otherwise, when an interval straddles a threshold, it is UNDECIDED. "
    "If every recipe passes, the paper's mechanism (a precision-induced gradient error large enough to destabilise "
    "RL) does not operate at this scale; if any recipe exceeds, it does, for the recipes that exceed; otherwise the "
    f"answer is UNDECIDED. In norm terms, threshold (1) is an RMS error of {math.sqrt(NOISE_FRACTION_MAX):.3f} of the "
    f"RMS noise, and threshold (2) a squared ratio of {COHERENT_BIAS_MAX**2:g}. The same rule is also applied to each "
    "parameter group on its own (its error against its own noise floor and signal, its own grad-norm tail).")
