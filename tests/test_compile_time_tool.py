"""`tools/compile_time.py size`: an arm's update program lowered for CUDA on a machine without a GPU.

It guards what the GPU program of the pretraining recipe's backward holds: its stochastic rounding
runs in the Triton quantize kernel, so the only integer long divisions left (`ieee.integer_divide`,
about 560 StableHLO ops each) are the per-tensor and per-token global scales, none per element
or per block; and under `xla_flags.IEEE_GPU_DIVISION` there are none.
"""

from __future__ import annotations

from fp4rl import xla_flags
from tests.tool_module import load_tool

compile_time = load_tool("compile_time")


def test_the_pretraining_backward_divides_no_element_on_the_gpu(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    program = compile_time.gpu_program_size("smoke", "nvfp4-pt", 1, "xla")
    shapes = list(program["integer_divisions"])
    assert shapes and all(shape == () or shape[-1] == 1 for shape in shapes), program["integer_divisions"]
    assert sum(n for target, n in program["custom_calls"].items() if target.startswith("__gpu")) > 0  # the kernels


def test_ieee_gpu_division_leaves_no_integer_division(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", xla_flags.IEEE_GPU_DIVISION)
    program = compile_time.gpu_program_size("smoke", "nvfp4-pt", 1, "xla")
    assert program["integer_divisions"] == {} and program["ops"] > 0
