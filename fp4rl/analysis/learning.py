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

    python -m fp4rl.analysis.learning runs/h200/rl/bf16      # prints the table, writes learning.md/png
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from fp4rl.analysis.runs import SeedRun, load_seed
from fp4rl.analysis.statistics import BootstrapCI, accuracy_change_ci

MIN_GAIN = 0.10
LEARNING_RULE = (f"The arm learns when its mean held-out sampled accuracy rises by >= {MIN_GAIN:.2f} from the initial "
                 "evaluation to the last and the 95% CI of that change (two-level bootstrap: seeds, and each "
                 "evaluation's error as the Jeffreys posterior of k of n) excludes 0; it does not learn (at that level) when the CI's upper end "
                 f"is below {MIN_GAIN:.2f}; otherwise UNDECIDED.")


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


def summarize(arm_dir: str | Path) -> Learning:
    arm_dir = Path(arm_dir)
    seeds = sorted(arm_dir.glob("seed*/metrics.jsonl"), key=lambda p: int(p.parent.name[4:]))
    if not seeds:
        raise FileNotFoundError(f"no seed*/metrics.jsonl under {arm_dir}")
    curves = tuple(seed_curve(load_seed(p, arm_dir.name, int(p.parent.name[4:]))) for p in seeds)
    change = accuracy_change_ci([c.sampled[0] for c in curves], [c.n[0] for c in curves],
                                [c.sampled[-1] for c in curves], [c.n[-1] for c in curves])
    slope, t = pooled_slope(curves)
    verdict, reason = decide(change)
    return Learning(arm_dir.name, curves, change, 100 * slope, t, verdict, reason)


def markdown(result: Learning) -> str:
    lines = [f"## Learning: `{result.arm}`", "", f"Rule (declared before the run): {LEARNING_RULE}", "",
             "| seed | evaluations (after steps) | problems | sampled: initial -> last | greedy: initial -> last |",
             "|---|---|---|---|---|"]
    for c in result.curves:
        lines.append(f"| {c.seed} | {', '.join(map(str, c.steps))} | {c.n[0]} | {c.sampled[0]:.3f} -> {c.sampled[-1]:.3f} | "
                     f"{c.greedy[0]:.3f} -> {c.greedy[-1]:.3f} |")
    ch = result.change
    lines += ["", f"- sampled accuracy change, mean over {len(result.curves)} seeds: {ch.mean:+.3f} "
                  f"(95% CI [{ch.low:+.3f}, {ch.high:+.3f}], {ch.kind if hasattr(ch, 'kind') else 'bootstrap'})",
              f"- slope: {result.slope_per_100:+.3f} per 100 steps, t = {result.slope_t:.2f} (pooled over seeds, "
              "one intercept per seed; descriptive)",
              f"- **verdict: {result.verdict}** ({result.reason})", ""]
    return "\n".join(lines)


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


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m fp4rl.analysis.learning ARM_DIR   (a directory holding seed*/metrics.jsonl)")
    result = summarize(argv[0])
    text = markdown(result)
    (Path(argv[0]) / "learning.md").write_text(text)
    plot(result, Path(argv[0]) / "learning.png")
    print(text)


if __name__ == "__main__":
    main()
