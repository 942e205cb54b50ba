"""Recovery from a damaged checkpoint finishes: a run stopped after a checkpoint whose newest step
is then damaged (bytes flipped, files cut short, a save killed before orbax committed it) is rerun
with the same command; the bad step is moved aside (kept), the move is logged and recorded, and
the run ends with the parameters and metrics of an uninterrupted run, bit for bit (on CPU).

One smoke warm-up for the session, one uninterrupted run for the module; eval is off (it is not
what is tested).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from fp4rl import configs
from fp4rl.rl import resume, trainer
from fp4rl.rl.checkpoint import CHECKSUM_SUFFIX, DAMAGED_DIR, CheckpointError, CheckpointWarning
from tests.rl.test_checkpoint import _flip_a_byte, _largest_data_file, _truncate

pytestmark = pytest.mark.slow
ARM = "bf16"  # the arm that compiles fastest; recovery does not depend on the recipe
STEPS = 3
STOP_AT = 2  # the interrupted run stops before this step: checkpoints of steps 0 and 1 are on disk
DAMAGED_STEP = STOP_AT - 1
TIMING_KEYS = ("time/", "throughput/")  # wall time differs between two identical runs


class Interrupted(Exception):
    """Stands for a kill between two steps."""


def _config(warmup_dir, out):
    return dataclasses.replace(configs.RL_PRESETS["smoke"], init=str(warmup_dir), out=str(out), arm=ARM,
                               steps=STEPS, checkpoint_every=1, eval_every=0)


def _records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING_KEYS)}
            for line in path.read_text().splitlines()]


def _tree_digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(warmup_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    trainer.Trainer(_config(warmup_dir, out), progress=False).run()
    return out / ARM


def _run_interrupted(warmup_dir, out, monkeypatch) -> None:
    step = trainer.Trainer.step

    def stopping_step(self, state, i):
        if i == STOP_AT:
            raise Interrupted(f"stopped before step {i}")
        return step(self, state, i)

    with monkeypatch.context() as patch:
        patch.setattr(trainer.Trainer, "step", stopping_step)
        run = trainer.Trainer(_config(warmup_dir, out), progress=False)
        with pytest.raises(Interrupted):
            run.run()
        run.ckpt.close()
    assert run.ckpt.steps() == [DAMAGED_STEP - 1, DAMAGED_STEP]


def _flip_bytes(checkpoint: Path) -> Path:
    _flip_a_byte(_largest_data_file(checkpoint / str(DAMAGED_STEP)))
    return checkpoint / str(DAMAGED_STEP)


def _cut_short(checkpoint: Path) -> Path:
    """A committed step whose files were cut short (a copy or a disk that failed)."""
    _truncate(_largest_data_file(checkpoint / str(DAMAGED_STEP)))
    return checkpoint / str(DAMAGED_STEP)


def _killed_mid_write(checkpoint: Path) -> Path:
    """A save killed before orbax committed it: orbax writes a step under a temporary name and
    renames it to the step number when the step is complete, so the kill leaves the temporary
    directory (with files cut short) beside the step's checksums, which are written first."""
    unfinished = checkpoint / f"{DAMAGED_STEP}.orbax-checkpoint-tmp-1700000000000000"
    (checkpoint / str(DAMAGED_STEP)).rename(unfinished)
    _truncate(_largest_data_file(unfinished))
    return unfinished


@pytest.mark.parametrize("damage", [_flip_bytes, _cut_short, _killed_mid_write])
def test_a_rerun_moves_a_damaged_step_aside_and_finishes_as_an_uninterrupted_run(
        warmup_dir, uninterrupted, tmp_path, monkeypatch, damage):
    _run_interrupted(warmup_dir, tmp_path, monkeypatch)
    arm = tmp_path / ARM
    checkpoint = arm / "checkpoint"
    bad = damage(checkpoint)
    bad_files = _tree_digest(bad)

    trainer.Trainer(_config(warmup_dir, tmp_path), progress=False).run()  # the same command again

    assert json.loads((arm / resume.DONE_FILE).read_text())["steps"] == STEPS
    # Bit for bit the uninterrupted run: metrics, per-update lines and the final state's digests
    # (SHA-256 of every parameter and optimizer leaf, and of the metadata).
    for name in ("metrics.jsonl", trainer.UPDATES_FILE):
        assert _records(arm / "seed0" / name) == _records(uninterrupted / "seed0" / name), name
    final = f"{STEPS - 1}{CHECKSUM_SUFFIX}"
    assert json.loads((checkpoint / final).read_text()) == json.loads((uninterrupted / "checkpoint" / final).read_text())

    # The bad step was moved aside unchanged, with its checksums, and nothing else is left over.
    kept = checkpoint / DAMAGED_DIR / f"{DAMAGED_STEP}-1"
    assert _tree_digest(kept) == bad_files
    assert (checkpoint / DAMAGED_DIR / f"{DAMAGED_STEP}-1{CHECKSUM_SUFFIX}").is_file()
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted(
        [DAMAGED_DIR, *(f"{s}{suffix}" for s in (STEPS - 2, STEPS - 1) for suffix in ("", CHECKSUM_SUFFIX))])

    # The log names both paths; the run directory's recovery record holds the move.
    log = (arm / "train.log").read_text()
    assert f"{bad} -> {kept}" in log, log
    assert f"resuming from step {DAMAGED_STEP} (checkpoint of step {DAMAGED_STEP - 1}" in log
    (line,) = [json.loads(x) for x in (arm / resume.RECOVERY_FILE).read_text().splitlines()]
    assert (line["step"], line["moved"], line["to"], line["resumed_from"]) == (DAMAGED_STEP, str(bad), str(kept),
                                                                              DAMAGED_STEP - 1)
    assert line["reason"]
    assert not (arm / resume.CHANGES_FILE).exists()  # no setting changed


def test_a_run_with_no_good_step_stops_and_moves_nothing(warmup_dir, tmp_path, monkeypatch):
    """Every step damaged: starting over would silently throw the run away, so the rerun stops
    naming the steps, and leaves them where they are."""
    _run_interrupted(warmup_dir, tmp_path, monkeypatch)
    checkpoint = tmp_path / ARM / "checkpoint"
    for step in (DAMAGED_STEP - 1, DAMAGED_STEP):
        _flip_a_byte(_largest_data_file(checkpoint / str(step)))
    before = _tree_digest(checkpoint)
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError, match="no good checkpoint step.*nothing was moved"):
        trainer.Trainer(_config(warmup_dir, tmp_path), progress=False).run()
    assert _tree_digest(checkpoint) == before
    assert not (checkpoint / DAMAGED_DIR).exists()
