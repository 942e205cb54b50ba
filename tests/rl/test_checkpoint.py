"""Checkpoints are verified on restore: damaged steps are named and skipped, never restored as
garbage, and moved aside (kept) for a writer that saves them again; damaged JSON beside a run
names its file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fp4rl.rl.checkpoint import CHECKSUM_SUFFIX, DAMAGED_DIR, CheckpointError, Checkpointer, CheckpointWarning
from fp4rl.run_files import read_json


def _state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(4000).astype(np.float32), "b": np.full((3, 3), step, np.float32)}


def _saved(tmp_path: Path, steps=(0, 1, 2), max_to_keep: int = 3) -> Path:
    directory = tmp_path / "checkpoint"
    ckpt = Checkpointer(directory, max_to_keep=max_to_keep)
    for step in steps:
        ckpt.save(step, _state(step), {"step": step})
    ckpt.close()
    return directory


def _largest_data_file(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _restore_latest(directory: Path):
    ckpt = Checkpointer(directory, max_to_keep=3)
    try:
        return ckpt.restore_latest(_state(0))
    finally:
        ckpt.close()


def _assert_state(state, step):
    for key, want in _state(step).items():
        np.testing.assert_array_equal(np.asarray(state[key]), want)


def test_a_good_checkpoint_restores_its_values(tmp_path):
    restored = _restore_latest(_saved(tmp_path))
    assert restored.step == 2 and restored.meta == {"step": 2} and restored.skipped == ()
    _assert_state(restored.state, 2)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _swap_in_step_1(step_dir: Path) -> None:  # valid files, other values: orbax cannot notice
    shutil.rmtree(step_dir / "state")
    shutil.copytree(step_dir.parent / "1" / "state", step_dir / "state")


@pytest.mark.parametrize("damage", [_flip_a_byte, _truncate, _swap_in_step_1])
def test_a_damaged_latest_step_is_named_and_the_previous_one_restored(tmp_path, damage):
    """A flipped byte restores through orbax without any error, as other values: only the checksum
    sees it. The run goes on from the previous good step, with a warning naming the bad one."""
    directory = _saved(tmp_path)
    damage(directory / "2" if damage is _swap_in_step_1 else _largest_data_file(directory / "2"))
    with pytest.warns(CheckpointWarning, match=f"skipping checkpoint step 2: {directory / '2'}"):
        restored = _restore_latest(directory)
    assert restored.step == 1 and len(restored.skipped) == 1
    _assert_state(restored.state, 1)


def test_no_good_step_is_an_error(tmp_path):
    directory = _saved(tmp_path, steps=(0,))
    _flip_a_byte(_largest_data_file(directory / "0"))
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError, match="no good checkpoint step"):
        _restore_latest(directory)


def test_damaged_metadata_names_its_file(tmp_path):
    directory = _saved(tmp_path, steps=(0,))
    meta = directory / "0" / "meta" / "metadata"
    meta.write_text(meta.read_text()[:3])
    ckpt = Checkpointer(directory)
    with pytest.raises(CheckpointError, match=f"{directory / '0' / 'meta'}: unreadable JSON"):
        ckpt.restore(0, _state(0))
    ckpt.close()


def test_a_step_without_its_checksum_is_not_trusted(tmp_path):
    directory = _saved(tmp_path, steps=(0, 1))
    (directory / f"1{CHECKSUM_SUFFIX}").unlink()
    with pytest.warns(CheckpointWarning, match="cannot be verified"):
        assert _restore_latest(directory).step == 0


def test_checksums_of_deleted_steps_are_removed(tmp_path):
    directory = _saved(tmp_path, steps=(0, 1, 2), max_to_keep=2)
    assert sorted(p.name for p in directory.glob(f"*{CHECKSUM_SUFFIX}")) == [f"1{CHECKSUM_SUFFIX}", f"2{CHECKSUM_SUFFIX}"]


def test_saving_a_step_twice_is_an_error_not_a_no_op(tmp_path):
    """orbax's save() returns False for a step that exists and keeps the old values; ignoring
    that would write new metadata beside old weights."""
    directory = _saved(tmp_path, steps=(0,))
    ckpt = Checkpointer(directory)
    with pytest.raises(CheckpointError, match="exists already"):
        ckpt.save(0, _state(5), {"step": 0})
    ckpt.close()
    _assert_state(_restore_latest(directory).state, 0)


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_writer_moves_a_damaged_step_aside_and_can_save_it_again(tmp_path):
    directory = _saved(tmp_path)
    _flip_a_byte(_largest_data_file(directory / "2"))
    bad = _files(directory / "2")
    with pytest.warns(CheckpointWarning):  # a reader leaves the directory as it is
        assert _restore_latest(directory).set_aside == ()
    assert _files(directory / "2") == bad

    ckpt = Checkpointer(directory, max_to_keep=3)
    with pytest.warns(CheckpointWarning, match=f"moved aside and kept: {directory / '2'} -> {directory / DAMAGED_DIR / '2-1'}"):
        restored = ckpt.restore_latest(_state(0), set_aside=True)
    (moved,) = restored.set_aside
    assert (restored.step, moved.step, moved.to) == (1, 2, directory / DAMAGED_DIR / "2-1")
    assert "differ from the SHA-256" in moved.reason
    assert _files(moved.to) == bad and (directory / DAMAGED_DIR / f"2-1{CHECKSUM_SUFFIX}").is_file()
    assert ckpt.steps() == [0, 1]
    ckpt.save(2, _state(2), {"step": 2})  # the step is free again; an intact one never is
    with pytest.raises(CheckpointError, match="exists already"):
        ckpt.save(2, _state(2), {"step": 2})

    _flip_a_byte(_largest_data_file(directory / "2"))  # damaged again: kept beside the first copy
    with pytest.warns(CheckpointWarning):
        assert ckpt.restore_latest(_state(0), set_aside=True).set_aside[0].to == directory / DAMAGED_DIR / "2-2"
    ckpt.close()
    assert _restore_latest(directory).step == 1  # orbax never takes the kept copies for steps


def test_no_good_step_moves_nothing(tmp_path):
    directory = _saved(tmp_path, steps=(0,))
    _flip_a_byte(_largest_data_file(directory / "0"))
    before = _files(directory)
    ckpt = Checkpointer(directory)
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError, match="no good checkpoint step.*nothing was moved"):
        ckpt.restore_latest(_state(0), set_aside=True)
    ckpt.close()
    assert _files(directory) == before


def test_uncommitted_saves_are_moved_aside_with_only_their_own_checksums(tmp_path):
    """orbax writes a step under a temporary name and renames it at commit: a kill mid-write leaves
    that directory, which orbax never lists. The checksums beside it belong to it unless the
    step was committed since (a later save of the same step)."""
    directory = _saved(tmp_path, steps=(0, 1, 2))
    shutil.copytree(directory / "2", directory / "2.orbax-checkpoint-tmp-1")  # an earlier save of 2, cut short
    (directory / "1").rename(directory / "1.orbax-checkpoint-tmp-2")  # the latest save of 1, cut short
    ckpt = Checkpointer(directory, max_to_keep=3)
    assert ckpt.uncommitted() == [directory / "1.orbax-checkpoint-tmp-2", directory / "2.orbax-checkpoint-tmp-1"]
    with pytest.warns(CheckpointWarning, match="a save orbax never committed"):
        moved = ckpt.set_aside_uncommitted()
    assert [(m.step, m.to.name) for m in moved] == [(1, "1-1"), (2, "2-1")]
    assert ckpt.uncommitted() == [] and ckpt.steps() == [0, 2]
    assert sorted(p.name for p in (directory / DAMAGED_DIR).iterdir()) == ["1-1", f"1-1{CHECKSUM_SUFFIX}", "2-1"]
    ckpt.close()
    assert _restore_latest(directory).step == 2  # step 2 kept its checksums


def test_damaged_json_names_its_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"rl_config": {"steps": 1')
    with pytest.raises(ValueError, match=f"{path}: unreadable JSON"):
        read_json(path)
