"""The fit's extrapolation target: Qwen3-30B-A3B's config.json fixture, read through fp4rl.model.hf."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp4rl.analysis import rl_memory, scaling
from fp4rl.model.config import ModelConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen3_30b_a3b" / "config.json"


def test_the_fixture_is_qwen3_30b_a3b_as_hf_reads_it():
    mc = scaling.PaperSetting(hf_config=str(FIXTURE)).model
    assert (mc.num_layers, mc.d_model, mc.num_experts, mc.moe_d_ff, mc.top_k) == (48, 2048, 128, 768, 8)
    assert (mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size) == (32, 4, 128, 151936)
    assert mc.shared_expert_d_ff == 0 and not mc.shared_expert_gate and mc.dense_layers == () and mc.qk_norm
    assert mc.param_count().total == pytest.approx(30.5e9, rel=0.01)
    # the config the RL memory table uses is the same model
    assert mc == rl_memory.qwen3_30b_a3b()


def test_the_target_keeps_7_of_48_layers_and_nothing_else_in_bf16():
    summary = scaling.PaperSetting().summary()  # the default target is the fixture
    assert summary["kept_bf16_layers"] == 7 and summary["shared_expert_d_ff"] == 0
    assert summary["hf_config"] == scaling.TARGET_CONFIG and json.loads(FIXTURE.read_text())["num_experts"] == 128


def test_the_widest_rung_is_the_targets_layer_at_6_layers():
    widest, target = ModelConfig.from_name("ladder-w2048-l6"), scaling.PaperSetting().model
    for field in ("d_model", "num_experts", "moe_d_ff", "top_k", "num_heads", "num_kv_heads", "head_dim",
                  "shared_expert_d_ff", "norm_topk_prob"):
        assert getattr(widest, field) == getattr(target, field), field
    assert widest.num_layers == 6
    assert scaling.PaperSetting().params_at_depth(6) == ModelConfig.from_name(
        "ladder-w2048-l6", vocab_size=151936, qk_norm=True).param_count().total
