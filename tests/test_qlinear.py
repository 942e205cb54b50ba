"""qdot: forward emulation, the three backward modes, transformations, expert layouts.

Matmul tolerances (docs/design.md practice 4) are derived from the dtype and the reduction length:
an f32 dot of length n accumulates at most ~n * 2^-24 relative error per term, so we use
rtol = 4 * n * 2^-24 on the norm where two different-but-equivalent op orders are compared.
Where the test computes the very same sequence of ops as qdot, the comparison is bitwise.

Longer than ~400 lines because tests mirror packages and `qdot` is one entry point with three
weight layouts, three backward modes and two formats, all tested here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import grouped, qlinear
from fp4rl.formats import hadamard, mx, nvfp4
from fp4rl.recipe import SiteConfig

T, K, N = 48, 64, 32
NVFP4_46 = SiteConfig(format="nvfp4", weight_46="mae", act_46="mse")


def _inputs(seed=0, dtype=jnp.float32):
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (T, K), dtype)
    w = (jax.random.normal(kw, (K, N)) * 0.1).astype(dtype)
    g = jax.random.normal(kg, (T, N), dtype)
    return x, w, g


def _vjp(site, x, w, g, key=None):
    y, pull = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, key=key), x, w)
    return y, *pull(g)


def _tn(a, b):
    """a^T @ b contracting the token axis, the op order qdot's wgrad uses."""
    return jax.lax.dot_general(a, b, (([0], [0]), ([], [])), preferred_element_type=jnp.float32)


def _dq(t):
    return nvfp4.dequantize(t, jnp.float32)


def _nvfp4_site(backward, **kw):
    return SiteConfig(format="nvfp4", backward=backward, **kw)


@pytest.mark.parametrize("site", [SiteConfig(format="nvfp4"), NVFP4_46, SiteConfig(format="nvfp4", weight_block="1d", act_scale="tensor")])
def test_forward_is_the_emulated_nvfp4_gemm(site):
    x, w, _ = _inputs()
    xq = nvfp4.quantize(x, site.act_config())
    wq = nvfp4.quantize(w.T, site.weight_config())
    xv, sx = nvfp4.scaled_operand(xq)
    wv, sw = nvfp4.scaled_operand(wq)
    expected = jnp.matmul(xv, wv.T, preferred_element_type=jnp.float32) * (sx * sw)
    np.testing.assert_array_equal(np.asarray(qlinear.qdot(x, w, site)), np.asarray(expected))
    # and it is DQ(Q(x)) @ DQ(Q(w)) up to f32 re-association (the operands are exact in bf16)
    dq = _dq(xq) @ _dq(wq).T
    np.testing.assert_allclose(np.asarray(expected), np.asarray(dq), rtol=4 * K * 2**-24, atol=1e-6)


def test_unquantized_site_is_x_at_w_with_its_exact_gradient():
    x, w, g = _inputs()
    y, dx, dw = _vjp(SiteConfig(), x, w, g)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.matmul(x, w, preferred_element_type=jnp.float32)))
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(g @ w.T))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(_tn(x, g)))


def test_ragged_grouped_matmul_survives_vmap_with_unbatched_weights():
    """The seeds of an arm vmap the MoE; lax.ragged_dot alone cannot batch an unbatched weight."""
    site = _nvfp4_site("dequantized")
    w = jax.random.normal(jax.random.key(1), (3, K, N)) * 0.1
    xs = jax.random.normal(jax.random.key(0), (2, 96, K))
    sizes = jnp.array([32, 0, 64], jnp.int32)
    f = lambda x, w: jnp.sum(qlinear.qdot(x, w, site, group_sizes=sizes) ** 2)  # noqa: E731
    batched = jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(0, None)))(xs, w)
    for i in range(2):
        single = jax.jit(jax.grad(f, argnums=(0, 1)))(xs[i], w)
        for a, b in zip(batched, single):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=4 * 96 * 2**-24, atol=1e-5)


def test_xla_ragged_gemms_batch_over_seeds_linearly():
    """Vmapped (nested too) XLA ragged GEMMs run as one batched ragged dot: each problem's result
    bit for bit, and B problems need B times one problem's temporary memory (XLA expands a ragged
    dot over its groups; B problems folded into B * (E + 1) groups would need B^2 times)."""
    b, rows, k, n = 4, 256, 64, 32
    sizes = jnp.asarray([[64, 0, 128], [8, 200, 0], [0, 0, 256], [100, 100, 50]], jnp.int32)
    a, w, g = (jax.random.normal(jax.random.key(i), s, jnp.bfloat16)
               for i, s in enumerate([(2, b, rows, k), (2, b, 3, k, n), (2, b, rows, n)]))
    matmul = lambda a, w, s: grouped.ragged_matmul(a, w, s)  # noqa: E731
    wgrad = lambda a, g, s: grouped.ragged_wgrad(a, g, s)  # noqa: E731
    nested = lambda f: jax.jit(jax.vmap(jax.vmap(f), in_axes=(0, 0, None)))  # noqa: E731
    y, dw = nested(matmul)(a, w, sizes), nested(wgrad)(a, g, sizes)
    for o in range(2):
        for i in range(b):
            np.testing.assert_array_equal(np.asarray(y[o, i]), np.asarray(matmul(a[o, i], w[o, i], sizes[i])))
            np.testing.assert_array_equal(np.asarray(dw[o, i]), np.asarray(wgrad(a[o, i], g[o, i], sizes[i])))

    def temp_bytes(f, *args):
        return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes

    for f, second in ((matmul, w[0]), (wgrad, g[0])):
        one = temp_bytes(f, a[0, 0], second[0], sizes[0])
        assert temp_bytes(jax.vmap(f), a[0], second, sizes) <= b * one * 1.1


def test_bf16_backward_is_the_gradient_of_x_at_w():
    x, w, g = _inputs()
    _, dx, dw = _vjp(_nvfp4_site("bf16"), x, w, g)
    _, pull = jax.vjp(lambda x, w: x @ w, x, w)
    rx, rw = pull(g)
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(g @ w.T))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(_tn(x, g)))
    np.testing.assert_allclose(np.asarray(dx), np.asarray(rx), rtol=4 * N * 2**-24, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(rw), rtol=4 * T * 2**-24, atol=1e-6)


@pytest.mark.parametrize("site", [_nvfp4_site("dequantized"), _nvfp4_site("dequantized", weight_46="mae", act_46="mae", weight_block="1d")])
def test_dequantized_backward_formula_and_straight_through(site):
    x, w, g = _inputs(1)
    _, dx, dw = _vjp(site, x, w, g)
    wq = nvfp4.quantize(w.T, site.weight_config())
    w_dq = _dq(wq).T  # [K, N]
    x_dq = _dq(nvfp4.quantize(x, site.act_config()))
    wv, sw = nvfp4.scaled_operand(wq)  # dgrad as the forward's GEMM: exact values, scale after
    expected_dx = jnp.matmul(g, wv, preferred_element_type=jnp.float32) * sw
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(expected_dx))
    # = g @ DQ(Q(w))^T up to f32 re-association of the scale (operands exact): 4 n 2^-24
    np.testing.assert_allclose(np.asarray(dx), np.asarray(jnp.matmul(g, w_dq.T)), rtol=4 * N * 2**-24, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(_tn(x_dq, g)))  # per-token scales: f32 DQ(Q(x))

    def straight_through(x, w):
        x_hat = x + jax.lax.stop_gradient(x_dq - x)
        w_hat = w + jax.lax.stop_gradient(w_dq - w)
        return x_hat @ w_hat

    _, pull = jax.vjp(straight_through, x, w)
    sx, sw = pull(g)
    # x + (dq - x) re-rounds dq by at most an ulp, then the dot: 4 n 2^-24 relative
    np.testing.assert_allclose(np.asarray(dx), np.asarray(sx), rtol=4 * N * 2**-24, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(sw), rtol=4 * T * 2**-24, atol=1e-5)


def test_quantized_backward_matches_the_pretraining_recipe_formula():
    site = _nvfp4_site("quantized")
    x, w, g = _inputs(2)
    key = jax.random.key(7)
    _, dx, dw = _vjp(site, x, w, g, key)
    k_dgrad, k_wgrad, k_rht = jax.random.split(key, 3)
    per_tensor = nvfp4.NVFP4Config(scale="tensor")
    gq = nvfp4.quantize(g, per_tensor, sr_key=k_dgrad)
    wq = nvfp4.quantize(w, site.weight_config())  # along N: dgrad's contraction
    gv, sg = nvfp4.scaled_operand(gq)
    wv, sw = nvfp4.scaled_operand(wq)
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(jnp.matmul(gv, wv.T, preferred_element_type=jnp.float32) * (sg * sw)))
    pad = -T % qlinear.TOKEN_ALIGN
    xt = hadamard.random_hadamard(jnp.pad(x, ((0, pad), (0, 0))).T, k_rht, axis=-1)
    gt = hadamard.random_hadamard(jnp.pad(g, ((0, pad), (0, 0))).T, k_rht, axis=-1)
    xv, sx = nvfp4.scaled_operand(nvfp4.quantize(xt, per_tensor))
    gv, sg = nvfp4.scaled_operand(nvfp4.quantize(gt, per_tensor, sr_key=k_wgrad))
    expected_dw = _tn(xv.T, gv.T) * (sx * sg)
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(expected_dw))


# ---------------------------------------------------------------- bf16 backward vs a float64 oracle
# Unit roundoffs (round to nearest moves y by at most half an ulp): bf16 has 8 significant bits, so
# for |y| in [2^e, 2^(e+1)) the move is <= 2^-9 * 2^(e+1) <= 2^-8 |y|; f32 (24 bits): 2^-24 |y|.
U_BF16, U_F32 = 2.0**-8, 2.0**-24
BF16 = jnp.bfloat16


def _f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def _assert_gemm_matches_oracle(got, a, b, scale, out_bf16):
    """`got` against the exact (a @ b) * scale in float64, on the GEMM's own operands a, b.

    f32 accumulation of n products: |error| <= n 2^-24 sum|a_i b_i| (gamma_n, Higham 3.1); add one
    2^-24 for products that are themselves rounded (an f32 operand times a bf16 one) and one per
    scale multiplication (two at most), so (n + 3) 2^-24 sum|a_i b_i| |scale|. A bf16 output rounds
    that once more: + 2^-8 |exact|, and the f32 error grows by at most (1 + 2^-8).
    """
    n = a.shape[-1]
    exact = (_f64(a) @ _f64(b)) * np.float64(scale)
    magnitude = (np.abs(_f64(a)) @ np.abs(_f64(b))) * np.abs(np.float64(scale))
    tol = (n + 3) * U_F32 * magnitude * (1 + U_BF16) + (U_BF16 * np.abs(exact) if out_bf16 else 0.0)
    err = np.abs(_f64(got) - exact)
    assert np.all(err <= tol), f"{np.sum(err > tol)} elements past the bound, worst by {np.max(err - tol):.3g}"


def _bf16_training_inputs(seed):
    """x and the cotangent g in bf16 (the h200 compute dtype), w an f32 master weight."""
    x, w, g = _inputs(seed)
    return x.astype(BF16), w, g.astype(BF16)


@pytest.mark.parametrize("site", [_nvfp4_site("bf16"), _nvfp4_site("dequantized"),
                                  _nvfp4_site("dequantized", act_scale="tensor", weight_46="mae", act_46="mae"),
                                  _nvfp4_site("quantized")],
                         ids=["bf16", "dequantized", "dequantized-tensor-46", "quantized"])
def test_bf16_backward_against_float64_oracle(site):
    """dx (bf16, x's dtype) and dw (f32, w's dtype) against float64 products of the operands each
    backward GEMM consumes, rebuilt here from the same bytes (the quantized mode from the same key)."""
    x, w, g = _bf16_training_inputs(6)
    key = jax.random.key(11)
    _, dx, dw = _vjp(site, x, w, g, key if site.backward == "quantized" else None)
    assert dx.dtype == BF16 and dw.dtype == jnp.float32
    if site.backward == "bf16":  # g @ w^T on w rounded to the cotangent's dtype; x^T @ g
        _assert_gemm_matches_oracle(dx, g, w.astype(BF16).T, 1.0, out_bf16=True)
        _assert_gemm_matches_oracle(dw, x.T, g, 1.0, out_bf16=False)
    elif site.backward == "dequantized":
        wv, sw = nvfp4.scaled_operand(nvfp4.quantize(w.T, site.weight_config()))  # [N, K]
        _assert_gemm_matches_oracle(dx, g, wv, sw, out_bf16=True)
        xq = nvfp4.quantize(x, site.act_config())
        if site.act_scale == "tensor":
            xv, sx = nvfp4.scaled_operand(xq)
            _assert_gemm_matches_oracle(dw, xv.T, g, sx, out_bf16=False)
        else:  # per-token scales: DQ(Q(x)) in f32
            _assert_gemm_matches_oracle(dw, _dq(xq).T, g, 1.0, out_bf16=False)
    else:
        k_dgrad, k_wgrad, k_rht = jax.random.split(key, 3)
        per_tensor = nvfp4.NVFP4Config(scale="tensor")
        gv, sg = nvfp4.scaled_operand(nvfp4.quantize(g, per_tensor, sr_key=k_dgrad))
        wv, sw = nvfp4.scaled_operand(nvfp4.quantize(w, site.weight_config()))  # along N: [K, N]
        _assert_gemm_matches_oracle(dx, gv, wv.T, sw * sg, out_bf16=True)
        pad = -T % qlinear.TOKEN_ALIGN
        xt = hadamard.random_hadamard(jnp.pad(x.astype(jnp.float32), ((0, pad), (0, 0))).T, k_rht, axis=-1)
        gt = hadamard.random_hadamard(jnp.pad(g.astype(jnp.float32), ((0, pad), (0, 0))).T, k_rht, axis=-1)
        xv, sx = nvfp4.scaled_operand(nvfp4.quantize(xt, per_tensor))
        gv, sg = nvfp4.scaled_operand(nvfp4.quantize(gt, per_tensor, sr_key=k_wgrad))
        _assert_gemm_matches_oracle(dw, xv, gv.T, sx * sg, out_bf16=False)


def _rounds_up_in_bf16():
    """Positive operands whose DQ(Q(.)) never round down to bf16 and mostly round up: with amax 1.1
    (w, f32) or 0.98828125 (x, bf16) the global scale S_dec puts dec(q) * sf * S_dec just above a
    bf16 value for the codes that occur (checked by the test), so rounding DQ(Q(.)) to bf16 before
    the GEMM would bias every product the same way."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0.1, 1.0, (K, N)).astype(np.float32) * np.float32(1.1)
    w[0, 0] = 1.1
    x = np.array(jnp.asarray(rng.uniform(0.1, 1.0, (T, K)) * 0.98828125, BF16).astype(jnp.float32))
    x[:, 0] = 0.98828125  # every token's amax, so per-token and per-tensor scales are equal
    g = rng.uniform(0.5, 1.0, (T, N)).astype(np.float32)
    return jnp.asarray(x, BF16), jnp.asarray(w), jnp.asarray(g, BF16)


@pytest.mark.parametrize("act_scale", ["token", "tensor"])
def test_dequantized_backward_takes_exact_operands_and_epilogue_scales(act_scale):
    site = _nvfp4_site("dequantized", act_scale=act_scale)
    x, w, g = _rounds_up_in_bf16()
    _, dx, dw = _vjp(site, x, w, g)
    wq = nvfp4.quantize(w.T, site.weight_config())
    xq = nvfp4.quantize(x, site.act_config())
    for t in (wq, xq):  # the construction: rounding DQ(Q(.)) to bf16 never lowers it, on average +1e-3
        rel = _f64(_dq(t).astype(BF16)) / _f64(_dq(t)) - 1
        assert (rel >= 0).all() and rel.mean() > 1e-3

    # dgrad is the forward's GEMM on the same packed weight: bitwise
    wv, sw = nvfp4.scaled_operand(wq)
    f32_dx = jnp.matmul(g, wv, preferred_element_type=jnp.float32) * sw
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(f32_dx.astype(BF16)))
    # wgrad: per-tensor scale as an epilogue; per-token scales sum along tokens, so f32 DQ(Q(x))
    if act_scale == "tensor":
        xv, sx = nvfp4.scaled_operand(xq)
        expected_dw = _tn(xv, g) * sx
    else:
        expected_dw = _tn(_dq(xq), g.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(expected_dw))

    # Against the exact product the error is the final rounding only (dx in bf16: unbiased, the mean
    # relative error of 3072 elements has a std below 2^-8 / sqrt(3 * 3072) = 4e-5; dw in f32), while
    # rounding DQ(Q(.)) to bf16 first shifts the products by the construction's ~+1e-3.
    exact_dx = (_f64(g) @ _f64(wv)) * np.float64(sw)
    rounded_dx = jnp.matmul(g, _dq(wq).astype(BF16), preferred_element_type=jnp.float32).astype(BF16)
    assert abs(np.mean(_f64(dx) / exact_dx - 1)) < 2e-4
    assert np.mean(_f64(rounded_dx) / exact_dx - 1) > 5e-4
    assert np.mean(np.asarray(rounded_dx) != np.asarray(dx)) > 0.25
    exact_dw = _f64(_dq(xq)).T @ _f64(g)
    rounded_dw = _tn(_dq(xq).astype(BF16), g)
    assert abs(np.mean(np.asarray(dw, np.float64) / exact_dw - 1)) < 2e-4
    assert np.mean(np.asarray(rounded_dw, np.float64) / exact_dw - 1) > 5e-4


def test_quantized_backward_needs_a_key():
    x, w, g = _inputs()
    with pytest.raises(ValueError, match="key"):
        _vjp(_nvfp4_site("quantized"), x, w, g)


def test_quantized_dgrad_is_unbiased_over_keys():
    """E_key[Q_sr(g)] = clip(g * inv, +-6) / inv per block, so the mean dgrad over keys approaches
    that expectation times Q(w)^T. (The clip matters: when E4M3 rounds a block scale down, the
    block max lands a little past 6 and saturates, deterministically.)

    Each element's mean over n keys has standard error sigma/sqrt(n); we allow 6 standard
    errors (a false failure rate below 1e-8 per element, ~1e-5 over the matrix).
    """
    site = _nvfp4_site("quantized")
    x, w, g = _inputs(3)
    n = 512
    dxs = jax.jit(jax.vmap(lambda k: _vjp(site, x, w, g, k)[1]))(jax.random.split(jax.random.key(0), n))
    gq = nvfp4.quantize(g, nvfp4.NVFP4Config(scale="tensor"))  # the deterministic block scales
    _, s_dec = nvfp4.global_scales(gq.amax, 448)
    sf = jnp.repeat(gq.scales.astype(jnp.float32), 16, axis=-1) * s_dec
    expected_g = jnp.clip(g / sf, -6, 6) * sf
    wv, sw = nvfp4.scaled_operand(nvfp4.quantize(w, site.weight_config()))
    expected = np.asarray(jnp.matmul(expected_g, (wv.astype(jnp.float32) * sw).T))
    mean, std = np.asarray(dxs.mean(0)), np.asarray(dxs.std(0))
    assert np.all(np.abs(mean - expected) <= 6 * std / np.sqrt(n) + 1e-4)


def test_random_hadamard_cancels_in_the_wgrad_product():
    x, _, g = _inputs(4)
    key = jax.random.key(5)
    xt = hadamard.random_hadamard(x.T, key, axis=-1)
    gt = hadamard.random_hadamard(g.T, key, axis=-1)
    np.testing.assert_allclose(np.asarray(xt @ gt.T), np.asarray(x.T @ g), rtol=8 * T * 2**-24, atol=1e-4)


@pytest.mark.parametrize("backward", ["bf16", "dequantized", "quantized"])
def test_same_under_jit_remat_and_vmap(backward):
    """jit and jit(remat) run the same ops: bitwise. Eager and vmap may pick another CPU dot
    kernel (another summation order), so they match to the f32 dot bound 4 n 2^-24."""
    site = _nvfp4_site(backward, weight_46="mae", act_46="mae")
    x, w, g = _inputs(5)
    key = jax.random.key(1)
    loss = lambda x, w: jnp.sum(qlinear.qdot(x, w, site, key=key) * g)  # noqa: E731
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1)))(x, w)
    eager = jax.grad(loss, argnums=(0, 1))(x, w)
    for a, b, c in zip(jitted, remat, eager):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=4 * T * 2**-24, atol=1e-5)
    xs, ws = jnp.stack([x, x * 2]), jnp.stack([w, -w])
    batched = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(xs, ws)
    for i in range(2):
        single = jax.jit(jax.grad(loss, argnums=(0, 1)))(xs[i], ws[i])
        for a, b in zip(batched, single):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=4 * T * 2**-24, atol=1e-5)


def test_scan_over_layers_equals_a_python_loop():
    site = _nvfp4_site("dequantized", weight_46="mae", act_46="mae")
    x = jax.random.normal(jax.random.key(0), (T, K))
    ws = jax.random.normal(jax.random.key(1), (3, K, K)) * 0.2

    def scanned(x, ws):
        return jnp.sum(jax.lax.scan(lambda h, w: (jnp.tanh(qlinear.qdot(h, w, site)), None), x, ws)[0] ** 2)

    def looped(x, ws):
        for i in range(ws.shape[0]):
            x = jnp.tanh(qlinear.qdot(x, ws[i], site))
        return jnp.sum(x**2)

    for a, b in zip(jax.jit(jax.grad(scanned, (0, 1)))(x, ws), jax.jit(jax.grad(looped, (0, 1)))(x, ws)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_retracing_per_step():
    traces = []
    site = NVFP4_46

    @jax.jit
    def step(x, w):
        traces.append(1)
        return jax.grad(lambda w: jnp.sum(qlinear.qdot(x, w, site) ** 2))(w)

    x, w, _ = _inputs()
    for i in range(3):
        w = w - 0.01 * step(x * (i + 1), w)
    assert len(traces) == 1


@pytest.mark.parametrize("backward", ["bf16", "dequantized", "quantized"])
def test_expert_stack_forms_equal_looping_over_experts(backward):
    site = _nvfp4_site(backward, weight_46="mae", act_46="mae")
    e, rows = 3, 32
    x = jax.random.normal(jax.random.key(0), (e * rows, K))
    w = jax.random.normal(jax.random.key(1), (e, K, N)) * 0.1
    g = jax.random.normal(jax.random.key(2), (e * rows, N))
    sizes = jnp.array([rows, 0, 2 * rows], jnp.int32)
    key = jax.random.key(3)
    y, pull = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, group_sizes=sizes, key=key), x, w)
    dx, dw = pull(g)
    # per expert: its own rows through the 2D form. The quantized backward uses per-tensor
    # scales over the whole sorted matrix, so compare that mode's forward only.
    starts = [0, rows, rows]
    for i, (s, n) in enumerate(zip(starts, [rows, 0, 2 * rows])):
        if n == 0:
            np.testing.assert_array_equal(np.asarray(dw[i]), 0)
            continue
        ye, pe = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, key=key), x[s : s + n], w[i])
        np.testing.assert_array_equal(np.asarray(y[s : s + n]), np.asarray(ye))
        if backward != "quantized":
            dxe, dwe = pe(g[s : s + n])
            np.testing.assert_array_equal(np.asarray(dx[s : s + n]), np.asarray(dxe))
            np.testing.assert_allclose(np.asarray(dw[i]), np.asarray(dwe), rtol=4 * T * 2**-24, atol=1e-5)
    # batched [E, C, K] form: one 2D qdot per expert
    xb = x.reshape(e, rows, K)
    yb = qlinear.qdot(xb, w, site, key=key)
    for i in range(e):
        np.testing.assert_array_equal(np.asarray(yb[i]), np.asarray(qlinear.qdot(xb[i], w[i], site)))


def test_prequantized_weight_gives_identical_bytes():
    site = NVFP4_46
    x, w, _ = _inputs()
    wq = qlinear.quantize_weight(w, site)
    np.testing.assert_array_equal(np.asarray(qlinear.qdot(x, wq, site)), np.asarray(qlinear.qdot(x, w, site)))
    stack = jnp.stack([w, 2 * w])
    xs = jnp.stack([x, x])
    np.testing.assert_array_equal(
        np.asarray(qlinear.qdot(xs, qlinear.quantize_weight(stack, site), site)), np.asarray(qlinear.qdot(xs, stack, site))
    )


def test_mxfp8_forward_uses_mx_operands():
    site = SiteConfig(format="mxfp8", backward="dequantized")
    x, w, _ = _inputs()
    expected = jnp.matmul(mx.dequantize(mx.quantize(x, "mxfp8"), jnp.bfloat16), mx.dequantize(mx.quantize(w.T, "mxfp8"), jnp.bfloat16).T, preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(qlinear.qdot(x, w, site)), np.asarray(expected))


def test_group_sizes_must_cover_every_row_when_concrete():
    """rows past sum(group_sizes) would come out as zeros, a plausible but wrong answer."""
    w = jax.random.normal(jax.random.key(1), (2, K, N))
    x = jax.random.normal(jax.random.key(0), (64, K))
    for sizes, match in (([32, 16], "sum to 48, but x has 64 rows"), ([32, 64], "sum to 96, but x has 64 rows"),
                         ([-32, 96], "negative size"), ([64], r"must have shape \(2,\)")):
        with pytest.raises(ValueError, match=match):
            qlinear.qdot(x, w, NVFP4_46, group_sizes=jnp.array(sizes, jnp.int32))
    with pytest.raises(ValueError, match="must be integers"):
        qlinear.qdot(x, w, NVFP4_46, group_sizes=jnp.array([32.0, 32.0]))
    # Declared padding (the MoE's static row bound): the rows past the groups are zeros.
    y = qlinear.qdot(x, w, NVFP4_46, group_sizes=jnp.array([32, 16], jnp.int32), padding_rows=True)
    np.testing.assert_array_equal(np.asarray(y[48:]), 0)


def test_wrong_traced_group_sizes_give_nan_not_zeros():
    """Under jit the sizes have no value to raise on: the output is NaN, which the trainer's
    non-finite checks stop on; right sizes give the eager result."""
    w = jax.random.normal(jax.random.key(1), (2, K, N))
    x = jax.random.normal(jax.random.key(0), (64, K))
    f = jax.jit(lambda sizes: qlinear.qdot(x, w, NVFP4_46, group_sizes=sizes))
    assert np.isnan(np.asarray(f(jnp.array([32, 16], jnp.int32)))).all()
    good = jnp.array([32, 32], jnp.int32)
    np.testing.assert_array_equal(np.asarray(f(good)), np.asarray(qlinear.qdot(x, w, NVFP4_46, group_sizes=good)))


@pytest.mark.parametrize("site", [SiteConfig(), NVFP4_46])
def test_an_empty_contraction_is_a_clear_error(site):
    with pytest.raises(ValueError, match=r"qdot needs a contraction dimension K >= 1, got x of shape \(8, 0\)"):
        qlinear.qdot(jnp.ones((8, 0)), jnp.ones((0, 16)), site)


def test_bad_arguments_raise():
    x, w, _ = _inputs()
    with pytest.raises(ValueError, match="impl"):
        qlinear.qdot(x, w, NVFP4_46, impl="cuda")
    with pytest.raises(ValueError, match="group_sizes"):
        qlinear.qdot(x, w, NVFP4_46, group_sizes=jnp.array([T]))
    with pytest.raises(ValueError, match="multiple of the block"):
        qlinear.qdot(jnp.ones((4, 24)), jnp.ones((24, 16)), NVFP4_46)


def test_reference_quantizer_trace_is_keyed_by_the_division_mode():
    """The model's jitted reference quantizer is traced once per (shape, config) AND division mode:
    a trace made under `ieee.integer_division_everywhere` (the GPU path) must not serve a plain call."""
    from fp4rl import operands
    from fp4rl.formats import ieee

    x = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.float32).reshape(2, 32)
    config = nvfp4.NVFP4Config(scale="token", four_over_six="mae")  # exact errors: divisions in the trace
    before = operands._reference_quantize._cache_size()
    plain = operands.nvfp4_quantize(x, config, "reference")
    operands.nvfp4_quantize(x, config, "reference")
    assert operands._reference_quantize._cache_size() == before + 1  # a second call reuses the trace
    with ieee.integer_division_everywhere():
        forced = operands.nvfp4_quantize(x, config, "reference")
        text = jax.jit(lambda v: operands.nvfp4_quantize(v, config, "reference").codes).lower(x).as_text()
    assert operands._reference_quantize._cache_size() == before + 2
    assert "divide" not in text.replace("shift_right", "")  # the integer division has no float divide
    for field in ("codes", "scales", "amax", "map4"):  # normal inputs: both divisions are IEEE on the CPU
        np.testing.assert_array_equal(np.asarray(getattr(plain, field)), np.asarray(getattr(forced, field)))


def test_per_row_weight_scale_is_each_rows_expert_without_a_while_loop():
    """`_per_row` runs at every quantized MoE call (every decode step, every layer): straight-line
    device code, since a GPU while loop returns its condition to the host at every iteration."""
    sizes, scales = jnp.asarray([2, 0, 3, 1]), jnp.asarray([1.0, 2.0, 3.0, 4.0])
    got = qlinear._per_row(scales, sizes, 7)[:, 0]
    np.testing.assert_array_equal(np.asarray(got), [1, 1, 3, 3, 3, 4, 4])  # row 6: past the groups, the last expert's
    text = jax.jit(qlinear._per_row, static_argnums=2).lower(scales, sizes, 7).as_text()
    assert "while" not in text
