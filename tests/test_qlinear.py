"""qdot: forward emulation, the three backward modes, transformations, expert layouts.

Matmul tolerances (DESIGN.md practice 4) are derived from the dtype and the reduction length:
an f32 dot of length n accumulates at most ~n * 2^-24 relative error per term, so we use
rtol = 4 * n * 2^-24 on the norm where two different-but-equivalent op orders are compared.
Where the test computes the very same sequence of ops as qdot, the comparison is bitwise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import qlinear
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
    w_dq = _dq(nvfp4.quantize(w.T, site.weight_config())).T  # [K, N]
    x_dq = _dq(nvfp4.quantize(x, site.act_config()))
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(jnp.matmul(g, w_dq.T)))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(_tn(x_dq, g)))

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
