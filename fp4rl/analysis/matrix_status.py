"""Where an RL matrix stands: per arm, the seeds run against the plan, its learning, stability and
cost, and the device runs still to do, read from the committed metrics.

    python -m experiments.matrix_status results/long_h200/chain/paired [--window=150:300]
        [--reward_cap=0.8@150] [--preset=h200-chain] [--write=STATUS.md]

The plan (docs/rl.md "The ablation matrix", the instruments first), in device runs of `RUN_SEEDS`
seeds (seeds 0-1, 2-3, ... with `--rl.seed_offset`, merged with `python -m experiments.merge_seeds`):
`FIRST_PHASE`: the no-intervention arms nvfp4 and nvfp4-pt at 4 seeds beside bf16 and full (the
paired reference and the recipe), then the positive controls (nvfp4+attn, nvfp4-tensor), then the
dose-response of the mismatch (nvfp4@A and +dq@A, A = 4, 16, 64, and A = 1: nvfp4 and +dq). The
decision rule, stated before the runs: if nvfp4 at 4 seeds is EQUIVALENT to full within the rule's
margins (`verdicts.equivalence`), the matrix ends with `EQUIVALENT_PHASE` (bf16, full, nvfp4 and
full-dq at 8 seeds) and reads "at this scale no intervention is needed", the positive controls and
the dose-response saying what the instruments can see; otherwise `DECISIVE_PHASE` runs the claim's
arms (bf16, full and the three leave-one-out arms) to 8 seeds. One table replaces hand-kept counts,
so the status and the next command cannot drift from the files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from fp4rl.analysis import learning
from fp4rl.analysis.report import _ci
from fp4rl.analysis.runs import RunData, load_run
from fp4rl.analysis.summary import summarize_run
from fp4rl.analysis.verdicts import claim_reproduced, equivalence, run_verdicts, spike_counts
from fp4rl.recipe import POSITIVE_CONTROL_ARMS, dose_response_arms
from fp4rl.run_files import MERGED_KEY

DECISIVE_ARMS = ("bf16", "full", "full-dq", "full-46", "full-hp")
DECISIVE_SEEDS = 8
# Seeds per device run: a run's state cannot come back from the machine, so it must finish in the
# 10-minute call that starts it or in the next call while the machine is still warm (resuming its
# last checkpoint). On an H200 at h200-chain, warm-up, compiling and 300 steps of 2 seeds take ~7
# minutes for bf16; full-dq's 1.5 s steps take 8.3 minutes with compiled programs, more than a cold
# call leaves after warm-up and compiling; 4 seeds take ~12.
RUN_SEEDS = 2


def _runs(arm: str, seeds: int, first: int = 0) -> tuple[tuple[str, int], ...]:
    return tuple((arm, f) for f in range(first, first + seeds, RUN_SEEDS))


# (arm, first seed) of every run, in the order they are to run.
FIRST_PHASE = (
    ("bf16", 0), ("nvfp4", 0), ("bf16", 2), ("nvfp4", 2), *_runs("nvfp4-pt", 4), *_runs("full", 4),
    *((arm, 0) for arm in POSITIVE_CONTROL_ARMS),
    *((arm, 0) for arm in dose_response_arms() if arm != "nvfp4"),  # nvfp4 (dose 1) ran above
)
EQUIVALENT_PHASE = (*_runs("bf16", 4, 4), *_runs("full", 4, 4), *_runs("nvfp4", 4, 4), *_runs("full-dq", 8))
DECISIVE_PHASE = (*_runs("bf16", 4, 4), *_runs("full", 4, 4),
                  *(run for arm in DECISIVE_ARMS[2:] for run in _runs(arm, DECISIVE_SEEDS)))
DECISION_ARMS, DECISION_SEEDS = ("nvfp4", "full"), 4
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


def planned_seeds(plan) -> dict[str, int]:
    seeds: dict[str, int] = {}
    for arm, _ in plan:
        seeds[arm] = seeds.get(arm, 0) + RUN_SEEDS
    return seeds


def arm_statuses(run, plan) -> list[ArmStatus]:
    planned = planned_seeds(plan)
    rows = []
    for arm, seeds in run.arms.items():
        runs = list(seeds.values())
        latest = latest_run_seeds(run.configs.get(arm, {}), seeds)
        rows.append(ArmStatus(arm, tuple(sorted(seeds)), planned.get(arm, 0),
                              min(len(r) for r in runs), _timing(seeds[latest[0]]), len(latest)))
    return rows


def decision(summaries) -> tuple[bool | None, str]:
    """The decision rule on nvfp4 vs full: (equivalent?, the line saying so). None until both hold
    `DECISION_SEEDS` judged seeds, or while the equivalence is undecided."""
    a, b = (summaries.get(arm) for arm in DECISION_ARMS)
    held = [0 if s is None else len(s.judged_seeds) for s in (a, b)]
    if min(held) < DECISION_SEEDS:
        return None, (f"Decision rule (before the runs): pending until {DECISION_ARMS[0]} and {DECISION_ARMS[1]} hold "
                      f"{DECISION_SEEDS} judged seeds each (now {held[0]} and {held[1]}).")
    result = equivalence(a, b)
    word = {True: "EQUIVALENT", False: "NOT EQUIVALENT", None: "UNDECIDED"}[result.passed]
    then = ("the matrix ends with bf16, full, nvfp4 and full-dq at 8 seeds: at this scale no intervention is needed"
            if result.passed else "the claim's decisive arms run to 8 seeds")
    return result.passed, f"Decision rule: {DECISION_ARMS[0]} vs {DECISION_ARMS[1]} {word} ({result.value}): {then}."


def plan_for(equivalent: bool | None) -> tuple[tuple[str, int], ...]:
    return FIRST_PHASE + (EQUIVALENT_PHASE if equivalent else DECISIVE_PHASE)


def remaining_runs(run, plan) -> list[tuple[str, int]]:
    """The planned runs whose seeds are not all in the run directory, in plan order (a run listed
    twice by the phases is listed once)."""
    todo = [(arm, first) for arm, first in plan if not set(range(first, first + RUN_SEEDS)) <= set(run.arms.get(arm, {}))]
    return list(dict.fromkeys(todo))


def run_command(jobs, preset: str, warmup_sha: str) -> str:
    """One device call (carry .whl) for `jobs`, (arm, first seed) pairs dealt round-robin to the
    machine's GPUs: the warm-up without its accuracy table, then each run in its own folder
    (/tmp/fp4rl-matrix/seedsFIRST, for merge_seeds). A checkpoint every 100 steps lets a run that the
    call's deadline cut resume in the next call while the machine is still warm (none outlives it)."""
    sha = f"WARMUP_SHA256={warmup_sha} " if warmup_sha else ""
    arms = ",".join(f"{arm}:{first}" for arm, first in jobs)
    return (f"{sha}SFT_ARGS=--eval_problems=0 CHECKPOINT_EVERY=100 MATRIX_PRESET={preset} ARMS={arms} "
            f"SEEDS={RUN_SEEDS} PARALLEL=1 MATRIX_DIR=/tmp/fp4rl-matrix EXPORT_JAX_CACHE=1 bash tools/gpu_session.sh matrix")


def claim_line(reproduced: bool | None, rows: list[ArmStatus], equivalent: bool | None = None) -> str:
    """The claim as the plan decides it: UNDECIDED while a planned 8-seed arm lacks its seeds (a
    verdict read before the planned sample is reached could be overturned by the seeds still to
    come), with what the rule reads on the seeds so far beside it."""
    status = {True: "REPRODUCED", False: "NOT REPRODUCED", None: "UNDECIDED"}[reproduced]
    held = {row.arm: len(row.seeds) for row in rows}
    arms = ("bf16", "full", "nvfp4", "full-dq") if equivalent else DECISIVE_ARMS
    short = [f"{arm} {held.get(arm, 0)} of {DECISIVE_SEEDS}" for arm in arms if held.get(arm, 0) < DECISIVE_SEEDS]
    if equivalent and not short:
        return ("Result: nvfp4 is equivalent to full at 8 seeds: **at this scale no intervention is needed** "
                f"(the claim's rule reads {status}; the positive controls and the dose-response say what the tests see).")
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
    # A matrix not started yet has no arm: its status is the whole plan.
    started = any(run_dir.glob("*/seed*/metrics.jsonl*"))
    run = load_run(run_dir) if started else RunData(run_dir, {}, ())
    summaries = summarize_run(run)
    verdicts = run_verdicts(summaries)
    claim = claim_reproduced(verdicts)
    equivalent, decided = decision(summaries)
    plan = plan_for(equivalent)
    rows = arm_statuses(run, plan)
    lines = [f"# Matrix status: `{run_dir}`", "", claim_line(claim.reproduced, rows, equivalent), "", decided,
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
    todo = remaining_runs(run, plan)
    lines += ["", f"Device runs to go: {len(todo)} of {len(dict.fromkeys(plan))} ({RUN_SEEDS} seeds each)"
              + (", next:" if todo else ".")]
    if todo:
        machine = "one GPU" if gpus == 1 else f"{gpus} GPUs, one run per GPU"
        lines += ["", f"On a machine of {machine}:", "", "```bash", run_command(todo[:gpus], preset, warmup_sha), "```", "",
                  "Then: " + ", ".join(f"{a} seeds {f}-{f + RUN_SEEDS - 1}" for a, f in todo[gpus:]) + "." if todo[gpus:] else ""]
    return "\n".join(lines).rstrip() + "\n"
