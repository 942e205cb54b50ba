"""RL from a Hugging Face Qwen2-MoE checkpoint (shared expert, q/k/v biases; fp4rl/model/hf_local.py)
on DAPO-Math rows, with the micro-batched update (`policy.UpdateMemory`, fp4rl/rl/micro_batch.py), on
a 2 x 4 mesh: one RL step equals the same step on one device, and the one-device step without
micro-batches or the other memory options; selective precision holds on the mesh."""

import json

import numpy as np
import pytest

from fp4rl.parallel.mesh import MeshConfig
from fp4rl.rl import policy, trainer
from fp4rl.model.hf_local import write_checkpoint, write_rows

TIMING = ("time/", "throughput/")
# Remat, query chunks of 16 (prompt 48 + response 8 tokens: 4 chunks) and 2 micro-batches.
MEMORY = policy.UpdateMemory(remat=True, attention_query_chunk=16, micro_batches=2)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("micro_batch_mesh")
    return write_checkpoint(root / "qwen2", "qwen2_moe"), write_rows(root / "rows.jsonl")


def _step(files, out, mesh, memory):
    ckpt, rows = files
    # 2 prompts x 8 samples in one mini-batch of 16 rows: 2 micro-batches of 8, one row per device each.
    config = trainer.RLConfig(steps=1, group_size=8, prompts_per_step=2, mini_batches=1, max_gen_batches=1,
                              max_new_tokens=8, overlong_buffer=4, prompt_len=48, impl="reference", arm="full",
                              init="", model=trainer.ModelSource(hf=str(ckpt)), data_file=str(rows), out=str(out),
                              mesh=mesh, memory=memory)
    return trainer.Trainer(config, progress=False).run()[0][0]


def _assert_same_step(got, want):
    """Tolerances of test_trainer_mesh.py: sampling draws the same tokens, so rewards, lengths and group
    statistics are exact; log-prob means agree within 2e-4 and gradient norms (sums re-added across
    devices and micro-batches) within rtol 1e-3."""
    assert got.keys() == want.keys()
    exact = [k for k in want if k.startswith(("reward/", "population/", "response_length/", "dapo/", "updates/"))]
    assert exact and all(got[k] == want[k] for k in exact), {k: (got[k], want[k]) for k in exact if got[k] != want[k]}
    for k in want:
        if k not in exact and not k.startswith(TIMING) and isinstance(want[k], float):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=2e-4, err_msg=k)


def test_micro_batched_step_on_8_devices_equals_one_device(files, tmp_path):
    many = _step(files, tmp_path / "mesh", MeshConfig(data=2, expert=4), MEMORY)
    one = _step(files, tmp_path / "one", MeshConfig(), MEMORY)
    plain = _step(files, tmp_path / "plain", MeshConfig(), policy.UpdateMemory())
    assert plain["updates/applied"] > 0 and plain["grad_norm/global"] > 0  # the fixture's groups vary: it trained
    _assert_same_step(many, one)
    # The Switch loss of 2 micro-batches is the mean of theirs, not the loss of all 16 rows
    # (fp4rl/rl/micro_batch.py): it differs from the unchunked one (so the chunks ran), here by
    # 6e-4 relative, inside the tolerance; every other quantity is the unchunked one up to rounding.
    assert many["loss/aux"] != plain["loss/aux"]
    _assert_same_step(many, plain)
    # Selective precision (full: NVFP4 routed experts but in the last layer; the shared expert in BF16).
    layer_map = json.loads((tmp_path / "mesh" / "full" / "config.json").read_text())["layer_map"]
    assert layer_map["bf16_layers"] == [1] and layer_map["routed_experts"] == "nvfp4"
    assert layer_map["shared_expert"] == "bf16"


def test_micro_batches_that_would_split_a_device_s_rows_are_refused_naming_the_valid_ones(files, tmp_path):
    # 16 rows on 8 devices: 2 per device, so only 1 or 2 micro-batches keep every device's share equal.
    with pytest.raises(ValueError, match=r"memory.micro_batches=4 .* valid options on mesh.data \* mesh.expert = 8 "
                                         r"devices: 1, 2"):
        _step(files, tmp_path / "bad", MeshConfig(data=2, expert=4), policy.UpdateMemory(micro_batches=4))
