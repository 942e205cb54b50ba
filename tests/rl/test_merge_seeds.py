"""Merging the seeds of a second ablation run into a first: only under equal settings and new seed
numbers, refused before anything is written, and visible in the report's settings section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import merge_seeds as merge_seeds_cli
from fp4rl.analysis.runs import load_run
from fp4rl.analysis.synthetic import make_synthetic_run, synthetic_recipe
from fp4rl.rl import merge_seeds
from fp4rl.studies import ablation

STEPS = 30


def _run(out: Path, arms, seeds, lr=3e-5, seed_offset=0) -> Path:
    """A finished synthetic run as the trainer leaves one: metrics, config.json, done.json, train.log."""
    make_synthetic_run(out, arms, seeds=seeds, steps=STEPS)
    for arm in arms:
        rl = {"arm": arm, "seeds": len(seeds), "seed_offset": seed_offset, "steps": STEPS, "optim": {"lr": lr},
              "out": str(out), "checkpoint_every": 20}
        record = {"rl_config": rl, "recipe": synthetic_recipe(arm), "model_config": {"num_layers": 8}}
        (out / arm / "config.json").write_text(json.dumps(record))
        (out / arm / "done.json").write_text(json.dumps({"steps": STEPS, "seeds": list(seeds)}))
        (out / arm / "train.log").write_text(f"{arm} seeds {list(seeds)}\n")
    return out


def test_seeds_of_a_second_run_join_the_first(tmp_path):
    dst = _run(tmp_path / "dst", ["bf16", "full"], [0, 1])
    src = _run(tmp_path / "src", ["bf16", "full", "full-hp"], [2, 3], seed_offset=2)
    (src / "full" / "checkpoint").mkdir()  # never copied
    added = merge_seeds.merge(src, dst)
    assert added == {"bf16": [2, 3], "full": [2, 3], "full-hp": [2, 3]}
    run = load_run(dst)
    assert sorted(run.arms["full"]) == [0, 1, 2, 3] and sorted(run.arms["full-hp"]) == [2, 3]
    assert json.loads((dst / "full" / "done.json").read_text())["seeds"] == [0, 1, 2, 3]
    assert (dst / "full" / "train_seeds2-3.log").read_text() == "full seeds [2, 3]\n"
    assert (dst / "full" / "train.log").read_text() == "full seeds [0, 1]\n"
    assert not (dst / "full-hp" / "checkpoint").exists()
    settings = ablation.settings_text(dst)
    assert f"  seeds 2, 3 merged from {src / 'full'} (seed_offset 2, settings otherwise equal)" in settings


@pytest.mark.parametrize("change, message", [
    (dict(lr=1e-4), r"other settings than .*: optim\.lr: 3e-05 -> 0\.0001"),
    (dict(seeds=[1, 2], seed_offset=1), r"both hold seed\(s\) \[1\]; run the new seeds with --rl\.seed_offset"),
])
def test_a_merge_that_would_mix_runs_is_refused_before_anything_is_written(tmp_path, change, message):
    dst = _run(tmp_path / "dst", ["bf16", "full"], [0, 1])
    seeds = change.pop("seeds", [2, 3])
    src = _run(tmp_path / "src", ["bf16", "full"], seeds, **change)
    (src / "bf16" / "config.json").write_text((dst / "bf16" / "config.json").read_text()
                                              .replace('"seed_offset": 0', f'"seed_offset": {seeds[0]}'))
    before = {p: p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=message):
        merge_seeds.merge(src, dst)
    assert {p: p.read_bytes() for p in dst.rglob("*") if p.is_file()} == before  # bf16 passed, full did not


def test_cli_names_an_unfinished_arm(tmp_path, capsys):
    dst = _run(tmp_path / "dst", ["bf16"], [0, 1])
    src = _run(tmp_path / "src", ["bf16"], [2, 3], seed_offset=2)
    with pytest.raises(ValueError, match=r"no finished arm \['full'\] in .* \(finished there: \['bf16'\]\)"):
        merge_seeds_cli.main([str(src), str(dst), "--arms", "full"])
    merge_seeds_cli.main([str(src), str(dst)])
    assert "bf16: seeds [2, 3]" in capsys.readouterr().out


def _edit(arm_dir: Path, rl: dict | None = None, drop: tuple[str, ...] = (), **top) -> None:
    record = json.loads((arm_dir / "config.json").read_text())
    record["rl_config"] = {k: v for k, v in {**record["rl_config"], **(rl or {})}.items() if k not in drop}
    (arm_dir / "config.json").write_text(json.dumps({**record, **top}))


def test_a_setting_added_later_matches_at_its_default_and_not_otherwise(tmp_path):
    dst = _run(tmp_path / "dst", ["bf16"], [0, 1])  # an older record: no trim_padding
    src = _run(tmp_path / "src", ["bf16"], [2, 3], seed_offset=2)
    _edit(src / "bf16", {"trim_padding": True})
    with pytest.raises(ValueError, match=r'trim_padding: "<absent>" -> true'):
        merge_seeds.merge(src, dst)
    _edit(src / "bf16", {"trim_padding": False})  # RLConfig's default: what the older run ran under
    _edit(dst / "bf16", {"retired_setting": 1})  # a field RLConfig no longer has: no default excuses it
    with pytest.raises(ValueError, match=r'retired_setting: 1 -> "<absent>"'):
        merge_seeds.merge(src, dst)
    _edit(dst / "bf16", drop=("retired_setting",))
    assert merge_seeds.merge(src, dst) == {"bf16": [2, 3]}


@pytest.mark.parametrize("dst_sha, src_sha, given, merges", [
    ("aa", "aa", "", True),     # both records name the warm-up: equal
    ("aa", "bb", "", False),    # two warm-ups
    (None, None, "", False),    # older records and no digest given: the folder is all there is
    (None, None, "aa", True),   # older records, the digest the calls checked
    (None, "bb", "aa", False),  # the digest given is not the recorded one
])
def test_init_may_differ_only_for_one_warm_up(tmp_path, dst_sha, src_sha, given, merges):
    dst = _run(tmp_path / "dst", ["bf16"], [0, 1])
    src = _run(tmp_path / "src", ["bf16"], [2, 3], seed_offset=2)
    for arm_dir, init, sha in ((dst / "bf16", "/tmp/a/sft", dst_sha), (src / "bf16", "/tmp/b/sft", src_sha)):
        _edit(arm_dir, {"init": init}, **({} if sha is None else {"warmup_sha256": sha}))
    if not merges:
        with pytest.raises(ValueError, match=r'init: "/tmp/a/sft" -> "/tmp/b/sft"'):
            merge_seeds.merge(src, dst, warmup_sha256=given)
        return
    merge_seeds.merge(src, dst, warmup_sha256=given)
    entry = json.loads((dst / "bf16" / "config.json").read_text())[merge_seeds.MERGED_KEY][0]
    assert entry["warmup_sha256"] == (src_sha or given)
    assert "the same warm-up, aa..., from another folder" in ablation.settings_text(dst)
