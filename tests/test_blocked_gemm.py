"""`fp4rl.blocked_gemm` (the "blocked" grouped-GEMM backend): the float64 oracle under the f32
accumulation bound (`tests.grouped_oracle`), the padded layout's edge cases, vmap, and memory
that grows with rows + groups, not rows x groups as XLA's ragged dot does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import blocked_gemm, grouped
from tests.grouped_oracle import accumulation_bound, assert_within, exact_matmul, exact_wgrad, random_operands

# (rows, K, N, group sizes): what the layout special-cases
CASES = {
    "empty-middle-rows-past-the-groups": (96, 64, 32, (40, 0, 24)),
    "empty-first-full-cover": (128, 32, 64, (0, 64, 32, 32)),
    "one-group-over-many-blocks": (1000, 16, 8, (0, 0, 999, 0, 0)),  # 8-row blocks, the last group empty
    "every-row-past-the-groups": (40, 16, 16, (0, 0)),
    "wide-blocks": (4096, 16, 16, (1000, 7, 0, 3000, 89)),  # 128-row blocks, partial blocks everywhere
}


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["fwd", "dgrad"])
@pytest.mark.parametrize("case", CASES)
def test_matmul_is_the_grouped_product(case, transpose_rhs):
    rows, k, n, sizes = CASES[case]
    a, b = random_operands([(rows, k), (len(sizes), k, n)])
    out = grouped.ragged_matmul(a, jnp.swapaxes(b, 1, 2) if transpose_rhs else b, jnp.asarray(sizes, jnp.int32),
                                gemm="blocked", transpose_rhs=transpose_rhs)
    assert out.dtype == jnp.float32 and out.shape == (rows, n)
    exact, mag = exact_matmul(a, b, sizes)
    assert_within(out, exact, accumulation_bound(mag, k), case)
    np.testing.assert_array_equal(np.asarray(out)[sum(sizes):], 0.0)  # rows past the groups: exactly 0


@pytest.mark.parametrize("case", CASES)
def test_wgrad_is_the_grouped_product(case):
    rows, k, n, sizes = CASES[case]
    a, g = random_operands([(rows, k), (rows, n)], seed=1)
    out = grouped.ragged_wgrad(a, g, jnp.asarray(sizes, jnp.int32), gemm="blocked")
    assert out.dtype == jnp.float32 and out.shape == (len(sizes), k, n)
    exact, mag = exact_wgrad(a, g, sizes)
    assert_within(out, exact, accumulation_bound(mag, max(max(sizes), 1)), case)
    np.testing.assert_array_equal(np.asarray(out)[np.asarray(sizes) == 0], 0.0)  # empty groups


def test_f32_operands_multiply_exactly():
    """An f32 operand (the dequantized backward's per-token DQ(Q(x))) widens the other and the
    dot runs at HIGHEST precision: within the f32 bound of the float64 product."""
    rows, k, n, sizes = CASES["empty-first-full-cover"]
    a = random_operands([(rows, k)], seed=2, dtype=jnp.float32)[0] * 1e-3
    (g,) = random_operands([(rows, n)], seed=3)
    out = grouped.ragged_wgrad(a, g, jnp.asarray(sizes, jnp.int32), gemm="blocked")
    exact, mag = exact_wgrad(a, g, sizes)
    assert_within(out, exact, accumulation_bound(mag, max(sizes)), "f32 x bf16 wgrad")


def test_vmap_is_each_problem():
    """Nested vmaps over per-problem group sizes (and an unbatched weight) give each problem's
    result bit for bit: the backend is plain XLA ops, batched by JAX's own rules."""
    rows, k, n = 96, 32, 16
    sizes = jnp.asarray([[40, 0, 24], [0, 96, 0], [1, 2, 3]], jnp.int32)
    a, g = random_operands([(2, 3, rows, k), (2, 3, rows, n)], seed=4)
    (w,) = random_operands([(3, k, n)], seed=5)
    nested = lambda f: jax.jit(jax.vmap(jax.vmap(f, in_axes=(0, None, 0)), in_axes=(0, None, None)))  # noqa: E731
    matmul = lambda a, w, s: grouped.ragged_matmul(a, w, s, gemm="blocked")  # noqa: E731
    wgrad = lambda a, g, s: grouped.ragged_wgrad(a, g, s, gemm="blocked")  # noqa: E731
    y = nested(matmul)(a, w, sizes)
    dw = jax.jit(jax.vmap(jax.vmap(wgrad)))(a, g, jnp.broadcast_to(sizes, (2, 3, 3)))
    for o in range(2):
        for i in range(3):
            np.testing.assert_array_equal(np.asarray(y[o, i]), np.asarray(matmul(a[o, i], w, sizes[i])))
            np.testing.assert_array_equal(np.asarray(dw[o, i]), np.asarray(wgrad(a[o, i], g[o, i], sizes[i])))


def test_block_rows_follow_rows_per_group():
    assert blocked_gemm.block_rows(57344, 32) == 128  # the h200 update: 14336 tokens x top-4, 32 experts
    assert blocked_gemm.block_rows(1024, 32) == 32  # decode: 256 sequences x top-4
    assert blocked_gemm.block_rows(10, 4) == 8


def _temp_bytes(f, *shapes):
    args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("kind", ["matmul", "wgrad"])
def test_memory_grows_with_rows_plus_groups(kind):
    """16x the groups at fixed rows: XLA's ragged dot needs ~16x the temporaries (it expands over
    the groups), the blocked backend less than 4x (its padding, at most groups x block rows, and
    its per-block weights grow; here blocks narrow from 128 to 32 rows)."""
    k = n = 64
    bf16, i32 = jnp.bfloat16, jnp.int32

    def temp(gemm, rows, groups):
        if kind == "matmul":
            f = lambda a, b, s: grouped.ragged_matmul(a, b, s, gemm=gemm)  # noqa: E731
            return _temp_bytes(f, ((rows, k), bf16), ((groups, k, n), bf16), ((groups,), i32))
        f = lambda a, g, s: grouped.ragged_wgrad(a, g, s, gemm=gemm)  # noqa: E731
        return _temp_bytes(f, ((rows, k), bf16), ((rows, n), bf16), ((groups,), i32))

    few, many = temp("blocked", 4096, 8), temp("blocked", 4096, 128)
    assert many < 4 * few, (few, many)
    assert temp("blocked", 8192, 8) < 2.2 * few  # linear in rows
    assert temp("xla", 4096, 128) > 8 * temp("xla", 4096, 8)  # the reference's expansion, for contrast
    assert many < temp("xla", 4096, 128) / 8
