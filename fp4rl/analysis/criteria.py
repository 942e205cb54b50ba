"""The declared stability criteria of docs/rl.md ("Stability criteria (declare before running,
report per arm)") and the power every verdict needs.

The definitions, per arm:
- spike: pre-clip grad norm > 3x the median of the previous 10 measurements (after step 20);
  severe spike: > 10x; reported as spiking steps per 100 judged steps per seed;
- collapse: any non-finite value, a grad norm > 100x the early median, or reward falling
  more than 0.5 below its running best without recovering within 50 steps;
- reward tracking: mean gap to BF16's reward over the run, paired by seed (seed k of every arm
  sees the same prompts), and the final held-out accuracy, each with a bootstrap interval over
  seeds and a Student t interval beside it;
- mismatch: k3 KL per token between sampler and trainer.

The definitions alone fix no pass threshold for the spike rate or the reward gap, and no
amount of data a verdict needs; `StabilityCriteria` declares them here, so they are fixed
before any run is looked at (docs/rl.md restates them). Mismatch and final accuracy are
reported, not judged: no threshold is attached to them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StabilityCriteria:
    """Thresholds of docs/rl.md "Stability criteria", the declared pass thresholds, and power.

    docs/rl.md's definitions:
    spike_factor, severe_factor, window, warmup_steps: a spike is a pre-clip grad norm
        measurement > spike_factor x the median of the previous `window` finite measurements,
        at a step >= warmup_steps; severe: > severe_factor x. A measurement is one non-empty
        mini-batch update (updates.jsonl): the clip acts on each update, and a per-step mean
        over updates dilutes a spike in one of them. The window is short (10 measurements, 5
        steps at 2 updates per step) so that the baseline follows the grad norm's trend: a
        median lags its window's centre, and over a long window a rising grad norm (it rises
        4x in the first 20 steps of RL and keeps moving over a long run) exceeds 3x its own
        lagging median without any excursion. See `detectors.detect_spikes`.
        A step spikes when any of its updates does: spikes are counted in steps (the rates,
        the severe count and the BF16 comparison), since the updates of one step share their
        rollouts and are not independent measurements.
    collapse_grad_factor: collapse when a grad norm measurement exceeds this multiple of the
        *early median*, the median of the finite measurements at steps < warmup_steps.
    reward_drop, recovery_steps: collapse when the population reward falls more than
        `reward_drop` below its running best and does not come back to within `reward_drop`
        of that best within `recovery_steps` steps.

    Declared decision rule (every criterion judges the arm against the run's BF16 arm: the claim
    is "as stable as BF16", so no absolute threshold decides):
    spike_margin_per_100: the spike criterion's non-inferiority margin, in spiking steps per 100
        judged steps above BF16's rate. PASS when the one-sided `spike_level` upper bound of the
        arm's rate minus BF16's (`statistics.rate_difference`: seeds are the units, since spikes
        cluster inside a seed) is below it; otherwise FAIL when the lower bound of that
        difference is above 0 (more spikes than BF16) or the lower bound of the severe-spike
        rate's difference is (more severe spikes than BF16: judged against BF16 too, so an arm
        exactly as stable as BF16, whose own severe spikes are rare but not absent, is not
        failed by them); otherwise UNDECIDED. The margin was chosen with the rule's simulation
        (`fp4rl.analysis.power`) so that an arm as stable as BF16 passes at 8 seeds x 300 steps.
    spike_level: the one-sided level of those bounds (each a one-sided test at 1 - level).
    reward_margin_fraction: "tracks BF16" is a paired population-reward gap (seed k minus BF16's
        seed k at each step: the arms share each seed's prompts) no worse than this fraction of
        what RL gains in BF16's own run: the margin is fraction x BF16's reward rise (mean over
        its seeds of the last `reward_rise_steps` steps' mean reward minus the first's). PASS
        when the `ci_level` Student t interval over the seeds' mean gaps lies above -margin,
        FAIL when it lies below, UNDECIDED when it straddles (or BF16 does not learn: no rise).
        Seeds are the units of that interval; the two-level bootstrap (seeds, then blocks of
        steps) is reported beside it, but with 2-4 seeds it is far narrower than what they can say.
    reward_rise_steps: the window at either end of BF16's run that its rise is measured over.

    Power (below it a criterion is UNDECIDED, never FAIL; a non-finite value needs none):
    min_judged_steps: a seed is judged only with at least this many judged steps: steps
        >= warmup_steps with at least one grad-norm measurement.
    min_seeds: a criterion passes only with at least this many judged seeds; the reward
        criterion also needs them to fail (its interval is over seeds).
    few_seeds: a decided verdict resting on fewer judged seeds than this is flagged "few
        seeds" in the report: with 2 seeds a bootstrap over seeds has 3 distinct resamples
        and its interval is the seeds' [min, max], so every seed-level interval also comes
        with a Student t interval over seeds (n - 1 degrees of freedom).
    idle_grad_norm, max_idle_frac: a seed is degenerate (not judged) when more than
        `max_idle_frac` of its steps >= warmup_steps applied no update (every group dropped
        by dynamic sampling, so every mini-batch was empty or skipped) or had every grad
        norm <= idle_grad_norm.
    saturated_accuracy: a seed is degenerate (no learning signal) when its population
        accuracy is <= this at every logged step, or >= 1 - this at every logged step.

    Statistics:
    ci_level, bootstrap_samples: the confidence level and the number of bootstrap
        resamples of every interval (accuracy, accuracy change, reward gap).
    reward_block_steps: block length of the moving-block bootstrap over steps inside a seed
        for the reward gap's interval (consecutive steps are correlated).
    """

    spike_factor: float = 3.0
    severe_factor: float = 10.0
    window: int = 10
    warmup_steps: int = 20
    collapse_grad_factor: float = 100.0
    reward_drop: float = 0.5
    recovery_steps: int = 50
    spike_margin_per_100: float = 0.5
    spike_level: float = 0.95
    reward_margin_fraction: float = 0.1
    reward_rise_steps: int = 20
    min_judged_steps: int = 50
    min_seeds: int = 2
    few_seeds: int = 4
    idle_grad_norm: float = 1e-8
    max_idle_frac: float = 0.5
    saturated_accuracy: float = 0.02
    ci_level: float = 0.95
    bootstrap_samples: int = 10_000
    reward_block_steps: int = 10

    def __post_init__(self) -> None:
        if not 1.0 < self.spike_factor <= self.severe_factor:
            raise ValueError(f"need 1 < {self.spike_factor=} <= {self.severe_factor=}")
        if self.window < 1:
            raise ValueError(f"{self.window=} must be >= 1")
        if self.warmup_steps < 0 or self.recovery_steps < 1:
            raise ValueError(f"{self.warmup_steps=} must be >= 0 and {self.recovery_steps=} >= 1")
        if self.collapse_grad_factor <= 1.0 or self.reward_drop <= 0.0:
            raise ValueError(f"{self.collapse_grad_factor=} must be > 1 and {self.reward_drop=} > 0")
        if self.spike_margin_per_100 <= 0 or not 0.0 < self.reward_margin_fraction < 1.0 or self.reward_rise_steps < 1:
            raise ValueError(f"need {self.spike_margin_per_100=} > 0, 0 < {self.reward_margin_fraction=} < 1 and "
                             f"{self.reward_rise_steps=} >= 1")
        if self.min_judged_steps < 1 or self.min_seeds < 1 or self.few_seeds < 1:
            raise ValueError(f"{self.min_judged_steps=}, {self.min_seeds=} and {self.few_seeds=} must be >= 1")
        if self.idle_grad_norm < 0 or not 0.0 <= self.max_idle_frac < 1.0 or not 0.0 <= self.saturated_accuracy < 0.5:
            raise ValueError(f"need {self.idle_grad_norm=} >= 0, 0 <= {self.max_idle_frac=} < 1, "
                             f"0 <= {self.saturated_accuracy=} < 0.5")
        if not 0.5 < self.spike_level < 1.0:
            raise ValueError(f"need 0.5 < {self.spike_level=} < 1")
        if not 0.0 < self.ci_level < 1.0 or self.bootstrap_samples < 1 or self.reward_block_steps < 1:
            raise ValueError(f"need 0 < {self.ci_level=} < 1, {self.bootstrap_samples=} >= 1, "
                             f"{self.reward_block_steps=} >= 1")

    def describe(self) -> list[str]:
        """The declared criteria as report lines."""
        c = self
        return [
            f"spike: a pre-clip global grad norm measurement > {c.spike_factor:g}x the median of the previous "
            f"{c.window} finite measurements (a short window, so that the baseline follows the grad norm's trend), "
            f"at steps >= {c.warmup_steps}; severe: > {c.severe_factor:g}x. A measurement is one non-empty mini-batch "
            "update (updates.jsonl; a seed without it falls back to the per-step mean grad_norm/global, noted below). "
            "Empty mini-batches are not measurements. A step spikes when any of its updates does; spikes are "
            "counted in steps (the updates of one step share their rollouts).",
            f"spike criterion, against BF16 (seeds are the units: spiking steps / judged steps per seed, the rate "
            f"difference's one-sided {c.spike_level:.0%} bounds with a between-seed variance, never below the "
            "binomial one, and Student t quantiles): PASS when the upper bound of the arm's spiking-step rate minus "
            f"BF16's is below {c.spike_margin_per_100:g} per 100 judged steps (non-inferiority margin); otherwise FAIL "
            "when the lower bound is above 0 (more spikes than BF16) or the severe-spike rate's lower bound is "
            "(more severe spikes than BF16); otherwise UNDECIDED.",
            f"collapse: any non-finite logged value; a grad norm > {c.collapse_grad_factor:g}x the early median "
            f"(median of the finite measurements at steps < {c.warmup_steps}); or population reward more than "
            f"{c.reward_drop:g} below its running best, not back within {c.reward_drop:g} of it within "
            f"{c.recovery_steps} steps (only decided once {c.recovery_steps} steps were observed after the drop). "
            "Passes when no seed collapses.",
            f"reward: mean over seeds of the per-seed mean gap of population/reward_mean (every sampled "
            "response) to BF16's, paired by seed (seed k minus BF16's seed k at each step: the arms share each "
            f"seed's prompts). Margin: {c.reward_margin_fraction:g} x BF16's reward rise (the mean over its seeds of "
            f"the last {c.reward_rise_steps} steps' mean reward minus the first {c.reward_rise_steps}'s): the arm "
            f"tracks BF16 when it loses at most {c.reward_margin_fraction:.0%} of what RL gains. PASS when the "
            f"{c.ci_level:.0%} Student t interval over the seeds' mean gaps lies above -margin, FAIL when below, "
            "UNDECIDED when it straddles it (or BF16's reward does not rise). A two-level bootstrap interval (seeds, "
            f"then blocks of {c.reward_block_steps} steps) is reported beside it.",
            f"power: a seed is judged when it has >= {c.min_judged_steps} judged steps (steps >= {c.warmup_steps} "
            f"with a grad-norm measurement) and is not degenerate: more than {c.max_idle_frac:.0%} of its steps "
            f">= {c.warmup_steps} applying no update or with grad norm <= {c.idle_grad_norm:g} (every group "
            f"dropped), or population accuracy <= {c.saturated_accuracy:g} or >= {1 - c.saturated_accuracy:g} at "
            f"every step (no learning signal). A criterion passes only with >= {c.min_seeds} judged seeds (the "
            "reward criterion also needs them to fail); without power it is UNDECIDED, never FAIL. A non-finite "
            "value is a collapse at any power.",
            f"final held-out accuracy (greedy and sampled) with a {c.ci_level:.0%} hierarchical bootstrap "
            "interval (seeds resampled, then each seed's evaluation error: Jeffreys posterior of k of eval/n), and the "
            "change of sampled accuracy from the first evaluation to the last; mismatch (sampler vs trainer "
            "k3 KL per token): reported, not judged.",
            f"few seeds: every interval over seeds also has a {c.ci_level:.0%} Student t interval (n - 1 degrees of "
            "freedom; with 2 seeds the bootstrap's interval is the two seeds' [min, max]), and a decided verdict "
            f"resting on fewer than {c.few_seeds} judged seeds is marked (few seeds).",
        ]
