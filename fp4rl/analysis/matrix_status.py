"""Where an RL matrix stands: per arm, the seeds run against the plan, its learning, stability and
cost, and the device runs still to do, read from the committed metrics.

    python -m fp4rl.analysis.matrix_status results/long_h200/chain/matrix [--window=150:300]
        [--reward_cap=0.8@150] [--preset=h200-chain] [--write=STATUS.md]

The plan (`PLAN`): the decisive arms (bf16, full and its leave-one-out arms) at 8 seeds, every
other arm at 4, each in device runs of `RUN_SEEDS` seeds (seeds 0-1, 2-3, ... with
`--rl.seed_offset`, merged with `fp4rl.rl.merge_seeds`), in `PLAN`'s order: the decisive arms'
seeds 0-3 first (the claim needs all four), then their seeds 4-7, then the 4-seed arms. Seeds a
directory already holds count whatever run made them (the first arms ran 4 seeds at a time). One
table replaces hand-kept counts, so the status and the next command cannot drift from the files.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from fp4rl.analysis import learning
from fp4rl.analysis.report import _ci
from fp4rl.analysis.runs import load_run
from fp4rl.analysis.summary import summarize_run
from fp4rl.analysis.verdicts import claim_reproduced, run_verdicts, spike_counts
from fp4rl.rl.run_settings import MERGED_KEY

DECISIVE_ARMS = ("bf16", "full", "full-dq", "full-46", "full-hp")
DECISIVE_SEEDS, OTHER_SEEDS = 8, 4
FOUR_SEED_ARMS = ("nvfp4", "nvfp4-pt", "+dq", "+46", "+hp", "mxfp8-q", "mxfp8", "mxfp8+dq")
# Seeds per device run: a run's state cannot come back from the machine, so it must finish in the
# 10-minute call that starts it or in the next call while the machine is still warm (resuming its
# last checkpoint). On an H200 at h200-chain, warm-up, compiling and 300 steps of 2 seeds take ~7
# minutes for bf16; full-dq's 1.5 s steps take 8.3 minutes with compiled programs, more than a cold
# call leaves after warm-up and compiling; 4 seeds take ~12.
RUN_SEEDS = 2
# (arm, first seed) of every run, in the order they are to run.
PLAN = (tuple((arm, first) for arm in DECISIVE_ARMS for first in (0, 2))
        + tuple((arm, first) for arm in DECISIVE_ARMS for first in (4, 6))
        + tuple((arm, first) for arm in FOUR_SEED_ARMS for first in (0, 2)))
TIMING_KEYS = ("time/step_s", "time/rollout_s", "memory/peak_gb")


@dataclasses.dataclass(frozen=True)
class ArmStatus:
    arm: str
    seeds: tuple[int, ...]
    planned: int
    steps: int  # the fewest steps any seed ran
    timing: dict  # TIMING_KEYS -> the latest run's first seed's median over steps >= 1 (step 0 compiles); max for memory
    timed_seeds: int  # the seeds vmapped in that run (its step's time is theirs together)


def _timing(first_seed_run) -> dict:
    """The vmapped seeds share one step; each seed's record adds its own bookkeeping to the clock,
    so the first seed's is the step's time (later seeds log a few tens of ms more)."""
    out = {}
    for key in TIMING_KEYS:
        steps, values = first_seed_run.logged(key)
        values = values[steps >= 1]
        out[key] = float("nan") if values.size == 0 else float(values.max() if key.startswith("memory") else np.median(values))
    return out


def latest_run_seeds(config: dict, seeds) -> tuple[int, ...]:
    """The seeds of the arm's latest run: those the last merge added (`fp4rl.rl.merge_seeds`), else all."""
    merged = config.get(MERGED_KEY, [])
    return tuple(sorted(merged[-1]["seeds"])) if merged else tuple(sorted(seeds))


def arm_statuses(run) -> list[ArmStatus]:
    planned = {arm: (DECISIVE_SEEDS if arm in DECISIVE_ARMS else OTHER_SEEDS) for arm in DECISIVE_ARMS + FOUR_SEED_ARMS}
    rows = []
    for arm, seeds in run.arms.items():
        runs = list(seeds.values())
        latest = latest_run_seeds(run.configs.get(arm, {}), seeds)
        rows.append(ArmStatus(arm, tuple(sorted(seeds)), planned.get(arm, OTHER_SEEDS),
                              min(len(r) for r in runs), _timing(seeds[latest[0]]), len(latest)))
    return rows


def remaining_runs(run) -> list[tuple[str, int]]:
    """The planned runs whose seeds are not all in the run directory, in plan order."""
    return [(arm, first) for arm, first in PLAN
            if not set(range(first, first + RUN_SEEDS)) <= set(run.arms.get(arm, {}))]


def run_command(jobs, preset: str, warmup_sha: str) -> str:
    """One device call (carry .whl) for `jobs`, (arm, first seed) pairs dealt round-robin to the
    machine's GPUs: the warm-up without its accuracy table, then each run in its own folder
    (/tmp/fp4rl-matrix/seedsFIRST, for merge_seeds). A checkpoint every 100 steps lets a run that the
    call's deadline cut resume in the next call while the machine is still warm (none outlives it)."""
    sha = f"WARMUP_SHA256={warmup_sha} " if warmup_sha else ""
    arms = ",".join(f"{arm}:{first}" for arm, first in jobs)
    return (f"{sha}SFT_ARGS=--eval_problems=0 CHECKPOINT_EVERY=100 MATRIX_PRESET={preset} ARMS={arms} "
            f"SEEDS={RUN_SEEDS} PARALLEL=1 MATRIX_DIR=/tmp/fp4rl-matrix EXPORT_JAX_CACHE=1 bash tools/gpu_session.sh matrix")


def claim_line(reproduced: bool | None, rows: list[ArmStatus]) -> str:
    """The claim as the plan decides it: UNDECIDED while a decisive arm lacks its planned seeds (a
    verdict read before the planned sample is reached could be overturned by the seeds still to
    come), with what the rule reads on the seeds so far beside it."""
    status = {True: "REPRODUCED", False: "NOT REPRODUCED", None: "UNDECIDED"}[reproduced]
    held = {row.arm: len(row.seeds) for row in rows}
    short = [f"{arm} {held.get(arm, 0)} of {DECISIVE_SEEDS}" for arm in DECISIVE_ARMS if held.get(arm, 0) < DECISIVE_SEEDS]
    if not short:
        return f"Claim (docs/rl.md): **{status}**."
    return (f"Claim (docs/rl.md): **UNDECIDED** until every decisive arm holds its {DECISIVE_SEEDS} planned seeds (now: "
            f"{', '.join(short)}). On the seeds so far the claim's rule reads {status} (provisional; "
            "`report.md` gives each arm's reasons).")


def _window_cell(arm_dir: Path, window, reward_cap, cap_step) -> str:
    try:
        bar = learning.long_horizon_bar(arm_dir, window, reward_cap, cap_step)
    except ValueError as error:  # too few evaluations in the window
        return f"n/a ({error})"
    return f"{_ci(bar.change, '+.3f')}: {bar.verdict}"


def status_markdown(run_dir: str | Path, window=(150, 300), reward_cap=0.8, cap_step=150,
                    preset: str = "h200-chain", warmup_sha: str = "", gpus: int = 1) -> str:
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    summaries = summarize_run(run)
    verdicts = run_verdicts(summaries)
    claim = claim_reproduced(verdicts)
    rows = arm_statuses(run)
    lines = [f"# Matrix status: `{run_dir}`", "", claim_line(claim.reproduced, rows),
             "", f"| arm | seeds (planned) | steps | held-out sampled accuracy change | window {window[0]} -> {window[1]} "
             "| spiking steps / judged (severe) | reward gap to bf16, paired | verdict | latest run: s per step (rollout), seeds | peak GB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        summary, verdict = summaries[row.arm], verdicts[row.arm]
        change = learning.summarize(run_dir / row.arm).change
        spikes, judged, severe = spike_counts(summary)
        gap = _ci(summary.reward_gap_ci, "+.3f") if summary.has_reference else "n/a"
        mark = {True: "PASS", False: "FAIL: " + ", ".join(verdict.failed()), None: "UNDECIDED"}[verdict.passed]
        t = row.timing
        seeds = f"{row.seeds[0]}-{row.seeds[-1]}" if row.seeds == tuple(range(row.seeds[0], row.seeds[-1] + 1)) else ",".join(map(str, row.seeds))
        lines.append(f"| {row.arm} | {seeds} ({row.planned}) | {row.steps} | {_ci(change, '+.3f')} "
                     f"| {_window_cell(run_dir / row.arm, window, reward_cap, cap_step)} | {spikes} / {judged} ({severe}) "
                     f"| {gap} | {mark} | {t['time/step_s']:.2f} ({t['time/rollout_s']:.2f}), {row.timed_seeds} | {t['memory/peak_gb']:.1f} |")
    todo = remaining_runs(run)
    lines += ["", f"Device runs to go: {len(todo)} of {len(PLAN)} ({RUN_SEEDS} seeds each)" + (", next:" if todo else ".")]
    if todo:
        machine = "one GPU" if gpus == 1 else f"{gpus} GPUs, one run per GPU"
        lines += ["", f"On a machine of {machine}:", "", "```bash", run_command(todo[:gpus], preset, warmup_sha), "```", "",
                  "Then: " + ", ".join(f"{a} seeds {f}-{f + RUN_SEEDS - 1}" for a, f in todo[gpus:]) + "." if todo[gpus:] else ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(prog="python -m fp4rl.analysis.matrix_status", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the matrix directory: ARM/seedK/metrics.jsonl")
    parser.add_argument("--window", type=learning.parse_window, default=(150, 300),
                        help="the long-horizon window, START:END (steps; default 150:300)")
    parser.add_argument("--reward_cap", type=learning.parse_reward_cap, default=(0.8, 150),
                        help="CAP@STEP: the early-saturation cap (default 0.8@150)")
    parser.add_argument("--preset", default="h200-chain", help="the preset in the next run's command")
    parser.add_argument("--warmup_sha", default="", help="the warm-up digest the next run's command holds it to")
    parser.add_argument("--gpus", type=int, default=1, choices=(1, 2, 4, 8),
                        help="GPUs of the machine the next call gets: its command holds that many runs (default 1)")
    parser.add_argument("--write", default="", help="also write the status here (markdown)")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        parser.error(f"{args.run_dir} is not a directory")
    text = status_markdown(args.run_dir, args.window, *args.reward_cap, args.preset, args.warmup_sha, args.gpus)
    if args.write:
        Path(args.write).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
