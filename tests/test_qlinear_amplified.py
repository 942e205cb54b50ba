"""qdot at an amplified site (the dose-response arms nvfp4@A, +dq@A): the forward on x_a and w_a,
the two backwards, the pre-formed weight, and amplification 1 as the plain site.

The amplified operands are rebuilt here in NumPy float32, one rounding per operation, from the
reference quantizer's DQ(Q(.)), and rounded to bf16 with ml_dtypes: qdot's operands must match
them bit for bit. GEMMs are compared bitwise with the same jnp op on the same operands, and against
a float64 product under the bound of tests/test_qlinear.py (`_assert_gemm_matches_oracle`).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp4rl import qlinear
from fp4rl.formats import nvfp4
from fp4rl.operands import ScaledWeight
from fp4rl.recipe import SiteConfig
from tests.test_qlinear import K, N, T, _assert_gemm_matches_oracle, _inputs, _tn

A = 4.0


def _site(backward, a=A, **kw):
    return SiteConfig(format="nvfp4", backward=backward, amplification=a, **kw)


def _amplified_np(v, config, a):
    """v + a * (DQ(Q(v)) - v) in NumPy float32 (each op rounded), then rounded to bf16."""
    v32 = np.asarray(v, np.float32)
    dq = np.asarray(nvfp4.dequantize(nvfp4.quantize(jnp.asarray(v), config), jnp.float32))
    step = np.float32(a) * (dq - v32)
    return (v32 + step).astype(ml_dtypes.bfloat16)


def _vjp(site, x, w, g, group_sizes=None):
    y, pull = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, group_sizes=group_sizes), x, w)
    return y, *pull(g)


@pytest.mark.parametrize("act_scale", ["token", "tensor"])
def test_forward_is_x_a_at_w_a(act_scale):
    site = _site("bf16", act_scale=act_scale)
    x, w, _ = _inputs(2)
    xa = _amplified_np(x, site.act_config(), A)
    wa_t = _amplified_np(w.T, site.weight_config(), A)  # [N, K], as the GEMM reads it
    wa = qlinear.quantize_weight(w, site)
    assert isinstance(wa, ScaledWeight) and wa.amplification == A and wa.values.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(wa.values).view(np.uint16), wa_t.T.view(np.uint16))  # w's layout
    y = qlinear.qdot(x, w, site)
    expected = jnp.matmul(jnp.asarray(xa), jnp.asarray(wa_t).T, preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected))
    _assert_gemm_matches_oracle(y, xa.astype(np.float32), wa_t.astype(np.float32).T, 1.0, out_bf16=False)
    # the dose: a times the plain site's error, plus the second-order a^2 (x_a - x)(w_a - w) (2-3% here)
    plain = SiteConfig(format="nvfp4", act_scale=act_scale)
    exact = x @ w
    err_1 = float(jnp.linalg.norm(qlinear.qdot(x, w, plain) - exact))
    err_a = float(jnp.linalg.norm(y - exact))
    assert 0.8 * A * err_1 < err_a < 1.2 * A * err_1


def test_bf16_backward_takes_the_raw_operands():
    """The paper's mismatch, amplified: the gradient is that of x @ w on the raw operands."""
    x, w, g = _inputs(3)
    y, dx, dw = _vjp(_site("bf16"), x, w, g)
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(g @ w.T))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(_tn(x, g)))
    y_dq, dx_dq, dw_dq = _vjp(_site("dequantized"), x, w, g)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_dq))  # one forward for both backwards
    assert float(jnp.linalg.norm(dx_dq - dx) / jnp.linalg.norm(dx)) > 0.1


def test_dequantized_backward_takes_the_amplified_operands():
    site = _site("dequantized")
    x, w, g = _inputs(4)
    _, dx, dw = _vjp(site, x, w, g)
    xa = jnp.asarray(_amplified_np(x, site.act_config(), A))
    wa_t = jnp.asarray(_amplified_np(w.T, site.weight_config(), A))  # [N, K]
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(jnp.matmul(g, wa_t.astype(jnp.float32))))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(_tn(xa.astype(jnp.float32), g)))
    _assert_gemm_matches_oracle(dx, g, wa_t, 1.0, out_bf16=False)
    _assert_gemm_matches_oracle(dw, xa.T, g, 1.0, out_bf16=False)


@pytest.mark.parametrize("backward", ["bf16", "dequantized"])
def test_expert_stack_and_preformed_weight_equal_the_dense_site(backward):
    """Ragged stack: each expert's rows as the 2D site, up to the f32 dot bound 4 n 2^-24 (the ragged
    and the dense dot sum in other orders, and x_a, w_a use all of bf16's bits, unlike the plain
    site's few-bit values); the synced w_a gives the same bytes."""
    site = _site(backward)
    e, rows = 3, 32
    x = jax.random.normal(jax.random.key(0), (e * rows, K))
    w = jax.random.normal(jax.random.key(1), (e, K, N)) * 0.1
    g = jax.random.normal(jax.random.key(2), (e * rows, N))
    sizes = jnp.array([rows, 0, 2 * rows], jnp.int32)
    y, dx, dw = _vjp(site, x, w, g, sizes)
    np.testing.assert_array_equal(np.asarray(dw[1]), 0)
    for i, (s, n) in ((0, (0, rows)), (2, (rows, 2 * rows))):
        ye, dxe, dwe = _vjp(site, x[s : s + n], w[i], g[s : s + n])
        np.testing.assert_allclose(np.asarray(y[s : s + n]), np.asarray(ye), rtol=4 * K * 2**-24, atol=1e-6)
        np.testing.assert_allclose(np.asarray(dx[s : s + n]), np.asarray(dxe), rtol=4 * N * 2**-24, atol=1e-6)
        np.testing.assert_allclose(np.asarray(dw[i]), np.asarray(dwe), rtol=4 * T * 2**-24, atol=1e-5)
    wa = qlinear.quantize_weight(w, site)
    assert wa.values.shape == (e, K, N) and wa.scale.shape == (e,)
    np.testing.assert_array_equal(np.asarray(qlinear.qdot(x, wa, site, group_sizes=sizes)), np.asarray(y))


def test_amplification_one_is_the_plain_site():
    """a = 1 is the recipe itself: an equal SiteConfig, so the same program (not only the same values)."""
    assert _site("bf16", 1) == SiteConfig(format="nvfp4") and _site("dequantized", 1.0) == _site("dequantized", 1)
    x, w, g = _inputs(5)
    assert isinstance(qlinear.quantize_weight(w, _site("bf16", 1)), nvfp4.NVFP4Tensor)

    def text(site):
        return jax.jit(lambda x, w: _vjp(site, x, w, g)).lower(x, w).as_text()

    assert text(_site("dequantized", 1)) == text(SiteConfig(format="nvfp4", backward="dequantized"))
    assert text(_site("dequantized", 1)) != text(_site("dequantized", 2))


def test_weights_of_another_amplification_are_refused():
    x, w, _ = _inputs()
    plain, amplified = SiteConfig(format="nvfp4"), _site("bf16")
    with pytest.raises(ValueError, match="quantized without it"):
        qlinear.qdot(x, qlinear.quantize_weight(w, plain), amplified)
    with pytest.raises(ValueError, match="amplification=4.0 given to a site with amplification=1.0"):
        qlinear.qdot(x, qlinear.quantize_weight(w, amplified), plain)
    with pytest.raises(ValueError, match="amplification=4.0 given to a site with amplification=2.0"):
        qlinear.qdot(x, qlinear.quantize_weight(w, amplified), _site("bf16", 2.0))


@pytest.mark.parametrize("kwargs, match", [
    ({"amplification": 0.0}, "finite number > 0"), ({"amplification": -2.0}, "finite number > 0"),
    ({"amplification": float("inf")}, "finite number > 0"), ({"amplification": "4"}, "finite number > 0"),
    ({"amplification": 4.0, "backward": "quantized"}, "backward 'bf16' or 'dequantized'"),
    ({"amplification": 4.0, "format": "mxfp8"}, "format='nvfp4'"),
    ({"amplification": 4.0, "format": "bf16"}, "format='nvfp4'"),
])
def test_bad_amplifications_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SiteConfig(**{"format": "nvfp4", **kwargs})


def test_packed_weight_backends_run_amplified_gemms_on_their_bf16_kernels():
    """w_a has no packed form: on a packed-weight backend the amplified site traces exactly as on
    that backend's bf16 kernels (forward, dgrad, wgrad), where the plain site reads packed codes."""
    from fp4rl import grouped

    x, w = jnp.zeros((128, 128), jnp.bfloat16), jnp.zeros((2, 128, 128), jnp.float32)
    sizes, g = jnp.array([64, 64], jnp.int32), jnp.ones((128, 128), jnp.bfloat16)

    def traced(site, gemm):
        step = lambda x, w: jax.vjp(lambda x, w: qlinear.qdot(x, w, site, group_sizes=sizes, gemm=gemm), x, w)[1](g)  # noqa: E731
        return str(jax.make_jaxpr(step)(x, w))

    for packed in ("packed_interpret", "packed_dgrad_interpret", "packed_wgmma_interpret"):
        bf16_kernels = grouped.PACKED_GEMMS[packed]
        assert traced(_site("dequantized"), packed) == traced(_site("dequantized"), bf16_kernels), packed
        plain = _site("dequantized", 1)
        assert traced(plain, packed) != traced(plain, bf16_kernels), packed
