"""The 16x16 random Hadamard transform (docs/numerics.md §6): H16 * D / 4 on 16-blocks along an axis."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fp4rl.formats import hadamard

U32 = 2.0**-24  # unit roundoff of float32


def _matrix(key, n=64):
    """The transform as a matrix M acting on column vectors: M[:, j] = T(e_j) along axis 0."""
    return np.asarray(jax.jit(lambda e: hadamard.random_hadamard(e, key, axis=0))(np.eye(n, dtype=np.float32)))


def test_block_diagonal_orthogonal_with_entries_quarter():
    m = _matrix(jax.random.key(0)).astype(np.float64)
    blocks = np.kron(np.eye(4), np.ones((16, 16)))
    np.testing.assert_array_equal(m[blocks == 0], 0.0)  # blocks of 16, nothing crosses them
    np.testing.assert_array_equal(np.abs(m[blocks == 1]), 0.25)  # +-1/4: H16 entries are +-1
    # every entry of M^T M is a sum of 16 products +-1/16: exact in float32 and float64
    np.testing.assert_array_equal(m.T @ m, np.eye(64))


def test_different_keys_differ_only_by_the_sign_diagonal():
    """M_k = blockdiag(H16 D_k / 4): two keys give M_1^T M_2 = D_1 H^T H D_2 / 16 = D_1 D_2,
    diagonal with +-1 (or, for the D H convention, M_1 M_2^T is). The signs differ."""
    m1 = _matrix(jax.random.key(1)).astype(np.float64)
    m2 = _matrix(jax.random.key(2)).astype(np.float64)
    assert not np.array_equal(m1, m2)
    p, q = m1.T @ m2, m1 @ m2.T
    is_sign_diag = lambda a: np.array_equal(a, np.diag(np.diag(a))) and np.array_equal(np.abs(np.diag(a)), np.ones(64))  # noqa: E731
    assert is_sign_diag(p) or is_sign_diag(q)
    np.testing.assert_array_equal(_matrix(jax.random.key(1)), m1)  # same key, same transform


@pytest.mark.parametrize("k", [64, 1024])
def test_preserves_the_gemm_product_along_the_contraction_dim(k):
    """a [M, K] along axis 1 and b [K, N] along axis 0 with the same key: (a M^T)(M b) = a b.
    Tolerance, per output element, with u = 2^-24 and ||.|| the 2-norms of the row of a and
    the column of b: the transform has 4 butterfly levels and an exact /4, so each transformed
    element carries a relative error <= gamma_4 on sum |M_ij x_j| <= 4 ||x_block|| (Cauchy-Schwarz
    over 16 entries of 1/4), i.e. ||error|| <= 4 gamma_4 ||x|| per operand; the float32 product
    of length K adds gamma_K ||a|| ||b||. Reference in float64. Bound: (gamma_K + 8 gamma_4 + 2u)
    ||a|| ||b|| with gamma_n = n u / (1 - n u)."""
    rng = np.random.default_rng(k)
    a = rng.standard_t(3, (8, k)).astype(np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    key = jax.random.key(7)
    f = jax.jit(
        lambda a, b: jax.numpy.matmul(
            hadamard.random_hadamard(a, key, axis=1),
            hadamard.random_hadamard(b, key, axis=0),
            precision=jax.lax.Precision.HIGHEST,
        )
    )
    got = np.asarray(f(a, b)).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64)
    gamma = lambda n: n * U32 / (1 - n * U32)  # noqa: E731
    norms = np.linalg.norm(a.astype(np.float64), axis=1)[:, None] * np.linalg.norm(b.astype(np.float64), axis=0)[None]
    tol = (gamma(k) + 8 * gamma(4) + 2 * U32) * norms
    assert (np.abs(got - want) <= tol).all(), np.max(np.abs(got - want) / tol)
    # and the transform really changed the operands (not the identity)
    assert not np.allclose(np.asarray(hadamard.random_hadamard(a, key, axis=1)), a)


def test_norm_preserved_per_block_and_axis_must_be_multiple_of_16():
    x = np.random.default_rng(0).standard_normal((3, 48, 5)).astype(np.float32)
    y = np.asarray(hadamard.random_hadamard(x, jax.random.key(0), axis=1))
    assert y.shape == x.shape
    nx = np.linalg.norm(x.reshape(3, 3, 16, 5).astype(np.float64), axis=2)
    ny = np.linalg.norm(y.reshape(3, 3, 16, 5).astype(np.float64), axis=2)
    np.testing.assert_allclose(ny, nx, rtol=8 * U32 * 16)  # 4 rounding levels on sums of <= 16 terms
    with pytest.raises(ValueError):
        hadamard.random_hadamard(np.ones((4, 40), np.float32), jax.random.key(0), axis=-1)
