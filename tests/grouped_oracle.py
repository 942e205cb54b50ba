"""The float64 oracle of the grouped GEMMs and the f32 accumulation bound they are held to.

The operands are bf16 (or exactly split f32), so every product is exact in f32 and the only
error is the f32 accumulation. A sum of n terms accumulated in any order with at most one f32
ulp (2u, u = 2^-24) of error per addition is within 2 (n - 1) u * sum|terms| of the exact sum;
one ulp per addition covers round-to-nearest (u) and the truncating accumulators of tensor cores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

U = 2.0**-24


def accumulation_bound(abs_products_sum, n: int):
    return 2 * max(n - 1, 0) * U * abs_products_sum


def group_of_rows(sizes, rows: int):
    """Each row's group, or -1 past the groups."""
    group = np.full(rows, -1)
    ends = np.cumsum(sizes)
    for e, (start, end) in enumerate(zip(ends - np.asarray(sizes), ends)):
        group[start:end] = e
    return group


def exact_matmul(a, b, sizes):
    """float64 a @ b[group] and sum |a| |b[group]|, rows past the groups 0."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    group = group_of_rows(sizes, a64.shape[0])
    out, mag = np.zeros((a64.shape[0], b64.shape[2])), np.zeros((a64.shape[0], b64.shape[2]))
    for e in range(b64.shape[0]):
        rows = group == e
        out[rows], mag[rows] = a64[rows] @ b64[e], np.abs(a64[rows]) @ np.abs(b64[e])
    return out, mag


def exact_wgrad(a, g, sizes):
    a64, g64 = np.asarray(a, np.float64), np.asarray(g, np.float64)
    group = group_of_rows(sizes, a64.shape[0])
    out = np.stack([a64[group == e].T @ g64[group == e] for e in range(len(sizes))])
    mag = np.stack([np.abs(a64[group == e]).T @ np.abs(g64[group == e]) for e in range(len(sizes))])
    return out, mag


def random_operands(shapes, seed=0, dtype=jnp.bfloat16):
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    return [jax.random.normal(k, s, dtype) for k, s in zip(keys, shapes)]


def assert_within(out, exact, bound, what):
    err = np.abs(np.asarray(out, np.float64) - exact)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{what}: |error| {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"
