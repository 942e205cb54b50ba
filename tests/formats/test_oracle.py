"""The oracle's own foundations, checked against tables built from docs/numerics.md by hand.

The oracle leans on ml_dtypes for element rounding; these tests pin that ml_dtypes does what
the contract says (§1), with tables computed in exact rational / float64 arithmetic, so a
change in ml_dtypes cannot silently move the oracle.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tests.formats import cases, oracle


def _e2m1_by_thresholds(v: float) -> float:
    """docs/numerics.md §1 verbatim: |v| <= 0.25 -> 0; < 0.75 -> 0.5; <= 1.25 -> 1; < 1.75 -> 1.5;
    <= 2.5 -> 2; < 3.5 -> 3; <= 5 -> 4; else 6."""
    a = abs(v)
    if a <= 0.25:
        m = 0.0
    elif a < 0.75:
        m = 0.5
    elif a <= 1.25:
        m = 1.0
    elif a < 1.75:
        m = 1.5
    elif a <= 2.5:
        m = 2.0
    elif a < 3.5:
        m = 3.0
    elif a <= 5:
        m = 4.0
    else:
        m = 6.0
    return m


def test_e2m1_tie_table_of_s1():
    # (tie, expected magnitude) exactly as docs/numerics.md §1 lists them
    table = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    for t, want in table.items():
        for sign in (1, -1):
            code = oracle.e2m1_codes(np.array([sign * t], np.float32))[0]
            assert oracle.e2m1_decode(code) == sign * want, (t, sign, code)
            assert (code >> 3) == (1 if sign < 0 else 0)


def test_e2m1_oracle_matches_threshold_rule_on_ties_neighbours_and_random():
    vals = []
    for t in cases.E2M1_TIES + cases.E2M1_VALUES + (0.0, 6.5, 7.0, 8.0, 1e30, 3.4e38):
        vals += cases._neighbours(t, 3)
    rng = np.random.default_rng(0)
    vals += list(rng.uniform(-8, 8, 20000).astype(np.float32))
    v = np.array(vals + [-x for x in vals], np.float32)
    got = oracle.e2m1_decode(oracle.e2m1_codes(v))
    want = np.array([np.copysign(_e2m1_by_thresholds(float(x)), x) for x in v], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_e2m1_sign_of_tiny_negatives_is_code_8():
    v = np.array([-1e-30, -0.1, -0.25, -np.float32(1e-45)], np.float32)
    np.testing.assert_array_equal(oracle.e2m1_codes(v), [8, 8, 8, 8])
    np.testing.assert_array_equal(oracle.e2m1_codes(np.array([np.inf, -np.inf], np.float32)), [7, 15])


def _e4m3_rne_exact(v: float) -> float:
    """Nearest E4M3 value by exact rational comparison, ties to even mantissa, saturating."""
    grid = cases.e4m3_values().astype(np.float64)
    a = Fraction(abs(v))
    if a >= 448:
        r = 448.0
    else:
        i = int(np.searchsorted(grid, float(a), side="right")) - 1
        lo, hi = Fraction(grid[i]), Fraction(grid[min(i + 1, len(grid) - 1)])
        if a - lo < hi - a:
            r = float(lo)
        elif a - lo > hi - a:
            r = float(hi)
        else:  # tie: even code (codes are consecutive, so even index <=> even mantissa bit)
            r = float(lo) if i % 2 == 0 else float(hi)
    return float(np.copysign(r, v))


def test_e4m3_oracle_is_round_nearest_even_with_subnormals_and_saturation():
    vals = []
    for m in np.concatenate([cases.e4m3_values(), cases.e4m3_midpoints(), np.float32([464, 500, 1e9])]):
        vals += cases._neighbours(m, 2)
    vals += [np.float32(2.0**-10), np.float32(2.0**-10 * 1.0000001), np.float32(3 * 2.0**-11)]
    v = np.array(vals, np.float32)
    v = np.concatenate([v, -v])
    got = oracle.e4m3(v).astype(np.float32)
    want = np.array([_e4m3_rne_exact(float(x)) for x in v], np.float32)
    np.testing.assert_array_equal(got, want)
    assert oracle.e4m3(np.float32([2.0**-10]))[0] == 0  # §1: below 2^-10 -> 0; the tie goes to even 0
    assert np.isnan(oracle.e4m3(np.float32([np.nan]))[0].astype(np.float32))


def test_oracle_reference_vectors_of_s3():
    """docs/numerics.md §3 on the oracle itself (E = 256, A = 1536, MAE)."""
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = 1536
    x[0, 16:18] = [6, 5]
    x[0, 32:34] = [6, 4]
    r = oracle.quantize_nvfp4(x, four_over_six="mae")
    np.testing.assert_array_equal(r.scales[0], [0x78, 0x3C, 0x38, 0x00])
    np.testing.assert_array_equal(r.map4[0], [False, True, False, False])
    assert r.codes[0, 8] == 0x56
    y = np.zeros((1, 32), np.float32)
    y[0, 0] = 1536
    y[0, 16:20] = [6, 5, 1, 2]
    assert not oracle.quantize_nvfp4(y, four_over_six="mae").map4[0, 1]
    assert oracle.quantize_nvfp4(y, four_over_six="mse").map4[0, 1]


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_mx_oracle_scale_rule_by_hand(fmt):
    # amax 1.0: MXFP8 t = fl(1/448) -> 2^-8 (2^-9 < 1/448 < 2^-8) -> byte 119;
    # MXFP4 floor(log2 1) - 2 = -2 -> byte 125. amax 448 (MXFP8): t = fl(448*fl(1/448)) = 1 -> 127.
    x = np.zeros((3, 32), np.float32)
    x[0, 0] = 1.0
    x[1, 0] = 448.0
    r = oracle.quantize_mx(x, fmt)
    if fmt == "mxfp8":
        assert oracle.F32(448) * (oracle.ONE / oracle.F32(448)) == 1.0
        np.testing.assert_array_equal(r.scales_e8m0[:, 0], [119, 127, 0])
    else:
        np.testing.assert_array_equal(r.scales_e8m0[:, 0], [125, 133, 0])


@pytest.mark.parametrize(
    "kw", [dict(), dict(four_over_six="mse", fast_error=True), dict(block_2d=True, four_over_six="mae"), dict(scale="token")]
)
def test_oracle_batch_dims_equals_a_loop(kw):
    """batch_dims=1 (independent tensors, as under vmap) is the per-case oracle, stacked."""
    x = cases.student_t()
    rb = oracle.quantize_nvfp4(x, batch_dims=1, **kw)
    for i in range(x.shape[0]):
        r = oracle.quantize_nvfp4(x[i], **kw)
        for f in ("codes", "scales", "map4", "amax"):
            np.testing.assert_array_equal(getattr(rb, f)[i], getattr(r, f), err_msg=f)
