"""RL from a Hugging Face Qwen2-MoE checkpoint (shared expert, q/k/v biases; fp4rl/model/hf_local.py)
on DAPO-Math rows: one step on a 2 x 4 mesh equals the one-device step."""

import json

import numpy as np

from fp4rl.parallel.mesh import MeshConfig
from fp4rl.rl import trainer
from fp4rl.model.hf_local import write_checkpoint, write_rows

TIMING = ("time/", "throughput/")


def test_hf_rl_step_on_8_devices_equals_one_device(tmp_path):
    ckpt, rows = write_checkpoint(tmp_path / "qwen2", "qwen2_moe"), write_rows(tmp_path / "rows.jsonl")

    def run(name, mesh):
        # 2 prompts x 8 samples in 2 mini-batches: 8 rows each, one per device.
        config = trainer.RLConfig(steps=1, group_size=8, prompts_per_step=2, mini_batches=2, max_gen_batches=1,
                                  max_new_tokens=8, overlong_buffer=4, prompt_len=48, impl="reference", arm="+hp",
                                  init="", model=trainer.ModelSource(hf=str(ckpt)), data_file=str(rows),
                                  out=str(tmp_path / name), mesh=mesh)
        return trainer.Trainer(config, progress=False).run()[0][0]

    one, many = run("one", MeshConfig()), run("mesh", MeshConfig(data=2, expert=4))
    assert one["updates/applied"] > 0  # the fixture's groups have mixed rewards: the step trained
    # Tolerances as in test_trainer_mesh.py: sampling draws the same tokens, so rewards, lengths and
    # group statistics are exact; log-prob means agree within 2e-4, gradient norms (sums re-added
    # across devices) within rtol 1e-3.
    exact = [k for k in one if k.startswith(("reward/", "population/", "response_length/", "dapo/", "updates/"))]
    assert exact and all(one[k] == many[k] for k in exact), {k: (one[k], many[k]) for k in exact if one[k] != many[k]}
    for k in one:
        if k not in exact and not k.startswith(TIMING) and isinstance(one[k], float):
            np.testing.assert_allclose(many[k], one[k], rtol=1e-3, atol=2e-4, err_msg=k)
    # Selective precision (+hp: NVFP4 routed experts but in the last layer; the shared expert in BF16).
    layer_map = json.loads((tmp_path / "mesh" / "+hp" / "config.json").read_text())["layer_map"]
    assert layer_map["bf16_layers"] == [1] and layer_map["routed_experts"] == "nvfp4"
    assert layer_map["shared_expert"] == "bf16"
