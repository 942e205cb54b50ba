"""tools/program_digest.py: one arm's programs hash the same when built twice, and another
recipe's update differs (the digest sees the computation, not the run's object identities)."""

import dataclasses

from fp4rl import configs
from fp4rl.model import init
from fp4rl.rl import sft

from tests.tool_module import load_tool


def _tool():
    return load_tool("program_digest")


def test_digests_are_stable_and_tell_recipes_apart():
    tool = _tool()
    model_config = sft.model_config(configs.SFT_PRESETS["smoke"])
    graphdef, params = init(model_config, 0)
    warmup = (graphdef, params, {"model_config": dataclasses.asdict(model_config)})
    bf16 = tool.digests("smoke", "bf16", 1, warmup)
    assert set(bf16) == {"sync", "sample", "update"}
    assert tool.digests("smoke", "bf16", 1, warmup) == bf16
    full = tool.digests("smoke", "full", 1, warmup)
    assert full["update"] != bf16["update"] and full["sample"] != bf16["sample"]
