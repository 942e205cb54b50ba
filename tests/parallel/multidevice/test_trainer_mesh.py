"""The RL trainer on a 2 x 4 mesh of CPU devices: one step equals the one-device step, and its
checkpoint restores onto other mesh shapes (and one device) with the saved bytes."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from fp4rl import configs
from fp4rl.model import init
from fp4rl.parallel.mesh import MeshConfig
from fp4rl.rl import sft, trainer
from fp4rl.rl.checkpoint import Checkpointer

TIMING = ("time/", "throughput/")


@pytest.fixture(scope="module")
def warmup(tmp_path_factory):
    """A warm-up directory holding the initial tiny model (8 experts), as `sft.load` reads it."""
    out = tmp_path_factory.mktemp("warmup")
    mc = dataclasses.replace(sft.model_config(configs.SFT_PRESETS["smoke"]), num_experts=8)
    _, params = init(mc, 0)
    ckpt = Checkpointer(sft.checkpoint_dir(out))
    ckpt.save(0, params, {"kind": "sft"})
    ckpt.close()
    (out / sft.META_FILE).write_text(json.dumps({"model_config": dataclasses.asdict(mc)}))
    return out


def _config(warmup, out, mesh, **kw):
    return trainer.RLConfig(steps=1, task=configs.SMOKE_TASK, group_size=4, prompts_per_step=4, mini_batches=2,
                            max_gen_batches=1, max_new_tokens=16, prompt_len=32, impl="reference", init=str(warmup),
                            out=str(out), mesh=mesh, **kw)


def test_mesh_step_equals_one_device_and_checkpoint_moves_between_meshes(warmup, tmp_path):
    one = trainer.Trainer(_config(warmup, tmp_path / "one", MeshConfig()), progress=False).run()[0][0]
    mesh_config = _config(warmup, tmp_path / "mesh", MeshConfig(data=2, expert=4))
    many = trainer.Trainer(mesh_config, progress=False).run()[0][0]
    assert one.keys() == many.keys()
    # Sampling draws the same tokens (logits agree to ~1e-4, see test_data.py): rewards, lengths and
    # group statistics are exact. Log-prob based metrics (losses, KL, ratios, mismatch) are means of
    # per-token log-probs within 2e-4; gradient norms are sums re-added across devices (rtol 1e-4,
    # test_data.py), but the first update's Adam step amplifies nothing measured here.
    exact = [k for k in one if k.startswith(("reward/", "population/", "response_length/", "dapo/", "updates/"))]
    assert exact and all(one[k] == many[k] for k in exact), {k: (one[k], many[k]) for k in exact if one[k] != many[k]}
    for k in one:
        if k in exact or k.startswith(TIMING) or not isinstance(one[k], float):
            continue
        np.testing.assert_allclose(many[k], one[k], rtol=1e-3, atol=2e-4, err_msg=k)

    # The checkpoint of the 2 x 4 run, restored onto 8 x 1, 1 x 8 and one device: the same bytes,
    # each leaf in the target layout (orbax restores with the target shardings).
    saved = None
    for mesh in (MeshConfig(data=8, expert=1), MeshConfig(data=1, expert=8), MeshConfig()):
        run = trainer.Trainer(dataclasses.replace(mesh_config, mesh=mesh, resume="force"), progress=False)
        like = run._initial_state()
        restored = run.ckpt.restore_latest(like)
        assert restored is not None and restored.step == 0
        leaves = [np.asarray(x) for x in jax.tree.leaves(restored.state)]
        saved = saved or leaves
        for a, b in zip(leaves, saved, strict=True):
            np.testing.assert_array_equal(a, b)
        for got, want in zip(jax.tree.leaves(restored.state), jax.tree.leaves(like), strict=True):
            assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
        run.ckpt.close()


def test_sft_on_mesh_equals_one_device(tmp_path):
    base = dataclasses.replace(configs.SFT_PRESETS["smoke"], steps=3, warmup_steps=1, eval_problems=1, max_new_tokens=8)
    one = sft.train(dataclasses.replace(base, out=str(tmp_path / "one")), progress=False)
    many = sft.train(dataclasses.replace(base, out=str(tmp_path / "mesh"), mesh=MeshConfig(data=4, expert=2)),
                     progress=False)
    assert [s for s, _ in one["loss_curve"]] == [s for s, _ in many["loss_curve"]] == [0, 2]
    # Token-mean losses of 8 sequences, re-added across devices, after two AdamW steps whose
    # directions agree up to the gradients' rounding (test_data.py): well within 1e-4 relative.
    np.testing.assert_allclose([v for _, v in many["loss_curve"]], [v for _, v in one["loss_curve"]], rtol=1e-4)
    assert many["sft_config"]["mesh"] == {"data": 4, "expert": 2}
