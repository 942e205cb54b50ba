"""The Mosaic GPU NVFP4 quantizer: the shared kernel suite plus Mosaic-specific checks.

TestMosaicInterpret runs the shared suite (`tests/kernels/quant_suite.py`) in the Mosaic GPU
interpreter on the CPU (`interpret=True`: jax 0.11.2's `plgpu.InterpretGPUParams`);
TestMosaicCompiled runs the same suite compiled on a Hopper GPU (`pytest -m gpu`). The tests
after them cover what the shared suite does not: the overlapping last program (M > block_m),
bf16 inputs where one-ulp arithmetic errors show, the K-split grid with a given amax, kernel
names, validation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import nvfp4 as ref
from pallas_kernels.nvfp4_quant import mosaic as mq
from pallas_kernels.nvfp4_quant import shapes
from tests.formats import oracle
from tests.kernels.quant_suite import Impl, KernelQuantSuite, reference_experts
from tests.kernels.quant_cases import COVERING_1D_CONFIGS

ON_GPU = jax.default_backend() == "gpu"

C = ref.NVFP4Config
CONFIGS = {
    "token-6": C(scale="token"),
    "tensor-6": C(scale="tensor"),
    "token-mae-256": C(scale="token", four_over_six="mae"),
    "token-mse-256": C(scale="token", four_over_six="mse"),
    "token-mae-448": C(scale="token", four_over_six="mae", e4m3_max=448),
    "token-mae-256-fast": C(scale="token", four_over_six="mae", fast_error=True),
    "token-mse-448-fast": C(scale="token", four_over_six="mse", e4m3_max=448, fast_error=True),
    "tensor-mse-256": C(scale="tensor", four_over_six="mse"),
    "tensor-mae-448-fast": C(scale="tensor", four_over_six="mae", e4m3_max=448, fast_error=True),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def make_input(m, k, dtype, seed, special=True, subnormal=True, nan=True):
    """Rows with per-row magnitudes over ~2^-30..2^30, plus (if `special`) a zero row, a huge
    row, a tiny row (f32 subnormals if `subnormal`, else 1e-30), a NaN row and an Inf row."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-30, 30, size=(m, 1)))
    x = x.astype(np.float32)
    if special and m >= 6:
        x[1] = 0.0
        x[2] = rng.standard_normal(k) * 1e37
        x[3] = rng.standard_normal(k) * (1e-39 if subnormal else 1e-30)
        if nan:
            x[4, k // 2] = np.nan
        x[5, 0] = -np.inf
    return jnp.asarray(x).astype(dtype)


def cpu_input(m, k, dtype, seed, special=True):
    """Inputs for the CPU (interpret) tests: no f32-subnormal row, and no NaN in bf16 input.

    Why: the *reference* on XLA:CPU deviates from docs/numerics.md there (not the kernel): its
    `jnp.max(|x|)` flushes f32 subnormals to 0 (amax 0 instead of the subnormal), and for
    bf16 input the fused convert+abs+max drops a NaN (finite amax instead of NaN, §8). The
    kernel follows the contract (integer max on the bits); the GPU tests keep both rows.
    """
    return make_input(m, k, dtype, seed, special, subnormal=False, nan=jnp.dtype(dtype) == jnp.float32)


def assert_same_bytes(got: ref.NVFP4Tensor, want: ref.NVFP4Tensor):
    """Bit-exact on raw bytes (docs/design.md practice 4): codes, scale bytes, amax bits, map4."""
    for field in ("codes", "scales", "amax", "map4"):
        g, w = np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
        assert g.shape == w.shape and g.dtype == w.dtype, (field, g.shape, w.shape, g.dtype, w.dtype)
        view = {1: np.uint8, 4: np.uint32}[g.dtype.itemsize]
        gb, wb = g.view(view), w.view(view)
        differ = gb != wb
        if field == "amax":  # a NaN amax's payload is the platform's (XLA:GPU 0x7FFFFFFF, x86 0x7FC00000)
            differ &= ~(np.isnan(g) & np.isnan(w))
        bad = np.argwhere(differ)
        assert bad.size == 0, f"{field}: {len(bad)} mismatches, first at {bad[:5].tolist()}: got {gb[tuple(bad[0])]:#x} want {wb[tuple(bad[0])]:#x}"


def fma_sensitive(config) -> bool:
    """4/6 errors have products feeding adds (§3: fl(d*d) summed, fl(v - fl(x*S_enc)),
    fl(fl(dq*A)/6E) - x), which XLA:GPU may contract into FMAs inside the reference's fused
    kernels (or turn the division by 6E into a multiply), against the contract ("no FMA
    anywhere"). The kernel blocks contraction, so these are compared on the host CPU."""
    return config.four_over_six is not None


def reference(x, config, amax=None, *, experts=False):
    """The reference's bytes (`experts`: of a K-major stack [E, K, N], vmapped over E);
    FMA-sensitive configs are evaluated on the host CPU (no FMA)."""

    def quantize(x, amax):
        return reference_experts(x, config, 1, amax) if experts else ref.quantize(x, config, amax=amax)

    if ON_GPU and fma_sensitive(config):
        cpu = jax.devices("cpu")[0]
        x, amax = jax.device_put((x, amax), cpu)
        with jax.default_device(cpu):
            return quantize(x, amax)
    return quantize(x, amax)


def check(x, config, *, amax=None, interpret):
    got = mq.quantize_mosaic(x, config, amax=amax, interpret=interpret)
    assert_same_bytes(got, reference(x, config, amax))
    return got


# ---------------------------------------------------------------- the shared suite -----

# block_k=16: with a given (or per-tensor) amax the sweep's K = 48 runs as 3 programs along K.
SMALL = (("tiling", mq.MosaicQuantTiling(block_k=16)),)


# The interpreter is slow: tests/kernels/conftest.py groups this class's tests per parameter set,
# and its shape sweep stops at K=1024 (several whole-row blocks already; K=8192 runs compiled).
# 2D: every 4/6 mode once and every E4M3 maximum at least once; 1D: the covering subset of
# quant_cases (the other configs: compiled only, TestMosaicCompiled).
INTERPRET_2D_CONFIGS = ("2d-tensor-m6-E256", "2d-tensor-mae-exact-Edef", "2d-tensor-mae-fast-E448",
                        "2d-tensor-mse-exact-E256", "2d-tensor-mse-fast-Edef")


class TestMosaicInterpret(KernelQuantSuite):
    impl = Impl("mosaic", interpret=True, small_k_options=SMALL, max_shape_k=1024, configs_2d=INTERPRET_2D_CONFIGS,
                configs_1d=COVERING_1D_CONFIGS)


@pytest.mark.gpu
class TestMosaicCompiled(KernelQuantSuite):
    impl = Impl("mosaic", interpret=False, small_k_options=SMALL)


# ---------------------------------------------------------------- CPU (interpret) ------


def test_interpret_overlapping_last_program():
    # 131 rows (units) > block_m = 128: two programs, the second overlapping the first, for a
    # plain tensor and for a K-major expert stack (threads walk N there).
    for name in ("token-6", "token-mae-256"):
        check(cpu_input(131, 32, jnp.bfloat16, seed=163), CONFIGS[name], interpret=True)
    w = cpu_input(2 * 32, 131, jnp.bfloat16, seed=5, special=False).reshape(2, 32, 131)  # [E, K, N]
    cfg = C(four_over_six="mae")
    assert_same_bytes(mq.quantize_experts_mosaic(w, cfg, contraction_axis=1, interpret=True),
                      reference(w, cfg, experts=True))


def test_kernel_names_in_lowered_program():
    # Lowered for CUDA on any host: the Mosaic GPU custom call carries the kernel name.
    tiling = mq.MosaicQuantTiling()
    view = mq._View(groups=1, m=128, k=32, band=1, k_major=False)
    x = jnp.zeros((1, 128, 32), jnp.bfloat16)
    t = ref.quantize(x[0], C())
    cases = [
        (mq._quant_call(view, x.dtype, CONFIGS["token-mae-256"], "compute", tiling, False), (x,), mq.QUANT_KERNEL_NAME),
        (mq._amax_call(view, x.dtype, tiling, False), (x,), mq.AMAX_KERNEL_NAME),
        (mq._dequant_call(128, 32, jnp.dtype(jnp.bfloat16), 448, tiling, False),
         (t.codes, t.scales.view(jnp.uint8), jnp.zeros((128,), jnp.float32)), mq.DEQUANT_KERNEL_NAME),
    ]
    for fn, args, name in cases:
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text and name in text, name


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU error path")
def test_compiled_without_gpu_raises():
    with pytest.raises(RuntimeError, match="GPU"):
        mq.quantize_mosaic(jnp.ones((4, 16), jnp.float32), C())
    with pytest.raises(RuntimeError, match="GPU"):
        mq.dequantize_mosaic(ref.quantize(jnp.ones((4, 16), jnp.float32), C()))


def test_validation():
    with pytest.raises(ValueError, match="block_m"):
        mq.MosaicQuantTiling(block_m=100)
    with pytest.raises(ValueError, match="multiple of"):
        mq.quantize_mosaic(jnp.ones((4, 24), jnp.float32), C(), interpret=True)
    with pytest.raises(ValueError, match="multiple of tile"):
        mq.quantize_mosaic(jnp.ones((24, 16), jnp.float32), C(block_2d=True), interpret=True)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        mq.quantize_mosaic(jnp.ones((4, 16), jnp.float16), C(), interpret=True)
    with pytest.raises(ValueError, match="contraction_axis"):
        mq.quantize_experts_mosaic(jnp.ones((2, 16, 16), jnp.float32), C(), contraction_axis=0, interpret=True)


# ---------------------------------------------------------------- GPU (compiled) -------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
@pytest.mark.parametrize("dtype", ["bf16"])
@pytest.mark.parametrize("name", CONFIGS, ids=str)
@pytest.mark.parametrize("m,k", shapes.MOSAIC_OVERLAP)
def test_gpu_matches_reference(m, k, name, dtype):
    # M > block_m (the overlapping last program; the shared suite's M are < 128), odd M and K;
    # bf16, whose short significands put values on rounding boundaries (f32: the shared suite)
    config = CONFIGS[name]
    # an FMA-sensitive config is compared with the reference on the host CPU (see `reference`),
    # whose XLA:CPU deviations `cpu_input` avoids
    if fma_sensitive(config):
        # vs the reference on the host CPU: no f32-subnormal row (XLA:CPU flushes it in the
        # amax) and no NaN (XLA:CPU's min/max NaN handling varies by host; on some hosts a NaN
        # amax gives finite scales). NaN rows of 4/6 are checked in test_gpu_nan_rows_4over6.
        x = make_input(m, k, DTYPES[dtype], seed=m * k, subnormal=False, nan=False)
    else:
        x = make_input(m, k, DTYPES[dtype], seed=m * k)
    check(x, config, interpret=False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if fma_sensitive(c)], ids=str)
def test_gpu_bf16_input_equals_its_f32_upcast(name):
    """The contract quantizes f32(x): bf16 input and its exact f32 upcast must give the same
    bytes from the kernel, and the NumPy oracle's bytes (no XLA reference involved).

    Why bf16 matters: its 8-bit significands put quantities on E4M3/E2M1 rounding boundaries
    often, so a one-ulp arithmetic error shows up in the bytes (a compiled Mosaic GPU float
    division is one ulp off in about a third of the rows on an H200, which only bf16 input turns
    into byte differences often; hence `ieee.integer_divide`). Upcast and bf16 must agree, and
    both must equal the oracle.
    """
    config = CONFIGS[name]
    x = make_input(257, 1024, jnp.bfloat16, seed=13, subnormal=False, nan=False)
    x32 = x.astype(jnp.float32)
    assert_same_bytes(mq.quantize_mosaic(x, config), mq.quantize_mosaic(x32, config))
    want = oracle.quantize_nvfp4(
        np.asarray(x32), scale=config.scale, four_over_six=config.four_over_six,
        e4m3_max=config.e4m3_max, fast_error=config.fast_error,
    )
    got = mq.quantize_mosaic(x, config)
    np.testing.assert_array_equal(np.asarray(got.map4), want.map4)
    np.testing.assert_array_equal(np.asarray(got.scales).view(np.uint8), want.scales)
    np.testing.assert_array_equal(np.asarray(got.codes), want.codes)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_nan_rows_4over6(dtype):
    """A NaN row under 4/6 (per token): every scale byte is 0x7F (NaN) and the row's bytes
    equal the XLA:GPU reference's (a NaN error never chooses map-4; no FMA question there)."""
    x = make_input(131, 272, DTYPES[dtype], seed=7)
    for name in ("token-mae-256", "token-mse-448-fast"):
        got, want = mq.quantize_mosaic(x, CONFIGS[name]), ref.quantize(x, CONFIGS[name])
        assert np.all(np.asarray(got.scales).view(np.uint8)[4] == 0x7F)
        for field in ("codes", "scales", "map4"):
            g, w = np.asarray(getattr(got, field))[4], np.asarray(getattr(want, field))[4]
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=f"{name} {field}")
        assert np.isnan(np.asarray(got.amax)[4, 0])


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if fma_sensitive(c)], ids=str)
def test_gpu_fma_sensitive_vs_numpy_oracle(name):
    """Kernel vs the independent NumPy oracle (never fuses) on a large input; also reports how
    many 4/6 decisions the reference evaluated by XLA:GPU gets differently (FMA contraction)."""
    config = CONFIGS[name]
    x = make_input(2048, 1024, jnp.float32, seed=11, special=False)
    got = mq.quantize_mosaic(x, config)
    want = oracle.quantize_nvfp4(
        np.asarray(x), scale=config.scale, four_over_six=config.four_over_six,
        e4m3_max=config.e4m3_max, fast_error=config.fast_error,
    )
    xla_gpu = ref.quantize(x, config)
    n_xla = int(np.sum(np.asarray(xla_gpu.map4) != want.map4))
    n_cpu = int(np.sum(np.asarray(reference(x, config).map4) != want.map4))
    print(f"\n{name}: 4/6 decisions differing from the oracle: XLA:GPU reference {n_xla}, "
          f"XLA:CPU reference {n_cpu}, kernel {int(np.sum(np.asarray(got.map4) != want.map4))} "
          f"(of {want.map4.size})")
    np.testing.assert_array_equal(np.asarray(got.map4), want.map4)
    np.testing.assert_array_equal(np.asarray(got.scales).view(np.uint8), want.scales)
    np.testing.assert_array_equal(np.asarray(got.codes), want.codes)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
def test_gpu_given_amax_and_block_k():
    x = make_input(200, 1024, jnp.bfloat16, seed=5, special=False)
    tiled = mq.MosaicQuantTiling(block_m=128, block_k=256)
    for cfg, amax in [
        (C(scale="tensor"), jnp.float32(3.0)),
        (C(scale="tensor", four_over_six="mae"), jnp.max(jnp.abs(x.astype(jnp.float32)))),
        (C(scale="token", four_over_six="mse", fast_error=True), jnp.max(jnp.abs(x.astype(jnp.float32)), -1, keepdims=True)),
    ]:
        got = mq.quantize_mosaic(x, cfg, amax=amax, tiling=tiled)
        assert_same_bytes(got, reference(x, cfg, amax))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
def test_gpu_dequantize_and_rerun_bitwise():
    x = make_input(300, 1024, jnp.bfloat16, seed=6)
    cfg = C(scale="token", four_over_six="mae")
    a = mq.quantize_mosaic(x, cfg)
    b = jax.jit(lambda v: mq.quantize_mosaic(v, cfg))(x)
    assert_same_bytes(a, b)  # kernel vs itself (jit, rerun): bit-exact
    for dtype in (jnp.float32, jnp.bfloat16):
        got = np.asarray(mq.dequantize_mosaic(a, dtype))
        np.testing.assert_array_equal(got.view(np.uint8), np.asarray(ref.dequantize(a, dtype)).view(np.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
def test_gpu_kernel_name_in_jit_lowering():
    x = jnp.zeros((128, 32), jnp.bfloat16)
    text = jax.jit(lambda v: mq.quantize_mosaic(v, CONFIGS["token-6"])).lower(x).as_text()
    assert mq.QUANT_KERNEL_NAME in text


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
@pytest.mark.parametrize("name", ["2d-6", "2d-mse-256", "2d-mae-448-fast"])
def test_gpu_2d_tiles_and_expert_stacks(name):
    """16x16 tiles with more bands than one program (2064 rows = 129 bands of 16 > block_m) and
    a K-major expert stack [E, K, N] with N = 304 > block_m, against the reference."""
    config = {"2d-6": C(block_2d=True), "2d-mse-256": C(block_2d=True, four_over_six="mse"),
              "2d-mae-448-fast": C(block_2d=True, four_over_six="mae", e4m3_max=448, fast_error=True)}[name]
    x = make_input(2064, 64, jnp.bfloat16, seed=21, subnormal=False, nan=False)
    check(x, config, interpret=False)
    w = make_input(3 * 64, 304, jnp.bfloat16, seed=22, special=False).reshape(3, 64, 304)  # [E, K, N]
    for cfg in (config, dataclasses.replace(config, block_2d=False, scale="token")):
        assert_same_bytes(mq.quantize_experts_mosaic(w, cfg, contraction_axis=1), reference(w, cfg, experts=True))
