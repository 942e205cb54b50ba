"""Grouped (ragged) matmuls that survive any number of `vmap`s, on an explicit GEMM backend.

`lax.ragged_dot` only batches when every operand carries its batch axis at 0, so vmapping a
MoE over seeds (or over anything that leaves the weights unbatched) fails. Here the vmap rules
broadcast the unbatched operands and then:
- on XLA, run the B problems as one ragged dot with a batch dimension (`ragged_dot_general`);
- on the kernels, fold them into ONE ragged problem: the rows of problem b are followed by a
  dummy group that absorbs its padding rows, so group g of problem b becomes group
  b * (E + 1) + g of the folded problem, with a zero weight for every dummy group (the kernels'
  cost is linear in rows; XLA's is not, see `_xla_batched_matmul_fn`).
Each rule calls a custom-vmapped function again, so nested vmaps batch level by level.

Both functions take and return arrays whose per-problem shapes are:
- `ragged_matmul(a_RxK, b_ExKxN, group_sizes_E) -> [R, N]` (rows of group e use b[e]; rows
  past sum(group_sizes) give zeros, as `lax.ragged_dot` does); with `transpose_rhs=True` b is
  [E, N, K] and rows use b[e]^T (a dgrad reads the forward's weight without a transposed copy);
- `ragged_wgrad(a_RxK, g_RxN, group_sizes_E) -> [E, K, N]` (per group: a_e^T @ g_e).
Accumulation is float32 (`preferred_element_type`).

`gemm` selects the backend, statically (docs/design.md, "Grouped-GEMM backends"):
- "xla": `lax.ragged_dot` / `ragged_dot_general`, the portable reference. XLA (CPU and GPU)
  expands a ragged dot over its groups: memory and work grow with rows x groups (the h200
  preset's RL update: 16 GiB of temporaries per seed in XLA:CPU's estimate, 7 GiB on "blocked");
- "blocked": plain XLA ops with memory and work linear in rows (`fp4rl.blocked_gemm`): each
  group's rows padded to whole blocks, one batched dense GEMM over the blocks; vmaps natively;
- "mosaic": the Pallas Mosaic GPU kernels of `pallas_kernels.grouped_gemm`; compiled, so a CUDA
  GPU is required (it raises elsewhere: no silent fallback);
- "mosaic_interpret": the same kernels in the Mosaic GPU interpreter on the CPU (tests only: slow);
- "packed" / "packed_interpret": "mosaic" / "mosaic_interpret" for every bf16 GEMM, and for the
  forward of an NVFP4 weight (`ragged_matmul_nvfp4`) the Pallas Triton kernel that reads the
  weight packed and dequantizes it in registers (`pallas_kernels.grouped_gemm.packed_weight`):
  no bf16 copy of the weight in HBM, 3.6x fewer weight bytes (the decode path on Hopper);
- "packed_dgrad" / "packed_dgrad_interpret": "packed", and the dgrad of an NVFP4 weight under the
  dequantized backward (`ragged_dgrad_nvfp4`) reads the packed weight too, so a training step
  forms no bf16 copy of an NVFP4 expert stack. Its own name, not a change to "packed": a matrix
  that began on "packed" keeps its programs (docs/design.md, "Grouped-GEMM backends");
- "packed_wgmma" / "packed_wgmma_interpret": "mosaic" for every bf16 GEMM; the forward and the
  dgrad (dequantized backward) of an NVFP4 weight read it packed on Mosaic GPU kernels: at decode
  sizes (under 64 rows per expert) the forward on `wgmma_nvfp4` (the weight as WGMMA's register
  operand, its row tile following the rows per expert), otherwise on `packed_ragged_dot` (the
  weight tile decoded into shared memory per row tile; an NVFP4 activation read as its codes and
  scales too, `ragged_matmul_nvfp4_rows`), which also runs the dgrad. No bf16 copy of an NVFP4
  expert stack, nor a 16-bit copy of an NVFP4 activation, in a training step. Not picked by
  "auto" until the GPU benchmarks rank it.
A config may also name "auto" (`ModelConfig.expert_gemm`'s default): `resolve_gemm` turns it into
the fastest of these that the tests hold to the reference on the platform ("packed" on a Hopper GPU
where the kernels take the model, "xla" elsewhere) once, where the model is built; the GEMM
functions below take backends only.
The kernels take bf16/f16 operands. One mixed case is exact on them too: an f32 wgrad operand
(the dequantized backward's DQ(Q(x)) with per-token scales) against a bf16 one; the f32 operand
is split into three bf16 parts whose sum is exactly it (8 significand bits each), each part's
product with the bf16 operand is exact in f32, and the three f32 GEMMs are summed: the f32
GEMM up to accumulation order (exact split down to |x| ~ 2^-126; bf16 has f32's exponents).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from fp4rl import blocked_gemm
from fp4rl.exact_dot import F32, exact_precision, promoted

GEMMS = ("xla", "blocked", "mosaic", "mosaic_interpret", "packed", "packed_interpret", "packed_dgrad",
         "packed_dgrad_interpret", "packed_wgmma", "packed_wgmma_interpret")
PACKED_GEMMS = {"packed": "mosaic", "packed_interpret": "mosaic_interpret",  # -> their bf16 GEMM backend
                "packed_dgrad": "mosaic", "packed_dgrad_interpret": "mosaic_interpret",
                "packed_wgmma": "mosaic", "packed_wgmma_interpret": "mosaic_interpret"}
WGMMA_GEMMS = ("packed_wgmma", "packed_wgmma_interpret")  # NVFP4 forward and dgrad on the Mosaic packed kernels
PACKED_DGRAD_GEMMS = ("packed_dgrad", "packed_dgrad_interpret", *WGMMA_GEMMS)  # the dgrad of an NVFP4 weight read packed too
DECODE_ROWS_PER_EXPERT = 64  # packed_wgmma: below this mean, the forward runs the decode kernel
# What a config may name: a backend, or "auto", which `resolve_gemm` turns into one before any
# GEMM is traced (the functions below take backends only).
AUTO = "auto"
GEMM_OPTIONS = (AUTO, *GEMMS)
_WGRAD_DIMS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[]
)


def check_gemm(gemm: str, *, auto: bool = False) -> None:
    """Raise, naming the valid options, unless `gemm` is a backend (or, with `auto`, "auto")."""
    valid = GEMM_OPTIONS if auto else GEMMS
    if gemm in valid:
        return
    if gemm == AUTO:
        raise ValueError(f"gemm='auto' is no backend: it is resolved once, where the model is built "
                         f"(`fp4rl.grouped.resolve_gemm`, `ModelConfig.resolved`); valid options here: {GEMMS}")
    raise ValueError(f"unknown grouped GEMM backend gemm={gemm!r}; valid options: {valid}")


def on_hopper() -> bool:
    """JAX's default backend is a GPU of compute capability 9.x (H100, H200): the Mosaic GPU
    kernels are built on its WGMMA and TMA instructions, which other GPU generations lack."""
    if jax.default_backend() != "gpu":
        return False
    return str(getattr(jax.devices()[0], "compute_capability", "")).split(".")[0] == "9"


@functools.cache
def kernels_refuse(gemm: str, dtype: str, weights: tuple[tuple[int, int], ...]) -> str | None:
    """Why the compiled kernels of `gemm` ("mosaic" or a packed backend) cannot run the
    grouped GEMMs of expert weights [E, K, N] of these (K, N) on `dtype` operands; None when they can.

    Every GEMM a ragged qdot runs on such a weight goes through the kernels' own argument checks:
    forward K -> N, dgrad N -> K, wgrad [K, N], and with a packed backend the forward of the
    weight's NVFP4 form on its kernel (with "packed_dgrad" and "packed_wgmma" its dgrad too).
    Abstractly (`jax.eval_shape`) and in interpret mode, so no GPU is needed: the checks raise
    before tracing, the same for the compiled kernels."""
    from pallas_kernels.grouped_gemm import grouped_dgrad_nvfp4, grouped_matmul, grouped_matmul_nvfp4, grouped_wgrad

    spec = jax.ShapeDtypeStruct
    rows, groups = 128, 2  # any: the kernels pad the rows to their blocks
    sizes = spec((groups,), jnp.int32)
    checks = []
    for k, n in weights:
        checks += [
            (f"forward [{k} -> {n}]", functools.partial(grouped_matmul, interpret=True),
             (spec((rows, k), dtype), spec((groups, k, n), dtype), sizes)),
            (f"dgrad [{n} -> {k}]", functools.partial(grouped_matmul, transpose_rhs=True, interpret=True),
             (spec((rows, n), dtype), spec((groups, k, n), dtype), sizes)),
            (f"wgrad [{k}, {n}]", functools.partial(grouped_wgrad, interpret=True),
             (spec((rows, k), dtype), spec((rows, n), dtype), sizes)),
        ]
        if gemm in PACKED_GEMMS:
            if k % 16:
                return f"NVFP4 forward [{k} -> {n}]: K={k} is no whole number of 16-element NVFP4 blocks"
            packed_weight = (spec((groups, n, k // 2), jnp.uint8), spec((groups, n, k // 16), jnp.float8_e4m3fn), sizes)
            if gemm in WGMMA_GEMMS:  # both forward kernels (decode and training row counts) and the dgrad
                for what, forward_rows in (("decode", groups), ("training", DECODE_ROWS_PER_EXPERT * groups)):
                    checks.append((f"NVFP4 forward [{k} -> {n}], {what} rows",
                                   functools.partial(_wgmma_packed_matmul, dgrad=False, interpret=True),
                                   (spec((forward_rows, k), jnp.float16), *packed_weight)))
                checks.append((f"NVFP4 dgrad [{n} -> {k}]", functools.partial(_wgmma_packed_matmul, dgrad=True, interpret=True),
                               (spec((rows, n), jnp.bfloat16), *packed_weight)))
                continue
            checks.append((f"NVFP4 forward [{k} -> {n}]", functools.partial(grouped_matmul_nvfp4, interpret=True),
                           (spec((rows, k), jnp.float16), *packed_weight)))
            if gemm in PACKED_DGRAD_GEMMS:
                checks.append((f"NVFP4 dgrad [{n} -> {k}]", functools.partial(grouped_dgrad_nvfp4, interpret=True),
                               (spec((rows, n), jnp.bfloat16), *packed_weight)))
    for what, kernel, args in checks:
        try:
            jax.eval_shape(kernel, *args)
        except (TypeError, ValueError) as err:
            return f"{what}: {err}"
    return None


def resolve_gemm(gemm: str, *, dtype: str, weights: tuple[tuple[int, int], ...]) -> str:
    """The backend `gemm` names: itself, or for "auto" the fastest backend whose results the tests
    hold to the XLA reference on this platform, for expert weights [E, K, N] of these (K, N) on
    `dtype` operands (the model's compute dtype).

    On a Hopper GPU: "packed". Its RL step (benchmarks/README.md, "RL step time"): bf16 0.71 s and
    `full` 0.96 s, against 0.82 / 1.00 on "mosaic" and 1.36 / 1.93 on "xla". bf16 runs the same
    kernels on both Mosaic backends, so their 0.1 s is run-to-run spread: "packed" and "mosaic" are
    not yet told apart there, while "mosaic"'s training MoE block alone is 15% faster ("Dropless
    expert GEMM"). The compiled suites hold it to the reference (`pytest -m gpu tests/kernels/test_grouped_gemm.py`). It serves every recipe: its
    packed-weight kernel takes only the forward of an NVFP4 expert stack, and every other GEMM
    (BF16 and MXFP8 sites, every backward) runs on "mosaic"'s kernels, so no arm of a matrix needs
    another backend. Where the kernels refuse the model (`kernels_refuse`: f32 compute, as the
    kernels take bf16/f16 operands, f32 would run as TF32; widths off their tiles), the next that
    takes it: "mosaic" (the packed kernel alone refused), else "xla".
    Anywhere else: "xla", the portable reference (the kernels run compiled on Hopper only; their
    interpreters are for tests).
    The choice depends on the platform, so it is made once where a model is built
    (`ModelConfig.resolved`), and runs record the backend, never "auto"."""
    check_gemm(gemm, auto=True)
    if gemm != AUTO:
        return gemm
    if not on_hopper():
        return "xla"
    for candidate in ("packed", "mosaic"):
        if kernels_refuse(candidate, str(dtype), tuple(weights)) is None:
            return candidate
    return "xla"


def _batched(x, is_batched: bool, n: int):
    return x if is_batched else jnp.broadcast_to(x, (n, *x.shape))


def _folded_group_sizes(group_sizes_BxE, num_rows: int):
    """[B, E] -> [B * (E + 1)]: each problem's groups plus a dummy group for its remaining rows."""
    rest = num_rows - jnp.sum(group_sizes_BxE, axis=1, keepdims=True)
    return jnp.concatenate([group_sizes_BxE, rest], axis=1).reshape(-1).astype(jnp.int32)


def _bf16_parts(x_f32):
    """Three bf16 arrays whose f32 sum is exactly x (see the module docstring)."""
    hi = x_f32.astype(jnp.bfloat16)
    rest = x_f32 - hi.astype(F32)
    mid = rest.astype(jnp.bfloat16)
    return hi, mid, (rest - mid.astype(F32)).astype(jnp.bfloat16)


def _mosaic_matmul(gemm, transpose_rhs, a, b, group_sizes):
    from pallas_kernels.grouped_gemm import grouped_matmul  # lazy: only the mosaic backends need Pallas

    return grouped_matmul(a, b, group_sizes, transpose_rhs=transpose_rhs, interpret=gemm == "mosaic_interpret")


def _mosaic_wgrad(gemm, a, g, group_sizes):
    from pallas_kernels.grouped_gemm import grouped_wgrad

    wgrad = functools.partial(grouped_wgrad, group_sizes_E=group_sizes, interpret=gemm == "mosaic_interpret")
    if a.dtype == F32 and g.dtype == jnp.bfloat16:
        return sum(wgrad(part, g) for part in _bf16_parts(a))
    if g.dtype == F32 and a.dtype == jnp.bfloat16:
        return sum(wgrad(a, part) for part in _bf16_parts(g))
    return wgrad(a, g)


def _flattened_batch(n, in_batched, *args):
    """Arguments [n, B, ...] (broadcast where unbatched) as [n * B, ...]."""
    return [_batched(x, flag, n).reshape(-1, *x.shape[(2 if flag else 1):]) for x, flag in zip(args, in_batched)]


@functools.cache
def _xla_batched_matmul_fn(transpose_rhs: bool):
    """[B, R, K] x [B, E, K, N] ([B, E, N, K] with transpose_rhs), sizes [B, E] -> [B, R, N]: the B
    problems as one XLA ragged dot with a batch dimension. Folding them into one ragged problem of
    B * (E + 1) groups, as the kernels do, would cost XLA B^2 times one problem: XLA expands a
    ragged dot over its groups (a [rows, groups, N] intermediate), so its memory and work grow with
    rows x groups (at the h200 preset, 4 vmapped seeds folded asked for 119 GiB on the H200)."""
    dims = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([2], [3 if transpose_rhs else 2]), ([0], [0])),
                                         lhs_ragged_dimensions=[1], rhs_group_dimensions=[1])

    @jax.custom_batching.custom_vmap
    def matmul(a, b, group_sizes):
        return lax.ragged_dot_general(a, b, group_sizes, dims, preferred_element_type=F32,
                                      precision=exact_precision(jnp.promote_types(a.dtype, b.dtype)))

    @matmul.def_vmap
    def _vmap(n, in_batched, a, b, group_sizes):  # a nested vmap: its axis joins the batch axis
        out = matmul(*_flattened_batch(n, in_batched, a, b, group_sizes))
        return out.reshape(n, -1, *out.shape[1:]), True

    return matmul


_BATCHED_WGRAD_DIMS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([1], [1]), ([0], [0])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
)


@jax.custom_batching.custom_vmap
def _xla_batched_wgrad(a_BxRxK, g_BxRxN, group_sizes_BxE):
    """[B, R, K], [B, R, N], sizes [B, E] -> [B, E, K, N]: one batched XLA ragged dot (see above)."""
    a, g = promoted(a_BxRxK, g_BxRxN)
    out = lax.ragged_dot_general(a, g, group_sizes_BxE, _BATCHED_WGRAD_DIMS, preferred_element_type=F32,
                                 precision=exact_precision(a.dtype))
    return jnp.swapaxes(out, 0, 1)  # XLA puts the group axis first: [E, B, K, N]


@_xla_batched_wgrad.def_vmap
def _xla_batched_wgrad_vmap(n, in_batched, a, g, group_sizes):
    out = _xla_batched_wgrad(*_flattened_batch(n, in_batched, a, g, group_sizes))
    return out.reshape(n, -1, *out.shape[1:]), True


@functools.cache
def _matmul_fn(gemm: str, transpose_rhs: bool):
    @jax.custom_batching.custom_vmap
    def matmul(a_RxK, b_ExKxN, group_sizes_E):
        if gemm == "xla":
            b = jnp.swapaxes(b_ExKxN, 1, 2) if transpose_rhs else b_ExKxN
            return lax.ragged_dot(a_RxK, b, group_sizes_E, preferred_element_type=F32,
                                  precision=exact_precision(jnp.promote_types(a_RxK.dtype, b.dtype)))
        return _mosaic_matmul(gemm, transpose_rhs, a_RxK, b_ExKxN, group_sizes_E)

    @matmul.def_vmap
    def _vmap(n, in_batched, a, b, group_sizes):
        a, b, group_sizes = (_batched(x, flag, n) for x, flag in zip((a, b, group_sizes), in_batched))
        if gemm == "xla":
            return _xla_batched_matmul_fn(transpose_rhs)(a, b, group_sizes), True
        _, rows, k = a.shape
        _, e, *b_dims = b.shape
        b_padded = jnp.concatenate([b, jnp.zeros((n, 1, *b_dims), b.dtype)], axis=1)  # the dummy groups
        out = matmul(a.reshape(n * rows, k), b_padded.reshape(n * (e + 1), *b_dims), _folded_group_sizes(group_sizes, rows))
        return out.reshape(n, rows, -1), True

    return matmul


@functools.cache
def _wgrad_fn(gemm: str):
    @jax.custom_batching.custom_vmap
    def wgrad(a_RxK, g_RxN, group_sizes_E):
        if gemm == "xla":
            a, g = promoted(a_RxK, g_RxN)
            return lax.ragged_dot_general(a, g, group_sizes_E, _WGRAD_DIMS, preferred_element_type=F32,
                                          precision=exact_precision(a.dtype))
        return _mosaic_wgrad(gemm, a_RxK, g_RxN, group_sizes_E)

    @wgrad.def_vmap
    def _vmap(n, in_batched, a, g, group_sizes):
        a, g, group_sizes = (_batched(x, flag, n) for x, flag in zip((a, g, group_sizes), in_batched))
        if gemm == "xla":
            return _xla_batched_wgrad(a, g, group_sizes), True
        _, rows, k = a.shape
        e = group_sizes.shape[1]
        out = wgrad(a.reshape(n * rows, k), g.reshape(n * rows, -1), _folded_group_sizes(group_sizes, rows))
        return out.reshape(n, e + 1, k, -1)[:, :e], True

    return wgrad


@functools.cache
def _packed_weight_fn(kind: str, interpret: bool):
    """A packed-weight kernel: "forward" (a [R, K] -> [R, N]) or "dgrad" (g [R, N] -> [R, K]) on the
    Triton kernels, "wgmma" / "wgmma_dgrad" the same on the Mosaic ones (`_wgmma_packed_matmul`),
    "wgmma_rows" the forward with a given as its NVFP4 (codes, scales) (`_wgmma_packed_rows_matmul`),
    with a vmap rule that folds the batch into one ragged problem, as on the Mosaic kernels."""

    @jax.custom_batching.custom_vmap
    def matmul(a, codes_ExNxK2, scales_ExNxK16, group_sizes_E):
        from pallas_kernels.grouped_gemm import grouped_dgrad_nvfp4, grouped_matmul_nvfp4

        kernel = {"dgrad": grouped_dgrad_nvfp4, "forward": grouped_matmul_nvfp4,
                  "wgmma": functools.partial(_wgmma_packed_matmul, dgrad=False),
                  "wgmma_dgrad": functools.partial(_wgmma_packed_matmul, dgrad=True),
                  "wgmma_rows": _wgmma_packed_rows_matmul}[kind]
        return kernel(a, codes_ExNxK2, scales_ExNxK16, group_sizes_E, interpret=interpret)

    @matmul.def_vmap
    def _vmap(n, in_batched, a, codes, scales, group_sizes):
        a = jax.tree.map(lambda x, flag: _batched(x, flag, n), a, in_batched[0])  # an array or its (codes, scales)
        codes, scales, group_sizes = (_batched(x, flag, n) for x, flag in zip((codes, scales, group_sizes), in_batched[1:]))
        rows = jax.tree.leaves(a)[0].shape[1]
        e = codes.shape[1]
        # dummy groups of code 0 and scale 0: a zero weight
        codes, scales = (jnp.concatenate([v, jnp.zeros((n, 1, *v.shape[2:]), v.dtype)], axis=1) for v in (codes, scales))
        out = matmul(jax.tree.map(lambda x: x.reshape(n * rows, *x.shape[2:]), a),
                     codes.reshape(n * (e + 1), *codes.shape[2:]), scales.reshape(n * (e + 1), *scales.shape[2:]),
                     _folded_group_sizes(group_sizes, rows))
        return out.reshape(n, rows, -1), True

    return matmul


def _wgmma_row_tile(rows: int, groups: int) -> int:
    """The decode kernel's row tile for `rows` over `groups` experts: the mean rows per expert
    rounded up to a power of two, in [8, DECODE_ROWS_PER_EXPERT] (each tile holds one expert's rows:
    a taller tile only computes padding, a shorter one reads the weight again per tile)."""
    mean = -(-rows // max(groups, 1))
    return min(DECODE_ROWS_PER_EXPERT, max(8, 1 << (mean - 1).bit_length()))


def _wgmma_packed_matmul(a, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, dgrad: bool, interpret: bool):
    """The Mosaic packed-weight kernels on the stored NVFP4 weight, laid out for them here
    (`pack_for_wgmma`: a transpose of its scale bytes, 1/8 of the codes' bytes, per call; loop-invariant
    in a decode loop, where XLA's invariant code motion may hoist it, not checked):
    the forward at decode sizes on `wgmma_nvfp4` (row tile from the rows per expert), otherwise
    and for the dgrad on `packed_ragged_dot`."""
    from pallas_kernels.grouped_gemm import packed_ragged_dot, wgmma_nvfp4

    e, _, half = codes_ExNxK2.shape
    weight = wgmma_nvfp4.pack_for_wgmma(codes_ExNxK2, scales_ExNxK16)
    if dgrad or _training_rows(a.shape[0], e):
        return packed_ragged_dot.grouped_matmul_packed(a, weight, group_sizes_E, dgrad=dgrad, interpret=interpret)
    block_k = next((b for b in (128, 64, 32) if (2 * half) % b == 0), 128)  # the kernel names the K it refuses
    tiles = wgmma_nvfp4.WgmmaDecodeTiles(rows=_wgmma_row_tile(a.shape[0], e), block_k=block_k)
    return wgmma_nvfp4.grouped_matmul_nvfp4_wgmma(a, weight, group_sizes_E, tiles=tiles, interpret=interpret)


def _wgmma_packed_rows_matmul(x_packed, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, interpret: bool):
    """`packed_ragged_dot` with both operands read packed: x as its NVFP4 (codes [R, K/2], scales
    [R, K/16]), the weight as stored (both laid out for the kernel here)."""
    from pallas_kernels.grouped_gemm import packed_ragged_dot, wgmma_nvfp4

    weight = wgmma_nvfp4.pack_for_wgmma(codes_ExNxK2, scales_ExNxK16)
    return packed_ragged_dot.grouped_matmul_packed(packed_ragged_dot.pack_rows(*x_packed), weight, group_sizes_E,
                                                   interpret=interpret)


def reads_packed_rows(num_rows: int, groups: int, gemm: str) -> bool:
    """Whether the forward of an NVFP4 site with an NVFP4 weight stack of `groups` experts takes x as
    its NVFP4 codes and scales (`ragged_matmul_nvfp4_rows`) on `gemm`: the Mosaic packed kernels at
    training sizes (DECODE_ROWS_PER_EXPERT rows per expert or more)."""
    return gemm in WGMMA_GEMMS and _training_rows(num_rows, groups)


def _training_rows(num_rows: int, groups: int) -> bool:
    return num_rows >= DECODE_ROWS_PER_EXPERT * groups


def ragged_matmul_nvfp4_rows(x_codes_RxK2, x_scales_RxK16, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, gemm: str):
    """`ragged_matmul_nvfp4` with x given as its NVFP4 codes and E4M3 scales (1x16 blocks along K):
    the kernel decodes both operands' tiles into shared memory, so no 16-bit copy of x is written to
    HBM either (`gemm` in WGMMA_GEMMS). The same products: x's operand dec(q) * sf, exact in f16."""
    if gemm not in WGMMA_GEMMS:
        raise ValueError(f"ragged_matmul_nvfp4_rows runs on gemm in {WGMMA_GEMMS}, got {gemm!r}")
    return _packed_weight_fn("wgmma_rows", gemm.endswith("_interpret"))((x_codes_RxK2, x_scales_RxK16), codes_ExNxK2,
                                                                       scales_ExNxK16, group_sizes_E)


def ragged_matmul_nvfp4(a_RxK, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, gemm: str):
    """f32 [R, N]: rows of group e times (dec(codes[e]) * scales[e])^T, the bf16 operand of an NVFP4
    weight w^T [E, N, K] read packed (`gemm` in PACKED_GEMMS; WGMMA_GEMMS on the Mosaic kernels);
    rows past the groups: 0.

    `a` holds the values of an NVFP4-quantized activation, dec(q) * sf: multiples of 2^-10 of at
    most 6 significant bits, below 6 * 448, hence exact in f16. The kernel takes them as f16 and
    forms the weight tile in f16 (`packed_weight.grouped_matmul_nvfp4`: fewer instructions per
    weight element, the same products)."""
    if gemm not in PACKED_GEMMS:
        raise ValueError(f"ragged_matmul_nvfp4 runs on gemm in {tuple(PACKED_GEMMS)}, got {gemm!r}")
    kind = "wgmma" if gemm in WGMMA_GEMMS else "forward"
    return _packed_weight_fn(kind, gemm.endswith("_interpret"))(a_RxK.astype(jnp.float16), codes_ExNxK2,
                                                               scales_ExNxK16, group_sizes_E)


def ragged_dgrad_nvfp4(g_RxN, codes_ExNxK2, scales_ExNxK16, group_sizes_E, *, gemm: str):
    """f32 [R, K]: rows of group e times dec(codes[e]) * scales[e] ([N, K], the NVFP4 weight w^T's
    bf16 operand), read packed (`gemm` in PACKED_DGRAD_GEMMS); rows past the groups: 0. The dgrad of
    `ragged_matmul_nvfp4`. g in bf16 runs as it is; g in f32 (f32 compute) as its three bf16 parts,
    whose products with the weight's exact bf16 values are exact in f32, as `_mosaic_wgrad` does."""
    if gemm not in PACKED_DGRAD_GEMMS:
        raise ValueError(f"ragged_dgrad_nvfp4 runs on gemm in {PACKED_DGRAD_GEMMS}, got {gemm!r}")
    kernel = _packed_weight_fn("wgmma_dgrad" if gemm in WGMMA_GEMMS else "dgrad", gemm.endswith("_interpret"))
    if g_RxN.dtype == F32:
        return sum(kernel(part, codes_ExNxK2, scales_ExNxK16, group_sizes_E) for part in _bf16_parts(g_RxN))
    if g_RxN.dtype != jnp.bfloat16:
        raise TypeError(f"ragged_dgrad_nvfp4: g must be bfloat16 or float32, got {g_RxN.dtype}")
    return kernel(g_RxN, codes_ExNxK2, scales_ExNxK16, group_sizes_E)


def ragged_matmul(a_RxK, b_ExKxN, group_sizes_E, *, gemm: str = "xla", transpose_rhs: bool = False):
    """f32 [R, N]: rows of group e times b[e] (b[e]^T with transpose_rhs); rows past the groups: 0."""
    check_gemm(gemm)
    gemm = PACKED_GEMMS.get(gemm, gemm)
    if gemm == "blocked":
        return blocked_gemm.matmul(a_RxK, b_ExKxN, group_sizes_E, transpose_rhs=transpose_rhs)
    return _matmul_fn(gemm, transpose_rhs)(a_RxK, b_ExKxN, group_sizes_E)


def ragged_wgrad(a_RxK, g_RxN, group_sizes_E, *, gemm: str = "xla"):
    """f32 [E, K, N]: per group e, a[rows of e]^T @ g[rows of e]."""
    check_gemm(gemm)
    gemm = PACKED_GEMMS.get(gemm, gemm)
    if gemm == "blocked":
        return blocked_gemm.wgrad(a_RxK, g_RxN, group_sizes_E)
    return _wgrad_fn(gemm)(a_RxK, g_RxN, group_sizes_E)
