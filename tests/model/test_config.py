"""ModelConfig: presets, validation, exact parameter counts, FLOPs, serialisation."""

import dataclasses

import jax
import pytest
from flax import nnx

from fp4rl.model import ModelConfig, init
from fp4rl.model.transformer import Transformer
from tests.model.common import TINY, model


def _tree_size(config):
    # eval_shape: the real parameter tree's shapes without allocating (h200 is ~65M parameters).
    abstract = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(params=0)))
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize("name", ModelConfig.names())
def test_param_count_matches_the_parameter_tree(name):
    config = ModelConfig.from_name(name)
    assert config.param_count().total == _tree_size(config)


def test_param_count_variants_match_the_tree():
    # Every optional part (biases, q/k norm, gate, dense layer, tied head) counted exactly.
    variant = dataclasses.replace(TINY, qkv_bias=True, qk_norm=True, shared_expert_gate=True,
                                  dense_layers=(0,), tie_embeddings=True)
    assert variant.param_count().total == _tree_size(variant)


def test_preset_sizes():
    counts = {n: ModelConfig.from_name(n).param_count() for n in ModelConfig.names()}
    assert counts["tiny"].total < 200_000
    assert 3e6 < counts["small"].total < 8e6
    assert 20e6 < counts["h200"].total < 100e6
    for c in counts.values():
        assert c.active < c.total


def test_active_params_by_hand():
    # tiny: per layer attention 64*(64+2*32)+64*64 = 12288, norms 128, router 256,
    # shared 3*64*64 = 12288, experts 3*64*32 = 6144 each (4 total, 2 active);
    # embedding + head 2*64*64 + final norm 64.
    layer_common = 12288 + 128 + 256 + 12288
    assert TINY.param_count().total == 2 * (layer_common + 4 * 6144) + 8192 + 64
    assert TINY.param_count().active == 2 * (layer_common + 2 * 6144) + 8192 + 64


def test_flops_per_token_by_hand():
    # Forward: 2 * active matmul MACs (no embedding gather, no norms) + causal attention
    # 2 * seq_len * H * Dh per layer; training is 3x.
    macs = 64 * 64 + 2 * (12288 + 64 * 4 + 2 * 3 * 64 * 32 + 3 * 64 * 64)
    fwd = 2 * macs + 2 * 2 * 32 * 4 * 16
    assert TINY.flops_per_token(seq_len=32, training=False) == fwd
    assert TINY.flops_per_token(seq_len=32) == 3 * fwd


def test_init_matches_config_dtypes_and_is_deterministic():
    _, params = model()
    leaves = jax.tree.leaves(params)
    assert sum(x.size for x in leaves) == TINY.param_count().total
    assert all(x.dtype == jax.numpy.float32 for x in leaves)
    again = init(TINY, 0)[1]  # the seed alone fixes the parameters
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(again), leaves))


def test_json_roundtrip_and_overrides():
    config = ModelConfig.from_name("small", vocab_size=99)  # the RL character vocabulary
    assert config.vocab_size == 99
    assert ModelConfig.from_json(config.to_json()) == config
    assert hash(ModelConfig.from_json(config.to_json())) == hash(config)


@pytest.mark.parametrize("overrides, message", [
    (dict(num_kv_heads=3), "multiple of num_kv_heads"),
    (dict(head_dim=15), "even"),
    (dict(top_k=5), "top_k=5"),
    (dict(dense_layers=(2,)), "dense_layers"),
    (dict(dense_layers=(1, 0)), "sorted"),
    (dict(dtype="float16"), "dtype"),
    (dict(group_align=16), "group_align=16"),
    (dict(shared_expert_d_ff=0, shared_expert_gate=True), "shared_expert_gate"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides)


def test_unknown_preset():
    with pytest.raises(ValueError, match="valid names"):
        ModelConfig.from_name("huge")
