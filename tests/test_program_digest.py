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


def test_dose_one_has_the_programs_of_its_recipe():
    """nvfp4@1 and +dq@1 run the programs of nvfp4 and +dq (the dose-response's a = 1 is the
    recipe itself); the dose 4 changes the sampler's and the update's programs."""
    tool = _tool()
    model_config = sft.model_config(configs.SFT_PRESETS["smoke"])
    graphdef, params = init(model_config, 0)
    warmup = (graphdef, params, {"model_config": dataclasses.asdict(model_config)})
    nvfp4 = tool.digests("smoke", "nvfp4", 1, warmup)
    assert tool.digests("smoke", "nvfp4@1", 1, warmup) == nvfp4
    assert tool.digests("smoke", "+dq@1", 1, warmup) == tool.digests("smoke", "+dq", 1, warmup)
    dosed = tool.digests("smoke", "nvfp4@4", 1, warmup)
    assert dosed["sample"] != nvfp4["sample"] and dosed["update"] != nvfp4["update"]
