"""The Mosaic GPU grouped GEMMs (`pallas_kernels.grouped_gemm`) against the XLA reference.

On the CPU every kernel runs in the Mosaic GPU interpreter (`interpret=True`, or the backend
"mosaic_interpret" through `fp4rl.grouped` / `qdot`); the `gpu`-marked variants run the same
checks compiled (`pytest -m gpu tests/kernels/test_grouped_gemm.py` on a Hopper GPU). Shapes are
tiny (each interpreted kernel call takes ~1 s) but cover what the kernels special-case: an
empty group (first and in the middle), group boundaries inside a row tile / token block, a group
over several blocks, rows past sum(group_sizes), rows that are not a multiple of the block.

Tolerance (derived, not tuned; `tests.grouped_oracle`): both backends are compared with the
exact (float64) result under the f32 accumulation bound, elementwise. The qdot-level checks
(gradient, vmap over seeds) also hold the XLA "blocked" backend (`fp4rl.blocked_gemm`) to it.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4rl import grouped, operands, qlinear
from fp4rl.model import forward, init
from fp4rl.model.config import ModelConfig
from fp4rl.recipe import PrecisionRecipe, SiteConfig
from tests.grouped_oracle import U, accumulation_bound, assert_within, exact_matmul, exact_wgrad, random_operands
from pallas_kernels.grouped_gemm import FORWARD_TILES, WGRAD_TILES, GroupedGemmTiles, grouped_matmul, grouped_wgrad
from pallas_kernels.grouped_gemm import ragged_dot as forward_kernel
from pallas_kernels.grouped_gemm import transposed_ragged_dot as wgrad_kernel

ON_GPU = jax.default_backend() == "gpu"
# (rows R, K, N, group sizes): forward tiles are 128 rows, wgrad token blocks 64 (tunables.py)
FORWARD_CASES = {
    "pad-rows-empty-middle": (96, 64, 128, (40, 0, 24)),  # R padded to 128; rows 64..95 past the groups
    "empty-first-full-cover": (128, 128, 64, (0, 64, 32, 32)),
}
WGRAD_CASES = {
    "boundaries-inside-blocks": (128, 64, 64, (40, 0, 80)),  # 80 rows: 3 token blocks, 2 partial
    "past-the-groups": (96, 64, 128, (0, 32, 16)),  # R padded to 128; rows 48..95 ignored
}
BACKENDS = [pytest.param(True, id="interpret"), pytest.param(False, id="compiled", marks=pytest.mark.gpu)]
GEMMS = [pytest.param("mosaic_interpret", id="interpret"), pytest.param("mosaic", id="compiled", marks=pytest.mark.gpu)]
QDOT_GEMMS = [*GEMMS, pytest.param("blocked", id="blocked"), pytest.param("packed_interpret", id="packed-interpret"),
              pytest.param("packed", id="packed-compiled", marks=pytest.mark.gpu),
              pytest.param("packed_dgrad_interpret", id="packed-dgrad-interpret"),
              pytest.param("packed_dgrad", id="packed-dgrad-compiled", marks=pytest.mark.gpu),
              pytest.param("packed_wgmma_interpret", id="packed-wgmma-interpret"),
              pytest.param("packed_wgmma", id="packed-wgmma-compiled", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["fwd", "dgrad"])
@pytest.mark.parametrize("case", FORWARD_CASES)
def test_grouped_matmul_matches_ragged_dot(case, transpose_rhs, interpret):
    rows, k, n, sizes = FORWARD_CASES[case]
    a, b = random_operands([(rows, k), (len(sizes), k, n)])
    group_sizes = jnp.asarray(sizes, jnp.int32)
    out = grouped_matmul(a, jnp.swapaxes(b, 1, 2) if transpose_rhs else b, group_sizes, transpose_rhs=transpose_rhs,
                         interpret=interpret)
    assert out.dtype == jnp.float32 and out.shape == (rows, n)
    exact, mag = exact_matmul(a, b, sizes)
    bound = accumulation_bound(mag, k)
    assert_within(out, exact, bound, "grouped_matmul")
    assert_within(jax.lax.ragged_dot(a, b, group_sizes, preferred_element_type=jnp.float32), exact, bound, "lax.ragged_dot")
    np.testing.assert_array_equal(np.asarray(out)[sum(sizes):], 0.0)  # rows past the groups


@pytest.mark.parametrize("interpret", BACKENDS)
@pytest.mark.parametrize("case", WGRAD_CASES)
def test_grouped_wgrad_matches_ragged_dot_general(case, interpret):
    rows, k, n, sizes = WGRAD_CASES[case]
    a, g = random_operands([(rows, k), (rows, n)], seed=1)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    out = grouped_wgrad(a, g, group_sizes, interpret=interpret)
    assert out.dtype == jnp.float32 and out.shape == (len(sizes), k, n)
    exact, mag = exact_wgrad(a, g, sizes)
    bound = accumulation_bound(mag, max(sizes))
    assert_within(out, exact, bound, "grouped_wgrad")
    assert_within(grouped.ragged_wgrad(a, g, group_sizes), exact, bound, "ragged_dot_general")
    np.testing.assert_array_equal(np.asarray(out)[np.asarray(sizes) == 0], 0.0)  # empty groups


@pytest.mark.parametrize("gemm", GEMMS)
def test_mixed_precision_wgrad_splits_f32_exactly(gemm):
    """An f32 operand against a bf16 one (the per-token dequantized wgrad): three exact bf16 parts."""
    rows, k, n, sizes = WGRAD_CASES["boundaries-inside-blocks"]
    a = random_operands([(rows, k)], seed=2, dtype=jnp.float32)[0] * 1e-3  # f32 values with 24-bit significands
    (g,) = random_operands([(rows, n)], seed=3)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    out = grouped.ragged_wgrad(a, g, group_sizes, gemm=gemm)
    exact, mag = exact_wgrad(a, g, sizes)
    # Three partial GEMMs of max(sizes) terms each, then two additions of the partial results.
    assert_within(out, exact, accumulation_bound(mag, max(sizes) + 2), "split wgrad")


# ---------------------------------------------------------------- through qdot: grad and vmap
R, D, F, SIZES = 64, 64, 64, (32, 0, 16)  # rows past the groups: 48..63 (padding_rows)
SITES = {
    "bf16": SiteConfig(),
    "nvfp4-dequantized": SiteConfig(format="nvfp4", backward="dequantized"),  # per-token: the f32 split wgrad
}


def _qdot_vjp(site, x, w, g, gemm, sizes=SIZES):
    y, pull = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, group_sizes=jnp.asarray(sizes, jnp.int32),
                                                 padding_rows=True, gemm=gemm), x, w)
    return (y, *pull(g))


def _gemm_operands(site, x, w):
    """|x|-side and |w|-side operands the site's GEMMs see (for the bounds): DQ(Q(.)) or raw."""
    if not site.quantized:
        return x.astype(jnp.float32), w.astype(x.dtype).astype(jnp.float32)
    xq = operands.dequantized(operands.quantize(x, site, "act"))
    wq = jnp.swapaxes(jax.vmap(operands.dequantized)(qlinear.quantize_weight(w, site)), 1, 2)
    return xq, wq


def _bf16_ulp(v):
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(np.asarray(v, np.float64)), 1e-30))) - 7)


def _assert_vjps_agree(site, x, w, g, ours, ref, what, sizes=SIZES):
    """(y, dx, dw) of two backends for one problem. Each f32 GEMM result is within the
    accumulation bound of the exact one, so the two differ by at most twice that; an NVFP4 site
    then multiplies y and dx by its decode scales (two f32 roundings each: 4u |y| between the
    two); y and dx are rounded to bf16, which can put two such f32 values on either side of a
    rounding boundary: one bf16 ulp more. dw stays f32 (the parameters are f32); the f32 split
    wgrad sums three partial GEMMs (two more additions)."""
    xv, wv = _gemm_operands(site, x, w)
    _, mag_y = exact_matmul(xv, wv, sizes)
    _, mag_dx = exact_matmul(g, jnp.swapaxes(wv, 1, 2), sizes)
    _, mag_dw = exact_wgrad(xv, g, sizes)
    for name, a, b, mag, n, rounded in (("y", ours[0], ref[0], mag_y, D, True), ("dx", ours[1], ref[1], mag_dx, F, True),
                                        ("dw", ours[2], ref[2], mag_dw, max(sizes) + 2, False)):
        b = np.asarray(b, np.float64)
        bound = 2 * accumulation_bound(mag, n) + (4 * U * np.abs(b) + _bf16_ulp(b) if rounded else 0)
        assert_within(a, b, bound, f"{what} {name}")
    np.testing.assert_array_equal(np.asarray(ours[0])[sum(sizes):], 0.0)  # rows past the groups


def _f32_params(seed):
    return random_operands([(len(SIZES), D, F)], seed=seed, dtype=jnp.float32)[0] * 0.1  # f32 parameters, bf16 compute


@pytest.mark.parametrize("gemm", QDOT_GEMMS)
@pytest.mark.parametrize("site_name", SITES)
def test_qdot_grad_matches_xla(site_name, gemm):
    """y, dx, dw of a ragged qdot (custom_vjp: forward, dgrad, wgrad): the Mosaic kernels (and
    the blocked XLA backend) vs "xla"."""
    site = SITES[site_name]
    x, g = random_operands([(R, D), (R, F)], seed=4)
    w = _f32_params(5)
    _assert_vjps_agree(site, x, w, g, _qdot_vjp(site, x, w, g, gemm), _qdot_vjp(site, x, w, g, "xla"), site_name)


@pytest.mark.parametrize("gemm", [pytest.param("packed_wgmma_interpret", id="interpret"),
                                  pytest.param("packed_wgmma", id="compiled", marks=pytest.mark.gpu)])
def test_packed_wgmma_at_training_sizes_matches_xla(gemm):
    """64+ rows per expert: the NVFP4 forward takes x as its codes and scales too (both operands
    decoded in the kernel), the dgrad reads the packed weight; y, dx, dw as on "xla", alone and
    vmapped over 2 seeds."""
    site, sizes, rows = SITES["nvfp4-dequantized"], (128, 0, 64), 256  # rows 192..255 past the groups
    x, g = random_operands([(2, rows, D), (2, rows, F)], seed=17)
    w = _f32_params(18)
    ours = _qdot_vjp(site, x[0], w, g[0], gemm, sizes)
    _assert_vjps_agree(site, x[0], w, g[0], ours, _qdot_vjp(site, x[0], w, g[0], "xla", sizes), "one seed", sizes)
    ours = jax.vmap(lambda x, g: _qdot_vjp(site, x, w, g, gemm, sizes))(x, g)
    ref = jax.vmap(lambda x, g: _qdot_vjp(site, x, w, g, "xla", sizes))(x, g)
    for s in range(2):
        _assert_vjps_agree(site, x[s], w, g[s], [v[s] for v in ours], [v[s] for v in ref], f"seed {s}", sizes)


@pytest.mark.parametrize("gemm", QDOT_GEMMS)
def test_qdot_vmap_over_seeds_matches_xla(gemm):
    """vmap over 2 seeds (batched x and g, shared w and sizes): the folded ragged problem of
    `fp4rl.grouped` runs on the kernels as on XLA."""
    site = SITES["nvfp4-dequantized"]
    x, g = random_operands([(2, R, D), (2, R, F)], seed=6)
    w = _f32_params(7)
    ours = jax.vmap(lambda x, g: _qdot_vjp(site, x, w, g, gemm))(x, g)
    ref = jax.vmap(lambda x, g: _qdot_vjp(site, x, w, g, "xla"))(x, g)
    for s in range(2):
        _assert_vjps_agree(site, x[s], w, g[s], [v[s] for v in ours], [v[s] for v in ref], f"seed {s}")


@pytest.mark.parametrize("steps", [1, 2], ids=["1-stage", "2-stage"])
def test_pipelines_have_no_races(steps):
    """The interpreter's happens-before race detector over pipelines that wrap around their SMEM
    buffers: K (forward) and the tokens (wgrad) span 5 blocks of 64 through 1 or 2 stages (the
    forward needs 2: it releases each buffer one step late), tiles shared by two groups. It
    tracks the TMA copies and SMEM accesses (an unawaited TMA store fails the kernel); the
    interpreter runs WGMMA synchronously, so a missing `wgmma_wait` only shows compiled."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks  # the detector's verdict

    tiles = GroupedGemmTiles(block_m=64, block_n=64, block_k=64, max_concurrent_steps=steps)
    params = plgpu.InterpretGPUParams(detect_races=True)
    a, b, x, g = random_operands([(128, 320), (2, 320, 64), (320, 64), (320, 64)], seed=8)
    if steps > 1:
        grouped_matmul(a, b, jnp.asarray([40, 88], jnp.int32), tiles=tiles, interpret=params).block_until_ready()
        assert not gpu_callbacks.get_races().races_found, "race in the forward kernel"
    else:
        with pytest.raises(ValueError, match="max_concurrent_steps=1 must be >= 2"):
            grouped_matmul(a, b, jnp.asarray([40, 88], jnp.int32), tiles=tiles, interpret=params)
    grouped_wgrad(x, g, jnp.asarray([80, 176], jnp.int32), tiles=tiles, interpret=params).block_until_ready()
    assert not gpu_callbacks.get_races().races_found, "race in the wgrad kernel"


# ---------------------------------------------------------------- the compiled kernels' lowering
H200_SMS = 132
# (rows, K, N, experts): the benchmark's layer, and the h200 model preset's expert down
# projection (F=128 -> D=512, 32 experts; rows padded to the 128-row tile) whose K=128 and
# dgrad N=128 are the narrowest dimensions the default tiles meet; the tests' own tiny shape.
LOWERING_SHAPES = {"bench": (16384, 2048, 768, 128), "h200-down": (17408, 128, 512, 32), "tests": (128, 64, 64, 3)}


@pytest.mark.parametrize("kind", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("shape", LOWERING_SHAPES)
def test_default_tiles_lower_for_the_gpu(shape, kind):
    """On any machine: jit-lowering for CUDA runs the whole Mosaic GPU lowering (layouts, WGMMA
    shapes, the SMEM budget: it raises "exceeds available shared memory") of the default tiles
    at the H200 shapes, and the kernel's name is in the program."""
    rows, k, n, experts = LOWERING_SHAPES[shape]
    a = jax.ShapeDtypeStruct((rows, k), jnp.bfloat16)
    if kind == "wgrad":
        tiles = WGRAD_TILES.fit(block_m=k, block_n=n)
        fn = functools.partial(wgrad_kernel.transposed_ragged_dot, **dataclasses.asdict(tiles), num_programs=H200_SMS)
        args, name = (a, jax.ShapeDtypeStruct((rows, n), jnp.bfloat16), jax.ShapeDtypeStruct((experts,), jnp.int32)), wgrad_kernel.KERNEL_NAME
    else:
        out, inner = (k, n) if kind == "dgrad" else (n, k)  # dgrad: [rows, N] @ w[e]^T, w [E, K, N]
        a = jax.ShapeDtypeStruct((rows, inner), jnp.bfloat16)
        tiles = FORWARD_TILES.fit(block_n=out, block_k=inner)
        fn = functools.partial(forward_kernel.ragged_dot, **dataclasses.asdict(tiles), num_programs=H200_SMS,
                               transpose_rhs=kind == "dgrad")
        b = jax.ShapeDtypeStruct((experts, k, n), jnp.bfloat16)
        args, name = (a, b, jax.ShapeDtypeStruct((experts + 1,), jnp.int32)), forward_kernel.KERNEL_NAME
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and name in text


@pytest.mark.gpu
def test_qdot_on_mosaic_runs_both_kernels():
    """The compiled program of a ragged qdot's vjp on gemm="mosaic" holds both kernels (by name),
    and on gemm="xla" neither."""
    x, g = random_operands([(R, D), (R, F)], seed=9)
    w = _f32_params(10)
    for gemm, present in (("mosaic", True), ("xla", False)):
        text = jax.jit(lambda x, w, g, gemm=gemm: _qdot_vjp(SITES["bf16"], x, w, g, gemm)).lower(x, w, g).as_text()
        assert (forward_kernel.KERNEL_NAME in text, wgrad_kernel.KERNEL_NAME in text) == (present, present), gemm


def test_packed_backend_reads_nvfp4_weights_packed():
    """gemm="packed_interpret": an NVFP4 site's forward runs the packed-weight kernel (by name in
    the program) and no bf16 copy of the weight stack is formed; a BF16 site's does not use it."""
    from pallas_kernels.grouped_gemm import packed_weight

    x = random_operands([(R, D)], seed=11)[0]
    w = _f32_params(12)
    sizes = jnp.asarray(SIZES, jnp.int32)
    for site_name, present in (("nvfp4-dequantized", True), ("bf16", False)):
        fn = lambda x, w, site=SITES[site_name]: qlinear.qdot(x, w, site, group_sizes=sizes, padding_rows=True,  # noqa: E731
                                                             gemm="packed_interpret")
        jaxpr = str(jax.make_jaxpr(fn)(x, w))
        assert (packed_weight.KERNEL_NAME in jaxpr) == present, site_name
        if present:  # the forward's only [E, N, K] bf16 arrays would be the dequantized weight
            assert f"bf16[{len(SIZES)},{F},{D}]" not in jaxpr


def test_packed_dgrad_backend_reads_nvfp4_weights_packed_in_the_backward_too():
    """gemm="packed_dgrad_interpret": the vjp of an NVFP4 site (dequantized backward) runs the
    packed forward and the packed dgrad kernels, and no bf16 copy of the weight stack is formed
    anywhere in it; "packed" still forms one for its dgrad (its programs are unchanged)."""
    from pallas_kernels.grouped_gemm import packed_weight

    x, g = random_operands([(R, D), (R, F)], seed=13)
    w = _f32_params(14)
    site = SITES["nvfp4-dequantized"]
    for gemm, packed_dgrad in (("packed_dgrad_interpret", True), ("packed_interpret", False)):
        jaxpr = str(jax.make_jaxpr(lambda x, w, g, gemm=gemm: _qdot_vjp(site, x, w, g, gemm))(x, w, g))
        assert packed_weight.KERNEL_NAME in jaxpr
        assert (packed_weight.DGRAD_KERNEL_NAME in jaxpr) == packed_dgrad, gemm
        assert (f"bf16[{len(SIZES)},{F},{D}]" in jaxpr) != packed_dgrad, gemm


def test_packed_wgmma_backend_reads_nvfp4_weights_packed_on_the_mosaic_kernels():
    """gemm="packed_wgmma_interpret": an NVFP4 site's forward runs `wgmma_nvfp4` at decode sizes and
    `packed_ragged_dot` from 64 rows per expert on (x then read packed too), its dgrad
    `packed_ragged_dot`, by name in the program; no Triton packed kernel and no bf16 copy of the
    weight stack anywhere in the vjp. The decode kernel's row tile follows the rows per expert."""
    from pallas_kernels.grouped_gemm import packed_ragged_dot, packed_weight, wgmma_nvfp4

    site = SITES["nvfp4-dequantized"]
    w = _f32_params(16)
    for rows, sizes, forward_name in ((R, SIZES, wgmma_nvfp4.KERNEL_NAME),
                                        (256, (128, 0, 64), packed_ragged_dot.KERNEL_NAME)):
        x, g = random_operands([(rows, D), (rows, F)], seed=15)
        fn = lambda x, w, g, sizes=sizes: jax.vjp(lambda x, w: qlinear.qdot(  # noqa: E731
            x, w, site, group_sizes=jnp.asarray(sizes, jnp.int32), padding_rows=True, gemm="packed_wgmma_interpret"),
            x, w)[1](g)
        forward = str(jax.make_jaxpr(lambda x, w, sizes=sizes: qlinear.qdot(
            x, w, site, group_sizes=jnp.asarray(sizes, jnp.int32), padding_rows=True, gemm="packed_wgmma_interpret"))(x, w))
        vjp = str(jax.make_jaxpr(fn)(x, w, g))
        assert forward_name in forward and packed_weight.KERNEL_NAME not in forward, rows
        assert packed_ragged_dot.KERNEL_NAME in vjp and packed_weight.DGRAD_KERNEL_NAME not in vjp, rows
        assert f"bf16[{len(SIZES)},{F},{D}]" not in forward + vjp, rows
        # at training sizes x too is read packed: no 16-bit operand copy of it ([rows, D] in f16)
        assert bool(re.search(rf"(?<!b)f16\[{rows},{D}\]", forward)) == (rows == R), rows
    assert [grouped._wgmma_row_tile(rows, 128) for rows in (1, 128, 1024, 2048, 4096, 8191)] == [8, 8, 8, 16, 32, 64]


# ---------------------------------------------------------------- errors
def test_bad_inputs_raise_clear_errors():
    a, b = random_operands([(64, 64), (2, 64, 64)])
    sizes = jnp.asarray([32, 32], jnp.int32)
    with pytest.raises(TypeError, match="two bfloat16 or two float16"):
        grouped_matmul(a, b.astype(jnp.float16), sizes, interpret=True)
    with pytest.raises(TypeError, match="TF32"):
        grouped_matmul(a.astype(jnp.float32), b.astype(jnp.float32), sizes, interpret=True)
    with pytest.raises(ValueError, match="group_sizes must have shape"):
        grouped_matmul(a, b, jnp.asarray([64], jnp.int32), interpret=True)
    with pytest.raises(ValueError, match=r"K=96 must be a positive multiple of its block size 64"):
        grouped_matmul(*random_operands([(64, 96), (2, 96, 64)]), sizes, interpret=True)
    with pytest.raises(ValueError, match=r"N=192 must be a positive multiple of its block size 128"):
        grouped_matmul(*random_operands([(64, 64), (2, 64, 192)]), sizes, interpret=True)
    with pytest.raises(ValueError, match="row counts differ"):
        grouped_wgrad(a, a[:32], sizes, interpret=True)
    with pytest.raises(ValueError, match="multiple of 64"):
        dataclasses.replace(FORWARD_TILES, block_m=96)
    with pytest.raises(ValueError, match="K=32 must be a multiple of 64"):
        grouped_wgrad(a[:, :32], a, sizes, interpret=True)
    assert GroupedGemmTiles().fit(block_n=64).block_n == 64


def test_backend_selector_is_explicit():
    a, b = random_operands([(64, 64), (2, 64, 64)])
    sizes = jnp.asarray([32, 32], jnp.int32)
    with pytest.raises(ValueError, match=r"valid options: \('xla', 'blocked', 'mosaic', 'mosaic_interpret', 'packed', "
                                         r"'packed_interpret', 'packed_dgrad', 'packed_dgrad_interpret', 'packed_wgmma', "
                                         r"'packed_wgmma_interpret'\)"):
        grouped.ragged_matmul(a, b, sizes, gemm="triton")
    with pytest.raises(ValueError, match="valid options"):
        ModelConfig.from_name("tiny", expert_gemm="cutlass")
    assert ModelConfig.from_json('{"vocab_size": 8, "d_model": 16, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1, '
                                 '"head_dim": 16, "dense_d_ff": 0, "moe_d_ff": 16, "num_experts": 2, "top_k": 1}'
                                 ).expert_gemm == "xla"  # a config saved before the field
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="no silent XLA fallback"):
            grouped.ragged_matmul(a, b, sizes, gemm="mosaic")
        with pytest.raises(RuntimeError, match="no silent XLA fallback"):
            grouped.ragged_wgrad(a, a, sizes, gemm="mosaic")


@pytest.mark.skipif(ON_GPU, reason="checks the refusal to run compiled kernels without a GPU")
def test_model_expert_gemm_reaches_the_kernels():
    """ModelConfig.expert_gemm is what the MoE's ragged qdots run on: "mosaic" on a CPU raises
    from the kernel's GPU guard while tracing the forward (no XLA fallback on the way)."""
    config = dataclasses.replace(ModelConfig.from_name("tiny"), expert_gemm="mosaic", dtype="bfloat16")
    graphdef, params = init(config, 0)
    tokens = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(RuntimeError, match="grouped_matmul is a compiled GPU kernel"):
        jax.eval_shape(lambda p: forward(graphdef, p, tokens, PrecisionRecipe.from_name("bf16")), params)


def test_f32_dots_of_the_xla_backend_ask_for_exact_products():
    """The dequantized wgrad's per-token DQ(Q(x)) is f32: its XLA dot must carry precision HIGHEST,
    or XLA:GPU runs it as TF32 (~5e-4 relative; the compiled comparisons above then fail by 20x
    their accumulation bound). Checked on the lowered program, which is the same on every backend;
    bf16 dots keep DEFAULT (exact products either way)."""
    site = SITES["nvfp4-dequantized"]
    x, g = random_operands([(R, D), (R, F)], seed=4)
    w = _f32_params(5)
    text = jax.jit(lambda x, w, g: _qdot_vjp(site, x, w, g, "xla")).lower(x, w, g).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    f32_dots = [d for d in dots if re.search(r"\(tensor<[0-9x]*xf32>, tensor<[0-9x]*xf32>\)", d)]
    assert f32_dots, "the dequantized wgrad no longer has an f32 dot: update this test"
    assert all("precision = [HIGHEST, HIGHEST]" in d for d in f32_dots), f32_dots
    assert all("precision = [DEFAULT, DEFAULT]" in d for d in dots if d not in f32_dots)
