"""`ieee.integer_divide` (the integer-only division used off CPU) is IEEE binary32 division,
compared bit for bit with NumPy's (the host FPU's correctly rounded divss, no denormal flushing),
in both forms: straight-line (the XLA:GPU reference) and a `fori_loop` (the Mosaic GPU kernels).
`ieee.integer_square` likewise against NumPy's product.

XLA:GPU's own f32 division is `div.full.f32` (approximate), which is why the reference needs it;
compiled Mosaic GPU kernels were one ulp off even through float64, and their MSE squares too.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.formats import ieee

DIVIDES = {unroll: jax.jit(lambda a, b, u=unroll: ieee.integer_divide(a, b, unroll=u)) for unroll in (True, False)}
SQUARE = jax.jit(ieee.integer_square)


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _check(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    with np.errstate(all="ignore"):
        want = a / b
    nan = np.isnan(want)
    for unroll, divide in DIVIDES.items():
        got = np.asarray(divide(a, b))
        np.testing.assert_array_equal(np.isnan(got), nan)
        bad = np.flatnonzero((_bits(got) != _bits(want)) & ~nan)
        assert bad.size == 0, (f"{unroll=}: {bad.size} wrong, e.g. {a[bad[:3]]} / {b[bad[:3]]} = {got[bad[:3]]}, "
                               f"want {want[bad[:3]]}")


def _random_bits(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_random_bit_patterns():
    """Every class at once: NaN, +-inf, +-0, subnormal and normal operands, over/underflow."""
    rng = np.random.default_rng(0)
    _check(_random_bits(rng, 1_000_000), _random_bits(rng, 1_000_000))


def test_quotients_near_one_and_self_division():
    rng = np.random.default_rng(1)
    a = rng.uniform(1, 2, 500_000).astype(np.float32)
    _check(a, a)  # div.full.f32 gives 0.99999994 for 16% of these
    _check(a, np.nextafter(a, np.float32(3)))
    _check(np.float32(1), a)  # reciprocals


@pytest.mark.parametrize("scale", [2.0**-126, 2.0**-140, 2.0**-149])
def test_subnormal_results_and_ties(scale):
    """Results in the subnormal range, including exact midpoints (round half to even)."""
    rng = np.random.default_rng(2)
    m = rng.integers(1, 2**24, 200_000).astype(np.float32)
    a = (m * np.float32(scale)).astype(np.float32)  # subnormal or tiny numerators
    for b in (2.0, 4.0, 3.0, 1.5, 0.75, 1e10):
        _check(a, np.full_like(a, b))
    _check(np.float32(2.0**-126), rng.uniform(1, 2**24, 200_000).astype(np.float32))


def test_overflow_boundary():
    big = np.float32(np.finfo(np.float32).max)
    b = np.array([1.0, 0.5, np.nextafter(np.float32(1), np.float32(0)), 2.0**-126, 1e-45, 0.999999], np.float32)
    _check(np.full_like(b, big), b)
    _check(np.full_like(b, -big), b)


def test_short_significand_quotients():
    """bf16-like operands (8 significant bits), where exact quotients and near-ties are common
    (the Mosaic kernel's bf16 failures), and the kernels' 6E / A and 1 / A."""
    rng = np.random.default_rng(11)
    a, b = (np.ldexp(rng.uniform(1, 2, (2, 200_000)), rng.integers(-20, 20, (2, 200_000)))
            .astype(np.float32).astype(jnp.bfloat16).astype(np.float32))
    _check(a, b)
    _check(np.full_like(a, 2688.0), a)
    _check(np.ones_like(a), a)


def _check_square(d):
    d = np.asarray(d, np.float32)
    with np.errstate(all="ignore"):
        want = d * d
    got = np.asarray(SQUARE(d))
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero((_bits(got) != _bits(want)) & ~nan)
    assert bad.size == 0, f"{bad.size} wrong, e.g. {d[bad[:3]]}^2 = {got[bad[:3]]}, want {want[bad[:3]]}"


def test_square_matches_ieee_multiplication():
    """fl(d * d): every class (random bit patterns), squares around the subnormal range and
    FLT_MAX, short significands."""
    rng = np.random.default_rng(17)
    _check_square(_random_bits(rng, 1_000_000))
    for lo, hi in ((-80, -60), (60, 66)):
        _check_square(np.ldexp(rng.uniform(1, 2, 200_000), rng.integers(lo, hi, 200_000)).astype(np.float32))
    _check_square(rng.normal(size=200_000).astype(np.float32).astype(jnp.bfloat16).astype(np.float32))


def test_square_rounding_ties_exhaustive_short_significands():
    """Every integer t < 2^15 squared (t^2 needs up to 30 bits: 1-6 bits rounded off, exact
    ties included), at unit scale and scaled into the subnormal result range."""
    t = np.arange(1, 1 << 15, dtype=np.float32)
    for scale in (1.0, 2.0**-80, 2.0**-70):
        _check_square(t * np.float32(scale))


def test_divide_on_cpu_is_the_native_division():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(2, 1000)).astype(np.float32)
    np.testing.assert_array_equal(_bits(jax.jit(ieee.divide)(a, b)), _bits(a / b))


def test_forcing_integer_division_is_thread_local():
    """The oracle suite builds its cases in 2 threads; a process-wide flag would leak out of
    the block and slow every later test of that worker (integer division everywhere)."""
    inside = threading.Barrier(3)
    leave = threading.Event()

    def use():
        with ieee.integer_division_everywhere():
            assert ieee._depth("integer")
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=use) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert not ieee._depth("integer")  # the main thread is not forced meanwhile
    leave.set()
    for t in threads:
        t.join()
    assert not ieee._depth("integer")


def test_native_division_for_cpu_wins_over_forced_integer_division():
    """The benchmark's CPU reference traces the hardware division even where `divide` would
    otherwise emit the integer long division (a GPU default backend, or the tests' switch)."""
    def lowered():  # a fresh function each time: jit caches traces per function
        return jax.jit(lambda a, b: ieee.divide(a, b)).lower(np.float32(1), np.float32(3)).as_text()

    with ieee.integer_division_everywhere():
        integer = lowered()
        with ieee.native_division_for_cpu():
            native = lowered()
    assert "stablehlo.divide" in native and "shift_right" not in native
    assert "shift_right" in integer


def test_a_gpu_with_ieee_division_divides_natively(monkeypatch):
    """Traced for a GPU, `divide` is the integer long division unless XLA_FLAGS makes XLA:GPU's f32
    division IEEE (`xla_flags.IEEE_GPU_DIVISION`, also among other backend options); forcing the
    integer division still wins (the tests run the GPU path on the CPU that way)."""
    from fp4rl import xla_flags

    def lowered():
        return jax.jit(lambda a, b: ieee.divide(a, b)).lower(np.float32(1), np.float32(3)).as_text()

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    assert "shift_right" in lowered() and "stablehlo.divide" not in lowered()
    for flags in (xla_flags.IEEE_GPU_DIVISION, "--xla_backend_extra_options=-nvptx-sched4reg,-nvptx-prec-divf32=3"):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert "stablehlo.divide" in lowered() and "shift_right" not in lowered(), flags
        with ieee.integer_division_everywhere():
            assert "shift_right" in lowered()
