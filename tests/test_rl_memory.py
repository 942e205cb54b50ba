"""The memory table of docs/parallel.md: Qwen3-30B-A3B's shapes as the code builds them."""

from pathlib import Path

import pytest

from experiments import rl_memory as rl_memory_cli
from fp4rl.analysis import rl_memory


def test_qwen3_30b_a3b_has_the_parameters_of_its_model_card():
    count = rl_memory.qwen3_30b_a3b().param_count()
    assert count.total == pytest.approx(30.5e9, rel=0.01)
    # 3.353B counted with the embedding row and the head; the card's "3.3B activated" has two
    # significant digits, so the bound is its rounding (3.25-3.35B, +1.5% at the top), not 1%.
    assert 3.25e9 <= count.active <= 3.36e9


def test_expert_parallelism_splits_only_the_routed_experts():
    mc = rl_memory.qwen3_30b_a3b()
    one, eight = rl_memory.params_per_device(mc, 1), rl_memory.params_per_device(mc, 8)
    routed = mc.num_moe_layers * mc.num_experts * 3 * mc.d_model * mc.moe_d_ff
    assert one - eight == pytest.approx(routed * 7 / 8)
    m = rl_memory.memory_per_device(mc, data=1, expert=8, seq_len=8192, prompts=32, group_size=16, mini_batches=4)
    assert m["rollout_rows"] == 64 and m["update_rows"] == 16
    assert m["kv_cache"] == 64 * 8192 * 48 * 2 * 4 * 128 * 2


def test_the_update_options_bound_activations_by_one_micro_batch():
    mc = rl_memory.qwen3_30b_a3b()
    shape = dict(data=1, expert=8, seq_len=8192, prompts=32, group_size=16, mini_batches=4)
    one = rl_memory.memory_per_device(mc, micro_rows=1, query_chunk=1024, **shape)
    two = rl_memory.memory_per_device(mc, micro_rows=2, query_chunk=1024, **shape)
    whole = rl_memory.memory_per_device(mc, micro_rows=16, query_chunk=1024, **shape)
    # Linear in micro-batch rows, plus the accumulated f32 gradient (4 P_dev) only when chunked.
    accumulated = 4 * one["params_per_device"]
    assert two["activations_options"] - accumulated == pytest.approx(2 * (one["activations_options"] - accumulated))
    assert whole["activations_options"] == pytest.approx(16 * (one["activations_options"] - accumulated))
    # The LM head's f32 logits of one row of 8k tokens alone are 12 V S bytes (x OVERHEAD).
    assert one["activations_options"] - accumulated > rl_memory.OVERHEAD * 12 * mc.vocab_size * 8192
    # Query chunks shrink the score term: [H, c, S] per row instead of [H, S, S].
    full_scores = rl_memory.memory_per_device(mc, micro_rows=1, query_chunk=0, **shape)
    saved = rl_memory.OVERHEAD * 6 * mc.num_heads * 8192 * (8192 - 1024)
    assert full_scores["activations_options"] - one["activations_options"] == pytest.approx(saved)
    with pytest.raises(ValueError, match="micro_rows=3 must be >= 1 and divide the 16 update rows"):
        rl_memory.memory_per_device(mc, micro_rows=3, **shape)


def test_the_chunked_lm_head_holds_one_chunk_of_logits():
    mc = rl_memory.qwen3_30b_a3b()
    shape = dict(data=1, expert=8, seq_len=8192, prompts=32, group_size=16, mini_batches=4, micro_rows=1)
    whole = rl_memory.memory_per_device(mc, logit_chunk=0, **shape)
    chunked = rl_memory.memory_per_device(mc, logit_chunk=1024, **shape)
    saved = rl_memory.OVERHEAD * 12 * mc.vocab_size * (8192 - 1024)
    assert whole["activations_options"] - chunked["activations_options"] == pytest.approx(saved)
    assert chunked["logit_chunk"] == 1024 and whole["logit_chunk"] == 8192


def test_generation_chunks_divide_the_kv_cache():
    mc = rl_memory.qwen3_30b_a3b()
    shape = dict(data=1, expert=8, seq_len=8192, prompts=32, group_size=16, mini_batches=4)
    whole, chunked = (rl_memory.memory_per_device(mc, generation_chunks=k, **shape) for k in (1, 4))
    assert chunked["kv_cache"] * 4 == whole["kv_cache"] and chunked["rollout_rows"] == 16
    assert chunked["update_rows"] == whole["update_rows"] == 16  # the update's rows do not change
    with pytest.raises(ValueError, match="generation_chunks=3 must split 512 rows evenly over 8 devices"):
        rl_memory.memory_per_device(mc, generation_chunks=3, **shape)


def test_the_cli_takes_a_checkpoint_config_and_meshes(capsys):
    # The committed 324M-parameter model of benchmarks/hf_rl/ on one device: the row its GPU peak
    # is compared with (34.1 GB modelled).
    config = Path(__file__).resolve().parents[1] / "benchmarks" / "hf_rl" / "model_config.json"
    rl_memory_cli.main([f"--hf_config={config}", "--meshes=1x1", "--micro_rows=8", "--reference_logprobs=true"])
    out = capsys.readouterr().out
    assert "0.32B parameters" in out and "| 1 x 1 |" in out and "(34.1 GB) |" in out and "| 8 x 1 |" not in out
    with pytest.raises(SystemExit):
        rl_memory_cli.main(["--meshes=8"])
    assert "DATAxEXPERT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rl_memory_cli.main(["--reference_logprobs=maybe"])
    assert "valid options: true, false" in capsys.readouterr().err


def test_without_reference_logprobs_the_initial_weights_leave_the_devices():
    mc = rl_memory.qwen3_30b_a3b()
    shape = dict(data=1, expert=8, seq_len=8192, prompts=32, group_size=16, mini_batches=4)
    kept, released = (rl_memory.memory_per_device(mc, reference_copy=r, **shape) for r in (True, False))
    assert kept["weights"] - released["weights"] == pytest.approx(4 * kept["params_per_device"])
