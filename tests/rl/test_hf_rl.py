"""RL from a Hugging Face Qwen-MoE checkpoint on DAPO-Math rows (docs/rl.md "From a Hugging Face
checkpoint"): the command of the `hf` preset runs on local fixtures (fp4rl/model/hf_local.py), a
resumed run equals an uninterrupted one, the trained policy exports as a Hugging Face folder that
imports with identical logits and serves, and bad inputs stop the run with one line naming them.
The run on 8 devices: tests/parallel/multidevice/test_micro_batch_mesh.py."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from experiments import rl as rl_command
from fp4rl import configs
from fp4rl.config_cli import parse
from fp4rl.model import hf
from experiments import hf_export
from fp4rl.rl import run_inputs, trainer
from fp4rl.rl.hf_tokenizer import HFCodec
from fp4rl.serving import checkpoints
from fp4rl.model.hf_local import ROWS, dapo_row, write_checkpoint, write_rows

TIMING = ("time/", "throughput/")
# The preset's update memory options stay on (remat, query chunks), micro-batches scaled to the 4 rows
# of a mini-batch: the command and the resumed run below go through the micro-batched update.
SMALL = ["--steps=2", "--group_size=4", "--prompts_per_step=2", "--mini_batches=2", "--max_gen_batches=1",
         "--max_new_tokens=8", "--overlong_buffer=4", "--prompt_len=48", "--model.dtype=float32", "--impl=reference",
         "--arm=full", "--memory.micro_batches=2", "--memory.attention_query_chunk=16"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_rl")
    return {"ckpt": write_checkpoint(root / "qwen3"), "jsonl": write_rows(root / "rows.jsonl"),
            "parquet": write_rows(root / "rows.parquet"), "root": root}


def _config(files, out, **kw) -> trainer.RLConfig:
    settings = dict(steps=2, group_size=4, prompts_per_step=2, mini_batches=2, max_gen_batches=1, max_new_tokens=8,
                    overlong_buffer=4, prompt_len=48, impl="reference", arm="full", init="",
                    model=trainer.ModelSource(hf=str(files["ckpt"])), data_file=str(files["jsonl"]), out=str(out))
    return trainer.RLConfig(**{**settings, **kw})


def _records(arm_dir) -> list[dict]:
    lines = (arm_dir / "seed0" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)} for line in lines]


def test_the_codec_renders_the_chat_template_and_stops_on_every_stop_token(files):
    codec = HFCodec.from_dir(files["ckpt"])
    tok = codec.tokenizer
    assert codec.render("What is 2 + 2?") == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert codec.stop_ids == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    # the tokenizer's pad token, a stop token too but not the sampler's EOS (which would read as stopped)
    assert codec.pad_id == tok.token_to_id("<|endoftext|>") != codec.stop_ids[0]
    answer = tok.token_to_id("\\boxed{4}")
    for stop in codec.stop_ids:
        assert codec.decode([answer, stop, answer, answer]) == "\\boxed{4}"


def test_the_hf_command_trains_resumes_exports_and_serves(files, tmp_path):
    """The `hf` preset's command (parquet rows) for 2 steps, against the same run through the API
    (JSONL rows) stopped after step 0 and resumed: the same metrics; then export and serving."""
    command_out = tmp_path / "command"
    argv = ["--preset", "hf", f"--model.hf={files['ckpt']}", *SMALL, "--checkpoint_every=1"]
    rl_command.main([*argv, f"--rl.data_file={files['parquet']}", f"--rl.out={command_out}"])
    uninterrupted = _records(command_out / "full")
    assert len(uninterrupted) == 2 and sum(r["updates/applied"] for r in uninterrupted) > 0  # the fixture's groups vary
    record = json.loads((command_out / "full" / "config.json").read_text())
    assert record["layer_map"] == {"num_layers": 2, "bf16_layers": [1], "summary": "1 of 2 layers kept in BF16 (50.0%)",
                                   "routed_experts": "nvfp4", "shared_expert": None}
    assert record["codec"] == f"hf:{files['ckpt']}" and record["rl_config"]["init"] == ""

    api = parse(trainer.RLConfig, [*argv, f"--data_file={files['jsonl']}", f"--out={tmp_path / 'api'}"],
                configs.RL_PRESETS)
    trainer.Trainer(dataclasses.replace(api, steps=1), progress=False).run()
    trainer.Trainer(api, progress=False).run()
    assert _records(tmp_path / "api" / "full") == uninterrupted

    # The trained policy (seed 0, last step) as a Hugging Face folder: same parameters, same logits.
    out = tmp_path / "export"
    hf_export.main([str(command_out / "full"), str(files["ckpt"]), str(out)])
    trained = checkpoints.load(command_out / "full")
    exported = hf.from_pretrained(str(out))
    for a, b in zip(jax.tree.leaves(trained.params), jax.tree.leaves(exported.params), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    start = hf.from_pretrained(str(files["ckpt"]))
    tokens = np.asarray([HFCodec.from_dir(out).encode_prompt("What is 9 - 5?")])
    tuned = dataclasses.replace(start, params=trained.params)
    assert np.asarray(exported(tokens)).tobytes() == np.asarray(tuned(tokens)).tobytes()
    assert not np.array_equal(np.asarray(exported(tokens)), np.asarray(start(tokens)))  # RL changed the policy
    served = checkpoints.load(out)  # what `experiments.serve --checkpoint OUT` loads
    assert served.kind == "hf" and served.text
    assert served.stop_ids == HFCodec.from_dir(out).stop_ids  # the server stops where the RL sampler stopped
    assert served.decode(served.encode("What is 9 - 5?")) == "What is 9 - 5?"


def _one_line_input_error(config, match):
    with pytest.raises(run_inputs.InputError, match=match) as info:
        run_inputs.load(config)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad_row, match", [
    ("{\"prompt\": [{\"role\": \"user\", \"content\": \"1+1?\"}], ", r"rows.jsonl:3: malformed row, not JSON"),
    (json.dumps({"question": "1+1?", "reward_model": {"ground_truth": "2"}}), r"rows.jsonl:3: malformed row, it lacks prompt_key"),
])
def test_a_malformed_row_stops_the_run_with_one_line(files, tmp_path, bad_row, match):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]) + bad_row + "\n")
    _one_line_input_error(_config(files, tmp_path / "run", data_file=str(path)), match)


def test_a_malformed_parquet_row_names_its_row(files, tmp_path):
    path = write_rows(tmp_path / "rows.parquet", [dapo_row("2+2?", 4), {**dapo_row("3+3?", 6), "prompt": None}])
    _one_line_input_error(_config(files, tmp_path / "run", data_file=str(path)), r"rows.parquet: 1 usable rows of 2 "
                          r"\(dropped: bad_prompt 1\), fewer than prompts_per_step=2")


@pytest.mark.parametrize("missing, match", [
    ("tokenizer.json", r"tokenizer.json not found: the checkpoint's tokenizer is read from a tokenizer.json"),
    ("chat_template", r"no chat template; expected a `chat_template` string in tokenizer_config.json or a "
                      r"chat_template.jinja file"),
])
def test_missing_tokenizer_files_stop_the_run_with_one_line(files, tmp_path, missing, match):
    ckpt = write_checkpoint(tmp_path / "ckpt", template=missing != "chat_template")
    if missing == "tokenizer.json":
        (ckpt / "tokenizer.json").unlink()
    _one_line_input_error(dataclasses.replace(_config(files, tmp_path / "run"), model=trainer.ModelSource(hf=str(ckpt))),
                          match)


def test_the_command_refuses_a_run_without_or_with_two_initial_policies(files, capsys):
    for argv in (["--preset", "hf"], ["--preset", "hf", f"--model.hf={files['ckpt']}", "--init=runs/sft"]):
        with pytest.raises(SystemExit) as info:
            rl_command.main(argv)
        assert info.value.code == 2
        assert "set exactly one initial policy" in capsys.readouterr().err


def test_a_sequence_past_the_checkpoint_context_is_refused(files, tmp_path):
    config = dataclasses.replace(_config(files, tmp_path / "run"), max_new_tokens=240, overlong_buffer=4)
    _one_line_input_error(config, r"prompt_len \+ max_new_tokens = 48 \+ 240 = 288 exceeds the checkpoint's context, "
                                  r"max_position_embeddings=256")
