"""Which warm-up starts RL inside its difficulty band: the choice among candidate long-horizon bands.

docs/rl.md: every RL arm starts from a warm-up whose sampled (temperature 1) accuracy on the RL
band is about 0.2-0.45, so that a group of 8 samples often holds a right and a wrong answer. A
warm-up's band accuracy is the mean over the band's levels (numbers of operations) of its
accuracy table (`sft_meta.json`), the levels weighted equally, as the RL prompts draw them.

Rule (`BAND_RULE`, declared before the runs it chooses): RL runs on every candidate whose band
accuracy lies in [0.2, 0.45]; a warm-up outside it is reported, not run (below the band, groups of
8 samples rarely hold a right answer: `results/long_h200/`; above it, too few hold a wrong one).

    python -m experiments.band runs/h200-long-x4/sft runs/h200-chain/sft --table=band.md
    # prints the table, then the directories inside the band one per line; exit status 1 if none is
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fp4rl.run_files import read_json

BAND = (0.2, 0.45)
BAND_RULE = (f"RL runs on every candidate whose warm-up's mean sampled accuracy over the RL band's levels (equally "
             f"weighted) lies in [{BAND[0]}, {BAND[1]}]; the others are reported, not run.")


def band_accuracy(warmup_dir: str | Path) -> float:
    """Mean sampled accuracy over the levels of a finished warm-up's accuracy table."""
    return mean_sampled_accuracy(read_json(Path(warmup_dir) / "sft_meta.json"), f"{warmup_dir}/sft_meta.json")


def mean_sampled_accuracy(meta: Mapping, where: str = "sft_meta.json") -> float:
    """Mean sampled accuracy over the levels of a warm-up's `sft_meta.json` record (`where` names it)."""
    rows = meta["accuracy"]
    if not rows:
        raise ValueError(f"{where} has an empty accuracy table")
    return sum(r["sampled"] for r in rows) / len(rows)


def distance_to_band(accuracy: float, band: tuple[float, float] = BAND) -> float:
    return max(band[0] - accuracy, 0.0, accuracy - band[1])


def inside(accuracies: dict[str, float], band: tuple[float, float] = BAND) -> list[str]:
    """The candidates (keys, in the dict's order) that BAND_RULE runs."""
    return [name for name, acc in accuracies.items() if distance_to_band(acc, band) == 0.0]


def table_markdown(accuracies: dict[str, float], chosen: list[str]) -> str:
    """One row per warm-up directory (the keys): its sampled accuracy per level, the mean, chosen or not."""
    lines = [f"Rule (declared before the runs): {BAND_RULE}", "",
             "| warm-up | sampled accuracy (T=1) per number of operations | band mean | chosen |", "|---|---|---|---|"]
    for d, acc in accuracies.items():
        levels = ", ".join(f"{r['difficulty']}: {r['sampled']:.3f}" for r in read_json(Path(d) / "sft_meta.json")["accuracy"])
        lines.append(f"| {d} | {levels} | {acc:.3f} | {'yes' if d in chosen else 'no'} |")
    return "\n".join(lines) + "\n"
