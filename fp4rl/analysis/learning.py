"""Does RL learn? Held-out accuracy of one arm over its steps, with the decision rule applied.

The trainer evaluates the policy before any update (`eval/initial_*`, logged with step 0) and
every `eval_every` steps after (`eval/accuracy` greedy, `eval/sampled_accuracy` at the rollout
temperature, `eval/n` problems; the same problems and sampling keys each time). From these:

- per seed, the sampled and greedy accuracy at every evaluation (x = updates done so far);
- the change of sampled accuracy from the initial evaluation to the last, with a two-level
  bootstrap CI over seeds and each evaluation's error (`statistics.accuracy_change_ci`);
- the slope of sampled accuracy per 100 steps by least squares, pooled over seeds with one
  intercept per seed, and its t-statistic (residual standard error; the evaluations of one seed
  share problems, so points are not independent draws: the t-statistic is descriptive, the
  bootstrap CI is the test).

Decision rule, declared before any run (`LEARNING_RULE`): the arm learns when the mean change
is at least `min_gain` and the CI's lower end is above 0; it does not learn (at the `min_gain`
level) when the CI's upper end is below `min_gain`; otherwise UNDECIDED.

The long-horizon bar (`LONG_HORIZON_RULE`, `--window=150:300 --reward_cap=0.8@150`) asks more of a
task than learning at all: that RL still learns late. It takes the same change over a window of
the run only (from the first evaluation at or after the window's start to the last at or before its
end) and requires its CI's lower end above 0, and the population reward (seed mean of
`population/reward_mean`, in a 10-step running mean) to stay below the cap before the given step.

    python -m experiments.learning runs/h200/rl/bf16      # prints the table, writes learning.md/png
    python -m experiments.learning runs/h200-long/rl/bf16 --window=150:300 --reward_cap=0.8@150
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from fp4rl.analysis.runs import METRICS_FILE, SeedRun, load_seed, seed_dirs, seed_log
from fp4rl.analysis.statistics import BootstrapCI, accuracy_change_ci

# The kinds of wrong response the trainer's held-out evaluations log (`eval/{mode}_{kind}`, the
# kinds of `fp4rl.rl.failures` after "right"; tests/analysis/test_learning.py pins them equal): the
# analysis reads run directories and imports nothing of `rl`.
WRONG_KINDS = ("miscopied", "wrong_chain")
MIN_GAIN = 0.10
LEARNING_RULE = (f"The arm learns when its mean held-out sampled accuracy rises by >= {MIN_GAIN:.2f} from the initial "
                 "evaluation to the last and the 95% CI of that change (two-level bootstrap: seeds, and each "
                 "evaluation's error as the Jeffreys posterior of k of n) excludes 0; it does not learn (at that level) when the CI's upper end "
                 f"is below {MIN_GAIN:.2f}; otherwise UNDECIDED.")
REWARD_SMOOTHING_STEPS = 10
LONG_HORIZON_RULE = ("The task keeps RL learning when the held-out sampled accuracy change over the window alone (first "
                     "evaluation at or after its start to the last at or before its end, same bootstrap) has its 95% CI "
                     "above 0, and the seed-mean population reward in a "
                     f"{REWARD_SMOOTHING_STEPS}-step running mean stays below the cap at every step before the cap's step; "
                     "it fails when the window's CI upper end is <= 0 or the reward reaches the cap early; otherwise UNDECIDED.")


@dataclasses.dataclass(frozen=True)
class SeedCurve:
    """One seed's evaluations: x = updates done (0: before RL)."""

    seed: int
    steps: np.ndarray
    sampled: np.ndarray
    greedy: np.ndarray
    n: np.ndarray


@dataclasses.dataclass(frozen=True)
class Learning:
    arm: str
    curves: tuple[SeedCurve, ...]
    change: BootstrapCI
    slope_per_100: float
    slope_t: float
    verdict: str  # "learns" | "does not learn" | "UNDECIDED"
    reason: str
    failures: dict | None = None  # `failure_split`, when the run logged it


FAILURE_MODES = ("sampled", "greedy")


def failure_split(runs) -> dict | None:
    """{(mode, kind): (seed-mean fraction at the initial evaluation, at the last)} for the wrong
    responses' kinds of `fp4rl.rl.failures` (miscopied box, wrong chain), or None when a seed did
    not log them (runs older than the split)."""
    split = {}
    for mode in FAILURE_MODES:
        for kind in WRONG_KINDS:
            name = f"eval/{mode}_{kind}"
            first = [r.last_logged(name.replace("eval/", "eval/initial_")) for r in runs]
            last = [r.last_logged(name) for r in runs]
            if any(v is None for v in first + last):
                return None
            split[mode, kind] = (float(np.mean([v[1] for v in first])), float(np.mean([v[1] for v in last])))
    return split


def seed_curve(run: SeedRun) -> SeedCurve:
    """The evaluations of one seed, the initial one first; raises when either is missing."""
    if run.last_logged("eval/initial_sampled_accuracy") is None:
        raise ValueError(f"{run.path}: no eval/initial_sampled_accuracy (the run needs eval_every > 0 from step 0)")
    i0 = int(np.flatnonzero(run.present["eval/initial_sampled_accuracy"])[0])
    points = [(0, run.metrics["eval/initial_sampled_accuracy"][i0], run.metrics["eval/initial_accuracy"][i0],
               run.metrics["eval/initial_n"][i0])]
    if "eval/sampled_accuracy" in run.present:
        for i in np.flatnonzero(run.present["eval/sampled_accuracy"]):
            points.append((int(run.steps[i]) + 1, run.metrics["eval/sampled_accuracy"][i], run.metrics["eval/accuracy"][i],
                           run.metrics["eval/n"][i]))
    steps, sampled, greedy, n = (np.asarray(c, np.float64) for c in zip(*points))
    return SeedCurve(run.seed, steps.astype(np.int64), sampled, greedy, n.astype(np.int64))


def pooled_slope(curves) -> tuple[float, float]:
    """(slope per step, t-statistic) of sampled accuracy on steps, one intercept per seed."""
    x = np.concatenate([c.steps - c.steps.mean() for c in curves]).astype(np.float64)
    y = np.concatenate([c.sampled - c.sampled.mean() for c in curves])
    dof = x.size - len(curves) - 1
    if dof < 1 or not np.any(x):
        return float("nan"), float("nan")
    slope = float(x @ y / (x @ x))
    sigma2 = float(np.sum((y - slope * x) ** 2) / dof)
    se = np.sqrt(sigma2 / (x @ x))
    if se == 0:
        return slope, float("nan") if slope == 0 else float(np.copysign(np.inf, slope))
    return slope, float(slope / se)


def decide(change: BootstrapCI, min_gain: float = MIN_GAIN) -> tuple[str, str]:
    if change.mean >= min_gain and change.low > 0:
        return "learns", f"change {change.mean:+.3f} >= {min_gain:.2f} and CI [{change.low:+.3f}, {change.high:+.3f}] excludes 0"
    if change.high < min_gain:
        return "does not learn", f"CI [{change.low:+.3f}, {change.high:+.3f}] lies below {min_gain:.2f}"
    return "UNDECIDED", f"change {change.mean:+.3f}, CI [{change.low:+.3f}, {change.high:+.3f}]: the data cannot decide"


def _load_runs(arm_dir: Path) -> tuple[SeedRun, ...]:
    logs = [(seed, seed_log(d, METRICS_FILE)) for seed, d in seed_dirs(arm_dir)]
    seeds = [(seed, log) for seed, log in logs if log is not None]
    if not seeds:
        raise FileNotFoundError(f"no seed*/metrics.jsonl(.gz) under {arm_dir}")
    return tuple(load_seed(log, arm_dir.name, seed) for seed, log in seeds)


def summarize(arm_dir: str | Path) -> Learning:
    arm_dir = Path(arm_dir)
    runs = _load_runs(arm_dir)
    curves = tuple(seed_curve(r) for r in runs)
    change = accuracy_change_ci([c.sampled[0] for c in curves], [c.n[0] for c in curves],
                                [c.sampled[-1] for c in curves], [c.n[-1] for c in curves])
    slope, t = pooled_slope(curves)
    verdict, reason = decide(change)
    return Learning(arm_dir.name, curves, change, 100 * slope, t, verdict, reason, failure_split(runs))


@dataclasses.dataclass(frozen=True)
class WindowBar:
    """The long-horizon bar: the window's change and the early population reward."""

    window: tuple[int, int]
    steps: tuple[tuple[int, int], ...]  # per seed: the evaluations (after steps) the change spans
    change: BootstrapCI
    reward_cap: float
    cap_step: int
    max_reward_before: float  # the highest running-mean population reward before cap_step
    verdict: str  # "keeps learning" | "does not keep learning" | "UNDECIDED"
    reason: str


def window_change(curves, start: int, end: int) -> tuple[BootstrapCI, tuple[tuple[int, int], ...]]:
    """The sampled-accuracy change from the first evaluation at or after `start` to the last at or
    before `end`, per seed, with the bootstrap CI of its mean; raises when a seed has no such pair."""
    first, last, spans = [], [], []
    for c in curves:
        inside = np.flatnonzero((c.steps >= start) & (c.steps <= end))
        if inside.size < 2:
            raise ValueError(f"seed {c.seed}: fewer than two evaluations in steps {start}..{end} "
                             f"(evaluations after steps {', '.join(map(str, c.steps))})")
        first.append(inside[0])
        last.append(inside[-1])
        spans.append((int(c.steps[inside[0]]), int(c.steps[inside[-1]])))
    ci = accuracy_change_ci([c.sampled[i] for c, i in zip(curves, first)], [c.n[i] for c, i in zip(curves, first)],
                            [c.sampled[i] for c, i in zip(curves, last)], [c.n[i] for c, i in zip(curves, last)])
    return ci, tuple(spans)


def running_population_reward(runs, smoothing: int = REWARD_SMOOTHING_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, running mean over `smoothing` steps of the seed-mean population reward) on the steps
    every seed logged it."""
    per_seed = [dict(zip(*(a.tolist() for a in r.logged("population/reward_mean")))) for r in runs]
    steps = sorted(set.intersection(*(set(d) for d in per_seed)))
    if not steps:
        raise ValueError("no step where every seed logged population/reward_mean")
    mean = np.array([np.mean([d[s] for d in per_seed]) for s in steps])
    window = min(smoothing, mean.size)
    smooth = np.convolve(mean, np.ones(window) / window, mode="valid")
    return np.asarray(steps[window - 1:]), smooth


def long_horizon_bar(arm_dir: str | Path, window: tuple[int, int], reward_cap: float, cap_step: int) -> WindowBar:
    runs = _load_runs(Path(arm_dir))
    change, spans = window_change(tuple(seed_curve(r) for r in runs), *window)
    steps, reward = running_population_reward(runs)
    early = reward[steps < cap_step]
    max_before = float(early.max()) if early.size else float("nan")
    if early.size == 0:
        verdict, reason = "UNDECIDED", f"no population reward logged before step {cap_step}"
    elif max_before >= reward_cap:
        verdict, reason = "does not keep learning", f"population reward reached {max_before:.3f} >= {reward_cap} before step {cap_step}"
    elif change.low > 0:
        verdict, reason = "keeps learning", f"window change {change.mean:+.3f}, CI [{change.low:+.3f}, {change.high:+.3f}] above 0"
    elif change.high <= 0:
        verdict, reason = "does not keep learning", f"window change CI [{change.low:+.3f}, {change.high:+.3f}] at or below 0"
    else:
        verdict, reason = "UNDECIDED", f"window change {change.mean:+.3f}, CI [{change.low:+.3f}, {change.high:+.3f}] spans 0"
    return WindowBar(window, spans, change, reward_cap, cap_step, max_before, verdict, reason)


def window_markdown(bar: WindowBar) -> str:
    ch = bar.change
    t = "" if ch.t_interval is None else f"; t interval over seeds [{ch.t_interval[0]:+.3f}, {ch.t_interval[1]:+.3f}]"
    spans = ", ".join(f"{a}->{b}" for a, b in bar.steps)
    return "\n".join([f"### Long-horizon bar: steps {bar.window[0]}-{bar.window[1]}", "",
                      f"Rule (declared before the run): {LONG_HORIZON_RULE}", "",
                      f"- window change of sampled accuracy (evaluations {spans}): {ch.mean:+.3f} "
                      f"(95% CI [{ch.low:+.3f}, {ch.high:+.3f}], {ch.kind}{t})",
                      f"- highest population reward ({REWARD_SMOOTHING_STEPS}-step running mean) before step "
                      f"{bar.cap_step}: {bar.max_reward_before:.3f} (cap {bar.reward_cap})",
                      f"- **verdict: {bar.verdict}** ({bar.reason})", ""])


def markdown(result: Learning) -> str:
    lines = [f"## Learning: `{result.arm}`", "", f"Rule (declared before the run): {LEARNING_RULE}", "",
             "| seed | evaluations (after steps) | problems | sampled: initial -> last | greedy: initial -> last |",
             "|---|---|---|---|---|"]
    for c in result.curves:
        lines.append(f"| {c.seed} | {', '.join(map(str, c.steps))} | {c.n[0]} | {c.sampled[0]:.3f} -> {c.sampled[-1]:.3f} | "
                     f"{c.greedy[0]:.3f} -> {c.greedy[-1]:.3f} |")
    ch = result.change
    t = "" if ch.t_interval is None else f"; t interval over seeds [{ch.t_interval[0]:+.3f}, {ch.t_interval[1]:+.3f}]"
    lines += ["", f"- sampled accuracy change, mean over {len(result.curves)} seeds: {ch.mean:+.3f} "
                  f"(95% CI [{ch.low:+.3f}, {ch.high:+.3f}], {ch.kind}{t})",
              f"- slope: {result.slope_per_100:+.3f} per 100 steps, t = {result.slope_t:.2f} (pooled over seeds, "
              "one intercept per seed; descriptive)",
              f"- **verdict: {result.verdict}** ({result.reason})", ""]
    if result.failures is not None:
        lines += failures_markdown(result)
    return "\n".join(lines)


def failures_markdown(result: Learning) -> list[str]:
    """The wrong responses split by kind, initial -> last (seed means), and, when greedy accuracy
    fell while sampled accuracy rose, which kind of failure grew under greedy decoding."""
    f = result.failures
    lines = ["Wrong responses by kind (`fp4rl.rl.failures`; fractions of all held-out responses, mean over seeds, "
             "initial -> last evaluation):", "", "| decoding | box miscopied (the chain computed the answer) | "
             "wrong chain |", "|---|---|---|"]
    for mode in FAILURE_MODES:
        (m0, m1), (w0, w1) = f[mode, "miscopied"], f[mode, "wrong_chain"]
        lines.append(f"| {mode} | {m0:.3f} -> {m1:.3f} | {w0:.3f} -> {w1:.3f} |")
    greedy0 = np.mean([c.greedy[0] for c in result.curves])
    greedy1 = np.mean([c.greedy[-1] for c in result.curves])
    if greedy1 < greedy0 and result.change.mean > 0:
        grew = max(WRONG_KINDS, key=lambda k: f["greedy", k][1] - f["greedy", k][0])
        what = {"wrong_chain": "the scratchpad's arithmetic, not the copy into the box",
                "miscopied": "the copy into the box"}[grew]
        lines += ["", f"Greedy accuracy fell ({greedy0:.3f} -> {greedy1:.3f}) while sampled accuracy rose: the greedy "
                      f"failures that grew are {what} ({grew} {f['greedy', grew][0]:.3f} -> {f['greedy', grew][1]:.3f})."]
    return lines + [""]


def plot(result: Learning, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for c in result.curves:
        line, = ax.plot(c.steps, c.sampled, marker="o", label=f"seed {c.seed} sampled (T=1)")
        ax.plot(c.steps, c.greedy, marker="s", ls="--", color=line.get_color(), label=f"seed {c.seed} greedy")
    ax.set_xlabel("RL steps done")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"{result.arm}: {result.verdict} (sampled change {result.change.mean:+.3f})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_window(text: str) -> tuple[int, int]:
    try:
        start, end = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window takes START:END steps (e.g. 150:300), got {text!r}") from None
    if not 0 <= start < end:
        raise argparse.ArgumentTypeError(f"--window needs 0 <= START < END, got {text!r}")
    return start, end


def parse_reward_cap(text: str) -> tuple[float, int]:
    try:
        cap, step = text.split("@")
        return float(cap), int(step)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--reward_cap takes CAP@STEP (e.g. 0.8@150), got {text!r}") from None
