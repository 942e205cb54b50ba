"""Held-out evaluation of a data-file run on an eval file (docs/rl.md "From a Hugging Face checkpoint"):
a run from the fixture checkpoint (fp4rl/model/hf_local.py) logs the procedural evaluation's metrics,
which the learning analysis reads unchanged; the same run twice logs the same values; bad eval
settings and files stop the run with one line naming them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fp4rl.analysis import learning
from fp4rl.rl import run_inputs, trainer
from fp4rl.model.hf_local import dapo_row, write_checkpoint, write_rows

TIMING = ("time/", "throughput/")
ACCURACIES = ("eval/accuracy", "eval/sampled_accuracy", "eval/greedy_miscopied", "eval/greedy_wrong_chain",
              "eval/sampled_miscopied", "eval/sampled_wrong_chain")
# Held-out rows unlike the training rows: three the fixture's policy can answer (4 or 5), one it cannot
# (7), and two the verifier cannot judge (dropped, as math_file drops training rows).
HELD_OUT = [dapo_row("What is 1 + 3?", 4), dapo_row("What is 10 / 2?", 5), dapo_row("Find 8 - 1.", 7),
            dapo_row("What is a third of 1?", "1/3"), dapo_row("Compute 3 * 3 - 5.", 4),
            dapo_row("What is pi to two places?", "3.14")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_eval")
    return {"ckpt": write_checkpoint(root / "qwen3"), "train": write_rows(root / "train.jsonl"),
            "eval": write_rows(root / "eval.parquet", HELD_OUT)}


def _config(files, out, **kw) -> trainer.RLConfig:
    settings = dict(steps=2, group_size=4, prompts_per_step=2, mini_batches=2, max_gen_batches=1, max_new_tokens=8,
                    overlong_buffer=4, prompt_len=48, impl="reference", arm="full", init="",
                    model=trainer.ModelSource(hf=str(files["ckpt"])), data_file=str(files["train"]),
                    eval_file=str(files["eval"]), eval_every=1, eval_prompts=3, out=str(out))
    return trainer.RLConfig(**{**settings, **kw})


def _records(arm_dir) -> list[dict]:
    lines = (arm_dir / "seed0" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)} for line in lines]


def test_a_data_file_run_evaluates_the_first_rows_of_its_eval_file(files, tmp_path):
    trainer.Trainer(_config(files, tmp_path / "a"), progress=False).run()
    trainer.Trainer(_config(files, tmp_path / "b"), progress=False).run()
    first, second = _records(tmp_path / "a" / "full"), _records(tmp_path / "b" / "full")
    assert len(first) == 2
    # The initial policy with step 0, then after every step (eval_every=1, the last step too).
    initial = {k.replace("eval/", "eval/initial_") for k in ACCURACIES}
    assert initial <= first[0].keys() and all(set(ACCURACIES) <= r.keys() for r in first)
    for r in first:
        for k in [*ACCURACIES, *(initial & r.keys())]:
            assert 0.0 <= r[k] <= 1.0, (k, r[k])
        assert r["eval/n"] == 3  # eval_prompts of the 4 usable held-out rows
    assert first[0]["eval/initial_n"] == 3
    assert first == second  # same keys every evaluation: identical runs log identical values
    log = (tmp_path / "a" / "full" / "train.log").read_text()
    assert f"held-out evaluation every 1 steps and at the last: 3 rows of {files['eval']}" in log
    # The learning analysis reads the run as it reads a procedural one.
    summary = learning.summarize(tmp_path / "a" / "full")
    assert list(summary.curves[0].steps) == [0, 1, 2] and list(summary.curves[0].n) == [3, 3, 3]
    assert summary.curves[0].sampled[0] == first[0]["eval/initial_sampled_accuracy"]


def _one_line(error_type, match, make):
    with pytest.raises(error_type, match=match) as info:
        make()
    assert "\n" not in str(info.value)


def test_bad_eval_files_stop_the_run_with_one_line(files, tmp_path):
    missing = tmp_path / "missing.jsonl"
    _one_line(run_inputs.InputError, rf"{missing}: cannot read the file \(No such file or directory\)",
              lambda: run_inputs.load(_config(files, tmp_path / "run", eval_file=str(missing))))
    unusable = write_rows(tmp_path / "unusable.jsonl", [dapo_row("What is 1/2 + 1/4?", "3/4")])
    _one_line(run_inputs.InputError, rf"eval_file {unusable}: no usable row of 1 \(dropped: not_integer 1\)",
              lambda: run_inputs.load(_config(files, tmp_path / "run", eval_file=str(unusable))))
    wrong_suffix = tmp_path / "rows.csv"
    wrong_suffix.write_text("prompt,answer\n")
    _one_line(run_inputs.InputError, r"must end in .jsonl, .json \(JSON lines\) or .parquet",
              lambda: run_inputs.load(_config(files, tmp_path / "run", eval_file=str(wrong_suffix))))


@pytest.mark.parametrize("changes, match", [
    (dict(eval_file=""), r"eval_every=1 with data_file=.* needs eval_file=FILE"),
    (dict(eval_every=0), r"eval_file=.* is read by the held-out evaluation only: set eval_every > 0"),
    (dict(data_file=""), r"eval_file=.* holds held-out rows for a data_file run"),
])
def test_eval_settings_that_cannot_evaluate_are_refused(files, tmp_path, changes, match):
    config = _config(files, tmp_path / "run")
    _one_line(ValueError, match, lambda: dataclasses.replace(config, **changes))
