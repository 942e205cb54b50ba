"""HF export: a model imported from a Qwen-MoE folder, trained or not, written back as a Hugging Face
folder that imports to the same parameters and logits bit for bit (fixtures: tests/fixtures/hf)."""

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from fp4rl.model import from_pretrained
from fp4rl.model.hf import INDEX_FILE, read_tensors
from fp4rl.model.hf_export import hf_tensors, save_pretrained

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf")
NAMES = ("qwen3_moe_tiny", "qwen2_moe_tiny")


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.mark.parametrize("name", NAMES)
def test_the_exported_tensors_are_the_checkpoints(name):
    """Import then export gives back every tensor of the source, under its name, bit for bit
    (in float32, the parameters' dtype)."""
    source = os.path.join(FIXTURES, name)
    model = from_pretrained(source)
    exported = hf_tensors(model.graphdef, model.params)
    original = load_file(os.path.join(source, "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for key, array in original.items():
        assert exported[key].dtype == np.float32 and exported[key].shape == array.shape, key
        assert exported[key].tobytes() == np.asarray(array, np.float32).tobytes(), key


@pytest.mark.parametrize("name", NAMES)
def test_a_trained_policy_round_trips_with_identical_logits(name, tmp_path):
    """Parameters changed as training would change them, exported (sharded, with an index) and
    imported again: the same parameters and logits, bit for bit; the source's other files come along."""
    source = os.path.join(FIXTURES, name)
    model = from_pretrained(source)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(model.params))))
    trained = jax.tree.map(lambda x: x + 1e-3 * jax.random.normal(next(keys), x.shape, x.dtype), model.params)
    files = save_pretrained(str(tmp_path / "out"), model.graphdef, trained, source, shard_bytes=64 << 10)
    assert INDEX_FILE in files and "generation_config.json" in files and "config.json" in files
    assert len([f for f in files if f.endswith(".safetensors")]) > 1
    index = json.loads((tmp_path / "out" / INDEX_FILE).read_text())
    assert sorted(index["weight_map"]) == sorted(read_tensors(str(tmp_path / "out")))
    again = from_pretrained(str(tmp_path / "out"))
    for a, b in zip(_leaves(trained), _leaves(again.params), strict=True):
        assert a.tobytes() == b.tobytes()
    ids = np.load(os.path.join(source, "reference_logits.npz"))["input_ids"]
    tuned = type(model)(model.config, model.graphdef, trained, model.recipe, model.model_type)
    assert np.asarray(again(ids)).tobytes() == np.asarray(tuned(ids)).tobytes()
    assert not np.array_equal(np.asarray(again(ids)), np.asarray(model(ids)))  # the change is in the file


def test_a_model_the_source_does_not_describe_is_refused(tmp_path):
    qwen3 = from_pretrained(os.path.join(FIXTURES, "qwen3_moe_tiny"))
    with pytest.raises(ValueError, match="does not describe this model .*fields that differ: .*qk_norm"):
        save_pretrained(str(tmp_path / "out"), qwen3.graphdef, qwen3.params, os.path.join(FIXTURES, "qwen2_moe_tiny"))
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_non_empty_folder_and_a_source_without_config(tmp_path):
    model = from_pretrained(os.path.join(FIXTURES, "qwen3_moe_tiny"))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(FileExistsError, match="not empty"):
        save_pretrained(str(tmp_path / "busy"), model.graphdef, model.params, os.path.join(FIXTURES, "qwen3_moe_tiny"))
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        save_pretrained(str(tmp_path / "out"), model.graphdef, model.params, str(tmp_path))


def test_the_command_exports_a_folder_that_serves(tmp_path, capsys):
    from experiments import hf_export
    from fp4rl.serving import checkpoints

    source = os.path.join(FIXTURES, "qwen2_moe_tiny")
    hf_export.main([source, source, str(tmp_path / "out")])
    assert "model.safetensors" in capsys.readouterr().out
    served = checkpoints.load(str(tmp_path / "out"))
    assert served.kind == "hf" and served.config == checkpoints.load(source).config
