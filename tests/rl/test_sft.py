"""The warm-up never writes new settings beside old weights: a finished warm-up of the same
settings is returned as it is, of other settings (or a checkpoint without metadata) refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fp4rl import configs
from fp4rl.rl import sft


def _config(out, **overrides) -> sft.SFTConfig:
    return dataclasses.replace(configs.SFT_PRESETS["smoke"], out=str(out), **overrides)


def _finished(out, config: sft.SFTConfig) -> dict:
    """A finished warm-up's metadata (no training: what `train` checks is the metadata)."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"sft_config": sft.settings(config), "train_seconds": 1.5}
    (out / sft.META_FILE).write_text(json.dumps(meta))
    return meta


def test_a_finished_warm_up_of_other_settings_is_refused(tmp_path):
    out = tmp_path / "sft"
    meta = _finished(out, _config(out))
    with pytest.raises(ValueError, match=rf"{out} holds a finished warm-up of other settings \(lr: 0.003 -> 0.01, "
                                         r"steps: 20 -> 40\); delete it or choose another --out"):
        sft.train(_config(out, lr=1e-2, steps=40), progress=False)
    assert json.loads((out / sft.META_FILE).read_text()) == meta


def test_a_finished_warm_up_of_the_same_settings_is_returned_untouched(tmp_path):
    out = tmp_path / "sft"
    meta = _finished(tmp_path / "elsewhere", _config(tmp_path / "elsewhere"))  # a moved directory: `out` may differ
    (tmp_path / "elsewhere").rename(out)
    assert sft.train(_config(out), progress=False) == meta
    assert not (out / "checkpoint").exists()  # nothing trained or saved


def test_a_checkpoint_without_metadata_is_refused(tmp_path):
    out = tmp_path / "sft"
    (out / "checkpoint" / "20").mkdir(parents=True)
    with pytest.raises(ValueError, match=f"{out / 'checkpoint'} exists but {out / sft.META_FILE} does not"):
        sft.train(_config(out), progress=False)


def test_damaged_metadata_names_its_file(tmp_path):
    out = tmp_path / "sft"
    out.mkdir()
    (out / sft.META_FILE).write_text('{"model_config": {')
    with pytest.raises(ValueError, match=f"{out / sft.META_FILE}: unreadable JSON"):
        sft.load(out)
