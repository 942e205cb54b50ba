"""The claim rule's operating characteristics, by simulation (`fp4rl.analysis.power`): P(REPRODUCED),
P(NOT REPRODUCED) and P(UNDECIDED) per scenario and seed count, printed, and with --out written to
that folder's README.md, one section per command.

    python -m experiments.rule_power --seeds 2,4,8 --steps 300 --replicates 2000
    python -m experiments.rule_power --out results/rule_power   # also writes README.md's table there
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fp4rl.analysis import power
from fp4rl.analysis.criteria import StabilityCriteria

PROG = "python -m experiments.rule_power"


def main(argv: Sequence[str] | None = None) -> None:
    """Simulate the rule over the default scenarios and print (and with --out write) the table."""
    parser = argparse.ArgumentParser(prog=PROG, description=power.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="2,4,8", help="seeds per arm (BF16's too); a comma list (default 2,4,8)")
    parser.add_argument("--steps", type=int, default=300, help="RL steps per seed (default 300)")
    parser.add_argument("--replicates", type=int, default=2000, help="simulated matrices per row (default 2000)")
    parser.add_argument("--spike-margin", type=float, default=StabilityCriteria().spike_margin_per_100,
                        help="non-inferiority margin, spiking steps per 100 judged steps (default: the declared one)")
    parser.add_argument("--dispersion", type=float, default=power.CHAIN_DISPERSION,
                        help="seed effect's phi (default 1)")
    parser.add_argument("--bf16-step-rate", type=float, default=None, help="BF16's spiking-step rate (default 3/2240)")
    parser.add_argument("--gap-sd", type=float, default=power.CHAIN_GAP_SD, help="per-seed sd of the mean paired gap")
    parser.add_argument("--from-run", default=None, help="measure the noise model on this run directory instead")
    parser.add_argument("--out", default=None, help="also write README.md (the table and the command) in this folder")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        c = StabilityCriteria(spike_margin_per_100=args.spike_margin)
        noise = power.NoiseModel(dispersion=args.dispersion, gap_sd=args.gap_sd)
        source = "measured on results/long_h200/chain/matrix"
        if args.from_run:
            noise, source = power.measured_noise(args.from_run, c)
        if args.bf16_step_rate is not None:
            noise = dataclasses.replace(noise, bf16_step_rate=args.bf16_step_rate)
    except ValueError as e:
        parser.error(str(e))
    start = time.time()
    points = [power.operating_point(truth, s, args.steps, args.replicates, noise, c, seed=i)
              for i, truth in enumerate(power.default_scenarios(c, noise)) for s in seeds]
    sizes = {s: power.false_spike_failure_rate(s, args.steps, args.replicates, noise, c) for s in seeds}
    table = power.markdown(points, sizes, noise, c, source)
    print(table)
    print(f"\n({time.time() - start:.0f} s)")
    if args.out:
        command = f"{PROG} " + " ".join(sys.argv[1:] if argv is None else argv)
        write_readme(Path(args.out), command.strip(), table)


def write_readme(out: Path, command: str, table: str) -> None:
    """`out`/README.md: one section per command (a rerun replaces its own section, another command
    adds one), each with the date and the commit; the text above the first section is kept."""
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    section = f"## `{command}`\n\n{datetime.date.today()}, commit {commit or 'unknown'}.\n\n{table}\n"
    readme = out / "README.md"
    text = readme.read_text() if readme.exists() else "# The claim rule's operating characteristics (simulated)\n\n"
    head, *sections = text.split("\n## ")  # the head (title, what the tables say) is kept as written
    head = head.rstrip() + "\n\n"
    kept = ["## " + x.rstrip() + "\n" for x in sections if not x.startswith(f"`{command}`")]
    readme.write_text(head + "\n".join([*kept, section]))


if __name__ == "__main__":
    main()
