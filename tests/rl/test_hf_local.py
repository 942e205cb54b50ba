"""fp4rl.model.hf_local: the locally made Hugging Face checkpoints and DAPO-Math-style rows."""

import json

import pytest

from experiments import hf_local as hf_local_cli
from fp4rl.model import hf_local
from fp4rl.model.hf import config_from_hf
from fp4rl.rl import math_file


def test_300m_size_is_a_few_hundred_million_parameters_at_8k_positions():
    config = config_from_hf(hf_local.hf_config("qwen3_moe", 384, "300m"))
    count = config.param_count()
    assert 250e6 < count.total < 400e6 and 50e6 < count.active < 150e6, count
    assert config.max_seq_len == 8192  # the `hf` preset's 1k prompt + 7k response


def test_unknown_size_and_model_type_name_the_valid_ones():
    with pytest.raises(ValueError, match="valid sizes: tiny, 300m"):
        hf_local.hf_config("qwen3_moe", 384, "1b")
    with pytest.raises(ValueError, match="valid: qwen3_moe, qwen2_moe"):
        hf_local.hf_config("llama", 384)


def test_cli_writes_a_checkpoint_and_rows_the_loader_reads(tmp_path):
    hf_local_cli.main([str(tmp_path / "ckpt"), "--rows", str(tmp_path / "rows.jsonl"), "--num_rows", "12"])
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["num_hidden_layers"] == 2
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {r["reward_model"]["ground_truth"] for r in rows} <= {"4", "5"}
    data = math_file.load_math_rows(tmp_path / "rows.jsonl")
    assert len(data.prompts) == 12 and not any(data.dropped.values())
