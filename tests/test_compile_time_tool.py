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


TRITON_HLO = """HloModule m

%region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %d = f32[] divide(%a, %b)
}

%triton_computation (p0: f32[8], p1: f32[8]) -> f32[] {
  %p0 = f32[8]{0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %divide.1 = f32[8]{0} divide(%p0, %p1)
  %c = f32[] constant(0)
  ROOT %r = f32[] reduce(%divide.1, %c), dimensions={0}, to_apply=%region
}

%fused_computation (q0: f32[8], q1: f32[8]) -> f32[8] {
  %q0 = f32[8]{0} parameter(0)
  %q1 = f32[8]{0} parameter(1)
  ROOT %divide.2 = f32[8]{0} divide(%q0, %q1)
}

ENTRY %main (x: f32[8], y: f32[8]) -> (f32[], f32[8]) {
  %x = f32[8]{0} parameter(0)
  %y = f32[8]{0} parameter(1)
  %fusion.1 = f32[] fusion(%x, %y), kind=kCustom, calls=%triton_computation, backend_config={"fusion_backend_config":{"kind":"__triton"}}
  %fusion.2 = f32[8]{0} fusion(%x, %y), kind=kLoop, calls=%fused_computation
  ROOT %t = (f32[], f32[8]{0}) tuple(%fusion.1, %fusion.2)
}
"""


def test_divisions_in_triton_fusions_are_counted_and_no_others():
    """The Triton fusion's own division and the one in the reduction it applies: 2; the loop
    fusion's division (emitted by XLA's LLVM emitter, which the flag governs) is not counted."""
    assert compile_time.triton_fusion_divisions(TRITON_HLO) == 2
    assert compile_time.triton_fusion_divisions(TRITON_HLO.replace('"__triton"', '"__cub"')) == 0
