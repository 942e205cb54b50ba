"""More seeds for finished arms: merge the seed directories of one ablation run into another.

    python -m experiments.merge_seeds SRC DST [--arms a,b]

A matrix grows seeds in separate runs (e.g. seeds 2-3 with `--rl.seed_offset=2 --out=SRC` after
seeds 0-1 in DST), since a run directory resumes only under the settings it started with. Each
seed is an independent run (its number draws every key), so seeds 0-1 plus seeds 2-3 under the
same settings are four seeds of one arm. For every finished arm of SRC (done.json):
- its settings must equal DST's arm's except `seeds`, `seed_offset` and what never changes a
  computed step (`resume.MAY_DIFFER`, `resume.NOT_COMPARED`); its recipe and model too; a setting
  one record lacks (a field added to the config later) is equal when the other holds its default,
  which is what the older run ran under;
- `init` (where the warm-up lay) may differ when both runs started from the same warm-up: the
  records' `warmup_sha256` are equal, or, for records that predate it, the caller names the digest
  its calls checked (`--warmup_sha256`, e.g. the `=== warmup params_sha256 ... == the expected one`
  line of each call's log), which the merge notes;
- its seed numbers must be new to DST's arm;
- then its seed<k>/ directories are copied, done.json lists every seed, and config.json gains a
  "merged_seeds" entry (seeds, seed_offset, source) that the report's settings section prints;
  the arm's train.log is kept as train_seeds<first>-<last>.log.
An arm of SRC that DST lacks is copied whole. Nothing is written before every arm has passed
the checks, so a refused merge leaves DST as it was.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from fp4rl.rl import resume
from fp4rl.rl.rl_config import RLConfig, settings
from fp4rl.run_files import read_json, write_json_atomic
from fp4rl.rl.run_settings import MERGED_KEY

# What may differ between the runs merged: which seeds, and what `resume` lets differ on resume.
MAY_DIFFER = ("seeds", "seed_offset", *resume.MAY_DIFFER, *resume.NOT_COMPARED)
WARMUP_KEY = "warmup_sha256"  # config.json: the digest of the warm-up's parameters (absent: an HF checkpoint)


def _finished_arms(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir()
                  if (p / resume.DONE_FILE).is_file() and (p / resume.CONFIG_FILE).is_file())


def _same_warmup(a: dict, b: dict, warmup_sha256: str) -> bool:
    """Did the runs of records a and b start from one warm-up (see the module's docstring)?"""
    recorded = {r.get(WARMUP_KEY) for r in (a, b)}
    if None not in recorded:
        return len(recorded) == 1 and (not warmup_sha256 or recorded == {warmup_sha256})
    return bool(warmup_sha256) and recorded <= {None, warmup_sha256}


def _merge_plan(src: Path, dst: Path, warmup_sha256: str = "") -> tuple[list[int], list[int]]:
    """(seeds of src, seeds of dst) of one arm, or ValueError naming what forbids the merge."""
    a, b = read_json(dst / resume.CONFIG_FILE), read_json(src / resume.CONFIG_FILE)
    changes = resume.without_added_at_default(resume.differences(a["rl_config"], b["rl_config"], ignore=MAY_DIFFER),
                                              settings(RLConfig()))
    if "init" in changes and _same_warmup(a, b, warmup_sha256):
        del changes["init"]
    for part in ("recipe", "model_config"):
        changes.update({f"{part}.{k}": v for k, v in resume.differences(a.get(part, {}), b.get(part, {})).items()})
    if changes:
        raise ValueError(f"{src} ran under other settings than {dst}: {resume.describe(changes)}")
    src_seeds, dst_seeds = read_json(src / resume.DONE_FILE)["seeds"], read_json(dst / resume.DONE_FILE)["seeds"]
    if set(src_seeds) & set(dst_seeds):
        raise ValueError(f"{src} and {dst} both hold seed(s) {sorted(set(src_seeds) & set(dst_seeds))}; "
                         "run the new seeds with --rl.seed_offset past the existing ones")
    return src_seeds, dst_seeds


def merge(src: str | Path, dst: str | Path, arms: Sequence[str] | None = None,
          warmup_sha256: str = "") -> dict[str, list[int]]:
    """Merge the finished arms of `src` (all, or `arms`) into `dst`; returns {arm: seeds added}."""
    src, dst = Path(src), Path(dst)
    finished = _finished_arms(src)
    names = finished if arms is None else list(arms)
    missing = [a for a in names if a not in finished]
    if missing:
        raise ValueError(f"no finished arm {missing} in {src} (finished there: {finished})")
    plans = {arm: _merge_plan(src / arm, dst / arm, warmup_sha256) for arm in names if (dst / arm / resume.DONE_FILE).is_file()}
    added = {}
    for arm in names:
        if arm not in plans:  # new to dst: the whole arm (without its checkpoint)
            shutil.copytree(src / arm, dst / arm, ignore=shutil.ignore_patterns("checkpoint", "tb", ".jax_cache"))
            added[arm] = read_json(src / arm / resume.DONE_FILE)["seeds"]
            continue
        src_seeds, dst_seeds = plans[arm]
        for seed in src_seeds:
            shutil.copytree(src / arm / f"seed{seed}", dst / arm / f"seed{seed}")
        if (src / arm / "train.log").is_file():
            shutil.copy2(src / arm / "train.log", dst / arm / f"train_seeds{min(src_seeds)}-{max(src_seeds)}.log")
        record = read_json(dst / arm / resume.CONFIG_FILE)
        source = read_json(src / arm / resume.CONFIG_FILE)
        entry = {"seeds": src_seeds, "seed_offset": source["rl_config"]["seed_offset"], "source": str(src / arm)}
        if source["rl_config"].get("init") != record["rl_config"].get("init"):
            entry["warmup_sha256"] = source.get(WARMUP_KEY) or warmup_sha256
        record.setdefault(MERGED_KEY, []).append(entry)
        write_json_atomic(dst / arm / resume.CONFIG_FILE, record, indent=2)
        done = read_json(dst / arm / resume.DONE_FILE)
        write_json_atomic(dst / arm / resume.DONE_FILE, {**done, "seeds": sorted(dst_seeds + src_seeds)})
        added[arm] = src_seeds
    return added
