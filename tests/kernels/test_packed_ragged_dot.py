"""The training-size grouped GEMM on a packed NVFP4 weight (`pallas_kernels.grouped_gemm.packed_ragged_dot`).

On the CPU the kernel runs in the Mosaic GPU interpreter and is lowered for sm_90; the `gpu`-marked
variants run it compiled (`pytest -m gpu tests/kernels/test_packed_ragged_dot.py`). References: the
emulated forward and dgrad (`nvfp4.scaled_operand`, then the XLA grouped GEMM) bit for bit where the
f32 sums are exact, the float64 oracle under the f32 accumulation bound otherwise. Shapes: an empty
group, row tiles shared by two groups, rows past the groups, several column tiles and K steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import grouped
from pallas_kernels.grouped_gemm import packed_ragged_dot as prd
from pallas_kernels.grouped_gemm import wgmma_nvfp4 as wn
from pallas_kernels.grouped_gemm.tunables import GroupedGemmTiles
from tests.grouped_oracle import accumulation_bound, assert_within, exact_matmul
from tests.kernels.test_packed_weight_gemm import _activations, _operand, _weight

# (rows R, weight N, weight K, group sizes): group boundaries inside row tiles, an empty group,
# rows past the groups (130 of 140 in groups)
CASES = {
    "shared-tiles-past-the-groups": (140, 128, 128, (40, 0, 70, 20)),
    "empty-first": (64, 64, 256, (0, 50, 14)),
}
SMALL_TILES = GroupedGemmTiles(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2)
BACKENDS = [pytest.param(True, id="interpret"), pytest.param(False, id="compiled", marks=pytest.mark.gpu)]
DIRECTIONS = [pytest.param(False, id="forward"), pytest.param(True, id="dgrad")]
DTYPES = [pytest.param(jnp.float16, id="f16"), pytest.param(jnp.bfloat16, id="bf16")]


def _problem(case, dgrad, dtype, exact_sums=True):
    rows, n, k, sizes = CASES[case]
    codes, scales = _weight(len(sizes), n, k, exact_sums=exact_sums)
    a = _activations(rows, n if dgrad else k, exact_sums=exact_sums).astype(dtype)
    return a, codes, scales, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dgrad", DIRECTIONS)
@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_packed_ragged_dot_is_the_emulated_gemm_bit_for_bit(case, interpret, dgrad, dtype):
    a, codes, scales, sizes = _problem(case, dgrad, dtype)
    # multiples of 1/8: exact in f16 and bf16, so one reference serves both
    want = grouped.ragged_matmul(a.astype(jnp.bfloat16), _operand(codes, scales), sizes, gemm="xla", transpose_rhs=not dgrad)
    weight = wn.pack_for_wgmma(codes, scales)
    # the default tiles (fitted to the shapes) too for the model's pairs: f16 forward, bf16 dgrad
    model_pair = (dtype == jnp.bfloat16) == dgrad
    for tiles in (SMALL_TILES, None) if model_pair else (SMALL_TILES,):
        got = prd.grouped_matmul_packed(a, weight, sizes, dgrad=dgrad, tiles=tiles, interpret=interpret)
        assert got.dtype == jnp.float32 and got.shape == want.shape
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), tiles
    total = int(sizes.sum())
    assert not np.asarray(got[total:]).any() and np.asarray(got[:total]).any()


@pytest.mark.parametrize("interpret", BACKENDS)
def test_x_read_packed_too_is_the_emulated_forward_bit_for_bit(interpret):
    """x given as its NVFP4 codes and scales (`pack_rows`): both tiles decoded in the kernel, the
    same bytes as the emulated forward on x's scaled operand."""
    rows, n, k, sizes = CASES["shared-tiles-past-the-groups"]
    codes, scales = _weight(len(sizes), n, k, exact_sums=True)
    x_codes, x_scales = (v[0] for v in _weight(1, rows, k, seed=3, exact_sums=True))  # [R, K/2], [R, K/16]
    x = _operand(x_codes[None], x_scales[None])[0]  # dec(q) sf, exact in bf16
    group_sizes = jnp.asarray(sizes, jnp.int32)
    want = grouped.ragged_matmul(x, _operand(codes, scales), group_sizes, gemm="xla", transpose_rhs=True)
    packed = prd.pack_rows(x_codes, x_scales)
    assert packed.codes.shape == (rows, k) and packed.scales.shape == (k // 16, rows)
    got = prd.grouped_matmul_packed(packed, wn.pack_for_wgmma(codes, scales), group_sizes, tiles=SMALL_TILES,
                                    interpret=interpret)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


@pytest.mark.parametrize("dgrad", DIRECTIONS)
@pytest.mark.parametrize("interpret", BACKENDS)
def test_within_the_f32_accumulation_bound(interpret, dgrad):
    a, codes, scales, sizes = _problem("shared-tiles-past-the-groups", dgrad, jnp.bfloat16, exact_sums=False)
    w = _operand(codes, scales)  # [E, N, K] bf16
    rhs = w if dgrad else jnp.swapaxes(w, 1, 2)
    exact, magnitude = exact_matmul(a, rhs, [int(s) for s in sizes])
    got = prd.grouped_matmul_packed(a, wn.pack_for_wgmma(codes, scales), sizes, dgrad=dgrad, tiles=SMALL_TILES,
                                    interpret=interpret)
    assert_within(got, exact, accumulation_bound(magnitude, a.shape[1]), f"packed ragged dot, dgrad={dgrad}")


def test_a_nan_scale_makes_nan_only_where_its_block_is_used():
    """A NaN scale byte at (expert 2, weight row 70, K block 3): the forward's column 70 and the
    dgrad's columns 48..63 (the block's 16 K) turn NaN in expert 2's rows only."""
    a, codes, scales, sizes = _problem("shared-tiles-past-the-groups", False, jnp.bfloat16)
    scale_bytes = np.array(jax.lax.bitcast_convert_type(scales, jnp.uint8))
    scale_bytes[2, 70, 3] = 0x7F
    weight = wn.pack_for_wgmma(codes, jnp.asarray(scale_bytes))
    forward = np.asarray(prd.grouped_matmul_packed(a, weight, sizes, tiles=SMALL_TILES, interpret=True))
    nan = np.zeros(forward.shape, bool)
    nan[40:110, 70] = True
    assert np.array_equal(np.isnan(forward), nan)
    g = _activations(a.shape[0], 128, exact_sums=True)
    dgrad = np.asarray(prd.grouped_matmul_packed(g, weight, sizes, dgrad=True, tiles=SMALL_TILES, interpret=True))
    nan = np.zeros(dgrad.shape, bool)
    nan[40:110, 48:64] = True
    assert np.array_equal(np.isnan(dgrad), nan)


def test_bad_operands_are_refused_with_what_is_valid():
    a, codes, scales, sizes = _problem("empty-first", False, jnp.bfloat16)
    weight = wn.pack_for_wgmma(codes, scales)
    with pytest.raises(TypeError, match="a must be float16 or bfloat16"):
        prd.grouped_matmul_packed(a.astype(jnp.float32), weight, sizes, interpret=True)
    with pytest.raises(ValueError, match="a has 256 columns but the dgrad contracts over the weight's N=64"):
        prd.grouped_matmul_packed(a, weight, sizes, dgrad=True, interpret=True)
    with pytest.raises(ValueError, match=r"group_sizes must be integers of shape \(3,\)"):
        prd.grouped_matmul_packed(a, weight, sizes[:2], interpret=True)
    with pytest.raises(TypeError, match="must be a WgmmaNvfp4Weight"):
        prd.grouped_matmul_packed(a, (codes, scales), sizes, interpret=True)
    bad_rows = prd.PackedRows(jnp.zeros((64, 256), jnp.int4), jnp.zeros((64, 16), jnp.uint8))  # scales not [K/16, R]
    with pytest.raises(ValueError, match="PackedRows must hold int4 codes"):
        prd.grouped_matmul_packed(bad_rows, weight, sizes, interpret=True)
    with pytest.raises(ValueError, match="the weight tile \\[32, 64\\]"):  # forward tile [block_n, block_k]
        prd.grouped_matmul_packed(a, weight, sizes, tiles=GroupedGemmTiles(block_m=64, block_n=32, block_k=64),
                                  interpret=True)
    with pytest.raises(ValueError, match="max_concurrent_steps=1 must be >= 2"):
        prd.grouped_matmul_packed(a, weight, sizes, tiles=GroupedGemmTiles(max_concurrent_steps=1), interpret=True)
    if jax.default_backend() != "gpu":
        with pytest.raises(RuntimeError, match="no silent XLA fallback"):
            prd.grouped_matmul_packed(a, weight, sizes)


@pytest.mark.parametrize("dgrad", DIRECTIONS)
def test_lowers_to_mosaic_gpu_for_sm90(dgrad):
    """On CPU CI: the compiled kernel (f16 and bf16 operands, the default tiles, a 128-expert layer of
    [2048 -> 768] and the h200 model's gate|up [512 -> 256]) goes through Mosaic GPU's layout inference
    and lowering for sm_90. It does not run ptxas; the `gpu` tests above do."""
    for e, n, k in ((128, 768, 2048), (32, 256, 512)):
        weight = wn.WgmmaNvfp4Weight(codes=jax.ShapeDtypeStruct((e, n, k), jnp.int4),
                                     scales=jax.ShapeDtypeStruct((e, k // 16, n), jnp.uint8))
        sizes = jax.ShapeDtypeStruct((e + 1,), jnp.int32)
        tiles = GroupedGemmTiles().fit(block_n=k if dgrad else n, block_k=n if dgrad else k)
        for dtype in (jnp.float16, jnp.bfloat16):
            a = jax.ShapeDtypeStruct((4096, n if dgrad else k), dtype)
            text = jax.jit(lambda a, w, s: prd._packed_ragged_dot(a, w, s, dgrad=dgrad, tiles=tiles, num_programs=132,
                                                                  interpret=False)).trace(a, weight, sizes).lower(
                lowering_platforms=("cuda",)).as_text()
            assert "mosaic_gpu" in text and prd.KERNEL_NAME in text, (e, n, k, dtype)


def test_pipeline_has_no_races():
    """The interpreter's happens-before race detector over the kernel's TMA pipeline and its two
    decode buffers: the contraction spans 3 blocks of 64 through 2 stages (each released one step
    late), tiles shared by two groups, x read packed. The interpreter runs WGMMA synchronously, so a
    missing `wgmma_wait` only shows compiled."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks  # the detector's verdict
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = plgpu.InterpretGPUParams(detect_races=True)
    codes, scales = _weight(2, 64, 192, exact_sums=True)
    weight = wn.pack_for_wgmma(codes, scales)
    sizes = jnp.asarray([40, 60], jnp.int32)
    x_codes, x_scales = (v[0] for v in _weight(1, 128, 192, seed=3, exact_sums=True))
    prd.grouped_matmul_packed(prd.pack_rows(x_codes, x_scales), weight, sizes, tiles=SMALL_TILES,
                              interpret=params).block_until_ready()
    assert not gpu_callbacks.get_races().races_found, "race in the forward"
    g = _activations(128, 192, exact_sums=True)
    big = wn.pack_for_wgmma(*_weight(2, 192, 64, exact_sums=True))  # dgrad: contraction N = 192
    prd.grouped_matmul_packed(g, big, sizes, dgrad=True, tiles=SMALL_TILES, interpret=params).block_until_ready()
    assert not gpu_callbacks.get_races().races_found, "race in the dgrad"
