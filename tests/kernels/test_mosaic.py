"""Mosaic GPU NVFP4 quantizer vs the reference `fp4rl.formats.nvfp4`, byte for byte.

CPU: every kernel call runs in the Mosaic GPU interpreter (`interpret=True`, which jax 0.11.2
has: `plgpu.InterpretGPUParams`), and the kernels are lowered for CUDA (no GPU needed) to
show their names in the lowered program. GPU (`-m gpu`): the compiled kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import nvfp4 as ref
from pallas_kernels import mosaic_quant as mq

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

    Why: the *reference* on XLA:CPU deviates from NUMERICS.md there (not the kernel): its
    `jnp.max(|x|)` flushes f32 subnormals to 0 (amax 0 instead of the subnormal), and for
    bf16 input the fused convert+abs+max drops a NaN (finite amax instead of NaN, s8). The
    kernel follows the contract (integer max on the bits); the GPU tests keep both rows.
    """
    return make_input(m, k, dtype, seed, special, subnormal=False, nan=jnp.dtype(dtype) == jnp.float32)


def assert_same_bytes(got: ref.NVFP4Tensor, want: ref.NVFP4Tensor):
    """Bit-exact on raw bytes (DESIGN.md practice 4): codes, scale bytes, amax bits, map4."""
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
    """4/6 errors have products feeding adds (s3: fl(d*d) summed, fl(v - fl(x*S_enc)),
    fl(fl(dq*A)/6E) - x), which XLA:GPU may contract into FMAs inside the reference's fused
    kernels (or turn the division by 6E into a multiply), against the contract ("no FMA
    anywhere"). The kernel blocks contraction, so these are compared on the host CPU."""
    return config.four_over_six is not None


def reference(x, config, amax=None):
    """The reference's bytes; FMA-sensitive configs are evaluated on the host CPU (no FMA)."""
    if ON_GPU and fma_sensitive(config):
        cpu = jax.devices("cpu")[0]
        x, amax = jax.device_put((x, amax), cpu)
        with jax.default_device(cpu):
            return ref.quantize(x, config, amax=amax)
    return ref.quantize(x, config, amax=amax)


def check(x, config, *, amax=None, interpret):
    got = mq.quantize_mosaic(x, config, amax=amax, interpret=interpret)
    assert_same_bytes(got, reference(x, config, amax))
    return got


# ---------------------------------------------------------------- CPU (interpret) ------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CONFIGS, ids=str)
def test_interpret_matches_reference(name, dtype):
    # odd M (7 < 128 rows: one padded program) and K = 272 (17 blocks, not a power of two)
    check(cpu_input(7, 272, DTYPES[dtype], seed=1), CONFIGS[name], interpret=True)


@pytest.mark.parametrize("m,k", [(1, 16), (3, 32), (131, 32)])
def test_interpret_shapes(m, k):
    # M = 131 > block_m = 128: two programs, the second overlapping the first
    for name in ("token-6", "token-mae-256"):
        check(cpu_input(m, k, jnp.bfloat16, seed=m + k), CONFIGS[name], interpret=True)


def test_interpret_given_amax():
    x = cpu_input(6, 32, jnp.float32, seed=3, special=False)
    check(x, C(scale="tensor"), amax=jnp.float32(37.5), interpret=True)
    check(x, C(scale="tensor", four_over_six="mae"), amax=jnp.max(jnp.abs(x)), interpret=True)
    row_amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True) * 2
    check(x, C(scale="token", four_over_six="mse"), amax=row_amax, interpret=True)


def test_interpret_reference_vectors():
    # NUMERICS.md s3: E = 256, A = 1536 (S_enc = 1), MAE; blocks [1536], [6, 5], [6, 4], 0.
    blocks = [[1536.0], [6.0, 5.0], [6.0, 4.0], []]
    x = np.zeros((1, 64), np.float32)
    for j, vals in enumerate(blocks):
        x[0, 16 * j : 16 * j + len(vals)] = vals
    t = mq.quantize_mosaic(jnp.asarray(x), C(four_over_six="mae"), interpret=True)
    assert np.asarray(t.scales).view(np.uint8).tolist() == [[0x78, 0x3C, 0x38, 0x00]]
    assert np.asarray(t.map4).tolist() == [[False, True, False, False]]
    assert int(np.asarray(t.codes)[0, 8]) == 0x56


def test_interpret_dequantize_matches_reference():
    x = cpu_input(6, 48, jnp.float32, seed=4)
    for cfg in (C(scale="token", four_over_six="mae"), C(scale="tensor")):
        t = ref.quantize(x, cfg)
        for dtype in (jnp.float32, jnp.bfloat16):
            got = np.asarray(mq.dequantize_mosaic(t, dtype, interpret=True))
            want = np.asarray(ref.dequantize(t, dtype))
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_kernel_names_in_lowered_program():
    # Lowered for CUDA on any host: the Mosaic GPU custom call carries the kernel name.
    tiling = mq.MosaicQuantTiling()
    x = jnp.zeros((128, 32), jnp.bfloat16)
    cases = [
        (mq._quant_call(128, 32, x.dtype, CONFIGS["token-mae-256"], "compute", tiling, False), (x,), mq.QUANT_KERNEL_NAME),
        (mq._amax_call(128, 32, x.dtype, tiling, False), (x,), mq.AMAX_KERNEL_NAME),
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
    with pytest.raises(NotImplementedError, match="2D"):
        mq.quantize_mosaic(jnp.ones((16, 16), jnp.float32), C(block_2d=True), interpret=True)


# ---------------------------------------------------------------- GPU (compiled) -------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compiled Mosaic GPU kernels need a CUDA GPU (Hopper or newer)")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CONFIGS, ids=str)
@pytest.mark.parametrize("m,k", [(7, 16), (300, 32), (129, 272), (257, 1024), (33, 8192)])
def test_gpu_matches_reference(m, k, name, dtype):
    # odd M, M < and > block_m (padding / overlapping last program), K from 1 to 512 blocks
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
    often, so a one-ulp arithmetic error shows up in the bytes (session 5: the compiled kernel's
    divisions were one ulp off in ~1/3 of the rows, bf16 cases failed, f32 ones passed; fixed by
    `ieee.integer_divide`). Upcast and bf16 must agree, and both must equal the oracle.
    """
    from tests.formats import oracle

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
    from tests.formats import oracle

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
