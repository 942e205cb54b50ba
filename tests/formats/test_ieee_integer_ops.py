"""`ieee.integer_divide` / `integer_square` (the XLA:GPU reference's and the Mosaic kernels'
division, the Mosaic MSE square) vs IEEE f32 division and product, bit for bit, in both forms
(straight-line, and the `fori_loop` of the Mosaic kernel): NumPy divides with the host's IEEE `divss` (no FTZ/DAZ), the contract's fl(a / b).

Covers random operands over the whole exponent range (normal and subnormal quotients, overflow,
gradual underflow to zero), subnormal operands, quotients near the normal/subnormal boundary,
exact quotients, zeros, infinities and NaNs (NaN results: only "is NaN" is the contract's).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import ieee


def _random_floats(rng, n, lo_exp, hi_exp):
    mant = rng.uniform(1.0, 2.0, n)
    exp = rng.integers(lo_exp, hi_exp, n)
    sign = rng.choice([-1.0, 1.0], n)
    with np.errstate(over="ignore", under="ignore"):
        return (sign * np.ldexp(mant, exp)).astype(np.float32)


def _specials():
    v = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.0, 1536.0, 2688.0, 6.0, 448.0,
                  1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 2.0**-149,
                  2.0**-126, 0.1, 7.0, 2.0**100, 2.0**-100], np.float32)
    a, b = np.meshgrid(v, v)
    return a.ravel(), b.ravel()


_DIVIDES = {unroll: jax.jit(lambda a, b, u=unroll: ieee.integer_divide(a, b, lambda x, y: x / y, unroll=u))
            for unroll in (True, False)}


def _check(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    with np.errstate(all="ignore"):
        want = a / b
    nan = np.isnan(want)
    for unroll, divide in _DIVIDES.items():
        got = np.asarray(divide(jnp.asarray(a), jnp.asarray(b)))
        np.testing.assert_array_equal(np.isnan(got), nan)
        bad = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
        assert bad.size == 0, (unroll, [(float(x), float(y), float(g), float(w)) for x, y, g, w in
                                        zip(a[~nan][bad[:5]], b[~nan][bad[:5]], got[~nan][bad[:5]], want[~nan][bad[:5]])])


def test_special_operands():
    _check(*_specials())


@pytest.mark.parametrize("seed", range(4))
def test_random_operands_over_the_exponent_range(seed):
    rng = np.random.default_rng(seed)
    n = 250_000
    _check(_random_floats(rng, n, -149, 128), _random_floats(rng, n, -149, 128))


def test_subnormal_operands_and_quotients():
    rng = np.random.default_rng(7)
    n = 200_000
    tiny = _random_floats(rng, n, -149, -125)  # subnormal and smallest normal operands
    mid = _random_floats(rng, n, -30, 30)
    big = _random_floats(rng, n, 90, 128)
    _check(tiny, mid)   # subnormal / normal: subnormal quotients, gradual underflow
    _check(mid, big)    # normal / large: quotients near and below 2^-126
    _check(mid, tiny)   # normal / subnormal: overflow to Inf
    _check(tiny, tiny)


def test_exact_and_short_significand_quotients():
    """bf16-like operands (8 significant bits), where exact quotients and near-ties are common."""
    rng = np.random.default_rng(11)
    a = _random_floats(rng, 200_000, -20, 20).astype(jnp.bfloat16).astype(np.float32)
    b = _random_floats(rng, 200_000, -20, 20).astype(jnp.bfloat16).astype(np.float32)
    _check(a, b)
    _check(np.float32(2688.0) + 0 * a, a)  # 6E / A
    _check(np.float32(1.0) + 0 * a, a)


def test_power_of_two_divisors_round_the_dropped_bits():
    """a / 2^k with a small: the quotient is exact before it underflows, so the rounding of the
    bits shifted out of a subnormal result (ties to even, no sticky remainder) decides alone."""
    rng = np.random.default_rng(13)
    a = _random_floats(rng, 100_000, -149, -100)
    b = np.exp2(rng.integers(1, 30, a.size)).astype(np.float32)
    _check(a, b)
    ties = (np.arange(1, 4097, dtype=np.float32) * np.float32(2.0**-149))  # m * 2^-149 / 2, / 4, / 8
    for k in (2.0, 4.0, 8.0):
        _check(ties, np.full_like(ties, k))


_square = jax.jit(lambda d: ieee.integer_square(d, lambda x: x * x))


def _check_square(d):
    d = np.asarray(d, np.float32)
    with np.errstate(all="ignore"):
        want = d * d
    got = np.asarray(_square(jnp.asarray(d)))
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
    assert bad.size == 0, [(float(x), float(g), float(w)) for x, g, w in zip(d[~nan][bad[:5]], got[~nan][bad[:5]], want[~nan][bad[:5]])]


def test_square_matches_ieee_multiplication():
    """fl(d * d) over the whole range: subnormal operands (squares flush to 0 only by rounding),
    squares in the subnormal range (gradual underflow, ties included), overflow to Inf, short
    (bf16-like) significands, specials."""
    rng = np.random.default_rng(17)
    _check_square(_random_floats(rng, 500_000, -149, 128))
    _check_square(_random_floats(rng, 200_000, -80, -60))  # squares around 2^-126..2^-149
    _check_square(_random_floats(rng, 100_000, 60, 66))  # squares around FLT_MAX
    _check_square(_random_floats(rng, 200_000, -40, 40).astype(jnp.bfloat16).astype(np.float32))
    _check_square(np.arange(1, 1 << 16, dtype=np.float32) * np.float32(2.0**-75))  # exact squares, subnormal ties
    _check_square(_specials()[0])


def test_square_rounding_ties_exhaustive_short_significands():
    """Every integer t < 2^15 squared (t^2 needs up to 30 bits: 1-6 bits rounded off, exact
    ties included), at unit scale and scaled into the subnormal result range."""
    t = np.arange(1, 1 << 15, dtype=np.float32)
    _check_square(t)
    _check_square(t * np.float32(2.0**-80))
    _check_square(t * np.float32(2.0**-70))
