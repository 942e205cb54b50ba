"""The choice of the long-horizon band to run RL on (fp4rl.analysis.band)."""

from __future__ import annotations

import json

import pytest

from experiments import band as band_cli
from fp4rl.analysis import band


def _warmup(tmp_path, name, sampled):
    d = tmp_path / name
    d.mkdir()
    rows = [{"difficulty": 2 + i, "sampled": s, "greedy": s, "n": 512} for i, s in enumerate(sampled)]
    (d / "sft_meta.json").write_text(json.dumps({"accuracy": rows}))
    return str(d)


def test_band_accuracy_weighs_levels_equally(tmp_path):
    assert band.band_accuracy(_warmup(tmp_path, "w", [0.5, 0.1, 0.0, 0.2])) == pytest.approx(0.2)


def test_inside_keeps_every_candidate_in_the_band_edges_included():
    accuracies = {"first": 0.5, "second": 0.3, "low_edge": 0.2, "high_edge": 0.45, "low": 0.19}
    assert band.inside(accuracies) == ["second", "low_edge", "high_edge"]
    assert band.inside({"low": 0.09, "high": 0.52}) == []


def test_cli_prints_the_chosen_and_skips_unfinished(tmp_path, capsys):
    low = _warmup(tmp_path, "low", [0.2, 0.1, 0.0, 0.0])
    good = _warmup(tmp_path, "good", [0.6, 0.4, 0.2, 0.1])
    missing = str(tmp_path / "missing")
    table = tmp_path / "band.md"
    band_cli.main([missing, low, good, f"--table={table}"])
    out, err = capsys.readouterr()
    assert out.split() == [good]
    assert "holds no finished warm-up" in err and missing in err
    text = table.read_text()
    assert "| 0.325 | yes |" in text and "| 0.075 | no |" in text and "2: 0.600" in text


def test_cli_exits_1_when_no_warm_up_is_inside(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        band_cli.main([_warmup(tmp_path, "low", [0.1, 0.0])])
    assert exit_info.value.code == 1
    assert capsys.readouterr().out.strip() == ""


def test_cli_fails_loudly_without_any_finished_warm_up(tmp_path):
    with pytest.raises(SystemExit, match="none of the warm-ups finished"):
        band_cli.main([str(tmp_path / "nothing")])
