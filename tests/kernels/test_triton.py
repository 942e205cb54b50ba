"""The shared kernel suite on the Pallas Triton backend, plus Triton-specific checks.

TestTritonInterpret runs every kernel with interpret=True (CPU CI); TestTritonCompiled runs
the same suite compiled on a CUDA GPU (`pytest -m gpu`), comparing with the reference
evaluated on the CPU.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from fp4rl.formats import ieee
from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import triton as tq
from tests.kernels.quant_suite import Impl, KernelQuantSuite, assert_tensor_equal, gpu_present, lowered_text
from tests.kernels.quant_cases import COVERING_1D_CONFIGS

# block_k=32 makes the sweep's K = 48 span two chunks (the second one masked) and rows_1d=4
# leaves a masked row tail for M = 19: the chunk loop and both masks run at interpret sizes.
# rows_2d=32: a program holds two 16x16 tile rows (the expert stack's N = 32: both full; the
# sweep's 16-row inputs: the second one masked). The defaults run in the shape tests.
SMALL = (("tunables", tq.TritonQuantTunables(rows_1d=4, block_k=32, block_k_2d=32, rows_2d=32)),)


# The interpreter runs quant_cases' covering subset of the 1D configs; all 45 run compiled (TestTritonCompiled).
class TestTritonInterpret(KernelQuantSuite):
    impl = Impl("triton", interpret=True, small_k_options=SMALL, configs_1d=COVERING_1D_CONFIGS)


@pytest.mark.gpu
class TestTritonCompiled(KernelQuantSuite):
    impl = Impl("triton", interpret=False, small_k_options=SMALL)


def _quant_fns():
    cfg = ref.NVFP4Config(four_over_six="mae")  # per tensor, amax computed: both quantize kernels
    x = jnp.zeros((19, 48), jnp.bfloat16)
    t = ref.quantize(x, ref.NVFP4Config(scale="token"))
    return cfg, x, t


def test_kernel_names_in_interpret_lowering():
    """Practice 5: the interpret-mode program carries each pallas_call's name."""
    cfg, x, t = _quant_fns()
    text = lowered_text(lambda x: pallas_kernels.quantize(x, cfg, backend="triton", interpret=True), x,
                        debug_info=True)
    assert tq.QUANT_NAME in text and tq.AMAX_NAME in text
    text = lowered_text(lambda t: pallas_kernels.dequantize(t, jnp.bfloat16, backend="triton", interpret=True), t,
                        debug_info=True)
    assert tq.DEQUANT_NAME in text


@pytest.mark.gpu
def test_kernel_names_in_compiled_lowering():
    """Compiled: each kernel is a Triton custom call whose backend config names it."""
    cfg, x, t = _quant_fns()
    text = lowered_text(lambda x: pallas_kernels.quantize(x, cfg, backend="triton"), x, debug_info=False)
    assert f'name = "{tq.QUANT_NAME}"' in text and f'name = "{tq.AMAX_NAME}"' in text
    text = lowered_text(lambda t: pallas_kernels.dequantize(t, jnp.bfloat16, backend="triton"), t, debug_info=False)
    assert f'name = "{tq.DEQUANT_NAME}"' in text


def _h200_gpu_info(monkeypatch):
    """Let the Triton lowering target an H200 on a GPU-less host (private jax hooks)."""
    try:
        from jax._src.pallas.triton import gpu_info, pallas_call_registration
    except ImportError as e:  # pragma: no cover - depends on jax internals
        pytest.skip(f"jax internals for cross-lowering moved: {e}")
    monkeypatch.setattr(pallas_call_registration.gpu_info_lib, "get_gpu_info",
                        lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200))


@pytest.mark.parametrize("config", [
    ref.NVFP4Config(),
    ref.NVFP4Config(scale="token", four_over_six="mse", fast_error=True),
    ref.NVFP4Config(block_2d=True, four_over_six="mae", e4m3_max=448),
], ids=["1d-tensor-m6", "1d-token-mse-fast", "2d-mae-exact"])
def test_lowers_to_triton_ir_for_h200(monkeypatch, config):
    """On CPU CI: the compiled (non-interpret) kernels build and verify as Triton IR for sm_90.

    This catches primitives the Triton lowering does not support without a GPU; it does not
    run ptxas (the @gpu tests do). It calls the jitted internals, past the no-GPU guard.
    """
    _h200_gpu_info(monkeypatch)
    x = jnp.zeros((32, 272), jnp.bfloat16)
    # JAX deprecates its Pallas Triton backend (docs/numerics.md §10 has the plan): the warning is
    # asserted here, so a JAX that drops it or the backend shows up in this test.
    with pytest.warns(DeprecationWarning, match="Pallas Triton backend is deprecated"):
        for tun in (tq.DEFAULT_TUNABLES, tq.TritonQuantTunables(rows_1d=2, block_k=64, block_k_2d=32, rows_2d=32)):
            text = jax.jit(lambda x: tq._quantize_jit(x, None, None, config, False, tun)).trace(x).lower(
                lowering_platforms=("cuda",)).as_text()
            assert f'name = "{tq.QUANT_NAME}"' in text
            # The inline PTX that pins each fl() is in the serialized Triton module.
            assert "div.rn.f32" in text and "mul.rn.f32" in text
            if config.four_over_six is None:  # stochastic rounding's kernel (its a - lo is sub.rn.f32)
                uniform = jnp.zeros(x.shape, jnp.float32)
                text = jax.jit(lambda x: tq._quantize_jit(x, None, uniform, config, False, tun)).trace(x).lower(
                    lowering_platforms=("cuda",)).as_text()
                assert f'name = "{tq.QUANT_NAME}"' in text and "sub.rn.f32" in text
        w = jnp.zeros((2, 48, 32), jnp.float32)
        for tun in (tq.DEFAULT_TUNABLES, tq.TritonQuantTunables(rows_2d=32)):
            text = jax.jit(lambda w: tq._quantize_experts_jit(w, None, config, True, False, tun)).trace(
                w).lower(lowering_platforms=("cuda",)).as_text()
            assert f'name = "{tq.QUANT_NAME}"' in text
        t = ref.quantize(jnp.ones((19, 48)), ref.NVFP4Config(scale="token"))
        text = jax.jit(lambda t: tq._dequantize_jit(t, jnp.dtype(jnp.bfloat16), False, tq.DEFAULT_TUNABLES)).trace(
            t).lower(lowering_platforms=("cuda",)).as_text()
        assert f'name = "{tq.DEQUANT_NAME}"' in text


def _kernel_float_ops(closed_jaxpr):
    """(primitive name, dtype) of every equation inside a pallas_call kernel body."""
    found = []

    def subjaxprs(params):
        for v in params.values():
            for item in v if isinstance(v, (list, tuple)) else (v,):
                if isinstance(item, jax.extend.core.ClosedJaxpr):
                    yield item.jaxpr
                elif isinstance(item, jax.extend.core.Jaxpr):
                    yield item

    def walk(jaxpr, in_kernel):
        for eqn in jaxpr.eqns:
            if in_kernel and eqn.invars:
                dtype = getattr(eqn.invars[0].aval, "dtype", None)
                if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
                    found.append((eqn.primitive.name, str(dtype)))
            for sub in subjaxprs(eqn.params):
                walk(sub, in_kernel or eqn.primitive.name == "pallas_call")

    walk(closed_jaxpr.jaxpr, False)
    return found


# Float primitives whose Triton lowering breaks the contract: neg is `0 - x` (-(+0) = +0),
# max/min and their reductions are maxnumf/minnumf (drop NaN), div is div.full.f32
# (approximate). The compiled kernels must do these on the bits or through inline PTX.
_TRITON_UNSAFE = {"neg", "max", "min", "reduce_max", "reduce_min", "div"}


@pytest.mark.parametrize("config", [
    ref.NVFP4Config(),
    ref.NVFP4Config(scale="token", four_over_six="mae"),
    ref.NVFP4Config(scale="token", four_over_six="mse", fast_error=True),
    ref.NVFP4Config(block_2d=True, four_over_six="mse", e4m3_max=448),
], ids=["1d-tensor-m6", "1d-token-mae-exact", "1d-token-mse-fast", "2d-mse-exact-E448"])
def test_compiled_kernel_bodies_avoid_triton_unsafe_float_ops(config):
    x = jnp.zeros((32, 272), jnp.bfloat16)
    tun = tq.DEFAULT_TUNABLES
    ops = _kernel_float_ops(jax.make_jaxpr(lambda x: tq._quantize_jit(x, None, None, config, False, tun))(x))
    if config.four_over_six is None:  # stochastic rounding's kernel body too
        uniform = jnp.zeros(x.shape, jnp.float32)
        ops += _kernel_float_ops(jax.make_jaxpr(lambda x: tq._quantize_jit(x, None, uniform, config, False, tun))(x))
    w = jnp.zeros((2, 48, 32), jnp.float32)
    ops += _kernel_float_ops(jax.make_jaxpr(
        lambda w: tq._quantize_experts_jit(w, None, config, True, False, tun))(w))
    t = ref.quantize(jnp.ones((32, 48)), config)
    for dtype in (jnp.bfloat16, jnp.float32):
        ops += _kernel_float_ops(jax.make_jaxpr(lambda t: tq._dequantize_jit(t, jnp.dtype(dtype), False, tun))(t))
    assert ops, "no kernel body found: the walker is broken"
    unsafe = sorted({op for op in ops if op[0] in _TRITON_UNSAFE})
    assert not unsafe, f"float ops with contract-breaking Triton lowerings in a compiled kernel: {unsafe}"


def test_compiled_kernel_without_gpu_raises():
    if gpu_present():
        pytest.skip("a GPU is present: the compiled kernel is allowed to run here")
    x = np.zeros((4, 32), np.float32)
    with pytest.raises(RuntimeError, match="interpret=True"):
        pallas_kernels.quantize(x, ref.NVFP4Config(), backend="triton")
    t = ref.quantize(x, ref.NVFP4Config())
    with pytest.raises(RuntimeError, match="interpret=True"):
        pallas_kernels.dequantize(t, jnp.bfloat16, backend="triton")


def test_tunables_are_validated_before_tracing():
    with pytest.raises(ValueError, match="block_k=48 must be a power of two and a multiple of block=16"):
        tq.TritonQuantTunables(block_k=48)
    with pytest.raises(ValueError, match="block_k_2d=8 must be a power of two and a multiple of block=16"):
        tq.TritonQuantTunables(block_k_2d=8)
    with pytest.raises(ValueError, match="rows_2d=8 must be a power of two >= block=16"):
        tq.TritonQuantTunables(rows_2d=8)
    with pytest.raises(ValueError, match="rows_1d=3 must be a power of two"):
        tq.TritonQuantTunables(rows_1d=3)
    with pytest.raises(ValueError, match="k=40 must be a multiple of block=16"):
        tq.quantize_triton(np.zeros((4, 40), np.float32), interpret=True)
    with pytest.raises(ValueError, match="rows=24 must be a multiple of tile=16"):
        tq.quantize_triton(np.zeros((24, 32), np.float32), ref.NVFP4Config(block_2d=True), interpret=True)
    with pytest.raises(ValueError, match="contraction_axis=0"):
        tq.quantize_experts_triton(np.zeros((2, 32, 16), np.float32), contraction_axis=0, interpret=True)


def test_registry_refuses_unknown_and_unavailable_backends(monkeypatch):
    x = np.zeros((4, 32), np.float32)
    with pytest.raises(ValueError, match="unknown kernel backend 'cuda'"):
        pallas_kernels.quantize(x, ref.NVFP4Config(), backend="cuda")
    monkeypatch.setitem(pallas_kernels.BACKENDS, "ghost", "pallas_kernels.no_such_module")
    with pytest.raises(pallas_kernels.BackendUnavailableError, match="cannot be imported"):
        pallas_kernels.quantize(x, ref.NVFP4Config(), backend="ghost", interpret=True)
    monkeypatch.setitem(pallas_kernels.BACKENDS, "ghost", "pallas_kernels.nvfp4_quant.block_math")
    with pytest.raises(pallas_kernels.BackendUnavailableError, match="no quantize_ghost"):
        pallas_kernels.quantize(x, ref.NVFP4Config(), backend="ghost", interpret=True)


@pytest.mark.parametrize("interpret", [True, pytest.param(False, marks=pytest.mark.gpu)], ids=["interpret", "compiled"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["no-prefetch", "prefetch"])
@pytest.mark.parametrize("layout", ["planar", "tiled"])
def test_k_major_stack_loops_with_and_without_prefetch(interpret, prefetch, layout):
    """An expert stack [E, K, N] read K-major, per-expert amax, 16x16 tiles with 4/6: K = 80 in
    chunks of 32 (the last one half masked), N = 48 in programs of 32 columns (the second half
    masked), by the element-plane kernel and by the tiled one; bytes equal the vmapped reference's."""
    if not interpret and not gpu_present():
        pytest.skip("needs a CUDA GPU")
    tunables = tq.TritonQuantTunables(rows_2d=32, block_k_2d=32, prefetch=prefetch, layout=layout)
    w = jnp.asarray(np.random.default_rng(5).standard_normal((2, 80, 48)) * [[[1e-3]], [[7.0]]], jnp.bfloat16)
    config = ref.NVFP4Config(block_2d=True, four_over_six="mse", fast_error=True)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu), ieee.native_division_for_cpu():
        want = jax.vmap(lambda m: ref.quantize(m.T, config))(jax.device_put(w, cpu))
    got = tq.quantize_experts_triton(w, config, contraction_axis=1, interpret=interpret, tunables=tunables)
    assert_tensor_equal(got, want, f"{tunables}")
    if layout == "planar" and prefetch:  # the default launch shape (K_MAJOR_TUNABLES: N = 48 in one masked program)
        got = tq.quantize_experts_triton(w, config, contraction_axis=1, interpret=interpret)
        assert_tensor_equal(got, want, "default tunables")


@pytest.mark.parametrize("interpret", [True, pytest.param(False, marks=pytest.mark.gpu)], ids=["interpret", "compiled"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["no-prefetch", "prefetch"])
@pytest.mark.parametrize("block_k,row_groups", [(32, 1), (128, 3)], ids=["chunks", "row-groups"])
def test_planar_loops_with_and_without_prefetch(interpret, prefetch, block_k, row_groups):
    """The planar kernel's pipelined loops, with and without carrying the next item's loads:
    "chunks": the two chunk loops (amax, then quantize), K = 80 in chunks of 32 (the last one half
    masked); "row-groups": a row in one chunk, 3 groups of 4 rows per program (the last program's
    groups partly and wholly past M). M = 19 (a masked row tail); the per-token amax computed in
    the kernel and given; bytes equal the reference's."""
    if not interpret and not gpu_present():
        pytest.skip("needs a CUDA GPU")
    tunables = tq.TritonQuantTunables(rows_1d=4, block_k=block_k, prefetch=prefetch, row_groups=row_groups)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((19, 80)) * 3, jnp.bfloat16)
    config = ref.NVFP4Config(scale="token", four_over_six="mae", fast_error=True)
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1, keepdims=True) * 1.5
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu), ieee.native_division_for_cpu():  # the reference's bytes, on the CPU
        expected = [ref.quantize(jax.device_put(x, cpu), config, amax=a) for a in (None, jax.device_put(amax, cpu))]
    for given, want in zip((None, amax), expected):
        got = tq.quantize_triton(x, config, interpret=interpret, amax=given, tunables=tunables)
        assert_tensor_equal(got, want, f"{tunables} amax {'given' if given is not None else 'computed'}")
