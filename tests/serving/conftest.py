"""Shared by tests/serving: the smoke warm-up, trained once per session (~15 s on CPU), is the
trained checkpoint every serving test loads from disk."""

from __future__ import annotations

import dataclasses

import pytest

from experiments import sft as sft_experiment
from fp4rl.rl import sft


@pytest.fixture(scope="session")
def warmup_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving_sft")
    sft.train(dataclasses.replace(sft_experiment.PRESETS["smoke"], out=str(out)), progress=False)
    return out
